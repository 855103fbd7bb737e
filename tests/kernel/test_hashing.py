"""input_hash: changes with anything that reaches the pixels, not with JSON formatting."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel

SETTINGS = kernel.RenderSettings(32, 24, 8)


def _leaves(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to every numeric leaf of a document."""
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _leaves(v, (*path, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _leaves(v, (*path, i))]
    return [path] if isinstance(doc, int | float) and not isinstance(doc, bool) else []


def _nudge(doc: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    value = node[path[-1]]
    node[path[-1]] = value * 0.5 if value else 0.01
    return out


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


@pytest.mark.parametrize("name", ["cornell", "spheres"])
def test_every_numeric_field_changes_the_hash(name: str) -> None:
    doc = kernel.builtin_scene(name)
    base = kernel.input_hash(doc, 0, SETTINGS)
    paths = [p for p in _leaves(doc) if p != ("version",)]
    tested = 0
    for path in paths:
        try:
            nudged = kernel.input_hash(_nudge(doc, path), 0, SETTINGS)
        except kernel.SceneError:
            continue  # the nudge left the valid range; invalid documents have no hash
        assert nudged != base, path
        tested += 1
    assert tested > 0.9 * len(paths)


def test_frame_settings_version_and_material_changes_change_the_hash() -> None:
    doc = kernel.builtin_scene("cornell")
    base = kernel.input_hash(doc, 0, SETTINGS)
    other = copy.deepcopy(doc)
    other["spheres"][6]["material"] = "white"
    variants = {
        kernel.input_hash(doc, 1, SETTINGS),
        kernel.input_hash(doc, 0, kernel.RenderSettings(32, 24, 9)),
        kernel.input_hash(doc, 0, kernel.RenderSettings(33, 24, 8)),
        kernel.input_hash(doc, 0, kernel.RenderSettings(32, 25, 8)),
        kernel.input_hash(doc, 0, kernel.RenderSettings(32, 24, 8, max_depth=5)),
        kernel.input_hash(doc, 0, kernel.RenderSettings(32, 24, 8, seed=7)),
        kernel.input_hash(other, 0, SETTINGS),
    }
    assert base not in variants and len(variants) == 7
    mesh = kernel.builtin_scene("mesh")
    flipped = copy.deepcopy(mesh)
    flipped["meshes"][1]["indices"][0] = [0, 1, 2]
    assert kernel.input_hash(mesh, 0, SETTINGS) != kernel.input_hash(flipped, 0, SETTINGS)


def test_hash_includes_kernel_version(monkeypatch: pytest.MonkeyPatch) -> None:
    import kernel.hashing

    doc = kernel.builtin_scene("cornell")
    before = kernel.input_hash(doc, 0, SETTINGS)
    monkeypatch.setattr(kernel.hashing, "KERNEL_VERSION", kernel.KERNEL_VERSION + "-next")
    assert kernel.input_hash(doc, 0, SETTINGS) != before


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32), indent=st.sampled_from([None, 0, 1, 4, "\t"]))
def test_key_order_and_whitespace_do_not_matter(seed: int, indent: int | str | None) -> None:
    doc = kernel.builtin_scene("spheres")
    text = json.dumps(_shuffled(doc, random.Random(seed)), indent=indent)
    assert kernel.input_hash(json.loads(text), 5, SETTINGS) == kernel.input_hash(doc, 5, SETTINGS)


def test_int_vs_float_and_explicit_defaults_do_not_matter() -> None:
    doc = kernel.builtin_scene("cornell")
    ints = copy.deepcopy(doc)
    ints["camera"]["position"] = [50, 52, 295.6]
    ints["camera"]["aperture"] = 0
    ints["spheres"][6]["radius"] = 16.5
    ints["meshes"] = []
    assert kernel.input_hash(ints, 0, SETTINGS) == kernel.input_hash(doc, 0, SETTINGS)


def test_hash_is_a_stable_sha256_hex() -> None:
    h = kernel.input_hash(kernel.builtin_scene("mesh"), 2, SETTINGS)
    assert len(h) == 64 and int(h, 16) >= 0
    assert h == kernel.input_hash(kernel.builtin_scene("mesh"), 2, SETTINGS)
