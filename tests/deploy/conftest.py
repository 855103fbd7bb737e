"""Deployment tests: least-privilege NATS users, a 3-node cluster, and the deploy files.

The end-to-end fixtures (``e2e_env``, ``objects``, ``db``) come from :mod:`tests.e2e.conftest`;
NATS is each test's own server (its auth config depends on the test's namespace).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from proto.names import Names
from services.client.api import TesseraClient
from shared.core.config import Settings
from shared.devstack import natsauth
from shared.devstack.stack import NatsServer
from shared.nats.jetstream import connect_nats
from tests.e2e.conftest import db, e2e_env, e2e_settings, objects  # noqa: F401 - fixtures
from tests.harness import ServiceProcesses

REPO = Path(__file__).resolve().parents[2]


class AuthNats:
    """A nats-server running the generated least-privilege config for one namespace."""

    def __init__(self, server: NatsServer, passwords: dict[str, str]) -> None:
        self.server, self.passwords = server, passwords

    def url(self, role: str) -> str:
        return natsauth.url_for(self.server.url, role, self.passwords[role])

    async def connect(self, role: str, settings: Settings) -> NATS:
        """A connection as ``role`` through :func:`connect_nats` (it logs violations)."""
        env = settings.to_env() | {"TESSERA_NATS_URL": self.url(role)}
        return await connect_nats(Settings.from_env(env), name=f"test-{role}")


@pytest.fixture
def auth_nats(server_dir: Path, namespace: str) -> Iterator[AuthNats]:
    """This test's own NATS with one user per service and one for clients."""
    passwords = natsauth.generate_passwords()
    config = server_dir / "auth.conf"
    config.write_text(natsauth.render_config(passwords, Names(namespace)))
    server = NatsServer(server_dir / "nats", config_file=config)
    server.start()
    try:
        yield AuthNats(server, passwords)
    finally:
        server.stop()


@pytest.fixture
def auth_services(
    e2e_env: dict[str, str],  # noqa: F811
    auth_nats: AuthNats,
    tmp_path: Path,
) -> Iterator[ServiceProcesses]:
    """Service processes, each connecting as its own NATS user."""
    procs = ServiceProcesses(
        e2e_env, tmp_path / "logs", service_env=lambda s: {"TESSERA_NATS_URL": auth_nats.url(s)}
    )
    try:
        yield procs
    finally:
        procs.stop_all()


@pytest.fixture
async def auth_client(
    auth_nats: AuthNats,
    e2e_settings: Settings,  # noqa: F811
) -> AsyncIterator[TesseraClient]:
    """An API client connected as the ``client`` user."""
    nc = await auth_nats.connect("client", e2e_settings)
    try:
        yield TesseraClient(nc, Names(e2e_settings.deployment.namespace), timeout=10)
    finally:
        await nc.close()
