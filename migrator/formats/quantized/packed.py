"""compressed-tensors `pack-quantized`: integer weights (int4 W4A16, int8, 1 to 8 bits) in int32 words,
as GPTQ/AWQ-style models converted by llm-compressor store them.

Layout of a quantized module `M`: `M.weight_packed` I32 [rows, ceil(cols * bits / 32)], each row a
little-endian stream of `bits`-bit fields holding code + 2^(bits-1) (32 codes in `bits` words);
`M.weight_shape` the logical [rows, cols]; `M.weight_scale` [rows, cols / group_size] (strategy
`group`) or [rows, 1] (`channel`); asymmetric weights add `M.weight_zero_point`, packed the same way
down the rows ([ceil(rows * bits / 32), groups]). Dequantized as compressed-tensors'
`PackedQuantizationCompressor.decompress` computes it: (code - zero) * scale in the scale's dtype,
then cast. Activation-ordered groups (`actorder`, a stored `weight_g_idx`) are not read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np

from ...core import dequant as dq
from ...core.dtypes import DType
from .blocks import FLOAT_SCALES, check_scales, scale_values
from .compressed import CompressedTensors, Group
from .scheme import KERNELS, Band, QuantizationError, QuantizedWeight, Scheme

if TYPE_CHECKING:
    from ...core.tensor import LazyTensor

STRATEGIES = ("group", "channel")


class _Without(Mapping[str, "LazyTensor"]):
    """`tensors` without one name: the base class refuses any stored zero point, which this format reads."""

    def __init__(self, tensors: Mapping[str, LazyTensor], hidden: str) -> None:
        self.tensors, self.hidden = tensors, hidden

    def __getitem__(self, key: str) -> LazyTensor:
        if key == self.hidden:
            raise KeyError(key)
        return self.tensors[key]

    def __contains__(self, key: object) -> bool:
        return key != self.hidden and key in self.tensors

    def __iter__(self) -> Iterator[str]:
        return (k for k in self.tensors if k != self.hidden)

    def __len__(self) -> int:
        return len(self.tensors) - (self.hidden in self.tensors)


class PackQuantized(CompressedTensors, name="compressed-tensors pack-quantized"):
    formats = ("pack-quantized",)
    weight_suffix = "weight_packed"

    def describe(self) -> str:
        kinds = sorted({f"int{g.weights.get('num_bits')} {g.weights.get('strategy')}"
                        + ("" if g.weights.get("symmetric", True) else " asymmetric")
                        for g in self.groups if g.weights is not None})
        return f"compressed-tensors pack-quantized ({', '.join(kinds)} scales)"

    def check_args(self, group: Group, where: str) -> None:
        w = group.weights
        assert w is not None
        bits = w.get("num_bits")
        if w.get("type") != "int" or not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= 8:
            raise QuantizationError(f"{where}: num_bits {bits}, type {w.get('type')}: pack-quantized weights are "
                                    "integers of 1 to 8 bits", file=self.file)
        if w.get("dynamic", False):
            raise QuantizationError(f"{where}.dynamic true: a stored weight's scales are static", file=self.file)
        strategy = w.get("strategy")
        if strategy not in STRATEGIES:
            raise QuantizationError(f"{where}.strategy '{strategy}': pack-quantized weights are read with group or "
                                    "channel scales", file=self.file)
        gs = w.get("group_size")
        if strategy == "group" and (not isinstance(gs, int) or isinstance(gs, bool) or gs < 1):
            raise QuantizationError(f"{where}.group_size must be a positive integer, not {gs!r}", file=self.file)
        if w.get("actorder") not in (None, False, "static"):
            raise QuantizationError(f"{where}.actorder '{w.get('actorder')}': activation-ordered groups "
                                    "(weight_g_idx) are not read", file=self.file)

    def looks_quantized(self, t: LazyTensor) -> bool:
        return True  # a stored weight_packed is quantized whatever its dtype

    def quantized(self, module: str, group: Group, weight: LazyTensor, scale: LazyTensor,
                  tensors: Mapping[str, LazyTensor]) -> QuantizedWeight:
        args = group.weights
        assert args is not None
        bits, strategy = int(args["num_bits"]), str(args["strategy"])
        symmetric = args.get("symmetric", True) is not False
        if weight.dtype.name != "I32" or len(weight.shape) != 2:
            raise QuantizationError(f"is {weight.dtype.display} {list(weight.shape)}: packed weights are a 2-D I32 "
                                    "matrix", file=weight.origin, tensor=weight.name)
        if f"{module}.weight_g_idx" in tensors:
            raise QuantizationError(f"'{module}.weight_g_idx': activation-ordered groups are not read",
                                    file=weight.origin, tensor=weight.name)
        shape_t = tensors.get(f"{module}.weight_shape")
        if shape_t is None:
            raise QuantizationError(f"'{module}.weight_shape' is not in the checkpoint: a packed weight's columns "
                                    "are only known from it", file=weight.origin, tensor=weight.name)
        rows, cols = _logical_shape(shape_t)
        words = -(-cols * bits // 32)
        if tuple(weight.shape) != (rows, words):
            raise QuantizationError(f"packed shape {list(weight.shape)} disagrees with weight_shape {[rows, cols]}: "
                                    f"{bits}-bit codes pack into [{rows}, {words}] int32 words",
                                    file=weight.origin, tensor=weight.name)
        gs = int(args["group_size"]) if strategy == "group" else cols
        if cols % gs:
            raise QuantizationError(f"{cols} columns do not split into groups of {gs}", file=weight.origin,
                                    tensor=weight.name)
        if scale.dtype.name not in FLOAT_SCALES or tuple(scale.shape) != (rows, cols // gs):
            raise QuantizationError(f"scales are {scale.dtype.display} {list(scale.shape)}: F32, BF16 or F16 "
                                    f"[{rows}, {cols // gs}] expected (strategy {strategy})", file=scale.origin,
                                    tensor=scale.name)
        parts = {"weight": weight.name, "scale": scale.name}
        zero = f"{module}.weight_zero_point"
        if not symmetric:
            z = tensors.get(zero)
            want = (-(-rows * bits // 32), cols // gs)
            if z is None:
                raise QuantizationError(f"'{zero}' is not in the checkpoint, which config group {group.name} declares "
                                        "asymmetric", file=weight.origin, tensor=weight.name)
            if z.dtype.name != "I32" or tuple(z.shape) != want:
                raise QuantizationError(f"zero points are {z.dtype.display} {list(z.shape)}: I32 {list(want)} "
                                        "expected (packed down the rows)", file=z.origin, tensor=z.name)
            parts["zero"] = zero
        consumed = (shape_t.name, *self.activation_scales(module, group, weight, _Without(tensors, zero)))
        if symmetric and zero in tensors:
            raise QuantizationError(f"'{zero}' is stored, but config group {group.name} declares symmetric weights",
                                    file=weight.origin, tensor=weight.name)
        return QuantizedWeight(f"{module}.weight", (rows, cols), parts, consumed=consumed,
                               info={"bits": bits, "group": gs, "scale_dtype": scale.dtype, "strategy": strategy})

    def check(self, weight: QuantizedWeight, whole: Mapping[str, np.ndarray]) -> None:
        check_scales(scale_values(whole["scale"], weight.info["scale_dtype"]), weight.parts["scale"], None)

    def dequantize(self, weight: QuantizedWeight, band: Band) -> np.ndarray:
        return _band(weight, band, "F32", kernels=False).view(np.float32)


def _logical_shape(t: LazyTensor) -> tuple[int, int]:
    """The [rows, cols] a `weight_shape` tensor holds (16 bytes read at open: the header cannot say it)."""
    if t.dtype.name not in ("I64", "I32") or t.numel != 2:
        raise QuantizationError(f"is {t.dtype.display} {list(t.shape)}: a weight_shape holds two integers",
                                file=t.origin, tensor=t.name)
    values = np.frombuffer(t.data(), dtype=t.dtype.numpy()).tolist()
    if any(v < 1 for v in values):
        raise QuantizationError(f"weight_shape {values} is not a shape", file=t.origin, tensor=t.name)
    return int(values[0]), int(values[1])


_unpacked: list[tuple[np.ndarray, np.ndarray]] = []
"""The last zero points unpacked (the stored array, kept alive so that `is` identifies it, and the
result): every band of a weight gets the same whole array, unpacked once."""


def _zeros(weight: QuantizedWeight, packed: np.ndarray) -> np.ndarray:
    """The stored zero points ([ceil(rows * bits / 32), groups] int32, packed down the rows) as signed
    int8 [rows, groups]."""
    last = _unpacked[-1] if _unpacked else None
    if last is not None and last[0] is packed:
        return last[1]
    bits = weight.info["bits"]
    columns = np.ascontiguousarray(packed.view(np.int32).T).view(np.uint8)
    codes = dq.unpack_codes(columns, bits, weight.shape[0]).T
    zeros = (codes.astype(np.int32) - (1 << (bits - 1))).astype(np.int8)
    _unpacked[:] = [(packed, zeros)]
    return zeros


def _band(weight: QuantizedWeight, band: Band, out: str, *, kernels: bool) -> np.ndarray:
    bits, gs = weight.info["bits"], weight.info["group"]
    mid = weight.info["scale_dtype"].name
    rows = band.stop - band.start
    codes = band.parts["weight"].view(np.uint8)
    zero = band.parts.get("zero")
    zeros = None if zero is None else _zeros(weight, zero)[band.start:band.stop]
    return dq.dequantize_band(codes, dq.Codes("int", bits, 1 << (bits - 1)), rows=rows, row_bytes=codes.shape[1],
                              cols=weight.columns, scales=band.parts["scale"][band.start:band.stop], scale_dtype=mid,
                              block=(1, gs), zeros=zeros, mid=mid, out=out, name=weight.parts["scale"],
                              use_kernels=kernels)


def packed_bits(scheme: Scheme, weight: QuantizedWeight, band: Band, to: DType) -> np.ndarray | None:
    if dq.kernels() is None or to.name not in ("F32", "BF16", "F16"):
        return None
    return _band(weight, band, to.name, kernels=True)


KERNELS["compressed-tensors pack-quantized"] = packed_bits
