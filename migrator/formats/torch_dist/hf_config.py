"""A Hugging Face config.json made from Megatron's training arguments (`target.hf_config` with a
`torch_dist` source), for the families the shipped recipes convert: Llama (no biases, no q/k norms),
Qwen2 (biases on q, k and v only), Qwen3 (q/k RMSNorm), Mixtral (experts, a softmax top-k
router) and Qwen3-MoE (both). Each field is read from the arguments; a setting the family cannot
express (LayerNorm, GELU, learned positions, partial or interleaved RoPE, RoPE scaling, a pre-softmax
router) is refused naming it, never dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...core.errors import PlanError
from ..megatron.args import megatron_config

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def _need(args: Mapping[str, Any], key: str, label: str) -> Any:
    v = args.get(key)
    if v is None:
        raise PlanError(f"target.hf_config: the checkpoint's arguments (common.pt args) have no {key} ({label})")
    return v


def hf_config(args: Mapping[str, Any], shapes: Mapping[str, Sequence[int]], label: str) -> dict[str, Any]:
    """The config.json of the family the arguments describe; `shapes` are the source's tensors (the
    vocabulary's rows after its padding is cut, whether an output layer is saved)."""
    if not args:
        raise PlanError(f"target.hf_config: {label} has no training arguments in common.pt to make a config.json from")
    a = megatron_config(dict(args))
    refused = []
    if a.get("normalization", "LayerNorm") != "RMSNorm":
        refused.append(f"normalization {a.get('normalization', 'LayerNorm')} (these families use RMSNorm)")
    if not a.get("swiglu"):
        refused.append("an MLP without swiglu (these families use SiLU-gated MLPs)")
    if a.get("position_embedding_type", "learned_absolute") != "rope":
        refused.append(f"position_embedding_type {a.get('position_embedding_type', 'learned_absolute')}")
    if a.get("rotary_percent", 1.0) != 1.0:
        refused.append(f"rotary_percent {a['rotary_percent']} (partial RoPE)")
    if a.get("rotary_interleaved"):
        refused.append("rotary_interleaved (Hugging Face's rotary embedding splits halves)")
    if a.get("use_rope_scaling"):
        refused.append("use_rope_scaling (Llama 3.1's rope_scaling is not written: give your own config.json)")
    if a.get("add_bias_linear"):
        refused.append("add_bias_linear (biases on every linear layer)")
    experts = a.get("num_experts")  # Megatron-LM's --num-experts
    if experts:
        refused += _moe_refusals(a)
    if refused:
        raise PlanError("target.hf_config: the arguments describe a model these Hugging Face families cannot "
                        f"express: {'; '.join(refused)}")
    qk_norm, qkv_bias = bool(a.get("qk_layernorm")), bool(a.get("add_qkv_bias"))
    if qkv_bias and (qk_norm or experts):
        raise PlanError("target.hf_config: the arguments combine q/k/v biases with q/k norms or experts, which no "
                        "family made here has")
    arch, model_type = (("Qwen3MoeForCausalLM", "qwen3_moe") if experts and qk_norm
                        else ("MixtralForCausalLM", "mixtral") if experts
                        else ("Qwen3ForCausalLM", "qwen3") if qk_norm
                        else ("Qwen2ForCausalLM", "qwen2") if qkv_bias else ("LlamaForCausalLM", "llama"))
    embed = shapes.get("embedding.word_embeddings.weight")
    if embed is None:
        raise PlanError("target.hf_config: the checkpoint has no embedding.word_embeddings.weight")
    untied = bool(a.get("untie_embeddings_and_output_weights"))
    if untied != ("output_layer.weight" in shapes):
        raise PlanError(f"target.hf_config: untie_embeddings_and_output_weights is {untied}, but the checkpoint "
                        f"{'has no' if untied else 'has an'} output_layer.weight")
    dtype = a.get("params_dtype")
    if dtype is None:
        dtype = "bfloat16" if a.get("bf16") else "float16" if a.get("fp16") else "float32"
    config: dict[str, Any] = {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": _need(a, "hidden_size", "hidden_size"),
        "intermediate_size": _need(a, "ffn_hidden_size", "the MLP's width"),
        "num_hidden_layers": _need(a, "num_layers", "the layer count"),
        "num_attention_heads": _need(a, "num_attention_heads", "the attention heads"),
        "num_key_value_heads": _need(a, "num_query_groups", "the key/value heads"),
        "head_dim": _need(a, "kv_channels", "the head size"),
        "vocab_size": int(embed[0]),
        "max_position_embeddings": _need(a, "max_position_embeddings", "the context length"),
        "rms_norm_eps": _need(a, "norm_epsilon", "the RMSNorm epsilon"),
        "rope_theta": float(_need(a, "rotary_base", "the RoPE base")),
        "hidden_act": "silu",
        "tie_word_embeddings": not untied,
        "torch_dtype": _DTYPES.get(str(dtype), "float32"),
    }
    if model_type == "mixtral":
        config.update(intermediate_size=a.get("moe_ffn_hidden_size") or config["intermediate_size"],
                      num_local_experts=experts, num_experts_per_tok=_need(a, "moe_router_topk", "experts per token"),
                      router_aux_loss_coef=float(a.get("moe_aux_loss_coeff") or 0.0))
    if model_type == "qwen3_moe":  # Megatron's router renormalizes its top-k (a softmax over them): norm_topk_prob
        config.update(moe_intermediate_size=a.get("moe_ffn_hidden_size") or config["intermediate_size"],
                      num_experts=experts, num_experts_per_tok=_need(a, "moe_router_topk", "experts per token"),
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False,
                      use_sliding_window=False, router_aux_loss_coef=float(a.get("moe_aux_loss_coeff") or 0.0))
    if model_type == "llama":
        config.update(attention_bias=False, mlp_bias=False)
    if model_type in ("qwen2", "qwen3"):
        config.update(use_sliding_window=False)
    if model_type == "qwen3":
        config.update(attention_bias=False)
    return config


def _moe_refusals(a: Mapping[str, Any]) -> list[str]:
    """What Mixtral's block (every layer's experts, a softmax over the top-k logits, no shared expert)
    cannot express."""
    out = []
    if a.get("moe_router_score_function", "softmax") != "softmax":
        out.append(f"moe_router_score_function {a['moe_router_score_function']}")
    if a.get("moe_router_pre_softmax"):
        out.append("moe_router_pre_softmax (Mixtral renormalizes the top-k weights)")
    if a.get("moe_shared_expert_intermediate_size"):
        out.append("shared experts")
    if a.get("moe_router_topk_scaling_factor") not in (None, 1, 1.0):
        out.append(f"moe_router_topk_scaling_factor {a['moe_router_topk_scaling_factor']}")
    if a.get("moe_layer_freq", 1) != 1:
        out.append(f"moe_layer_freq {a['moe_layer_freq']} (Mixtral has experts in every layer)")
    if a.get("moe_router_enable_expert_bias"):
        out.append("moe_router_enable_expert_bias")
    return out
