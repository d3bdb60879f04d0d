"""Quantized model folders for tests: a tiny Llama (random weights, fixed seed) whose linear weights are
quantized by torch in a checkpoint layout (fine-grained FP8 as DeepSeek-V3 stores it, compressed-tensors'
float-quantized as its own compressor writes it), saved as a Hugging Face folder of shards with its
config.json declaring the scheme. No hub, no GPU."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8_MAX = 448.0


def tiny_llama(seed: int = 0, *, hidden: int = 48, intermediate: int = 100, layers: int = 2,
               dtype: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config dict, state dict) of a tiny random LlamaForCausalLM: sizes that are not multiples of the
    blocks, so edge blocks are cropped."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=64, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=64,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(dtype or torch.bfloat16)
    with torch.no_grad():  # norms of ones would hide a dropped or misplaced tensor
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p, dtype=torch.float32).to(p.dtype) + 0.5)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    out = config.to_dict()
    out["torch_dtype"] = "bfloat16"
    out.pop("dtype", None)
    return out, state


def is_linear(name: str) -> bool:
    return name.endswith(".weight") and any(f".{p}." in name for p in LINEARS)


def block_quantize(w: Any, block: tuple[int, int], scale_dtype: Any = None, *, ue8m0: bool = False
                   ) -> tuple[Any, Any]:
    """(F8_E4M3 codes, scale per block) of a 2-D weight: amax / 448 per block (the grid cropped at the
    edges), as DeepSeek's and transformers' FP8 quantizers compute it; `ue8m0`: scales rounded up to a
    power of two."""
    import torch

    rows, cols = w.shape
    bh, bw = block
    gr, gc = -(-rows // bh), -(-cols // bw)
    scale = torch.empty(gr, gc, dtype=torch.float32)
    codes = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    wf = w.to(torch.float32)
    for i in range(gr):
        for j in range(gc):
            blk = wf[i * bh:(i + 1) * bh, j * bw:(j + 1) * bw]
            s = blk.abs().amax().clamp(min=1e-12) / FP8_MAX
            if ue8m0:
                s = torch.exp2(torch.ceil(torch.log2(s)))
            scale[i, j] = s
            codes[i * bh:(i + 1) * bh, j * bw:(j + 1) * bw] = (blk / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, scale.to(scale_dtype or torch.float32)


def save_folder(folder: Path, tensors: Mapping[str, Any], config: Mapping[str, Any], *, shards: int = 2) -> Path:
    """`tensors` as a Hugging Face folder: `shards` safetensors files and an index (one file: no index),
    with config.json."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    if shards == 1:
        save_file({n: v.contiguous() for n, v in tensors.items()}, str(folder / "model.safetensors"))
    else:
        per = -(-len(names) // shards)
        weight_map = {}
        for i in range(shards):
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: tensors[n] for n in names[i * per:(i + 1) * per]}
            save_file({n: v.contiguous() for n, v in part.items()}, str(folder / file))
            weight_map.update(dict.fromkeys(part, file))
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def fp8_folder(folder: Path, *, block: tuple[int, int] | None = (32, 32), ue8m0: bool = False, seed: int = 0,
               skip: tuple[str, ...] = (), scale_dtype: Any = None, shards: int = 2,
               edit: Callable[[dict[str, Any]], None] | None = None, hidden: int = 48,
               intermediate: int = 100) -> tuple[Path, dict[str, Any]]:
    """A fine-grained FP8 folder (`quant_method: fp8`): every layer's linear weight F8_E4M3 with its
    `weight_scale_inv`, the rest BF16; modules matching `skip` (modules_to_not_convert) left BF16.
    Returns the folder and the stored tensors."""
    config, state = tiny_llama(seed, hidden=hidden, intermediate=intermediate)
    out: dict[str, Any] = {}
    for name, t in state.items():
        module = name.rpartition(".")[0]
        if is_linear(name) and not any(module.endswith(s) for s in skip):
            codes, scale = block_quantize(t, block or tuple(t.shape), scale_dtype, ue8m0=ue8m0)
            out[name] = codes
            out[module + ".weight_scale_inv"] = scale if block else scale.reshape(())
        else:
            out[name] = t
    qc: dict[str, Any] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                          "weight_block_size": list(block) if block else None}
    if ue8m0:
        qc["scale_fmt"] = "ue8m0"
    if skip:
        qc["modules_to_not_convert"] = list(skip)
    config["quantization_config"] = qc
    if edit is not None:
        edit(out)
    return save_folder(folder, out, config, shards=shards), out


