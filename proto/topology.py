"""Streams, consumers and KV buckets as data, built from one :class:`Topology`.

==============  ===========================================  ==========  ======================
stream          subjects                                     retention   max age
==============  ===========================================  ==========  ======================
``JOBS``        ``tessera.jobs.>``                           work-queue  —
``TILES``       ``tessera.tiles.<renderer>.<job>.<i>``       work-queue  —
``EVENTS``      ``tessera.events.<job>.<kind>``              limits      ``events_max_age``
``DLQ``         ``tessera.dlq.<job>.<unit>``                 limits      ``dlq_max_age``
``ADVISORIES``  MAX_DELIVERIES advisories of JOBS, TILES,    limits      ``advisories_max_age``
                EVENTS
==============  ===========================================  ==========  ======================

Consumers (all durable, pull, explicit ack, ``ack_wait``/``max_deliver``/``max_ack_pending`` from
the topology, no ``backoff`` — it silently replaces ``ack_wait`` — and no ``inactive_threshold`` —
it deletes an idle durable): ``scheduler-jobs`` on JOBS; on TILES one per renderer, filtered to
its subjects ``tessera.tiles.<renderer>.>``: ``workers`` (``tessera``, the name it had before
renderers), ``workers-blender``, ``workers-povray``; ``finalizer`` on EVENTS filtered to
tile-done, ``scheduler-advisories`` on ADVISORIES.

KV buckets are declared as their backing streams (``KV_<bucket>``, exactly what nats-py's
``create_key_value`` would build, so ``js.key_value(bucket)`` opens them): ``tessera-leases``
(history 1, per-message TTL allowed, no limit marker: see NATS-NOTES), ``tessera-progress`` and
``tessera-workers`` (live workers, each key put with a TTL and refreshed by its worker).
Reads stay on the stream leader (``allow_direct=False``) so compare-and-set sees its own writes.

Every stream, consumer and bucket carries a ``description`` (:data:`DESCRIPTIONS`) saying what it
holds and who reads it, shown by ``nats stream info``, ``nats consumer info`` and ``nats kv ls``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nats.js import api

from proto import names as n
from shared.core.config import DeliverySettings, DeploymentSettings
from shared.core.errors import ConfigError

DAY = 86_400.0
MAX_KV_VALUE = 64 * 1024
"""Largest lease or progress value, in bytes (values are small JSON documents)."""
KV_DUPLICATE_WINDOW = 120.0
"""Duplicate window of a KV bucket's backing stream: the value nats-py's ``create_key_value``
gives it (the buckets keep it whatever ``TESSERA_DUPLICATE_WINDOW`` says, which sets the
message streams' window)."""

DESCRIPTIONS: dict[str, str] = {
    n.STREAM_JOBS: "Tessera jobs to plan: one msgpack JobMessage per job generation "
    "(headers Tessera-Kind/Job/Generation). Read by the scheduler (consumer scheduler-jobs).",
    n.STREAM_TILES: "Tessera tiles to render: one msgpack TileMessage per tile, or per run of "
    "tiny tiles, and generation (headers Tessera-Kind/Job/Tile/Generation, Tessera-Run for a "
    "run). Read by the workers (consumer workers).",
    n.STREAM_EVENTS: "Tessera facts, subject <job>.<kind>: msgpack TileDone (tile-done), "
    "TilesDone (tiles-done) and JobEvent (job-completed, job-failed, ...), Tessera-Kind header = "
    "kind. tiles-done is read by the finalizer (consumer finalizer); tile-done and job events "
    "by watchers (tessera watch, the console).",
    n.STREAM_DLQ: "Tessera dead letters: msgpack DeadLetter holding the original message and "
    "why it failed (headers Tessera-Kind/Job/Unit/Reason/Source). Read by operators: tessera "
    "dlq list/show/requeue/purge.",
    n.STREAM_ADVISORIES: "JetStream MAX_DELIVERIES advisories (JSON) of JOBS, TILES and EVENTS. "
    "Read by the scheduler (consumer scheduler-advisories), which dead-letters the message.",
    n.BUCKET_LEASES: "Tessera leases: tile.<job>.<i> (workers) and final.<job> (finalizer), "
    "JSON owner {node, attempt_id, acquired_at}, expiring by per-key TTL. Read by their owners, "
    "the sweeper and tessera top; never write by hand.",
    n.BUCKET_PROGRESS: "Tessera progress pointers: tile.<job>.<i> -> JSON {input_hash, "
    "samples_done, checkpoint_key, attempt_id} of the tile's newest checkpoint. Written and read "
    "by workers (resume after a crash); read by tessera gc.",
    n.BUCKET_WORKERS: "Tessera live workers: worker.<node> -> JSON {node, threads, in_hand, "
    "renderers {name: version}, version, started_at, current [[job, tile], ...], room}, put "
    "with a TTL and refreshed every few seconds by each worker, deleted on a clean stop. Read "
    "by the scheduler's dispatcher (the release window, how it hears of room) and tessera top.",
    n.CONSUMER_SCHEDULER_JOBS: "Scheduler: plans each job into tile rows; its dispatcher "
    "releases them into TILES as workers have room.",
    n.CONSUMER_WORKERS: "Workers with the tessera renderer (numba kernel): render one tile per "
    "message, commit it, publish tile-done (tiles-done after a job's last tile).",
    n.workers_consumer("blender"): "Workers with Blender (Cycles) on PATH: render one tile per "
    "message, commit it, publish tile-done (tiles-done after a job's last tile).",
    n.workers_consumer("povray"): "Workers with POV-Ray on PATH: render one tile per message, "
    "commit it, publish tile-done (tiles-done after a job's last tile).",
    n.CONSUMER_FINALIZER: "Finalizer: tiles-done events (every tile of a job is done); "
    "assembles the job's image, then publishes job-completed.",
    n.CONSUMER_SCHEDULER_ADVISORIES: "Scheduler: copies the message an exhausted-delivery "
    "advisory names to DLQ and fails its tile and job.",
}
"""What each stream, bucket and consumer (by base name) holds and who reads it."""

_ADVISED_STREAMS = (n.STREAM_JOBS, n.STREAM_TILES, n.STREAM_EVENTS)
"""Streams whose exhausted deliveries are captured in ADVISORIES."""


@dataclass(frozen=True)
class Topology:
    """Parameters of one deployment's JetStream objects.

    ``prefix`` isolates a topology (tests use a fresh one each); see :mod:`proto.names`.
    Durations are in seconds. ``replicas`` is 1 (one server) or 3 (a cluster). A service builds
    its topology from its settings (:func:`shared.service.runtime.topology_for`); the defaults here
    are those settings' defaults, so a ``Topology()`` declares what a default deployment declares.
    """

    prefix: str = DeploymentSettings.namespace
    replicas: int = DeploymentSettings.replicas
    duplicate_window: float = float(DeploymentSettings.duplicate_window)
    ack_wait: float = float(DeliverySettings.ack_wait)
    max_deliver: int = DeliverySettings.max_deliver
    max_ack_pending: int = 1000
    events_max_age: float = 7 * DAY
    dlq_max_age: float = 90 * DAY
    advisories_max_age: float = 7 * DAY
    storage: api.StorageType = api.StorageType.FILE
    names: n.Names = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", n.Names(self.prefix))
        if self.replicas not in (1, 3):
            raise ConfigError(f"replicas: {self.replicas} is not 1 or 3")
        if self.max_deliver < 1 or self.max_ack_pending < 1:
            raise ConfigError("max_deliver and max_ack_pending must be >= 1")
        if self.ack_wait < 1:
            raise ConfigError(f"ack_wait: {self.ack_wait} is below 1 s")
        ages = (self.events_max_age, self.dlq_max_age, self.advisories_max_age)
        if not 0 < self.duplicate_window <= min(ages):
            raise ConfigError("duplicate_window must be > 0 and <= every stream's max age")

    def streams(self) -> list[api.StreamConfig]:
        """Every stream (KV backing streams included), in creation order."""
        return [*self.message_streams(), *self.bucket_streams()]

    def message_streams(self) -> list[api.StreamConfig]:
        """JOBS, TILES, EVENTS, DLQ and ADVISORIES."""
        nm = self.names
        wq, lim = api.RetentionPolicy.WORK_QUEUE, api.RetentionPolicy.LIMITS
        advisories = [nm.max_deliveries_advisory(s) for s in _ADVISED_STREAMS]
        return [
            self._stream(n.STREAM_JOBS, [nm.jobs_subjects], wq, 0.0),
            self._stream(n.STREAM_TILES, [nm.tiles_subjects], wq, 0.0),
            self._stream(n.STREAM_EVENTS, [nm.events_subjects], lim, self.events_max_age),
            self._stream(n.STREAM_DLQ, [nm.dlq_subjects], lim, self.dlq_max_age),
            self._stream(n.STREAM_ADVISORIES, advisories, lim, self.advisories_max_age),
        ]

    def _stream(
        self, base: str, subjects: list[str], retention: api.RetentionPolicy, max_age: float
    ) -> api.StreamConfig:
        return api.StreamConfig(
            name=self.names.stream(base),
            description=DESCRIPTIONS[base],
            subjects=subjects,
            retention=retention,
            storage=self.storage,
            num_replicas=self.replicas,
            duplicate_window=self.duplicate_window,
            max_age=max_age,
            discard=api.DiscardPolicy.OLD,
            allow_msg_ttl=False,
        )

    def bucket_streams(self) -> list[api.StreamConfig]:
        """Backing streams of the leases, progress and live-workers buckets."""
        return [self._bucket(b) for b in (n.BUCKET_LEASES, n.BUCKET_PROGRESS, n.BUCKET_WORKERS)]

    def _bucket(self, base: str) -> api.StreamConfig:
        bucket = self.names.bucket(base)
        return api.StreamConfig(
            name=f"KV_{bucket}",
            description=DESCRIPTIONS[base],
            subjects=[f"$KV.{bucket}.>"],
            retention=api.RetentionPolicy.LIMITS,
            storage=self.storage,
            num_replicas=self.replicas,
            max_msgs_per_subject=1,
            max_msg_size=MAX_KV_VALUE,
            discard=api.DiscardPolicy.NEW,
            duplicate_window=KV_DUPLICATE_WINDOW,
            max_age=0.0,
            allow_rollup_hdrs=True,
            deny_delete=True,
            allow_direct=False,
            allow_msg_ttl=True,
            subject_delete_marker_ttl=None,
        )

    def consumers(self) -> list[tuple[str, api.ConsumerConfig]]:
        """``(stream name, consumer config)`` for every durable consumer."""
        nm = self.names
        return [
            (nm.stream(n.STREAM_JOBS), self._consumer(n.CONSUMER_SCHEDULER_JOBS, None)),
            *(
                (
                    nm.stream(n.STREAM_TILES),
                    self._consumer(n.workers_consumer(r), nm.renderer_tiles(r)),
                )
                for r in n.RENDERERS
            ),
            (
                nm.stream(n.STREAM_EVENTS),
                self._consumer(n.CONSUMER_FINALIZER, nm.tiles_done_filter),
            ),
            (
                nm.stream(n.STREAM_ADVISORIES),
                self._consumer(n.CONSUMER_SCHEDULER_ADVISORIES, None),
            ),
        ]

    def _consumer(self, name: str, filter_subject: str | None) -> api.ConsumerConfig:
        return api.ConsumerConfig(
            name=name,
            durable_name=name,
            description=DESCRIPTIONS[name],
            deliver_policy=api.DeliverPolicy.ALL,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait,
            max_deliver=self.max_deliver,
            max_ack_pending=self.max_ack_pending,
            filter_subject=filter_subject,
            replay_policy=api.ReplayPolicy.INSTANT,
            backoff=None,
            inactive_threshold=None,
        )
