"""Operator tooling: stream statistics, the metrics collector, DLQ requeue, gc and ``top``.

- :mod:`shared.nats.streams` — depth and oldest-message age per stream/consumer (bounded reads);
- :mod:`services.scheduler.collector` — the scheduler's periodic stream-metrics collector;
- :mod:`shared.service.requeue` — what ``dlq.requeue`` does, paced by :mod:`shared.service.pacing`;
- :mod:`services.cli.ops.gc` — orphaned checkpoints and stale temporary objects;
- :mod:`services.cli.ops.top` — the ``tessera top`` snapshot and its rendering;
- :mod:`services.cli.ops.commands` — the ``tessera gc`` and ``tessera top`` commands.
"""
