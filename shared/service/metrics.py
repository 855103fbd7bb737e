"""Prometheus metrics of one Tessera process: one registry, built once, passed explicitly.

:class:`Metrics` owns a fresh :class:`~prometheus_client.CollectorRegistry` (never the library's
global one), so two services in one test process, or two tests in a row, never share counters.
The :class:`~shared.service.runtime.Runtime` builds it; services reach it as ``rt.metrics``. Every
metric is listed, with its labels and meaning, in the table of ``docs/operations.md``.

Counters are exposed with the ``_total`` suffix (``tessera_retries_total``); histograms as
``_bucket``/``_sum``/``_count``. Rates (tiles per second, kernel samples per second, resume rate)
are computed by Prometheus with ``rate()``, not here.
"""

from __future__ import annotations

from nats.js import api
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

#: seconds; tiles take from a fraction of a second to many minutes
_TILE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
#: seconds; a job is at least as long as its slowest tile
_JOB_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)
#: seconds; assembly, PNG encoding and the read-back check
_FINAL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    """Every Tessera metric, registered in this object's own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        stream_labels = ["stream", "consumer"]
        self.consumer_pending = Gauge(
            "tessera_consumer_pending_messages",
            "Messages not yet delivered to the consumer (num_pending)",
            stream_labels, registry=r,
        )  # fmt: skip
        self.consumer_ack_pending = Gauge(
            "tessera_consumer_ack_pending_messages",
            "Messages delivered but not yet acknowledged (num_ack_pending)",
            stream_labels, registry=r,
        )  # fmt: skip
        self.consumer_oldest_age = Gauge(
            "tessera_consumer_oldest_pending_age_seconds",
            "Age of the oldest message the consumer has not acknowledged (0 when none)",
            stream_labels, registry=r,
        )  # fmt: skip
        self.stream_messages = Gauge(
            "tessera_stream_messages", "Messages stored in the stream", ["stream"], registry=r
        )
        self.project_queued = Gauge(
            "tessera_project_queued_tiles",
            "Tiles of the project's live jobs waiting (queued or failed_retryable)",
            ["project"], registry=r,
        )  # fmt: skip
        self.project_in_flight = Gauge(
            "tessera_project_in_flight_tiles",
            "Tiles of the project being rendered (leased or progressing)",
            ["project"], registry=r,
        )  # fmt: skip
        self.project_share = Gauge(
            "tessera_project_share",
            "The project's share of kernel core-seconds over TESSERA_FAIR_SHARE_WINDOW (0..1)",
            ["project"], registry=r,
        )  # fmt: skip
        self._jobs_and_tiles(r)
        self._leases_and_checkpoints(r)
        self._failures(r)
        self._dispatch(r)

    def _dispatch(self, r: CollectorRegistry) -> None:
        self.dispatch_released = Counter(
            "tessera_dispatch_released",
            "Tiles the dispatcher released into TILES, by renderer", ["renderer"], registry=r,
        )  # fmt: skip
        self.dispatch_rounds = Counter(
            "tessera_dispatch_rounds", "Dispatch rounds run (released something or not)",
            registry=r,
        )  # fmt: skip
        self.dispatch_window = Gauge(
            "tessera_dispatch_window",
            "Messages a renderer's live workers could still take at the last round (capacity "
            "minus released-and-unfinished; a run of tiles is one message)", ["renderer"],
            registry=r,
        )  # fmt: skip
        self.dispatch_capacity = Gauge(
            "tessera_dispatch_capacity",
            "Factor x kernel threads of the live workers announcing the renderer",
            ["renderer"], registry=r,
        )  # fmt: skip
        self.dispatch_buffer = Gauge(
            "tessera_dispatch_buffer",
            "Messages of the renderer's window beyond its capacity, waiting in TILES for the "
            "next free slot (sized by the measured tile duration and round latency; 0 for long "
            "tiles)", ["renderer"], registry=r,
        )  # fmt: skip
        self.dispatch_unreleased = Gauge(
            "tessera_dispatch_unreleased_tiles",
            "Queued tiles of dispatchable jobs not yet released (the dispatch backlog)",
            registry=r,
        )  # fmt: skip
        self.superseded = Counter(
            "tessera_superseded_messages",
            "TILES messages a worker dropped because a newer generation of the tile exists",
            registry=r,
        )  # fmt: skip

    def _jobs_and_tiles(self, r: CollectorRegistry) -> None:
        self.tiles_in_flight = Gauge(
            "tessera_tiles_in_flight", "Tiles this worker holds a fenced lease on", registry=r
        )
        self.tiles_completed = Counter(
            "tessera_tiles_completed", "Tiles committed by this worker", registry=r
        )
        self.commits_refused = Counter(
            "tessera_tile_commits_refused",
            "Tile commits the store refused: reason already_done (another owner committed "
            "first) or fenced (a newer owner holds the tile)", ["reason"], registry=r,
        )  # fmt: skip
        self.tile_attempts = Counter(
            "tessera_tile_attempts", "Tile attempts started (lease taken and fenced)", registry=r
        )
        self.samples_rendered = Counter(
            "tessera_kernel_samples",
            "Pixel samples rendered by the kernel (rate() is samples per second)",
            registry=r,
        )
        self.tile_seconds = Histogram(
            "tessera_tile_duration_seconds",
            "One tile attempt, fence to commit", buckets=_TILE_BUCKETS, registry=r,
        )  # fmt: skip
        self.job_seconds = Histogram(
            "tessera_job_duration_seconds",
            "Submit to completed, from the job row's times", buckets=_JOB_BUCKETS, registry=r,
        )  # fmt: skip
        self.final_seconds = Histogram(
            "tessera_finalization_duration_seconds",
            "One finalization, lease to completed", buckets=_FINAL_BUCKETS, registry=r,
        )  # fmt: skip
        self.jobs_completed = Counter(
            "tessera_jobs_completed", "Jobs this finalizer completed", registry=r
        )
        self.duplicates = Counter(
            "tessera_duplicates_suppressed",
            "Duplicates absorbed: idempotency-key hits at submit, JetStream duplicate PubAcks",
            ["source"], registry=r,
        )  # fmt: skip

    def _leases_and_checkpoints(self, r: CollectorRegistry) -> None:
        self.lease_renewal_failures = Counter(
            "tessera_lease_renewal_failures",
            "Leases lost while held: a renew was refused or not confirmed within the TTL",
            ["kind"], registry=r,
        )  # fmt: skip
        self.lease_takeovers = Counter(
            "tessera_lease_takeovers",
            "Tiles acquired whose previous attempt never ended (the row was still leased)",
            registry=r,
        )
        self.checkpoints = Counter(
            "tessera_checkpoints_written", "Tile checkpoints written (object + pointer + row)",
            registry=r,
        )  # fmt: skip
        self.resumes = Counter(
            "tessera_checkpoint_resumes", "Tile attempts that resumed from a checkpoint",
            registry=r,
        )  # fmt: skip

    def _failures(self, r: CollectorRegistry) -> None:
        self.retries = Counter(
            "tessera_retries",
            "Retryable failures answered with nak(delay), by error code", ["code"], registry=r,
        )  # fmt: skip
        self.dead_letters = Counter(
            "tessera_dead_letters",
            "Dead letters written to the DLQ stream", ["unit", "reason"], registry=r,
        )  # fmt: skip
        self.finalization_failures = Counter(
            "tessera_finalization_failures",
            "Finalizations that failed (retryable: retried later; terminal: dead-lettered)",
            ["kind"], registry=r,
        )  # fmt: skip
        self.final_results = Counter(
            "tessera_finalization_results",
            "Tile results assembled, by where they came from (read_ahead, store, inline)",
            ["source"], registry=r,
        )  # fmt: skip
        self.read_ahead_bytes = Gauge(
            "tessera_finalizer_read_ahead_bytes",
            "Bytes of tile results the finalizer holds, read ahead of finalization", registry=r,
        )  # fmt: skip
        self.requeued = Counter(
            "tessera_dlq_requeued", "Dead letters requeued by an operator", ["unit"], registry=r
        )
        self.republished = Counter(
            "tessera_sweeper_republished", "Lost tiles re-published by the sweeper", registry=r
        )
        self.sweeper_skipped = Counter(
            "tessera_sweeper_skipped",
            "Stale tiles the sweeper checked and did not re-publish, by reason", ["reason"],
            registry=r,
        )  # fmt: skip
        self.gateway_busy = Counter(
            "tessera_gateway_busy",
            "Requests answered busy because their intake lane was full", ["lane"], registry=r,
        )  # fmt: skip

    def published(self, ack: api.PubAck) -> api.PubAck:
        """Count a JetStream PubAck the server marked duplicate; returns ``ack``."""
        if ack.duplicate:
            self.duplicates.labels(source="jetstream").inc()
        return ack

    def dead_letter_unit(self, unit: str) -> str:
        """The ``unit`` label of a DLQ unit token: ``tile-17`` is ``tile`` (bounded labels)."""
        return "tile" if unit.startswith("tile-") else unit

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)
