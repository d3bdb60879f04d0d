"""megatron-core 0.16 writing a `torch_dist` checkpoint with its optimizer state on 2 gloo ranks (CPU),
the oracle of `tests/formats/test_torch_dist_optim.py`.

Each rank builds the tiny GPT of `tests.support.torch_dist` wrapped in megatron's
`DistributedDataParallel`, takes three Adam steps with `get_megatron_optimizer`, and saves
`model_sd | {"optimizer": optimizer.sharded_state_dict(model_sd)}` with Megatron-LM's `args`, as
Megatron-LM does. Layouts (`LAYOUTS`):

* `non-distributed`: `use_distributed_optimizer=False`, tensor-parallel over the 2 ranks
  (`FP32Optimizer`: `optimizer.state.exp_avg.<param>`);
* `fully_reshardable` and `dp_reshardable`: the distributed optimizer, data-parallel over the 2 ranks
  (`metadata={"distrib_optim_sharding_type": ...}`).

What cannot run here: `fully_sharded_model_space` (the default sharding type of 0.16.1's
`DistributedOptimizer.sharded_state_dict`) raises in megatron-core itself ("ShardedTensor.
flattened_range is not supported": 0.16 removed flattened ranges), on any device, and
`fully_sharded_bucket_space` is no sharding type of 0.16.1 (NotImplementedError). Shims, in the
writing processes only, beside `tests.support.torch_dist`'s: tensors megatron's optimizers make on
"cuda" (`FP32Optimizer`'s scale, the distributed optimizer's buffers) are made on the CPU, gradient
clipping is off (`clip_grad=0`: `clip_grad_by_total_norm_fp32` asserts CUDA tensors), and for the
distributed optimizer `Tensor.type()` names CPU tensors as CUDA ones (its parameter check) and
`Tensor.cuda()` is the identity (`fully_reshardable` gathers through it).

Rank 0 records megatron's own reading (`load_plain_tensors`), each param group's parameters by
per-layer name (`decoder.layers.<i>.<param>`, from the sharded keys of the model's parameters), and
the step count.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from typing import Any

from tests.support.dist import end_rank

LAYOUTS: dict[str, tuple[bool, int, str | None]] = {
    # layout: (distributed optimizer, tensor-parallel size, distrib_optim_sharding_type)
    "non-distributed": (False, 2, None),
    "fully_reshardable": (True, 1, "fully_reshardable"),
    "dp_reshardable": (True, 1, "dp_reshardable"),
}
STEPS = 3
TOKENS = [[3, 17, 101, 5, 64, 119, 0, 42]]


def _on_cpu(make: Any) -> Any:
    @functools.wraps(make)
    def made(*args: Any, **kwargs: Any) -> Any:
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return make(*args, **kwargs)

    return made


def _shims(distributed: bool) -> None:
    import torch

    torch.cuda.synchronize = lambda *a, **k: None  # megatron-core's async saver calls both unconditionally
    torch.cuda.current_device = lambda: "cpu"
    for name in ("tensor", "zeros", "empty", "ones", "full"):
        setattr(torch, name, _on_cpu(getattr(torch, name)))
    if distributed:
        type_of = torch.Tensor.type

        def cuda_type(self: Any, *args: Any, **kwargs: Any) -> Any:
            found = type_of(self, *args, **kwargs)
            if not args and not kwargs and isinstance(found, str) and not found.startswith("torch.cuda."):
                return "torch.cuda." + found.removeprefix("torch.")
            return found

        torch.Tensor.type = cuda_type  # type: ignore[assignment]
        torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[assignment]


def per_layer_names(model_sd: dict[str, Any]) -> dict[tuple[int, tuple[int, ...]], str]:
    """(data pointer, shape) of each parameter -> its per-layer name, from the model's sharded keys."""
    out = {}
    for sh in model_sd.values():
        data = getattr(sh, "data", None)
        key = getattr(sh, "key", "")
        if data is None or key.endswith("_extra_state") or not hasattr(data, "data_ptr"):
            continue
        if key.startswith("decoder.layers."):
            # a factory (linear_fc1's gate;up) places its layer in the ShardedTensors it builds
            first = sh if hasattr(sh, "global_offset") else sh.build()
            while not hasattr(first, "global_offset"):
                first = next(iter(first.values())) if isinstance(first, dict) else first[0]
            key = f"decoder.layers.{first.global_offset[0]}.{key.removeprefix('decoder.layers.')}"
        out[(data.data_ptr(), tuple(data.shape))] = key
    return out


