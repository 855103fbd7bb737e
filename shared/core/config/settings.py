"""The top-level :class:`Settings`: the connections, the node, one frozen group per concern."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.core.config.common import (
    ClientSettings,
    DeliverySettings,
    DeploymentSettings,
    LeaseSettings,
    ObjectStoreSettings,
    ProcessSettings,
)
from shared.core.config.parse import (
    _check_relations,
    _database_url,
    _group,
    _nats_urls,
    _object_store,
    _required,
)
from shared.core.config.roles import (
    FinalizerSettings,
    GatewaySettings,
    SchedulerSettings,
    SweeperSettings,
    WebSettings,
    WorkerSettings,
)

_GROUPS: dict[str, type[Any]] = {
    "deployment": DeploymentSettings,
    "leases": LeaseSettings,
    "delivery": DeliverySettings,
    "worker": WorkerSettings,
    "scheduler": SchedulerSettings,
    "sweeper": SweeperSettings,
    "finalizer": FinalizerSettings,
    "gateway": GatewaySettings,
    "web": WebSettings,
    "client": ClientSettings,
    "process": ProcessSettings,
}
"""Each group of :class:`Settings`: attribute name -> class."""

_CONNECTIONS: tuple[tuple[str, str, str, str, str], ...] = (
    ("TESSERA_NATS_URL", "required", "NATS server URL(s), `nats://host:port`, comma-separated "
     "for a cluster", "nats_urls", "all"),
    ("TESSERA_DATABASE_URL", "required", "PostgreSQL DSN, `postgresql://user:pass@host:port/db` "
     "(the client commands do not use it)", "database_url", "services, operator tools"),
    ("TESSERA_OBJECT_STORE", "required", "`file:///absolute/dir` or `s3://bucket` (the client "
     "commands, `get` included, do not use it)", "object_store", "services, `tessera gc`"),
    ("TESSERA_S3_ENDPOINT", "empty (AWS)", "S3 endpoint URL", "object_store.endpoint",
     "services, `tessera gc`"),
    ("TESSERA_S3_ACCESS_KEY", "required for `s3://`", "S3 access key", "object_store.access_key",
     "services, `tessera gc`"),
    ("TESSERA_S3_SECRET_KEY", "required for `s3://`", "S3 secret key", "object_store.secret_key",
     "services, `tessera gc`"),
    ("TESSERA_S3_REGION", "`us-east-1`", "S3 region", "object_store.region",
     "services, `tessera gc`"),
    ("TESSERA_NODE", "`<hostname>-<pid>`", "this process's name in leases, attempts and logs",
     "node", "all"),
)  # fmt: skip
"""The variables that are not knobs of a group: variable, default, meaning, setting, reader."""


@dataclass(frozen=True)
class Settings:
    """Everything a Tessera process needs to know, validated."""

    nats_urls: tuple[str, ...]
    database_url: str
    object_store: ObjectStoreSettings
    #: this process's name in leases, attempts and logs (default ``<hostname>-<pid>``)
    node: str = ""
    deployment: DeploymentSettings = field(default_factory=DeploymentSettings)
    leases: LeaseSettings = field(default_factory=LeaseSettings)
    delivery: DeliverySettings = field(default_factory=DeliverySettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    sweeper: SweeperSettings = field(default_factory=SweeperSettings)
    finalizer: FinalizerSettings = field(default_factory=FinalizerSettings)
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    web: WebSettings = field(default_factory=WebSettings)
    client: ClientSettings = field(default_factory=ClientSettings)
    process: ProcessSettings = field(default_factory=ProcessSettings)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], *, database: bool = True, object_store: bool = True
    ) -> Settings:
        """Build and validate settings from ``env`` (normally ``os.environ``).

        ``database=False`` (the client commands, which only talk to the gateways) makes
        ``TESSERA_DATABASE_URL`` optional: unset, ``database_url`` is empty; set, it is checked.
        ``object_store=False`` does the same for ``TESSERA_OBJECT_STORE`` (and the S3
        variables): unset, the store is a ``file`` store without a path, which nothing opens.
        """
        node = env.get("TESSERA_NODE", "").strip() or f"{socket.gethostname()}-{os.getpid()}"
        need_db = database or bool(env.get("TESSERA_DATABASE_URL", "").strip())
        need_store = object_store or bool(env.get("TESSERA_OBJECT_STORE", "").strip())
        groups = {name: _group(group, env) for name, group in _GROUPS.items()}
        settings = cls(
            nats_urls=_nats_urls(_required(env, "TESSERA_NATS_URL")),
            database_url=(_database_url(_required(env, "TESSERA_DATABASE_URL")) if need_db else ""),
            object_store=_object_store(env) if need_store else ObjectStoreSettings(kind="file"),
            node=node,
            **groups,
        )
        _check_relations(settings)
        return settings

    def to_env(self) -> dict[str, str]:
        """The environment lines that rebuild these settings in another process."""
        out = {
            "TESSERA_NATS_URL": ",".join(self.nats_urls),
            "TESSERA_DATABASE_URL": self.database_url,
            "TESSERA_OBJECT_STORE": self.object_store.url(),
        }
        if self.object_store.kind == "s3":
            out |= {
                "TESSERA_S3_ENDPOINT": self.object_store.endpoint,
                "TESSERA_S3_ACCESS_KEY": self.object_store.access_key,
                "TESSERA_S3_SECRET_KEY": self.object_store.secret_key,
                "TESSERA_S3_REGION": self.object_store.region,
            }
        for name, f in _knobs():
            value = getattr(getattr(self, name), f.name)
            if value != f.default:
                out[f.metadata["env"]] = str(value)
        return out


def _knobs() -> Iterator[tuple[str, dataclasses.Field[Any]]]:
    """``(group attribute, field)`` of every knob, in declaration order."""
    for name, group in _GROUPS.items():
        for f in dataclasses.fields(group):
            yield name, f


def worker_settings(env: Mapping[str, str]) -> WorkerSettings:
    """Only the worker's knobs from ``env`` (validated like :meth:`Settings.from_env` does),
    for code that has no :class:`Settings` at hand: a renderer's registry constructor."""
    worker: WorkerSettings = _group(WorkerSettings, env)
    return worker


def variables() -> set[str]:
    """Every ``TESSERA_*`` variable :meth:`Settings.from_env` reads."""
    return {row[0] for row in _CONNECTIONS} | {f.metadata["env"] for _, f in _knobs()}
