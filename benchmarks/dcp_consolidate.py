"""A 2-rank DCP checkpoint consolidated: `migrate convert CKPT out.safetensors` against torch's
`dcp_to_torch_save(CKPT, out.pt)`, wall time and peak RSS, same rounds.

    python benchmarks/dcp_consolidate.py [--rounds 3] [--dir /tmp/dcp-bench] [--keep]

The checkpoint (issue 35): GPT-2-medium-like F32 shapes, 26 blocks of (3072x1024, 1024x1024,
4096x1024, 1024x4096) plus a 24576x1024 embedding (96 MiB, the largest tensor), ~1.43 GB in all,
every tensor a DTensor `Shard(0)` over 2 gloo ranks, written by `torch.distributed.checkpoint.save`.
Each job runs in its own process, timed by `harness.run` (the files read once before every job, so
both read from the page cache; `sync` before and after, outside the timing; peak RSS from GNU time,
mapped file pages included). Rounds are rotated; the figures are the medians over rounds (peak RSS:
the largest). Not run by the tests.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness  # noqa: E402

SHAPES = [("wte", (24576, 1024))] + [
    (f"h.{i}.{n}", s) for i in range(26)
    for n, s in (("attn.c_attn", (3072, 1024)), ("attn.c_proj", (1024, 1024)), ("mlp.c_fc", (4096, 1024)),
                 ("mlp.c_proj", (1024, 4096)))]

TORCH_JOB = ("import sys; from torch.distributed.checkpoint.format_utils import dcp_to_torch_save; "
             "dcp_to_torch_save(sys.argv[1], sys.argv[2])")


def _worker(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    sd = {}
    for i, (name, (rows, cols)) in enumerate(SHAPES):
        g = torch.Generator().manual_seed(i * 2 + rank)
        local = torch.randn(rows // 2, cols, generator=g)
        sd[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
    dcp.save({"model": sd}, checkpoint_id=out)
    dist.destroy_process_group()


def make_checkpoint(path: Path) -> None:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, str(path)), nprocs=2, join=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/dcp-bench")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint for the next run")
    args = ap.parse_args()
    os.environ["PYTHONPATH"] = str(ROOT)
    work = Path(args.dir)
    ckpt = work / "ckpt"
    if not (ckpt / ".metadata").exists():
        work.mkdir(parents=True, exist_ok=True)
        make_checkpoint(ckpt)
    size = sum(f.stat().st_size for f in ckpt.iterdir())
    jobs = [
        harness.Job("migrate -> .safetensors", [sys.executable, "-m", "migrator.cli", "convert", str(ckpt),
                                                 str(work / "out.safetensors"), "--overwrite"],
                    work / "out.safetensors", ckpt),
        harness.Job("dcp_to_torch_save -> .pt", [sys.executable, "-c", TORCH_JOB, str(ckpt), str(work / "out.pt")],
                    work / "out.pt", ckpt),
    ]
    res = harness.rounds(jobs, args.rounds, work / "rss.txt")
    largest = max(rows * cols * 4 for _, (rows, cols) in SHAPES)
    print(f"checkpoint: {size / 1e9:.2f} GB in {len(list(ckpt.iterdir()))} files, largest tensor "
          f"{largest / 2**20:.0f} MiB, {args.rounds} rounds")
    for job in jobs:
        wall, rss = res.wall(job.label), res.rss(job.label)
        print(f"{job.label:28s} wall {wall:6.2f} s   peak RSS {rss / 2**20:7.0f} MiB "
              f"(largest tensor + {(rss - largest) / 2**20:.0f} MiB)")
    if not args.keep:
        shutil.rmtree(ckpt)


if __name__ == "__main__":
    main()
