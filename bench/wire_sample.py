"""What an operator sees on the wire (not a test): the sample output in docs/operations.md.

Run: ``python -m bench.wire_sample``. Starts the embedded stack (NATS, PostgreSQL, directory
object store) with the production names (no namespace), the services one at a time so each
stream still holds its messages when it is read, submits one small job and prints what the
JetStream API returns — the same data ``nats stream view`` and ``nats kv get`` print: every
stored message's subject, sequence and headers (with the msgpack body decoded, which the nats CLI
cannot do), a lease and a progress pointer as stored in their buckets, and every stream's,
consumer's and bucket's description. A garbage tile message is published last, to show
the dead letter the worker makes of it.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import msgpack
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from proto import names as n
from proto.api import SubmitRequest
from proto.topology import Topology
from services.cli.local import ServiceProcesses
from services.client.api import TesseraClient
from shared.core.config import Settings
from shared.devstack.stack import Stack
from shared.nats.jetstream import connect_nats

WITHIN = 120.0


async def _until(what: str, check: Callable[[], Awaitable[Any]]) -> Any:
    """Poll ``check`` (bounded) until it returns something truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WITHIN
    while not (found := await check()):
        if loop.time() > deadline:
            raise SystemExit(f"wire_sample: {what} did not happen within {WITHIN:g} s")
        await asyncio.sleep(0.05)
    return found


def _body(data: bytes) -> str:
    try:
        decoded = msgpack.unpackb(data, raw=False)
    except Exception:  # msgpack raises many types; JSON advisories and such are shown as text
        return data[:200].decode(errors="replace")
    if isinstance(decoded, dict) and isinstance(decoded.get("payload"), bytes):
        decoded["payload"] = f"<{len(decoded['payload'])} bytes>"
    return repr(decoded)


async def view_stream(js: JetStreamContext, stream: str) -> None:
    """Every message stored in ``stream``, like ``nats stream view <stream>``."""
    state = (await js.stream_info(stream)).state
    print(
        f"$ # stream {stream}: {state.messages} messages (seq {state.first_seq}..{state.last_seq})"
    )
    for seq in range(state.first_seq, state.last_seq + 1):
        try:
            msg = await js.get_msg(stream, seq)
        except NotFoundError:
            continue  # acked from a work queue, or deleted
        print(f"[{msg.seq}] Subject: {msg.subject}")
        for key, value in (msg.headers or {}).items():
            print(f"  {key}: {value}")
        print(f"  body ({len(msg.data or b'')} bytes msgpack), decoded: {_body(msg.data or b'')}")
    print()


async def kv_get(js: JetStreamContext, bucket: str, key: str) -> bool:
    """One key's stored value, like ``nats kv get <bucket> <key>``; False if it has none."""
    try:
        msg = await js.get_msg(f"KV_{bucket}", subject=f"$KV.{bucket}.{key}")
    except NotFoundError:
        return False
    print(f"$ # kv {bucket} {key}: revision {msg.seq}, headers {dict(msg.headers or {})}")
    print((msg.data or b"").decode())
    print()
    return True


async def descriptions(js: JetStreamContext, topology: Topology) -> None:
    """Every stream's and consumer's description, like ``nats stream info`` / ``consumer info``."""
    print("$ # descriptions")
    for stream in topology.streams():
        info = await js.stream_info(stream.name or "")
        print(f"stream {info.config.name}: {info.config.description}")
    for stream_name, consumer in topology.consumers():
        cinfo = await js.consumer_info(stream_name, consumer.name or "")
        print(f"consumer {stream_name}/{cinfo.name}: {cinfo.config.description}")
    print()


async def sample(env: Mapping[str, str], procs: ServiceProcesses) -> None:
    """Walk one job through the services, printing each stream while it holds messages."""
    settings = Settings.from_env(env)
    nc = await connect_nats(settings, name="wire-sample")
    js, topology = nc.jetstream(), Topology()
    names = topology.names
    try:
        procs.wait_started(procs.start("gateway"))
        client = TesseraClient(nc, names, timeout=10)
        request = SubmitRequest(project="docs", scene="cornell", width=64, height=32, spp=4096,
                                tile_size=32)  # fmt: skip
        job = (await client.submit(request))["job_id"]
        await view_stream(js, names.stream(n.STREAM_JOBS))

        procs.wait_started(procs.start("scheduler"))
        tiles = names.stream(n.STREAM_TILES)

        async def planned() -> bool:
            return (await js.stream_info(tiles)).state.messages == 2

        await _until("planning", planned)
        await view_stream(js, tiles)

        procs.start("worker", env={"TESSERA_CHECKPOINT_INTERVAL": "0.5"})
        leases, progress = names.bucket(n.BUCKET_LEASES), names.bucket(n.BUCKET_PROGRESS)

        async def a_lease() -> bool:
            return any([await kv_get(js, leases, n.lease_key_tile(job, i)) for i in (0, 1)])

        async def a_pointer() -> bool:
            return any([await kv_get(js, progress, n.progress_key(job, i)) for i in (0, 1)])

        await _until("a lease", a_lease)
        await _until("a progress pointer", a_pointer)

        procs.start("finalizer")

        async def completed() -> bool:
            return bool((await client.status(job))["state"] == "completed")

        await _until("completion", completed)
        await view_stream(js, names.stream(n.STREAM_EVENTS))

        # a tile message nobody can decode: the worker copies it to the DLQ (reason invalid)
        await js.publish(names.tile_subject(job, 9), b"not msgpack", headers={"X-Sample": "1"})
        dlq = names.stream(n.STREAM_DLQ)

        async def dead_lettered() -> bool:
            return (await js.stream_info(dlq)).state.messages == 1

        await _until("a dead letter", dead_lettered)
        await view_stream(js, dlq)
        await descriptions(js, topology)
    finally:
        await nc.close()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="tessera-wire-") as tmp, Stack(Path(tmp)) as stack:
        env = stack.env()
        procs = ServiceProcesses(env, stack.data_dir / "logs")
        try:
            asyncio.run(sample(env, procs))
        finally:
            procs.stop_all()


if __name__ == "__main__":
    main()
