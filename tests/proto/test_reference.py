"""Scene references of Blender and POV-Ray jobs: the options each renderer takes, checked once
for the client, the gateway and the worker."""

from __future__ import annotations

from typing import Any

import pytest

from proto.api import SubmitRequest, check_reference
from shared.core.errors import DecodeError, ValidationError

SHA = "ab" * 32


def ref(**options: Any) -> dict[str, Any]:
    return {"asset": SHA, "main": "shots/shot.blend", **options}


def test_blender_takes_a_seed_and_a_pass_size() -> None:
    assert check_reference("blender", ref(seed=7, samples_per_pass=128))["seed"] == 7
    for bad in ({"seed": -1}, {"seed": 2**31}, {"samples_per_pass": 0}, {"seed": True},
                {"seed": 1.5}, {"options": ["+A0.1"]}):  # fmt: skip
        with pytest.raises(ValidationError):
            check_reference("blender", ref(**bad))


def test_povray_options_are_checked_as_the_worker_checks_them() -> None:
    assert check_reference("povray", ref(options=["+A0.1", "+R3", "-J"]))
    for bad, why in (
        (["+J"], "jitter"),
        (["Jitter=on"], "jitter"),
        (["+W1920"], "sets size"),
        (["+Oout.png"], "sets size"),
        (["+A0.1", 3], "strings"),
        (["+A"] * 33, "at most"),
    ):
        with pytest.raises(ValidationError, match=why):
            check_reference("povray", ref(options=bad))
    with pytest.raises(ValidationError, match="expected a list"):
        check_reference("povray", ref(options="+A0.1"))
    with pytest.raises(ValidationError, match="not an option of povray"):
        check_reference("povray", ref(antialias=0.1))


def test_a_reference_names_a_manifest_and_a_plain_relative_main() -> None:
    with pytest.raises(DecodeError):
        check_reference("povray", "scene.pov")
    with pytest.raises(ValidationError, match="sha256"):
        check_reference("povray", {"asset": "nope", "main": "scene.pov"})
    for main in ("/abs.pov", "../up.pov", "a\\b.pov", "a//b.pov"):
        with pytest.raises(ValidationError, match="plain relative"):
            check_reference("povray", {"asset": SHA, "main": main})


def test_a_submit_request_refuses_a_bad_option_on_construction() -> None:
    body: dict[str, Any] = {"project": "p", "width": 64, "height": 48, "spp": 1, "tile_size": 16}
    ok = SubmitRequest(renderer="povray", scene=ref(options=["+A0.1"]), **body)
    assert ok.to_body()["scene"]["options"] == ["+A0.1"]
    with pytest.raises(ValidationError, match=r"scene\.options: POV-Ray option '\+J0\.5' refused"):
        SubmitRequest(renderer="povray", scene=ref(options=["+J0.5"]), **body)
