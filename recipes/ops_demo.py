"""The small checkpoints the `ops:` recipes run on (numpy + migrator only; deterministic).

- gpt2-tiny.safetensors: Hugging Face GPT2LMHeadModel names and layouts (Conv1D weights [in, out],
  the fused attn.c_attn of q, k and v), lm_head tied to wte and so not stored, as save_pretrained writes.
- mixtral-tiny-experts.safetensors: a Mixtral-shaped model with one tensor per expert
  (block_sparse_moe.experts.E.w1/w2/w3.weight), as the original Mixtral releases ship it.
- mixtral-tiny-hf/: the same Mixtral as a Hugging Face folder (model.safetensors, config.json), which
  the expert-pruning recipe keeps experts 0 and 2 of.
- llama-meta-tiny/: a Meta-style Llama release: consolidated.00.pth (names tok_embeddings,
  layers.N.attention.wq/wk/wv/wo, feed_forward.w1..w3, attention_norm, ffn_norm, norm, output; q and k
  in Meta's interleaved rotary layout, with grouped key/value heads) and its params.json.
- llama-hf-tiny/config.json: the same model's Hugging Face LlamaConfig, beside which the
  llama-meta-to-hf recipe writes model.safetensors (the recipes take their head counts from these).
- qwen2-tiny-hf/, qwen3-tiny-hf/, qwen3-moe-tiny-hf/: Hugging Face Qwen2 (q/k/v biases), Qwen3 (q/k
  norms) and Qwen3-MoE (q/k norms, 4 experts) folders, the HF -> Megatron recipes' inputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from migrator import from_numpy, save

GPT2 = {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 64, "n_positions": 32}
MIXTRAL = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 64,
           "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0}
LLAMA = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 128, "ffn_dim": 96}


def _weights(seed: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    return w


def gpt2_tiny(seed: int = 10) -> dict[str, np.ndarray]:
    w = _weights(seed)
    e, v, p = GPT2["n_embd"], GPT2["vocab_size"], GPT2["n_positions"]
    t = {"transformer.wte.weight": w(v, e), "transformer.wpe.weight": w(p, e)}
    for i in range(GPT2["n_layer"]):
        h = f"transformer.h.{i}."
        t |= {h + "ln_1.weight": 1 + w(e), h + "ln_1.bias": w(e),
              h + "attn.c_attn.weight": w(e, 3 * e), h + "attn.c_attn.bias": w(3 * e),
              h + "attn.c_proj.weight": w(e, e), h + "attn.c_proj.bias": w(e),
              h + "ln_2.weight": 1 + w(e), h + "ln_2.bias": w(e),
              h + "mlp.c_fc.weight": w(e, 4 * e), h + "mlp.c_fc.bias": w(4 * e),
              h + "mlp.c_proj.weight": w(4 * e, e), h + "mlp.c_proj.bias": w(e)}
    t |= {"transformer.ln_f.weight": 1 + w(e), "transformer.ln_f.bias": w(e)}
    return t


def mixtral_experts(seed: int = 11) -> dict[str, np.ndarray]:
    w = _weights(seed)
    c = MIXTRAL
    hid, ffn, n = c["hidden_size"], c["intermediate_size"], c["num_local_experts"]
    kv = hid // c["num_attention_heads"] * c["num_key_value_heads"]
    t = {"model.embed_tokens.weight": w(c["vocab_size"], hid)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t |= {p + "self_attn.q_proj.weight": w(hid, hid), p + "self_attn.k_proj.weight": w(kv, hid),
              p + "self_attn.v_proj.weight": w(kv, hid), p + "self_attn.o_proj.weight": w(hid, hid),
              p + "block_sparse_moe.gate.weight": w(n, hid)}
        for x in range(n):
            q = f"{p}block_sparse_moe.experts.{x}."
            t |= {q + "w1.weight": w(ffn, hid), q + "w2.weight": w(hid, ffn), q + "w3.weight": w(ffn, hid)}
        t |= {p + "input_layernorm.weight": 1 + w(hid), p + "post_attention_layernorm.weight": 1 + w(hid)}
    t |= {"model.norm.weight": 1 + w(hid), "lm_head.weight": w(c["vocab_size"], hid)}
    return t


QWEN = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 64, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False}
QWEN_FAMILIES = {"qwen2": ("Qwen2ForCausalLM", {}),
                 "qwen3": ("Qwen3ForCausalLM", {}),
                 "qwen3_moe": ("Qwen3MoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2,
                                                       "moe_intermediate_size": 24, "norm_topk_prob": True,
                                                       "decoder_sparse_step": 1, "mlp_only_layers": []})}


def qwen(kind: str, seed: int = 13) -> dict[str, np.ndarray]:
    """A Qwen-family decoder's tensors under Hugging Face's names: Qwen2's q/k/v biases, Qwen3's q/k norms,
    Qwen3-MoE's router (mlp.gate) and one gate/up/down per expert."""
    w = _weights(seed)
    c, extra = QWEN, QWEN_FAMILIES[kind][1]
    hid, hd = c["hidden_size"], c["head_dim"]
    q, kv = hd * c["num_attention_heads"], hd * c["num_key_value_heads"]
    t = {"model.embed_tokens.weight": w(c["vocab_size"], hid)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t |= {p + "self_attn.q_proj.weight": w(q, hid), p + "self_attn.k_proj.weight": w(kv, hid),
              p + "self_attn.v_proj.weight": w(kv, hid), p + "self_attn.o_proj.weight": w(hid, q),
              p + "input_layernorm.weight": 1 + w(hid), p + "post_attention_layernorm.weight": 1 + w(hid)}
        if kind == "qwen2":
            t |= {p + "self_attn.q_proj.bias": w(q), p + "self_attn.k_proj.bias": w(kv),
                  p + "self_attn.v_proj.bias": w(kv)}
        else:
            t |= {p + "self_attn.q_norm.weight": 1 + w(hd), p + "self_attn.k_norm.weight": 1 + w(hd)}
        experts = extra.get("num_experts", 0)
        ffn = extra.get("moe_intermediate_size", c["intermediate_size"])
        for e in range(experts) if experts else [None]:
            x = p + ("mlp." if e is None else f"mlp.experts.{e}.")
            t |= {x + "gate_proj.weight": w(ffn, hid), x + "up_proj.weight": w(ffn, hid),
                  x + "down_proj.weight": w(hid, ffn)}
        if experts:
            t[p + "mlp.gate.weight"] = w(experts, hid)
    t |= {"model.norm.weight": 1 + w(hid), "lm_head.weight": w(c["vocab_size"], hid)}
    return t


def mixtral_config() -> dict[str, object]:
    return {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], **MIXTRAL, "tie_word_embeddings": False}