def _worker(rank: int, world: int, port: int, out: str, layout: str, source: str | None) -> None:
    import torch

    distributed, tp, sharding = LAYOUTS[layout]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    _shims(distributed)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.transformer_config import TransformerConfig

    from tests.support.torch_dist import FFN, GROUPS, HEADS, HIDDEN, LAYERS, PADDED, SEQ, _args

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    args = _args("llama", False)
    args.tensor_model_parallel_size = tp
    torch.manual_seed(1234)
    cfg = TransformerConfig(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=GROUPS,
        ffn_hidden_size=FFN, kv_channels=HIDDEN // HEADS, use_cpu_initialization=True, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, normalization="RMSNorm", layernorm_epsilon=1e-5,
        add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.2)
    module = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                      vocab_size=PADDED, max_sequence_length=SEQ, position_embedding_type="rope",
                      rotary_base=10000, share_embeddings_and_output_weights=False, parallel_output=False)
    model = DistributedDataParallel(cfg, DistributedDataParallelConfig(use_distributed_optimizer=distributed,
                                                                       grad_reduce_in_fp32=True), module)
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, weight_decay=0.1, clip_grad=0.0,
                                                       use_distributed_optimizer=distributed), [model])
    from tests.support.torch_dist import cpu_inputs

    tokens, positions, mask = cpu_inputs(TOKENS)

    def step() -> None:
        model.zero_grad_buffer()
        optimizer.zero_grad()
        model(tokens, positions, mask).float().pow(2).mean().backward()
        model.finish_grad_sync()
        optimizer.step()

    def record(path: Path) -> None:  # this rank's parameters and optimizer state, for a bit-for-bit comparison
        state = optimizer.chained_optimizers[0].optimizer.state_dict()
        torch.save({"params": {n: p.detach().clone() for n, p in module.named_parameters()}, "state": state}, path)

    if source is not None:  # resume: megatron loads the checkpoint into its model and optimizer, then steps once
        model_sd = module.sharded_state_dict()
        opt_sd = optimizer.sharded_state_dict(model_sd, is_loading=True)
        loaded = dist_checkpointing.load({**model_sd, "optimizer": opt_sd}, source)
        optimizer.load_state_dict(loaded.pop("optimizer"))
        module.load_state_dict(loaded)
        step()
        record(Path(out).parent / f"{Path(out).name}-resumed-{rank}.pt")
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
        end_rank()
    for _ in range(STEPS):
        step()
    model_sd = module.sharded_state_dict()
    names = per_layer_names(model_sd)
    inner = optimizer.chained_optimizers[0]
    if distributed:
        groups = [list(a) + list(b) for a, b in zip(inner.model_float16_groups, inner.model_fp32_groups, strict=True)]
    else:
        groups = [list(g["params"]) for g in inner.optimizer.param_groups]
    members = [sorted(names[(p.data_ptr(), tuple(p.shape))] for p in g) for g in groups]
    sd = dict(model_sd)
    sd["optimizer"] = optimizer.sharded_state_dict(
        model_sd, metadata=None if sharding is None else {"distrib_optim_sharding_type": sharding})
    sd["args"], sd["checkpoint_version"], sd["iteration"] = args, 3.0, STEPS
    Path(out).mkdir(parents=True, exist_ok=True)
    dist_checkpointing.save(sd, out)
    torch.distributed.barrier()
    plain = dist_checkpointing.load_plain_tensors(out)  # collective: every rank calls it
    if rank == 0:
        tensors = {k: v.clone() for k, v in plain.items() if isinstance(v, torch.Tensor)}
        torch.save({"plain": tensors, "members": members, "tp": tp},
                   Path(out).parent / f"{Path(out).name}-oracle.pt")
    if not distributed:  # the step after the save: what a resume from it must give
        step()
        record(Path(out).parent / f"{Path(out).name}-after-{rank}.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    end_rank()



def write_checkpoint(out: Path, layout: str) -> dict[str, Any]:
    """Write `out/` with megatron-core on 2 gloo ranks; return megatron's own reading of it (`plain`),
    the param groups' members by per-layer name (`members`), with megatron's optimizer state."""
    import torch
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, port, str(out), layout, None), nprocs=2)
    return torch.load(out.parent / f"{out.name}-oracle.pt", weights_only=True)


_WRITTEN: dict[str, tuple[Path, dict[str, Any]]] = {}


def cached_checkpoint(factory: Any, layout: str) -> tuple[Path, dict[str, Any]]:
    """`write_checkpoint` once per test session and layout (`factory`: pytest's tmp_path_factory)."""
    if layout not in _WRITTEN:
        out = factory.mktemp(f"megatron-optim-{layout}") / "ckpt"
        _WRITTEN[layout] = (out, write_checkpoint(out, layout))
    return _WRITTEN[layout]


def resume(source: Path, out: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """megatron-core loads `source` (a torch_dist checkpoint of the non-distributed layout's model and
    optimizer) into the same model and optimizer on 2 ranks and takes the next step; per rank, (what the
    resumed run holds after it, what the original run held after its own next step)."""
    import torch
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, port, str(out), "non-distributed", str(source)), nprocs=2)
    original = _WRITTEN["non-distributed"][0]
    return [(torch.load(out.parent / f"{out.name}-resumed-{r}.pt", weights_only=True),
             torch.load(original.parent / f"{original.name}-after-{r}.pt", weights_only=True)) for r in range(2)]
