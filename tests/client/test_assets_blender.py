"""The client lists a .blend's external files with Blender itself (``blender`` on PATH).

The .blend files are made by Blender's own Python here (no binary is checked in): one image
datablock each, whose file path is relative, relative and missing, relative but outside the
.blend's directory, or absolute.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from services.client.assets import AssetRefused, collect_files

BUILD = """
import bpy, json, sys
for out, image_path in json.loads(sys.argv[sys.argv.index("--") + 1]):
    bpy.ops.wm.read_factory_settings(use_empty=True)
    img = bpy.data.images.new("tex", 4, 4)
    img.source = "FILE"
    img.filepath = image_path
    img.use_fake_user = True
    bpy.ops.wm.save_as_mainfile(filepath=out, relative_remap=False)  # keep the path as given
"""

CASES = {
    "good": "//tex/wood.png",
    "missing": "//tex/gone.png",
    "outside": "//../wood.png",
    "absolute": "/opt/textures/wood.png",
}


@pytest.fixture(scope="module")
def blends(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    blender = shutil.which("blender")
    assert blender is not None, "the renderer tests need Blender (apt-get install blender)"
    root = tmp_path_factory.mktemp("blends")
    script = root / "build.py"
    script.write_text(BUILD)
    (root / "tex").mkdir()
    (root / "tex" / "wood.png").write_bytes(b"\x89PNG not really")
    made = {name: root / f"{name}.blend" for name in CASES}
    jobs = json.dumps([[str(made[name]), image] for name, image in CASES.items()])
    cmd = [blender, "-b", "-noaudio", "--factory-startup", "--python", str(script), "--", jobs]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)  # one start for all
    return made


async def test_a_blend_with_a_relative_texture_takes_it_along(blends: dict[str, Path]) -> None:
    files = await collect_files(blends["good"], "blender")
    assert [f.rel for f in files] == ["good.blend", "tex/wood.png"]


@pytest.mark.parametrize(
    ("case", "problem"),
    [
        ("missing", "does not exist: a missing file"),
        ("outside", "not a file inside its directory"),
        ("absolute", "uses the absolute path '/opt/textures/wood.png'"),
    ],
)
async def test_a_blend_that_cannot_be_an_asset_is_refused(
    blends: dict[str, Path], case: str, problem: str
) -> None:
    with pytest.raises(AssetRefused, match=problem) as refused:
        await collect_files(blends[case], "blender")
    assert refused.value.status == 2


async def test_without_blender_on_path_a_blend_is_refused(
    blends: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(AssetRefused, match="blender is not on PATH"):
        await collect_files(blends["good"], "blender")
