"""The groups of one service role each: worker, scheduler, sweeper, finalizer, gateway."""

from __future__ import annotations

import os
from dataclasses import dataclass

from shared.core.config.knobs import MiB, _knob
from shared.core.runs import MAX_RUN

MAX_URL_TTL = 7 * 24 * 3600
"""Longest lifetime of a presigned result URL, in seconds: an S3 signature's longest."""


@dataclass(frozen=True)
class WorkerSettings:
    """A worker process: its kernel threads, the tiles it holds, its caches, its passes."""

    #: kernel threads per worker process (0 = number of cores)
    slots: int = _knob(
        0,
        "TESSERA_WORKER_SLOTS",
        "kernel threads per worker (0: number of cores)",
        read_by="worker",
        minimum=0,
    )
    #: tile messages a worker holds at once (0 = twice ``slots``, so renderers never wait for a
    #: tile's commit I/O)
    in_hand: int = _knob(
        0,
        "TESSERA_WORKER_IN_HAND",
        "tile messages a worker holds at once (0: twice its kernel threads, so renderers never "
        "wait for a tile's commit I/O)",
        read_by="worker",
        minimum=0,
    )
    #: seconds between checkpoints of a tile's accumulator
    checkpoint_interval: float = _knob(
        5.0,
        "TESSERA_CHECKPOINT_INTERVAL",
        "seconds between accumulator checkpoints",
        read_by="worker",
        minimum=0.0,
    )
    #: samples per pixel of a tile's first pass until the worker has measured its job (and the
    #: least of any pass but its last)
    samples_per_pass: int = _knob(
        4,
        "TESSERA_SAMPLES_PER_PASS",
        "samples per pixel of a tile's first pass until the worker has measured the job's rate "
        "(and the least of any other)",
        read_by="worker",
        minimum=1,
    )
    #: other passes are sized from the measured rate to take about this long: a pass is the
    #: grain of cancel checks and checkpoints, and each costs a round trip to the event loop
    #: (0 = every pass has ``samples_per_pass``)
    pass_seconds: float = _knob(
        0.5,
        "TESSERA_PASS_SECONDS",
        "other passes are sized to take about this long (the grain of cancel, shutdown and "
        "checkpoint checks; 0: every pass has `SAMPLES_PER_PASS`), ≤ `PROGRESS_TIMEOUT`/2",
        read_by="worker",
        minimum=0.0,
    )
    #: a tile whose passes stop advancing for this long is aborted (progress watchdog)
    progress_timeout: float = _knob(
        120.0,
        "TESSERA_PROGRESS_TIMEOUT",
        "watchdog: abort a tile whose passes stop advancing for this long (s)",
        read_by="worker",
        minimum=1.0,
    )
    #: a finished tile result up to this many bytes (a small tile's float accumulator; 8x8 is
    #: 1.6 KiB) is committed inline in PostgreSQL, in the fenced commit's own statement,
    #: instead of as one object per tile; larger ones go to the object store (0 = all do)
    inline_result_bytes: int = _knob(
        16384,
        "TESSERA_INLINE_RESULT_BYTES",
        "tile results up to this size are committed inline in PostgreSQL instead of as one "
        "object each (0: all objects)",
        read_by="worker",
        minimum=0,
    )
    #: prepared scenes (flattened arrays + BVH) a worker keeps, by count ...
    scene_cache: int = _knob(
        8,
        "TESSERA_WORKER_SCENE_CACHE",
        "prepared scenes (flattened geometry + BVH) a worker keeps, least recently used "
        "dropped first",
        read_by="worker",
        minimum=1,
    )
    #: ... and by bytes of their arrays (a 200k-triangle mesh is ~40 MB); the newest scene
    #: always stays, whatever its size
    scene_cache_bytes: int = _knob(
        512 * MiB,
        "TESSERA_WORKER_SCENE_CACHE_BYTES",
        "bytes of prepared scene arrays a worker keeps (the newest scene stays whatever its size)",
        read_by="worker",
        minimum=0,
    )
    #: renderers the worker runs: ``auto`` (tessera, and blender / povray if found on PATH) or
    #: a comma-separated list (a listed renderer that is not found stops the worker at start)
    renderers: str = _knob(
        "auto",
        "TESSERA_RENDERERS",
        "renderers a worker runs: `auto` (tessera, plus blender and povray if on PATH) or a "
        "comma-separated list such as `tessera,povray` (one not found: the worker does not start)",
        read_by="worker",
    )
    #: POV-Ray processes a worker runs at once (0 = its tiles in hand)
    povray_processes: int = _knob(
        0,
        "TESSERA_POVRAY_PROCESSES",
        "POV-Ray processes a worker runs at once, one tile each (0: its tiles in hand, by "
        "default twice its kernel threads: a POV-Ray process spends about 0.65 s of every tile "
        "in timed waits, not on a core, so more processes than cores keep the cores busy)",
        read_by="worker",
        minimum=0,
    )
    #: where a worker keeps scene assets (Blender/POV-Ray files), one directory per asset
    #: named by its manifest's sha256 (empty: ``~/.cache/tessera/assets``)
    asset_cache_dir: str = _knob(
        "",
        "TESSERA_ASSET_CACHE_DIR",
        "directory of a worker's scene asset cache, one subdirectory per asset sha256 "
        "(empty: `~/.cache/tessera/assets/<TESSERA_NODE>`; one per worker process)",
        read_by="worker",
    )
    #: bytes of assets kept there; least recently used assets not in use are removed first
    asset_cache_bytes: int = _knob(
        20 * 1024 * MiB,
        "TESSERA_ASSET_CACHE_BYTES",
        "bytes of scene assets a worker keeps on disk; the least recently used ones not in use "
        "are removed first (assets in use may take it over the bound)",
        read_by="worker",
        minimum=1,
    )
    #: job rows a worker caches (what tiles need of a job never changes)
    job_cache: int = _knob(
        256,
        "TESSERA_WORKER_JOB_CACHE",
        "job rows a worker caches (scene, settings, input hash), least recently used dropped first",
        read_by="worker",
        minimum=1,
    )
    #: job ids announced cancelled that a worker remembers, oldest forgotten first
    cancel_memory: int = _knob(
        10_000,
        "TESSERA_WORKER_CANCEL_MEMORY",
        "cancelled job ids a worker remembers from job-cancelled events, oldest forgotten first",
        read_by="worker",
        minimum=1,
    )

    def kernel_threads(self) -> int:
        """``slots``, with 0 resolved to the number of cores."""
        return self.slots or os.cpu_count() or 1

    def tiles_in_hand(self) -> int:
        """``in_hand``, with 0 resolved to twice the kernel threads."""
        return self.in_hand or 2 * self.kernel_threads()


