"""The client-only install: ``pip install tessera`` without the ``render`` extra (no numba).

Three levels: the client's modules import nothing of the render stack (a fresh interpreter, fast);
a real virtualenv with only the base dependencies, whose ``tessera`` runs the client commands
against a real gateway and refuses the server-side ones with the install line; and the README's
"Use Tessera from Python" example, run as it is from that virtualenv against the four services.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from proto.names import new_job_id
from services import cli
from services.client.api import GatewayUnavailable, TesseraClient
from services.gateway.app import Gateway
from shared.service.runtime import Runtime
from tests.e2e.conftest import client, e2e_env, e2e_settings, services  # noqa: F401  (fixtures)
from tests.gateway.conftest import gateway, runtime  # noqa: F401  (fixtures)
from tests.harness import ServiceProcesses
from tests.helpers import eventually

REPO = Path(__file__).resolve().parent.parent
#: What the package is built from (pyproject's packages, README for the metadata).
SOURCES = ("pyproject.toml", "README.md", "services", "shared", "kernel", "proto")
#: The client commands, each with arguments it parses.
CLIENT_ARGV = (
    ["submit", "cornell", "--width", "64", "--frames", "1-3", "--json"],
    ["status", "J"],
    ["watch", "J", "K"],
    ["get", "J", "-o", "out.png"],
    ["list", "--state", "queued"],
    ["cancel", "J"],
    ["retry", "J"],
    ["dlq", "list"],
    ["dlq", "show", "1"],
    ["dlq", "requeue", "--dry-run"],
    ["dlq", "purge", "--all"],
)
#: What the client must not import (and the render extra brings).
RENDER_STACK = {
    "numba",
    "llvmlite",
    "numpy",
    "PIL",
    "isal",
    "asyncpg",
    "aioboto3",
    "botocore",
    "uvloop",
}
OBJ = "v 0 0 0\nv 1 0 0\nv 1 1 0\nf 1 2 3\n"


def scene_with_obj(directory: Path, *, radius: float = 1.0) -> Path:
    """A scene file whose mesh is an OBJ file beside it (``radius`` < 0: an invalid scene)."""
    (directory / "tri.obj").write_text(OBJ)
    scene = {
        "camera": {"position": [0, 0, 5], "look_at": [0, 0, 0], "vfov": 40},
        "materials": {"white": {"type": "diffuse", "color": [0.8, 0.8, 0.8]}},
        "spheres": [{"center": [0, 0, 0], "radius": radius, "material": "white"}],
        "meshes": [{"obj": "tri.obj", "material": "white"}],
    }
    path = directory / "scene.json"
    path.write_text(json.dumps(scene))
    return path


# -- the client's modules, in a fresh interpreter -------------------------------------------------

_IMPORT_CHECK = """
import json, pkgutil, sys, importlib, importlib.abc
BLOCKED = set(json.loads(sys.argv[3]))
class Blocked(importlib.abc.MetaPathFinder):
    # as on the client-only install: an optional import (guarded by ImportError) finds nothing
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Blocked())
import proto, services.client
for package in (proto, services.client):
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)
from services.client.actions import load_scene
doc = load_scene(sys.argv[1])
assert doc["meshes"][0]["vertices"] == [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]], doc
surface = sorted({m.partition(".")[0] for m in sys.modules})
from services import cli
parser = cli.build_parser()
for argv in json.loads(sys.argv[2]):
    parser.parse_args(argv)
