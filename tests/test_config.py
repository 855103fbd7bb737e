"""Settings: built from a mapping, errors name the variable."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from proto.topology import Topology
from services.gateway.intake import Intake
from services.worker.scenes import SceneCache
from shared.core import config
from shared.core.config import Settings
from shared.core.errors import ConfigError
from shared.core.retry import RetryPolicy
from shared.service.runtime import topology_for

BASE = {
    "TESSERA_NATS_URL": "nats://127.0.0.1:4222",
    "TESSERA_DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/tessera",
    "TESSERA_OBJECT_STORE": "file:///var/lib/tessera",
}


def test_minimal_settings_have_documented_defaults() -> None:
    s = Settings.from_env(BASE)
    assert s.nats_urls == ("nats://127.0.0.1:4222",)
    assert s.object_store.kind == "file" and s.object_store.path == "/var/lib/tessera"
    defaults = Settings(
        nats_urls=s.nats_urls, database_url=s.database_url, object_store=s.object_store
    )
    assert dataclasses.replace(s, node="") == defaults
    assert s.node


def test_several_nats_servers() -> None:
    s = Settings.from_env(BASE | {"TESSERA_NATS_URL": "nats://a:1, nats://b:2,nats://c:3"})
    assert s.nats_urls == ("nats://a:1", "nats://b:2", "nats://c:3")


def test_s3_store() -> None:
    env = BASE | {
        "TESSERA_OBJECT_STORE": "s3://renders",
        "TESSERA_S3_ENDPOINT": "http://127.0.0.1:8333",
        "TESSERA_S3_ACCESS_KEY": "a",
        "TESSERA_S3_SECRET_KEY": "b",
    }
    store = Settings.from_env(env).object_store
    assert (store.kind, store.bucket, store.endpoint, store.region) == (
        "s3",
        "renders",
        "http://127.0.0.1:8333",
        "us-east-1",
    )


def test_to_env_round_trips() -> None:
    s = Settings.from_env(BASE | {"TESSERA_LEASE_TTL": "7", "TESSERA_NODE": "n"})
    assert Settings.from_env(s.to_env() | {"TESSERA_NODE": "n"}) == s


@pytest.mark.parametrize(
    ("changes", "variable"),
    [
        ({"TESSERA_NATS_URL": ""}, "TESSERA_NATS_URL"),
        ({"TESSERA_NATS_URL": "http://x:1"}, "TESSERA_NATS_URL"),
        ({"TESSERA_NATS_URL": "nats://x:notaport"}, "TESSERA_NATS_URL"),
        ({"TESSERA_DATABASE_URL": "mysql://x"}, "TESSERA_DATABASE_URL"),
        ({"TESSERA_DATABASE_URL": " "}, "TESSERA_DATABASE_URL"),
        ({"TESSERA_OBJECT_STORE": "file://relative/dir"}, "TESSERA_OBJECT_STORE"),
        ({"TESSERA_OBJECT_STORE": "ftp://x"}, "TESSERA_OBJECT_STORE"),
        ({"TESSERA_OBJECT_STORE": "s3://b"}, "TESSERA_S3_ACCESS_KEY"),
        ({"TESSERA_LEASE_TTL": "ten"}, "TESSERA_LEASE_TTL"),
        ({"TESSERA_LEASE_TTL": "0"}, "TESSERA_LEASE_TTL"),
        ({"TESSERA_CHECKPOINT_INTERVAL": "nan"}, "TESSERA_CHECKPOINT_INTERVAL"),
        ({"TESSERA_HEARTBEAT_INTERVAL": "9"}, "TESSERA_HEARTBEAT_INTERVAL"),
        ({"TESSERA_ACK_WAIT": "5"}, "TESSERA_ACK_WAIT"),
        ({"TESSERA_PASS_SECONDS": "61"}, "TESSERA_PASS_SECONDS"),
        ({"TESSERA_PASS_SECONDS": "-1"}, "TESSERA_PASS_SECONDS"),
        ({"TESSERA_INLINE_RESULT_BYTES": "-1"}, "TESSERA_INLINE_RESULT_BYTES"),
        ({"TESSERA_READ_AHEAD_BYTES": "lots"}, "TESSERA_READ_AHEAD_BYTES"),
        ({"TESSERA_NAMESPACE": "a.b"}, "TESSERA_NAMESPACE"),
        ({"TESSERA_LOG_LEVEL": "LOUD"}, "TESSERA_LOG_LEVEL"),
        ({"TESSERA_METRICS_HOST": "0.0.0.0:9090"}, "TESSERA_METRICS_HOST"),
        ({"TESSERA_METRICS_HOST": "http://host"}, "TESSERA_METRICS_HOST"),
        ({"TESSERA_METRICS_HOST": "-bad.example"}, "TESSERA_METRICS_HOST"),
        ({"TESSERA_METRICS_HOST": "a..b"}, "TESSERA_METRICS_HOST"),
        ({"TESSERA_DEFAULT_TILE": "big"}, "TESSERA_DEFAULT_TILE"),
        ({"TESSERA_DEFAULT_TILE": "4"}, "TESSERA_DEFAULT_TILE"),
        ({"TESSERA_TILE_SECONDS": "0"}, "TESSERA_TILE_SECONDS"),
        ({"TESSERA_MALLOC_REUSE_BYTES": "-1"}, "TESSERA_MALLOC_REUSE_BYTES"),
        ({"TESSERA_MALLOC_REUSE_BYTES": "33554433"}, "TESSERA_MALLOC_REUSE_BYTES"),
    ],
)
def test_bad_values_name_the_variable(changes: dict[str, str], variable: str) -> None:
    env = {k: v for k, v in (BASE | changes).items()}
    with pytest.raises(ConfigError, match=variable):
        Settings.from_env(env)


@pytest.mark.parametrize("host", ["127.0.0.1", "::", "::1", "localhost", "metrics.internal."])
def test_metrics_host_takes_addresses_and_names(host: str) -> None:
    assert Settings.from_env(BASE | {"TESSERA_METRICS_HOST": host}).process.metrics_host == host


def test_missing_variable_is_named() -> None:
    env = dict(BASE)
    del env["TESSERA_DATABASE_URL"]
    with pytest.raises(ConfigError, match="TESSERA_DATABASE_URL is not set"):
        Settings.from_env(env)


REPO = Path(__file__).resolve().parent.parent
BOUNDED = [(g, f) for g, f in config._knobs() if f.metadata["max"] is not None]


def test_every_default_is_within_its_knobs_bounds() -> None:
    for _, f in config._knobs():
        low, high = f.metadata["min"], f.metadata["max"]
        assert low is None or f.default >= low, f.metadata["env"]
        assert high is None or f.default <= high[0], f.metadata["env"]
    assert {f.metadata["env"] for _, f in BOUNDED} >= {
        "TESSERA_MALLOC_REUSE_BYTES",
        "TESSERA_DISPATCH_RUN",
        "TESSERA_RESULT_URL_TTL",
    }


@pytest.mark.parametrize(("group", "f"), BOUNDED, ids=lambda v: getattr(v, "name", v))
def test_a_knobs_largest_value_is_taken_and_one_more_refused_saying_why(
    group: str, f: dataclasses.Field[Any]
) -> None:
    """A knob with a largest value (``_knob(maximum=(value, why))``): that value is taken; one
    more is refused naming the variable, the bound and why."""
    most, why = f.metadata["max"]
    name = f.metadata["env"]
    s = Settings.from_env(BASE | {name: str(most), "TESSERA_NODE": "n"})
    assert getattr(getattr(s, group), f.name) == most
    with pytest.raises(ConfigError) as refused:
        Settings.from_env(BASE | {name: str(most + 1), "TESSERA_NODE": "n"})
    assert str(refused.value) == f"{name}={most + 1} must be at most {most} ({why})"


def _other_value(f: dataclasses.Field[Any]) -> str:
    """A valid value of a knob that is not its default."""
    strings = {"namespace": "t1", "metrics_host": "127.0.0.1", "log_level": "DEBUG",
               "renderers": "tessera"}  # fmt: skip
    strings["asset_cache_dir"] = "/var/cache/tessera/assets"
    strings["default_tile"] = "64"
    strings |= {"host": "0.0.0.0", "token": "viewer:v-0123456789abcdef,operator-0123456789abcdef"}
    default: Any = f.default
    maximum = f.metadata["max"]
    if f.type == "int":
        above = maximum is not None and default + 1 > maximum[0]
        return str(default // 2 if above else default + 1)  # (a default may be its largest)
    if f.type == "float":
        return str(default + 0.5)
    return strings[f.name]


@pytest.mark.parametrize(("group", "f"), list(config._knobs()), ids=lambda v: getattr(v, "name", v))
def test_every_knob_is_read_from_its_variable(group: str, f: dataclasses.Field[Any]) -> None:
    env = BASE | {f.metadata["env"]: _other_value(f), "TESSERA_NODE": "n"}
    s = Settings.from_env(env)
    assert getattr(getattr(s, group), f.name) != f.default
    assert Settings.from_env(s.to_env() | {"TESSERA_NODE": "n"}) == s


def test_operations_md_names_every_variable_from_env_reads() -> None:
    table = config.documented_table((REPO / "docs" / "operations.md").read_text())
    assert table == config.knob_table(), (
        "stale: run python -m shared.core.config docs/operations.md"
    )
    documented = set(re.findall(r"^\| `(TESSERA_[A-Z0-9_]+)`", table, re.MULTILINE))
    sources = "".join(p.read_text() for p in sorted(Path(config.__file__).parent.glob("*.py")))
    read_in_source = set(re.findall(r"TESSERA_[A-Z0-9_]+", sources))
    assert documented == config.variables() == read_in_source


def test_defaults_elsewhere_are_the_settings_defaults() -> None:
    """Topology, retry, intake and cache defaults are the settings' (one default per knob)."""
    s = Settings.from_env(BASE)
    assert Topology() == topology_for(s)
    assert (Topology().ack_wait, Topology().max_deliver) == (12, 10)
    assert s.delivery.retry_policy() == RetryPolicy(base=1.0, cap=60.0)
    intake = Intake()
    assert (intake.small.capacity, intake.large.capacity, intake.large_body_bytes) == (
        s.gateway.in_flight,
        s.gateway.large_in_flight,
        s.gateway.large_body_bytes,
    )
    cache = SceneCache()
    assert (cache.size, cache.max_bytes) == (s.worker.scene_cache, s.worker.scene_cache_bytes)