def llama_meta(seed: int = 12, c: dict[str, int] = LLAMA) -> dict[str, np.ndarray]:
    w = _weights(seed)
    d, f = c["dim"], c["ffn_dim"]
    kv = d // c["n_heads"] * c["n_kv_heads"]
    t = {"tok_embeddings.weight": w(c["vocab_size"], d)}
    for i in range(c["n_layers"]):
        p = f"layers.{i}."
        t |= {p + "attention.wq.weight": w(d, d), p + "attention.wk.weight": w(kv, d),
              p + "attention.wv.weight": w(kv, d), p + "attention.wo.weight": w(d, d),
              p + "feed_forward.w1.weight": w(f, d), p + "feed_forward.w2.weight": w(d, f),
              p + "feed_forward.w3.weight": w(f, d),
              p + "attention_norm.weight": 1 + w(d), p + "ffn_norm.weight": 1 + w(d)}
    t |= {"norm.weight": 1 + w(d), "output.weight": w(c["vocab_size"], d)}
    return t


def write(out: Path) -> None:
    save([from_numpy(k, v) for k, v in gpt2_tiny().items()], out / "gpt2-tiny.safetensors",
         metadata={"format": "pt"}, overwrite=True)
    save([from_numpy(k, v) for k, v in mixtral_experts().items()], out / "mixtral-tiny-experts.safetensors",
         metadata={"format": "pt"}, overwrite=True)
    (out / "mixtral-tiny-config.json").write_text(json.dumps(mixtral_config(), indent=2) + "\n")
    (out / "mixtral-tiny-hf").mkdir(parents=True, exist_ok=True)  # the same model as a Hugging Face folder
    save([from_numpy(k, v) for k, v in mixtral_experts().items()], out / "mixtral-tiny-hf" / "model.safetensors",
         metadata={"format": "pt"}, overwrite=True)
    (out / "mixtral-tiny-hf" / "config.json").write_text(json.dumps(mixtral_config(), indent=2) + "\n")
    write_llama(out, LLAMA)
    for kind, (architecture, extra) in QWEN_FAMILIES.items():
        folder = out / f"{kind.replace('_', '-')}-tiny-hf"
        folder.mkdir(parents=True, exist_ok=True)
        save([from_numpy(k, v) for k, v in qwen(kind).items()], folder / "model.safetensors",
             metadata={"format": "pt"}, overwrite=True)
        config = {"model_type": kind, "architectures": [architecture], **QWEN, **extra}
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def llama_hf_config(c: dict[str, int]) -> dict[str, object]:
    """The Hugging Face LlamaConfig of a Meta params.json-shaped dict."""
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": c["dim"],
            "intermediate_size": c["ffn_dim"], "num_hidden_layers": c["n_layers"],
            "num_attention_heads": c["n_heads"], "num_key_value_heads": c["n_kv_heads"],
            "vocab_size": c["vocab_size"], "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "max_position_embeddings": 64}


def write_llama(out: Path, c: dict[str, int], seed: int = 12) -> None:
    """llama-meta-tiny/ (consolidated.00.pth + params.json) and llama-hf-tiny/config.json for the model `c`."""
    (out / "llama-meta-tiny").mkdir(parents=True, exist_ok=True)
    (out / "llama-hf-tiny").mkdir(parents=True, exist_ok=True)
    save([from_numpy(k, v) for k, v in llama_meta(seed, c).items()], out / "llama-meta-tiny" / "consolidated.00.pth",
         overwrite=True)
    (out / "llama-meta-tiny" / "params.json").write_text(json.dumps(c, indent=2) + "\n")
    (out / "llama-hf-tiny" / "config.json").write_text(json.dumps(llama_hf_config(c), indent=2) + "\n")
