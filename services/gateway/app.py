"""The gateway loop: one subscription per API verb, one task per request, bounded.

nats-py runs a subscription's callback for one message at a time, so the callback only decides:
it takes a place in the request's lane of the :class:`~services.gateway.intake.Intake` and
spawns the handler, or, when the lane is full, answers ``busy`` with a ``retry_after`` hint at
once. It never waits: a request left waiting in the client library would leave the next ones in
nats-server's buffer for this connection, which the server cuts as a slow consumer once it
holds ``max_pending`` (NATS's default is 64 MiB; Tessera's configurations set
:data:`proto.limits.NATS_MAX_PENDING`; every request buffered there is lost, and until the
reconnect every request gets "no responders").

Submits and the large asset verbs (``asset.chunk``, ``asset.manifest``) arrive on the service's
connection, every other verb (status, list, cancel, retry, result, the dead-letter verbs,
``asset.missing``, the console's) on a second connection of the gateway's own, same servers and
user:
nats-server writes each connection's messages in order, so on one connection a status waited
behind every byte of a burst of large submits sent before it (measured: up to 0.6 s).
A request is answered on the connection it arrived on. On stop the subscriptions go first, then
in-flight requests get the grace period to finish and reply, then the second connection drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Awaitable, Callable, Mapping

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from proto.api_replies import Reply, encode_reply
from proto.limits import MAX_REPLY_BYTES
from proto.names import ApiVerb
from proto.replies import ErrorCode, error_reply, reply_for_exception
from services.gateway.assets import AssetHandlers
from services.gateway.console import ConsoleHandlers
from services.gateway.control import ControlHandlers
from services.gateway.dlq import DlqHandlers
from services.gateway.handlers import Handlers
from services.gateway.intake import Intake, Lane
from services.gateway.results import ResultHandlers
from shared.core.errors import RetryableError, TesseraError
from shared.core.pauses import pause_point
from shared.nats.jetstream import connect_nats
from shared.service.requeue import Requeuer
from shared.service.runtime import Runtime

__all__ = ["CHECKER_MODULES", "LARGE_VERBS", "Gateway", "Handler", "freeze_heap", "run"]

Handler = Callable[[bytes, Mapping[str, str] | None], Awaitable[Reply]]
"""One verb: request body and headers in, its reply schema out (or a TesseraError)."""
CHECKER_MODULES = ("services.gateway.handlers", "services.gateway.assets")
"""What a large submit's (or manifest's) check imports in the worker process (the kernel's
checks, numpy)."""
LARGE_VERBS = frozenset({ApiVerb.SUBMIT, ApiVerb.ASSET_CHUNK, ApiVerb.ASSET_MANIFEST})
"""The verbs whose bodies may be large (an inline scene, an asset chunk or manifest): served
on the service's connection; every other verb on the second one, which refuses large bodies."""


def freeze_heap() -> None:
    """Leave everything allocated at start-up out of the garbage collector's full passes.

    The gateway imports the kernel's checks and numpy (numba no more, since the kernel's
    lazy import): some 60,000 long-lived objects, which every full collection walks again (with
    numba, 100,000). A burst allocates enough to trigger one, and it held the loop for 0.1 to
    0.5 s in the middle of the burst (measured then), during which no request was read.
    Frozen, a full pass only walks what the service allocated since.
    """
    gc.collect()
    gc.freeze()


