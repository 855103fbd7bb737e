"""Operator commands: ``tessera gc`` and ``tessera top``.

- :mod:`services.cli.ops.gc` — orphaned checkpoints and stale temporary objects;
- :mod:`services.cli.ops.top` — the ``tessera top`` snapshot and its rendering;
- :mod:`services.cli.ops.commands` — the ``tessera gc`` and ``tessera top`` commands.

What the services share with them lives below: stream statistics in :mod:`shared.nats.streams`
(also read by the scheduler's :mod:`services.scheduler.collector`), the DLQ requeue the gateway
runs in :mod:`shared.service.requeue`, paced by :mod:`shared.service.pacing`.
"""
