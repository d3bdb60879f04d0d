"""migrator: move neural-network weights between burnpack, SafeTensors and PyTorch files.

Public API (each name is imported on first use, so `import migrator` and `migrate --help` do
not pay for numpy):

- `open_file(path)`: a reader of a burnpack, SafeTensors or PyTorch file (`r["w"].numpy()`).
- `save(tensors, path, metadata=..., scalars=...)`, `to_bytes(tensors, fmt, ...)`: write tensors.
- `from_numpy(name, array)`: a `LazyTensor` from a numpy array.
- `LazyTensor`: a tensor read on demand; `Scalar`: a typed scalar (burnpack's scalars).
- `ApplyReport`: the report of a run (`ApplyReport.from_json` loads a `--report` file).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
PRODUCER = "migrator"

if TYPE_CHECKING:
    from .formats import open_file, save, to_bytes
    from .report import ApplyReport
    from .scalars import Scalar
    from .tensor import LazyTensor, from_numpy

_LAZY = {"open_file": "formats", "save": "formats", "to_bytes": "formats",
         "LazyTensor": "tensor", "from_numpy": "tensor", "Scalar": "scalars", "ApplyReport": "report"}

__all__ = ["PRODUCER", "ApplyReport", "LazyTensor", "Scalar", "__version__", "from_numpy", "open_file", "save",
           "to_bytes"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'migrator' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
