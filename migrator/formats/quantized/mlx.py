"""MLX affine quantization (config.json `quantization: {group_size, bits}`), as mlx-lm writes the
mlx-community models.

Layout of a quantized module `M` (linear layers, embeddings, stacked experts): `M.weight` U32
[..., rows, cols * bits / 32], each row a little-endian stream of `bits`-bit unsigned codes (bits 2,
3, 4, 5, 6 or 8); `M.scales` and `M.biases` [..., rows, cols / group_size] in the model's float dtype.
A module path given its own object in `quantization` (`"model.layers.0.mlp.down_proj": {"group_size":
64, "bits": 8}`) overrides the defaults for it; `false` declares it unquantized. Dequantized as
`mlx.core.dequantize` computes it: scale * code, rounded to the scales' dtype, + bias, rounded again.
Only the `affine` mode is read (MLX's `mxfp4`/`nvfp4` modes are not).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ...core import dequant as dq
from ...core.dtypes import DType
from .blocks import FLOAT_SCALES, check_scales, scale_values
from .declared import module_of
from .scheme import KERNELS, Band, QuantizationError, QuantizedWeight, Scheme

if TYPE_CHECKING:
    from ...core.tensor import LazyTensor

KEY = "quantization"
BITS = (2, 3, 4, 5, 6, 8)
DEFAULT_KEYS = ("group_size", "bits", "mode")


class MLXAffine(Scheme, name="mlx affine"):
    method = "mlx"
    config_key = KEY

    def __init__(self, config: Mapping[str, Any], file: str, *, default: tuple[int, int],
                 overrides: dict[str, tuple[int, int] | None]) -> None:
        super().__init__(config, file)
        self.default, self.overrides = default, overrides

    @classmethod
    def parse(cls, config: Mapping[str, Any], file: str) -> MLXAffine:
        mode = config.get("mode", "affine")
        if mode != "affine":
            raise QuantizationError(f"{KEY}.mode '{mode}': MLX's affine mode only is read", file=file)
        default = _params(config, KEY, file)
        overrides: dict[str, tuple[int, int] | None] = {}
        for key, value in config.items():
            if key in DEFAULT_KEYS:
                continue
            if value is False:
                overrides[key] = None
            elif isinstance(value, Mapping):
                overrides[key] = _params(value, f"{KEY}.{key}", file)
            else:
                raise QuantizationError(f"{KEY}.{key} must be a module's {{group_size, bits}} or false, not {value!r}",
                                        file=file)
        return cls(config, file, default=default, overrides=overrides)

    def describe(self) -> str:
        gs, bits = self.default
        n = len(self.overrides)
        more = f", {n} module{'s' if n > 1 else ''} overridden" if n else ""
        return f"MLX affine ({bits}-bit codes, groups of {gs}, scales and biases{more})"

    def skipped(self) -> list[str]:
        return [m for m, p in self.overrides.items() if p is None]

    def weights(self, tensors: Mapping[str, LazyTensor]) -> list[QuantizedWeight]:
        found = []
        claimed: set[str] = set()
        for t in tensors.values():
            if not t.name.endswith(".scales"):
                continue
            module = module_of(t.name)
            weight, biases = tensors.get(module + ".weight"), tensors.get(module + ".biases")
            if weight is None or biases is None:
                missing = module + (".weight" if weight is None else ".biases")
                raise QuantizationError(f"'{missing}' is not in the checkpoint: MLX scales come with a packed weight "
                                        "and biases", file=t.origin, tensor=t.name)
            params = self.overrides.get(module, self.default)
            if params is None:
                raise QuantizationError(f"{self.file} declares module '{module}' unquantized ({KEY}.{module}: false), "
                                        "yet it stores scales", file=t.origin, tensor=t.name)
            found.append(self._weight(weight, t, biases, params))
            claimed.update(found[-1].stored())
        for t in tensors.values():
            if t.dtype.name == "U32" and t.name.endswith(".weight") and t.name not in claimed:
                raise QuantizationError(f"a U32 weight without its scales ('{module_of(t.name)}.scales' is not in the "
                                        f"checkpoint, which {self.file} declares quantized)", file=t.origin,
                                        tensor=t.name)
        order = {name: i for i, name in enumerate(tensors)}
        found.sort(key=lambda w: order[w.parts["weight"]])
        return found

    def _weight(self, weight: LazyTensor, scales: LazyTensor, biases: LazyTensor,
                params: tuple[int, int]) -> QuantizedWeight:
        gs, bits = params
        if weight.dtype.name != "U32" or len(weight.shape) < 2:
            raise QuantizationError(f"is {weight.dtype.display} {list(weight.shape)}: an MLX quantized weight is U32 "
                                    "words, rows of them", file=weight.origin, tensor=weight.name)
        *lead, words = weight.shape
        if words * 32 % bits:
            raise QuantizationError(f"{words} words per row do not hold a whole number of {bits}-bit codes",
                                    file=weight.origin, tensor=weight.name)
        cols = words * 32 // bits
        want = (*lead, cols // gs)
        if cols % gs or scales.dtype.name not in FLOAT_SCALES or tuple(scales.shape) != want:
            raise QuantizationError(f"scales are {scales.dtype.display} {list(scales.shape)}: a float {list(want)} "
                                    f"expected for {cols} columns of {bits}-bit codes in groups of {gs}",
                                    file=scales.origin, tensor=scales.name)
        if biases.dtype != scales.dtype or tuple(biases.shape) != want:
            raise QuantizationError(f"biases are {biases.dtype.display} {list(biases.shape)}: "
                                    f"{scales.dtype.display} {list(want)} expected, as the scales",
                                    file=biases.origin, tensor=biases.name)
        return QuantizedWeight(weight.name, (*lead, cols),
                               {"weight": weight.name, "scales": scales.name, "biases": biases.name},
                               info={"bits": bits, "group": gs, "scale_dtype": scales.dtype})

    def check(self, weight: QuantizedWeight, whole: Mapping[str, np.ndarray]) -> None:
        dtype = weight.info["scale_dtype"]
        check_scales(scale_values(whole["scales"], dtype), weight.parts["scales"], None)
        biases = scale_values(whole["biases"], dtype).reshape(-1)
        bad = ~np.isfinite(biases)
        if bad.any():
            i = int(np.argmax(bad))
            raise QuantizationError(f"bias {float(biases[i])} at flat index {i}: a bias must be finite",
                                    tensor=weight.parts["biases"])

    def dequantize(self, weight: QuantizedWeight, band: Band) -> np.ndarray:
        return _band(weight, band, "F32", kernels=False).view(np.float32)


def _params(value: Mapping[str, Any], where: str, file: str) -> tuple[int, int]:
    gs, bits = value.get("group_size"), value.get("bits")
    if not isinstance(gs, int) or isinstance(gs, bool) or gs < 1:
        raise QuantizationError(f"{where}.group_size must be a positive integer, not {gs!r}", file=file)
    if bits not in BITS or isinstance(bits, bool):
        raise QuantizationError(f"{where}.bits {bits!r}: MLX packs {', '.join(map(str, BITS))}-bit codes", file=file)
    return gs, int(bits)


def _band(weight: QuantizedWeight, band: Band, out: str, *, kernels: bool) -> np.ndarray:
    gs, bits, dtype = weight.info["group"], weight.info["bits"], weight.info["scale_dtype"].name
    groups = weight.columns // gs
    codes = band.parts["weight"].view(np.uint8)
    scales = band.parts["scales"].reshape(-1, groups)[band.start:band.stop]
    biases = band.parts["biases"].reshape(-1, groups)[band.start:band.stop]
    return dq.dequantize_band(codes, dq.Codes("int", bits), rows=band.stop - band.start, row_bytes=codes.shape[1],
                              cols=weight.columns, scales=scales, biases=biases, scale_dtype=dtype, block=(1, gs),
                              mid=dtype, out=out, name=weight.parts["scales"], use_kernels=kernels)


def mlx_bits(scheme: Scheme, weight: QuantizedWeight, band: Band, to: DType) -> np.ndarray | None:
    if dq.kernels() is None or to.name not in ("F32", "BF16", "F16"):
        return None
    return _band(weight, band, to.name, kernels=True)


KERNELS["mlx affine"] = mlx_bits
