"""Hugging Face decoder checkpoints as GGUF (Llama, Mistral, Qwen2, Phi-3, Gemma 1-3): the recipe pieces
llama.cpp's converter applies (Gemma's norms as weight + 1: the `offset` op).

`hf_to_gguf(config)` gives, for a `config.json` naming one of `ARCHITECTURES`, the remaps (HF names ->
llama.cpp's `blk.N.attn_q.weight` ...; biases follow their weights), for llama only the q/k rotary
permute (GGUF keeps Meta's interleaved layout: `rope_permute` with `inverse: true`, k with the KV
head count; llama.cpp rotates qwen2 and phi3 as GPT-NeoX does, the layout Hugging Face stores), and
the architecture key/values (context and embedding length, block count, heads, KV heads, RoPE base
and dimension, norm epsilon, vocab size; Phi-3's sliding window and original context) as recipe
data. `migrate convert hf-folder/ out.gguf` merges them into its recipe; the tokenizer is
`tokenizer.py`'s or `bpe.py`'s. Llama 3.1's RoPE scaling becomes a `rope_freqs.weight` tensor
(`llama3_rope_factors`), as llama.cpp's converter writes it.

The way back: `gguf_to_hf(metadata)` gives the inverse recipe data (HF names, the forward permute,
`target.hf_config`), and `hf_config(metadata, names)` the config.json a sharded target is given, so
`migrate convert model.gguf out/` writes a folder `from_pretrained` loads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                 "Phi3ForCausalLM": "phi3", "GemmaForCausalLM": "gemma", "Gemma2ForCausalLM": "gemma2",
                 "Gemma3ForCausalLM": "gemma3"}
# a config.json with no `architectures` (what `LlamaConfig().save_pretrained()` writes) by its model_type
MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "phi3": "phi3", "gemma": "gemma",
               "gemma2": "gemma2", "gemma3_text": "gemma3"}
# the class and model_type a config.json made from a GGUF of each llama.cpp architecture names
HF_CLASSES = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2"),
              "phi3": ("Phi3ForCausalLM", "phi3"), "gemma": ("GemmaForCausalLM", "gemma"),
              "gemma2": ("Gemma2ForCausalLM", "gemma2"), "gemma3": ("Gemma3ForCausalLM", "gemma3_text")}
# llama.cpp rotates q/k of these as GPT-NeoX does (halves), as Hugging Face stores them: no permute.
# Its llama rotation is Meta's interleaved pairs, which the converter permutes q and k into.
PERMUTED = frozenset({"llama"})

# HF name -> llama.cpp's (gguf-py's tensor_mapping), in remap syntax. A prefix maps a layer's weight
# and its bias alike (Qwen2's q/k/v biases).
_COMMON = (
    (r"^model\.embed_tokens\.", "token_embd."),
    (r"^model\.norm\.", "output_norm."),
    (r"^lm_head\.", "output."),
    (r"^model\.layers\.(\d+)\.self_attn\.o_proj\.", "blk.$1.attn_output."),
    (r"^model\.layers\.(\d+)\.mlp\.down_proj\.", "blk.$1.ffn_down."),
    (r"^model\.layers\.(\d+)\.input_layernorm\.", "blk.$1.attn_norm."),
    (r"^model\.layers\.(\d+)\.post_attention_layernorm\.", "blk.$1.ffn_norm."),
)
_SEPARATE = (
    (r"^model\.layers\.(\d+)\.self_attn\.q_proj\.", "blk.$1.attn_q."),
    (r"^model\.layers\.(\d+)\.self_attn\.k_proj\.", "blk.$1.attn_k."),
    (r"^model\.layers\.(\d+)\.self_attn\.v_proj\.", "blk.$1.attn_v."),
    (r"^model\.layers\.(\d+)\.mlp\.gate_proj\.", "blk.$1.ffn_gate."),
    (r"^model\.layers\.(\d+)\.mlp\.up_proj\.", "blk.$1.ffn_up."),
)
_FUSED = (  # Phi-3: q, k, v in one projection, gate and up in another, kept fused by llama.cpp
    (r"^model\.layers\.(\d+)\.self_attn\.qkv_proj\.", "blk.$1.attn_qkv."),
    (r"^model\.layers\.(\d+)\.mlp\.gate_up_proj\.", "blk.$1.ffn_up."),
)
_GEMMA2 = (  # four norms a layer: around attention and around the MLP
    (r"^model\.embed_tokens\.", "token_embd."),
    (r"^model\.norm\.", "output_norm."),
    (r"^model\.layers\.(\d+)\.self_attn\.o_proj\.", "blk.$1.attn_output."),
    (r"^model\.layers\.(\d+)\.mlp\.down_proj\.", "blk.$1.ffn_down."),
    (r"^model\.layers\.(\d+)\.input_layernorm\.", "blk.$1.attn_norm."),
    (r"^model\.layers\.(\d+)\.post_attention_layernorm\.", "blk.$1.post_attention_norm."),
    (r"^model\.layers\.(\d+)\.pre_feedforward_layernorm\.", "blk.$1.ffn_norm."),
    (r"^model\.layers\.(\d+)\.post_feedforward_layernorm\.", "blk.$1.post_ffw_norm."),
)
_QK_NORMS = (  # Gemma 3's RMSNorm of each head's queries and keys
    (r"^model\.layers\.(\d+)\.self_attn\.q_norm\.", "blk.$1.attn_q_norm."),
    (r"^model\.layers\.(\d+)\.self_attn\.k_norm\.", "blk.$1.attn_k_norm."),
)
REMAPS = {"llama": _COMMON + _SEPARATE, "qwen2": _COMMON + _SEPARATE, "phi3": _COMMON + _FUSED,
          "gemma": _COMMON + _SEPARATE, "gemma2": _GEMMA2 + _SEPARATE, "gemma3": _GEMMA2 + _SEPARATE + _QK_NORMS}
# Gemma's RMSNorm multiplies by (1 + weight); llama.cpp's by its weight, so its converter stores weight + 1,
# computed in F32 (BF16 checkpoints are widened first), and transformers' GGUF loader takes 1 off again
NORM_OFFSET = frozenset({"gemma", "gemma2", "gemma3"})
GEMMA3_LOCAL_BASE = 10000.0  # llama.cpp's gemma3 sliding layers' RoPE base, fixed (not read from the file)
GELU_TANH = "gelu_pytorch_tanh"


def architecture(config: dict[str, Any]) -> str | None:
    """The llama.cpp architecture of a Hugging Face config, when this module can convert it: by the
    classes `architectures` names, else (none named) by `model_type`."""
    archs = config.get("architectures") or []
    if not isinstance(archs, list):
        return None
    if archs:
        return next((ARCHITECTURES[a] for a in archs if isinstance(a, str) and a in ARCHITECTURES), None)
    kind = config.get("model_type")
    return MODEL_TYPES.get(kind) if isinstance(kind, str) else None


_POSITIVE = ("num_attention_heads", "hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")
_OPTIONAL_POSITIVE = ("num_key_value_heads", "head_dim", "max_position_embeddings")
_NUMBERS = ("rms_norm_eps", "rope_theta", "partial_rotary_factor")
_ROPE_NUMBERS = ("rope_theta", "partial_rotary_factor", *("factor", "low_freq_factor", "high_freq_factor",
                                                         "original_max_position_embeddings"))


def config_problem(config: Mapping[str, Any]) -> str | None:
    """What in a config.json `hf_to_gguf` cannot use, in one line naming the key, else None: checked
    once, before any value is read, so no key is missing, zero or of another type on the way."""
    def shown(v: object) -> str:
        text = json.dumps(v) if isinstance(v, (str, int, float, bool)) or v is None else type(v).__name__
        return text if len(text) <= 40 else text[:37] + "..."

    def is_int(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    def is_number(v: object) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    for key in _POSITIVE:
        if key not in config:
            return f"{key} is missing (a positive integer)"
        if not is_int(config[key]) or config[key] <= 0:
            return f"{key} must be a positive integer, not {shown(config[key])}"
    for key in _OPTIONAL_POSITIVE:
        v = config.get(key)
        if v is not None and (not is_int(v) or v <= 0):
            return f"{key} must be a positive integer, not {shown(v)}"
    for key in _NUMBERS:
        v = config.get(key)
        if v is not None and (not is_number(v) or v <= 0):
            return f"{key} must be a positive number, not {shown(v)}"
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    if heads % kv_heads:
        return f"num_key_value_heads ({kv_heads}) does not divide num_attention_heads ({heads})"
    if config.get("head_dim") is None and config["hidden_size"] % heads:
        return f"hidden_size ({config['hidden_size']}) is not a multiple of num_attention_heads ({heads})"
    ropes = [(key, config.get(key)) for key in ("rope_parameters", "rope_scaling")]
    if isinstance(config.get("rope_parameters"), dict):  # Gemma 3's, by layer type (transformers 5)
        ropes += [(f"rope_parameters.{k}", config["rope_parameters"].get(k))
                  for k in ("full_attention", "sliding_attention")]
    for key, rope in ropes:
        if rope is None:
            continue
        if not isinstance(rope, dict):
            return f"{key} must be an object, not {shown(rope)}"
        for field in _ROPE_NUMBERS:
            if rope.get(field) is not None and not is_number(rope[field]):
                return f"{key}.{field} must be a number, not {shown(rope[field])}"
        kind = rope.get("rope_type", rope.get("type"))
        if kind is not None and not isinstance(kind, str):
            return f"{key}.rope_type must be a string, not {shown(kind)}"
    return None


def hf_to_gguf(config: dict[str, Any]) -> dict[str, Any]:
    """Recipe data (remap, filter, ops, target.metadata, target.rope_scaling) for a config.json of `ARCHITECTURES`
    (or of `MODEL_TYPES`) that `config_problem` finds nothing wrong with."""
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    arch = architecture(config) or "llama"
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if arch == "gemma3":
        rope = _gemma3_global_rope(config)
    theta = config.get("rope_theta") or rope.get("rope_theta") or 10000.0
    scaling = _rope_scaling(rope)
    if scaling is not None and arch != "llama" and not (arch == "gemma3" and scaling["rope_type"] == "linear"):
        from ...core.errors import PlanError

        raise PlanError(f"RoPE scaling '{scaling['rope_type']}' is converted for Llama models, not {arch}")
    if config.get("use_sliding_window"):  # Qwen2's; llama.cpp's qwen2 attends to the whole context
        from ...core.errors import PlanError

        raise PlanError("use_sliding_window: llama.cpp's qwen2 has no sliding-window attention")
    rotary = config.get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 1.0
    meta = {
        "general.architecture": arch,
        f"{arch}.context_length": config.get("max_position_embeddings", 2048),
        f"{arch}.embedding_length": hidden,
        f"{arch}.block_count": config["num_hidden_layers"],
        f"{arch}.feed_forward_length": config["intermediate_size"],
        f"{arch}.attention.head_count": heads,
        f"{arch}.attention.head_count_kv": kv_heads,
        f"{arch}.rope.freq_base": float(theta),
        f"{arch}.rope.dimension_count": int(head_dim * rotary),
        f"{arch}.attention.layer_norm_rms_epsilon": config.get("rms_norm_eps", 1e-6),
        f"{arch}.vocab_size": config["vocab_size"],
    }
    if head_dim != hidden // heads:  # llama.cpp then reads the head size from these, not hidden / heads
        meta[f"{arch}.attention.key_length"] = meta[f"{arch}.attention.value_length"] = head_dim
    if arch == "phi3":
        if isinstance(config.get("sliding_window"), int):
            meta[f"{arch}.attention.sliding_window"] = config["sliding_window"]
        if isinstance(config.get("original_max_position_embeddings"), int):
            meta[f"{arch}.rope.scaling.original_context_length"] = config["original_max_position_embeddings"]
    if scaling is not None and scaling["rope_type"] == "linear":  # llama.cpp's own keys
        meta[f"{arch}.rope.scaling.type"] = "linear"
        meta[f"{arch}.rope.scaling.factor"] = float(scaling["factor"])
    if arch in NORM_OFFSET:
        meta.update(_gemma_metadata(arch, config, head_dim))
    if config.get("_name_or_path"):
        meta["general.name"] = str(config["_name_or_path"]).rstrip("/").rsplit("/", 1)[-1]
    ops: list[dict[str, Any]] = [
        {"rope_permute": {"from": r"blk\.\d+\.attn_q\.weight", "heads": heads, "inverse": True}},
        {"rope_permute": {"from": r"blk\.\d+\.attn_k\.weight", "heads": kv_heads, "inverse": True}}
    ] if arch in PERMUTED else []
    excluded = [{"regex": r"\.rotary_emb\.inv_freq$"}]
    if arch in NORM_OFFSET:
        ops.append({"offset": {"from": r"(blk\.\d+\.\w+|output)_norm\.weight", "value": 1.0, "dtype": "F32"}})
        excluded.append({"regex": r"^lm_head\.weight$"})  # tied: llama.cpp's output is token_embd
    out = {
        "remap": [{"from": a, "to": b} for a, b in REMAPS[arch]],
        "filter": {"exclude": excluded},
        "ops": ops,
        "metadata": {k: _text(v) for k, v in meta.items()},
    }
    if scaling is not None and scaling["rope_type"] == "llama3":
        out["rope_scaling"] = scaling
    return out


def _gemma_metadata(arch: str, config: Mapping[str, Any], head_dim: int) -> dict[str, Any]:
    """Gemma's and Gemma 2's own key/values (what llama.cpp's converter writes), PlanError for what llama.cpp
    cannot run."""
    from ...core.errors import PlanError

    if config.get("tie_word_embeddings") is False:
        raise PlanError(f"{arch} with tie_word_embeddings false: llama.cpp's {arch} always uses the token "
                        "embedding as the output layer")
    act = config.get("hidden_activation") or config.get("hidden_act") or GELU_TANH
    if act != GELU_TANH:
        raise PlanError(f"{arch} with hidden_activation '{act}': llama.cpp's {arch} uses {GELU_TANH}")
    meta: dict[str, Any] = {f"{arch}.attention.key_length": head_dim, f"{arch}.attention.value_length": head_dim,
                            "tokenizer.ggml.add_space_prefix": "false"}
    if arch == "gemma":
        return meta
    if arch == "gemma3":
        capped = [k for k in ("attn_logit_softcapping", "final_logit_softcapping") if config.get(k) is not None]
        if capped:
            raise PlanError(f"gemma3 with {' and '.join(capped)}: llama.cpp's gemma3 soft-caps nothing")
        if isinstance(config.get("sliding_window"), int):
            meta["gemma3.attention.sliding_window"] = config["sliding_window"]
        return meta
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if config.get(key) is not None:
            meta[f"gemma2.{key}"] = float(config[key])
    if isinstance(config.get("sliding_window"), int):
        meta["gemma2.attention.sliding_window"] = config["sliding_window"]
    return meta


LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
ROPE_SCALING_KEY = "migrator.rope_scaling"
ROPE_FREQS = "rope_freqs.weight"


def _rope_scaling(rope: Mapping[str, Any]) -> dict[str, Any] | None:
    """config.json's RoPE scaling as GGUF can hold it: None (none), linear (llama.cpp's keys) or llama3
    (the rope_freqs tensor); PlanError for the other kinds."""
    from ...core.errors import PlanError

    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in ("default", None):
        return None
    if kind == "linear" and isinstance(rope.get("factor"), (int, float)):
        return {"rope_type": "linear", "factor": float(rope["factor"])}
    if kind == "llama3":
        missing = [k for k in ("factor", "original_max_position_embeddings") if rope.get(k) is None]
        if missing:
            raise PlanError(f"rope_scaling llama3 without {', '.join(missing)} in config.json")
        return {"rope_type": "llama3", **{k: rope[k] for k in LLAMA3_KEYS if rope.get(k) is not None}}
    raise PlanError(f"RoPE scaling '{kind}' is not converted to GGUF yet (linear and llama3 are)")


def llama3_rope_factors(scaling: Mapping[str, Any], theta: float, dims: int) -> Any:
    """Llama 3.1's per-dimension RoPE factors (what llama.cpp divides each rotary frequency by), F32, one
    per pair of rotated dimensions. A frequency whose wavelength is below original / high_freq_factor
    keeps its speed (1), one above original / low_freq_factor is slowed by `factor`, and between the two
    the inverse frequency is blended linearly in original / wavelength."""
    import numpy as np

    factor = float(scaling["factor"])
    low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
    original = float(scaling["original_max_position_embeddings"])
    # the base frequencies as transformers and llama.cpp compute them: in float32
    inv_freq = np.float32(1.0) / np.float32(theta) ** (np.arange(0, dims, 2, dtype=np.float32) / np.float32(dims))
    wavelength = 2 * np.pi / inv_freq.astype(np.float64)
    blend = (original / wavelength - low) / (high - low)
    factors = np.where(wavelength < original / high, 1.0,
                       np.where(wavelength > original / low, factor, 1.0 / ((1.0 - blend) / factor + blend)))
    return factors.astype(np.float32)


def rope_freqs_tensor(scaling: Mapping[str, Any], meta: Mapping[str, str]) -> Any:
    """The rope_freqs.weight tensor of a GGUF target, from its rope.freq_base and rope.dimension_count
    key/values (PlanError naming a missing one)."""
    from ...core.errors import PlanError
    from ...core.tensor import from_numpy

    arch = _value(meta, "general.architecture")
    theta, dims = _value(meta, f"{arch}.rope.freq_base"), _value(meta, f"{arch}.rope.dimension_count")
    if arch is None or theta is None or dims is None:
        raise PlanError("target.rope_scaling needs general.architecture and its rope.freq_base and "
                        "rope.dimension_count key/values (target.metadata)")
    return from_numpy(ROPE_FREQS, llama3_rope_factors(scaling, float(theta), int(dims)))


def _text(v: object) -> str:
    """A config value as the text the GGUF writer types by key (floats with their full precision)."""
    return repr(float(v)) if isinstance(v, float) else str(v)


def _back(pattern: str, repl: str) -> tuple[str, str]:
    """A forward remap (HF -> GGUF) turned around (GGUF -> HF)."""
    source = re.escape(repl).replace(r"\$1", r"(\d+)")
    target = pattern.lstrip("^").replace(r"(\d+)", "$1").replace("\\", "")
    return "^" + source, target


def _value(meta: Mapping[str, str], key: str, default: Any = None) -> Any:
    v = meta.get(key)
    if v is None:
        return default
    return getattr(v, "data", v)


def gguf_to_hf(metadata: Mapping[str, str]) -> dict[str, Any]:
    """Recipe data (remap, filter, ops, target.hf_config) turning a GGUF of `HF_CLASSES` back into Hugging Face
    names and layout."""
    arch = _value(metadata, "general.architecture")
    heads = int(_value(metadata, f"{arch}.attention.head_count"))
    kv_heads = int(_value(metadata, f"{arch}.attention.head_count_kv", heads))
    ops: list[dict[str, Any]] = [
        {"rope_permute": {"from": r"model\.layers\.\d+\.self_attn\.q_proj\.weight", "heads": heads}},
        {"rope_permute": {"from": r"model\.layers\.\d+\.self_attn\.k_proj\.weight", "heads": kv_heads}}
    ] if arch in PERMUTED else []
    if arch in NORM_OFFSET:  # llama.cpp's weight + 1 back to Gemma's weight, in F32 as transformers' loader does
        norms = r"model\.(layers\.\d+\.(\w+_layer|self_attn\.[qk]_)|)norm\.weight"  # Gemma 3's q/k norms too
        ops.append({"offset": {"from": norms, "value": -1.0}})
    return {
        "remap": [{"from": a, "to": b} for a, b in map(lambda r: _back(*r), REMAPS[arch])],
        "filter": {"exclude": [{"regex": "^" + re.escape(ROPE_FREQS) + "$"}]},  # config.json's rope_scaling
        "ops": ops,
        "hf_config": True,
    }


def hf_config(metadata: Mapping[str, str], names: Sequence[str], *, rope_freqs: Any = None,
              given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The config.json (LlamaForCausalLM, Qwen2ForCausalLM, Phi3ForCausalLM) from a GGUF's key/values and the
    tensor names written, with
    `given` entries over it. `rope_freqs`: the GGUF's per-dimension RoPE factors, when it has them: the
    rope_scaling they were computed from is needed (`migrator.rope_scaling`, which migrator writes, or
    `given`) and must reproduce them exactly; the factors alone do not determine it."""
    from ...core.errors import PlanError

    arch = _value(metadata, "general.architecture")
    if arch not in HF_CLASSES:
        raise PlanError(f"target.hf_config: a config.json is made for {', '.join(HF_CLASSES)} GGUF sources, not "
                        f"'{arch}'")

    def need(key: str) -> Any:
        v = _value(metadata, f"{arch}.{key}")
        if v is None:
            raise PlanError(f"target.hf_config: the GGUF has no {arch}.{key}")
        return v

    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    tokens = _value(metadata, "tokenizer.ggml.tokens")
    vocab = _value(metadata, f"{arch}.vocab_size", len(tokens) if tokens is not None else None)
    head_dim = int(_value(metadata, f"{arch}.attention.key_length", hidden // heads))
    rotated = int(_value(metadata, f"{arch}.rope.dimension_count", head_dim))
    hf_class, model_type = HF_CLASSES[arch]
    config: dict[str, Any] = {
        "architectures": [hf_class], "model_type": model_type,
        "hidden_size": hidden, "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(_value(metadata, f"{arch}.attention.head_count_kv", heads)),
        "max_position_embeddings": int(_value(metadata, f"{arch}.context_length", 2048)),
        "rms_norm_eps": _decimal(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": _decimal(_value(metadata, f"{arch}.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "lm_head.weight" not in names,
        "hidden_act": "silu",
    }
    if arch == "llama":
        config.update({"head_dim": rotated, "attention_bias": False, "mlp_bias": False})
    elif head_dim != hidden // heads:
        config["head_dim"] = head_dim
    if arch == "qwen2":
        config["use_sliding_window"] = False
    if arch == "gemma":
        config.update({"head_dim": head_dim, "hidden_act": GELU_TANH, "attention_bias": False})
    if arch in ("gemma2", "gemma3"):
        del config["hidden_act"]  # Gemma2Config's is hidden_activation
        config.update(_gemma2_config(metadata, config, head_dim))
    if arch == "phi3":
        window = _value(metadata, f"{arch}.attention.sliding_window")
        config["sliding_window"] = int(window) if window else None
        original = _value(metadata, f"{arch}.rope.scaling.original_context_length")
        config["original_max_position_embeddings"] = int(original or config["max_position_embeddings"])
        if rotated != head_dim:
            config["partial_rotary_factor"] = rotated / head_dim
    if vocab is not None:
        config["vocab_size"] = int(vocab)
    for key, hf in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                    ("padding_token_id", "pad_token_id")):
        v = _value(metadata, f"tokenizer.ggml.{key}")
        if v is not None:
            config[hf] = int(v)
    if _value(metadata, f"{arch}.rope.scaling.type") == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": _decimal(need("rope.scaling.factor"))}
    elif _value(metadata, f"{arch}.rope.scaling.type") not in (None, "none"):
        raise PlanError(f"target.hf_config: RoPE scaling '{_value(metadata, f'{arch}.rope.scaling.type')}' is not "
                        "made into a config.json (linear is)")
    if arch == "gemma3":  # in rope_parameters, by layer type
        config.pop("rope_scaling", None)
        config.pop("rope_theta", None)
    recorded = _value(metadata, ROPE_SCALING_KEY)
    if rope_freqs is not None and recorded is not None:
        try:
            config["rope_scaling"] = json.loads(recorded)
        except ValueError:
            raise PlanError(f"target.hf_config: {ROPE_SCALING_KEY} is not JSON: {str(recorded)[:80]!a}") from None
    config.update(given or {})
    if rope_freqs is not None:
        _check_rope_freqs(config, rope_freqs)
    return config


def _gemma3_global_rope(config: Mapping[str, Any]) -> dict[str, Any]:
    """Gemma 3's RoPE settings of its global layers (llama.cpp's rope.freq_base and linear scaling); its
    sliding layers must use llama.cpp's fixed base (PlanError otherwise). transformers 5 nests them by
    layer type in rope_parameters; older config.json files have rope_theta, rope_local_base_freq and
    rope_scaling."""
    from ...core.errors import PlanError

    params = config.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        full, local = dict(params["full_attention"]), dict(params.get("sliding_attention") or {})
    else:
        full = {**(config.get("rope_scaling") or {}), "rope_theta": config.get("rope_theta", 1_000_000.0)}
        local = {"rope_theta": config.get("rope_local_base_freq", GEMMA3_LOCAL_BASE)}
    base = float(local.get("rope_theta", GEMMA3_LOCAL_BASE))
    if base != GEMMA3_LOCAL_BASE or local.get("rope_type", "default") not in ("default", None):
        raise PlanError(f"gemma3 sliding layers with RoPE {local}: llama.cpp's rotate with base "
                        f"{GEMMA3_LOCAL_BASE:g}, unscaled")
    return full


def _gemma2_config(metadata: Mapping[str, str], config: Mapping[str, Any], head_dim: int) -> dict[str, Any]:
    """Gemma2ForCausalLM's and Gemma3ForCausalLM's own config.json entries, as llama.cpp runs the GGUF: it
    scales queries by 1/sqrt(head_dim), by 1/sqrt(hidden / heads) for its 27B (46 blocks for Gemma 2, 62 for
    Gemma 3), whatever query_pre_attn_scalar was; Gemma 2's every other layer (from the first) attends to
    a sliding window, Gemma 3's five of every six; Gemma 3's sliding layers rotate with base 10000."""
    arch = config["model_type"].split("_")[0]
    layers = int(config["num_hidden_layers"])
    big = {"gemma2": 46, "gemma3": 62}[arch]
    every = {"gemma2": 2, "gemma3": 6}[arch]
    out: dict[str, Any] = {"head_dim": head_dim, "hidden_activation": GELU_TANH, "attention_bias": False,
                           "tie_word_embeddings": True,
                           "query_pre_attn_scalar": config["hidden_size"] // config["num_attention_heads"]
                           if layers == big else head_dim,
                           "layer_types": ["sliding_attention" if i % every < every - 1 else "full_attention"
                                           for i in range(layers)]}
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        v = _value(metadata, f"{arch}.{key}")
        out[key] = _decimal(v) if v is not None else None
    window = _value(metadata, f"{arch}.attention.sliding_window")
    out["sliding_window"] = int(window) if window else None
    if arch == "gemma3":
        full: dict[str, Any] = {"rope_type": "default", "rope_theta": config["rope_theta"]}
        if _value(metadata, "gemma3.rope.scaling.type") == "linear":
            full = {**full, "rope_type": "linear", "factor": _decimal(_value(metadata, "gemma3.rope.scaling.factor"))}
        out["rope_parameters"] = {"full_attention": full,
                                  "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA3_LOCAL_BASE}}
    return out


def _check_rope_freqs(config: Mapping[str, Any], rope_freqs: Any) -> None:
    """The config's llama3 rope_scaling reproduces the GGUF's rope_freqs.weight bit for bit (PlanError if not)."""
    import numpy as np

    from ...core.errors import PlanError

    scaling = config.get("rope_scaling")
    if not isinstance(scaling, dict) or scaling.get("rope_type") != "llama3":
        raise PlanError(
            "target.hf_config: the GGUF has rope_freqs.weight (per-dimension RoPE factors: Llama 3.1's llama3 "
            "scaling) but not the settings they were computed from; the factors alone do not determine factor, "
            "low_freq_factor, high_freq_factor and original_max_position_embeddings. Give them in a recipe: "
            "target.rope_scaling: {rope_type: llama3, factor: 8.0, low_freq_factor: 1.0, "
            "high_freq_factor: 4.0, original_max_position_embeddings: 8192} (Llama 3.1's)")
    missing = [k for k in ("factor", "original_max_position_embeddings") if k not in scaling]
    if missing:
        raise PlanError(f"target.hf_config: rope_scaling llama3 needs {', '.join(missing)}")
    made = llama3_rope_factors(scaling, float(config["rope_theta"]), int(config["head_dim"]))
    found = np.asarray(rope_freqs, dtype=np.float32).reshape(-1)
    if made.shape != found.shape or not np.array_equal(made, found):
        raise PlanError(f"target.hf_config: rope_scaling {json.dumps(scaling)} does not give the GGUF's "
                        f"rope_freqs.weight (computed {made[:4].tolist()}..., stored {found[:4].tolist()}...)")


def _decimal(v: Any) -> float:
    """A FLOAT32 key/value as the shortest decimal that is that float32 (1e-05, not 9.999999747378752e-06):
    the value the config.json it came from most likely held."""
    import numpy as np

    return float(str(np.float32(v)))
