"""One dtype model for burnpack, SafeTensors and PyTorch.

Each format spells types differently and supports a different subset; converting through one
canonical `DType` lets a writer reject what it cannot hold before a byte is written.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from .errors import UnsupportedDTypeError

if TYPE_CHECKING:  # numpy is imported on first use: a pass-through copy never needs it
    import numpy as np


class Kind(enum.Enum):
    FLOAT = "float"
    INT = "int"
    UINT = "uint"
    BOOL = "bool"
    COMPLEX = "complex"
    QUANTIZED = "quantized"


@dataclass(frozen=True, eq=False)
class DType:
    """A tensor element type.

    `bits` is None only for opaque packed types (burnpack QFloat), whose byte length is not a
    function of the shape. `scheme` holds QFloat's scheme as canonical CBOR bytes so that it
    survives burnpack -> burnpack byte for byte.
    """

    name: str
    bits: int | None
    kind: Kind
    safetensors: str | None = None
    numpy_name: str | None = None
    torch_name: str | None = None
    burn_text: str | None = None
    scheme: bytes | None = None

    def __repr__(self) -> str:
        return self.display

    # Hand-written: the generated ones build 8-field tuples, and 100k-tensor plans compare and hash
    # dtypes several times per tensor. Same semantics: equal when every field is equal.
    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, DType):
            return NotImplemented
        return self.name == other.name and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash((self.name, self.scheme))

    def _fields(self) -> tuple[object, ...]:
        return (self.name, self.bits, self.kind, self.safetensors, self.numpy_name, self.torch_name,
                self.burn_text, self.scheme)

    @property
    def display(self) -> str:
        """SafeTensors' spelling where it has the type, else Burn's."""
        if self.safetensors:
            return self.safetensors
        if self.name == "BOOL_U8":
            return "Bool(U8)"
        if self.name == "BOOL_U32":
            return "Bool(U32)"
        return self.burn_text or self.name

    @property
    def is_float(self) -> bool:
        return self.kind is Kind.FLOAT

    @property
    def itemsize(self) -> int | None:
        """Bytes per element for byte-aligned types; None for sub-byte and opaque ones."""
        if self.bits is None or self.bits % 8:
            return None
        return self.bits // 8

    def nbytes(self, shape: tuple[int, ...]) -> int | None:
        """Bytes a tensor of `shape` takes, None where the type is opaque or not byte-aligned."""
        if self.bits is None:
            return None
        numel = 1
        for d in shape:
            numel *= d
        total_bits = numel * self.bits
        if total_bits % 8:
            return None
        return total_bits // 8

    def numpy(self) -> np.dtype:
        """The numpy dtype viewing this type's little-endian bytes (bf16/fp8 via ml_dtypes)."""
        if self.numpy_name is None:
            raise UnsupportedDTypeError(f"dtype {self.display} has no numpy equivalent")
        return _numpy_dtype(self.numpy_name)


@cache
def _numpy_dtype(name: str) -> np.dtype:
    import numpy as np

    if name in _NUMPY_NATIVE:
        return np.dtype(name).newbyteorder("<")
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


_NUMPY_NATIVE = frozenset({"float64", "float32", "float16", "int64", "int32", "int16", "int8",
                           "uint64", "uint32", "uint16", "uint8", "bool", "complex64"})


def _d(name: str, bits: int | None, kind: Kind, st: str | None, np_name: str | None,
       torch: str | None, burn: str | None) -> DType:
    return DType(name, bits, kind, st, np_name, torch, burn)


F, I, U, B, C = Kind.FLOAT, Kind.INT, Kind.UINT, Kind.BOOL, Kind.COMPLEX  # noqa: E741

