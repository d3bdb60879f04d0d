"""megatron-core 0.16 reading a `torch_dist` checkpoint into its own GPTModel, on CPU, as the oracle of the
Megatron writer's tests (`tests/formats/test_torch_dist_writer.py`, the docs' test).

`load_into_megatron(CKPT, HF_CONFIG, OUT)` runs new processes (megatron's shims and its process group stay
out of pytest's): a gloo group on 127.0.0.1 (a port from the OS) of one rank, or of two splitting the
model tensor-parallel, each building the GPTModel a Hugging Face Llama config describes (megatron's local
layer spec: Transformer Engine is not installed; RMSNorm, SwiGLU, rotary, grouped-query attention,
untied output), `dist_checkpointing.load`ing the model's sharded state dict from CKPT,
`load_state_dict`ing it (strict) and running megatron's forward on `TOKENS`. It returns rank 0's state
dict after the load and the logits.

megatron-core on CPU needs: `torch.cuda.current_device` (its sharded tensors name a device), the CUDA
RNG tracker's `fork` (the attention's dropout forks it; there is no CPU state to fork), and a causal
mask given to the forward (its default is built on "cuda"), and for experts `te_general_gemm` (0.16.1's
router reads it, undefined without Transformer Engine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TOKENS = [[3, 17, 101, 5, 64, 119, 0, 42]]


LOAD = """\
from megatron.core import dist_checkpointing

state = dist_checkpointing.load({"model": model.sharded_state_dict()}, CKPT)
model.load_state_dict(state["model"])
"""
"""What the run does with `model` (megatron's GPTModel) and `CKPT` (the folder): `load_into_megatron`'s `code`.
The model's sharded state dict under `model`, as Megatron-LM's `load_checkpoint` asks: `load` returns
`common.pt`'s values (`args`, `checkpoint_version`, `iteration`) beside it."""
MODEL_FIELDS = ("vocab_size", "max_sequence_length", "share_embeddings_and_output_weights", "position_embedding_type",
                "rotary_percent", "rotary_base", "rotary_scaling")
"""The GPTModel's own settings (beside its TransformerConfig) a run returns, as megatron built them."""


def load_into_megatron(ckpt: Path, hf_config: Path, out: Path, *, ranks: int = 1, code: str = LOAD) -> dict[str, Any]:
    """megatron's reading of `ckpt` (see the module docstring) on `ranks` gloo ranks, tensor-parallel over
    them: `{"state": {name: tensor}, "logits": [1, n, vocab], "common": {...}, "config": {...}, "model": {...}}`
    (rank 0's part of each tensor, the whole logits; what `load` returned beside the model, `args` as a dict
    and a torch dtype as its name; the model's TransformerConfig and `MODEL_FIELDS`). `code` loads the
    checkpoint, run with `model` and `CKPT` in scope and the checkpoint's folder as the working directory."""
    import torch

    script = out.with_suffix(".load.py")
    script.write_text(code)
    proc = subprocess.run([sys.executable, "-m", "tests.support.megatron_load", str(ckpt), str(hf_config), str(out),
                           str(ranks), str(script)],
                          capture_output=True, text=True, cwd=REPO, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    if proc.returncode != 0:
        raise AssertionError(f"megatron could not load {ckpt}:\n{proc.stderr[-4000:]}")
    return torch.load(out, weights_only=True)


def _family(hf: dict[str, Any]) -> dict[str, Any]:
    """What a Hugging Face config's family adds to the dense Llama, as megatron's TransformerConfig
    options and the local layer spec's: Qwen2's q/k/v biases, Qwen3's q/k RMSNorm, Mixtral's and Qwen3-MoE's
    experts (a SequentialMLP; a softmax top-k router: renormalised over the chosen experts, as Mixtral and
    Qwen3-MoE with norm_topk_prob do, or not, megatron's pre-softmax, as Qwen3-MoE without it)."""
    kind = hf.get("model_type", "llama")
    out: dict[str, Any] = {"add_qkv_bias": kind == "qwen2", "qk_layernorm": kind in ("qwen3", "qwen3_moe")}
    # Mixtral's count is num_local_experts; Qwen3-MoE's num_experts (transformers 5 saves it as num_local_experts)
    experts = hf.get("num_experts") or hf.get("num_local_experts") if kind in ("mixtral", "qwen3_moe") else None
    if experts:
        out.update(num_moe_experts=experts, moe_router_topk=hf["num_experts_per_tok"],
                   moe_ffn_hidden_size=hf["moe_intermediate_size" if kind == "qwen3_moe" else "intermediate_size"],
                   moe_router_pre_softmax=kind == "qwen3_moe" and not hf.get("norm_topk_prob"),
                   moe_token_dispatcher_type="allgather", moe_aux_loss_coeff=0.0)
    return out


def _model(hf: dict[str, Any]) -> Any:
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    heads = hf["num_attention_heads"]
    rope = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 10000.0))
    family = _family(hf)
    cfg = TransformerConfig(
        num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"], num_attention_heads=heads,
        num_query_groups=hf.get("num_key_value_heads", heads), ffn_hidden_size=hf["intermediate_size"],
        kv_channels=hf.get("head_dim") or hf["hidden_size"] // heads, use_cpu_initialization=True,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, normalization="RMSNorm",
        layernorm_epsilon=hf["rms_norm_eps"], add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
        **family)
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=family["qk_layernorm"],
                                    num_experts=family.get("num_moe_experts"), moe_grouped_gemm=False)
    return GPTModel(config=cfg, transformer_layer_spec=spec,
                    vocab_size=hf["vocab_size"], max_sequence_length=hf["max_position_embeddings"],
                    position_embedding_type="rope", rotary_base=int(rope),
                    share_embeddings_and_output_weights=bool(hf.get("tie_word_embeddings")), parallel_output=False)


