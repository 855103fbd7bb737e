"""Losing a NATS node: a 3-node cluster on loopback, R3 streams and buckets, two workers.

The TILES stream leader is SIGKILLed while a 16-tile job renders; the job must still complete
with the bit-identical image, every tile committed by exactly one attempt and one published PNG.
And publishes of one message id racing on an R3 stream are each answered, once stored.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.js.api import StreamConfig
from nats.js.errors import APIError

from proto import names as n
from services.client.api import TesseraClient
from shared.core.config import Settings
from shared.devstack.procs import free_port
from shared.devstack.stack import HOST, NatsServer
from shared.metadata import MetadataStore
from shared.nats.jetstream import ERR_IN_PROCESS, connect_nats, publish
from shared.objectstore import ObjectStore
from tests.e2e.conftest import reference_png
from tests.e2e.flows import request, result_bytes, settle, submit
from tests.harness import ServiceProcesses
from tests.helpers import eventually, eventually_sync

NODES = ("n1", "n2", "n3")


def _jsz(server: NatsServer) -> dict[str, object] | None:
    url = f"http://{HOST}:{server.monitor_port}/jsz"
    try:
        with urllib.request.urlopen(url, timeout=1) as reply:
            return dict(json.load(reply))
    except OSError:
        return None


def _meta_leader(servers: list[NatsServer]) -> str | None:
    """The JetStream meta leader, once every node names it and it sees both peers current."""
    metas = {}
    for server in servers:
        meta = (_jsz(server) or {}).get("meta_cluster")
        if not isinstance(meta, dict) or not meta.get("leader"):
            return None
        metas[server.name] = meta
    leaders = {m["leader"] for m in metas.values()}
    leader = leaders.pop() if len(leaders) == 1 else None
    if leader not in metas:
        return None
    replicas = metas[leader].get("replicas") or []
    return leader if len(replicas) == 2 and all(r["current"] for r in replicas) else None


@pytest.fixture
def cluster(server_dir: Path) -> Iterator[list[NatsServer]]:
    """Three JetStream nodes with stable names n1..n3, routed to each other."""
    routes = [free_port() for _ in NODES]
    servers = [
        NatsServer(server_dir / name, name=name, cluster=("tessera", route, routes))
        for name, route in zip(NODES, routes, strict=True)
    ]
    try:
        for server in servers:
            server.start()
        eventually_sync(lambda: _meta_leader(servers), timeout=30, what="a JetStream meta leader")
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def cluster_env(e2e_env: dict[str, str], cluster: list[NatsServer]) -> dict[str, str]:
    return e2e_env | {
        "TESSERA_NATS_URL": ",".join(s.url for s in cluster),
        "TESSERA_REPLICAS": "3",
    }


@pytest.fixture
def cluster_services(cluster_env: dict[str, str], tmp_path: Path) -> Iterator[ServiceProcesses]:
    procs = ServiceProcesses(cluster_env, tmp_path / "logs")
    try:
        yield procs
    finally:
        procs.stop_all()


@pytest.fixture
async def cluster_client(cluster_env: dict[str, str]) -> AsyncIterator[TesseraClient]:
    settings = Settings.from_env(cluster_env)
    nc = await connect_nats(settings, name="test-cluster-client")
    try:
        yield TesseraClient(nc, n.Names(settings.deployment.namespace), timeout=10)
    finally:
        await nc.close()


async def test_killing_the_tiles_leader_mid_render_loses_and_doubles_nothing(
    cluster: list[NatsServer],
    cluster_services: ServiceProcesses,
    cluster_client: TesseraClient,
    objects: ObjectStore,
    db: MetadataStore,
) -> None:
    cluster_services.start_all(workers=2)
    body = request(width=64, height=64, spp=2048, tile_size=16)  # 16 tiles
    reply = await submit(cluster_client, body)
    job_id = reply["job_id"]

    async def some_done() -> bool:
        tiles = await db.list_tiles(job_id)
        done = sum(t.state.value == "done" for t in tiles)
        return len(tiles) == 16 and 1 <= done <= 8

    await eventually(some_done, timeout=60, interval=0.1, what="the job is mid-render")
    js = cluster_client.nc.jetstream()
    tiles = cluster_client.names.stream(n.STREAM_TILES)
    info = await js.stream_info(tiles)
    assert info.config.num_replicas == 3 and info.cluster is not None
    leader = info.cluster.leader
    victim = next(s for s in cluster if s.name == leader)
    victim.proc.kill()
    killed_at = time.monotonic()
    rest = [s for s in cluster if s is not victim]
    quick = cluster_client.nc.jetstream(timeout=1)

    async def new_leader() -> str | None:
        try:
            fresh = await quick.stream_info(tiles)
        except (nats.errors.TimeoutError, APIError):  # election in progress: no leader yet
            return None
        return fresh.cluster.leader if fresh.cluster and fresh.cluster.leader != leader else None

    elected = await eventually(new_leader, timeout=30, interval=0.1, what="a new TILES leader")
    election = time.monotonic() - killed_at
    status = await settle(cluster_client, job_id, cluster_services, timeout=120)
    assert await result_bytes(objects, status) == reference_png(body)
    done = Counter(
        a.tile_index for a in await db.attempts(job_id) if a.tile_index is not None
        and a.outcome == "done"
    )  # fmt: skip
    assert done == Counter(range(16)), f"one done attempt per tile: {done}"
    dead = [name for name, p in cluster_services.procs.items() if not p.alive()]
    assert not dead, f"services died with the node: {dead}\n{cluster_services.logs()}"
    renders = await objects.list(f"renders/{job_id}/")
    assert len([o for o in renders if o.key.endswith(".png")]) == 1
    print(f"killed TILES leader {leader}; {elected} elected after {election:.1f} s;"
          f" survivors {[s.name for s in rest]}")  # fmt: skip
    victim.start()  # the node rejoins; teardown stops all three


async def test_publishes_of_one_id_racing_on_a_replicated_stream_store_it_once(
    cluster: list[NatsServer],
) -> None:
    """A publish that reaches an R3 stream's leader while an earlier one of the same id is still
    being replicated is answered 409 "in process" (10158), as a retry after a leader change can
    be: :func:`publish` retries it and gets the duplicate ack, never a rejection."""
    nc = await nats.connect([s.url for s in cluster])
    try:
        js = nc.jetstream()
        config = StreamConfig(name="RACE", subjects=["race.>"], num_replicas=3)

        async def created() -> bool:
            try:
                await js.add_stream(config)
            except (nats.errors.TimeoutError, APIError):  # the stream's group still forming
                return False
            return True

        await eventually(created, timeout=30, interval=0.2, what="an R3 stream")

        async def raw(msg_id: str) -> int | None:
            try:
                await js.publish("race.raw", b"x", headers={"Nats-Msg-Id": msg_id}, timeout=10)
            except APIError as exc:
                return exc.err_code
            return None

        raced = Counter(await asyncio.gather(*(raw("raw") for _ in range(20))))
        assert raced[ERR_IN_PROCESS[0]] > 0, f"the race this test is about did not happen: {raced}"

        for round_ in range(5):
            acks = await asyncio.gather(
                *(publish(js, "race.ours", b"x", msg_id=f"ours-{round_}") for _ in range(20))
            )
            assert sum(not a.duplicate for a in acks) == 1, [a.duplicate for a in acks]
            assert len({a.seq for a in acks}) == 1
        info = await js.stream_info("RACE", subjects_filter="race.ours")
        assert (info.state.subjects or {}).get("race.ours") == 5
    finally:
        await nc.close()
