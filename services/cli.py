"""The ``tessera`` command.

``tessera up`` runs the embedded stack, ``tessera demo`` the main job end to end, ``tessera
version`` prints versions. Every command documents itself under ``tessera COMMAND --help``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = ["main"]


def _version() -> str:
    try:
        return version("tessera")
    except PackageNotFoundError:
        return "0+unknown"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="tessera", description="Tessera: a retry-safe render queue over NATS JetStream."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="run the embedded stack in the foreground")
    up.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".tessera"),
        help="where servers keep their data (default: ./.tessera)",
    )
    up.add_argument("--s3", action="store_true", help="use SeaweedFS S3 instead of a directory")

    demo = sub.add_parser("demo", help="render the sample scene end to end on the embedded stack")
    demo.add_argument("--data-dir", type=Path, default=None, help="keep data here (default: temp)")
    demo.add_argument("--s3", action="store_true", help="use SeaweedFS S3 instead of a directory")

    sub.add_parser("version", help="print the versions of Tessera and its kernel")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    if args.command == "version":
        print(f"tessera {_version()}")
        return 0
    from services import local

    if args.command == "up":
        return local.run_up(args.data_dir, s3=args.s3)
    if args.command == "demo":
        return local.run_demo(args.data_dir, s3=args.s3)
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
