"""Timing whole commands on a noisy shared disk: rotating rounds, medians of per-round ratios.

Each job runs in its own process. `sync` runs before and after every timed job, outside the
timing, so dirty pages of one job do not bill the next; the job's input is read once beforehand
(outside the timing) so every job starts from the same warm page cache; its output is deleted
afterwards so the disk never holds more than one output.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

GNU_TIME = Path("/usr/bin/time")


@dataclass(frozen=True)
class Job:
    """A command to time; `output` (a file or a folder) is deleted before and after it, `warm` (a file
    or every file under a folder) is read before it."""

    label: str
    cmd: Sequence[str]
    output: Path | None = None
    warm: Path | None = None


@dataclass
class Run:
    wall: float  # seconds
    peak_rss: int  # bytes


@dataclass
class Results:
    """Runs per label, in round order, so round i of two labels can be compared."""

    runs: dict[str, list[Run]] = field(default_factory=dict)

    def wall(self, label: str) -> float:
        return statistics.median(r.wall for r in self.runs[label])

    def rss(self, label: str) -> int:
        return max(r.peak_rss for r in self.runs[label])

    def ratio(self, label: str, base: str) -> float:
        """Median of per-round ratios: each run is compared with the baseline of its own round."""
        return statistics.median(j.wall / b.wall for j, b in zip(self.runs[label], self.runs[base], strict=True))


def warm(path: Path) -> None:
    """Read a file, or every file under a folder, through the page cache (cheap when it is cached already)."""
    if path.is_dir():
        for file in sorted(path.rglob("*")):
            if file.is_file():
                warm(file)
        return
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(16 << 20)
        while f.readinto(buf):
            pass


def remove(path: Path) -> None:
    """Delete a job's output, a file or a folder, if it is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def run(job: Job, rss_file: Path) -> Run:
    """Run one job: delete its output, warm its input, sync, time it, sync, delete the output.

    Peak RSS (including mapped file pages) comes from GNU time: a child forked by this Python
    process would inherit its high-water mark, so `wait4` of a direct child overstates small jobs.
    """
    if job.output is not None:
        remove(job.output)
    if job.warm is not None:
        warm(job.warm)
    subprocess.run(["sync"], check=True)
    start = time.perf_counter()
    proc = subprocess.run([str(GNU_TIME), "-f", "%M", "-o", str(rss_file), *job.cmd],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{job.label}: {' '.join(map(str, job.cmd))} exited with {proc.returncode}:\n"
                           f"{proc.stderr[-2000:]}")
    subprocess.run(["sync"], check=True)
    if job.output is not None:
        remove(job.output)
    return Run(wall, int(rss_file.read_text().split()[-1]) * 1024)


def rounds(jobs: Sequence[Job], n: int, rss_file: Path, log: bool = True) -> Results:
    """`n` rounds of every job, the order rotated by one each round (no job always runs first)."""
    res = Results({j.label: [] for j in jobs})
    for i in range(n):
        k = i % len(jobs)
        for job in [*jobs[k:], *jobs[:k]]:
            r = run(job, rss_file)
            res.runs[job.label].append(r)
            if log:
                print(f"  round {i + 1}/{n} {job.label}: {r.wall:.2f} s, {mib(r.peak_rss)}", flush=True)
    return res


def cp_jobs(src: Path, copy: Path) -> list[Job]:
    """The floor: `cp`, and `cp` then an fsync of the copy (migrator fsyncs what it writes)."""
    return [Job("cp", ["cp", str(src), str(copy)], copy, src),
            Job("cp+fsync", ["sh", "-c", 'cp "$1" "$2" && sync "$2"', "_", str(src), str(copy)], copy, src)]


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def machine() -> str:
    """nproc, RAM, the filesystem of the outputs, Python: the facts a reader needs to compare."""
    import platform

    mem = next((int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal:")), 0)
    fs = subprocess.run(["df", "--output=fstype,source", str(Path(__file__).parent)], capture_output=True,
                        text=True).stdout.split("\n")[1:2]
    return (f"{os.cpu_count()} cores, {mem / 2**30:.0f} GiB RAM, {' '.join(fs).split()[0] if fs else '?'} on a "
            f"shared virtual disk, Linux {platform.release()}, Python {platform.python_version()}")
