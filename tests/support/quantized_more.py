"""Quantized model folders for tests of the integer, MXFP4 and MLX schemes (beside tests/support/quantized.py's
FP8 ones): a tiny Llama packed by compressed-tensors itself (pack-quantized), a tiny gpt-oss checkpoint in
OpenAI's MXFP4 layout, a tiny Llama quantized by mlx.core.quantize as mlx-lm stores it. No hub, no GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.quantized import is_linear, save_folder, tiny_llama


def pack_folder(folder: Path, *, bits: int = 4, strategy: str = "group", group: int = 16, symmetric: bool = True,
                scale_dtype: Any = None, seed: int = 0) -> tuple[Path, dict[str, Any], Any]:
    """A tiny Llama whose linear weights (lm_head ignored) compressed-tensors itself quantizes
    (min-max `calculate_qparams`) and packs (`PackedQuantizationCompressor.compress`)."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    config, state = tiny_llama(seed, hidden=64, intermediate=128, dtype=scale_dtype)
    weights = {"num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": strategy,
               "group_size": group if strategy == "group" else None, "dynamic": False, "actorder": None,
               "block_structure": None, "observer": "minmax", "observer_kwargs": {}}
    args = QuantizationArgs(**weights)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    out: dict[str, Any] = {}
    for name, w in state.items():
        module = name.rpartition(".")[0]
        if not is_linear(name):
            out[name] = w
            continue
        rows, cols = w.shape
        shaped = w.reshape(rows, cols // group, group) if strategy == "group" else w.reshape(rows, 1, cols)
        mn, mx = shaped.amin(dim=2), shaped.amax(dim=2)
        scale, zp = calculate_qparams(mn, mx, args)
        parts = {"weight": w, "weight_scale": scale, "weight_zero_point": zp}
        for k, v in PackedQuantizationCompressor.compress(parts, scheme).items():
            out[f"{module}.{k}"] = v
    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                        "output_activations": None, "format": "pack-quantized"}},
          "ignore": ["lm_head"], "kv_cache_scheme": None}
    config["quantization_config"] = qc
    return save_folder(folder, out, config), out, scheme


def gpt_oss_config() -> Any:
    from transformers import GptOssConfig

    return GptOssConfig(hidden_size=64, intermediate_size=64, num_local_experts=4, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=64,
                        num_experts_per_tok=2)


def mxfp4_folder(folder: Path, seed: int = 0) -> tuple[Path, dict[str, Any]]:
    """A tiny gpt-oss checkpoint as OpenAI ships it: the experts' weights as `_blocks` + `_scales`
    (random codes, E8M0 scales around 2^-4), the rest BF16; quantization_config mxfp4."""
    import torch
    from transformers import GptOssForCausalLM

    torch.manual_seed(seed)
    cfg = gpt_oss_config()
    model = GptOssForCausalLM(cfg).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {}
    for name, t in model.state_dict().items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            e, cols, rows = t.shape  # transformers' layout: the stored one is each expert transposed
            out[name + "_blocks"] = torch.randint(0, 256, (e, rows, cols // 32, 16), dtype=torch.uint8, generator=gen)
            out[name + "_scales"] = torch.randint(118, 130, (e, rows, cols // 32), dtype=torch.uint8, generator=gen)
        else:
            out[name] = t.detach().clone().contiguous()
    config = cfg.to_dict()
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    return save_folder(folder, out, config), out


def mlx_folder(folder: Path, *, bits: int = 4, group: int = 32, seed: int = 0) -> tuple[Path, dict[str, Any], Any]:
    """A tiny Llama quantized by mlx.core.quantize as mlx-lm does: every linear layer and the embeddings
    whose columns split into groups (`weight` U32, `scales`, `biases`), one module overridden to 8 bits,
    `quantization` in config.json (and its copy in quantization_config). Returns the folder, the stored
    tensors and (the MLX arrays per module, the group size)."""
    mx = pytest.importorskip("mlx.core")
    import numpy as np
    import torch

    config, state = tiny_llama(seed, hidden=64, intermediate=128)
    override = "model.layers.1.mlp.down_proj"
    out: dict[str, Any] = {}
    arrays: dict[str, Any] = {}
    for name, t in state.items():
        module = name.rpartition(".")[0]
        if not (is_linear(name) or name == "model.embed_tokens.weight") or t.shape[-1] % group:
            out[name] = t  # mlx-lm leaves a layer whose columns do not split into groups as it is (o_proj: 48)
            continue
        b = 8 if module == override else bits
        w = mx.array(t.to(torch.float32).numpy()).astype(mx.bfloat16)
        wq, s, z = mx.quantize(w, group_size=group, bits=b)
        arrays[module] = (wq, s, z, b)
        out[name] = torch.from_numpy(np.array(wq).view(np.int32).copy()).view(torch.uint32)
        out[module + ".scales"] = torch.from_numpy(np.array(s.view(mx.int16))).view(torch.bfloat16)
        out[module + ".biases"] = torch.from_numpy(np.array(z.view(mx.int16))).view(torch.bfloat16)
    q = {"group_size": group, "bits": bits, override: {"group_size": group, "bits": 8}}
    config["quantization"] = q
    config["quantization_config"] = q
    return save_folder(folder, out, config), out, (arrays, group)
