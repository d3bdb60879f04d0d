"""SafeTensors -> burnpack -> SafeTensors on a GPT-2-medium-shaped fp32 checkpoint, beside `cp`.

    .venv/bin/python benchmarks/bench_convert.py [--pairs 4] [--layers 24]

Prints a markdown table: wall time (median of the pairs), ratio to `cp` of the same file measured
in the same run (median of per-pair ratios), and peak RSS (max over runs) against the largest tensor.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import OUT, cp_jobs, mib, rounds, table
from models import gpt2_shapes, lazy_random

from migrator import save


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--layers", type=int, default=24)
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    src = OUT / f"gpt2-{args.layers}l.safetensors"
    tensors = lazy_random(gpt2_shapes(layers=args.layers))
    largest = max(t.nbytes for t in tensors)
    if not src.exists():
        save(tensors, src)
    size = src.stat().st_size
    migrate = str(Path(sys.executable).with_name("migrate"))
    bpk, back, copy = OUT / "bench.bpk", OUT / "bench-back.safetensors", OUT / "bench-copy.bin"
    rows = []
    # In this order: the second job reads the burnpack the first one leaves behind.
    jobs = [
        ("SafeTensors -> burnpack", [migrate, "convert", str(src), str(bpk), "--overwrite", "--no-progress"], src, bpk),
        ("burnpack -> SafeTensors", [migrate, "convert", str(bpk), str(back), "--overwrite", "--no-progress"], bpk,
         back),
    ]
    for label, cmd, inp, out in jobs:
        runs = rounds({"migrator": (cmd, out), **cp_jobs(inp, copy)}, n=args.rounds)
        rows.append((label, runs))
    for p in (bpk, back, copy):
        p.unlink(missing_ok=True)
    print(f"\nModel: GPT-2-medium shapes, {args.layers} layers, {size / 1e9:.2f} GB fp32, "
          f"largest tensor {mib(largest)}; {args.rounds} rounds; {platform.machine()}, "
          f"Python {platform.python_version()}\n")
    print(table(rows, largest))


if __name__ == "__main__":
    main()
