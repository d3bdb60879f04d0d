"""Small rank sets written here, for the hostile tests of rank-set readers: FSDP1 ShardedTensor rank
files made on torch's fake process group (an N-rank world in one process, no sockets), each rank's file
as FSDP1's SHARDED_STATE_DICT saves it (row k of `w` on rank k, `b` on rank 0 alone, a plain `step`),
and the oracles beside the folder; and a two-rank ZeRO-1 step laid out as DeepSpeed writes it."""

from __future__ import annotations

import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

FSDP1 = """
import sys, warnings, torch, torch.distributed as dist
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import ShardedTensor, Shard
from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties
from torch.testing._internal.distributed.fake_pg import FakeStore
warnings.simplefilter("ignore")
out, n, cols, expanded, protocol = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[6])
w = torch.randn(n, cols, generator=torch.Generator().manual_seed(0))
b = torch.randn(2, cols, generator=torch.Generator().manual_seed(1))  # all on rank 0: placements say nothing of n
if not expanded:
    torch.save(w, f"{out}/../whole.pt")
    torch.save(b, f"{out}/../whole_b.pt")
for k in range(n):
    dist.init_process_group("fake", store=FakeStore(), rank=k, world_size=n)
    rows = 1 if not expanded else int(sys.argv[5])
    metas = [ShardMetadata([r * rows, 0], [rows, cols], f"rank:{r}/cpu") for r in range(n)]
    md = ShardedTensorMetadata(metas, torch.Size([n * rows, cols]), TensorProperties(dtype=w.dtype))
    local = w[k:k + 1].clone() if not expanded else torch.zeros(rows, cols)
    st = ShardedTensor._init_from_local_shards_and_global_metadata([Shard(local, metas[k])], md)
    if expanded:  # a stride-0 view: a few bytes of storage claiming rows x cols elements
        st._local_shards = [Shard(torch.ones(1, 1).expand(rows, cols), metas[k])]
    saved = {"w": st, "step": torch.tensor(3)}
    if not expanded:
        metas_b = [ShardMetadata([0, 0], [2, cols], "rank:0/cpu")]
        md_b = ShardedTensorMetadata(metas_b, b.size(), TensorProperties(dtype=b.dtype))
        saved["b"] = ShardedTensor._init_from_local_shards_and_global_metadata(
            [Shard(b.clone(), metas_b[0])] if k == 0 else [], md_b)
    torch.save(saved, f"{out}/model_rank{k}.pt", pickle_protocol=protocol)
    dist.destroy_process_group()
"""


def fsdp1_set(folder: Path, ranks: int = 2, cols: int = 3, *, expanded_rows: int = 0, protocol: int = 2) -> Path:
    """`folder` filled with an FSDP1 set of `ranks` rank files (`model_rank{K}.pt`, torch.save's pickle
    `protocol`): `w` row k on rank k, `b` whole on rank 0 (oracles `whole.pt`, `whole_b.pt` beside the
    folder); with `expanded_rows`, `w` only, each rank's shard a stride-0 view of that many rows."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", FSDP1, str(folder), str(ranks), str(cols),
                    "1" if expanded_rows else "0", str(expanded_rows), str(protocol)], check=True, timeout=300)
    return folder


ZERO_STEP = "global_step1"
ZERO_MODEL = "mp_rank_00_model_states.pt"


def zero_optim_name(rank: int) -> str:
    return f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def zero_states() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A ZeRO-1 step of two ranks: `a.weight` [4, 3], `a.bias` [3], 15 elements, one of padding."""
    import torch

    w, b = torch.arange(12.0).reshape(4, 3), torch.ones(3)
    flat = torch.cat([w.flatten(), b, torch.zeros(1)])
    model = {"module": OrderedDict([("a.weight", w), ("a.bias", b)]), "buffer_names": [],
             "param_shapes": [OrderedDict([("a.weight", torch.Size([4, 3])), ("a.bias", torch.Size([3]))])],
             "frozen_param_shapes": None, "shared_params": {}, "frozen_param_fragments": None,
             "dp_world_size": 2, "mp_world_size": 1, "ds_version": "0.19.8"}
    optims = [{"optimizer_state_dict": {"zero_stage": 1, "partition_count": [2], "group_paddings": [1],
                                        "single_partition_of_fp32_groups": [flat[r * 8:(r + 1) * 8].clone()],
                                        "base_optimizer_state": {"state": {}, "param_groups": []}},
               "ds_version": "0.19.8"} for r in range(2)]
    return model, optims


def zero_step(folder: Path, model: dict[str, Any] | None = None, optims: list[dict[str, Any]] | None = None) -> Path:
    """`folder` holding `latest` and the step folder of `zero_states()` (or of the states given)."""
    import torch

    step = folder / ZERO_STEP
    step.mkdir(parents=True)
    (folder / "latest").write_text(ZERO_STEP)
    good_model, good_optims = zero_states()
    torch.save(model if model is not None else good_model, step / ZERO_MODEL)
    for rank, optim in enumerate(optims if optims is not None else good_optims):
        torch.save(optim, step / zero_optim_name(rank))
    return folder
