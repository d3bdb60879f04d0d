"""A Hugging Face model folder written as a DCP checkpoint: `migrate convert HF/ OUT/ --to dcp`
against what a user runs with torch (`safetensors.torch.load_file` then `dcp.save(sd, no_dist=True)`),
wall time and peak RSS, same rounds; each output then read back by `dcp.load` and checked equal.

    python benchmarks/dcp_write.py [--rounds 3] [--dir /tmp/dcp-write-bench] [--keep]

The model: GPT-2-medium-like F32 shapes (a 24576x1024 embedding, 96 MiB, the largest tensor; 26
blocks of 3072x1024, 1024x1024, 4096x1024, 1024x4096), ~1.43 GB in one `model.safetensors`. Each job
runs in its own process (`os.wait4` gives its own ru_maxrss, mapped file pages included); the source
is read once before every job, so both read from the page cache. Jobs alternate within a round; the
figures are the medians over rounds. Not run by the tests.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [("wte.weight", (24576, 1024))] + [
    (f"h.{i}.{n}.weight", s) for i in range(26)
    for n, s in (("attn.c_attn", (3072, 1024)), ("attn.c_proj", (1024, 1024)), ("mlp.c_fc", (4096, 1024)),
                 ("mlp.c_proj", (1024, 4096)))]
TORCH_JOB = ("import sys, torch.distributed.checkpoint as dcp; from safetensors.torch import load_file; "
             "dcp.save(load_file(sys.argv[1]), checkpoint_id=sys.argv[2], no_dist=True)")
CHECK = ("import sys, torch, torch.distributed.checkpoint as dcp; from safetensors.torch import load_file; "
         "src = load_file(sys.argv[1]); into = {k: torch.empty_like(v) for k, v in src.items()}; "
         "dcp.load(into, checkpoint_id=sys.argv[2], no_dist=True); "
         "assert all(torch.equal(into[k], v) for k, v in src.items())")


def make_model(folder: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    save_file({n: rng.standard_normal(s, dtype=np.float32) for n, s in SHAPES}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}\n")


def warm(path: Path) -> None:
    with open(path, "rb") as fh:
        while fh.read(1 << 24):
            pass


def timed(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{cmd} failed")
    return wall, usage.ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/dcp-write-bench")
    ap.add_argument("--keep", action="store_true", help="keep the model for the next run")
    args = ap.parse_args()
    work = Path(args.dir)
    hf = work / "hf"
    source = hf / "model.safetensors"
    if not source.exists():  # in a process of its own: a child forked from a large parent inherits its peak RSS
        subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import dcp_write; "
                        "from pathlib import Path; dcp_write.make_model(Path(sys.argv[2]))",
                        str(Path(__file__).parent), str(hf)], check=True)
    outs = {"migrate --to dcp": work / "ours", "load_file + dcp.save": work / "theirs"}
    jobs = {
        "migrate --to dcp": [sys.executable, "-m", "migrator.cli", "convert", str(hf), str(outs["migrate --to dcp"]),
                             "--to", "dcp", "--overwrite", "--no-progress"],
        "load_file + dcp.save": [sys.executable, "-c", TORCH_JOB, str(source), str(outs["load_file + dcp.save"])],
    }
    results: dict[str, list[tuple[float, int]]] = {k: [] for k in jobs}
    for r in range(args.rounds):
        order = list(jobs) if r % 2 == 0 else list(jobs)[::-1]
        for name in order:
            shutil.rmtree(outs[name], ignore_errors=True)
            warm(source)
            results[name].append(timed(jobs[name]))
    for out in outs.values():
        subprocess.run([sys.executable, "-c", CHECK, str(source), str(out)], check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.DEVNULL)
    largest = max(rows * cols * 4 for _, (rows, cols) in SHAPES)
    print(f"model: {source.stat().st_size / 1e9:.2f} GB, largest tensor {largest / 2**20:.0f} MiB, "
          f"{args.rounds} rounds; both outputs read back equal by dcp.load")
    for name, runs in results.items():
        wall = statistics.median(w for w, _ in runs)
        rss = statistics.median(m for _, m in runs)
        print(f"{name:24s} wall {wall:6.2f} s   peak RSS {rss / 2**20:7.0f} MiB")
    for out in outs.values():
        shutil.rmtree(out, ignore_errors=True)
    if not args.keep:
        shutil.rmtree(hf)


if __name__ == "__main__":
    main()
