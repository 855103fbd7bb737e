"""Tessera's wire contract: pure data and codecs; the only I/O is `shared.nats.ensure`.

- :mod:`proto.names`       every subject, stream, consumer, bucket, KV key and ``Nats-Msg-Id``
- :mod:`proto.topology`    :class:`~proto.topology.Topology`: stream/consumer/bucket configs
- :mod:`shared.nats.ensure`      create-or-update the topology, race-safe
- :mod:`proto.messages`    internal msgpack messages (JobMessage, TileMessage, TileDone, ...)
- :mod:`proto.api`         client API request schemas and ``decode_request``
- :mod:`proto.api_replies` client API reply schemas and ``encode_reply``
- :mod:`proto.apidoc`      ``docs/api.md``, generated from the schemas (``make api-docs``)
- :mod:`proto.limits`      the documented API limits
- :mod:`proto.replies`     error codes and reply builders
- :mod:`proto.canonical`   canonical JSON for hashing
- :mod:`proto.idempotency` idempotency keys and request fingerprints
"""
