"""The ``tessera`` command.

Subcommands are registered by the modules that implement them (``register(subparsers)``):
:mod:`services.cli.local` (``up``, ``demo``), :mod:`services.client.commands` (``submit``,
``status``, ``watch``, ``get``, ``list``, ``cancel``, ``retry``, ...),
:mod:`services.cli.ops.commands` (``gc``, ``top``) and this module (``version`` and the five
services; ``web`` is the console and HTTP API). ``tessera COMMAND --help`` documents each;
``python -m services.cli`` is the same command. This package is the top layer: it may import
every service (docs/architecture.md).

``pip install tessera`` installs only the client (:mod:`services.client`, ``proto/``): its
commands import neither numpy nor numba. Everything else needs the ``render`` extra; on a
client-only install those commands are listed as not installed and exit 2 with the
``pip install`` line to run, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TypeAlias

__all__ = ["build_parser", "main"]

Sub: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

SERVICES = ("gateway", "scheduler", "worker", "finalizer", "web")
_COMMAND_MODULES = ("services.cli.local", "services.client.commands", "services.cli.ops.commands")
#: The commands of the modules that need the render stack, listed even when it is missing.
RENDER_COMMANDS = {"services.cli.local": ("up", "demo"), "services.cli.ops.commands": ("gc", "top")}

RENDER_INSTALL = "pip install 'tessera[render]'"
#: Top-level modules of the ``render`` extra's packages (and of what they pull in): a missing
#: one means a client-only install, not a bug.
RENDER_MODULES = frozenset(
    {"numba", "llvmlite", "numpy", "PIL", "isal", "asyncpg", "aioboto3", "aiobotocore", "boto3"}
    | {"botocore", "uvloop", "prometheus_client", "OpenEXR", "Imath", "jinja2", "markupsafe"}
)
EXIT_USAGE = 2


def missing_render_module(exc: ModuleNotFoundError) -> str | None:
    """The render-stack module ``exc`` failed to find, or ``None`` if it is another module."""
    root = (exc.name or "").partition(".")[0]
    return root if root in RENDER_MODULES else None


def needs_render(command: str, module: str) -> str:
    """What a command that needs the render stack says on a client-only install."""
    return (
        f"tessera {command}: needs the render stack, which is not installed (no module "
        f"{module!r}); install it with: {RENDER_INSTALL}"
    )


def _version() -> str:
    try:
        return version("tessera")
    except PackageNotFoundError:
        return "0+unknown"


def _cmd_version(args: argparse.Namespace) -> int:
    try:
        from kernel import KERNEL_VERSION
    except ModuleNotFoundError as exc:
        if missing_render_module(exc) is None:
            raise
        print(f"tessera {_version()} (kernel not installed: {RENDER_INSTALL})")
        return 0
    print(f"tessera {_version()} (kernel {KERNEL_VERSION})")
    return 0


def _not_installed(module: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        print(needs_render(args.command, module), file=sys.stderr)
        return EXIT_USAGE

    return run


def _register(sub: Sub, name: str) -> None:
    """Register the commands of module ``name``, or placeholders if the render stack is missing."""
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = missing_render_module(exc)
        if missing is None or name not in RENDER_COMMANDS:
            raise
        for command in RENDER_COMMANDS[name]:
            # Any arguments (even --help) reach the placeholder, which says what to install.
            p = sub.add_parser(
                command,
                help=f"(not installed: {RENDER_INSTALL})",
                add_help=False,
                prefix_chars="\0",
            )
            p.add_argument("arguments", nargs="*", help=argparse.SUPPRESS)
            p.set_defaults(func=_not_installed(missing))
        return
    module.register(sub)


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
        _register(sub, name)
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
    try:
        status: int = args.func(args)
    except ModuleNotFoundError as exc:  # a service, or S3 from a client-only install
        missing = missing_render_module(exc)
        if missing is None:
            raise
        print(needs_render(args.command, missing), file=sys.stderr)
        return EXIT_USAGE
    return status
