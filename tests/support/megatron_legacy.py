"""Legacy Megatron-LM checkpoints written in tests, as Megatron-LM's `torch` checkpointer lays them out.

`iter_{N:07d}/mp_rank_TT[_PPP]/model_optim_rng.pt` per (tensor-parallel rank, pipeline stage), each
`torch.save({'args': Namespace, 'checkpoint_version': 3.0, 'iteration': N, 'model': ..., 'optimizer':
..., 'opt_param_scheduler': ..., 'rng_state': [...]})` (megatron/training/checkpointing.py,
`generate_state_dict`), and `latest_checkpointed_iteration.txt` at the root. The split of each tensor
is written out here by hand, per Megatron's layer classes (ColumnParallelLinear rows, RowParallelLinear
columns, VocabParallelEmbedding rows, SwiGLU's per-rank [gate_r; up_r]), independently of migrator's
table; layers are numbered from 0 in each stage's file.

The weights come from a tiny Hugging Face Llama (`tiny_llama`), converted to megatron-core's global
names and layout (`llama_to_mcore`: QKV grouped per KV group, fc1 = [gate; up], vocab padded).
"""

from __future__ import annotations

import argparse
import enum
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

HIDDEN, HEADS, GROUPS, FFN, VOCAB, PADDED, LAYERS = 64, 4, 2, 96, 128, 256, 4
HEAD_DIM = HIDDEN // HEADS


class AttnBackend(enum.Enum):
    """Stands for an enum in Megatron's args (`--attention-backend`): a class migrator does not build."""

    auto = 5


def tiny_llama(seed: int = 0) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=GROUPS, max_position_embeddings=64,
                         rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1, so a misplaced norm shows in the logits
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return model


def llama_to_mcore(model: Any, *, te: bool = True) -> dict[str, torch.Tensor]:
    """The global megatron-core state dict of a HF Llama (TE names for the fused norms when `te`)."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    pad = torch.randn(PADDED - VOCAB, HIDDEN)  # Megatron's padding rows: never read by the tokenizer
    out: dict[str, torch.Tensor] = {
        "embedding.word_embeddings.weight": torch.cat([sd["model.embed_tokens.weight"], pad])}
    per_group = HEADS // GROUPS
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        q = sd[p + "self_attn.q_proj.weight"].view(GROUPS, per_group * HEAD_DIM, HIDDEN)
        k = sd[p + "self_attn.k_proj.weight"].view(GROUPS, HEAD_DIM, HIDDEN)
        v = sd[p + "self_attn.v_proj.weight"].view(GROUPS, HEAD_DIM, HIDDEN)
        m = f"decoder.layers.{i}."
        if te:
            out[m + "self_attention.linear_qkv.layer_norm_weight"] = sd[p + "input_layernorm.weight"]
        else:
            out[m + "input_layernorm.weight"] = sd[p + "input_layernorm.weight"]
        out[m + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, HIDDEN)
        out[m + "self_attention.linear_proj.weight"] = sd[p + "self_attn.o_proj.weight"]
        if te:
            out[m + "mlp.linear_fc1.layer_norm_weight"] = sd[p + "post_attention_layernorm.weight"]
        else:
            out[m + "pre_mlp_layernorm.weight"] = sd[p + "post_attention_layernorm.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
        out[m + "mlp.linear_fc2.weight"] = sd[p + "mlp.down_proj.weight"]
    out["decoder.final_layernorm.weight"] = sd["model.norm.weight"]
    out["output_layer.weight"] = torch.cat([sd["lm_head.weight"], torch.randn(PADDED - VOCAB, HIDDEN)])
    return out


def random_mcore(args: argparse.Namespace, seed: int = 0) -> dict[str, torch.Tensor]:
    """A global megatron-core state dict of random weights in the sizes `args` names (no transformers)."""
    g = torch.Generator().manual_seed(seed)
    h, heads, groups = args.hidden_size, args.num_attention_heads, args.num_query_groups
    qkv = (heads + 2 * groups) * args.kv_channels
    out = {"embedding.word_embeddings.weight": torch.randn(args.padded_vocab_size, h, generator=g)}
    for i in range(args.num_layers):
        m = f"decoder.layers.{i}."
        out[m + "self_attention.linear_qkv.layer_norm_weight"] = torch.randn(h, generator=g)
        out[m + "self_attention.linear_qkv.weight"] = torch.randn(qkv, h, generator=g)
        out[m + "self_attention.linear_proj.weight"] = torch.randn(h, heads * args.kv_channels, generator=g)
        out[m + "mlp.linear_fc1.layer_norm_weight"] = torch.randn(h, generator=g)
        out[m + "mlp.linear_fc1.weight"] = torch.randn(2 * args.ffn_hidden_size, h, generator=g)
        out[m + "mlp.linear_fc2.weight"] = torch.randn(h, args.ffn_hidden_size, generator=g)
    out["decoder.final_layernorm.weight"] = torch.randn(h, generator=g)
    out["output_layer.weight"] = torch.randn(args.padded_vocab_size, h, generator=g)
    return out


def rank_piece(name: str, t: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s piece of a global tensor, as Megatron's layers divide it."""
    if name.endswith(("word_embeddings.weight", "output_layer.weight", "linear_qkv.weight", "linear_qkv.bias")):
        return t.chunk(tp, dim=0)[rank].clone()
    if name.endswith(("linear_fc1.weight", "linear_fc1.bias")):  # SwiGLU: this rank's gate rows, then its up rows
        gate, up = t.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]]).clone()
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return t.chunk(tp, dim=1)[rank].clone()
    return t.clone()  # norms, row-parallel biases: whole on every rank


