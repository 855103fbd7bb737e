"""The one place the kernel's numba compilation flags live.

Every kernel function is compiled with ``cache=True`` (warm starts load machine code from disk),
``nogil=True`` (renders run in executor threads next to an event loop) and
``error_model="numpy"`` (no Python-style zero-division checks in the hot loop). ``fastmath`` is
deliberately never enabled: re-association or fused multiply-adds would make results depend on
how a function was inlined, and the resume guarantee needs the serial, parallel and tiled paths
to agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from numba import njit

F = TypeVar("F", bound=Callable[..., Any])


def jit(fn: F) -> F:
    """Compile ``fn`` as a cached, GIL-releasing numba function."""
    return cast(F, njit(cache=True, nogil=True, error_model="numpy")(fn))


def jit_inline(fn: F) -> F:
    """Like :func:`jit`, but inlined into callers at the numba IR level.

    numba links separately compiled callees without letting LLVM inline them, which costs the
    hot loop a call per intersection and per bounce; ``inline="always"`` avoids that.
    """
    return cast(F, njit(cache=True, nogil=True, error_model="numpy", inline="always")(fn))


def jit_noalloc(fn: F) -> F:
    """Like :func:`jit`, compiled without numba's reference-counting runtime (``_nrt=False``).

    Inlined helpers re-bind their array arguments, and outside a ``prange`` body numba keeps
    an atomic incref/decref pair for every such binding inside the hot loop: about a quarter of
    the serial render time. Such a function cannot allocate arrays; callers pass scratch space.
    """
    options: dict[str, Any] = {"_nrt": False}  # a numba target option missing from its stubs
    return cast(F, njit(cache=True, nogil=True, error_model="numpy", **options)(fn))


def jit_parallel(fn: F) -> F:
    """Like :func:`jit`, with ``prange`` loops spread over numba's thread pool."""
    return cast(F, njit(cache=True, nogil=True, error_model="numpy", parallel=True)(fn))
