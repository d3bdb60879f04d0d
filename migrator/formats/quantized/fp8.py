"""Fine-grained FP8 (`quant_method: fp8`): DeepSeek-V3/R1, Qwen3-FP8, GLM, Kimi.

Layout: each quantized module `M` stores `M.weight` as F8_E4M3 and `M.weight_scale_inv` (a fused
expert stack `E.gate_up_proj` [experts, rows, columns]: `E.gate_up_proj_scale_inv`, per expert), a
multiplier per block of `weight_block_size` ([rows, columns], e.g. [128, 128]) whose grid is cropped
at the last row and column (`ceil`); without a block size, one scale for the tensor. `scale_fmt: ue8m0`
declares power-of-two scales (stored as F32, or as F8_E8M0 codes). Modules matching
`modules_to_not_convert` (alias `ignored_layers`) are stored unquantized; a static activation scheme
adds `M.input_scale` (or `M.activation_scale`), consumed with the weight.

Dequantized value: float32(code) * float32(scale), rounded once to the output dtype, as transformers'
`Fp8Dequantize` and compressed-tensors' `FP8BlockDequantizer` compute it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .blocks import FLOAT_SCALES, check_scales, e4m3_values, expanded, grid, scale_values
from .declared import hf_skips, module_of, string_list
from .scheme import Band, QuantizationError, QuantizedWeight, Scheme

if TYPE_CHECKING:
    import numpy as np

    from ...core.tensor import LazyTensor

SCALE = "weight_scale_inv"
SUFFIX = "_scale_inv"
ACTIVATION_SCALES = ("input_scale", "activation_scale")
KEY = "quantization_config"


class FineGrainedFP8(Scheme, name="fp8"):
    method = "fp8"

    def __init__(self, config: Mapping[str, Any], file: str, *, block: tuple[int, int] | None, ue8m0: bool,
                 static: bool, skip: list[str]) -> None:
        super().__init__(config, file)
        self.block, self.ue8m0, self.static, self.skip = block, ue8m0, static, skip

    @classmethod
    def parse(cls, config: Mapping[str, Any], file: str) -> FineGrainedFP8:
        fmt = config.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise QuantizationError(f"{KEY}.fmt '{fmt}': fine-grained FP8 is read in e4m3 only", file=file)
        block_size = config.get("weight_block_size")
        block: tuple[int, int] | None = None
        if block_size is not None:
            if (not isinstance(block_size, list) or len(block_size) != 2
                    or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block_size)):
                raise QuantizationError(f"{KEY}.weight_block_size must be two positive integers, not {block_size!r}",
                                        file=file)
            block = (block_size[0], block_size[1])
        scale_fmt = config.get("scale_fmt") or "float"
        if scale_fmt not in ("float", "ue8m0"):
            raise QuantizationError(f"{KEY}.scale_fmt '{scale_fmt}' is neither float nor ue8m0", file=file)
        scheme = config.get("activation_scheme") or "dynamic"
        if not isinstance(scheme, str) or scheme.lower() not in ("dynamic", "static"):
            raise QuantizationError(f"{KEY}.activation_scheme '{scheme}' is neither dynamic nor static", file=file)
        expert = config.get("expert_dtype") or "fp8"
        if expert != "fp8":
            raise QuantizationError(f"{KEY}.expert_dtype '{expert}': FP4-packed experts are not read", file=file)
        skip = string_list(config, "modules_to_not_convert", file) or string_list(config, "ignored_layers", file)
        return cls(config, file, block=block, ue8m0=scale_fmt == "ue8m0", static=scheme.lower() == "static", skip=skip)

    def describe(self) -> str:
        blocks = f"{self.block[0]}x{self.block[1]} blocks" if self.block else "one scale per tensor"
        return (f"fine-grained FP8 (quant_method fp8, e4m3, {blocks}, "
                f"{'ue8m0 power-of-two' if self.ue8m0 else 'float'} scales)")

    def skipped(self) -> list[str]:
        return self.skip

    def weights(self, tensors: Mapping[str, LazyTensor]) -> list[QuantizedWeight]:
        found: list[QuantizedWeight] = []
        claimed: set[str] = set()
        for t in tensors.values():
            if not t.name.endswith(SUFFIX):  # `M.weight_scale_inv` scales `M.weight`; a fused expert stack
                continue                     # `M.experts.gate_up_proj_scale_inv` scales `...gate_up_proj`
            weight_name = t.name[:-len(SUFFIX)]
            module = module_of(weight_name)
            weight = tensors.get(weight_name)
            if weight is None:
                raise QuantizationError(f"a {SCALE} without its weight: '{weight_name}' is not in the checkpoint",
                                        file=t.origin, tensor=t.name)
            if hf_skips(module, self.skip):
                raise QuantizationError(f"module '{module}' is in modules_to_not_convert of {self.file}, yet it "
                                        f"stores a {SCALE}", file=t.origin, tensor=t.name)
            found.append(self._weight(weight, t, tensors))
            claimed.update(found[-1].stored())
        order = {name: i for i, name in enumerate(tensors)}
        found.sort(key=lambda w: order[w.parts["weight"]])
        for t in tensors.values():
            if t.dtype.name == "F8_E4M3" and t.name not in claimed:
                raise QuantizationError(f"F8_E4M3 tensor without its {SCALE} ('{t.name}{SUFFIX}' is not in the "
                                        f"checkpoint, which {self.file} declares quantized)", file=t.origin,
                                        tensor=t.name)
        return found

    def _weight(self, weight: LazyTensor, scale: LazyTensor, tensors: Mapping[str, LazyTensor]) -> QuantizedWeight:
        if weight.dtype.name != "F8_E4M3":
            raise QuantizationError(f"is {weight.dtype.display}, but it has a {SCALE}: a quantized weight is F8_E4M3",
                                    file=weight.origin, tensor=weight.name)
        if len(weight.shape) < 2:
            raise QuantizationError(f"shape {list(weight.shape)}: a quantized weight has rows and columns",
                                    file=weight.origin, tensor=weight.name)
        if scale.dtype.name not in FLOAT_SCALES and not (scale.dtype.name == "F8_E8M0" and self.ue8m0):
            allowed = "F32, BF16, F16" + (" or F8_E8M0" if self.ue8m0 else " (F8_E8M0 needs scale_fmt ue8m0)")
            raise QuantizationError(f"scales are {scale.dtype.display}: {allowed} expected", file=scale.origin,
                                    tensor=scale.name)
        block = self.block or (weight.shape[-2], weight.shape[-1])
        expected = grid(weight.shape, block)
        if self.block is None:
            ok = scale.numel == 1
            want = "one scale (no weight_block_size)"
        else:
            ok = tuple(scale.shape) == expected
            want = (f"{list(expected)}: weight {list(weight.shape)} in blocks of {list(block)}, the last ones "
                    "cropped")
        if not ok:
            raise QuantizationError(f"scale shape {list(scale.shape)} disagrees with the blocks: expected {want}",
                                    file=scale.origin, tensor=scale.name)
        module = module_of(weight.name) if weight.name.endswith(".weight") else weight.name
        consumed = tuple(f"{module}.{n}" for n in ACTIVATION_SCALES if f"{module}.{n}" in tensors)
        if self.static and not consumed:
            raise QuantizationError(f"activation_scheme static, but '{module}.input_scale' is not in the checkpoint",
                                    file=weight.origin, tensor=weight.name)
        return QuantizedWeight(weight.name, tuple(weight.shape), {"weight": weight.name, "scale": scale.name},
                               consumed=consumed,
                               info={"block": block, "scale_dtype": scale.dtype, "grid_rows": expected[-2]})

    def row_step(self, weight: QuantizedWeight) -> int:
        return int(weight.info["block"][0])

    def check(self, weight: QuantizedWeight, whole: Mapping[str, np.ndarray]) -> None:
        dtype = weight.info["scale_dtype"]
        check_scales(scale_values(whole["scale"], dtype), weight.parts["scale"], None, power_of_two=self.ue8m0,
                     code_255=dtype.name == "F8_E8M0")

    def dequantize(self, weight: QuantizedWeight, band: Band) -> np.ndarray:
        codes = band.parts["weight"]
        scales = scale_values(band.parts["scale"], weight.info["scale_dtype"])
        values = e4m3_values(codes).reshape(band.stop - band.start, weight.columns)
        if scales.size == 1:  # one scale for the tensor
            values *= scales.reshape(())
            return values
        per = expanded(scales.reshape(-1, scales.shape[-1]), band.start, band.stop, weight.shape[-2],
                       weight.info["block"], weight.columns)
        values *= per
        return values