def args_for(tp: int, pp: int, **over: Any) -> argparse.Namespace:
    args = argparse.Namespace(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, num_layers=LAYERS, hidden_size=HIDDEN,
        ffn_hidden_size=FFN, num_attention_heads=HEADS, num_query_groups=GROUPS, group_query_attention=True,
        kv_channels=HEAD_DIM, padded_vocab_size=PADDED, swiglu=True, untie_embeddings_and_output_weights=True,
        normalization="RMSNorm", virtual_pipeline_model_parallel_size=None, expert_model_parallel_size=1,
        decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None, params_dtype=torch.bfloat16,
        attention_backend=AttnBackend.auto, ckpt_format="torch", seq_length=64, lr=3e-4)
    for k, v in over.items():
        setattr(args, k, v)
    return args


def _old_nested(sd: dict[str, torch.Tensor]) -> dict[str, Any]:
    """megatron-core local names as the pre-megatron-core GPT model nested them (`language_model` dicts)."""
    lm: dict[str, Any] = {}
    for name, t in sd.items():
        if name.startswith("embedding."):
            node = lm.setdefault("embedding", {})
            for part in name.split(".")[1:-1]:
                node = node.setdefault(part, {})
            node[name.split(".")[-1]] = t
        elif name.startswith("decoder."):
            old = (name[len("decoder."):].replace("self_attention.linear_qkv.", "self_attention.query_key_value.")
                   .replace("self_attention.linear_proj.", "self_attention.dense.")
                   .replace("pre_mlp_layernorm.", "post_attention_layernorm.")
                   .replace("mlp.linear_fc1.", "mlp.dense_h_to_4h.").replace("mlp.linear_fc2.", "mlp.dense_4h_to_h."))
            lm.setdefault("encoder", {})[old] = t
        elif name.startswith("output_layer."):
            lm.setdefault("output_layer", {})[name.split(".")[-1]] = t
        else:
            raise AssertionError(name)
    return {"language_model": lm}


def _chunk(sd: dict[str, torch.Tensor], tp: int, t: int, first: int, count: int, *, head: bool, tail: bool,
           extra_state: bool, old_names: bool) -> dict[str, torch.Tensor | None]:
    """Rank `t`'s state dict of the layers first..first+count-1 (numbered from 0), with the embedding
    (`head`) and the final norm and output layer (`tail`)."""
    model: dict[str, torch.Tensor | None] = {}
    for name, tensor in sd.items():
        local = name
        if name.startswith("decoder.layers."):
            index = int(name.split(".")[2])
            if not first <= index < first + count:
                continue
            local = name.replace(f"decoder.layers.{index}.", f"decoder.layers.{index - first}.", 1)
        elif ((name.startswith("embedding.") and not head)
              or (name.startswith(("decoder.final_layernorm", "output_layer.")) and not tail)):
            continue  # the embedding lives on the first stage, the head on the last
        model[local] = rank_piece(name, tensor, tp, t)
        if extra_state and not old_names and name.endswith(("linear_qkv.weight", "linear_fc2.weight")):
            model[local.rsplit(".", 1)[0] + "._extra_state"] = None
    return model


