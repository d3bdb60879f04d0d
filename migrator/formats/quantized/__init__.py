"""Quantized checkpoints: the schemes a model folder's `config.json` may declare, one module each.

`scheme.py` says what a scheme is (`Scheme`, registered by defining it) and what it yields
(`QuantizedWeight`, `Band`); `declared.py` reads a config into its scheme (`scheme_of`) and holds the
name rules of the declarations; `blocks.py` the arithmetic block-scaled schemes share. The reader that
presents a quantized folder, stored or dequantized, is `files/quantized.py`.

The schemes register in the order of `SCHEME_MODULES`: a new one is a module here, added to that list.
"""

from __future__ import annotations

from importlib import import_module

from .declared import scheme_of
from .scheme import KERNELS, SCHEMES, Band, QuantizationError, QuantizedWeight, Scheme

SCHEME_MODULES = ("fp8", "compressed", "packed", "mxfp4", "mlx", "compiled")
"""The built-in schemes' modules, imported (and so registered) with this package (`compiled` plugs the
compiled band loops into the FP8 schemes)."""

for _name in SCHEME_MODULES:
    import_module(f"{__name__}.{_name}")

__all__ = ["KERNELS", "SCHEMES", "SCHEME_MODULES", "Band", "QuantizationError", "QuantizedWeight", "Scheme",
           "scheme_of"]
