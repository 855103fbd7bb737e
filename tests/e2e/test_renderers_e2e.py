"""``tessera submit shot.blend`` and ``tessera submit scene.pov`` through the four services.

One stack for the module (gateway, scheduler, finalizer and a worker with ``tessera``,
``blender`` and ``povray``, real processes), the ``tessera`` command run as a process of its
own with only the client's variables, as a user runs it:

- a small ``.blend`` built by :mod:`services.cli.demo_blend` (64x48, 16 samples in the file's
  own settings, which the submit takes), one pass per tile: the job's float image equals
  ``blender -b shot.blend -f 1``'s EXR value for value; submitted again with another tile size
  it uploads no chunk and equals it again;
- a ``.pov`` with an ``#include``, anti-aliased (``+A0.1 +R3``), tiles not on POV-Ray's block
  grid: the job's 16-bit PNG equals ``povray +FN16``'s own full frame pixel for pixel;
- options and sources that cannot tile exactly are refused at submit: exit 2 from the client,
  ``invalid`` from the gateway for a request that skips the client.
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import orjson
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from proto.names import ApiVerb, Names
from services.cli.demo_scenes import build_demo_blend
from services.client.api import GatewayUnavailable, TesseraClient
from services.worker.renderers.blender import read_exr_rgb
from shared.devstack.stack import Stack
from tests.e2e.conftest import FAST
from tests.e2e.flows import settle
from tests.harness import ServiceProcesses
from tests.helpers import eventually
from tests.pngread import read_png
from tests.renderers.conftest import SCENES, require
from tests.renderers.test_blender import REFERENCE

ROOT = Path(__file__).resolve().parents[2]
W, H, SPP = 64, 48, 16
POV_W, POV_H = 80, 60
AA = ("+A0.1", "+R3")

pytestmark = pytest.mark.timeout(300)


@dataclass
class Rig:
    """The module's stack: its environment, service processes and a scratch directory."""

    env: dict[str, str]
    procs: ServiceProcesses
    names: Names
    tmp: Path


async def _database(stack: Stack, sql: str) -> None:
    admin = await asyncpg.connect(stack.postgres.dsn)
    try:
        await admin.execute(sql)
    finally:
        await admin.close()


@pytest.fixture(scope="module")
async def rig(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    """The four services on a namespace of this module; every process stopped afterwards."""
    require("blender")
    require("povray")
    namespace = f"t{uuid.uuid4().hex[:12]}"
    tmp = tmp_path_factory.mktemp("renderers-e2e")
    (tmp / "objects").mkdir()
    await _database(stack, f'CREATE DATABASE "{namespace}"')
    env = (
        stack.env()
        | FAST
        | {
            "TESSERA_NAMESPACE": namespace,
            "TESSERA_DATABASE_URL": stack.postgres.dsn.rsplit("/", 1)[0] + f"/{namespace}",
            "TESSERA_OBJECT_STORE": f"file://{tmp / 'objects'}",
            "TESSERA_ASSET_CACHE_DIR": str(tmp / "asset-cache"),
            "TESSERA_RENDERERS": "tessera,blender,povray",
        }
    )
    procs = ServiceProcesses(env, tmp / "logs")
    try:
        procs.start_all(workers=1)
        yield Rig(env, procs, Names(namespace), tmp)
    finally:
        procs.stop_all()
        await _database(stack, f'DROP DATABASE IF EXISTS "{namespace}" WITH (FORCE)')


@pytest.fixture
async def api(rig: Rig, nc: NATS) -> TesseraClient:
    """An API client on the module's namespace, once the gateway answers."""
    client = TesseraClient(nc, rig.names, timeout=30)

    async def answers() -> bool:
        try:
            await client.asset_missing([])
        except GatewayUnavailable:
            return False
        return True

    await eventually(answers, timeout=60, interval=0.2, what="the gateway answers")
    return client


def tessera(rig: Rig, *args: str) -> subprocess.CompletedProcess[str]:
    """``tessera ...`` as its own process with only the client's variables (and PATH, where
    the client finds Blender to read a .blend)."""
    keep = {k: rig.env[k] for k in ("TESSERA_NATS_URL", "TESSERA_NAMESPACE")}
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "HOME": str(rig.tmp)}
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        env=env | keep,
        cwd=rig.tmp,
        capture_output=True,
        text=True,
        timeout=180,  # subprocess.run kills the child when this runs out
        check=False,
    )


async def submit_cli(rig: Rig, *args: str) -> dict[str, Any]:
    """``tessera submit ... --json``: its one reply."""
    done = await asyncio.to_thread(tessera, rig, "submit", *args, "--json", "--timeout", "60")
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr}"
    reply: dict[str, Any] = orjson.loads(done.stdout.strip().splitlines()[-1])
    return reply


class Requests:
    """Counts the requests of one API verb seen on the wire (a plain subscription beside the
    gateway's queue group gets a copy of each)."""

    def __init__(self) -> None:
        self.count = 0

    async def seen(self, msg: Msg) -> None:
        self.count += 1


def blender_full_frame(blend: Path, out_dir: Path, frame: int) -> np.ndarray:
    """``blender -b shot.blend -f FRAME``: Blender's own float32 render of the whole frame."""
    script = REFERENCE.format(spp=SPP, w=W, h=H)
    argv = [require("blender"), "-b", "-noaudio", str(blend), "--python-expr", script]
    argv += ["-o", str(out_dir / "ref_####"), "-F", "OPEN_EXR", "-f", str(frame)]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    return read_exr_rgb(out_dir / f"ref_{frame:04d}.exr")


