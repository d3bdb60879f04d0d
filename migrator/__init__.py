"""migrator: move neural-network weights between burnpack, SafeTensors and PyTorch files."""

from __future__ import annotations

__version__ = "0.1.0"
PRODUCER = "migrator"

from .formats import open_file, save, to_bytes  # noqa: E402
from .tensor import LazyTensor, from_numpy  # noqa: E402

__all__ = ["PRODUCER", "LazyTensor", "__version__", "from_numpy", "open_file", "save", "to_bytes"]
