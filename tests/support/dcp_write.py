"""torch.distributed reading the DCP checkpoints migrator writes: 2 ranks on gloo over 127.0.0.1.

One spawn of 2 ranks does every check that needs a process group (transformers is imported once per
rank), writing what rank 0 gathered into `root` for the tests to compare:

* `plain`: `dcp.load` of `llama-dcp/` into plain tensors shaped like `hf/model.safetensors`' on each
  rank; each rank asserts them equal bit for bit to the file's (an assertion fails the spawn);
* `fsdp`: a transformers Llama built from `hf/config.json`, each decoder layer and the root
  `fully_shard`ed over a 1-D CPU mesh (FSDP2), loads `llama-dcp/` as a torchtitan seed checkpoint
  (`dcp.load` of its sharded state dict); its full state dict gathered -> `fsdp-full.pt`;
* `resume`: for each `resume-*` checkpoint (a training checkpoint put through a recipe), the new
  model `New` sharded the same way with a fresh Adam, `get_state_dict` -> `dcp.load` ->
  `set_state_dict`, one Adam step with the gradients of `grads.pt`, then model and optimizer state
  gathered whole -> `<name>.stepped.pt`.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from tests.support.dist import end_rank


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def new_model() -> Any:
    """The model after the surgery: `fc1` renamed `inp`, `qkv` split into `q`, `k`, `v` (declared in
    another order than the checkpoint lists them: the resume matches by name)."""
    import torch
    from torch import nn

    class New(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(4, 6)
            self.q = nn.Linear(6, 3)
            self.k = nn.Linear(6, 3)
            self.v = nn.Linear(6, 3)
            self.head = nn.Linear(9, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inp(x)
            return self.head(torch.cat([self.q(h), self.k(h), self.v(h)], -1))

    return New()


def old_model() -> Any:
    from torch import nn

    class Old(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(4, 6)
            self.qkv = nn.Linear(6, 9)
            self.head = nn.Linear(9, 2)

    return Old()


def _worker(rank: int, port: int, root: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        _plain(Path(root))
        _fsdp(Path(root), rank)
        for ckpt in sorted(Path(root).glob("resume-*")):
            if ckpt.is_dir():
                _resume(ckpt, rank)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    del torch
    end_rank()


def _plain(root: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    source = load_file(str(root / "hf" / "model.safetensors"))
    into = {k: torch.full_like(v, 7) for k, v in source.items()}
    dcp.load(into, checkpoint_id=str(root / "llama-dcp"))
    for k, v in source.items():
        assert into[k].dtype == v.dtype and torch.equal(into[k].view(-1).view(torch.uint8),
                                                        v.view(-1).view(torch.uint8)), k


def _shard(model: Any) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    for layer in getattr(getattr(model, "model", None), "layers", []):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _fsdp(root: Path, rank: int) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1 + rank)  # weights unlike the checkpoint's, different per rank: the load must set them
    model = _shard(LlamaForCausalLM(LlamaConfig.from_pretrained(root / "hf")))
    sd = model.state_dict()  # DTensors: each rank reads only its shards' rows
    dcp.load(sd, checkpoint_id=str(root / "llama-dcp"))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(full, root / "fsdp-full.pt")


def _resume(ckpt: Path, rank: int) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
    from torch.distributed.tensor import distribute_tensor

    torch.manual_seed(5 + rank)
    model = _shard(new_model())
    opt = torch.optim.Adam(model.named_parameters(), lr=1e-2)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(ckpt))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    grads = torch.load(ckpt.parent / "grads.pt", weights_only=True)
    for name, p in model.named_parameters():
        p.grad = distribute_tensor(grads[name], p.device_mesh, p.placements)
    opt.step()
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({"model": msd, "optim": osd}, ckpt.parent / f"{ckpt.name}.stepped.pt")


def run_ranks(root: Path) -> None:
    """Spawn the 2 ranks over `root` (a few seconds: each imports transformers)."""
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(_free_port(), str(root)), nprocs=2, join=True)
