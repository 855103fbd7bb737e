"""Operator tooling: stream statistics, the metrics collector, DLQ requeue, gc and ``top``.

- :mod:`services.ops.streams` — depth and oldest-message age per stream/consumer (bounded reads);
- :mod:`services.ops.collector` — the scheduler's periodic stream-metrics collector;
- :mod:`services.ops.requeue` — what ``dlq.requeue`` does, paced by :mod:`services.ops.pacing`;
- :mod:`services.ops.gc` — orphaned checkpoints and stale temporary objects;
- :mod:`services.ops.top` — the ``tessera top`` snapshot and its rendering;
- :mod:`services.ops.commands` — the ``tessera gc`` and ``tessera top`` commands.
"""
