"""`migrate diff` and `migrate inspect --stats` against reading the files once with `cat`.

    python benchmarks/diffstats.py [--rounds 5] [--window 4MiB]

Targets (issue 17): diff of two 1.4 GB files at >= 50% of the speed of `cat A B > /dev/null`,
and stats at >= 50% of `cat A > /dev/null`, in the same run. The files are GPT-2-medium shapes
(292 F32 tensors, 1.42 GB): the SafeTensors file of benchmarks/models.py and a burnpack with the
same tensors, so diff compares every byte and finds them identical.

Page cache: warm. Both files are read before every job (outside the timing) and `fincore` shows
they stay cached; every job, `cat` included, reads from memory, so the figures compare CPU
cost, not the disk. Jobs run in rotated order per round; a ratio is the median of per-round
ratios to the `cat` of the same round. `startup` is the interpreter plus the imports diff and
stats need (`python -c "import migrator.analysis.diff, migrator.analysis.stats"`): the part of each migrator run
that does not depend on the model's size. CPU seconds (user + sys, every thread) are given too:
on a shared machine they move less than wall times, and migrator uses a second thread.
`(numpy)`: stats without the compiled kernels (MIGRATOR_NO_KERNELS=1), the A/B for
migrator/core/kernels/stats.c's float_stats. Peak RSS (mapped file pages included) from GNU time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import GNU_TIME, Job, machine, mib, warm
from models import MODELS, OUT, lazy_random

REPO = Path(__file__).resolve().parents[1]


def ensure_files() -> tuple[Path, Path]:
    model = MODELS["gpt2-medium"]
    a, b = model.path("safetensors"), model.path("bpk")
    sys.path.insert(0, str(REPO))
    from migrator import open_file, save

    OUT.mkdir(parents=True, exist_ok=True)
    if not a.exists():
        print(f"generating {a}", file=sys.stderr)
        save(lazy_random(model.shapes), a)
    if not b.exists():
        print(f"deriving {b}", file=sys.stderr)
        with open_file(a) as r:
            save(r.tensors, b)
    return a, b


@dataclass
class Timed:
    wall: float
    cpu: float  # user + sys seconds, all threads
    peak_rss: int


def run(job: Job, out: Path) -> Timed:
    """One job under GNU time (as harness.run, plus CPU seconds): wall, user+sys, peak RSS."""
    subprocess.run(["sync"], check=True)
    start = time.perf_counter()
    proc = subprocess.run([str(GNU_TIME), "-f", "%U %S %M", "-o", str(out), *job.cmd], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{job.label} exited with {proc.returncode}:\n{proc.stderr[-2000:]}")
    user, system, rss = out.read_text().split()[-3:]
    return Timed(wall, float(user) + float(system), int(rss) * 1024)


def cached(*paths: Path) -> str:
    """What `fincore` says of the files' pages in the page cache."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES,SIZE", *map(str, paths)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return "unknown (no fincore)"
    res = size = 0
    for line in out.stdout.split("\n"):
        if line.strip():
            r, s = line.split()
            res, size = res + int(r), size + int(s)
    return f"{100 * res / max(size, 1):.1f}% of {size / 1e9:.2f} GB cached"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", default="4MiB")
    opts = ap.parse_args()
    a, b = ensure_files()
    py = sys.executable
    migrate = [py, "-m", "migrator.cli"]
    jobs = [
        Job("cat A B", ["sh", "-c", 'cat "$1" "$2" > /dev/null', "_", str(a), str(b)]),
        Job("diff A B", [*migrate, "diff", str(a), str(b), "--window", opts.window]),
        Job("cat A", ["sh", "-c", 'cat "$1" > /dev/null', "_", str(a)]),
        Job("inspect A --stats", [*migrate, "inspect", str(a), "--stats", "--json"]),
        Job("inspect A --stats (numpy)", ["env", "MIGRATOR_NO_KERNELS=1", *migrate, "inspect", str(a), "--stats",
                                            "--json"]),
        Job("startup", [py, "-c", "import migrator.analysis.diff, migrator.analysis.stats"]),
    ]
    import os

    os.environ["PYTHONPATH"] = str(REPO)
    rss_file = OUT / "diffstats.rss"
    for path in (a, b):
        warm(path)
    before = cached(a, b)
    load_before = os.getloadavg()[0]
    runs: dict[str, list] = {j.label: [] for j in jobs}
    for i in range(opts.rounds):
        k = i % len(jobs)
        for job in [*jobs[k:], *jobs[:k]]:
            warm(a)
            warm(b)
            r = run(job, rss_file)
            runs[job.label].append(r)
            print(f"  round {i + 1}/{opts.rounds} {job.label}: {r.wall:.3f} s, CPU {r.cpu:.2f} s, {mib(r.peak_rss)}",
                  flush=True)
    after = cached(a, b)
    load = f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"

    def wall(label: str) -> float:
        return statistics.median(r.wall for r in runs[label])

    def speed(label: str, base: str) -> float:  # fraction of the baseline's speed, per round
        return statistics.median(c.wall / j.wall for j, c in zip(runs[label], runs[base], strict=True))

    def cpu(label: str) -> float:
        return statistics.median(r.cpu for r in runs[label])

    def net_speed(label: str, base: str) -> float:  # the same without the start-up
        return statistics.median(c.wall / max(j.wall - s.wall, 1e-9)
                                 for j, c, s in zip(runs[label], runs[base], runs["startup"], strict=True))

    rows = [("diff A B", "cat A B"), ("inspect A --stats", "cat A"), ("inspect A --stats (numpy)", "cat A")]
    lines = [f"{machine()}; {load}; {opts.rounds} rounds; window {opts.window}; page cache: warm "
             f"(before: {before}; after: {after})", "",
             "| job | s (median) | baseline s | speed vs baseline | without start-up | CPU s (job / baseline) "
             "| peak RSS |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    for label, base in rows:
        lines.append(f"| `{label}` | {wall(label):.2f} | {wall(base):.2f} (`{base}`) | {100 * speed(label, base):.0f}% "
                     f"| {100 * net_speed(label, base):.0f}% | {cpu(label):.2f} / {cpu(base):.2f} "
                     f"| {mib(max(r.peak_rss for r in runs[label]))} |")
    lines.append(f"| `startup` | {wall('startup'):.2f} | | | | {cpu('startup'):.2f} | "
                 f"{mib(max(r.peak_rss for r in runs['startup']))} |")
    text = "\n".join(lines)
    print(text)
    (OUT / "diffstats.md").write_text(text + "\n")
    (OUT / "diffstats.json").write_text(json.dumps({k: [vars(r) for r in v] for k, v in runs.items()}, indent=1))


if __name__ == "__main__":
    main()
