"""PyTorch `.pt` -> SafeTensors on a GPT-2-medium-shaped fp32 state_dict, beside `cp` and torch.

    .venv/bin/python benchmarks/bench_pytorch.py [--rounds 3] [--layers 24]

The checkpoint (~1.42 GB with 24 layers) is written once by `torch.save` (zip format) into
`benchmarks/out/` and reused. Every job runs in its own process (peak RSS from `os.wait4` /
GNU time, see `harness.run`), rounds rotate the job order, and the table reports the median wall
time, the median per-round ratio to `cp` of the same file, and the highest peak RSS:

* migrator: `open_file(pt)` then `formats.save(reader.tensors, out, format="safetensors")`
  (burnpack if the SafeTensors writer is missing), and `.pt -> .pt` through our own writer;
* torch: `torch.load(pt, mmap=True, weights_only=True)` + `safetensors.torch.save_file`;
* `cp` and `cp` + fsync of the copy (migrator fsyncs what it writes).
"""

from __future__ import annotations

import argparse
import math
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import OUT, Run, cp_jobs, max_rss, median_wall, mib, rounds
from models import gpt2_shapes

GENERATE = """
import sys, torch
from models import gpt2_shapes
layers, path = int(sys.argv[1]), sys.argv[2]
gen = torch.Generator().manual_seed(0)
sd = {name: torch.randn(shape, generator=gen) for name, shape in gpt2_shapes(layers=layers)}
torch.save(sd, path)
"""

MIGRATOR = """
import sys
from migrator.formats import open_file, save
src, out, fmt = sys.argv[1:4]
with open_file(src) as reader:
    save(reader.tensors, out, format=fmt, overwrite=True)
"""

TORCH = """
import sys, torch
from safetensors.torch import save_file
sd = torch.load(sys.argv[1], mmap=True, weights_only=True)
save_file(sd, sys.argv[2])
"""


def target_format() -> str:
    """SafeTensors when its writer exists in this tree, else burnpack (the writer was in progress)."""
    try:
        from migrator.formats.safetensors import SafetensorsWriter  # noqa: F401
    except ImportError:
        return "burnpack"
    return "safetensors"


def ratio(jobs: list[Run], bases: list[Run]) -> float:
    return statistics.median(j.wall / b.wall for j, b in zip(jobs, bases, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=24)
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    src = OUT / f"gpt2-{args.layers}l.pt"
    if not src.exists():
        print(f"generating {src} with torch.save ...", file=sys.stderr)
        subprocess.run([py, "-c", GENERATE, str(args.layers), str(src)], check=True,
                       cwd=Path(__file__).resolve().parent)
    size = src.stat().st_size
    largest = max(4 * math.prod(s) for _, s in gpt2_shapes(layers=args.layers))
    fmt = target_format()
    ext = ".safetensors" if fmt == "safetensors" else ".bpk"
    work = Path(tempfile.mkdtemp(prefix="bench-pytorch-", dir=OUT))
    try:
        st_out, pt_out, torch_out = work / f"out{ext}", work / "out.pt", work / "torch.safetensors"
        jobs = {
            f"migrator .pt -> {fmt}": ([py, "-c", MIGRATOR, str(src), str(st_out), fmt], st_out),
            "migrator .pt -> .pt": ([py, "-c", MIGRATOR, str(src), str(pt_out), "pytorch"], pt_out),
            "torch.load(mmap) + safetensors save_file": ([py, "-c", TORCH, str(src), str(torch_out)], torch_out),
            **cp_jobs(src, work / "copy.bin"),
        }
        runs = rounds(jobs, n=args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nModel: GPT-2-medium shapes, {args.layers} layers, {size / 1e9:.2f} GB fp32 .pt (torch zip), "
          f"largest tensor {mib(largest)}; {args.rounds} rounds; {platform.machine()}, "
          f"Python {platform.python_version()}\n")
    print("| job | median wall s | ratio to cp | ratio to cp+fsync | peak RSS |")
    print("|---|---|---|---|---|")
    for label, rs in runs.items():
        print(f"| {label} | {median_wall(rs):.2f} | {ratio(rs, runs['cp']):.2f}x | "
              f"{ratio(rs, runs['cp+fsync']):.2f}x | {mib(max_rss(rs))} |")


if __name__ == "__main__":
    main()
