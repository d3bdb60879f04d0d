"""A/B of two commits on the suite's jobs: does a refactor cost speed or memory?

Usage: python benchmarks/ab/layout.py [--base COMMIT] [--models gpt2-medium] [--rounds N]

Checks out BASE (default 36b74e3, main before the package layout of issue 26) into a detached
worktree beside the repository, builds its kernels, and runs the suite's jobs (benchmarks/suite.py:
SafeTensors <-> burnpack, the two transforming recipes, durable and --no-fsync; `--help` and
`plan` of the 100k-tensor model) once per round with each checkout, alternating which goes first.
Both run as `python -c "from migrator.cli import main; main()"` with PYTHONPATH set, so neither
gets an installed entry point the other lacks. Reports, per job, the median over rounds of the
per-round ratio new/base of wall time, and both peak RSS figures.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import Job, rounds
from models import MODELS, OUT, burn_recipe, ensure
from suite import cases

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
ENTRY = "import sys; from migrator.cli import main; sys.exit(main())"


def checkout(commit: str) -> Path:
    tree = REPO.parent / f"ab-{commit[:10]}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), commit], check=True)
        subprocess.run([PY, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, check=True,
                       stdout=subprocess.DEVNULL)
    subprocess.run([PY, "-m", "compileall", "-q", str(tree / "migrator")], check=True)
    return tree


def as_variant(job: Job, tree: Path, tag: str) -> Job:
    """The same job run from `tree`'s package instead of the installed `migrate`."""
    assert Path(job.cmd[0]).name == "migrate"
    cmd = ["env", f"PYTHONPATH={tree}", PY, "-c", ENTRY, *job.cmd[1:]]
    return Job(f"{job.label} [{tag}]", cmd, job.output, job.warm)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="36b74e3")
    ap.add_argument("--models", default="gpt2-medium")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    trees = {"base": checkout(args.base), "new": REPO}
    subprocess.run([PY, "-m", "compileall", "-q", str(REPO / "migrator")], check=True)
    jobs: list[Job] = []
    for name in args.models.split(","):
        model = MODELS[name]
        if not ensure(model, spare=2 * model.nbytes + (1 << 30)):
            sys.exit(f"not enough disk for {name}")
        for case in cases(model):
            jobs += [case.job, case.fast]
    small = MODELS["100k"]
    if ensure(small, spare=1 << 30):
        plain = OUT / "100k.plan-convert.yaml"
        plain.write_text(f"version: 1\nsource: {{path: {small.path('safetensors').name}}}\ntarget: {{path: job.bpk}}\n")
        to_burn = burn_recipe(small, source=small.path("pt").name, target="job.bpk", adapter="pytorch_to_burn",
                              cast="F16")
        migrate = str(Path(PY).with_name("migrate"))
        jobs += [Job("--help", [migrate, "--help"]),
                 Job("plan 100k st", [migrate, "plan", str(plain)], warm=small.path("safetensors")),
                 Job("plan 100k pt+F16", [migrate, "plan", str(to_burn)], warm=small.path("pt"))]
    # pairs: base then new in even rounds, new then base in odd ones (rounds() rotates the whole list)
    paired = [as_variant(j, trees[t], t) for j in jobs for t in ("base", "new")]
    res = rounds(paired, args.rounds, OUT / ".rss")
    print("\n| job | base median s | new median s | new/base (median of rounds) | base RSS | new RSS |")
    print("|---|--:|--:|--:|--:|--:|")
    for j in jobs:
        b, n = res.runs[f"{j.label} [base]"], res.runs[f"{j.label} [new]"]
        ratio = statistics.median(x.wall / y.wall for x, y in zip(n, b, strict=True))
        print(f"| {j.label} | {statistics.median(r.wall for r in b):.2f} | {statistics.median(r.wall for r in n):.2f} "
              f"| {ratio:.2f} | {max(r.peak_rss for r in b) >> 20} MiB | {max(r.peak_rss for r in n) >> 20} MiB |")


if __name__ == "__main__":
    main()
