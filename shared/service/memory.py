"""Freed memory kept for reuse, so a service's per-job buffers do not fault in fresh pages.

glibc's ``malloc`` serves a request of 128 KiB or more with a fresh ``mmap`` and gives it back
to the OS on ``free``; it raises that threshold by itself after such a free, but then returns
the heap's free top to the OS once it exceeds twice the threshold. The finalizer's frames
(a 512x512 frame's float32 mean is 3 MiB, the image and the encoded files a few more), the
worker's tile results and the gateway's asset chunks are allocated and freed again for every
job, so every job paid the kernel for zeroing those pages anew: about 1,800 page faults per
14 MiB of buffers, 4.5 ms of CPU, in the tail a client waits for
(docs/architecture.md, "Process memory").

:func:`reuse_freed_memory` sets both thresholds once, at start-up: requests below ``below``
come from the process's heaps, and up to ``2 * below`` of free memory stays in each heap for
the next job before any is returned. Larger requests (a 4K frame's arrays) are mapped and
unmapped as before. Only glibc has these settings; elsewhere (musl) nothing changes.
"""

from __future__ import annotations

import ctypes
import platform

from shared.core.config.common import MAX_MALLOC_REUSE

__all__ = ["reuse_freed_memory"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def reuse_freed_memory(below: int) -> bool:
    """Serve requests below ``below`` bytes from memory freed earlier; ``True`` if set.

    ``0`` leaves the C library's defaults. Raises :class:`ValueError` for a value outside
    ``0..MAX_MALLOC_REUSE`` (32 MiB, the largest mmap threshold glibc accepts on 64-bit: half
    its heap size); returns ``False`` where the C library is not glibc.
    """
    if not 0 <= below <= MAX_MALLOC_REUSE:
        raise ValueError(f"below={below} must be within 0..{MAX_MALLOC_REUSE}")
    if below == 0 or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    # mallopt returns 1 on success, 0 for a value it refuses
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, below)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, 2 * below)
    )
