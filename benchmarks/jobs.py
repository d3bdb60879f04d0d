"""Many jobs and parallel writers: wall time of `migrate run` serial against `--jobs` / `--workers` / Ray.

    PYTHONPATH=$PWD python benchmarks/jobs.py [WORKDIR] [--rounds 3] [--big-gb 6] [--parts many,big,ray]

- many: 8 independent recipes of ~150 MB each (12 torch-Linear-shaped F32 tensors; pytorch_to_burn
  with the Linear weights declared, cast to F16, into a .bpk; and the same as a pass-through to .bpk),
  `--jobs 1` against `--jobs 2`, all durable.
- big: one job of BIG_GB GB (60 tensors) written as a 5-shard SafeTensors folder, and as one .bpk,
  with the Linear weights transposed (pytorch_to_burn), durable: `--workers 1` against `--workers 2`.
- ray: the 8 transforming recipes with `--executor ray` against a Ray head started once
  (`ray start --head --num-cpus 2`), and the big sharded job with `--executor ray --workers 2`; each
  compared with its local counterpart of the same round.

The ray part ends with `ray stop`, which stops every Ray on the machine: run it where no one else
uses Ray. Rounds rotate the order of the variants; figures are medians, ratios medians of per-round ratios.
Every output is deleted after its run, with `sync` before each timing (outside it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

PY = sys.executable
REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
MODULES = {"Linear": [r"^layers\.\d+$"]}


def _lazy(shapes: list[tuple[str, tuple[int, ...]]], seed: int) -> list:
    import numpy as np

    from migrator import dtypes
    from migrator.tensor import LazyTensor

    out = []
    for i, (name, shape) in enumerate(shapes):
        def load(shape: tuple[int, ...] = shape, i: int = i) -> memoryview:
            arr = np.random.default_rng(seed * 1000 + i).random(shape, dtype=np.float32)
            return memoryview(arr.reshape(-1).view(np.uint8))

        out.append(LazyTensor(name, dtypes.F32, shape, 4 * shape[0] * shape[1], load))
    return out


def make_source(path: Path, n: int, shape: tuple[int, int], seed: int) -> None:
    if path.exists():
        return
    from migrator import save

    tensors = [t for i in range(n) for t in _lazy([(f"layers.{i}.weight", shape)], seed + i)]
    save(tensors, path, fsync=False)


def recipe(path: Path, source: Path, target: str, *, transform: bool, cast: bool = False,
           shard: str | None = None) -> Path:
    doc: dict = {"version": 1, "source": {"path": str(source)}}
    if transform:
        doc["modules"] = MODULES
        doc["adapters"] = ["pytorch_to_burn"]
    if cast:
        doc["dtype"] = {"cast": "F16"}
    doc["target"] = {"path": target, "overwrite": True}
    if shard:
        doc["target"].update(shard={"max_size": shard}, format="safetensors")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def timed(cmd: list[str], cleanup: list[Path]) -> float:
    subprocess.run(["sync"], check=True)
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    for c in cleanup:
        if c.is_dir():
            shutil.rmtree(c)
        elif c.exists():
            c.unlink()
    return wall


def bench(variants: dict[str, tuple[list[str], list[Path]]], rounds: int) -> dict[str, list[float]]:
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            cmd, cleanup = variants[n]
            times[n].append(timed(cmd, cleanup))
            print(f"round {r + 1} {n}: {times[n][-1]:.2f} s", flush=True)
    return times


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def migrate(*args: str) -> list[str]:
    return [PY, "-m", "migrator.cli", "run", *args, "--no-progress"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", nargs="?", default="/tmp/migrator-jobs-bench")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big-gb", type=float, default=6.0)
    ap.add_argument("--parts", default="many,big,ray")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out: dict[str, dict] = {}

    # 8 x ~150 MB: 12 tensors of [2048, 1536] F32 each
    small = [work / f"src{i}.safetensors" for i in range(8)]
    for i, s in enumerate(small):
        make_source(s, 12, (2048, 1536), 100 * i)
    cast = [recipe(work / f"cast{i}.yaml", s, str(work / f"cast{i}.bpk"), transform=True, cast=True)
            for i, s in enumerate(small)]
    copy = [recipe(work / f"copy{i}.yaml", s, str(work / f"copy{i}.bpk"), transform=False)
            for i, s in enumerate(small)]
    cast_out = [work / f"cast{i}.bpk" for i in range(8)]
    copy_out = [work / f"copy{i}.bpk" for i in range(8)]
    ray_head = False
    if "ray" in parts:
        subprocess.run(["ray", "start", "--head", "--num-cpus", "2", "--include-dashboard", "false",
                        "--disable-usage-stats"], check=True, capture_output=True, env=ENV)
        ray_head = True
    try:
        if "many" in parts or "ray" in parts:
            variants = {
                "8 x 150 MB transpose+F16, --jobs 1": (migrate(*map(str, cast), "--jobs", "1"), cast_out),
                "8 x 150 MB transpose+F16, --jobs 2": (migrate(*map(str, cast), "--jobs", "2"), cast_out),
            }
            if "many" in parts:
                variants.update({
                    "8 x 150 MB pass-through, --jobs 1": (migrate(*map(str, copy), "--jobs", "1"), copy_out),
                    "8 x 150 MB pass-through, --jobs 2": (migrate(*map(str, copy), "--jobs", "2"), copy_out),
                })
            if ray_head:
                variants["8 x 150 MB transpose+F16, --executor ray"] = (
                    migrate(*map(str, cast), "--executor", "ray", "--ray-address", "auto"), cast_out)
            times = bench(variants, args.rounds)
            out["many"] = {k: statistics.median(v) for k, v in times.items()}
            out["many_ratios"] = {"transpose+F16 jobs2/jobs1": ratio(times, *list(variants)[1::-1])}
            if "many" in parts:
                out["many_ratios"]["pass-through jobs2/jobs1"] = ratio(
                    times, "8 x 150 MB pass-through, --jobs 2", "8 x 150 MB pass-through, --jobs 1")
            if ray_head:
                out["many_ratios"]["ray/jobs2"] = ratio(times, "8 x 150 MB transpose+F16, --executor ray",
                                                        "8 x 150 MB transpose+F16, --jobs 2")
        if "big" in parts or "ray" in parts:
            n = 60
            rows = int(args.big_gb * 1e9 / n / 4 / 4096)
            big = work / f"big-{args.big_gb:g}.safetensors"
            make_source(big, n, (rows, 4096), 7)
            size = big.stat().st_size
            shard = str(-(-size // 5))  # 5 shards
            sharded = recipe(work / "big-shards.yaml", big, str(work / "big-out") + "/", transform=True, shard=shard)
            single = recipe(work / "big-file.yaml", big, str(work / "big-out.bpk"), transform=True)
            outs = [work / "big-out"]
            variants = {
                "5 shards, --workers 1": (migrate(str(sharded), "--workers", "1"), outs),
                "5 shards, --workers 2": (migrate(str(sharded), "--workers", "2"), outs),
            }
            if "big" in parts:
                variants.update({
                    "one .bpk, --workers 1": (migrate(str(single), "--workers", "1"), [work / "big-out.bpk"]),
                    "one .bpk, --workers 2": (migrate(str(single), "--workers", "2"), [work / "big-out.bpk"]),
                })
            if ray_head:
                variants["5 shards, --executor ray --workers 2"] = (
                    migrate(str(sharded), "--executor", "ray", "--ray-address", "auto", "--workers", "2"), outs)
            times = bench(variants, args.rounds)
            out["big"] = {k: statistics.median(v) for k, v in times.items()}
            out["big_ratios"] = {"shards w2/w1": ratio(times, "5 shards, --workers 2", "5 shards, --workers 1")}
            if "big" in parts:
                out["big_ratios"]["one .bpk w2/w1"] = ratio(times, "one .bpk, --workers 2", "one .bpk, --workers 1")
            if ray_head:
                out["big_ratios"]["shards ray/w2"] = ratio(times, "5 shards, --executor ray --workers 2",
                                                           "5 shards, --workers 2")
            out["big_bytes"] = size
    finally:
        if ray_head:
            subprocess.run(["ray", "stop"], capture_output=True, env=ENV)
    out["load"] = os.getloadavg()
    print(json.dumps(out, indent=2))
    (work / "results.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
