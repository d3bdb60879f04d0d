"""The GGUF format as data: ggml tensor types with their block geometry, metadata value types, bounds.

GGUF (llama.cpp's file format, version 2 and 3): the magic `GGUF`, a u32 version, u64 tensor and
key/value counts, the key/values, one info record per tensor (name, dims, ggml type, data offset),
padding to `general.alignment` (default 32), then the tensor data. Everything is little-endian.

A ggml type stores `block_size` elements in `type_size` bytes; the unquantized types are blocks of
one element. Numbers are the format's (ggml.h / ggml-common.h), written here from the format itself.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"
MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses a tensor of more dimensions
MAX_ARRAY_DEPTH = 4  # arrays of arrays: llama.cpp reads none; gguf-py reads any. Deeper is refused.
QK_K = 256  # the super-block of the K-quants, IQ and TQ types


@dataclass(frozen=True)
class GGMLType:
    """One ggml tensor type: its number in the file, elements per block and bytes per block."""

    name: str
    code: int
    block_size: int
    type_size: int
    numpy_name: str | None = None  # unquantized types: the numpy dtype of their elements

    @property
    def quantized(self) -> bool:
        return self.numpy_name is None

    def nbytes(self, numel: int) -> int:
        """Bytes of `numel` elements (a multiple of the block size)."""
        return numel // self.block_size * self.type_size


_TYPES = (
    GGMLType("F32", 0, 1, 4, "float32"),
    GGMLType("F16", 1, 1, 2, "float16"),
    GGMLType("Q4_0", 2, 32, 18),
    GGMLType("Q4_1", 3, 32, 20),
    GGMLType("Q5_0", 6, 32, 22),
    GGMLType("Q5_1", 7, 32, 24),
    GGMLType("Q8_0", 8, 32, 34),
    GGMLType("Q8_1", 9, 32, 40),
    GGMLType("Q2_K", 10, QK_K, 84),
    GGMLType("Q3_K", 11, QK_K, 110),
    GGMLType("Q4_K", 12, QK_K, 144),
    GGMLType("Q5_K", 13, QK_K, 176),
    GGMLType("Q6_K", 14, QK_K, 210),
    GGMLType("Q8_K", 15, QK_K, 292),
    GGMLType("IQ2_XXS", 16, QK_K, 66),
    GGMLType("IQ2_XS", 17, QK_K, 74),
    GGMLType("IQ3_XXS", 18, QK_K, 98),
    GGMLType("IQ1_S", 19, QK_K, 50),
    GGMLType("IQ4_NL", 20, 32, 18),
    GGMLType("IQ3_S", 21, QK_K, 110),
    GGMLType("IQ2_S", 22, QK_K, 82),
    GGMLType("IQ4_XS", 23, QK_K, 136),
    GGMLType("I8", 24, 1, 1, "int8"),
    GGMLType("I16", 25, 1, 2, "int16"),
    GGMLType("I32", 26, 1, 4, "int32"),
    GGMLType("I64", 27, 1, 8, "int64"),
    GGMLType("F64", 28, 1, 8, "float64"),
    GGMLType("IQ1_M", 29, QK_K, 56),
    GGMLType("BF16", 30, 1, 2, "bfloat16"),
    GGMLType("TQ1_0", 34, QK_K, 54),
    GGMLType("TQ2_0", 35, QK_K, 66),
    GGMLType("MXFP4", 39, 32, 17),
    GGMLType("NVFP4", 40, 64, 36),
)
BY_CODE: dict[int, GGMLType] = {t.code: t for t in _TYPES}
BY_NAME: dict[str, GGMLType] = {t.name: t for t in _TYPES}
# Types ggml only uses inside its dot products (no file of llama.cpp's holds them): listed, not read.
INTERNAL_TYPES = frozenset({"Q8_1", "Q8_K"})


class ValueType(enum.IntEnum):
    """The type tag of a metadata value (gguf_type)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Fixed-size value types: struct format (little-endian) and numpy dtype.
SCALAR_FORMATS: dict[ValueType, tuple[str, str]] = {
    ValueType.UINT8: ("<B", "<u1"), ValueType.INT8: ("<b", "<i1"),
    ValueType.UINT16: ("<H", "<u2"), ValueType.INT16: ("<h", "<i2"),
    ValueType.UINT32: ("<I", "<u4"), ValueType.INT32: ("<i", "<i4"),
    ValueType.FLOAT32: ("<f", "<f4"), ValueType.BOOL: ("<?", "<u1"),
    ValueType.UINT64: ("<Q", "<u8"), ValueType.INT64: ("<q", "<i8"),
    ValueType.FLOAT64: ("<d", "<f8"),
}

# The file type llama.cpp records in `general.file_type` (llama_ftype) for a file whose weights are
# mostly of one ggml type.
# A file of one K-quant throughout gets the number of its _S mix, the closest llama.cpp has (Q2_K's
# own for Q2_K, Q3_K_S for Q3_K); formats/gguf/mixes.py has the _M/_S mixes' own.
FILE_TYPES: dict[str, int] = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9,
                              "Q2_K": 10, "Q3_K": 11, "Q4_K": 14, "Q5_K": 16, "Q6_K": 18, "BF16": 32}
QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION
