"""The benchmark suite: migrator beside `cp`, `cp` + fsync, and the tools users run today.

    make bench                                   # every model, 4 rounds (~30-45 min, mostly GPT-2-XL)
    .venv/bin/python benchmarks/suite.py --models 100k,gpt2-medium --rounds 2   # quicker

Models (generated once into benchmarks/out/, see models.py): GPT-2-medium shapes (1.4 GB fp32),
GPT-2-XL shapes (6.2 GB fp32), and 100,000 small tensors. Per model, every round runs each job
once in a rotated order; a job's figures are medians over rounds of its ratio to the baseline run
in the same round, because the shared disk makes absolute times vary several-fold between runs.
Prints markdown tables and writes them with the raw runs to benchmarks/out/results.{md,json}; a
full run (every model, with the start-up timings) also replaces the suite-results block of
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Job, Results, cp_jobs, machine, mib, rounds
from models import MODELS, OUT, Model, burn_recipe, ensure

PY = sys.executable
MIGRATE = str(Path(PY).with_name("migrate"))
PEERS = str(Path(__file__).resolve().parent / "peers.py")
RSS_BUDGET = 150 * 2**20
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
BEGIN, END = "<!-- suite-results:begin -->", "<!-- suite-results:end -->"
PLAN_TARGETS = {"migrate --help": 0.3, "migrate plan, 100k SafeTensors -> burnpack": 2.0,
                "migrate plan, 100k PyTorch -> burnpack, pytorch_to_burn + F16": 5.0}


@dataclass(frozen=True)
class Case:
    """A migrator job and the peer doing the same work the way users do it today.

    `job` is migrator's default (fsync before the atomic rename: compare with cp+fsync); `fast` is
    the same command with --no-fsync (nothing waits for the disk, as with cp: compare with cp).
    """

    label: str
    kind: str  # "pass-through" or "transform"
    job: Job
    peer: Job

    @property
    def fast(self) -> Job:
        return Job(self.job.label + " --no-fsync", [*self.job.cmd, "--no-fsync"], self.job.output, self.job.warm)


def cases(model: Model) -> list[Case]:
    st, pt, bpk, burn = (model.path(k) for k in ("safetensors", "pt", "bpk", "burn.bpk"))
    out = {ext: OUT / f"job.{ext}" for ext in ("bpk", "safetensors", "peer.safetensors")}
    to_burn = burn_recipe(model, source=pt.name, target=out["bpk"].name, adapter="pytorch_to_burn", cast="F16")
    to_torch = burn_recipe(model, source=burn.name, target=out["safetensors"].name, adapter="burn_to_pytorch")
    resave = Job("safetensors load_file + save_file", [PY, PEERS, "resave", str(st), str(out["peer.safetensors"])],
                 out["peer.safetensors"], st)
    torch_half = Job("torch.load(mmap) + transpose + half + save_file",
                     [PY, PEERS, "torch", str(pt), str(out["peer.safetensors"]), "--half"], out["peer.safetensors"], pt)
    torch_plain = Job("torch.load(mmap) + transpose + save_file",
                      [PY, PEERS, "torch", str(pt), str(out["peer.safetensors"])], out["peer.safetensors"], pt)
    convert = [MIGRATE, "convert", "--overwrite", "--no-progress"]
    run = [MIGRATE, "run", "--no-progress"]
    return [
        Case("SafeTensors -> burnpack", "pass-through",
             Job("st->bpk", [*convert, str(st), str(out["bpk"])], out["bpk"], st), resave),
        Case("burnpack -> SafeTensors", "pass-through",
             Job("bpk->st", [*convert, str(bpk), str(out["safetensors"])], out["safetensors"], bpk), resave),
        Case("PyTorch -> burnpack, pytorch_to_burn + F16", "transform",
             Job("pt->bpk", [*run, str(to_burn)], out["bpk"], pt), torch_half),
        Case("burnpack -> SafeTensors, burn_to_pytorch", "transform",
             Job("burn->st", [*run, str(to_torch)], out["safetensors"], burn), torch_plain),
    ]


def bench_model(model: Model, n: int, rss_file: Path) -> tuple[list[Case], Results]:
    cs = cases(model)
    peers = list({c.peer.label: c.peer for c in cs}.values())
    jobs = [*(c.job for c in cs), *(c.fast for c in cs), *cp_jobs(model.path("safetensors"), OUT / "job.copy")]
    # The peers run in rounds of their own, after migrator's and cp's: a job right after a peer (which
    # holds up to 12 GB and writes a whole model) runs slower, and in a rotation of 13 jobs over 4
    # rounds only the first few jobs would ever take that slot (benchmarks/RESULTS.md).
    print(f"{model.name}: {len(jobs)} jobs x {n} rounds, then {len(peers)} peers x {n} rounds", flush=True)
    res = rounds(jobs, n, rss_file)
    res.runs.update(rounds(peers, n, rss_file).runs)
    return cs, res


def model_table(results: dict[str, tuple[Model, list[Case], Results]]) -> str:
    lines = ["| model | job | migrator s | x cp+fsync | --no-fsync s | x cp | x peer | cp s | cp+fsync s | peer s | "
             "peak RSS | RSS - largest tensor | peer peak RSS |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for model, cs, res in results.values():
        for c in cs:
            j, f, p = c.job.label, c.fast.label, c.peer.label
            rss = max(res.rss(j), res.rss(f))
            lines.append(
                f"| {model.name} | {c.label} | {res.wall(j):.2f} | {res.ratio(j, 'cp+fsync'):.2f} | "
                f"{res.wall(f):.2f} | {res.ratio(f, 'cp'):.2f} | {res.ratio(j, p):.2f} | {res.wall('cp'):.2f} | "
                f"{res.wall('cp+fsync'):.2f} | {res.wall(p):.2f} | {mib(rss)} | {mib(rss - model.largest)} | "
                f"{mib(res.rss(p))} |")
    return "\n".join(lines)


def models_legend(results: dict[str, tuple[Model, list[Case], Results]]) -> str:
    peers = {c.label: c.peer.label for _, cs, _ in results.values() for c in cs}
    lines = [f"- **{m.name}**: {m.description}; {m.count:,} tensors, {m.nbytes / 1e9:.2f} GB, largest tensor "
             f"{mib(m.largest)}" for m, _, _ in results.values()]
    lines += [f"- peer of *{job}*: `{peer}`" for job, peer in peers.items()]
    return "\n".join(lines)


def linearity(results: dict[str, tuple[Model, list[Case], Results]]) -> tuple[str, dict[str, float]]:
    """Time ratios of a bigger model to a smaller one against their byte (or tensor-count) ratio.

    Returns the table and, per comparison, the worst job ratio divided by the yardstick: the
    byte ratio, or cp+fsync's own time ratio when the disk itself slows down on the bigger file.
    """
    lines: list[str] = []
    worst: dict[str, float] = {}
    for small, big, what in (("gpt2-medium", "gpt2-xl", "bytes"), ("10k", "100k", "tensors")):
        if small not in results or big not in results:
            continue
        (m, cs, a), (x, _, b) = results[small], results[big]
        scale = x.nbytes / m.nbytes if what == "bytes" else x.count / m.count
        disk = b.wall("cp+fsync") / a.wall("cp+fsync")
        yardstick = max(scale, disk) if what == "bytes" else scale
        lines += [f"{big} / {small}: {what} ratio **{scale:.2f}**, cp+fsync time ratio {disk:.2f}.", "",
                  f"| job | {small} s | {big} s | time ratio | time ratio / {what} ratio |", "|---|--:|--:|--:|--:|"]
        for c in cs:
            j = c.job.label
            r = b.wall(j) / a.wall(j)
            worst[what] = max(worst.get(what, 0.0), r / yardstick)
            lines.append(f"| {c.label} | {a.wall(j):.2f} | {b.wall(j):.2f} | {r:.2f} | {r / scale:.2f} |")
        lines.append("")
    if "100k" in results:
        small, cs, r = results["100k"]
        lines += ["Per-tensor overhead on the 100k model: (migrator - cp+fsync of the same file) / 100,000.", "",
                  "| job | 100k s | cp+fsync s | overhead per tensor |", "|---|--:|--:|--:|"]
        for c in cs:
            j = c.job.label
            per = (r.wall(j) - r.wall("cp+fsync")) / small.count * 1e6
            lines.append(f"| {c.label} | {r.wall(j):.2f} | {r.wall('cp+fsync'):.2f} | {per:.0f} us |")
    return "\n".join(lines), worst


def startup(n: int, rss_file: Path) -> tuple[str, Results]:
    """`migrate --help` and `migrate plan` on the 100k model (pass-through and transforming recipes)."""
    model = MODELS["100k"]
    st = model.path("safetensors")
    plain = OUT / "100k.plan-convert.yaml"
    plain.write_text(f"version: 1\nsource: {{path: {st.name}}}\ntarget: {{path: job.bpk}}\n")
    to_burn = burn_recipe(model, source=model.path("pt").name, target="job.bpk", adapter="pytorch_to_burn",
                          cast="F16")
    jobs = [Job("migrate --help", [MIGRATE, "--help"]),
            Job("migrate plan, 100k SafeTensors -> burnpack", [MIGRATE, "plan", str(plain)], warm=st),
            Job("migrate plan, 100k PyTorch -> burnpack, pytorch_to_burn + F16", [MIGRATE, "plan", str(to_burn)],
                warm=model.path("pt"))]
    res = rounds(jobs, n, rss_file)
    lines = ["| command | median s | min s | target | peak RSS |", "|---|--:|--:|--:|--:|"]
    for label, target in PLAN_TARGETS.items():
        best = min(r.wall for r in res.runs[label])
        lines.append(f"| {label} | {res.wall(label):.2f} | {best:.2f} | <= {target} s | {mib(res.rss(label))} |")
    return "\n".join(lines), res


def verdicts(results: dict[str, tuple[Model, list[Case], Results]], start: Results | None,
             linear: dict[str, float]) -> str:
    lines = ["| target | worst measured | met |", "|---|--:|---|"]

    def row(name: str, worst: float, limit: float, unit: str = "x") -> None:
        if math.isnan(worst):
            lines.append(f"| {name} | not measured | - |")
        else:
            lines.append(f"| {name} | {worst:.2f}{unit} | {'yes' if worst <= limit else 'no'} |")

    for kind, limit in (("pass-through", 1.2), ("transform", 2.0)):
        for fast, base, how in ((False, "cp+fsync", "migrator (fsync) vs cp+fsync"),
                                (True, "cp", "migrator --no-fsync vs cp"),
                                (False, "cp", "migrator (fsync) vs plain cp")):
            worst = max((res.ratio((c.fast if fast else c.job).label, base) for m, cs, res in results.values()
                         for c in cs if c.kind == kind and m.nbytes > 1e9), default=math.nan)
            row(f"{kind} <= {limit}x, {how} (1.4 and 6.2 GB models)", worst, limit)
    for m, cs, res in results.values():
        worst_rss = max(max(res.rss(c.job.label), res.rss(c.fast.label)) - m.largest for c in cs)
        lines.append(f"| peak RSS <= largest tensor + 150 MiB, {m.name} (every job) | largest + {mib(worst_rss)} | "
                     f"{'yes' if worst_rss <= RSS_BUDGET else 'no'} |")
    for what, ratio in linear.items():
        yardstick = "max(bytes, cp+fsync) ratio" if what == "bytes" else "tensor ratio"
        lines.append(f"| cost linear in {what} (worst time ratio / {yardstick} <= 1.2) | {ratio:.2f} | "
                     f"{'yes' if ratio <= 1.2 else 'no'} |")
    if start is not None:
        for label, limit in PLAN_TARGETS.items():
            row(label, start.wall(label), limit, " s")
    return "\n".join(lines)


def with_suite_block(document: str, block: str) -> str:
    """`document` (RESULTS.md) with the text between the suite-results markers replaced by `block`."""
    head, begin, rest = document.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"{RESULTS} lacks the {BEGIN} ... {END} markers")
    return f"{head}{BEGIN}\n{block.strip()}\n{END}{tail}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="10k,100k,gpt2-medium,gpt2-xl", help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--no-startup", action="store_true", help="skip the --help and plan timings")
    args = ap.parse_args()
    started = datetime.now(timezone.utc)
    if not Path("/usr/bin/time").exists():
        sys.exit("GNU time (/usr/bin/time) is needed for peak RSS: apt-get install time")
    OUT.mkdir(parents=True, exist_ok=True)
    # time what an installed user runs: a wheel install byte-compiles the package, an editable one
    # under PYTHONDONTWRITEBYTECODE would recompile every module in every timed process
    subprocess.run([PY, "-m", "compileall", "-q", str(Path(__file__).resolve().parents[1] / "migrator")], check=True)
    rss_file = OUT / ".rss"
    results: dict[str, tuple[Model, list[Case], Results]] = {}
    for name in args.models.split(","):
        model = MODELS[name]
        if not ensure(model, spare=2 * model.nbytes + (1 << 30)):
            continue
        cs, res = bench_model(model, args.rounds, rss_file)
        results[name] = (model, cs, res)
    start_table, start = (None, None)
    if not args.no_startup and ensure(MODELS["100k"], spare=1 << 30):
        start_table, start = startup(max(args.rounds, 5), rss_file)
    linear_table, linear = linearity(results)
    free = shutil.disk_usage(OUT).free
    md = [f"Machine: {machine()}; {args.rounds} rounds per job; outputs removed between jobs "
          f"({free / 1e9:.0f} GB free at the end).", "", models_legend(results), "",
          model_table(results), "", linear_table, ""]
    if start_table:
        md += [start_table, ""]
    md += [verdicts(results, start, linear)]
    text = "\n".join(md)
    print("\n" + text)
    (OUT / "results.md").write_text(text + "\n")
    if set(results) == set(MODELS) and start is not None:
        when = f"Run of {started:%Y-%m-%d %H:%M}-{datetime.now(timezone.utc):%H:%M} UTC."
        RESULTS.write_text(with_suite_block(RESULTS.read_text(), f"{when} {text}"))
        print(f"\nwritten to {RESULTS} (commit it with notes on what changed)")
    else:
        print(f"\npartial run: {RESULTS} left as it is")
    raw = {name: {label: [asdict(r) for r in runs] for label, runs in res.runs.items()}
           for name, (_, _, res) in results.items()}
    if start is not None:
        raw["startup"] = {label: [asdict(r) for r in runs] for label, runs in start.runs.items()}
    (OUT / "results.json").write_text(json.dumps(raw, indent=1) + "\n")


if __name__ == "__main__":
    main()
