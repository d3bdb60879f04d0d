"""megatron-core 0.16 writing a real `torch_dist` checkpoint on 2 gloo ranks (CPU), as the oracle of
the Megatron reader's tests (`tests/formats/test_torch_dist.py`, `tests/cli/test_megatron_recipes.py`).

Each rank builds the same tiny GPTModel (megatron's local layer spec: Transformer Engine is not
installed), tensor-parallel over the 2 ranks, and saves `model.sharded_state_dict()` plus Megatron-LM's
common values (`args`, `checkpoint_version`, `iteration`) with `dist_checkpointing.save`. Rank 0 then
records what megatron itself reads back (`load_plain_tensors`) and the model's logits for fixed tokens,
computed by megatron's own forward on CPU. megatron-core's async saver calls `torch.cuda.synchronize`
and builds a tensor on `torch.cuda.current_device()`, the attention forks a CUDA RNG tracker, and the
MoE router (0.16.1) reads `te_general_gemm`, undefined without Transformer Engine: those are shimmed in
the writing processes only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
from pathlib import Path
from typing import Any

from tests.support.dist import end_rank

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {"add_qkv_bias": True},
    "qwen3": {"qk_layernorm": True},
    "mixtral": {"num_experts": 4},
    "qwen3_moe": {"num_experts": 4, "qk_layernorm": True},
}
TOPK = 2
HIDDEN, LAYERS, HEADS, GROUPS, FFN, PADDED, VOCAB, SEQ = 64, 2, 4, 2, 128, 128, 120, 32
TOKENS = [[3, 17, 101, 5, 64, 119, 0, 42]]


def _args(family: str, tied: bool) -> argparse.Namespace:
    import torch
    from megatron.core.transformer.enums import AttnBackend

    extra = FAMILIES[family]
    return argparse.Namespace(
        num_layers=LAYERS, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        group_query_attention=True, num_query_groups=GROUPS, kv_channels=HIDDEN // HEADS,
        max_position_embeddings=SEQ, padded_vocab_size=PADDED, vocab_size=VOCAB, normalization="RMSNorm",
        norm_epsilon=1e-5, swiglu=True, position_embedding_type="rope", rotary_base=10000, rotary_percent=1.0,
        rotary_interleaved=False, untie_embeddings_and_output_weights=not tied, add_bias_linear=False,
        add_qkv_bias=bool(extra.get("add_qkv_bias")), qk_layernorm=bool(extra.get("qk_layernorm")),
        params_dtype=torch.float32, bf16=False, fp16=False, tensor_model_parallel_size=2,
        pipeline_model_parallel_size=1, attention_backend=AttnBackend.auto,
        num_experts=extra.get("num_experts"),  # Megatron-LM's name (TransformerConfig: num_moe_experts)
        moe_router_topk=TOPK, moe_ffn_hidden_size=FFN if extra.get("num_experts") else None,
        micro_batch_size=1, iteration=7)


def cpu_inputs(tokens: list[list[int]] = TOKENS) -> tuple[Any, Any, Any]:
    """(tokens, positions, causal mask) for megatron's GPTModel on a CPU, in a rank whose megatron-core
    is initialised: the attention's dropout (0 here) forks megatron's CUDA RNG tracker, which has no CPU
    state to fork, and its default causal mask is made on "cuda", so the mask is given (True = masked out)."""
    import torch
    from megatron.core import tensor_parallel

    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    ids = torch.tensor(tokens)
    n = ids.shape[1]
    return ids, torch.arange(n).unsqueeze(0), torch.triu(torch.ones(n, n), diagonal=1).bool()[None, None]


def cpu_logits(model: Any, tokens: list[list[int]] = TOKENS) -> Any:
    """megatron's forward of `model` on `tokens` (see `cpu_inputs`), without gradients."""
    import torch

    with torch.no_grad():
        return model(*cpu_inputs(tokens))


def join_megatron_group(rank: int, world: int, port: int) -> None:
    """A spawned rank joins a gloo group of `world` ranks on 127.0.0.1:`port`, with the two shims
    megatron-core's writer needs on a CPU (its async saver calls both unconditionally)."""
    import torch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)


