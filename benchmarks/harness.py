"""Measuring whole commands: wall time and peak RSS (incl. mapped file pages) from the kernel.

Each job runs in its own process so its peak RSS is its own (`wait4` rusage). `sync` runs before
and after every timed job, outside the timing, so dirty pages of one job do not bill the next.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"


@dataclass
class Run:
    wall: float
    peak_rss: int  # bytes


def run(cmd: Sequence[str], *, cleanup: Sequence[Path] = ()) -> Run:
    """Run `cmd` once: remove `cleanup` paths first, sync, time it, sync again."""
    for p in cleanup:
        p.unlink(missing_ok=True)
    subprocess.run(["sync"], check=True)
    start = time.perf_counter()
    proc = subprocess.Popen(list(cmd), stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} exited with {proc.returncode}")
    subprocess.run(["sync"], check=True)
    return Run(wall, usage.ru_maxrss * 1024)


def pairs(job: Sequence[str], baseline: Sequence[str], *, job_out: Path, base_out: Path, n: int = 4
          ) -> tuple[list[Run], list[Run]]:
    """`n` (job, baseline) pairs, alternating which one goes first."""
    jobs, bases = [], []
    for i in range(n):
        if i % 2 == 0:
            jobs.append(run(job, cleanup=[job_out]))
            bases.append(run(baseline, cleanup=[base_out]))
        else:
            bases.append(run(baseline, cleanup=[base_out]))
            jobs.append(run(job, cleanup=[job_out]))
    return jobs, bases


def median_wall(runs: Sequence[Run]) -> float:
    return statistics.median(r.wall for r in runs)


def max_rss(runs: Sequence[Run]) -> int:
    return max(r.peak_rss for r in runs)


def ratio_median(jobs: Sequence[Run], bases: Sequence[Run]) -> float:
    return statistics.median(j.wall / b.wall for j, b in zip(jobs, bases, strict=True))


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"