async def float_image(api: TesseraClient, job_id: str) -> np.ndarray:
    data = await api.download(job_id, kind="float")
    image: np.ndarray = np.load(io.BytesIO(data), allow_pickle=False)
    return image


async def test_blend_renders_blenders_own_frame_and_uploads_once(
    rig: Rig, api: TesseraClient, nc: NATS
) -> None:
    shot_dir = rig.tmp / "shot"
    shot_dir.mkdir()
    blend = await asyncio.to_thread(build_demo_blend, shot_dir / "shot.blend", W, H, SPP)
    chunks = Requests()
    sub = await nc.subscribe(rig.names.api_subject(ApiVerb.ASSET_CHUNK), cb=chunks.seen)
    try:
        # Size, samples and frame come from the .blend's own render settings.
        first = await submit_cli(rig, str(blend), "--tile", "16", "--samples-per-pass", "16")
        await nc.flush()
        assert chunks.count >= 1, "the first submit uploads the .blend"
        sent = chunks.count
        second = await submit_cli(rig, str(blend), "--tile", "32", "--samples-per-pass", "16")
        await nc.flush()
        assert chunks.count == sent, "a second submit of the same file uploads no chunk"
    finally:
        await sub.unsubscribe()
    assert first["created"] and second["created"] and first["job_id"] != second["job_id"]
    reference = await asyncio.to_thread(blender_full_frame, blend, rig.tmp, 1)
    for reply in (first, second):
        status = await settle(api, reply["job_id"], rig.procs, timeout=240)
        assert status["state"] == "completed", status
        assert (status["width"], status["height"], status["frame"]) == (W, H, 1), status
        image = await float_image(api, reply["job_id"])
        assert image.dtype == np.float32 and image.shape == (H, W, 3)
        assert np.array_equal(image, reference), float(np.abs(image - reference).max())


def povray_png16(scene: Path, out: Path) -> np.ndarray:
    """``povray +FN16``: POV-Ray's own 16-bit PNG of the whole frame (without jitter)."""
    argv = [require("povray"), "-D", f"+I{scene.name}", f"+O{out}", "+FN16"]
    argv += [f"+W{POV_W}", f"+H{POV_H}", "-J", *AA]
    subprocess.run(argv, cwd=scene.parent, check=True, capture_output=True, timeout=120)
    return read_png(out.read_bytes())


async def test_pov_with_include_renders_povrays_own_png(rig: Rig, api: TesseraClient) -> None:
    scene_dir = rig.tmp / "pov"
    shutil.copytree(SCENES, scene_dir)
    scene = scene_dir / "scene.pov"
    assert '#include "props.inc"' in scene.read_text()
    options = [f"--povray-option={opt}" for opt in AA]
    reply = await submit_cli(rig, str(scene), "--width", str(POV_W), "--height", str(POV_H),
                             "--tile", "24", *options)  # fmt: skip
    status = await settle(api, reply["job_id"], rig.procs, timeout=180)
    assert status["state"] == "completed", status
    png = await api.download(reply["job_id"], kind="png")
    reference = await asyncio.to_thread(povray_png16, scene, rig.tmp / "reference.png")
    image = read_png(png)
    assert image.dtype == np.uint16 and image.shape == (POV_H, POV_W, 3)
    assert np.array_equal(image, reference), int(np.abs(image.astype(int) - reference).max())


async def test_inexact_povray_settings_are_refused_at_submit(
    rig: Rig, api: TesseraClient, nc: NATS
) -> None:
    scene_dir = rig.tmp / "refused"
    shutil.copytree(SCENES, scene_dir)
    scene = scene_dir / "scene.pov"
    done = await asyncio.to_thread(tessera, rig, "submit", str(scene), "--povray-option", "+J")
    assert done.returncode == 2, done.stderr
    assert "jitter" in done.stderr and "refused" in done.stderr
    done = await asyncio.to_thread(tessera, rig, "submit", str(scene), "--povray-option=+W999")
    assert done.returncode == 2 and "+W999" in done.stderr, done.stderr
    # A scene using radiosity: refused before anything is uploaded.
    lit = scene_dir / "lit.pov"
    lit.write_text(scene.read_text().replace(
        "global_settings { assumed_gamma 1.0 }",
        "global_settings { assumed_gamma 1.0 radiosity { count 50 } }",
    ))  # fmt: skip
    done = await asyncio.to_thread(tessera, rig, "submit", str(lit))
    assert done.returncode == 2 and "radiosity" in done.stderr, done.stderr
    # A request that skips the client: the gateway refuses it with a structured error.
    body = {"project": "e2e", "renderer": "povray", "width": 8, "height": 8, "spp": 1,
            "tile_size": 8, "scene": {"asset": "0" * 64, "main": "scene.pov",
                                      "options": ["+A0.1", "+J0.5"]}}  # fmt: skip
    msg = await nc.request(rig.names.api_subject(ApiVerb.SUBMIT), orjson.dumps(body), timeout=30)
    reply = orjson.loads(msg.data)
    assert reply["ok"] is False and reply["error"]["code"] == "invalid", reply
    assert "jitter" in reply["error"]["message"], reply
