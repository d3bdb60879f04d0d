"""The HTML report at 100k tensors (issue 17): file size, render time, browser open and filter times.

    .venv/bin/python benchmarks/html_report.py [--rounds 3]

The plan is the suite's 100k model (GPT-2 names, d=16; generated into benchmarks/out/ if absent)
through a recipe that gives every tensor the ops a real conversion has: a remap, `pytorch_to_burn`
(transposes, gamma/beta renames) and an F16 cast. Measured, each as the median of the rounds:

- `migrate plan R --html F` (the whole command) and, in this process, `plan_page(plan_json(plan))`
  alone (the render, from a built plan);
- the page in headless Chromium (Debian's, through playwright): from `goto` to the page's ready
  marker, then typing a filter that leaves 12 tensors (their modules open), one that leaves a
  third of them, clearing it, expanding the module of 8,333 layers (its first 500 rendered), and
  "Expand all" (built up to the page's budget of 5,000 rows and modules).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from models import MODELS, MODULES, OUT, lazy_random  # noqa: E402

import tests.support.browser as browser  # noqa: E402


def recipe() -> Path:
    import yaml

    model = MODELS["100k"]
    st = model.path("safetensors")
    if not st.exists():
        from migrator import save

        OUT.mkdir(parents=True, exist_ok=True)
        print(f"generating {st}", file=sys.stderr)
        save(lazy_random(model.shapes), st)
    path = OUT / "100k.html-report.yaml"
    path.write_text(yaml.safe_dump({
        "version": 1, "source": {"path": st.name}, "remap": [{"from": r"^h\.(\d+)\.", "to": "layers.$1."}],
        "modules": MODULES, "adapters": ["pytorch_to_burn"], "dtype": {"cast": "F16"},
        "target": {"path": "job.bpk", "overwrite": True}}, sort_keys=False))
    return path


RESULTS: dict[str, list[float]] = {}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def clock(label: str, cpu: bool = False, child: bool = False) -> Iterator[None]:
    """Record the block's wall time under `label`, and its CPU time (this process's, or with
    `child` the processes it ran) under `label, CPU time`: on a shared machine the wall time
    mostly measures the others' load."""
    start, start_cpu, start_child = time.perf_counter(), time.process_time(), _children_cpu()
    yield
    RESULTS.setdefault(label, []).append(time.perf_counter() - start)
    if cpu or child:
        used = _children_cpu() - start_child if child else time.process_time() - start_cpu
        RESULTS.setdefault(f"{label}, CPU time", []).append(used)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    why = browser.missing()
    if why:
        sys.exit(f"no browser: {why}")
    r = recipe()
    page_file = OUT / "100k.plan.html"
    from migrator.analysis.html_report import plan_page
    from migrator.cli.recipe import add_target_problems
    from migrator.plan.document import plan_json
    from migrator.plan.loaded import load, open_plan

    migrate = [sys.executable, "-m", "migrator.cli", "plan", str(r)]
    for _ in range(args.rounds):
        with clock("migrate plan --html (whole command)", child=True):
            subprocess.run([*migrate, "--html", str(page_file), "--overwrite"], check=True, stdout=subprocess.DEVNULL)
        with clock("migrate plan --json > /dev/null (for comparison)", child=True):
            subprocess.run([*migrate, "--json"], check=True, stdout=subprocess.DEVNULL)
        with open_plan(load(str(r))) as p:
            add_target_problems(p)
            with clock("plan_json(plan) in process", cpu=True):
                doc = plan_json(p)
            with clock("plan_page(doc) in process (the render)", cpu=True):
                plan_page(doc)
    size = page_file.stat().st_size
    url = page_file.resolve().as_uri()
    with tempfile.TemporaryDirectory() as profile, browser.chromium(Path(profile)) as context:
        for _ in range(args.rounds):
            page = context.new_page()
            page.set_default_timeout(60_000)
            with clock("browser: goto -> page ready"):
                page.goto(url)
                page.wait_for_selector("body[data-ready]", state="attached")
            RESULTS.setdefault("browser: navigation start -> ready (page clock)", []).append(
                page.evaluate("performance.now()") / 1000)
            for text, label in (("layers.4711.", "12 tensors, their modules opened"), ("attn", "33,332 tensors"),
                                ("", "cleared")):
                with clock(f"browser: filter '{text}' ({label})"):
                    page.fill("#filter", text)
                    page.wait_for_selector(f'#tree[data-query="{text}"]', state="attached")
                if text == "layers.4711.":
                    assert page.locator("#tree li.tensor").count() == 12
            with clock("browser: expand 'layers' (8,333 modules, 500 shown)"):
                page.click('#tree li.mod[data-path="layers"] > .line > .tog')
                page.wait_for_selector('#tree li.mod[data-path="layers.0"]')
            with clock("browser: Expand all (5,000 rows and modules built, then laid out)"):
                page.click("#expand-all")
                page.evaluate("document.body.offsetHeight")  # runs after the click's handler: forces the layout
            page.close()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"page: {size / 1e6:.2f} MB ({size:,} bytes), {args.rounds} rounds, medians; load average {load}\n")
    print("| step | median s | min s |\n|---|--:|--:|")
    for label, values in RESULTS.items():
        print(f"| {label} | {statistics.median(values):.2f} | {min(values):.2f} |")


if __name__ == "__main__":
    main()
