"""Shared test helpers (tokenizer_files); moved from the test files that first needed them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from migrator import from_numpy, save

VOCAB, HIDDEN = 8, 32


def hf_llama(folder: Path, vocab: int = VOCAB) -> Path:
    """A 1-layer Llama folder written by migrator (no torch): config.json and model.safetensors."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    shapes = {"model.embed_tokens.weight": (vocab, HIDDEN), "lm_head.weight": (vocab, HIDDEN),
              "model.norm.weight": (HIDDEN,)}
    layer = {"self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (HIDDEN // 2, HIDDEN),
             "self_attn.v_proj": (HIDDEN // 2, HIDDEN), "self_attn.o_proj": (HIDDEN, HIDDEN),
             "mlp.gate_proj": (64, HIDDEN), "mlp.up_proj": (64, HIDDEN), "mlp.down_proj": (HIDDEN, 64),
             "input_layernorm": (HIDDEN,), "post_attention_layernorm": (HIDDEN,)}
    shapes.update({f"model.layers.0.{k}.weight": v for k, v in layer.items()})
    save([from_numpy(k, rng.standard_normal(v).astype(np.float32)) for k, v in shapes.items()],
         folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": vocab, "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "rope_theta": 10000.0,
        "tie_word_embeddings": False}))
    return folder


def bpe(vocab: object = None, merges: object = None, **extra: object) -> str:
    """A byte-level BPE tokenizer.json with the given parts replaced."""
    doc: dict[str, object] = {
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2} if vocab is None else vocab,
                  "merges": ["a b"] if merges is None else merges},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False}}
    doc.update(extra)
    return json.dumps(doc)
