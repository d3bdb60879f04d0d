"""DeepSpeed ZeRO checkpoints written by DeepSpeed itself, on this CPU, for the ZeRO reader's tests.

`python tests/support/zero_run.py OUT CONFIG...` (a new process: DeepSpeed's engine sets process-wide state)
spawns 2 ranks (torch.multiprocessing) that join a gloo group on 127.0.0.1, train a tiny module
(a buffer, a frozen Linear, tied weights, two parameter groups, sizes that do not split evenly) with
AdamW for two steps and `save_checkpoint` after each, for every CONFIG `STAGE:DTYPE` (1|2|3, fp32|bf16),
into OUT/z{STAGE}_{DTYPE}/ (`global_step1/`, `global_step2/`, `latest`). Seeds are fixed.

DeepSpeed's CPU accelerator would compile its shared-memory collective op the first time (minutes);
gloo does the collectives here, so `build_shm_op` is replaced by one that builds nothing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

WORLD = 2
CONFIGS = ("1:fp32", "2:fp32", "3:fp32", "1:bf16", "2:bf16", "3:bf16")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, out: str, configs: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu")
    import deepspeed
    import deepspeed.comm.torch  # the module itself, not the `torch` name deepspeed.comm imports
    import torch

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # type: ignore[attr-defined]
    deepspeed.init_distributed(dist_backend="gloo")

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(7, 5)  # 35 + 5 elements: odd, split unevenly over 2 ranks
            self.b = torch.nn.Linear(5, 3, bias=False)
            self.n = torch.nn.LayerNorm(3)
            self.f = torch.nn.Linear(3, 3)  # frozen
            self.f.requires_grad_(False)
            self.g = torch.nn.Linear(3, 3, bias=False)
            self.h = torch.nn.Linear(3, 3, bias=False)
            self.h.weight = self.g.weight  # tied: DeepSpeed's shared_params
            self.register_buffer("scale", torch.arange(3, dtype=torch.float32))

        def forward(self, x: Any) -> Any:
            y = self.f(self.n(self.b(torch.relu(self.a(x)))))
            return self.h(self.g(y)) * self.scale

    for config in configs:
        stage, dtype = int(config.split(":")[0]), config.split(":")[1]
        torch.manual_seed(0)
        model = Tiny()
        trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        groups = [{"params": [p for n, p in trained if n.endswith("weight")], "weight_decay": 0.1},
                  {"params": [p for n, p in trained if not n.endswith("weight")], "weight_decay": 0.0}]
        ds: dict[str, Any] = {"train_batch_size": 2 * world, "train_micro_batch_size_per_gpu": 2,
                              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
                              "zero_optimization": {"stage": stage}}
        if dtype == "bf16":
            ds["bf16"] = {"enabled": True}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=groups, config=ds)
        gen = torch.Generator().manual_seed(1 + rank)
        for _ in range(2):
            x = torch.randn(2, 7, generator=gen)
            loss = engine(x.bfloat16() if dtype == "bf16" else x).float().pow(2).sum()
            engine.backward(loss)
            engine.step()
            engine.save_checkpoint(os.path.join(out, f"z{stage}_{dtype}"))
        del engine
    # DeepSpeed leaves C++ threads running; letting the interpreter tear them down aborts the rank
    # now and then ("terminate called without an active exception", about 1 run in 3 here). Every
    # file is written and flushed by now, so the rank leaves the group and exits without teardown.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def write_checkpoints(out: Path, configs: tuple[str, ...] = CONFIGS) -> subprocess.CompletedProcess[str]:
    """Run the writer in a new process; the checkpoints land in out/z{STAGE}_{DTYPE}/."""
    return subprocess.run([sys.executable, __file__, str(out), *configs], capture_output=True, text=True,
                          env={**os.environ, "DS_ACCELERATOR": "cpu"}, timeout=600)


if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(WORLD, _free_port(), sys.argv[1], sys.argv[2:]), nprocs=WORLD, join=True)


def count_partition_reads(monkeypatch: Any) -> list[int]:
    """From now on in the test, the bytes of each read of the ranks' partition files (`RankFiles.read_into`),
    one entry per read: what a streamed consolidation reads, to compare with what it needs."""
    from migrator.formats.deepspeed import partitions

    read: list[int] = []
    real = partitions.RankFiles.read_into

    def counting(self: Any, spans: Any, out: Any, tensor: str) -> None:
        read.append(sum(s.nbytes for s in spans))
        real(self, spans, out, tensor)

    monkeypatch.setattr(partitions.RankFiles, "read_into", counting)
    return read