class Gateway:
    """The API of one gateway process: subscribe, serve, stop."""

    def __init__(self, rt: Runtime, *, intake: Intake | None = None) -> None:
        self.rt = rt
        self.intake = intake or Intake.of(rt.settings.gateway)
        self.assets = AssetHandlers(
            rt.store,
            rt.log,
            max_asset_bytes=rt.settings.gateway.asset_max_bytes,
            intake=self.intake,
        )
        self.handlers = Handlers(rt.db, rt.js, rt.names, rt.log, rt.metrics, self.intake,
                                 check_reference=self.assets.check_reference)  # fmt: skip
        # half the server's max_payload at most: the reply's envelope and counts fit beside it
        budget = min(MAX_REPLY_BYTES, rt.nc.max_payload // 2)
        self.dlq = DlqHandlers(rt.js, rt.names, rt.log, requeuer=Requeuer(rt), reply_budget=budget)
        ttl = rt.settings.gateway.result_url_ttl
        self.results = ResultHandlers(rt.db, rt.store, reply_budget=budget, url_ttl=ttl)
        self.control = ControlHandlers(rt)
        self.console = ConsoleHandlers(rt, reply_budget=budget)
        self.routes: dict[str, Handler] = {
            rt.names.api_subject(verb): handler for verb, handler in self._verbs().items()
        }
        self._tasks: set[asyncio.Task[None]] = set()
        self._subs: list[Subscription] = []
        #: the connection of every verb but submit (see the module docstring); set by start()
        self.small_nc: NATS | None = None

    def _verbs(self) -> dict[ApiVerb, Handler]:
        h, d, c, v = self.handlers, self.dlq, self.control, self.console
        return {
            ApiVerb.SUBMIT: h.submit,
            ApiVerb.STATUS: h.status,
            ApiVerb.LIST: h.list,
            ApiVerb.CANCEL: h.cancel,
            ApiVerb.RETRY: h.retry,
            ApiVerb.RESULT: self.results.result,
            ApiVerb.DLQ_LIST: d.list,
            ApiVerb.DLQ_SHOW: d.show,
            ApiVerb.DLQ_REQUEUE: d.requeue,
            ApiVerb.DLQ_PURGE: d.purge,
            ApiVerb.PRIORITY: c.priority,
            ApiVerb.PAUSE: c.pause,
            ApiVerb.RESUME: c.resume,
            ApiVerb.PROJECT_SET: c.project_set,
            ApiVerb.PROJECT_LIST: c.project_list,
            ApiVerb.PROJECT_SHOW: c.project_show,
            ApiVerb.ASSET_MISSING: self.assets.missing,
            ApiVerb.ASSET_CHUNK: self.assets.chunk,
            ApiVerb.ASSET_MANIFEST: self.assets.manifest,
            ApiVerb.JOB_TILES: v.job_tiles,
            ApiVerb.JOB_TIMELINE: v.job_timeline,
            ApiVerb.JOB_PREVIEW: v.job_preview,
            ApiVerb.WORKERS: v.workers,
            ApiVerb.FARM: v.farm,
        }

    async def start(self) -> None:
        """Subscribe to every verb in the shared queue group; requests flow once this returns.

        Opens the second connection (submits stay on the service's). The large lane's checker
        process starts in the background (``intake.warm``).
        """
        self.small_nc = small = await self._connect_small()
        self.intake.start(*CHECKER_MODULES)
        msgs, size = self.intake.pending_limits(self.rt.nc.max_payload)
        large = {self.rt.names.api_subject(verb) for verb in LARGE_VERBS}
        try:
            for subject in self.routes:
                nc = self.rt.nc if subject in large else small
                sub = await nc.subscribe(
                    subject,
                    queue=self.rt.names.queue_group,
                    cb=self._receiver(nc),
                    pending_msgs_limit=msgs,
                    pending_bytes_limit=size,
                )
                self._subs.append(sub)
            await self.rt.nc.flush()
            await small.flush()
        except BaseException:
            await self.stop(0)  # no connection or process left behind by a failed start
            raise
        self.rt.log.info("gateway listening", subjects=len(self._subs))

    async def _connect_small(self) -> NATS:
        """The connection of the small verbs: the service's servers, user and options."""
        settings = self.rt.settings
        return await connect_nats(settings, name=f"gateway:{settings.node}:small")

    def _receiver(self, nc: NATS) -> Callable[[Msg], Awaitable[None]]:
        async def on_msg(msg: Msg) -> None:
            await self._on_msg(msg, nc)

        return on_msg

    async def stop(self, grace: float) -> None:
        """Stop taking requests, then give in-flight ones ``grace`` seconds to reply.

        The subscriptions are drained, not just dropped: a request already read into the client
        library's buffer still gets its answer (served, or ``busy``) instead of leaving its
        client waiting out its whole timeout.
        """
        for sub in self._subs:
            try:
                await asyncio.wait_for(sub.drain(), max(grace, 0.1))  # type: ignore[no-untyped-call]
            except Exception:  # connection gone, or the drain did not finish in time
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        self._subs.clear()
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=grace)
            for task in late:
                task.cancel()
            if late:
                self.rt.log.warning("requests cut off at stop", count=len(late))
                await asyncio.wait(late)
        self.intake.close()
        small, self.small_nc = self.small_nc, None
        if small is not None and small is not self.rt.nc and not small.is_closed:
            await small.drain()  # the replies still buffered go out, then it closes

    async def _on_msg(self, msg: Msg, nc: NATS) -> None:
        """A request that arrived on ``nc`` (and is answered there)."""
        await pause_point("gateway.received")
        if nc is not self.rt.nc and len(msg.data) >= self.intake.large_body_bytes:
            # Only the LARGE_VERBS carry a large body (an inline scene, an asset chunk or
            # manifest), and they arrive on the service's connection; anything else that large
            # is refused unread, so it never parses on this loop nor takes a large-lane place.
            await self._refuse_large(msg, nc)
            return
        lane = self.intake.lane_for(len(msg.data))
        if lane.take():
            self._spawn(msg, lane, nc)
        else:
            await self._busy(msg, lane, nc)

    def _spawn(self, msg: Msg, lane: Lane, nc: NATS) -> None:
        task = asyncio.create_task(self._serve(msg, lane, nc))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refuse_large(self, msg: Msg, nc: NATS) -> None:
        if not msg.reply:
            return
        reply = error_reply(
            ErrorCode.INVALID,
            f"a {msg.subject} request of {len(msg.data)} bytes: only submit takes a body of "
            f"{self.intake.large_body_bytes} bytes or more (and asset.chunk, asset.manifest)",
        )
        try:
            await nc.publish(msg.reply, reply)
        except Exception:  # the connection is gone: the client's request times out
            self.rt.log.error("could not refuse a large request", exc=True, subject=msg.subject)

    async def _busy(self, msg: Msg, lane: Lane, nc: NATS) -> None:
        self.rt.metrics.gateway_busy.labels(lane=lane.name).inc()
        if not msg.reply:
            return
        retry_after = lane.retry_after()
        reply = error_reply(
            ErrorCode.BUSY,
            f"the gateway is serving {lane.capacity} {lane.name} requests; "
            f"send this one again in {retry_after:g} s",
            retry_after=retry_after,
        )
        try:
            await nc.publish(msg.reply, reply)
        except Exception:  # the connection is gone: the client's request times out
            self.rt.log.error("could not reply busy", exc=True, subject=msg.subject)

    async def _serve(self, msg: Msg, lane: Lane, nc: NATS) -> None:
        started = time.monotonic()
        try:
            reply = await self.dispatch(msg.subject, msg.data, msg.headers)
            if msg.reply:
                # not msg.respond(): it would echo the request's headers, which count
                # towards max_payload too
                await nc.publish(msg.reply, reply)
        except Exception:  # the reply itself failed (connection gone): log, keep serving
            self.rt.log.error("could not reply", exc=True, subject=msg.subject)
        finally:
            lane.release(time.monotonic() - started)

    async def dispatch(self, subject: str, data: bytes, headers: Mapping[str, str] | None) -> bytes:
        """The reply to one request: ok, a structured error, or ``internal`` for a bug."""
        handler = self.routes.get(subject)
        if handler is None:
            return error_reply(ErrorCode.BAD_REQUEST, f"{subject}: not an API subject")
        try:
            reply = encode_reply(await handler(data, headers))
        except TesseraError as exc:
            if isinstance(exc, RetryableError):
                self.rt.log.warning("request failed, retryable", subject=subject, error=str(exc))
            return reply_for_exception(exc)
        except Exception:
            self.rt.log.error("handler raised", exc=True, subject=subject)
            return error_reply(ErrorCode.INTERNAL, "internal error (logged by the gateway)")
        if len(reply) > self.rt.nc.max_payload:  # a handler that forgot its bound: say so
            self.rt.log.error("reply too large", subject=subject, size=len(reply))
            return error_reply(
                ErrorCode.INTERNAL,
                f"the reply ({len(reply)} bytes) is larger than the NATS server's max_payload "
                f"({self.rt.nc.max_payload} bytes); ask for fewer items",
            )
        return reply


async def run(rt: Runtime, stop: asyncio.Event) -> None:
    """The gateway service body: serve until ``stop`` is set, then drain."""
    gateway = Gateway(rt)
    freeze_heap()
    await gateway.start()
    try:
        await stop.wait()
    finally:
        await gateway.stop(rt.settings.process.grace_period)
