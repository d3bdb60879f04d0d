"""migrator: move neural-network weights between burnpack, SafeTensors and PyTorch files.

The package namespace is lazy so that `migrate --help` does not pay for numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
PRODUCER = "migrator"

if TYPE_CHECKING:
    from .formats import open_file, save, to_bytes
    from .tensor import LazyTensor, from_numpy

_LAZY = {"open_file": "formats", "save": "formats", "to_bytes": "formats",
         "LazyTensor": "tensor", "from_numpy": "tensor"}

__all__ = ["PRODUCER", "LazyTensor", "__version__", "from_numpy", "open_file", "save", "to_bytes"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'migrator' has no attribute {name!r}")
