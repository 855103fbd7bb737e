"""The ``tessera`` client commands against an in-process gateway."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import orjson
import pytest

import kernel
from proto.names import new_job_id
from services import cli
from services.client.commands import EPILOG
from services.gateway.app import Gateway
from shared.core.lifecycle import JobTrigger
from shared.devstack.procs import free_port
from shared.objectstore import open_object_store, sha256_hex
from shared.service.runtime import Runtime
from tests.client.conftest import CliRunner

SMALL = ("--width", "64", "--height", "48", "--spp", "4", "--tile", "16", "--project", "cli")


async def test_submit_prints_the_job_id_and_creates_the_job(
    gateway: Gateway, runtime: Runtime, tessera: CliRunner
) -> None:
    result = await tessera("submit", "cornell", *SMALL)
    assert result.status == 0, result.err
    job_id = result.out.strip()
    job = await runtime.db.get_job(job_id)
    assert job is not None and job.project == "cli" and job.width == 64
    again = await tessera("submit", "cornell", *SMALL)
    assert again.out.strip() == job_id and "duplicate" in again.err


async def test_a_frame_range_submits_one_job_per_frame(
    gateway: Gateway, runtime: Runtime, tessera: CliRunner
) -> None:
    result = await tessera("submit", "cornell", *SMALL, "--frames", "3-5", "--key", "shot7")
    assert result.status == 0, result.err
    ids = result.out.split()
    assert len(set(ids)) == 3
    jobs = [await runtime.db.get_job(job_id) for job_id in ids]
    assert [j.frame for j in jobs if j] == [3, 4, 5]


async def test_submit_a_scene_file(
    gateway: Gateway, runtime: Runtime, tessera: CliRunner, tmp_path: Path
) -> None:
    path = tmp_path / "scene.json"
    path.write_text(json.dumps(kernel.builtin_scene("spheres")))
    result = await tessera("submit", str(path), *SMALL, "--json")
    assert result.status == 0, result.err
    reply = orjson.loads(result.out)
    assert reply["ok"] is True and reply["created"] is True
    missing = await tessera("submit", str(tmp_path / "nope.json"), *SMALL)
    assert missing.status == 2 and "nope.json" in missing.err


async def test_status_json_and_list(gateway: Gateway, tessera: CliRunner) -> None:
    job_id = (await tessera("submit", "cornell", *SMALL)).out.strip()
    status = await tessera("status", job_id, "--json")
    assert status.status == 0
    assert orjson.loads(status.out)["state"] == "queued"
    text = await tessera("status", job_id)
    assert "queued" in text.out and job_id in text.out
    listed = await tessera("list", "--state", "queued", "--json")
    assert [j["job_id"] for j in orjson.loads(listed.out)["jobs"]] == [job_id]


async def test_client_commands_need_no_database_url(
    gateway: Gateway, tessera: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TESSERA_DATABASE_URL", raising=False)
    job_id = (await tessera("submit", "cornell", *SMALL)).out.strip()
    status = await tessera("status", job_id, "--json")
    assert status.status == 0, status.err
    assert orjson.loads(status.out)["job_id"] == job_id
    monkeypatch.setenv("TESSERA_DATABASE_URL", "mysql://not-postgres")
    bad = await tessera("list")  # set, it is still checked
    assert bad.status == 2 and "TESSERA_DATABASE_URL" in bad.err


async def test_unknown_job_exits_3_with_the_code(gateway: Gateway, tessera: CliRunner) -> None:
    result = await tessera("status", new_job_id())
    assert result.status == 3
    assert "error[not_found]:" in result.err


async def test_unknown_builtin_exits_3(gateway: Gateway, tessera: CliRunner) -> None:
    result = await tessera("submit", "teapot", *SMALL)
    assert result.status == 3 and "error[invalid]" in result.err


async def test_no_gateway_exits_4_within_the_timeout(tessera: CliRunner) -> None:
    started = time.monotonic()
    result = await tessera("status", new_job_id(), "--timeout", "1")
    assert result.status == 4, result.err
    assert time.monotonic() - started < 5
    assert "gateway" in result.err


async def test_unreachable_nats_exits_4(
    tessera: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TESSERA_NATS_URL", f"nats://127.0.0.1:{free_port()}")
    result = await tessera("list", "--timeout", "1")
    assert result.status == 4 and "NATS" in result.err


async def test_bad_configuration_exits_2_naming_the_variable(
    tessera: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TESSERA_NATS_URL")
    result = await tessera("list")
    assert result.status == 2 and "TESSERA_NATS_URL" in result.err
    monkeypatch.setenv("TESSERA_NATS_URL", "http://nowhere")
    assert (await tessera("list")).status == 2


async def test_get_of_a_job_that_is_not_completed_fails_clearly(
    gateway: Gateway, tessera: CliRunner, tmp_path: Path
) -> None:
    job_id = (await tessera("submit", "cornell", *SMALL)).out.strip()
    result = await tessera("get", job_id, "-o", str(tmp_path / "out.png"))
    assert result.status == 1
    assert "queued" in result.err and "completed" in result.err
    assert not (tmp_path / "out.png").exists()


async def test_get_and_watch_a_completed_job(
    gateway: Gateway, runtime: Runtime, tessera: CliRunner, tmp_path: Path
) -> None:
    job_id = (await tessera("submit", "cornell", *SMALL)).out.strip()
    png, floats = b"\x89PNG not really", b"npy bytes"
    async with await open_object_store(runtime.settings.object_store) as store:
        sha = await store.put(f"renders/{job_id}/x.png", png)
        await store.put(f"renders/{job_id}/x.npy", floats)
    for trigger in (JobTrigger.TILES_PLANNED, JobTrigger.ALL_TILES_DONE):
        await runtime.db.transition_job(job_id, trigger)
    await runtime.db.complete_job(
        job_id,
        result_location=f"renders/{job_id}/x.png",
        result_sha256=sha,
        float_location=f"renders/{job_id}/x.npy",
    )
    nowhere = tmp_path / "missing" / "out.png"
    refused = await tessera("get", job_id, "-o", str(nowhere))
    assert refused.status == 2 and f"cannot write {nowhere}" in refused.err, refused.err
    assert "Traceback" not in refused.err and not nowhere.parent.exists()
    half = await tessera("get", job_id, "-o", str(tmp_path / "a.png"), "--float", str(nowhere))
    assert half.status == 2 and not (tmp_path / "a.png").exists(), "both files or neither"
    out, flt = tmp_path / "out.png", tmp_path / "out.npy"
    result = await tessera("get", job_id, "-o", str(out), "--float", str(flt))
    assert result.status == 0, result.err
    assert out.read_bytes() == png and flt.read_bytes() == floats
    watched = await tessera("watch", job_id, "--timeout", "5")
    assert watched.status == 0 and f"{job_id} completed" in watched.out


async def test_watch_ends_non_zero_when_a_job_is_cancelled(
    gateway: Gateway, tessera: CliRunner
) -> None:
    ids = (await tessera("submit", "cornell", *SMALL, "--frames", "0-1")).out.split()
    for job_id in ids:
        assert (await tessera("cancel", job_id)).status == 0
    result = await tessera("watch", *ids, "--interval", "0.2")
    assert result.status == 1
    assert all(f"{job_id} cancelled" in result.out for job_id in ids)


async def test_cancel_twice_and_retry_report_illegal_state(
    gateway: Gateway, tessera: CliRunner
) -> None:
    job_id = (await tessera("submit", "cornell", *SMALL)).out.strip()
    assert (await tessera("retry", job_id)).status == 3
    assert (await tessera("cancel", job_id)).status == 0
    second = await tessera("cancel", job_id)
    assert second.status == 3 and "error[illegal_state]" in second.err


async def test_dlq_list_is_empty(gateway: Gateway, tessera: CliRunner) -> None:
    result = await tessera("dlq", "list", "--json")
    assert result.status == 0
    assert orjson.loads(result.out)["dead_letters"] == []


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["submit", "--help"])
    assert "exit status" in capsys.readouterr().out
    assert "4 unavailable" in EPILOG


@pytest.mark.parametrize(
    "argv",
    [
        ("watch", "J", "--interval", "0"),
        ("watch", "J", "--interval", "nan"),
        ("submit", "cornell", "--watch", "--interval", "-1"),
        ("status", "J", "--timeout", "inf"),
        ("top", "--interval", "0"),
        ("top", "--window", "-5"),
        ("gc", "--timeout", "0"),
        ("up", "--workers", "0"),
    ],
)
def test_non_positive_numbers_are_usage_errors(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(list(argv))
    assert exit_.value.code == 2
    assert "must be" in capsys.readouterr().err


async def test_gc_and_top_without_a_database_url_are_configuration_errors(
    tessera: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never asyncpg's fallback to libpq's defaults (PGHOST, the local socket)."""
    monkeypatch.delenv("TESSERA_DATABASE_URL")
    monkeypatch.setenv("PGHOST", "127.0.0.1")  # a fallback would try this and hang or succeed
    for argv in (("gc", "--dry-run"), ("top", "--once")):
        result = await tessera(*argv)
        assert result.status == 2, result
        assert "TESSERA_DATABASE_URL is not set" in result.err and "Traceback" not in result.err


