"""Build Tessera's demo ``.blend`` with Blender's own Python (no binary is checked in).

Run inside Blender: ``blender -b --factory-startup --python services/cli/demo_blend.py -- OUT
[WIDTH HEIGHT SAMPLES]`` (default 640 480 128: the scene's own render settings, which
``tessera submit`` takes unless told otherwise).
The scene: a camera, a sun and a point light, a ground plane, a glossy sphere, a red cube and an
emissive torus, each with its own material, rendered by Cycles. It imports only ``bpy`` and the
standard library, because Blender's Python does not see Tessera's virtualenv.
"""

from __future__ import annotations

import math
import sys

import bpy


def _material(name: str, color: tuple[float, float, float], **inputs: float) -> bpy.types.Material:
    mat = bpy.data.materials.new(name)
    mat.use_nodes = True
    bsdf = mat.node_tree.nodes["Principled BSDF"]
    bsdf.inputs["Base Color"].default_value = (*color, 1.0)
    for key, value in inputs.items():
        bsdf.inputs[key.replace("_", " ").title()].default_value = value
    return mat


def _emission(name: str, color: tuple[float, float, float], strength: float) -> bpy.types.Material:
    mat = _material(name, color)
    bsdf = mat.node_tree.nodes["Principled BSDF"]
    bsdf.inputs["Emission"].default_value = (*color, 1.0)
    bsdf.inputs["Emission Strength"].default_value = strength
    return mat


def _add(obj: bpy.types.Object, mat: bpy.types.Material) -> None:
    obj.data.materials.append(mat)


def build(path: str, width: int = 640, height: int = 480, samples: int = 128) -> None:
    """Replace the open file with the demo scene and save it as ``path``."""
    bpy.ops.wm.read_factory_settings(use_empty=True)
    scene = bpy.context.scene
    scene.render.engine = "CYCLES"
    scene.render.resolution_x, scene.render.resolution_y = width, height
    scene.render.resolution_percentage = 100
    scene.cycles.samples = samples
    scene.frame_start, scene.frame_end = 1, 24

    bpy.ops.mesh.primitive_plane_add(size=20.0, location=(0.0, 0.0, 0.0))
    _add(bpy.context.object, _material("Ground", (0.8, 0.8, 0.75), roughness=0.6))
    bpy.ops.mesh.primitive_uv_sphere_add(radius=1.0, location=(-1.2, 0.0, 1.0))
    _add(bpy.context.object, _material("Chrome", (0.9, 0.9, 0.95), metallic=1.0, roughness=0.1))
    bpy.ops.mesh.primitive_cube_add(size=1.2, location=(1.3, 0.6, 0.6))
    cube = bpy.context.object
    _add(cube, _material("Red", (0.8, 0.1, 0.08), roughness=0.4))
    # An animated rotation, so frames differ and `--frame` matters.
    cube.rotation_euler = (0.0, 0.0, 0.0)
    cube.keyframe_insert("rotation_euler", frame=1)
    cube.rotation_euler = (0.0, 0.0, math.pi / 2)
    cube.keyframe_insert("rotation_euler", frame=24)
    bpy.ops.mesh.primitive_torus_add(
        location=(0.4, -1.4, 0.25), major_radius=0.5, minor_radius=0.15
    )
    _add(bpy.context.object, _emission("Glow", (0.2, 0.6, 1.0), 4.0))

    bpy.ops.object.light_add(type="SUN", location=(4.0, -4.0, 8.0), rotation=(0.6, 0.2, 0.8))
    bpy.context.object.data.energy = 3.0
    bpy.ops.object.light_add(type="POINT", location=(-3.0, -2.0, 3.0))
    bpy.context.object.data.energy = 400.0

    bpy.ops.object.camera_add(location=(0.0, -7.0, 3.2), rotation=(math.radians(68), 0.0, 0.0))
    scene.camera = bpy.context.object

    world = bpy.data.worlds.new("Sky")
    world.use_nodes = True
    world.node_tree.nodes["Background"].inputs["Color"].default_value = (0.05, 0.07, 0.1, 1.0)
    scene.world = world
    bpy.ops.wm.save_as_mainfile(filepath=path)


if __name__ == "__main__":
    argv = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else []
    if len(argv) not in (1, 4):
        sys.exit(
            "usage: blender -b --factory-startup --python demo_blend.py -- OUT.blend "
            "[WIDTH HEIGHT SAMPLES]"
        )
    build(argv[0], *(int(a) for a in argv[1:]))
