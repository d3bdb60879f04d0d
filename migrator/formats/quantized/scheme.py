"""What a quantization scheme is, and the registry of them.

A scheme is a subclass of `Scheme` given its registry name (`class FineGrainedFP8(Scheme, name="fp8")`):
defining it registers it in `SCHEMES`. A model folder's `config.json` declares its scheme
(`declared.scheme_of`); the scheme then says, from the stored tensors' headers alone, which of them
make each quantized weight (`weights`: a `QuantizedWeight` per module, naming the stored tensors it
consumes by role, the logical name, shape it yields) and refuses what contradicts the declaration.
Its `dequantize` computes a band of the logical tensor's rows (numpy, exact); `band_bits` turns that
band into the output dtype's bit patterns, and is where a compiled kernel giving the same bits takes
over (`kernel_for`).

Nothing here reads a byte by itself: the reader over a model folder (`files/quantized.py`) reads the
parts a band needs and hands them to the scheme as arrays (`Band`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ...core.dtypes import DType
from ...core.errors import FormatError

if TYPE_CHECKING:
    import numpy as np

    from ...core.tensor import LazyTensor


class QuantizationError(FormatError):
    """A quantized checkpoint that contradicts its `quantization_config`, or a config migrator cannot
    read: exit 1, naming the file and the tensor or key."""


SCHEMES: dict[str, type[Scheme]] = {}
"""Every scheme by its registry name, in the order they were defined."""


@dataclass(frozen=True)
class QuantizedWeight:
    """One module's quantized weight: the stored tensors it is made of and the tensor it stands for.

    `parts`: role -> stored tensor name (e.g. {"weight": "m.weight", "scale": "m.weight_scale_inv"});
    `banded`: the roles read a band of rows at a time (each holds the same number of bytes per logical
    row); the other roles are read whole (scales: small), once per written tensor. `consumed`: stored
    tensors the weight takes that dequantizing does not need (a static activation's `input_scale`),
    left out of a dequantized source with the parts. `info`: what the scheme keeps per weight (its
    block size, the scale's role...)."""

    name: str
    shape: tuple[int, ...]
    parts: Mapping[str, str]
    banded: frozenset[str] = frozenset({"weight"})
    consumed: tuple[str, ...] = ()
    info: Mapping[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        """The logical tensor's rows: every dimension but the last, flattened."""
        return math.prod(self.shape[:-1]) if len(self.shape) > 1 else 1

    @property
    def columns(self) -> int:
        return self.shape[-1] if self.shape else 1

    def stored(self) -> list[str]:
        """Every stored tensor this weight takes: its parts, then what it consumes besides."""
        return [*self.parts.values(), *self.consumed]


@dataclass
class Band:
    """Rows [start, stop) of a quantized weight's logical tensor, with what computing them needs:
    `parts` has each banded role's rows of the band (as a 2-D array of its stored dtype: one row per
    logical row) and each whole role's full array (its stored shape)."""

    start: int
    stop: int
    parts: dict[str, np.ndarray]


Kernel = Callable[["Scheme", QuantizedWeight, Band, DType], "np.ndarray | None"]
"""A compiled dequantizer: the band's output bits, or None when it does not take this case (the numpy
path then does). It must give the same bits as the numpy path."""

KERNELS: dict[str, Kernel] = {}
"""Compiled dequantizers by scheme name (set by the module that loads them)."""


class Scheme(ABC):
    """A quantization scheme, parsed from one `quantization_config` (see the module docstring)."""

    name: ClassVar[str]
    """The registry name, also what `inspect` shows."""
    method: ClassVar[str]
    """The `quant_method` it is declared by (`fp8`, `compressed-tensors`, ...)."""
    formats: ClassVar[tuple[str, ...]] = ()
    """For compressed-tensors: the `format` values it reads (`float-quantized`, ...)."""
    config_key: ClassVar[str] = "quantization_config"
    """The config.json key that declares it (MLX's is `quantization`)."""

    def __init_subclass__(cls, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if name is None:
            return
        if name in SCHEMES:
            raise TypeError(f"quantization scheme '{name}' is defined twice ({SCHEMES[name].__module__}, "
                            f"{cls.__module__})")
        cls.name = name
        SCHEMES[name] = cls

    def __init__(self, config: Mapping[str, Any], file: str) -> None:
        self.config = config
        self.file = file

    @classmethod
    @abstractmethod
    def parse(cls, config: Mapping[str, Any], file: str) -> Scheme:
        """The scheme `config` (the `quantization_config` object) declares; `QuantizationError` naming
        the key for a value it cannot read."""

    @abstractmethod
    def describe(self) -> str:
        """One line: the scheme and its parameters (block size, strategy...)."""

    @abstractmethod
    def weights(self, tensors: Mapping[str, LazyTensor]) -> list[QuantizedWeight]:
        """The quantized weights the stored `tensors` hold, in their order, each checked against the
        declaration from the headers (dtypes, shapes, every part present); a stored tensor the scheme
        would consume but that belongs to no quantized weight, or a quantized tensor without its scale,
        is a `QuantizationError` naming it."""

    @abstractmethod
    def dequantize(self, weight: QuantizedWeight, band: Band) -> np.ndarray:
        """The band's values as float32, shape (stop - start, columns), rounded as the reference
        implementation rounds them before its final cast."""

    def check(self, weight: QuantizedWeight, whole: Mapping[str, np.ndarray]) -> None:  # noqa: B027 - optional
        """Refuse values no dequantization should run on (NaN, infinite or zero scales...), given the
        whole-read parts, before any band of `weight` is computed."""

    def row_step(self, weight: QuantizedWeight) -> int:
        """Bands start on multiples of this many rows (a block's height: each band takes whole scale rows)."""
        return 1

    def skipped(self) -> Sequence[str]:
        """The patterns of the modules the config leaves unquantized (`modules_to_not_convert`, `ignore`)."""
        return ()

    def band_bits(self, weight: QuantizedWeight, band: Band, to: DType) -> np.ndarray:
        """The band in `to`'s bit patterns (a compiled kernel's when one takes it, else numpy's)."""
        kernel = KERNELS.get(self.name)
        if kernel is not None:
            out = kernel(self, weight, band, to)
            if out is not None:
                return out
        from ...core.casts import from_f32

        return from_f32(self.dequantize(weight, band), to)
