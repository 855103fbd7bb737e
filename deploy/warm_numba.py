"""Build-time warm-up: compile the kernel once so containers start rendering at once.

numba caches compiled code on disk (``cache=True``, in ``NUMBA_CACHE_DIR``); rendering one tiny
tile of a built-in scene compiles exactly the entry point the worker calls (``render_tile``).
"""

import numpy as np

import kernel

settings = kernel.RenderSettings(width=8, height=8, spp=1, max_depth=2, seed=0)
prepared = kernel.prepare(kernel.builtin_scene("cornell"), 0, settings)
acc = np.zeros((8, 8, 3), dtype=np.float64)
kernel.render_tile(prepared, kernel.Rect(0, 0, 8, 8), 0, 1, acc)
assert np.isfinite(acc).all()
print(f"numba cache warm (kernel {kernel.KERNEL_VERSION})")
