"""Bench-only start-up hook: give every Python thread its name at the OS level too.

Python 3.11 keeps ``Thread.name`` to itself; the OS calls every thread of a service
``python``. The pipeline benchmark puts this directory first on the services' ``PYTHONPATH``,
so each thread sets its own ``comm`` (``/proc/<pid>/task/<tid>/comm``, at most 15 bytes) to its
Python name when it starts: the worker's kernel threads (``ThreadPoolExecutor`` with
``thread_name_prefix="kernel"``) then show up as ``kernel_0``, ``kernel_1``, ... and their CPU
can be told apart from the rest of the process without changing the service's code. One
``prctl`` call per thread start; nothing else changes.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

_PR_SET_NAME = 15

try:
    _prctl: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the threads keep the OS's name
    _prctl = None

_bootstrap_inner: Any = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _named_bootstrap(self: threading.Thread) -> None:
    if _prctl is not None:
        _prctl(_PR_SET_NAME, ctypes.c_char_p(self.name.encode()[:15]), 0, 0, 0)
    _bootstrap_inner(self)


if _prctl is not None:
    threading.Thread._bootstrap_inner = _named_bootstrap  # type: ignore[attr-defined]
