"""The compressed-tensors quantization schemes migrator writes (no calibration data), declared once.

Each row is one of compressed-tensors 0.20's presets (`compressed_tensors.quantization.quant_scheme`
PRESET_SCHEMES) that needs no calibration: its weight strategy, and the `quantization_config` that
compressed-tensors' `ModelCompressor.update_config` writes into `config.json` for a model quantized
with it into the `float-quantized` layout (`QuantizationArgs` serialized as it serializes them: the
unset `actorder`, `block_structure`, `scale_dtype`, `observer` and `zp_dtype` left out). `--quantize`'s
choices, the recipe's `quantize.scheme` and the docs are made from `SCHEMES`.

Light on purpose (no numpy): `migrate --help` lists the names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

COMPRESSED_TENSORS_VERSION = "0.20.0"
"""The compressed-tensors release whose layout and config are written (its `version` key)."""

FORMAT = "float-quantized"
"""compressed-tensors' name of the layout: the weight stored as F8_E4M3, `weight_scale` beside it."""


def _args(strategy: str, *, dynamic: bool, group_size: int | None = None,
          block_structure: list[int] | None = None) -> dict[str, Any]:
    """One `QuantizationArgs` (8-bit float, symmetric) as compressed-tensors serializes it."""
    out: dict[str, Any] = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": group_size,
                           "strategy": strategy, "dynamic": dynamic}
    if block_structure is not None:
        out["block_structure"] = block_structure
    return out


@dataclass(frozen=True)
class Scheme:
    """One preset: its weights' strategy (`channel`: a scale per output row; `block`: a scale per
    `block` rows x columns tile) and its activations as the config declares them."""

    name: str
    strategy: str
    summary: str
    input_activations: dict[str, Any] = field(repr=False)
    block: tuple[int, int] | None = None

    def weights(self) -> dict[str, Any]:
        return _args(self.strategy, dynamic=False,
                     block_structure=None if self.block is None else list(self.block))

    def scale_shape(self, shape: Sequence[int]) -> tuple[int, int]:
        """The `weight_scale` shape of a [rows, cols] weight: [rows, 1] or one per block (edges cropped)."""
        rows, cols = shape
        if self.block is None:
            return (rows, 1)
        return (-(-rows // self.block[0]), -(-cols // self.block[1]))


SCHEMES: dict[str, Scheme] = {
    "FP8_DYNAMIC": Scheme(
        "FP8_DYNAMIC", "channel", "F8_E4M3 weights, one scale per output channel ([out, 1]); activations "
        "quantized per token at run time", _args("token", dynamic=True)),
    "FP8_BLOCK": Scheme(
        "FP8_BLOCK", "block", "F8_E4M3 weights, one scale per 128x128 block ([ceil(out/128), ceil(in/128)]); "
        "activations quantized per group of 128 at run time", _args("group", dynamic=True, group_size=128),
        block=(128, 128)),
}
"""The schemes `--quantize` and the recipe's `quantize.scheme` take, by name."""


def scheme_names() -> tuple[str, ...]:
    return tuple(SCHEMES)


def quantization_config(scheme: Scheme, ignore: Sequence[str]) -> dict[str, Any]:
    """config.json's `quantization_config` for a model whose Linear weights are quantized with `scheme`,
    except the modules named in `ignore`: what compressed-tensors 0.20 writes (keys sorted as its
    `json.dump(..., sort_keys=True)` does; the caller's writer sorts them too)."""
    return {
        "config_groups": {"group_0": {"format": FORMAT, "input_activations": dict(scheme.input_activations),
                                      "output_activations": None, "targets": ["Linear"],
                                      "weights": scheme.weights()}},
        "format": FORMAT,
        "global_compression_ratio": None,
        "ignore": list(ignore),
        "kv_cache_scheme": None,
        "moe_sparsity_config": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": COMPRESSED_TENSORS_VERSION,
    }


def can_hold(fmt: str, folder: bool) -> bool:
    """Whether a target of format `fmt` (a folder of shards, or one file) holds compressed-tensors' layout:
    a Hugging Face model folder of the registry's default folder format (SafeTensors, which
    compressed-tensors reads and writes), whose config.json gets the quantization_config."""
    from .registry import default_sharded

    return folder and fmt == default_sharded().name