print(json.dumps({"surface": surface, "cli": sorted({m.partition(".")[0] for m in sys.modules})}))
"""


def test_the_client_imports_nothing_of_the_render_stack(tmp_path: Path) -> None:
    """Every module of proto/ and services/client/, a scene file read, every client command parsed.

    With the full install present, the render stack's packages blocked as if missing: a module
    that imports one unconditionally fails the check; an optional import (the full install's
    local scene validation) finds nothing, as on the client-only install.
    """
    env = os.environ | {"PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _IMPORT_CHECK,
            str(scene_with_obj(tmp_path)),
            json.dumps(CLIENT_ARGV),
            json.dumps(sorted(RENDER_STACK)),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert sorted(RENDER_STACK & set(loaded["surface"])) == []
    # build_parser also imports the modules of up, demo, gc and top: still no kernel
    assert sorted({"numba", "llvmlite", "numpy", "PIL"} & set(loaded["cli"])) == []


def test_every_kernel_name_loads_on_first_use() -> None:
    """``kernel``'s lazy names: each listed once, each found in the module it names."""
    import kernel

    assert sorted(kernel.__all__) == sorted(kernel._HOME)
    for name in kernel.__all__:
        assert getattr(kernel, name) is getattr(
            importlib.import_module(f"kernel.{kernel._HOME[name]}"), name
        )
    with pytest.raises(AttributeError, match="no attribute 'render_tiles'"):
        kernel.render_tiles  # type: ignore[attr-defined]  # noqa: B018


def test_the_placeholders_list_what_the_render_modules_register() -> None:
    """``RENDER_COMMANDS`` (shown on a client-only install) matches the real registrations."""
    for name, commands in cli.RENDER_COMMANDS.items():
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(name).register(sub)
        assert tuple(sub.choices) == commands, name


