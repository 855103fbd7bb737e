"""Validation names the field and the limit; OBJ files load relative to the scene file."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kernel
from kernel import scene as limits


def _cornell() -> dict[str, Any]:
    return kernel.builtin_scene("cornell")


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("spheres", 3, "radius"), 0, "spheres[3].radius must be > 0"),
        (("spheres", 3, "radius"), -1.0, "spheres[3].radius must be > 0"),
        (("spheres", 0, "radius"), 2e7, "spheres[0].radius must be <= 1e+07"),
        (("spheres", 2, "center"), [0, float("nan"), 0], "spheres[2].center[1] must be a finite"),
        (("spheres", 2, "center"), [0, 1], "spheres[2].center must be a list of 3 numbers"),
        (("spheres", 1, "material"), "gold", "spheres[1].material must name one of the materials"),
        (("spheres", 1, "colour"), [1, 1, 1], "spheres[1].colour is not a known field"),
        (("camera", "vfov"), 180, "camera.vfov must be <= 179"),
        (("camera", "vfov"), 0, "camera.vfov must be > 0"),
        (("camera", "vfov"), True, "camera.vfov must be a number"),
        (("camera", "up"), [0, 0, 0], "camera.up must not be the zero vector"),
        (("camera", "up"), [0, 0.085224, 2], "camera.up must not be parallel"),
        (("camera", "look_at"), [50, 52, 295.6], "camera.look_at must differ from camera.position"),
        (
            ("camera", "orbit", "degrees_per_frame"),
            400,
            "camera.orbit.degrees_per_frame must be <= 360",
        ),
        (("materials", "glass", "ior"), 0.5, "materials.glass.ior must be >= 1"),
        (("materials", "red", "color"), [1.5, 0, 0], "materials.red.color[0] must be <= 1"),
        (("materials", "mirror", "roughness"), 2, "materials.mirror.roughness must be <= 1"),
        (
            ("materials", "light", "emission"),
            [-1, 0, 0],
            "materials.light.emission[0] must be >= 0",
        ),
        (("materials", "red", "type"), "plastic", "materials.red.type must be one of"),
        (("sky",), [0, 0, 2e6], "sky[2] must be <= 1e+06"),
        (("version",), 2, "version must be 1"),
    ],
)
def test_errors_name_field_and_limit(path: tuple[Any, ...], value: Any, message: str) -> None:
    with pytest.raises(kernel.SceneError, match=message.replace("[", r"\[").replace("+", r"\+")):
        kernel.validate_scene(_set(_cornell(), path, value))


def test_count_limits_are_enforced() -> None:
    doc = _cornell()
    doc["spheres"] = doc["spheres"] * (limits.MAX_SPHERES // 9 + 1)
    with pytest.raises(kernel.SceneError, match=f"spheres must have at most {limits.MAX_SPHERES}"):
        kernel.validate_scene(doc)
    doc = _cornell()
    doc["materials"] = {f"m{i}": {"type": "diffuse", "color": [0, 0, 0]} for i in range(300)}
    with pytest.raises(kernel.SceneError, match=f"at most {limits.MAX_MATERIALS} entries"):
        kernel.validate_scene(doc)
    tri = {"vertices": [[0, 0, 0], [1, 0, 0], [0, 1, 0]], "material": "white"}
    doc = _cornell()
    doc["meshes"] = [{**tri, "indices": [[0, 1, 2]] * (limits.MAX_TRIANGLES // 4 + 1)}] * 4
    with pytest.raises(kernel.SceneError, match=f"at most {limits.MAX_TRIANGLES} triangles"):
        kernel.validate_scene(doc)


def test_mesh_errors() -> None:
    base = {
        "vertices": [[0, 0, 0], [1, 0, 0], [0, 1, 0]],
        "indices": [[0, 1, 2]],
        "material": "white",
    }
    cases: list[tuple[dict[str, Any], str]] = [
        ({"indices": [[0, 1, 3]]}, r"meshes\[0\].indices\[0\]\[2\] must be >= 0 and < 3"),
        ({"indices": [[0, 1, 1.5]]}, r"meshes\[0\].indices\[0\]\[2\] must be an integer"),
        ({"indices": []}, r"meshes\[0\].indices must have at least 1 entry"),
        ({"scale": 0}, r"meshes\[0\].scale must be > 0"),
        ({"translate": [9.5e6, 0, 0], "scale": 1e6}, r"meshes\[0\].vertices must lie within"),
        ({"obj": "x.obj"}, r"meshes\[0\].obj must be inlined"),
    ]
    for change, message in cases:
        doc = _cornell()
        doc["meshes"] = [{**base, **change}]
        with pytest.raises(kernel.SceneError, match=message):
            kernel.validate_scene(doc)


def test_settings_and_frame_limits() -> None:
    doc = _cornell()
    for bad, message in [
        (kernel.RenderSettings(0, 10, 1), "settings.width must be between 1 and 8192"),
        (kernel.RenderSettings(10, 9000, 1), "settings.height must be between 1 and 8192"),
        (kernel.RenderSettings(10, 10, 0), "settings.spp must be between 1"),
        (kernel.RenderSettings(10, 10, 1, max_depth=0), "settings.max_depth must be between 1"),
        (kernel.RenderSettings(10, 10, 1, seed=-1), "settings.seed must be between 0"),
    ]:
        with pytest.raises(kernel.SceneError, match=message):
            kernel.prepare(doc, 0, bad)
    with pytest.raises(kernel.SceneError, match="frame must be between 0"):
        kernel.prepare(doc, -1, kernel.RenderSettings(10, 10, 1))


def test_render_arguments_are_checked() -> None:
    p = kernel.prepare(_cornell(), 0, kernel.RenderSettings(8, 6, 1))
    with pytest.raises(ValueError, match="rect"):
        kernel.render_tile(p, kernel.Rect(0, 0, 9, 6), 0, 1, np.zeros((6, 9, 3)))
    with pytest.raises(ValueError, match=r"shape \(6, 8, 3\)"):
        kernel.render_tile(p, kernel.Rect(0, 0, 8, 6), 0, 1, np.zeros((6, 8, 3), np.float32))
    with pytest.raises(ValueError, match="sample_start <= sample_end"):
        kernel.render_full(p, 2, 1, np.zeros((6, 8, 3)))


def test_unknown_builtin_and_validated_model() -> None:
    with pytest.raises(kernel.SceneError, match="scene name must be one of cornell, spheres, mesh"):
        kernel.builtin_scene("teapot")
    assert kernel.BUILTIN_SCENES == ("cornell", "spheres", "mesh")
    for name in kernel.BUILTIN_SCENES:
        scene = kernel.validate_scene(kernel.builtin_scene(name))
        assert kernel.validate_scene(scene.to_doc()) == scene or name == "mesh"
    assert len(kernel.validate_scene(kernel.builtin_scene("cornell")).spheres) == 9


OBJ = """# a unit quad and a triangle, with texture/normal references and a negative index
v 0 0 0
v 1 0 0
v 1 1 0
v 0 1 0
vt 0 0
vn 0 0 1
f 1/1/1 2/1/1 3/1/1 4/1/1
f -4//1 -3//1 -1//1
"""


def test_obj_meshes_load_relative_to_the_scene_file(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "quad.obj").write_text(OBJ)
    (tmp_path / "scenes").mkdir()
    doc = _cornell()
    doc["meshes"] = [{"obj": "../models/quad.obj", "material": "white", "scale": 10.0}]
    scene_file = tmp_path / "scenes" / "scene.json"
    scene_file.write_text(json.dumps(doc))
    loaded = kernel.load_scene_file(scene_file)
    mesh = loaded["meshes"][0]
    assert "obj" not in mesh and mesh["scale"] == 10.0
    assert mesh["vertices"] == [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 1.0, 0.0]]
    assert mesh["indices"] == [[0, 1, 2], [0, 2, 3], [0, 1, 3]]
    json.dumps(loaded)  # self-contained and JSON-able
    kernel.prepare(loaded, 0, kernel.RenderSettings(4, 4, 1))


def test_obj_and_file_errors(tmp_path: Path) -> None:
    scene_file = tmp_path / "scene.json"
    doc = _cornell()
    doc["meshes"] = [{"obj": "missing.obj", "material": "white"}]
    scene_file.write_text(json.dumps(doc))
    with pytest.raises(kernel.SceneError, match=r"meshes\[0\].obj .*cannot be read"):
        kernel.load_scene_file(scene_file)
    (tmp_path / "bad.obj").write_text("v 0 0 0\nv 1 0 0\nf 1 2 7\n")
    doc["meshes"] = [{"obj": "bad.obj", "material": "white"}]
    scene_file.write_text(json.dumps(doc))
    with pytest.raises(kernel.SceneError, match="line 3: face index 7 must refer to one of the 2"):
        kernel.load_scene_file(scene_file)
    scene_file.write_text("{not json")
    with pytest.raises(kernel.SceneError, match="invalid JSON"):
        kernel.load_scene_file(scene_file)