def _rank(rank: int, ranks: int, port: int, ckpt: str, hf_config: str, out: str, script: str) -> None:

    import torch

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=ranks)
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):  # 0.16.1's router reads it, undefined without Transformer Engine
        moe_utils.te_general_gemm = None
    torch.manual_seed(0)
    model = _model(json.loads(Path(hf_config).read_text()))
    model.eval()
    os.chdir(Path(ckpt).parent)
    scope = {"model": model, "CKPT": ckpt}
    exec(Path(script).read_text(), scope)  # the load: LOAD, or a page's block
    from tests.support.torch_dist import cpu_logits

    logits = cpu_logits(model, TOKENS)
    if rank == 0:
        tensors = {k: v.clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
        torch.save({"state": tensors, "logits": logits.clone(), "common": _common(scope.get("state")),
                    "config": _plain(vars(model.config)),
                    "model": _plain({k: getattr(model, k) for k in MODEL_FIELDS})}, out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    from tests.support.dist import end_rank

    end_rank()  # gloo's teardown can abort a rank whose work is done (see end_rank)


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """Values `torch.load(weights_only=True)` reads back: a torch dtype as its name, other objects left out."""
    import torch

    out: dict[str, Any] = {}
    for k, v in values.items():
        if isinstance(v, torch.dtype):
            out[k] = str(v).removeprefix("torch.")
        elif v is None or isinstance(v, (bool, int, float, str)):
            out[k] = v
    return out


def _common(state: Any) -> dict[str, Any]:
    """What megatron's `load` returned beside the model (`args` a dict of its fields)."""
    import argparse

    if not isinstance(state, dict):
        return {}
    return {k: _plain(vars(v)) if isinstance(v, argparse.Namespace) else v for k, v in state.items() if k != "model"}


def _main(ckpt: str, hf_config: str, out: str, ranks: str, script: str) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(int(ranks), port, ckpt, hf_config, out, script), nprocs=int(ranks))


if __name__ == "__main__":
    _main(*sys.argv[1:6])
