"""The gateway: the client API over NATS request-reply.

It subscribes to every ``tessera.api.<verb>`` subject in the queue group ``tessera-gateway``, so
any number of gateways share the load. Every request gets exactly one reply, ``{"ok": true, ...}``
or ``{"ok": false, "error": {...}}`` (:mod:`proto.replies`); a handler that raises is logged and
answered ``internal``, never fatal. A request that is refused writes nothing: no row, no stream
message, no object.

- :mod:`services.gateway.app` — subscriptions, bounded concurrency, dispatch, graceful stop;
- :mod:`services.gateway.handlers` — submit, status, list, cancel, retry;
- :mod:`services.gateway.scenes` — builtin resolution, scene validation, input hash;
- :mod:`services.gateway.dlq` — the dead-letter verbs.
"""
