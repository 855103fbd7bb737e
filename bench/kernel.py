"""Kernel benchmark: Tessera's numba tracer vs the classic C++ smallpt, side by side.

Run as ``python -m bench.kernel`` (or ``python bench/kernel.py``) from the repository root.
Needs ``g++``. Prints pixel samples per second (width x height x spp; smallpt's spp is
4 subpixels x samps) for ``cornell`` at 256x192, 16 spp: single thread, all cores, the
scaling ratio, the ratio to smallpt built with ``g++ -O3`` (single-threaded), and the cold
(fresh numba cache, in a subprocess) and warm (cached) time from process start to first sample.
Every timing is the best of ``--repeat`` runs, C++ and numba interleaved, so a busy machine
penalises both alike.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SMALLPT_SOURCE = ROOT / "bench" / "smallpt" / "smallpt.cpp"

FIRST_SAMPLE = """
import time
t0 = time.perf_counter()
import numpy as np
import kernel
p = kernel.prepare(kernel.builtin_scene("cornell"), 0, kernel.RenderSettings(256, 192, 16))
kernel.render_tile(p, (0, 0, 1, 1), 0, 1, np.zeros((1, 1, 3)))
print(time.perf_counter() - t0)
"""


@dataclass(frozen=True)
class Result:
    """Best-of-N seconds for each contender on the same frame."""

    samples: int
    cpp: float
    serial: float
    parallel: float
    threads: int


def compile_smallpt(workdir: Path) -> Path:
    """Build bench/smallpt/smallpt.cpp with ``g++ -O3`` (no OpenMP) into ``workdir``."""
    exe = workdir / "smallpt"
    cmd = ["g++", "-O3", "-o", str(exe), str(SMALLPT_SOURCE)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return exe


def run_smallpt(exe: Path, width: int, height: int, spp: int, out: Path) -> float:
    """Render with smallpt; returns its self-reported render seconds (file output excluded)."""
    proc = subprocess.run(
        [str(exe), str(width), str(height), str(spp), str(out)],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(proc.stdout.split()[-1])


def time_ours(width: int, height: int, spp: int, parallel: bool) -> float:
    """Seconds for one full-frame render of ``cornell`` (compilation excluded)."""
    import kernel

    prepared = kernel.prepare(
        kernel.builtin_scene("cornell"), 0, kernel.RenderSettings(width, height, spp)
    )
    kernel.render_full(prepared, 0, 1, np.zeros((height, width, 3)), parallel=parallel)
    acc = np.zeros((height, width, 3))
    start = time.perf_counter()
    kernel.render_full(prepared, 0, spp, acc, parallel=parallel)
    return time.perf_counter() - start


def first_sample_seconds(cache_dir: Path) -> float:
    """Wall time of a fresh interpreter from start to its first rendered sample."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", FIRST_SAMPLE], check=True, env=env, cwd=ROOT, capture_output=True
    )
    return time.perf_counter() - start


def measure(width: int, height: int, spp: int, repeat: int, workdir: Path) -> Result:
    """Interleave smallpt and our serial/parallel renders ``repeat`` times; keep the best."""
    import numba

    exe = compile_smallpt(workdir)
    cpp, serial, parallel = [], [], []
    for _ in range(repeat):
        cpp.append(run_smallpt(exe, width, height, spp, workdir / "smallpt.ppm"))
        serial.append(time_ours(width, height, spp, parallel=False))
        parallel.append(time_ours(width, height, spp, parallel=True))
    return Result(
        width * height * spp, min(cpp), min(serial), min(parallel), numba.get_num_threads()
    )


def report(r: Result, cold: float, warm: float) -> str:
    """The human-readable benchmark summary."""
    cpp_rate, ser_rate, par_rate = (r.samples / t for t in (r.cpp, r.serial, r.parallel))
    lines = [
        f"cornell {r.samples:,} pixel samples, best of the interleaved runs",
        f"C++ smallpt (g++ -O3, 1 thread): {cpp_rate / 1e6:8.3f} M samples/s",
        f"tessera, 1 thread:               {ser_rate / 1e6:8.3f} M samples/s "
        f"({ser_rate / cpp_rate:.2f}x smallpt)",
        f"tessera, {r.threads} threads:               {par_rate / 1e6:8.3f} M samples/s "
        f"({par_rate / r.threads / 1e6:.3f} M/s per core)",
        f"scaling on {r.threads} threads:           {par_rate / ser_rate:8.2f}x",
        f"cold JIT to first sample:        {cold:8.2f} s (fresh NUMBA_CACHE_DIR)",
        f"warm start to first sample:      {warm:8.2f} s (cached)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m bench.kernel [--width W --height H --spp N --repeat R]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--height", type=int, default=192)
    parser.add_argument("--spp", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp:
        workdir = Path(tmp)
        cold = first_sample_seconds(workdir / "numba-cache")
        warm = min(first_sample_seconds(workdir / "numba-cache") for _ in range(3))
        result = measure(args.width, args.height, args.spp, args.repeat, workdir)
    print(report(result, cold, warm))


if __name__ == "__main__":
    if __package__ in (None, ""):
        sys.path.insert(0, str(ROOT))
    main()