@dataclass(frozen=True)
class SchedulerSettings:
    """The scheduler's consumers (its sweeper has :class:`SweeperSettings`)."""

    #: job messages the scheduler plans at once
    jobs_in_hand: int = _knob(
        8,
        "TESSERA_SCHEDULER_JOBS_IN_HAND",
        "job messages the scheduler plans at once",
        read_by="scheduler",
        minimum=1,
    )
    #: exhausted-delivery advisories the scheduler handles at once
    advisories_in_hand: int = _knob(
        4,
        "TESSERA_SCHEDULER_ADVISORIES_IN_HAND",
        "exhausted-delivery advisories the scheduler dead-letters at once",
        read_by="scheduler",
        minimum=1,
    )
    #: what a tile of a ``tile_size: "auto"`` job should take on one core
    tile_seconds: float = _knob(
        2.0,
        "TESSERA_TILE_SECONDS",
        'seconds one tile of a `tile_size: "auto"` job should take on one core: the planner '
        "picks the edge from the image size, spp and the measured cost of a pixel-sample",
        read_by="scheduler",
        minimum=0.01,
    )
    #: the cost assumed before anything of a renderer was measured
    tile_cost: float = _knob(
        1e-6,
        "TESSERA_TILE_COST",
        "seconds per pixel-sample an auto job assumes while no finished tile of its scene or "
        "renderer has been measured (the kernel's cornell scene: about 1e-6 on one core)",
        read_by="scheduler",
        minimum=1e-12,
    )
    #: shortest wait of the deadline check (jobs past their deadline end deadline_exceeded)
    deadline_interval: float = _knob(
        1.0,
        "TESSERA_DEADLINE_INTERVAL",
        "shortest wait (s) of the check that fails jobs past their deadline: it sleeps until "
        "the earliest deadline of a live job (at most 30 s), and planning a job wakes it",
        read_by="scheduler",
        minimum=0.1,
    )
    #: the shortest wait of the dispatcher's timer (events wake it sooner)
    dispatch_interval: float = _knob(
        0.25,
        "TESSERA_DISPATCH_INTERVAL",
        "shortest wait of the dispatcher's timer between rounds (s); rounds come on events: a "
        "new plan, job-control events (resume, pause, cancel, failure, retry) and finished "
        "tiles (the workers' Room messages: every few tiles, at once when a worker holds no "
        "more tiles than threads) wake the dispatcher at once; the timer is the net for what "
        "no event announces",
        read_by="scheduler",
        minimum=0.01,
    )
    #: the longest wait of the dispatcher's timer (the wait doubles up to it)
    dispatch_idle_interval: float = _knob(
        2.0,
        "TESSERA_DISPATCH_IDLE_INTERVAL",
        "longest wait of the dispatcher's timer (s): after each round that released nothing "
        "the wait doubles from `TESSERA_DISPATCH_INTERVAL` up to this, a round that released "
        "tiles on an event leaves it as it was, and one the timer started that releases tiles "
        "goes back to the short wait; an event ends any wait at once (a worker joining or a "
        "lost event waits at most this)",
        read_by="scheduler",
        minimum=0.01,
    )
    #: tiles released per live kernel thread (the window's base is this x threads)
    dispatch_factor: float = _knob(
        2.0,
        "TESSERA_DISPATCH_FACTOR",
        "base of the dispatch window per renderer: this x the kernel threads of its live workers "
        "(the tiles they hold); short tiles add a measured buffer up to "
        "`TESSERA_DISPATCH_MAX_FACTOR`; a round releases up to the window minus the renderer's "
        "released-and-unfinished tiles",
        read_by="scheduler",
        minimum=0.1,
    )
    #: the window's bound with its buffer for short tiles (the buffer is sized by measurement)
    dispatch_max_factor: float = _knob(
        8.0,
        "TESSERA_DISPATCH_MAX_FACTOR",
        "most tiles released-and-unfinished per live kernel thread, buffer for short tiles "
        "included (the buffer keeps a few dispatch rounds' worth of short tiles waiting in "
        "`TILES`, sized by their measured duration; at or below `TESSERA_DISPATCH_FACTOR` "
        "there is none)",
        read_by="scheduler",
        minimum=0.1,
    )
    #: most tiles one dispatch round releases
    dispatch_batch: int = _knob(
        512,
        "TESSERA_DISPATCH_BATCH",
        "most tiles one dispatch round releases (one transaction, then their publishes)",
        read_by="scheduler",
        minimum=1,
    )
    #: most tiles of one job a TILES message carries (a run of short tiles; 1: one per message)
    dispatch_run: int = _knob(
        16,
        "TESSERA_DISPATCH_RUN",
        "most tiles of a `tessera` job one TILES message carries: consecutive short tiles "
        "released together share a message, which counts once in the dispatch window, so the "
        "message costs (publish, fetch, ack, a round) are paid once per run (1: every tile its "
        "own message)",
        read_by="scheduler",
        minimum=1,
        maximum=(MAX_RUN, "the most tiles a TILES message may carry"),
    )
    #: pixel-samples (tile pixels x spp) a run covers at most: only short tiles are grouped
    dispatch_run_work: int = _knob(
        2_097_152,
        "TESSERA_DISPATCH_RUN_WORK",
        "most pixel-samples (tile pixels x spp) a run of tiles covers: a job whose tiles cover "
        "more than half of it sends each tile alone (the default, eight 64x64 tiles at 64 spp, "
        "about a second of one core on the sample scene, makes a message's coordination a small "
        "part of its work)",
        read_by="scheduler",
        minimum=0,
    )
    #: the sliding window over which fair share measures each project's core-seconds
    fair_share_window: float = _knob(
        300.0,
        "TESSERA_FAIR_SHARE_WINDOW",
        "sliding window (s) over which fair share sums each project's kernel core-seconds (the "
        "dispatcher's order; the share `project list`, `top` and the metrics show)",
        read_by="scheduler, gateway",
        minimum=1.0,
    )


