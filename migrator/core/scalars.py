"""Burnpack's typed scalars (Int, UInt, Float, Bool) with Burn's conversion rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ScalarKind = Literal["Int", "UInt", "Float", "Bool"]
SCALAR_KINDS: tuple[ScalarKind, ...] = ("Int", "UInt", "Float", "Bool")

_I64 = (-(2**63), 2**63 - 1)
_U64 = (0, 2**64 - 1)


@dataclass(frozen=True)
class Scalar:
    """One typed scalar; `kind` is Burn's variant name, so the CBOR tag is exactly this string."""

    kind: ScalarKind
    value: int | float | bool

    def __post_init__(self) -> None:
        v = self.value
        if self.kind == "Bool":
            ok = isinstance(v, bool)
        elif self.kind == "Float":
            ok = isinstance(v, float)
        else:
            lo, hi = _I64 if self.kind == "Int" else _U64
            ok = isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
        if not ok:
            raise ValueError(f"invalid {self.kind} scalar value {v!r}")

    @classmethod
    def of(cls, value: int | float | bool) -> Scalar:
        """Pick the variant Burn would: bool -> Bool, float -> Float, int -> Int (UInt if > i64)."""
        if isinstance(value, bool):
            return cls("Bool", value)
        if isinstance(value, float):
            return cls("Float", value)
        if isinstance(value, int):
            return cls("Int", value) if value <= _I64[1] else cls("UInt", value)
        raise TypeError(f"not a scalar: {value!r}")

    def as_int(self, lo: int = _I64[0], hi: int = _I64[1]) -> int:
        """Integer view, range-checked like Burn's conversions (Float and Bool are refused)."""
        if self.kind not in ("Int", "UInt"):
            raise TypeError(f"{self.kind} scalar cannot be read as an integer")
        assert isinstance(self.value, int)
        if not lo <= self.value <= hi:
            raise OverflowError(f"{self.value} does not fit in [{lo}, {hi}]")
        return self.value

    def as_float(self) -> float:
        if self.kind == "Bool":
            raise TypeError("Bool scalar cannot be read as a float")
        return float(self.value)

    def as_bool(self) -> bool:
        if self.kind != "Bool":
            raise TypeError(f"{self.kind} scalar cannot be read as a bool")
        return bool(self.value)

    def to_json(self) -> dict[str, int | float | bool | str]:
        v = self.value
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            return {self.kind: repr(v)}
        return {self.kind: v}
