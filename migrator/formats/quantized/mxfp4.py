"""gpt-oss MXFP4 (`quant_method: mxfp4`): the experts' weights in OCP MX FP4, as OpenAI ships gpt-oss.

Layout: a quantized weight `P` (`...mlp.experts.gate_up_proj`, `...down_proj`) is stored as
`P_blocks` U8 [experts, rows, groups, 16] (32 E2M1 codes per group, two per byte, the low nibble first)
and `P_scales` U8 (or F8_E8M0) [experts, rows, groups], one E8M0 exponent per group: value =
E2M1(code) * 2^(scale - 127). Dequantized into the layout of transformers' dequantized gpt-oss model
(`GptOssExperts`, what `Mxfp4Config(dequantize=True)` loads): `P` of shape [experts, groups * 32, rows],
each expert's matrix transposed, with the bits of transformers' `convert_moe_packed_tensors` (float32
product, one rounding to the output dtype). E8M0 255 (NaN) is refused. Modules matching
`modules_to_not_convert` are stored unquantized (attention, router, embeddings, `lm_head`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ...core import dequant as dq
from ...core.dtypes import DType
from .declared import hf_skips, module_of, string_list
from .scheme import KERNELS, Band, QuantizationError, QuantizedWeight, Scheme

if TYPE_CHECKING:
    from ...core.tensor import LazyTensor

BLOCKS, SCALES = "_blocks", "_scales"
KEY = "quantization_config"


class MXFP4(Scheme, name="mxfp4"):
    method = "mxfp4"

    def __init__(self, config: Mapping[str, Any], file: str, *, skip: list[str]) -> None:
        super().__init__(config, file)
        self.skip = skip

    @classmethod
    def parse(cls, config: Mapping[str, Any], file: str) -> MXFP4:
        return cls(config, file, skip=string_list(config, "modules_to_not_convert", file))

    def describe(self) -> str:
        return "gpt-oss MXFP4 (quant_method mxfp4, E2M1 codes in groups of 32 with E8M0 scales)"

    def skipped(self) -> list[str]:
        return self.skip

    def weights(self, tensors: Mapping[str, LazyTensor]) -> list[QuantizedWeight]:
        found = []
        claimed: set[str] = set()
        for t in tensors.values():
            if not t.name.endswith(BLOCKS):
                continue
            name = t.name[:-len(BLOCKS)]
            scale = tensors.get(name + SCALES)
            if scale is None:
                raise QuantizationError(f"'{name}{SCALES}' is not in the checkpoint: MXFP4 blocks need their scales",
                                        file=t.origin, tensor=t.name)
            if hf_skips(module_of(name), self.skip):
                raise QuantizationError(f"module '{module_of(name)}' is in modules_to_not_convert of {self.file}, yet "
                                        "it stores MXFP4 blocks", file=t.origin, tensor=t.name)
            found.append(self._weight(name, t, scale))
            claimed.update(found[-1].stored())
        for t in tensors.values():
            if t.name.endswith(SCALES) and t.name not in claimed:
                raise QuantizationError(f"MXFP4 scales without their blocks ('{t.name[:-len(SCALES)]}{BLOCKS}' is not "
                                        "in the checkpoint)", file=t.origin, tensor=t.name)
        return found

    def _weight(self, name: str, blocks: LazyTensor, scales: LazyTensor) -> QuantizedWeight:
        if blocks.dtype.name != "U8" or len(blocks.shape) != 4 or blocks.shape[-1] != 16:
            raise QuantizationError(f"is {blocks.dtype.display} {list(blocks.shape)}: MXFP4 blocks are U8 "
                                    "[experts, rows, groups, 16]", file=blocks.origin, tensor=blocks.name)
        experts, rows, groups, _ = blocks.shape
        if scales.dtype.name not in ("U8", "F8_E8M0") or tuple(scales.shape) != (experts, rows, groups):
            raise QuantizationError(f"scales are {scales.dtype.display} {list(scales.shape)}: U8 (E8M0) "
                                    f"{[experts, rows, groups]} expected, one per block of 32", file=scales.origin,
                                    tensor=scales.name)
        if rows % 2:
            raise QuantizationError(f"{rows} rows: an expert's transposed rows are read a byte at a time, which "
                                    "needs an even count", file=blocks.origin, tensor=blocks.name)
        return QuantizedWeight(name, (experts, groups * 32, rows), {"blocks": blocks.name, "scales": scales.name},
                               banded=frozenset({"blocks"}), info={"rows": rows, "groups": groups})

    def row_step(self, weight: QuantizedWeight) -> int:
        return weight.shape[1]  # one expert: its blocks are contiguous, its output is their transpose

    def check(self, weight: QuantizedWeight, whole: Mapping[str, np.ndarray]) -> None:
        codes = whole["scales"].view(np.uint8).reshape(-1)
        hit = np.flatnonzero(codes == 255)
        if hit.size:
            e, r, g = np.unravel_index(int(hit[0]), whole["scales"].shape)
            raise QuantizationError(f"scale [{e}, {r}, {g}] is E8M0 255 (NaN)", tensor=weight.parts["scales"])

    def dequantize(self, weight: QuantizedWeight, band: Band) -> np.ndarray:
        return _band(weight, band, "F32", kernels=False).view(np.float32)


def _band(weight: QuantizedWeight, band: Band, out: str, *, kernels: bool) -> np.ndarray:
    rows, groups = weight.info["rows"], weight.info["groups"]
    cols = groups * 32
    first, count = band.start // cols, (band.stop - band.start) // cols
    blocks = band.parts["blocks"].reshape(count, rows, groups * 16)
    scales = band.parts["scales"].view(np.uint8)
    result = np.empty((count, cols, rows), dtype=dq.out_numpy_dtype(out))
    for i in range(count):
        bits = dq.dequantize_band(blocks[i], dq.E2M1, rows=rows, row_bytes=groups * 16, cols=cols,
                                  scales=scales[first + i], scale_dtype="F8_E8M0", block=(1, 32), mid="F32", out=out,
                                  name=weight.parts["scales"], use_kernels=kernels)
        result[i] = bits.T
    return result.reshape(count * cols, rows)


def mxfp4_bits(scheme: Scheme, weight: QuantizedWeight, band: Band, to: DType) -> np.ndarray | None:
    if dq.kernels() is None or to.name not in ("F32", "BF16", "F16"):
        return None
    return _band(weight, band, to.name, kernels=True)


KERNELS["mxfp4"] = mxfp4_bits
