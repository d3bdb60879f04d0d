"""Training checkpoints written by torch.distributed itself: 2 ranks on gloo over 127.0.0.1.

A small model is tensor-parallel over a 1-D mesh of 2 ranks (ColwiseParallel: `Shard(0)` weight and
bias; RowwiseParallel: `Shard(1)` weight, `Replicate()` bias; a LayerNorm distributed `Replicate()`),
trained one AdamW step with fixed gradients; then each rank writes
* `dcp/`: `torch.distributed.checkpoint.save({"model": ..., "optim": ...})` (get_state_dict's keys),
* `verl/model_world_size_2_rank_K.pt`: `torch.save` of its model state dict of DTensors (verl's layout),
* `hf/shard-0000K-model-00001-of-00001.safetensors`: the model through DCP's `HuggingFaceStorageWriter`
  (`save_distributed=True`: each rank's chunks, placed by `DCP_SHARDING_INFO`),
and rank 0 writes `full.pt`: every tensor gathered whole (`full_tensor()`), the unsharded oracle.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import NoReturn


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _worker(rank: int, port: int, out: str, rows: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, rows), nn.ReLU(), nn.Linear(rows, 6), nn.LayerNorm(6))
        mesh = init_device_mesh("cpu", (2,))
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        for attr in ("weight", "bias"):
            setattr(model[3], attr, nn.Parameter(distribute_tensor(getattr(model[3], attr).detach(), mesh,
                                                                   [Replicate()])))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for i, p in enumerate(model.parameters()):
            p.grad = torch.ones_like(p) * (i + 1)
        opt.step()
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(out, "dcp"))
        os.makedirs(os.path.join(out, "verl"), exist_ok=True)
        torch.save(msd, os.path.join(out, "verl", f"model_world_size_2_rank_{rank}.pt"))
        # DCP's Hugging Face storage layout: each rank's chunks in SafeTensors files, no .metadata
        dcp.save(msd, storage_writer=dcp.HuggingFaceStorageWriter(os.path.join(out, "hf"), save_distributed=True))

        def whole(v: object) -> object:
            if isinstance(v, DTensor):
                return v.full_tensor()
            if isinstance(v, dict):
                return {k: whole(x) for k, x in v.items()}
            return v

        full = {"model": whole(msd), "optim": whole(osd)}
        if rank == 0:
            torch.save(full, os.path.join(out, "full.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    end_rank()


def write_checkpoints(out: Path, rows: int = 16) -> Path:
    """Write the checkpoints above into `out` (about 5 s: two spawned ranks)."""
    import torch.multiprocessing as mp

    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(_free_port(), str(out), rows), nprocs=2, join=True)
    return out


def end_rank() -> NoReturn:
    """End a spawned rank whose work is done and whose process group is destroyed, at once: the
    interpreter's own teardown can abort in gloo's threads ("terminate called without an active
    exception", SIGABRT; seen under load), which mp.spawn reports as a failed rank although every
    file was written. Only reached on success: an exception still ends the rank as a failure.

    The rank's own multiprocessing children are ended first: megatron-core's checkpoint writer starts a
    `multiprocessing.Manager` server (`filesystem_async._get_write_results_queue`) that only the
    interpreter's exit handlers shut down, which `os._exit` skips: each rank left one ~200 MB process
    behind for good."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.terminate()
        child.join(10)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
