"""Freed memory kept for reuse (shared.service.memory), measured in page faults of a real
process: a child Python that allocates and frees a finalizer's worth of buffers per "job"."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from shared.core.config.common import MAX_MALLOC_REUSE
from shared.service.memory import reuse_freed_memory

#: per job: a 512x512 frame's float32 mean, its bytes, an 8-bit image and a copy of the bytes
#: (about 10 MiB alive at once, as the finalizer's frame, float image and PNG are), freed at
#: the job's end; prints the minor page faults of jobs 2..21
_JOBS = """
import resource, sys
import numpy as np
from shared.service.memory import reuse_freed_memory

reuse_freed_memory(int(sys.argv[1]))

def job():
    mean = np.ones((512, 512, 3), dtype=np.float32)
    flt = mean.tobytes()
    image = np.full((512, 512, 3), 7, dtype=np.uint8)
    copy = bytes(flt)
    return len(copy) + int(image[0, 0, 0])

job()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    job()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(below: int) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _JOBS, str(below)], check=True, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    return int(out.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's")
def test_jobs_reuse_the_memory_the_last_job_freed() -> None:
    default = _faults(0)
    reused = _faults(MAX_MALLOC_REUSE)
    # glibc's defaults give every job's buffers fresh pages (about 1,700 faults a job here)
    assert default > 20 * 1000, default
    assert reused * 20 < default, (reused, default)


def test_zero_leaves_the_defaults_and_bounds_are_checked() -> None:
    assert reuse_freed_memory(0) is False
    with pytest.raises(ValueError, match="within"):
        reuse_freed_memory(MAX_MALLOC_REUSE + 1)
    with pytest.raises(ValueError, match="within"):
        reuse_freed_memory(-1)