def write_legacy(root: Path, sd: dict[str, torch.Tensor], tp: int, pp: int, *, iteration: int = 10,
                 old_names: bool = False, extra_state: bool = True, args: argparse.Namespace | None = None,
                 counts: list[int] | None = None, vp: int = 1) -> Path:
    """Write `sd` (global megatron-core names) as Megatron's legacy checkpointer does; returns `root`.
    `vp` > 1: a virtual pipeline, each file holding `model0..model{vp-1}`, chunk c of stage p the
    (c * pp + p)-th of pp * vp equal runs of layers (`counts` is then unused)."""
    args = args if args is not None else args_for(tp, pp, virtual_pipeline_model_parallel_size=vp if vp > 1 else None)
    counts = counts if counts is not None else [args.num_layers // pp] * pp
    folder = root / f"iter_{iteration:07d}"
    offsets = [sum(counts[:p]) for p in range(pp)]
    per_chunk = args.num_layers // (pp * vp)
    for p in range(pp):
        for t in range(tp):
            if vp == 1:
                model = _chunk(sd, tp, t, offsets[p], counts[p], head=p == 0, tail=p == pp - 1,
                               extra_state=extra_state, old_names=old_names)
                state: Any = {"model": _old_nested(model) if old_names else model}  # type: ignore[arg-type]
            else:
                chunks = [_chunk(sd, tp, t, (c * pp + p) * per_chunk, per_chunk, head=p == 0 and c == 0,
                                 tail=p == pp - 1 and c == vp - 1, extra_state=extra_state, old_names=old_names)
                          for c in range(vp)]
                model = {f"{c}.{k}": v for c, m in enumerate(chunks) for k, v in m.items()}
                state = {f"model{c}": _old_nested(m) if old_names else m  # type: ignore[arg-type]
                         for c, m in enumerate(chunks)}
            params = [v for v in model.values() if v is not None]
            checkpoint = {
                "args": args, "checkpoint_version": 3.0, "iteration": iteration, **state,
                "optimizer": {"optimizer": {"state": {i: {"exp_avg": torch.zeros_like(v),
                                                          "exp_avg_sq": torch.zeros_like(v)}
                                                      for i, v in enumerate(params[:2])},
                                            "param_groups": [{"lr": 3e-4, "params": list(range(len(params)))}]},
                              "fp32_from_fp16_params": [[v.float() for v in params[:2]]]},
                "opt_param_scheduler": {"max_lr": 3e-4, "num_steps": iteration},
                "rng_state": [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                               "torch_rng_state": torch.get_rng_state()}],
            }
            name = f"mp_rank_{t:02d}" if pp == 1 else f"mp_rank_{t:02d}_{p:03d}"
            (folder / name).mkdir(parents=True, exist_ok=True)
            torch.save(checkpoint, folder / name / "model_optim_rng.pt")
    (root / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return root


def hf_recipe(source: Path, target: Path) -> str:
    """A recipe from the megatron-core names to Hugging Face Llama's (the tiny model's sizes written in)."""
    per_group = HEADS // GROUPS
    return f"""version: 1
source: {{path: '{source}'}}
remap:
  - {{from: '^embedding\\.word_embeddings\\.', to: 'model.embed_tokens.'}}
  - {{from: '^decoder\\.final_layernorm\\.', to: 'model.norm.'}}
  - {{from: '^output_layer\\.', to: 'lm_head.'}}
  - {{from: '^decoder\\.layers\\.(\\d+)\\.self_attention\\.linear_qkv\\.layer_norm_weight$',
     to: 'model.layers.$1.input_layernorm.weight'}}
  - {{from: '^decoder\\.layers\\.(\\d+)\\.mlp\\.linear_fc1\\.layer_norm_weight$',
     to: 'model.layers.$1.post_attention_layernorm.weight'}}
  - {{from: '^decoder\\.layers\\.(\\d+)\\.input_layernorm\\.', to: 'model.layers.$1.input_layernorm.'}}
  - {{from: '^decoder\\.layers\\.(\\d+)\\.pre_mlp_layernorm\\.', to: 'model.layers.$1.post_attention_layernorm.'}}
  - {{from: '^decoder\\.layers\\.(\\d+)\\.self_attention\\.linear_proj\\.', to: 'model.layers.$1.self_attn.o_proj.'}}
  - {{from: '^decoder\\.layers\\.(\\d+)\\.mlp\\.linear_fc2\\.', to: 'model.layers.$1.mlp.down_proj.'}}
  - {{from: '^decoder\\.layers\\.(\\d+)\\.self_attention\\.linear_qkv\\.', to: 'model.layers.$1.self_attn.qkv.'}}
  - {{from: '^decoder\\.layers\\.(\\d+)\\.mlp\\.linear_fc1\\.', to: 'model.layers.$1.mlp.fc1.'}}
ops:
  - slice: {{from: 'model\\.embed_tokens\\.weight|lm_head\\.weight', dim: 0, start: 0, stop: {VOCAB}}}
  - reshape: {{from: 'model\\.layers\\.\\d+\\.self_attn\\.qkv\\.weight',
               shape: [{GROUPS}, {per_group + 2}, {HEAD_DIM}, {HIDDEN}]}}
  - split: {{from: 'model\\.layers\\.(\\d+)\\.self_attn\\.qkv\\.weight', dim: 1, sizes: [{per_group}, 1, 1],
            to: ['model.layers.$1.self_attn.q_proj.weight', 'model.layers.$1.self_attn.k_proj.weight',
                 'model.layers.$1.self_attn.v_proj.weight']}}
  - reshape: {{from: 'model\\.layers\\.\\d+\\.self_attn\\.[qkv]_proj\\.weight', shape: [-1, {HIDDEN}]}}
  - split: {{from: 'model\\.layers\\.(\\d+)\\.mlp\\.fc1\\.weight', dim: 0, parts: 2,
            to: ['model.layers.$1.mlp.gate_proj.weight', 'model.layers.$1.mlp.up_proj.weight']}}
target: {{path: '{target}'}}
"""
