"""The GGUF tensors llama.cpp's converter makes of a quantized Llama folder's linear weights: the
reference (compressed-tensors) dequantization of each, under its GGUF name, q/k rows permuted as
`convert_hf_to_gguf.py` permutes them."""

from __future__ import annotations

from typing import Any

import numpy as np

GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's q/k row permutation (convert_hf_to_gguf.py LlamaModel.permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def fp8_reference(stored: dict[str, Any], block: tuple[int, int], dtype: Any) -> dict[str, Any]:
    """Each FP8 weight as compressed-tensors' `FP8BlockDequantizer` dequantizes it to `dtype`."""
    from compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer import FP8BlockDequantizer

    d = FP8BlockDequantizer(weight_block_size=tuple(block), dtype=dtype)
    return {n: d._create_dequantized_weight(t, stored[n + "_scale_inv"]) for n, t in stored.items()
            if n + "_scale_inv" in stored}


def gguf_expected(stored: dict[str, Any], config: dict[str, Any], dtype: Any,
                  block: tuple[int, int] = (32, 32)) -> dict[str, np.ndarray]:
    """The GGUF name and values of every dequantized linear, as llama.cpp's converter lays them out."""
    import torch

    out = {}
    for name, w in fp8_reference(stored, block, dtype).items():
        _, _, layer, rest = name.split(".", 3)
        module = rest.removesuffix(".weight")
        values = w.numpy() if dtype != torch.bfloat16 else w.float().numpy()
        if module == "self_attn.q_proj":
            values = permute(values, config["num_attention_heads"])
        elif module == "self_attn.k_proj":
            values = permute(values, config["num_key_value_heads"])
        out[f"blk.{layer}.{GGUF_NAMES[module]}.weight"] = values
    return out