def ct_scheme(strategy: str, block: tuple[int, int] | None = None, *, static: bool = False) -> dict[str, Any]:
    """A compressed-tensors config group's `weights` and `input_activations` for FP8 weights."""
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "dynamic": False,
               "block_structure": list(block) if block else None, "group_size": None, "actorder": None,
               "observer": "minmax", "observer_kwargs": {}}
    inputs = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor" if static else "token",
              "dynamic": not static, "block_structure": None, "group_size": None, "actorder": None,
              "observer": "minmax" if static else None, "observer_kwargs": {}}
    return {"weights": weights, "input_activations": inputs}


def ct_float_folder(folder: Path, strategy: str, *, block: tuple[int, int] | None = None, static: bool = False,
                    ignore: tuple[str, ...] = ("lm_head",), targets: tuple[str, ...] = ("Linear",), seed: int = 0,
                    dtype: Any = None, shards: int = 2, hidden: int = 48,
                    intermediate: int = 100) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """A compressed-tensors `float-quantized` folder quantized by compressed-tensors itself: each targeted
    linear weight's scale from its observer-free min-max (`calculate_qparams`), then compressed by its
    `FloatQuantizationCompressor`. Returns the folder, the stored tensors and the quantization_config."""
    import torch
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams
    from compressed_tensors.utils.match import match_name

    config, state = tiny_llama(seed, dtype=dtype, hidden=hidden, intermediate=intermediate)
    group = ct_scheme(strategy, block, static=static)
    args = QuantizationArgs(**group["weights"])
    scheme = QuantizationScheme(targets=list(targets), weights=args)
    out: dict[str, Any] = {}
    gen = torch.Generator().manual_seed(seed + 1)
    for name, t in state.items():
        module = name.rpartition(".")[0]
        ignored = any(match_name(module, i) for i in ignore)  # compressed-tensors' own rule
        targeted = "Linear" in targets or any(match_name(module, t) for t in targets)
        if not is_linear(name) or ignored or not targeted:
            out[name] = t
            continue
        w = t
        if strategy == "tensor":
            mn, mx = w.amin().reshape(1), w.amax().reshape(1)
        elif strategy == "channel":
            mn, mx = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
        else:
            bh, bw = block  # type: ignore[misc]
            rows, cols = w.shape
            gr, gc = -(-rows // bh), -(-cols // bw)
            mn = torch.empty(gr, gc, dtype=w.dtype)
            mx = torch.empty(gr, gc, dtype=w.dtype)
            for i in range(gr):
                for j in range(gc):
                    blk = w[i * bh:(i + 1) * bh, j * bw:(j + 1) * bw]
                    mn[i, j], mx[i, j] = blk.amin(), blk.amax()
        scale, _ = calculate_qparams(mn, mx, args)
        packed = FloatQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, scheme)
        out[name] = packed["weight"]
        out[module + ".weight_scale"] = packed["weight_scale"]
        if static:
            out[module + ".input_scale"] = (torch.rand(1, generator=gen) + 0.1).to(scale.dtype)
    qc = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
          "config_groups": {"group_0": {"targets": list(targets), **group, "output_activations": None,
                                        "format": "float-quantized"}},
          "ignore": list(ignore), "kv_cache_scheme": None, "global_compression_ratio": None}
    config["quantization_config"] = qc
    return save_folder(folder, out, config, shards=shards), out, qc


def fp8_dequantized(stored: Mapping[str, Any], dtype: Any) -> dict[str, Any]:
    """compressed-tensors' `FP8BlockDequantizer` (32x32 blocks) on each weight of a fine-grained FP8
    folder's tensors (`fp8_folder`), in `dtype`: the oracle for migrator's dequantization."""
    from compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer import FP8BlockDequantizer

    d = FP8BlockDequantizer(weight_block_size=(32, 32), dtype=dtype)
    return {n: d._create_dequantized_weight(t, stored[n + "_scale_inv"]) for n, t in stored.items()
            if n + "_scale_inv" in stored}


def ct_float_dequantized(stored: Mapping[str, Any], qc: Mapping[str, Any], dtype: Any) -> dict[str, Any]:
    """compressed-tensors' `FloatQuantizationCompressor.decompress` on each weight of a float-quantized
    folder's tensors (`ct_float_folder`) under its `quantization_config` `qc`, in `dtype`."""
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    group = qc["config_groups"]["group_0"]
    scheme = QuantizationScheme(targets=group["targets"], weights=QuantizationArgs(**group["weights"]))
    return {n: FloatQuantizationCompressor.decompress({"weight": t, "weight_scale": stored[n + "_scale"]},
                                                      scheme)["weight"].to(dtype)
            for n, t in stored.items() if n + "_scale" in stored}
