"""A/B of `migrate plan` on 100k-tensor headers: CPU time and wall time, alternating runs.

Usage: python benchmarks/ab/plan.py [--rounds N] [--tree NAME=PATH ...] DIR

DIR holds the DeepSeek-V3-shaped model of `headers.py` (written there if missing) and, if
`benchmarks/out` has them, the suite's 100k `.pt` and its `pytorch_to_burn` + F16 recipe. Each
`--tree` is a checkout whose package is run (default: this one, as "new"); the trees alternate run
by run, in a fresh process each, output piped to a file (as `migrate plan > plan.txt` is). Both
user+sys CPU of the child (`os.wait4`) and wall time are printed: on a shared, loaded host the
wall time mostly measures the other jobs, the CPU time much less.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from headers import make_models  # noqa: E402


def recipes(folder: Path) -> list[tuple[str, Path, Path]]:
    """(label, recipe, folder to run in) for each plan measured."""
    st, bpk = make_models(folder)
    out = []
    for label, path, ext in (("DeepSeek 90k burnpack, rename", bpk, "safetensors"),
                             ("DeepSeek 90k SafeTensors, rename", st, "bpk")):
        recipe = folder / f"plan-{path.suffix[1:]}.yaml"
        recipe.write_text(f"version: 1\nsource:\n  path: {path}\nremap:\n  - from: '^model\\.'\n    to: ''\n"
                          f"target:\n  path: {folder / ('planned.' + ext)}\n")
        out.append((label, recipe, folder))
    # HF names to Burn-style names, as a real recipe does (every tensor matches 1-3 of 8 rules)
    rules = [(r"^model\.", ""), (r"^layers\.(\d+)\.", "layer$1."), (r"\.self_attn\.", ".attn."),
             (r"\.mlp\.experts\.(\d+)\.", ".moe.expert$1."), (r"\.mlp\.shared_experts\.", ".moe.shared."),
             (r"\.(gate|up|down)_proj\.", ".$1."), (r"\.input_layernorm\.", ".norm_1."),
             (r"\.post_attention_layernorm\.", ".norm_2.")]
    many = folder / "plan-bpk-8-rules.yaml"
    many.write_text(f"version: 1\nsource:\n  path: {bpk}\nremap:\n"
                    + "".join(f"  - {{from: '{a}', to: '{b}'}}\n" for a, b in rules)
                    + f"target:\n  path: {folder / 'planned.safetensors'}\n")
    out.append(("DeepSeek 90k burnpack, 8 rules", many, folder))
    bench = REPO / "benchmarks" / "out"
    to_burn = bench / "100k.pytorch_to_burn-f16.yaml"
    if to_burn.exists() and (bench / "100k.pt").exists():
        out.append(("100k .pt, pytorch_to_burn + F16", to_burn, bench))
    return out


def run(tree: Path, recipe: Path, cwd: Path, sink: Path) -> tuple[float, float]:
    """(CPU s, wall s) of one `migrate plan` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("COLUMNS", None)
    with sink.open("wb") as out:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "migrator.cli", "plan", str(recipe)], cwd=cwd, env=env,
                                stdout=out)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{tree}: migrate plan {recipe} exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--only", default="", help="run only the plans whose label contains this")
    a = ap.parse_args()
    trees = [(n, Path(p)) for n, _, p in (t.partition("=") for t in a.tree)] or [("new", REPO)]
    a.folder.mkdir(parents=True, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.1f}; {a.rounds} alternating rounds; median (min) s")
    for label, recipe, cwd in recipes(a.folder):
        if a.only not in label:
            continue
        cpu: dict[str, list[float]] = {n: [] for n, _ in trees}
        wall: dict[str, list[float]] = {n: [] for n, _ in trees}
        for _, tree in trees:
            run(tree, recipe, cwd, a.folder / "plan.txt")  # page cache, byte-compiled modules
        for r in range(a.rounds):
            for name, tree in trees if r % 2 == 0 else trees[::-1]:
                c, w = run(tree, recipe, cwd, a.folder / "plan.txt")
                cpu[name].append(c)
                wall[name].append(w)
        cells = "  ".join(f"{n}: CPU {statistics.median(cpu[n]):.2f} ({min(cpu[n]):.2f}) "
                          f"wall {statistics.median(wall[n]):.2f} ({min(wall[n]):.2f})" for n, _ in trees)
        ratio = ""
        if len(trees) == 2:
            (x, _), (y, _) = trees
            ratio = (f"  CPU {y}/{x} {statistics.median(cpu[y]) / statistics.median(cpu[x]):.2f}"
                     f"  wall {y}/{x} {statistics.median(wall[y]) / statistics.median(wall[x]):.2f}")
        print(f"{label:34} {cells}{ratio}  (load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