@dataclass(frozen=True)
class SweeperSettings:
    """The scheduler's sweeper, which re-publishes tiles whose message was lost."""

    #: sweeper period
    interval: float = _knob(
        5.0,
        "TESSERA_SWEEP_INTERVAL",
        "sweeper period (s)",
        read_by="scheduler",
        minimum=0.1,
    )
    #: the age after which a stuck tile is re-published (must cover a normal redelivery)
    age: float = _knob(
        60.0,
        "TESSERA_SWEEP_AGE",
        "age of a stuck tile (no message, no lease) before it is re-published (s), > `ACK_WAIT`",
        read_by="scheduler",
        minimum=0.5,
    )
    #: tiles one sweep pass reads (a page; the next pass reads the next page)
    batch: int = _knob(
        1000,
        "TESSERA_SWEEP_BATCH",
        "stuck tiles one sweep pass reads, oldest publish first (the next pass reads the next)",
        read_by="scheduler",
        minimum=1,
    )


@dataclass(frozen=True)
class FinalizerSettings:
    """The finalizer: how many tile-done events it handles at once, what it reads ahead."""

    #: tile-done events the finalizer handles at once
    in_hand: int = _knob(
        4,
        "TESSERA_FINALIZER_IN_HAND",
        "tiles-done events (jobs to finalize) a finalizer handles at once",
        read_by="finalizer",
        minimum=1,
    )
    #: bytes of tile results a finalizer reads ahead from S3 as their tile-done events arrive,
    #: so a job's finalization does not start by reading every tile (0 = no read-ahead; the
    #: directory store's results are always read at finalization)
    read_ahead_bytes: int = _knob(
        256 * MiB,
        "TESSERA_READ_AHEAD_BYTES",
        "tile results a finalizer reads ahead from S3 as tile-done events arrive (0: none)",
        read_by="finalizer",
        minimum=0,
    )


