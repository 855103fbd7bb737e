"""Reading and checking the environment: URLs, numbers with their bounds, cross-knob relations.

Every failure is a :class:`~shared.core.errors.ConfigError` naming the variable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from shared.core.config.common import ObjectStoreSettings
from shared.core.errors import ConfigError

if TYPE_CHECKING:
    from shared.core.config.settings import Settings

T = TypeVar("T", int, float)


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigError(f"{name} is not set (see the Configuration section of the README)")
    return value


def _nats_urls(raw: str) -> tuple[str, ...]:
    urls = tuple(u.strip() for u in raw.split(",") if u.strip())
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("nats", "tls") or not parts.hostname:
            raise ConfigError(
                f"TESSERA_NATS_URL: {url!r} is not a nats://host:port URL "
                "(several servers are separated by commas)"
            )
        _port_of("TESSERA_NATS_URL", url)
    return urls


def _port_of(name: str, url: str) -> None:
    try:
        urlsplit(url).port  # noqa: B018 - accessing .port validates it
    except ValueError as exc:
        raise ConfigError(f"{name}: {url!r} has an invalid port") from exc


def _database_url(raw: str) -> str:
    parts = urlsplit(raw)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError(
            f"TESSERA_DATABASE_URL: {raw!r} is not a postgresql://user@host:port/db DSN"
        )
    _port_of("TESSERA_DATABASE_URL", raw)
    return raw


def _object_store(env: Mapping[str, str]) -> ObjectStoreSettings:
    raw = _required(env, "TESSERA_OBJECT_STORE")
    parts = urlsplit(raw)
    if parts.scheme == "file":
        if parts.netloc or not parts.path.startswith("/"):
            raise ConfigError(
                f"TESSERA_OBJECT_STORE: {raw!r} must be file:///absolute/path (three slashes)"
            )
        return ObjectStoreSettings(kind="file", path=parts.path)
    if parts.scheme == "s3":
        if not parts.netloc or parts.path not in ("", "/"):
            raise ConfigError(f"TESSERA_OBJECT_STORE: {raw!r} must be s3://bucket")
        endpoint = env.get("TESSERA_S3_ENDPOINT", "").strip()
        if endpoint and urlsplit(endpoint).scheme not in ("http", "https"):
            raise ConfigError(f"TESSERA_S3_ENDPOINT: {endpoint!r} is not an http(s) URL")
        return ObjectStoreSettings(
            kind="s3",
            bucket=parts.netloc,
            endpoint=endpoint,
            access_key=_required(env, "TESSERA_S3_ACCESS_KEY"),
            secret_key=_required(env, "TESSERA_S3_SECRET_KEY"),
            region=env.get("TESSERA_S3_REGION", "").strip() or "us-east-1",
        )
    raise ConfigError(f"TESSERA_OBJECT_STORE: {raw!r} must start with file:/// or s3://")


def _group(group: type[Any], env: Mapping[str, str]) -> Any:
    """One settings group from the variables of its knobs (unset ones keep their default)."""
    values: dict[str, object] = {}
    for f in dataclasses.fields(group):
        name: str = f.metadata["env"]
        raw = env.get(name, "").strip()
        if not raw:
            continue
        minimum = f.metadata["min"]
        if f.type == "int":
            values[f.name] = _most(name, _int(name, raw, int(minimum)), f.metadata["max"])
        elif f.type == "float":
            values[f.name] = _most(name, _float(name, raw, float(minimum)), f.metadata["max"])
        else:
            values[f.name] = raw
    return group(**values)


def _int(name: str, raw: str, minimum: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be >= {minimum}")
    return value


def _float(name: str, raw: str, minimum: float) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if not (value >= minimum and value < float("inf")):
        raise ConfigError(f"{name}={raw} must be a finite number >= {minimum}")
    return value


def _most(name: str, value: T, maximum: tuple[float, str] | None) -> T:
    """``value``, unless the knob has a largest value (``(maximum, why)``) and it exceeds it."""
    if maximum is not None and value > maximum[0]:
        most, why = maximum
        raise ConfigError(f"{name}={value} must be at most {most} ({why})")
    return value


def _check_relations(s: Settings) -> None:
    """The checks that span knobs or need more than their bounds: the clocks, the names."""
    _check_clocks(s)
    _check_names(s)


def _check_clocks(s: Settings) -> None:
    leases, delivery, worker = s.leases, s.delivery, s.worker
    if leases.heartbeat_interval * 2 > leases.ttl:
        raise ConfigError(
            f"TESSERA_HEARTBEAT_INTERVAL={leases.heartbeat_interval} must be at most half of "
            f"TESSERA_LEASE_TTL={leases.ttl}, or one late renew loses the lease"
        )
    if delivery.ack_wait <= leases.ttl:
        raise ConfigError(
            f"TESSERA_ACK_WAIT={delivery.ack_wait} must exceed TESSERA_LEASE_TTL={leases.ttl}, "
            "so a dead owner's lease expires before its message is redelivered"
        )
    if worker.pass_seconds * 2 > worker.progress_timeout:
        raise ConfigError(
            f"TESSERA_PASS_SECONDS={worker.pass_seconds} must be at most half of "
            f"TESSERA_PROGRESS_TIMEOUT={worker.progress_timeout}, or the watchdog aborts healthy "
            "passes"
        )
    if delivery.retry_cap < delivery.retry_base:
        raise ConfigError(f"TESSERA_RETRY_CAP={delivery.retry_cap} must be >= TESSERA_RETRY_BASE")


def _check_names(s: Settings) -> None:
    process = s.process
    namespace = s.deployment.namespace
    if namespace and not namespace.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(
            f"TESSERA_NAMESPACE={namespace!r} may hold only letters, digits, '-' and '_'"
        )
    if not _is_host(process.metrics_host):
        raise ConfigError(
            f"TESSERA_METRICS_HOST={process.metrics_host!r} must be an IP address or a host name"
        )
    if not _is_host(s.web.host):
        raise ConfigError(f"TESSERA_WEB_HOST={s.web.host!r} must be an IP address or a host name")
    try:
        s.web.tokens()
    except ValueError as exc:
        raise ConfigError(f"TESSERA_WEB_TOKEN: {exc}") from None
    if process.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(
            f"TESSERA_LOG_LEVEL={process.log_level!r} must be DEBUG, INFO, WARNING or ERROR"
        )
    tile = s.client.default_tile
    if tile != "auto" and not (tile.isdigit() and int(tile) >= 8):
        raise ConfigError(f"TESSERA_DEFAULT_TILE={tile!r} must be auto or a tile edge >= 8")


def _is_host(value: str) -> bool:
    """An IP address literal, or a host name (RFC 1123 labels)."""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(value)
        return True
    labels = value.rstrip(".").split(".")
    return len(value) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
