"""The NATS adapter: connections and publishing (:mod:`shared.nats.jetstream`), KV
leases (:mod:`shared.nats.leases`), creating the topology (:mod:`shared.nats.ensure`)
and stream statistics (:mod:`shared.nats.streams`). Imports shared.core and proto.
"""