@dataclass(frozen=True)
class GatewaySettings:
    """The gateway's bounded intake (see :mod:`services.gateway.intake`) and result URLs."""

    #: small requests (body below ``large_body_bytes``) served at once; more are ``busy``
    in_flight: int = _knob(
        64,
        "TESSERA_GATEWAY_IN_FLIGHT",
        "small requests (body below `GATEWAY_LARGE_BODY_BYTES`) a gateway serves at once; "
        "more are answered `busy`",
        read_by="gateway",
        minimum=1,
    )
    #: large requests (inline scenes) served at once; more are ``busy``
    large_in_flight: int = _knob(
        8,
        "TESSERA_GATEWAY_LARGE_IN_FLIGHT",
        "large requests (inline scenes) a gateway serves at once; more are answered `busy`",
        read_by="gateway",
        minimum=1,
    )
    #: processes decoding and checking large requests off the event loop
    large_workers: int = _knob(
        1,
        "TESSERA_GATEWAY_LARGE_WORKERS",
        "processes of a gateway that decode and check large requests off its event loop",
        read_by="gateway",
        minimum=1,
    )
    #: bodies of this size or more go to the large lane
    large_body_bytes: int = _knob(
        16 * 1024,
        "TESSERA_GATEWAY_LARGE_BODY_BYTES",
        "request bodies of this size or more are large (decoded in the gateway's worker process)",
        read_by="gateway",
        minimum=1,
    )
    #: the most bytes of all files of one scene asset (``asset.manifest``)
    asset_max_bytes: int = _knob(
        2048 * MiB,
        "TESSERA_ASSET_MAX_BYTES",
        "the most bytes all files of one scene asset may have (`asset.manifest` refuses more; the "
        "client learns it from `asset.missing`)",
        read_by="gateway",
        minimum=1,
    )
    #: lifetime (whole seconds) of a presigned result URL from ``tessera.api.result`` (S3):
    #: short, since anyone holding the URL can download the image until it expires
    result_url_ttl: int = _knob(
        300,
        "TESSERA_RESULT_URL_TTL",
        "lifetime of a presigned result URL (`tessera.api.result`, S3 store), whole seconds, at "
        "most 7 days; anyone holding the URL can download the image until then",
        read_by="gateway",
        minimum=1,
        maximum=(MAX_URL_TTL, "7 days, the longest an S3 signature is valid"),
    )


