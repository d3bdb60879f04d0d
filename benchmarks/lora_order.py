"""Re-measure how this machine's torch sums a LoRA product, and time the fold (docs/merging.md, "Matching PEFT").

    PYTHONPATH=. .venv/bin/python benchmarks/lora_order.py [--threads 1] [--random 300]

For each shape B [m, r] @ A [r, n] it computes torch's F32 product and the candidate orders with
migrator's kernel used directly (exact: fmaf chains, or rounded products summed, in a given block
size), and prints which order torch's bits are: "fused" (one chain), "fused/B" (chains of B
products, block sums added), "plain", or "other". Then it counts, over random shapes, where
`lora_product.torch_order` (the rule the fold uses) gives torch's bits, and times a 4096x4096
rank-16 product: the kernel, OpenBLAS (numpy) and torch, into a ready buffer, one thread. Needs
the compiled kernels and torch.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

import numpy as np
import torch

from migrator.ops.compute import lora_product as lp


def _kernel(b: np.ndarray, a: np.ndarray, mode: int, block: int) -> np.ndarray:
    out = np.empty((b.shape[0], a.shape[1]), np.float32)
    k: Any = lp.lora_kernels()
    k.lora_band(b, a, out, a.shape[0], mode, block, 1.0)
    return out


def _inputs(m: int, r: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng([m, r, n, seed])
    return g.standard_normal((m, r)).astype(np.float32), g.standard_normal((r, n)).astype(np.float32)


def classify(m: int, r: int, n: int) -> str:
    """Which order gives torch's bits for two seeded inputs of this shape."""
    found: set[str] | None = None
    for seed in (0, 1):
        b, a = _inputs(m, r, n, seed)
        t = (torch.from_numpy(b) @ torch.from_numpy(a)).numpy().view(np.uint32)
        names = {"fused" if block >= r else f"fused/{block}"
                 for block in sorted({r, 192, r // 2, 128}) if 1 < block <= r
                 and np.array_equal(_kernel(b, a, lp.FUSED, block).view(np.uint32), t)}
        if np.array_equal(_kernel(b, a, lp.PLAIN, r).view(np.uint32), t):
            names.add("plain")
        found = names if found is None else found & names
    return "/".join(sorted(found)) if found else "other"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--random", type=int, default=300, help="random shapes checked against the rule")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s)")
    for r in (2, 5, 16, 64):
        print(f"r={r}: rows m=1..8 x columns n=1..16 (F fused, P plain, ? other, * both)")
        for m in range(1, 9):
            marks = {"fused": "F", "plain": "P", "other": "?"}
            row = "".join(marks.get(classify(m, r, n), "*") for n in range(1, 17))
            print(f"  m={m}: {row}")
    for r in (128, 192, 193, 256, 300, 384, 385, 512, 1000):
        print(f"r={r} at 64x64: {classify(64, r, 64)}")
    g = np.random.default_rng(0)
    tally: Counter[str] = Counter()
    for _ in range(args.random):
        r, m, n = int(g.integers(1, 65)), int(g.integers(1, 4097)), int(g.integers(1, 4097))
        b, a = _inputs(m, r, n, 2)
        t = (torch.from_numpy(b) @ torch.from_numpy(a)).numpy().view(np.uint32)
        mode, block = lp.torch_order(m, r, n)
        same = np.array_equal(_kernel(b, a, mode, block).view(np.uint32), t)
        tally[("fused" if mode == lp.FUSED else "small") + (" equal" if same else " differs")] += 1
    print("random shapes, the fold's rule against torch:", dict(tally))
    b, a = _inputs(4096, 16, 4096, 3)
    out, tb, ta = np.empty((4096, 4096), np.float32), torch.from_numpy(b), torch.from_numpy(a)
    k: Any = lp.lora_kernels()
    for name, run in [("kernel", lambda: k.lora_band(b, a, out, 16, lp.FUSED, 16, 2.0)),
                      ("numpy (OpenBLAS)", lambda: np.matmul(b, a, out=out)),
                      ("torch", lambda: torch.matmul(tb, ta, out=torch.from_numpy(out)))]:
        run()
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        print(f"4096x16x4096 {name}: {sorted(times)[3] * 1000:.1f} ms (median of 7)")


if __name__ == "__main__":
    main()
