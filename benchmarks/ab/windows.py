"""A/B of the choices in migrator/analysis/windows.py and migrator/analysis/stats.py, in one process, rounds alternated.

    python benchmarks/ab/windows.py [--rounds 5]     # after benchmarks/diffstats.py made the files

- read: two identical 1.4 GB files compared window by window (4 MiB), `pread` into a reused buffer +
  memcmp, against `mmap(MAP_POPULATE)` per window + numpy's array_equal (what windows.py does);
- ahead: `diff_document` and stats with windows.AHEAD = 0 and 1 (mapping and reducing the next
  window on a worker thread);
- kernels: stats with the compiled float_stats loop and with numpy alone.
Page cache warm (the files are read first). Medians of the rounds; ratios per round.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as migrator.cli sets it
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
OUT = REPO / "benchmarks" / "out"
A, B = OUT / "gpt2-medium.safetensors", OUT / "gpt2-medium.bpk"
COPY = OUT / "gpt2-medium.copy.safetensors"  # byte-identical to A: both reads compare every byte
W = 4 << 20


def read_pread() -> None:
    fa, fb = os.open(A, os.O_RDONLY), os.open(COPY, os.O_RDONLY)
    n = min(os.fstat(fa).st_size, os.fstat(fb).st_size) // W * W
    ba, bb = bytearray(W), bytearray(W)
    for off in range(0, n, W):
        os.preadv(fa, [ba], off)
        os.preadv(fb, [bb], off)
        assert ba == bb
    os.close(fa)
    os.close(fb)


def read_mmap() -> None:
    import numpy as np

    fa, fb = os.open(A, os.O_RDONLY), os.open(COPY, os.O_RDONLY)
    n = min(os.fstat(fa).st_size, os.fstat(fb).st_size) // W * W
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    for off in range(0, n, W):
        ma = mmap.mmap(fa, W, flags=flags, prot=mmap.PROT_READ, offset=off)
        mb = mmap.mmap(fb, W, flags=flags, prot=mmap.PROT_READ, offset=off)
        assert np.array_equal(np.frombuffer(ma, np.uint64), np.frombuffer(mb, np.uint64))
        del ma, mb
    os.close(fa)
    os.close(fb)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    rounds = ap.parse_args().rounds
    from migrator.analysis import windows
    from migrator.analysis.diff import diff_document
    from migrator.analysis.stats import inspect_with_stats
    from migrator.core import native

    kernels = native.kernels

    def with_ahead(n: int, fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            windows.AHEAD = n
            try:
                return fn()
            finally:
                windows.AHEAD = 1
        return run

    def stats_numpy() -> object:
        native.kernels = None
        try:
            return inspect_with_stats(A)
        finally:
            native.kernels = kernels

    pairs: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "read: pread+memcmp | mmap+array_equal": (read_pread, read_mmap),
        "diff: AHEAD 0 | 1": (with_ahead(0, lambda: diff_document(A, B)), with_ahead(1, lambda: diff_document(A, B))),
        "stats: AHEAD 0 | 1": (with_ahead(0, lambda: inspect_with_stats(A)),
                               with_ahead(1, lambda: inspect_with_stats(A))),
        "stats: numpy | kernel": (stats_numpy, lambda: inspect_with_stats(A)),
    }
    if not COPY.exists():
        import shutil

        shutil.copyfile(A, COPY)
    for path in (A, B, COPY):
        with open(path, "rb") as f:
            while f.read(16 << 20):
                pass
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    for label, (first, second) in pairs.items():
        times: tuple[list[float], list[float]] = ([], [])
        for r in range(rounds):
            order = ((0, first), (1, second)) if r % 2 == 0 else ((1, second), (0, first))
            for i, fn in order:
                t = time.perf_counter()
                fn()
                times[i].append(time.perf_counter() - t)
        ratio = statistics.median(b / a for a, b in zip(*times, strict=True))
        print(f"| {label} | {statistics.median(times[0]):.2f} s | {statistics.median(times[1]):.2f} s | "
              f"{ratio:.2f} |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
