"""The ``tessera`` command.

Subcommands are registered by the modules that implement them (``register(subparsers)``):
:mod:`services.local` (``up``, ``demo``), :mod:`services.client.commands` (``submit``,
``status``, ``watch``, ``get``, ``list``, ``cancel``, ``retry``, ...) and this module (``version``
and the four services). ``tessera COMMAND --help`` documents each.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

__all__ = ["build_parser", "main"]

SERVICES = ("gateway", "scheduler", "worker", "finalizer")
_COMMAND_MODULES = ("services.local", "services.client.commands", "services.ops.commands")


def _version() -> str:
    try:
        return version("tessera")
    except PackageNotFoundError:
        return "0+unknown"


def _cmd_version(args: argparse.Namespace) -> int:
    from kernel import KERNEL_VERSION

    print(f"tessera {_version()} (kernel {KERNEL_VERSION})")
    return 0


def _cmd_service(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"services.{args.command}.__main__")
    status: int = module.main()
    return status


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="tessera", description="Tessera: a retry-safe render queue over NATS JetStream."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for service in SERVICES:
        p = sub.add_parser(
            service,
            help=f"run the {service} service (configured by TESSERA_* environment variables)",
            epilog="runs until SIGTERM or SIGINT, then stops cleanly (a worker hands its tiles "
            "back within TESSERA_GRACE_PERIOD). exit status: 0 stopped; 1 could not start "
            "(a server unreachable) or crashed; 2 configuration error (a bad variable, or a "
            "topology the NATS server refuses)",
        )
        p.set_defaults(func=_cmd_service)
    sub.add_parser("version", help="print the versions of Tessera and its kernel").set_defaults(
        func=_cmd_version
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    status: int = args.func(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
