"""Settings: built from a mapping, errors name the variable."""

from __future__ import annotations

import pytest

from shared.config import Settings, Tuning
from shared.errors import ConfigError

BASE = {
    "TESSERA_NATS_URL": "nats://127.0.0.1:4222",
    "TESSERA_DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/tessera",
    "TESSERA_OBJECT_STORE": "file:///var/lib/tessera",
}


def test_minimal_settings_have_documented_defaults() -> None:
    s = Settings.from_env(BASE)
    assert s.nats_urls == ("nats://127.0.0.1:4222",)
    assert s.object_store.kind == "file" and s.object_store.path == "/var/lib/tessera"
    assert s.tuning == Tuning()
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
    ],
)
def test_bad_values_name_the_variable(changes: dict[str, str], variable: str) -> None:
    env = {k: v for k, v in (BASE | changes).items()}
    with pytest.raises(ConfigError, match=variable):
        Settings.from_env(env)


@pytest.mark.parametrize("host", ["127.0.0.1", "::", "::1", "localhost", "metrics.internal."])
def test_metrics_host_takes_addresses_and_names(host: str) -> None:
    assert Settings.from_env(BASE | {"TESSERA_METRICS_HOST": host}).tuning.metrics_host == host


def test_missing_variable_is_named() -> None:
    env = dict(BASE)
    del env["TESSERA_DATABASE_URL"]
    with pytest.raises(ConfigError, match="TESSERA_DATABASE_URL is not set"):
        Settings.from_env(env)
