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

from harness import OUT, max_rss, median_wall, mib, pairs, ratio_median
from models import gpt2_shapes, lazy_random

from migrator import save


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=4)
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
    # Run in this order: the second job reads the burnpack the first one leaves behind.
    jobs = [
        ("SafeTensors -> burnpack", [migrate, "convert", str(src), str(bpk), "--overwrite"], src, bpk),
        ("burnpack -> SafeTensors", [migrate, "convert", str(bpk), str(back), "--overwrite"], bpk, back),
    ]
    for label, cmd, inp, out in jobs:
        j, b = pairs(cmd, ["cp", str(inp), str(copy)], job_out=out, base_out=copy, n=args.pairs)
        rows.append((label, median_wall(j), median_wall(b), ratio_median(j, b), max_rss(j), max_rss(b)))
    for p in (bpk, back, copy):
        p.unlink(missing_ok=True)
    print(f"\nModel: GPT-2-medium shapes, {args.layers} layers, {size / 1e9:.2f} GB fp32, "
          f"largest tensor {mib(largest)}; {args.pairs} pairs; {platform.machine()}, "
          f"{platform.python_version()}\n")
    print("| job | migrator (median s) | cp (median s) | ratio to cp (median of pairs) | peak RSS | cp peak RSS |"
          " RSS - largest tensor |")
    print("|---|---|---|---|---|---|---|")
    for label, jw, bw, ratio, rss, brss in rows:
        print(f"| {label} | {jw:.2f} | {bw:.2f} | {ratio:.2f}x | {mib(rss)} | {mib(brss)} | {mib(rss - largest)} |")


if __name__ == "__main__":
    main()
