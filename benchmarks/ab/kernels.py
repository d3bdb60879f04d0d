"""A/B of two builds of migrator.core._kernels: alternating runs, CPU time of the calling thread.

Usage: python benchmarks/ab/kernels.py OLD_DIR NEW_DIR, each holding one built `_kernels*.so`
(build each version with `python setup.py build_ext --inplace` and copy migrator/core/_kernels*.so).
Thread CPU time, not wall time: on a machine shared with other jobs one call's wall time varies 2x;
the loops run on the calling thread, so its CPU time is the kernel's.
"""

from __future__ import annotations

import glob
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

ROUNDS = 9


def load(folder: str) -> Any:
    spec = importlib.util.spec_from_file_location("migrator.core._kernels", glob.glob(f"{folder}/_kernels*.so")[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    builds = {"old": load(sys.argv[1]), "new": load(sys.argv[2])}
    n = 64 << 20  # 64M float32 = 256 MiB
    f = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    h = f.astype(np.float16)
    rows = cols = 8192  # a 256 MiB float32 matrix
    out16, out32 = np.empty(n, np.uint16), np.empty(n, np.uint32)
    jobs: dict[str, Callable[[Any], None]] = {
        "f32->f16 256MiB": lambda k: k.f32_to_f16(f, out16),
        "f16->f32 128MiB": lambda k: k.f16_to_f32(h, out32),
        "f32->bf16 256MiB": lambda k: k.f32_to_bf16(f, out16, 0xFFFF),
        "transpose u32 8192^2": lambda k: k.transpose(f, out32, rows, cols, 4, 0, cols),
        "transpose u16 8192^2": lambda k: k.transpose(h, out16, rows, cols, 2, 0, cols),
        "transpose+f16 8192^2": lambda k: k.transpose_f32_to_f16(f, out16, rows, cols, 0, cols),
    }
    for vector in (True, False):
        for k in builds.values():
            k.use_f16c(vector)
        for name, job in jobs.items():
            times: dict[str, list[float]] = {"old": [], "new": []}
            for r in range(ROUNDS):
                for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    start = time.thread_time()
                    job(builds[which])
                    times[which].append(time.thread_time() - start)
            old, new = statistics.median(times["old"]), statistics.median(times["new"])
            print(f"{'f16c' if vector else 'portable':8} {name:22} median ms old {old * 1e3:6.1f} "
                  f"new {new * 1e3:6.1f} new/old {new / old:.3f}  (min {min(times['new']) / min(times['old']):.3f})")


if __name__ == "__main__":
    main()
