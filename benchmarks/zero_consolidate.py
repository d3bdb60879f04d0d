"""ZeRO-3 checkpoint -> SafeTensors: migrator vs DeepSpeed's zero_to_fp32, wall time and peak RSS.

    python benchmarks/zero_consolidate.py [--mb 400] [--rounds 3] [--keep DIR]

Writes a ZeRO-3 checkpoint of about `--mb` MB of fp32 masters with DeepSpeed itself (2 gloo ranks on
CPU, `tests/support/zero_run.py`'s recipe with a wider model, one AdamW step), then runs each tool in a
fresh process per round, alternating, and reports the median wall time and the peak RSS (ru_maxrss
of the child) of each:

* migrator: `migrate convert CKPT out.safetensors`;
* DeepSpeed: `convert_zero_checkpoint_to_fp32_state_dict(CKPT, OUT, safe_serialization=True)`.

Not run by the tests (it takes minutes and ~3x the checkpoint on disk).

Measured (2 shared cores, page cache warm, `--mb 300 --rounds 2`): 18 Linear(2048) layers, 288 MiB of
fp32 masters, optimizer files 865 MiB, largest tensor 16 MiB; both outputs equal bit for bit.
migrator 0.68 s, peak RSS 61 MiB; zero_to_fp32 3.75 s, peak RSS 865 MiB.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

WRITER = r"""
import os, sys, socket, torch, torch.multiprocessing as mp
def worker(rank, port, out, width, layers):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu")
    import deepspeed, deepspeed.comm.torch
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width + 1) if i % 2 == 0 else
                                  torch.nn.Linear(width + 1, width) for i in range(layers)])
    cfg = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 3}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    loss = engine(torch.randn(1, width)).pow(2).sum()
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(out)
if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(worker, args=(port, sys.argv[1], int(sys.argv[2]), int(sys.argv[3])), nprocs=2, join=True)
"""

DEEPSPEED = ("import os, sys; os.environ['DS_ACCELERATOR'] = 'cpu'\n"
             "from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict as c\n"
             "c(sys.argv[1], sys.argv[2], safe_serialization=True)\n")


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    """Wall seconds and the child's peak RSS in bytes (ru_maxrss of the one child waited for)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{cmd[:4]} failed: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
    return wall, usage.ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", help="write (or reuse) the checkpoint here")
    args = ap.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="zero-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / "ckpt"
    width, layers = 2048, max(2, round(args.mb * 1e6 / 4 / (2048 * 2049)))
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(REPO)}
    if not (ckpt / "latest").exists():
        script = work / "writer.py"
        script.write_text(WRITER)
        subprocess.run([sys.executable, str(script), str(ckpt), str(width), str(layers)], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    size = sum(f.stat().st_size for f in ckpt.rglob("*_optim_states.pt"))
    results: dict[str, list[tuple[float, int]]] = {"migrator": [], "zero_to_fp32": []}
    for _ in range(args.rounds):
        for name in results:
            out = work / f"out-{name}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            cmd = ([sys.executable, "-m", "migrator.cli", "convert", str(ckpt), str(out / "model.safetensors")]
                   if name == "migrator" else [sys.executable, "-c", DEEPSPEED, str(ckpt), str(out)])
            results[name].append(timed(cmd, env))
    print(f"ZeRO-3, 2 ranks, {layers} Linear({width}) layers: optimizer files {size / 2**20:.0f} MiB, "
          f"largest tensor {width * (width + 1) * 4 / 2**20:.0f} MiB, {args.rounds} rounds")
    for name, runs in results.items():
        wall = statistics.median(w for w, _ in runs)
        rss = max(r for _, r in runs)
        print(f"  {name:13s} median {wall:6.2f} s   peak RSS {rss / 2**20:7.0f} MiB")
    if not args.keep:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
