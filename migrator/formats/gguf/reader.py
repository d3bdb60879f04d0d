"""The GGUF reader: tensors as lazy views, quantized ones dequantized to F32 when read.

Unquantized tensors (F32, F16, BF16, F64, I8..I64) are zero-copy views of the file, as every other
reader's. A quantized tensor is listed as F32 of its shape; its bytes are dequantized when read, a
few MiB at a time when a writer streams it (`chunks`), so converting a Q4_K file never holds more
than one tensor's F32 values. `reader.ggml_type(t)` names the type a tensor is stored in.

GGUF lists dimensions fastest-varying first; tensors here have PyTorch / numpy order (reversed), as
gguf-py's reader and transformers present them. Metadata values are `header.Value`s: strings (what
`inspect` shows, long arrays summarised) that carry their GGUF type and data.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...core import dtypes
from ...core.bytesource import ByteSource
from ...core.dtypes import DType
from ...core.limits import DEFAULT_LIMITS, Limits
from ...core.scalars import Scalar
from ...core.tensor import LazyTensor, stored
from ..base import Reader
from .constants import GGMLType
from .header import Header, TensorInfo, parse_header
from .quants import DEQUANTIZERS

# ggml's unquantized types and migrator's dtypes, both ways
PLAIN: dict[str, DType] = {"F32": dtypes.F32, "F16": dtypes.F16, "BF16": dtypes.BF16, "F64": dtypes.F64,
                           "I8": dtypes.I8, "I16": dtypes.I16, "I32": dtypes.I32, "I64": dtypes.I64}
GGML_OF: dict[str, str] = {dt.name: name for name, dt in PLAIN.items()}
PIECE_BYTES = 8 << 20  # F32 output per streamed piece


class Dequantized:
    """The loader of a quantized tensor: its F32 values, whole (`__call__`) or in pieces (`pieces`)."""

    __slots__ = ("gtype", "length", "numel", "offset", "source")

    def __init__(self, source: ByteSource, offset: int, length: int, gtype: GGMLType, numel: int) -> None:
        self.source, self.offset, self.length, self.gtype, self.numel = source, offset, length, gtype, numel

    def __call__(self) -> memoryview:
        import numpy as np

        out = np.empty(self.numel, dtype=np.float32)
        block_bytes = self._blocks_per_piece() * self.gtype.type_size
        done = 0
        for start in range(0, self.length, block_bytes):
            raw = self.source.read(self.offset + start, min(block_bytes, self.length - start), "tensor data")
            values = _dequantize(raw, self.gtype, out[done:])
            done += len(values)
        return out.view(np.uint8).data

    def over(self, source: ByteSource) -> Dequantized:
        """This loader reading the same range of `source`: the same file reached another way (a split model's
        reader hands each shard's tensors its own descriptors), so a writer still sees blocks it may copy."""
        return Dequantized(source, self.offset, self.length, self.gtype, self.numel)

    def pieces(self) -> Iterator[memoryview]:
        block_bytes = self._blocks_per_piece() * self.gtype.type_size
        for start in range(0, self.length, block_bytes):
            raw = self.source.read(self.offset + start, min(block_bytes, self.length - start), "tensor data")
            yield _dequantize(raw, self.gtype).view("uint8").data

    def _blocks_per_piece(self) -> int:
        return max(1, PIECE_BYTES // (4 * self.gtype.block_size))


def _dequantize(raw: bytes, gtype: GGMLType, out: Any = None) -> Any:
    from .quants import dequantize

    n = len(raw) // gtype.type_size * gtype.block_size
    return dequantize(raw, gtype, None if out is None else out[:n])


class GGUFReader(Reader):
    """A validated GGUF header; tensors in the file's tensor-info order."""

    format = "gguf"

    def __init__(self, source: ByteSource, *, limits: Limits = DEFAULT_LIMITS) -> None:
        self.source = source
        self.limits = limits
        self.header: Header = parse_header(source, limits)
        self.metadata: dict[str, str] = dict(self.header.metadata)  # Values are strs that keep their type
        self.scalars: dict[str, Scalar] = {}
        self.tensors = [self._tensor(info) for info in self.header.tensors]

    def _tensor(self, info: TensorInfo) -> LazyTensor:
        offset = self.header.data_start + info.offset
        plain = PLAIN.get(info.gtype.name)
        if plain is not None:
            return stored(info.name, plain, info.shape, self.source, offset, info.nbytes)
        if info.gtype.name not in DEQUANTIZERS:
            from ...core.errors import UnsupportedDTypeError

            raise UnsupportedDTypeError(f"ggml type {info.gtype.name} is not read", file=self.label, tensor=info.name)
        loader = Dequantized(self.source, offset, info.nbytes, info.gtype, info.numel)
        return LazyTensor(info.name, dtypes.F32, info.shape, 4 * info.numel, loader, None, None, self.label,
                          loader.pieces)

    def ggml_type(self, tensor: LazyTensor) -> str:
        """The ggml type `tensor` is stored as (its dtype's name for unquantized tensors)."""
        loader = tensor.loader
        if isinstance(loader, Dequantized):
            return loader.gtype.name
        return GGML_OF.get(tensor.dtype.name, tensor.dtype.name)

    def extra(self) -> dict[str, Any]:
        h = self.header
        counts: dict[str, int] = {}
        for info in h.tensors:
            counts[info.gtype.name] = counts.get(info.gtype.name, 0) + 1
        types = {k: v.type.name + (f"[{v.item_type.name}] x {len(v.data)}" if v.item_type is not None else "")
                 for k, v in h.metadata.items()}  # the metadata's own text does not say UINT32 from INT64
        return {"version": h.version, "alignment": h.alignment, "data_start": h.data_start, "ggml_types": counts,
                "metadata_types": types}
