"""``tessera up`` and ``tessera demo``: the embedded stack in the foreground."""

from __future__ import annotations

import shlex
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from shared.stack import Stack, StackError

__all__ = ["run_demo", "run_up"]


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM; the previous handlers come back afterwards."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def export_lines(env: dict[str, str]) -> str:
    """``export NAME=value`` lines a shell can evaluate."""
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())


def run_up(data_dir: Path, *, s3: bool) -> int:
    """Run the stack until SIGINT/SIGTERM; print its endpoints as export lines."""
    stack = Stack(data_dir, s3=s3)
    with _stop_on_signals() as stop:
        try:
            stack.start()
        except StackError as exc:
            print(f"tessera up: {exc}", file=sys.stderr)
            return 1
        try:
            print(export_lines(stack.env()), flush=True)
            print(f"# data in {stack.data_dir}; Ctrl-C stops everything", file=sys.stderr)
            while not stop.wait(0.5):
                dead = [s.proc.name for s in stack._started if not s.proc.alive()]
                if dead:
                    print(f"tessera up: {', '.join(dead)} exited; stopping", file=sys.stderr)
                    return 1
        finally:
            stack.stop()
    return 0


def run_demo(data_dir: Path | None, *, s3: bool) -> int:
    """Start the stack, check it is healthy, stop it."""
    with _stop_on_signals() as stop, tempfile.TemporaryDirectory(prefix="tessera-demo-") as tmp:
        root = data_dir or Path(tmp)
        try:
            with Stack(root, s3=s3) as stack:
                if stop.is_set():
                    return 130
                print(export_lines(stack.env()))
                print("tessera demo: stack healthy (NATS, PostgreSQL, object store).")
        except StackError as exc:
            print(f"tessera demo: {exc}", file=sys.stderr)
            return 1
    return 0