async def test_get_needs_no_object_store_settings(
    gateway: Gateway,
    runtime: Runtime,
    tessera: CliRunner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job_id = (await tessera("submit", "cornell", *SMALL)).out.strip()
    png, floats = os.urandom(900_000), os.urandom(1000)  # the PNG takes three chunks
    await _complete(runtime, job_id, png, floats)
    monkeypatch.delenv("TESSERA_OBJECT_STORE")
    out, flt = tmp_path / "out.png", tmp_path / "out.npy"
    result = await tessera("get", job_id, "-o", str(out), "--float", str(flt), "--inline")
    assert result.status == 0, result.err
    assert out.read_bytes() == png and flt.read_bytes() == floats
    gc = await tessera("gc", "--dry-run")  # a command that does read the store says so
    assert gc.status == 2 and "TESSERA_OBJECT_STORE is not set" in gc.err, gc.err


async def _complete(runtime: Runtime, job_id: str, png: bytes, floats: bytes) -> None:
    sha = await runtime.store.put(f"renders/{job_id}/{sha256_hex(png)}.png", png)
    float_key = f"renders/{job_id}/{sha256_hex(floats)}.npy"
    await runtime.store.put(float_key, floats)
    for trigger in (JobTrigger.TILES_PLANNED, JobTrigger.ALL_TILES_DONE):
        await runtime.db.transition_job(job_id, trigger)
    await runtime.db.complete_job(
        job_id,
        result_location=f"renders/{job_id}/{sha}.png",
        result_sha256=sha,
        float_location=float_key,
    )


def _mesh_scene(vertices: int) -> dict[str, object]:
    scene = kernel.builtin_scene("cornell")
    verts = [
        [50.0 + (i % 97) * 0.01, 40.0 + (i // 97) * 0.01, 80.123456789] for i in range(vertices)
    ]
    tris = [[i, i + 1, i + 2] for i in range(vertices - 2)]
    scene["meshes"] = [{"vertices": verts, "indices": tris, "material": "white"}]
    return scene


async def test_a_scene_within_the_limits_is_sent_and_an_oversize_one_is_a_usage_error(
    gateway: Gateway, tessera: CliRunner, tmp_path: Path
) -> None:
    """Issue 14: a 1.4 MB scene died with a MaxPayloadError traceback (exit 1)."""
    path = tmp_path / "mesh.json"
    path.write_text(json.dumps(_mesh_scene(28_000)))
    assert 1_300_000 < path.stat().st_size < 2_000_000
    result = await tessera("submit", str(path), *SMALL)
    assert result.status == 0, result.err
    big = tmp_path / "huge.json"
    big.write_text(json.dumps(_mesh_scene(150_000)))
    assert big.stat().st_size > 5 * 1024 * 1024
    refused = await tessera("submit", str(big), *SMALL)
    assert refused.status == 2, refused.err
    assert "exceeds the limit 4194304" in refused.err
    assert "Traceback" not in refused.err


async def test_an_invalid_scene_file_is_a_usage_error_where_the_kernel_is_installed(
    gateway: Gateway, tessera: CliRunner, tmp_path: Path
) -> None:
    """The full install validates a scene file before sending it (the client-only install
    leaves that to the gateway: tests/test_light_client.py)."""
    scene = kernel.builtin_scene("cornell")
    scene["spheres"][0]["radius"] = -1.0
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(scene))
    result = await tessera("submit", str(path), *SMALL)
    assert result.status == 2, result.err
    assert "spheres[0].radius" in result.err and "Traceback" not in result.err
