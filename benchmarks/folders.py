"""Model folders and shards beside `cp` of the same bytes: wall time and peak RSS (/usr/bin/time -v).

    PYTHONPATH=$PWD python benchmarks/folders.py [WORKDIR] [--gib 1.5] [--runs 3]

Makes one SafeTensors file of ~GIB GiB (24 F32 tensors) and a 5-shard folder of the same tensors,
then times, each `--runs` times (median reported), in rotation: sharded folder -> one .bpk, one
file -> 5-shard folder, each durable and with --no-fsync, and `cp` (`cp -r` for the folder), `cp` +
sync. Also opening a 1,000-shard index.

Every job starts from the same page-cache state: its input read through once (untimed) and a
`sync` right before it. Without that, whichever job ran before decides what is cached: at 6 GiB
the source, the folder and the output do not all fit, and a job reading after `cp -r folder` finds
the single file evicted while `cp file` right after a conversion finds it cached.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

PY = sys.executable


def timed(cmd: list[str]) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (KiB) and CPU seconds (user + system) of `cmd`, from /usr/bin/time -v."""
    p = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{cmd} failed:\n{p.stderr}")
    wall = rss = cpu = 0.0
    for line in p.stderr.splitlines():
        line = line.strip()
        if line.startswith("Elapsed (wall clock) time"):
            parts = line.rsplit(" ", 1)[1].split(":")
            wall = sum(float(x) * 60 ** i for i, x in enumerate(reversed(parts)))
        elif line.startswith("Maximum resident set size"):
            rss = float(line.rsplit(" ", 1)[1])
        elif line.startswith(("User time", "System time")):
            cpu += float(line.rsplit(" ", 1)[1])
    return wall, int(rss), cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", nargs="?", default="/tmp/migrator-folders-bench")
    ap.add_argument("--gib", type=float, default=1.5)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    single, folder = work / "single.safetensors", work / "sharded"
    n_tensors = 24
    rows = int(args.gib * 2**30 / n_tensors / 4 / 4096)
    if not single.exists():  # each tensor made when written: a 6 GiB model never sits in memory
        import numpy as np

        from migrator import save
        from migrator.core import dtypes
        from migrator.core.tensor import LazyTensor

        def random(i: int) -> LazyTensor:
            def make() -> memoryview:
                return memoryview(np.random.default_rng(i).random((rows, 4096), dtype=np.float32)).cast("B")

            return LazyTensor(f"layers.{i}.weight", dtypes.parse("F32"), (rows, 4096), rows * 4096 * 4, make)

        save([random(i) for i in range(n_tensors)], single, fsync=False)
    total = single.stat().st_size
    shard = f"{-(-total // 5)}"  # bytes: five shards
    if not folder.exists():
        subprocess.run([PY, "-m", "migrator.cli", "convert", str(single), f"{folder}/", "--max-shard-size", shard,
                        "--no-progress", "--no-fsync"], check=True)
    out, bpk = work / "out", work / "out.bpk"
    jobs = {
        "folder -> .bpk": [PY, "-m", "migrator.cli", "convert", str(folder), str(bpk), "--no-progress"],
        "folder -> .bpk --no-fsync": [PY, "-m", "migrator.cli", "convert", str(folder), str(bpk), "--no-progress",
                                      "--no-fsync"],
        "cp -r folder": ["cp", "-r", str(folder), str(out)],
        "cp -r folder + sync": ["sh", "-c", f'cp -r "{folder}" "{out}" && sync "{out}"/*'],
        "file -> 5 shards": [PY, "-m", "migrator.cli", "convert", str(single), f"{out}/", "--max-shard-size", shard,
                             "--no-progress"],
        "file -> 5 shards --no-fsync": [PY, "-m", "migrator.cli", "convert", str(single), f"{out}/",
                                        "--max-shard-size", shard, "--no-progress", "--no-fsync"],
        "cp file": ["cp", str(single), str(out)],
        "cp file + sync": ["sh", "-c", f'cp "{single}" "{out}" && sync "{out}"'],
    }
    results: dict[str, list[tuple[float, int, float]]] = {k: [] for k in jobs}
    for _ in range(args.runs):
        for name, cmd in jobs.items():
            _clean(out, bpk)
            _warm(folder if "folder" in name else single)
            subprocess.run(["sync"], check=True)
            results[name].append(timed(cmd))
    _clean(out, bpk)
    print(f"{total / 2**30:.2f} GiB, {n_tensors} tensors of {total // n_tensors / 2**20:.0f} MiB, {args.runs} runs")
    print("| job | wall s (median) | all runs | CPU s (median) | peak RSS MiB (max) | vs cp of the same bytes |")
    print("|---|--:|--:|--:|--:|--:|")
    medians = {name: statistics.median(w for w, _, _ in rs) for name, rs in results.items()}
    baseline = {"folder -> .bpk": "cp -r folder + sync", "folder -> .bpk --no-fsync": "cp -r folder",
                "file -> 5 shards": "cp file + sync", "file -> 5 shards --no-fsync": "cp file"}
    for name, rs in results.items():
        cpu = statistics.median(c for _, _, c in rs)
        ratio = f"{medians[name] / medians[baseline[name]]:.2f}x" if name in baseline else ""
        runs = " ".join(f"{w:.2f}" for w, _, _ in rs)
        rss = max(r for _, r, _ in rs) / 1024
        print(f"| {name} | {medians[name]:.2f} | {runs} | {cpu:.2f} | {rss:.0f} | {ratio} |")
    many = work / "s1000"
    if not many.exists():
        import numpy as np
        from safetensors.numpy import save_file

        many.mkdir()
        weight_map = {}
        for i in range(1000):
            name = f"model-{i + 1:05d}-of-01000.safetensors"
            arrays = {f"layers.{i}.t{j}.weight": np.zeros((4, 4), np.float32) for j in range(10)}
            save_file(arrays, str(many / name))
            weight_map.update(dict.fromkeys(arrays, name))
        (many / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    from migrator.files.io import open_file

    walls, cpus = [], []
    for _ in range(5):
        t, c = time.perf_counter(), time.process_time()
        with open_file(many) as r:
            assert len(r.names()) == 10_000
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    print(f"open a 1,000-shard index (10,000 tensors), list every name: wall {statistics.median(walls):.3f} s, "
          f"CPU {statistics.median(cpus):.3f} s (median of 5, in-process)")


def _warm(path: Path) -> None:
    """Read `path` (a file, or every file of a folder) once, so a job finds it in the page cache."""
    for f in sorted(path.iterdir()) if path.is_dir() else [path]:
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(_BUF):
                pass


_BUF = bytearray(8 << 20)


def _clean(*paths: Path) -> None:
    for p in paths:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
