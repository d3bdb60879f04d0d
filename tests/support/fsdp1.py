"""Per-rank checkpoints written by FSDP1 (`FullyShardedDataParallel`) itself: 2 ranks on gloo over 127.0.0.1.

A small model (Linear, BatchNorm1d with its buffers, Linear with 5 rows, Linear with 1 row: rank 1 holds
no shard of it), each Linear its own FSDP unit, trained one Adam step with fixed inputs; then each rank
writes, with torch.save:
* `sharded/model_rank{K}.pt`: its SHARDED_STATE_DICT (ShardedTensors),
* `optim/optim_rank{K}.pt`: FSDP.optim_state_dict under SHARDED_STATE_DICT (ShardedTensor moments),
* `both/checkpoint-rank-{K}.pt`: {"model": the first, "optim": the second, "epoch": 3},
* `local/pytorch_model_fsdp_rank{K}.bin`: its LOCAL_STATE_DICT (flat parameters; Accelerate's name),
* bad variants of `sharded/` made by editing the ShardedTensors' metadata and local shards before the
  save, as a buggy writer would: `overlap/`, `hole/`, `disagree/` (rank 1's metadata differs from rank
  0's), `fewer/` (rank 1 lacks a tensor);
and rank 0 writes the oracles, gathered by torch.distributed on the same ranks: `full.pt`, {"model":
FULL_STATE_DICT, "optim": the full optimizer state dict}, and `gathered.pt`, the same two sharded state
dicts with every ShardedTensor gathered whole by its own `ShardedTensor.gather`. (The full optimizer
state dict is not an oracle for the moments: with use_orig_params on gloo its `exp_avg` comes out equal
to its `exp_avg_sq`, in torch 2.13.)
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.dist import _free_port, end_rank


def _variant(sd: dict, name: str, whole: object, layout: list[tuple[int, int, int]], rank: int) -> None:
    """Give the ShardedTensor `sd[name]` another layout: [(first row, rows, rank)], every shard's metadata
    and this rank's local shards cut from `whole`, without torch's validation."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor.shard import Shard

    st = sd[name]
    cols = list(st.size()[1:])
    metas = [ShardMetadata([r0, *[0] * len(cols)], [n, *cols], f"rank:{r}/cpu") for r0, n, r in layout]
    st._metadata.shards_metadata = metas
    st._local_shards = [Shard(whole[m.shard_offsets[0]:m.shard_offsets[0] + m.shard_sizes[0]].clone(), m)  # type: ignore[index]
                        for m, (_, _, r) in zip(metas, layout, strict=True) if r == rank]


def _gathered(value: object, rank: int) -> object:
    """`value` with every ShardedTensor gathered whole by torch (rank 0's result; a collective call)."""
    import torch
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    if isinstance(value, ShardedTensor):
        whole = torch.empty(value.size(), dtype=value.dtype) if rank == 0 else None
        value.gather(dst=0, out=whole)
        return whole
    if isinstance(value, dict):
        return {k: _gathered(v, rank) for k, v in value.items()}
    return value


def _worker(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 5), nn.ReLU(),
                              nn.Linear(5, 1))
        m = FSDP(model, device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                 use_orig_params=True)
        opt = torch.optim.Adam(m.parameters(), lr=1e-2)
        torch.manual_seed(1)
        m(torch.randn(4, 8)).sum().backward()
        opt.step()

        def save(kind: str, file: str, sd: object) -> None:
            os.makedirs(os.path.join(out, kind), exist_ok=True)
            torch.save(sd, os.path.join(out, kind, file))

        with FSDP.state_dict_type(m, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False),
                                  FullOptimStateDictConfig(rank0_only=False)):
            full = {"model": m.state_dict(), "optim": FSDP.optim_state_dict(m, opt)}
        if rank == 0:
            torch.save(full, os.path.join(out, "full.pt"))
        with FSDP.state_dict_type(m, StateDictType.SHARDED_STATE_DICT):
            msd, osd = m.state_dict(), FSDP.optim_state_dict(m, opt)
            save("sharded", f"model_rank{rank}.pt", msd)
            save("optim", f"optim_rank{rank}.pt", osd)
            save("both", f"checkpoint-rank-{rank}.pt", {"model": msd, "optim": osd, "epoch": 3})
            gathered = {"model": _gathered(msd, rank), "optim": _gathered(osd, rank)}
            if rank == 0:
                torch.save(gathered, os.path.join(out, "gathered.pt"))
            w = full["model"]["0.weight"]
            for kind, layout in (("overlap", [(0, 10, 0), (6, 10, 1)]), ("hole", [(0, 7, 0), (8, 8, 1)]),
                                 ("disagree", [(0, 8, 0), (8, 8, 1)] if rank == 0 else [(0, 9, 0), (9, 7, 1)])):
                sd = m.state_dict()
                _variant(sd, "0.weight", w, layout, rank)
                save(kind, f"model_rank{rank}.pt", sd)
            sd = m.state_dict()
            if rank == 1:
                del sd["3.bias"]
            save("fewer", f"model_rank{rank}.pt", sd)
        with FSDP.state_dict_type(m, StateDictType.LOCAL_STATE_DICT):
            save("local", f"pytorch_model_fsdp_rank{rank}.bin", m.state_dict())
        dist.barrier()
    finally:
        dist.destroy_process_group()
    end_rank()


def write_fsdp1_checkpoints(out: Path) -> Path:
    """Write the checkpoints above into `out` (a few seconds: two spawned ranks)."""
    import torch.multiprocessing as mp

    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=2, join=True)
    return out