# name, bits, kind, SafeTensors, numpy/ml_dtypes, torch, burnpack text
F64 = _d("F64", 64, F, "F64", "float64", "float64", "F64")
F32 = _d("F32", 32, F, "F32", "float32", "float32", "F32")
FLEX32 = _d("FLEX32", 32, F, None, "float32", None, "Flex32")
F16 = _d("F16", 16, F, "F16", "float16", "float16", "F16")
BF16 = _d("BF16", 16, F, "BF16", "bfloat16", "bfloat16", "BF16")
F8_E4M3 = _d("F8_E4M3", 8, F, "F8_E4M3", "float8_e4m3fn", "float8_e4m3fn", None)
F8_E5M2 = _d("F8_E5M2", 8, F, "F8_E5M2", "float8_e5m2", "float8_e5m2", None)
F8_E8M0 = _d("F8_E8M0", 8, F, "F8_E8M0", "float8_e8m0fnu", "float8_e8m0fnu", None)
F8_E4M3FNUZ = _d("F8_E4M3FNUZ", 8, F, None, "float8_e4m3fnuz", "float8_e4m3fnuz", None)
F8_E5M2FNUZ = _d("F8_E5M2FNUZ", 8, F, None, "float8_e5m2fnuz", "float8_e5m2fnuz", None)
F6_E2M3 = _d("F6_E2M3", 6, F, "F6_E2M3", None, None, None)
F6_E3M2 = _d("F6_E3M2", 6, F, "F6_E3M2", None, None, None)
F4 = _d("F4", 4, F, "F4", None, None, None)
I64 = _d("I64", 64, I, "I64", "int64", "int64", "I64")
I32 = _d("I32", 32, I, "I32", "int32", "int32", "I32")
I16 = _d("I16", 16, I, "I16", "int16", "int16", "I16")
I8 = _d("I8", 8, I, "I8", "int8", "int8", "I8")
U64 = _d("U64", 64, U, "U64", "uint64", "uint64", "U64")
U32 = _d("U32", 32, U, "U32", "uint32", "uint32", "U32")
U16 = _d("U16", 16, U, "U16", "uint16", "uint16", "U16")
U8 = _d("U8", 8, U, "U8", "uint8", "uint8", "U8")
BOOL = _d("BOOL", 8, B, "BOOL", "bool", "bool", None)  # Burn: Bool(Native)
BOOL_U8 = _d("BOOL_U8", 8, B, None, "uint8", None, None)  # Burn: Bool(U8), values 0/1
BOOL_U32 = _d("BOOL_U32", 32, B, None, "uint32", None, None)  # Burn: Bool(U32), values 0/1
C64 = _d("C64", 64, C, "C64", "complex64", "complex64", None)


def qfloat(scheme_cbor: bytes) -> DType:
    """Burn's quantized float; opaque bytes whose scheme is kept as canonical CBOR."""
    return DType("QFLOAT", None, Kind.QUANTIZED, None, None, None, "QFloat", scheme_cbor)


ALL: tuple[DType, ...] = (
    F64, F32, FLEX32, F16, BF16, F8_E4M3, F8_E5M2, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
    F6_E2M3, F6_E3M2, F4, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, BOOL_U8, BOOL_U32, C64,
)

BY_NAME: dict[str, DType] = {d.name: d for d in ALL}
BY_SAFETENSORS: dict[str, DType] = {d.safetensors: d for d in ALL if d.safetensors}
BY_TORCH: dict[str, DType] = {d.torch_name: d for d in ALL if d.torch_name}
BY_BURN_TEXT: dict[str, DType] = {d.burn_text: d for d in ALL if d.burn_text}
BURN_BOOL_STORES: dict[str, DType] = {"Native": BOOL, "U8": BOOL_U8, "U32": BOOL_U32}
FLOAT_DTYPES: tuple[DType, ...] = tuple(d for d in ALL if d.is_float)


def parse(spelling: str) -> DType:
    """Parse a user-facing spelling: canonical, SafeTensors, Burn or torch names (case-insensitive)."""
    s = spelling.strip()
    key = s.upper()
    if key in BY_NAME:
        return BY_NAME[key]
    for table in (BY_SAFETENSORS, BY_BURN_TEXT):
        if s in table:
            return table[s]
    lowered = s.lower().removeprefix("torch.")
    if lowered in BY_TORCH:
        return BY_TORCH[lowered]
    # the spellings people type: FP16/FP32 (PEFT, mergekit, llama.cpp docs), float16 with any case
    aliases = {"FLOAT": F32, "HALF": F16, "DOUBLE": F64, "BFLOAT16": BF16, "FLEX32": FLEX32,
               "FP16": F16, "FP32": F32, "FP64": F64, "BF16": BF16, "FLOAT16": F16, "FLOAT32": F32, "FLOAT64": F64,
               "BOOL(NATIVE)": BOOL, "BOOL(U8)": BOOL_U8, "BOOL(U32)": BOOL_U32}
    if key in aliases:
        return aliases[key]
    known = ", ".join(sorted({d.display for d in ALL}))
    raise UnsupportedDTypeError(f"unknown dtype '{spelling}' (known: {known})")


def from_numpy(dtype: np.dtype) -> DType:
    """Canonical dtype of a numpy array (bf16/fp8 through ml_dtypes)."""
    import numpy as np

    dt = np.dtype(dtype)
    if dt.byteorder == ">":
        raise UnsupportedDTypeError(f"big-endian numpy dtype {dt} (convert to little-endian first)")
    name = dt.name
    for d in ALL:
        if d.numpy_name == name and d.name not in {"FLEX32", "BOOL_U8", "BOOL_U32"}:
            return d
    raise UnsupportedDTypeError(f"numpy dtype {dt} has no migrator equivalent")