WEB_ROLES = ("viewer", "operator")
"""The roles of a web token, weakest first: ``viewer`` reads, ``operator`` also changes."""
MIN_WEB_TOKEN = 16
"""The fewest characters a web token may have (a guessable token is no protection)."""


@dataclass(frozen=True)
class WebSettings:
    """The web console and HTTP API (:mod:`services.web`)."""

    #: address the HTTP server listens on (loopback by default: expose it deliberately)
    host: str = _knob(
        "127.0.0.1",
        "TESSERA_WEB_HOST",
        "address the web console and HTTP API listen on (`0.0.0.0` in a container; the default "
        "keeps it on the machine)",
        read_by="web",
    )
    #: HTTP port of the console and API
    port: int = _knob(
        8470, "TESSERA_WEB_PORT", "port of the web console and HTTP API", read_by="web", minimum=1
    )
    #: ``role:token`` entries, comma-separated (a bare token is an operator's)
    token: str = _knob(
        "",
        "TESSERA_WEB_TOKEN",
        "access tokens, comma-separated `viewer:TOKEN` (reads) or `operator:TOKEN` (reads and "
        "changes; a bare `TOKEN` is an operator's), each at least 16 characters; empty: the web "
        "service makes up an operator token and logs it, allowed only on a loopback "
        "`TESSERA_WEB_HOST` (`tessera up` prints the one it made)",
        read_by="web",
    )
    #: seconds a login cookie stays valid
    session_ttl: int = _knob(
        12 * 3600,
        "TESSERA_WEB_SESSION_TTL",
        "seconds a console login (its HttpOnly cookie) stays valid",
        read_by="web",
        minimum=60,
    )
    #: mark the cookies ``Secure`` (only sent over HTTPS)
    cookie_secure: int = _knob(
        0,
        "TESSERA_WEB_COOKIE_SECURE",
        "1: mark the login and CSRF cookies `Secure` (set it when the console is behind HTTPS)",
        read_by="web",
        minimum=0,
    )
    #: seconds a gateway request of the web service may take
    timeout: float = _knob(
        10.0,
        "TESSERA_WEB_TIMEOUT",
        "seconds the web service waits for the gateway per request (503 `unavailable` after)",
        read_by="web",
        minimum=0.1,
    )
    #: events buffered per SSE client; one that falls further behind is disconnected
    sse_queue: int = _knob(
        256,
        "TESSERA_WEB_SSE_QUEUE",
        "events buffered for one server-sent-events client; a client that falls further behind "
        "is disconnected (it reconnects and reloads)",
        read_by="web",
        minimum=1,
    )
    #: SSE connections served at once; more are answered 503
    sse_clients: int = _knob(
        200,
        "TESSERA_WEB_SSE_CLIENTS",
        "server-sent-events connections served at once; more are answered 503 with Retry-After",
        read_by="web",
        minimum=1,
    )
    #: seconds between two SSE heartbeat comments
    heartbeat: float = _knob(
        15.0,
        "TESSERA_WEB_HEARTBEAT",
        "seconds between two heartbeat comments on a server-sent-events stream",
        read_by="web",
        minimum=0.05,
    )

    def tokens(self) -> tuple[tuple[str, str], ...]:
        """``(role, token)`` of every entry of ``token`` (ValueError naming a bad entry)."""
        out: list[tuple[str, str]] = []
        for raw in self.token.split(","):
            entry = raw.strip()
            if not entry:
                continue
            role, sep, secret = entry.partition(":")
            if not sep or role not in WEB_ROLES:
                role, secret = "operator", entry
            if len(secret) < MIN_WEB_TOKEN or any(c.isspace() or c == "," for c in secret):
                raise ValueError(
                    f"a {role} token has {len(secret)} characters (at least {MIN_WEB_TOKEN}, no "
                    "spaces)"
                )
            out.append((role, secret))
        return tuple(out)