def _worker(rank: int, world: int, port: int, out: str, family: str, tied: bool) -> None:
    import torch

    join_megatron_group(rank, world, port)
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):  # 0.16.1's router reads it, undefined without Transformer Engine
        moe_utils.te_general_gemm = None
    args = _args(family, tied)
    torch.manual_seed(1234)  # the same on every rank: replicated weights (norms) must agree, and megatron's CPU init
    # draws the whole weight on each rank and keeps its own part
    cfg = TransformerConfig(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=GROUPS,
        ffn_hidden_size=FFN, kv_channels=HIDDEN // HEADS, use_cpu_initialization=True, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, normalization="RMSNorm", layernorm_epsilon=1e-5,
        add_bias_linear=False, add_qkv_bias=args.add_qkv_bias, qk_layernorm=args.qk_layernorm,
        hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.2,
        **({"num_moe_experts": args.num_experts, "moe_router_topk": TOPK, "moe_ffn_hidden_size": FFN,
            "moe_token_dispatcher_type": "allgather", "moe_aux_loss_coeff": 0.0,
            } if args.num_experts else {}))
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=args.qk_layernorm,
                                    num_experts=args.num_experts, moe_grouped_gemm=False)
    model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=PADDED, max_sequence_length=SEQ,
                     position_embedding_type="rope", rotary_base=10000,
                     share_embeddings_and_output_weights=tied, parallel_output=False)
    with torch.no_grad():  # norms and biases away from their init (ones, zeros), so a swap would show
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if "norm" in name else 0.0))
    model.eval()
    sd = model.sharded_state_dict()
    sd["args"], sd["checkpoint_version"], sd["iteration"] = args, 3.0, 7
    dist_checkpointing.save(sd, out)
    torch.distributed.barrier()
    logits = cpu_logits(model)
    plain = dist_checkpointing.load_plain_tensors(out)  # collective: every rank calls it
    if rank == 0:
        tensors = {k: v.clone() for k, v in plain.items() if isinstance(v, torch.Tensor)}  # not common.pt's
        torch.save({"plain": tensors, "logits": logits.clone()}, Path(out).parent / f"{Path(out).name}-oracle.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    end_rank()


def write_checkpoint(out: Path, family: str = "llama", *, tied: bool = False) -> dict[str, Any]:
    """Write `out/` with megatron-core on 2 gloo ranks; return megatron's own reading of it
    (`plain`: load_plain_tensors) and its logits for `TOKENS` (`logits`, [1, len, padded vocab])."""
    import torch
    import torch.multiprocessing as mp

    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, port, str(out), family, tied), nprocs=2)
    return torch.load(out.parent / f"{out.name}-oracle.pt", weights_only=True)


_WRITTEN: dict[tuple[str, bool], tuple[Path, dict[str, Any]]] = {}


def cached_checkpoint(factory: Any, family: str = "llama", *, tied: bool = False) -> tuple[Path, dict[str, Any]]:
    """`write_checkpoint` once per test session and family (`factory`: pytest's tmp_path_factory)."""
    key = (family, tied)
    if key not in _WRITTEN:
        out = factory.mktemp(f"megatron-{family}{'-tied' if tied else ''}") / "ckpt"
        _WRITTEN[key] = (out, write_checkpoint(out, family, tied=tied))
    return _WRITTEN[key]


def megatron_files(folder: Path, args: argparse.Namespace | None) -> None:
    """megatron-core's `metadata.json` and a `common.pt` holding `args`, beside a DCP folder torch wrote."""
    import json

    import torch

    (folder / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                                                      "common_backend": "torch", "common_backend_version": 1}))
    torch.save({"args": args, "checkpoint_version": 3.0, "iteration": 1}, folder / "common.pt")


SECOND_RANK_FILE = "__1_0.distcp"


def two_rank_folder(folder: Path, sd: dict[str, Any], args: argparse.Namespace | None, moved: str) -> None:
    """`sd` laid out as megatron-core saves it, without megatron: torch's `dcp.save` in this process,
    `megatron_files` beside it, and tensor `moved`'s chunk in a second rank's file (`__1_0.distcp`),
    as two ranks write it (its bytes stay in the first file too, unreferenced)."""
    import pickle
    import warnings
    from dataclasses import replace

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(sd, checkpoint_id=str(folder))
    megatron_files(folder, args)
    with open(folder / ".metadata", "rb") as f:
        meta = pickle.load(f)  # written by torch just now: its own classes
    key, info = next((k, v) for k, v in meta.storage_data.items() if k.fqn == moved)
    with open(folder / info.relative_path, "rb") as f:
        f.seek(info.offset)
        (folder / SECOND_RANK_FILE).write_bytes(f.read(info.length))
    meta.storage_data[key] = replace(info, relative_path=SECOND_RANK_FILE, offset=0)
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(meta, f)
