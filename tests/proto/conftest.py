"""Proto tests use the shared session stack (``tests/conftest.py``): only its NATS server.

``nats_url`` is the session server's URL; each topology test uses the ``namespace`` fixture as
its topology prefix, so tests never see each other's streams.
"""

from __future__ import annotations

import pytest

from shared.devstack.stack import Stack


@pytest.fixture
def nats_url(stack: Stack) -> str:
    """URL of the session's JetStream-enabled nats-server."""
    return stack.nats.url