def test_render_modules_cover_the_render_extra() -> None:
    """Every import name of the ``render`` extra's packages counts as the render stack, and the
    base dependencies hold none of them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def dist(requirement: str) -> str:
        return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")

    render = {dist(r) for r in project["optional-dependencies"]["render"]}
    assert {"numba", "numpy", "asyncpg"} <= render
    assert not render & {dist(r) for r in project["dependencies"]}
    modules = {
        module
        for module, dists in packages_distributions().items()
        if render & {d.lower().replace("_", "-") for d in dists} and not module.startswith("_")
    }
    assert modules and modules <= cli.RENDER_MODULES


# -- a virtualenv with only the base dependencies ------------------------------------------------


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without the test run's Python paths (the venv must use its own copy)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return env | (extra or {})


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``bin/`` of a fresh virtualenv (no system site-packages) with ``pip install .`` only.

    Installed from a copy of the sources, so the build leaves nothing in the checkout; pip uses
    the configured index and its cache. Removed afterwards.
    """
    root = tmp_path_factory.mktemp("light")
    try:
        src = root / "src"
        src.mkdir()
        for name in SOURCES:
            if (REPO / name).is_dir():
                shutil.copytree(
                    REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__")
                )
            else:
                shutil.copy2(REPO / name, src / name)
        subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120)
        bin_dir = root / "venv" / "bin"
        install = subprocess.run(
            [bin_dir / "python", "-m", "pip", "install", "--quiet", str(src)],
            capture_output=True,
            text=True,
            env=_clean_env(),
            cwd=root,
            timeout=400,
            check=False,
        )
        assert install.returncode == 0, f"pip install . failed:\n{install.stdout}{install.stderr}"
        yield bin_dir
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_in(
    bin_dir: Path, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a program of the venv (``tessera``, ``python``) outside the checkout."""
    return subprocess.run(
        [str(bin_dir / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        env=_clean_env(env),
        cwd=bin_dir,
        timeout=60,
        check=False,
    )


async def arun_in(
    bin_dir: Path, *argv: str, env: dict[str, str], cwd: Path, timeout: float = 60
) -> tuple[int, str, str]:
    """:func:`run_in` without blocking the loop (an in-process gateway must answer meanwhile)."""
    proc = await asyncio.create_subprocess_exec(
        str(bin_dir / argv[0]),
        *argv[1:],
        env=_clean_env(env),
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.venv
@pytest.mark.timeout(600)
def test_the_client_only_install_has_no_render_stack(light_venv: Path) -> None:
    for module in ("numba", "llvmlite", "numpy", "asyncpg", "aioboto3"):
        done = run_in(light_venv, "python", "-c", f"import {module}")
        assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr, module
    helped = run_in(light_venv, "tessera", "--help")
    assert helped.returncode == 0, helped.stderr
    assert (
        "submit" in helped.stdout
        and "not installed: pip install 'tessera[render]'" in helped.stdout
    )
    submit_help = run_in(light_venv, "tessera", "submit", "--help")
    assert submit_help.returncode == 0 and "--frames" in submit_help.stdout, submit_help.stderr
    version = run_in(light_venv, "tessera", "version")
    assert version.returncode == 0 and "kernel not installed" in version.stdout, version.stderr
    for argv in (
        ["up", "--data-dir", "x"],
        ["demo", "--help"],
        ["gc", "--dry-run"],
        ["top"],
        ["gateway"],
        ["worker"],
        ["web"],
    ):
        refused = run_in(light_venv, "tessera", *argv)
        assert refused.returncode == 2, (argv, refused.stderr)
        assert f"tessera {argv[0]}: needs the render stack" in refused.stderr, refused.stderr
        assert "pip install 'tessera[render]'" in refused.stderr
        assert "Traceback" not in refused.stderr


@pytest.mark.venv
@pytest.mark.timeout(600)
async def test_the_client_only_install_talks_to_a_real_gateway(
    light_venv: Path,
    gateway: Gateway,  # noqa: F811
    runtime: Runtime,  # noqa: F811
    settings_env: dict[str, str],
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in settings_env.items() if k != "TESSERA_DATABASE_URL"}
    status, _, err = await arun_in(
        light_venv, "tessera", "status", new_job_id(), env=env, cwd=tmp_path
    )
    assert status == 3 and "error[not_found]:" in err, err
    small = ("--width", "32", "--height", "24", "--spp", "2", "--tile", "16", "--project", "light")
    scene = scene_with_obj(tmp_path)
    status, out, err = await arun_in(
        light_venv, "tessera", "submit", str(scene), *small, env=env, cwd=tmp_path
    )
    assert status == 0, err
    job = await runtime.db.get_job(out.strip())
    assert job is not None and job.project == "light" and job.width == 32
    bad = scene_with_obj(tmp_path, radius=-1.0)  # the gateway's kernel validates it
    status, _, err = await arun_in(
        light_venv, "tessera", "submit", str(bad), *small, env=env, cwd=tmp_path
    )
    assert status == 3 and "error[invalid]" in err and "spheres[0].radius" in err, err


def readme_example() -> str:
    """The Python block of the README's "Use Tessera from Python" section."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Use Tessera from Python\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "no ```python block in the README's 'Use Tessera from Python' section"
    return match.group(1)


@pytest.mark.venv
@pytest.mark.timeout(600)
async def test_the_readme_example_runs_on_the_client_only_install(
    light_venv: Path,
    services: ServiceProcesses,  # noqa: F811
    client: TesseraClient,  # noqa: F811
    e2e_env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    services.start_all(workers=1)

    async def answers() -> bool:
        try:
            await client.list(limit=1)
        except GatewayUnavailable:  # still starting
            return False
        return True

    await eventually(answers, timeout=60, interval=0.2, what="the gateway answers")
    example = tmp_path / "example.py"
    example.write_text(readme_example())
    env = {k: v for k, v in e2e_env.items() if k != "TESSERA_DATABASE_URL"}
    status, out, err = await arun_in(
        light_venv, "python", str(example), env=env, cwd=tmp_path, timeout=180
    )
    assert status == 0, f"{err}\n{services.logs()}"
    job_id = out.split(":", 1)[0].strip()
    final = await client.status(job_id)
    png = (tmp_path / "cornell.png").read_bytes()
    assert final["state"] == "completed" and (final["width"], final["height"]) == (160, 120)
    assert png.startswith(b"\x89PNG") and hashlib.sha256(png).hexdigest() == final["result_sha256"]
