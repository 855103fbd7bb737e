"""The layers: every import of a Tessera module points down the table (docs/architecture.md).

    shared.core  <-  proto  <-  adapters  <-  shared.service  <-  services  <-  services.cli
                                (shared.nats, shared.metadata, shared.objectstore)

``kernel`` stands alone (it imports only itself) and only services use it; ``shared.devstack``
(the embedded servers) sits on proto and is used by the ``tessera`` command and the tests. The
services (gateway, scheduler, worker, finalizer, client) do not import each other; the
``tessera`` command (``services.cli``) sits on top and may import all of them. The web console
(``services.web``) sits on the client: of the services it imports only ``services.client`` (it
reaches the farm through the gateway's API, never a store). Every import
counts: module level, inside functions and under ``TYPE_CHECKING``. ``core`` and ``proto`` also
import no I/O library (no NATS, no database, no HTTP), so the client and the wire contract stay
light.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("shared", "proto", "services", "kernel")

#: layer -> the module prefixes in it
LAYERS: dict[str, tuple[str, ...]] = {
    "core": ("shared.core",),
    "proto": ("proto",),
    "adapters": ("shared.nats", "shared.metadata", "shared.objectstore"),
    "devstack": ("shared.devstack",),
    "service": ("shared.service",),
    "kernel": ("kernel",),
    "services": tuple(
        f"services.{s}" for s in ("gateway", "scheduler", "worker", "finalizer", "client")
    ),
    "console": ("services.web",),
    "command": ("services.cli",),
    "root": ("shared", "services"),  # the empty package roots themselves
}
#: layer -> the layers it may import (and itself, except between services)
MAY_IMPORT: dict[str, frozenset[str]] = {
    "core": frozenset({"core"}),
    "proto": frozenset({"core", "proto"}),
    "adapters": frozenset({"core", "proto", "adapters"}),
    "devstack": frozenset({"core", "proto", "adapters", "devstack"}),
    "service": frozenset({"core", "proto", "adapters", "service"}),
    "kernel": frozenset({"kernel"}),
    "services": frozenset({"core", "proto", "adapters", "service", "kernel", "services"}),
    "console": frozenset({"core", "proto", "adapters", "service", "services", "console"}),
    "command": frozenset(LAYERS),
    "root": frozenset(),
}
#: Leaf modules any layer may import: they import nothing but the standard library's typing
#: (checked below), so no arrow can run upwards through them. ``kernel.rect`` is the one
#: ``Rect``, shared by the kernel (which imports nothing of Tessera) and everything above it.
LEAVES = frozenset({"kernel.rect"})
#: Third-party modules core and proto may import (besides the standard library); nats.js.api
#: is nats-py's configuration dataclasses (the topology as data), not its client.
PURE_THIRD_PARTY = {"core": ("numpy",), "proto": ("msgpack", "orjson", "nats.js.api")}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    path: str  # its file, relative to the repo
    line: int
    target: str  # the imported module (a submodule when ``from pkg import sub``)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules(root: Path = REPO) -> dict[str, Path]:
    return {
        module_name(p, root): p
        for pkg in PACKAGES
        for p in sorted((root / pkg).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def imports_of(module: str, path: Path, known: set[str], root: Path = REPO) -> list[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = str(path.relative_to(root))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[Import, None] = {}  # one entry per (line, target), in order
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update((Import(module, rel, node.lineno, a.name), None) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for a in node.names:
                sub = f"{source}.{a.name}"
                ours = source.partition(".")[0] in PACKAGES
                target = sub if sub in known or not ours else source
                found[Import(module, rel, node.lineno, target)] = None
    return list(found)


def layer_of(module: str) -> str | None:
    best: tuple[int, str] | None = None
    for layer, prefixes in LAYERS.items():
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if layer == "root" and module != prefix:
                    continue
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), layer)
    return best[1] if best else None


def service_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def violations(root: Path = REPO) -> list[str]:
    modules = all_modules(root)
    known = set(modules)
    out: list[str] = []
    for module, path in modules.items():
        layer = layer_of(module)
        if layer is None:
            out.append(f"{path.relative_to(root)}: module {module} is in no layer")
            continue
        for imp in imports_of(module, path, known, root):
            top = imp.target.partition(".")[0]
            where = f"{imp.path}:{imp.line}: {module} ({layer}) imports {imp.target}"
            if top not in PACKAGES:
                allowed = PURE_THIRD_PARTY.get(layer)
                if allowed is not None and not (
                    top in sys.stdlib_module_names
                    or any(imp.target == a or imp.target.startswith(a + ".") for a in allowed)
                ):
                    out.append(f"{where}: {layer} imports no I/O library")
                continue
            target = layer_of(imp.target)
            if imp.target in LEAVES:
                continue
            if target is None:
                out.append(f"{where}, which is in no layer")
            elif target not in MAY_IMPORT[layer]:
                out.append(f"{where} ({target}): {layer} may import {sorted(MAY_IMPORT[layer])}")
            elif layer == target == "services" and service_of(module) != service_of(imp.target):
                out.append(f"{where}: services do not import each other")
            elif (
                layer == "console"
                and target == "services"
                and (service_of(imp.target) != "services.client")
            ):
                out.append(f"{where}: the web console reaches the farm through the client only")
    return out


def test_a_leaf_imports_nothing_but_typing() -> None:
    modules = all_modules()
    for leaf in LEAVES:
        targets = {i.target for i in imports_of(leaf, modules[leaf], set(modules))}
        assert targets <= {"__future__.annotations", "typing.NamedTuple", "typing"}, (leaf, targets)


def test_layer_table_covers_every_module() -> None:
    assert [m for m in all_modules() if layer_of(m) is None] == []


def test_imports_point_down_the_layers() -> None:
    found = violations()
    if found:
        pytest.fail(f"{len(found)} import(s) against the layers:\n" + "\n".join(found))


def test_the_checker_reports_each_wrong_arrow_with_file_and_line(tmp_path: Path) -> None:
    """The checker itself, on a small tree: function-level, TYPE_CHECKING and ``from pkg import
    sub`` imports all count; an unplaced module and an I/O library in proto are reported."""
    files = {
        "shared/__init__.py": "",
        "shared/core/__init__.py": "",
        "shared/core/errors.py": "def f():\n    from shared.service.runtime import Runtime\n",
        "shared/service/__init__.py": "",
        "shared/service/runtime.py": "from shared.core import errors\n",
        "shared/legacy.py": "",
        "services/__init__.py": "",
        "services/worker/__init__.py": "",
        "services/worker/loop.py": "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from services.finalizer import assemble\n",
        "services/finalizer/__init__.py": "",
        "services/finalizer/assemble.py": "from services.worker.loop import X\n",
        "services/cli/__init__.py": "import services.worker.loop\nimport shared.legacy\n",
        "proto/__init__.py": "import json\nimport nats\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = sorted(violations(tmp_path))
    assert found == [
        "proto/__init__.py:2: proto (proto) imports nats: proto imports no I/O library",
        "services/cli/__init__.py:2: services.cli (command) imports shared.legacy, which is in no "
        "layer",
        "services/finalizer/assemble.py:1: services.finalizer.assemble (services) imports "
        "services.worker.loop: services do not import each other",
        "services/worker/loop.py:3: services.worker.loop (services) imports "
        "services.finalizer.assemble: services do not import each other",
        "shared/core/errors.py:2: shared.core.errors (core) imports shared.service.runtime "
        "(service): core may import ['core']",
        "shared/legacy.py: module shared.legacy is in no layer",
    ]
