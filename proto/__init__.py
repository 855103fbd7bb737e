"""Tessera's wire contract: pure data and codecs, no I/O (it imports only :mod:`shared.core`).

- :mod:`proto.names`       every subject, stream, consumer, bucket, KV key and ``Nats-Msg-Id``
- :mod:`proto.topology`    :class:`~proto.topology.Topology`: stream/consumer/bucket configs
- :mod:`proto.messages`    internal msgpack messages (JobMessage, TileMessage, TileDone, ...)
- :mod:`proto.api`         client API request schemas and ``decode_request``
- :mod:`proto.api_replies` client API reply schemas and ``encode_reply``
- :mod:`proto.apidoc`      ``docs/api.md``, generated from the schemas (``make api-docs``)
- :mod:`proto.limits`      the documented API limits
- :mod:`proto.replies`     error codes and reply builders
- :mod:`proto.canonical`   canonical JSON for hashing
- :mod:`proto.idempotency` idempotency keys and request fingerprints

Creating the topology on a server is :mod:`shared.nats.ensure` (the NATS adapter).
"""
