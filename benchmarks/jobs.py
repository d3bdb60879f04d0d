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

Each group also times its floors in the same rounds, since on a 2-core host with one disk they, not
the worker count, bound what parallel runs can gain:
- the disk: the same output bytes (sizes taken from an untimed warm-up run of each variant, which also
  caches the inputs) written by 2 threads and fsynced, file by file (`--write-floor`);
- the cores: CPU seconds (user + system, from the children's rusage) of every run, so the serial run's
  CPU / wall says how many cores one job already keeps busy.

The ray part ends with `ray stop`, which stops every Ray on the machine: run it where no one else
uses Ray. Rounds rotate the order of the variants; figures are medians, ratios medians of per-round ratios.
Every output is deleted after its run, with `sync` before each timing (outside it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

PY = sys.executable
REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
MODULES = {"Linear": [r"^layers\.\d+$"]}


def _lazy(shapes: list[tuple[str, tuple[int, ...]]], seed: int) -> list:
    import numpy as np

    from migrator.core import dtypes
    from migrator.core.tensor import LazyTensor

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


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def timed(cmd: list[str], cleanup: list[Path]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system of the process and its children) of `cmd`."""
    subprocess.run(["sync"], check=True)
    cpu = _children_cpu()
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    wall = time.perf_counter() - t
    cpu = _children_cpu() - cpu
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    _remove(cleanup)
    return wall, cpu


def _remove(paths: list[Path]) -> None:
    for c in paths:
        if c.is_dir():
            shutil.rmtree(c)
        elif c.exists():
            c.unlink()


def output_sizes(cmd: list[str], outputs: list[Path]) -> list[int]:
    """Run `cmd` once, untimed (it also brings its inputs into the page cache), and return the size
    of every file it wrote (a folder's files one by one), then remove them."""
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    sizes = [f.stat().st_size for o in outputs for f in (sorted(o.iterdir()) if o.is_dir() else [o])]
    _remove(outputs)
    return sizes


def floor_cmd(folder: Path, sizes: list[int], writers: int = 2) -> tuple[list[str], list[Path]]:
    """The disk floor of a variant: its output sizes written durably by `writers` threads."""
    return ([PY, __file__, "--write-floor", str(folder), "--writers", str(writers),
             "--sizes", ",".join(map(str, sizes))], [folder])


def write_floor(folder: Path, sizes: list[int], writers: int) -> None:
    """Files of `sizes` bytes (random bytes, so no layer can skip zeros), each written with 16 MiB
    writes and fsynced, shared round robin among `writers` threads; then the folder is fsynced."""
    folder.mkdir(parents=True)
    block = memoryview(os.urandom(16 << 20))

    def write(mine: list[tuple[int, int]]) -> None:
        for i, size in mine:
            fd = os.open(folder / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                left = size
                while left:
                    left -= os.write(fd, block[: min(left, len(block))])
                os.fsync(fd)
            finally:
                os.close(fd)

    jobs = list(enumerate(sizes))
    threads = [threading.Thread(target=write, args=(jobs[k::writers],)) for k in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fd = os.open(folder, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


Timings = dict[str, list[tuple[float, float]]]


def bench(variants: dict[str, tuple[list[str], list[Path]]], rounds: int) -> Timings:
    names = list(variants)
    times: Timings = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            cmd, cleanup = variants[n]
            times[n].append(timed(cmd, cleanup))
            wall, cpu = times[n][-1]
            print(f"round {r + 1} {n}: {wall:.2f} s, CPU {cpu:.2f} s", flush=True)
    return times


def medians(times: Timings) -> dict[str, dict[str, float]]:
    """Median wall and CPU seconds per variant, and CPU / wall (the cores a run kept busy)."""
    return {k: {"wall": statistics.median(w for w, _ in v), "cpu": statistics.median(c for _, c in v),
                "cores_busy": statistics.median(c / w for w, c in v)} for k, v in times.items()}


def ratio(times: Timings, a: str, b: str) -> float:
    return statistics.median(x[0] / y[0] for x, y in zip(times[a], times[b], strict=True))


def migrate(*args: str) -> list[str]:
    return [PY, "-m", "migrator.cli", "run", *args, "--no-progress"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", nargs="?", default="/tmp/migrator-jobs-bench")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big-gb", type=float, default=6.0)
    ap.add_argument("--parts", default="many,big,ray")
    ap.add_argument("--write-floor", metavar="FOLDER", help=argparse.SUPPRESS)  # a floor run (floor_cmd)
    ap.add_argument("--writers", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="", help=argparse.SUPPRESS)  # bytes per file, comma-separated
    args = ap.parse_args()
    if args.write_floor:
        write_floor(Path(args.write_floor), [int(n) for n in args.sizes.split(",")], args.writers)
        return
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
            floor = work / "floor"
            cast_sizes = output_sizes(migrate(*map(str, cast), "--jobs", "1"), cast_out)
            variants = {
                "8 x 150 MB transpose+F16, --jobs 1": (migrate(*map(str, cast), "--jobs", "1"), cast_out),
                "8 x 150 MB transpose+F16, --jobs 2": (migrate(*map(str, cast), "--jobs", "2"), cast_out),
                "8 x 150 MB transpose+F16, disk floor": floor_cmd(floor, cast_sizes),
            }
            if "many" in parts:
                copy_sizes = output_sizes(migrate(*map(str, copy), "--jobs", "1"), copy_out)
                variants.update({
                    "8 x 150 MB pass-through, --jobs 1": (migrate(*map(str, copy), "--jobs", "1"), copy_out),
                    "8 x 150 MB pass-through, --jobs 2": (migrate(*map(str, copy), "--jobs", "2"), copy_out),
                    "8 x 150 MB pass-through, disk floor": floor_cmd(floor, copy_sizes),
                })
            if ray_head:
                variants["8 x 150 MB transpose+F16, --executor ray"] = (
                    migrate(*map(str, cast), "--executor", "ray", "--ray-address", "auto"), cast_out)
            times = bench(variants, args.rounds)
            out["many"] = medians(times)
            out["many_ratios"] = {"transpose+F16 jobs2/jobs1": ratio(times, *list(variants)[1::-1]),
                                  "transpose+F16 floor/jobs1": ratio(times, "8 x 150 MB transpose+F16, disk floor",
                                                                     "8 x 150 MB transpose+F16, --jobs 1")}
            if "many" in parts:
                out["many_ratios"]["pass-through jobs2/jobs1"] = ratio(
                    times, "8 x 150 MB pass-through, --jobs 2", "8 x 150 MB pass-through, --jobs 1")
                out["many_ratios"]["pass-through floor/jobs1"] = ratio(
                    times, "8 x 150 MB pass-through, disk floor", "8 x 150 MB pass-through, --jobs 1")
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
                "5 shards, disk floor": floor_cmd(work / "floor",
                                                  output_sizes(migrate(str(sharded), "--workers", "1"), outs)),
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
            out["big"] = medians(times)
            out["big_ratios"] = {"shards w2/w1": ratio(times, "5 shards, --workers 2", "5 shards, --workers 1"),
                                 "shards floor/w1": ratio(times, "5 shards, disk floor", "5 shards, --workers 1")}
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
