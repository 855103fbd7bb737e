"""``tessera gateway`` / ``python -m services.gateway``: wiring only."""

from __future__ import annotations

import sys

from services.gateway.app import run
from shared.service.runtime import service_main


def main() -> int:
    """Run the gateway until SIGTERM/SIGINT; returns the exit status."""
    return service_main("gateway", run)


if __name__ == "__main__":
    sys.exit(main())
