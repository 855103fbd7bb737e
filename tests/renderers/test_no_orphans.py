"""A SIGKILLed worker leaves no renderer process behind (PR_SET_PDEATHSIG on each child)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import eventually_sync
from tests.renderers.conftest import ROOT, group_members, require

#: a scene that parses for ever (a loop of a billion steps): POV-Ray is busy until killed
ENDLESS_POV = "#declare I = 0;\n#while (I < 1000000000)\n  #declare I = I + 1;\n#end\n"


def standin(kind: str, path: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.renderers.worker_standin", kind, str(path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def gone(pid: int) -> bool:
    return group_members(pid) == []


def test_crash_inside_a_blender_pass_kills_blender(demo_blend: Path, tmp_path: Path) -> None:
    require("blender")
    # (the killed stand-in's Blender scratch directory is left behind: under the test's directory)
    env = {"TESSERA_CRASH_AT": "worker.blender_mid_pass:2", "TMPDIR": str(tmp_path)}
    worker = standin("blender", demo_blend, env)
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        assert line.startswith("blender-pid "), (
            line,
            worker.stderr.read() if worker.stderr else "",
        )
        pid = int(line.split()[1])
        assert worker.wait(timeout=60) == -signal.SIGKILL
        assert worker.stderr is not None
        assert "crash point worker.blender_mid_pass reached" in worker.stderr.read()
        eventually_sync(lambda: gone(pid), what=f"blender {pid} gone", timeout=10)
    finally:
        worker.kill()
        worker.wait()
        worker.stdout and worker.stdout.close()
        worker.stderr and worker.stderr.close()


def test_sigkilled_worker_kills_povray(tmp_path: Path) -> None:
    require("povray")
    scene = tmp_path / "endless.pov"
    scene.write_text(ENDLESS_POV)
    # (the killed stand-in's POV-Ray scratch directory is left behind: under the test's directory)
    worker = standin("povray", scene, {"TMPDIR": str(tmp_path)})
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        assert line.startswith("povray-pid "), (line, worker.stderr.read() if worker.stderr else "")
        pid = int(line.split()[1])
        assert not gone(pid)
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL
        eventually_sync(lambda: gone(pid), what=f"povray {pid} gone", timeout=10)
    finally:
        worker.kill()
        worker.wait()
        worker.stdout and worker.stdout.close()
        worker.stderr and worker.stderr.close()
