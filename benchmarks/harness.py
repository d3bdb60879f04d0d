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


GNU_TIME = Path("/usr/bin/time")


def run(cmd: Sequence[str], *, cleanup: Sequence[Path] = ()) -> Run:
    """Run `cmd` once: remove `cleanup` paths first, sync, time it, sync again.

    Peak RSS comes from GNU time when present: a child forked by this (large) Python process
    would inherit its high-water mark, so `wait4` here would overstate small jobs like `cp`.
    """
    for p in cleanup:
        p.unlink(missing_ok=True)
    subprocess.run(["sync"], check=True)
    rss_file = OUT / ".rss"
    wrapped = [str(GNU_TIME), "-f", "%M", "-o", str(rss_file), *cmd] if GNU_TIME.exists() else list(cmd)
    start = time.perf_counter()
    proc = subprocess.Popen(wrapped, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"{cmd} exited with {code}")
    subprocess.run(["sync"], check=True)
    peak_kib = int(rss_file.read_text().split()[-1]) if GNU_TIME.exists() else usage.ru_maxrss
    return Run(wall, peak_kib * 1024)


def rounds(jobs: dict[str, tuple[Sequence[str], Path]], n: int = 4) -> dict[str, list[Run]]:
    """`n` rounds of every job (label -> (command, output to delete first)), rotating the order."""
    labels = list(jobs)
    out: dict[str, list[Run]] = {label: [] for label in labels}
    for i in range(n):
        order = labels[i % len(labels):] + labels[: i % len(labels)]
        for label in order:
            cmd, target = jobs[label]
            out[label].append(run(cmd, cleanup=[target]))
    return out


def cp_jobs(src: Path, copy: Path) -> dict[str, tuple[Sequence[str], Path]]:
    """The floor: `cp`, and `cp` followed by an fsync of the copy (migrator fsyncs its output)."""
    return {"cp": (["cp", str(src), str(copy)], copy),
            "cp+fsync": (["sh", "-c", 'cp "$1" "$2" && sync "$2"', "_", str(src), str(copy)], copy)}


def median_wall(runs: Sequence[Run]) -> float:
    return statistics.median(r.wall for r in runs)


def max_rss(runs: Sequence[Run]) -> int:
    return max(r.peak_rss for r in runs)


def ratio_median(jobs: Sequence[Run], bases: Sequence[Run]) -> float:
    """Median of per-round ratios: each job is compared with the baseline run next to it."""
    return statistics.median(j.wall / b.wall for j, b in zip(jobs, bases, strict=True))


def table(rows: Sequence[tuple[str, dict[str, list[Run]]]], largest: int) -> str:
    """Markdown: per job, migrator's median wall time, its ratio to cp and to cp+fsync, peak RSS."""
    lines = ["| job | migrator s | cp s | cp+fsync s | ratio to cp | ratio to cp+fsync | peak RSS | "
             "RSS - largest tensor | cp peak RSS |", "|---|---|---|---|---|---|---|---|---|"]
    for label, runs in rows:
        m, cp, cps = runs["migrator"], runs["cp"], runs["cp+fsync"]
        lines.append(f"| {label} | {median_wall(m):.2f} | {median_wall(cp):.2f} | {median_wall(cps):.2f} | "
                     f"{ratio_median(m, cp):.2f}x | {ratio_median(m, cps):.2f}x | {mib(max_rss(m))} | "
                     f"{mib(max_rss(m) - largest)} | {mib(max_rss(cp))} |")
    return "\n".join(lines)


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"
