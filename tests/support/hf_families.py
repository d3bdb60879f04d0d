"""Tiny transformers models of the families the HF -> Megatron recipes convert (Qwen2, Qwen3, Mixtral,
Qwen3-MoE), built from configs with a fixed seed, for the torch_dist writer's tests and its docs' test.
Their norms and biases are moved away from their init (ones, zeros) so that a swap would show."""

from __future__ import annotations

from pathlib import Path
from typing import Any

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, VOCAB, EXPERTS, TOPK = 64, 2, 4, 2, 96, 128, 4, 2
COMMON = {"hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
          "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
          "tie_word_embeddings": False}
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2": ("Qwen2", {}),
    "qwen3": ("Qwen3", {"head_dim": HIDDEN // HEADS}),
    "mixtral": ("Mixtral", {"num_local_experts": EXPERTS, "num_experts_per_tok": TOPK}),
    "qwen3-moe": ("Qwen3Moe", {"head_dim": HIDDEN // HEADS, "num_experts": EXPERTS, "num_experts_per_tok": TOPK,
                               "moe_intermediate_size": 48, "norm_topk_prob": True, "decoder_sparse_step": 1,
                               "mlp_only_layers": []}),
}


def tiny_model(family: str, path: Path, **extra: Any) -> Any:
    """The family's transformers model, saved at `path` (save_pretrained: config.json, model.safetensors)."""
    import torch
    import transformers

    prefix, options = FAMILIES[family]
    torch.manual_seed(0)
    cfg = getattr(transformers, f"{prefix}Config")(**{**COMMON, **options, **extra})
    model = getattr(transformers, f"{prefix}ForCausalLM")(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if "norm" in name else 0.0))
    model.eval()
    model.save_pretrained(path)
    return model
