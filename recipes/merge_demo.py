"""The inputs of the merge recipes (numpy + migrator only; deterministic), written by generate_demo_data.py:

- llama-base/, llama-chat/, llama-code/: Hugging Face LlamaForCausalLM folders (4 layers, hidden 32):
  config.json, generation_config.json, model.safetensors; chat and code are the base plus small
  seeded "fine-tuning" deltas, as the models a TIES or SLERP merge combines;
- llama-vocab/: llama-base's weights with a word-level fast tokenizer of its 96 tokens (tokenizer.json,
  tokenizer_config.json, written as JSON here: no tokenizers library), the vocabulary-growth recipe's input;
- llama-lora/: a PEFT LoRA adapter of llama-base (adapter_config.json + adapter_model.safetensors,
  r 4 on q_proj and v_proj, non-zero lora_B), as `get_peft_model(...).save_pretrained` writes it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from migrator import from_numpy, save

HIDDEN, FFN, VOCAB, LAYERS, HEADS, KV_HEADS = 32, 64, 96, 4, 4, 2
HEAD_DIM = HIDDEN // HEADS
CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN,
          "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
          "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "max_position_embeddings": 64,
          "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "dtype": "float32"}
GENERATION = {"bos_token_id": 1, "eos_token_id": 2}
LORA_TARGETS = ("q_proj", "v_proj")
LORA_RANK = 4


def llama(seed: int) -> dict[str, np.ndarray]:
    """A LlamaForCausalLM state_dict with seeded normal weights (std 0.02) and unit norms."""
    g = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (g.standard_normal(shape) * 0.02).astype(np.float32)

    out = {"model.embed_tokens.weight": w(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {p + "self_attn.q_proj.weight": w(HIDDEN, HIDDEN),
                p + "self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.o_proj.weight": w(HIDDEN, HIDDEN),
                p + "mlp.gate_proj.weight": w(FFN, HIDDEN), p + "mlp.up_proj.weight": w(FFN, HIDDEN),
                p + "mlp.down_proj.weight": w(HIDDEN, FFN),
                p + "input_layernorm.weight": np.ones(HIDDEN, np.float32),
                p + "post_attention_layernorm.weight": np.ones(HIDDEN, np.float32)}
    out |= {"model.norm.weight": np.ones(HIDDEN, np.float32), "lm_head.weight": w(VOCAB, HIDDEN)}
    return out


def fine_tuned(base: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """`base` plus a small seeded delta on every weight (a stand-in for a fine-tune of it)."""
    g = np.random.default_rng(seed)
    return {k: (v + g.standard_normal(v.shape).astype(np.float32) * 0.005).astype(np.float32) for k, v in base.items()}


def write_model(folder: Path, tensors: dict[str, np.ndarray]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save([from_numpy(k, v) for k, v in tensors.items()], folder / "model.safetensors", metadata={"format": "pt"},
         overwrite=True)
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    (folder / "generation_config.json").write_text(json.dumps(GENERATION, indent=2) + "\n")


def write_adapter(folder: Path, seed: int = 40) -> None:
    """A PEFT LoRA adapter folder for llama-base: lora_A (r x in) and lora_B (out x r) per targeted projection."""
    g = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for i in range(LAYERS):
        for module, out_features in (("q_proj", HIDDEN), ("v_proj", KV_HEADS * HEAD_DIM)):
            p = f"base_model.model.model.layers.{i}.self_attn.{module}."
            tensors[p + "lora_A.weight"] = (g.standard_normal((LORA_RANK, HIDDEN)) * 0.1).astype(np.float32)
            tensors[p + "lora_B.weight"] = (g.standard_normal((out_features, LORA_RANK)) * 0.1).astype(np.float32)
    save([from_numpy(k, v) for k, v in tensors.items()], folder / "adapter_model.safetensors",
         metadata={"format": "pt"}, overwrite=True)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "llama-base",
              "r": LORA_RANK, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": list(LORA_TARGETS),
              "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
              "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}}
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_tokenizer(folder: Path) -> None:
    """A word-level tokenizer of VOCAB tokens (<unk>, <s>, </s>, w0, w1, ...), split on whitespace, as
    `PreTrainedTokenizerFast(tokenizer_object=...).save_pretrained` writes one."""
    words = ["<unk>", "<s>", "</s>", *(f"w{i}" for i in range(VOCAB - 3))]
    special = [{"id": i, "content": w, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                "special": True} for i, w in enumerate(words[:3])]
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": special, "normalizer": None,
                 "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
                 "model": {"type": "WordLevel", "vocab": {w: i for i, w in enumerate(words)}, "unk_token": "<unk>"}}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, indent=2) + "\n")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
              "eos_token": "</s>", "model_max_length": 64}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def write(out: Path) -> None:
    base = llama(30)
    write_model(out / "llama-base", base)
    write_model(out / "llama-vocab", base)
    write_tokenizer(out / "llama-vocab")
    write_model(out / "llama-chat", fine_tuned(base, 31))
    write_model(out / "llama-code", fine_tuned(base, 32))
    write_adapter(out / "llama-lora")
