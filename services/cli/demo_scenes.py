"""The scenes ``tessera demo --renderer blender|povray`` renders, built here, not checked in.

Blender: :mod:`services.cli.demo_blend` run by Blender's own Python builds a ``.blend``
(:func:`build_demo_blend`). POV-Ray: a ``.pov`` with an include file, written from the text
below (:func:`write_demo_pov`); both are then uploaded as assets like any user's scene.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["DEMO_INC", "DEMO_POV", "BlenderMissing", "build_demo_blend", "write_demo_pov"]

DEMO_BLEND_SCRIPT = Path(__file__).with_name("demo_blend.py")
#: seconds Blender may take to start and save the demo file
BUILD_TIMEOUT = 120.0

DEMO_INC = """\
// Materials and a macro for demo.pov (an include file travels with the scene's asset).
#declare Chrome = texture {
  pigment { rgb <0.8, 0.8, 0.85> } finish { reflection 0.6 specular 0.8 }
}
#declare Checker = texture {
  pigment { checker rgb <0.9, 0.9, 0.9> rgb <0.2, 0.25, 0.3> scale 0.5 }
}
#macro Pillar(X, Z, C)
  cylinder { <X, 0, Z>, <X, 1.5, Z>, 0.15 texture { pigment { rgb C } finish { specular 0.4 } } }
#end
"""

DEMO_POV = """\
// Tessera's POV-Ray demo: reflections, hard shadows and an include file.
#version 3.7;
#include "demo.inc"
global_settings { assumed_gamma 1.0 }
camera { location <0, 2, -5> look_at <0, 0.6, 0> angle 50 }
light_source { <4, 6, -4> color rgb 1 }
light_source { <-5, 3, -2> color rgb 0.4 }
sky_sphere { pigment { gradient y color_map { [0 rgb <0.6, 0.7, 0.9>] [1 rgb <0.1, 0.2, 0.5>] } } }
plane { y, 0 texture { Checker } }
sphere { <-0.8, 0.7, 0>, 0.7 texture { Chrome } }
box { <0.3, 0, -0.4>, <1.1, 0.8, 0.4> rotate y*25 pigment { rgb <0.2, 0.5, 0.9> } }
torus { 0.35, 0.1 rotate x*90 translate <0.2, 0.45, -1.2> pigment { rgb <1.0, 0.8, 0.2> } }
Pillar(1.6, 1.0, <0.9, 0.3, 0.1>)
Pillar(-2.0, 1.5, <0.3, 0.8, 0.3>)
"""


class BlenderMissing(Exception):
    """``blender`` is not on PATH (or could not build the file)."""


def build_demo_blend(out: Path, width: int = 640, height: int = 480, samples: int = 128) -> Path:
    """Build the demo ``.blend`` at ``out`` with Blender's Python; its render settings are
    ``width`` x ``height`` and ``samples`` Cycles samples."""
    blender = shutil.which("blender")
    if blender is None:
        raise BlenderMissing("blender is not on PATH (apt-get install blender)")
    argv = [blender, "-b", "-noaudio", "--factory-startup", "--python", str(DEMO_BLEND_SCRIPT),
            "--", str(out), str(width), str(height), str(samples)]  # fmt: skip
    try:
        subprocess.run(argv, check=True, capture_output=True, timeout=BUILD_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BlenderMissing(f"blender could not build {out}: {exc}") from exc
    return out


def write_demo_pov(directory: Path) -> Path:
    """Write ``demo.pov`` and ``demo.inc`` into ``directory``; the path of ``demo.pov``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "demo.inc").write_text(DEMO_INC)
    main = directory / "demo.pov"
    main.write_text(DEMO_POV)
    return main
