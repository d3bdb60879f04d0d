"""A/B: the workers of one parallel write as threads (what migrator uses) or as forked processes.

    PYTHONPATH=$PWD python benchmarks/ab/parallel_workers.py [WORKDIR] [--gb 1.5] [--rounds 3]

One SafeTensors source of GB GB (24 torch-Linear-shaped F32 tensors) is written to one .bpk,
durable, in this process (planned once per run): 1 writer; 2 threads (`LocalRunner`); 2 forked
processes sharing the scratch file's descriptor (the same `write_range` per run of tensors). Two
jobs: pass-through (kernel copies) and transpose + F16 cast (`pytorch_to_burn`, numpy/C kernels).
Medians over the rounds, order rotated per round. The forked children need a fresh cast thread
pool (`casts._pool`): the parent's threads do not exist after fork, and without the reset a child
waits on them forever, a hazard threads do not have.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs import make_source  # benchmarks/jobs.py

from migrator.files.write_options import WriteOptions
from migrator.run.parallel_write import LocalRunner, RangeTask, save_file_parallel, write_range


class ForkRunner:
    """Each run of tensors in a forked child writing through the inherited descriptor."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def write_ranges(self, scratch: Path, fd: int, writer: Any, tasks: Sequence[RangeTask],
                     start_writeback: bool) -> None:
        _, tensors, offsets = writer.layout()
        pids = []
        for task in tasks:
            pid = os.fork()
            if pid == 0:
                import migrator.core.casts

                migrator.core.casts._pool = None  # the parent's cast threads do not exist here: a fresh pool
                code = 1
                try:
                    write_range(fd, tensors, offsets, task, start_writeback=start_writeback)
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            if status:
                raise RuntimeError(f"worker {pid} failed ({status})")

    def write_shards(self, *args: Any) -> None:
        raise NotImplementedError


def run_once(recipe_text: str, work: Path, runner: Any) -> float:
    from migrator.files.io import save_planned
    from migrator.plan.build import build_plan
    from migrator.recipe.loader import load_recipe
    from migrator.run.execute import read_by

    path = work / "ab.yaml"
    path.write_text(recipe_text)
    loaded = load_recipe(path)
    out = work / "ab-out.bpk"
    subprocess.run(["sync"], check=True)
    t = time.perf_counter()
    with build_plan(loaded.recipe, loaded.base_dir) as plan:
        assert plan.writer is not None, plan.fatal
        if runner is None:
            save_planned(plan.writer, out, overwrite=True, protect=read_by(plan), mode_from=plan.source_modes())
        else:
            save_file_parallel(plan.writer, out, runner, WriteOptions(overwrite=True, protect=read_by(plan),
                                                                      mode_from=plan.source_modes()))
    wall = time.perf_counter() - t
    out.unlink()
    return wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", nargs="?", default="/tmp/migrator-ab-workers")
    ap.add_argument("--gb", type=float, default=1.5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    n = 24
    src = work / f"src-{args.gb:g}.safetensors"
    make_source(src, n, (int(args.gb * 1e9 / n / 4 / 4096), 4096), 3)
    jobs = {
        "pass-through": f"version: 1\nsource: {{path: {src}}}\ntarget: {{path: x.bpk}}\n",
        "transpose+F16": f"version: 1\nsource: {{path: {src}}}\nmodules: {{Linear: ['^layers\\.\\d+$']}}\n"
                         "adapters: [pytorch_to_burn]\ndtype: {cast: F16}\ntarget: {path: x.bpk}\n",
    }
    variants = {"1 writer": lambda: None, "2 threads": lambda: LocalRunner(2), "2 processes": lambda: ForkRunner(2)}
    for job, text in jobs.items():
        times: dict[str, list[float]] = {v: [] for v in variants}
        names = list(variants)
        for r in range(args.rounds):
            for v in names[r % 3:] + names[: r % 3]:
                times[v].append(run_once(text, work, variants[v]()))
        base = statistics.median(times["1 writer"])
        print(job + ": " + ", ".join(f"{v} {statistics.median(t):.2f} s ({statistics.median(t) / base:.2f}x)"
                                     for v, t in times.items()), flush=True)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
