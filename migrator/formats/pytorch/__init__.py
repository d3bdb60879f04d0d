"""PyTorch checkpoints (`torch.save`): zip (torch >= 1.6), legacy (pre-1.6 stream) and old tar.

The pickle is read by `migrator.safepickle` (no code from the file ever runs); storages are located
in the container without copying, and each tensor becomes a lazy view that honours the storage
offset and strides torch recorded, so values equal `torch.load`'s exactly:

* a C-contiguous tensor is a zero-copy window on the file (`tensor.stored`, kernel-copyable);
* a strided view (transposed, sliced with steps, expanded) gathers its elements with numpy
  `as_strided` over only its own storage window when materialised;
* big-endian zip checkpoints (`byteorder` = big) are byte-swapped when materialised; legacy and tar
  files from big-endian machines are refused, since their data order depends on the torch version.

Unsupported dtypes (complex128, quantized, sparse, ...) raise `UnsupportedDTypeError` at open
naming the tensor, but only for tensors inside the selection (`top_level_key`), so a checkpoint
can still be read for the parts that are supported.
"""

from __future__ import annotations

# The documented limits (SECURITY.md): module attributes, read when a file is opened, so that
# `pytorch.MAX_NODES = ...` moves them. Defined before the submodules are imported.
MAX_PICKLE_BYTES = 1 << 30  # a data.pkl larger than this is not a state_dict
MAX_ZIP_ENTRIES = 1_000_000
MAX_ZIP_DIRECTORY = 256 << 20
MAX_SMALL_RECORD = 1 << 20  # byteorder, version, sys_info
MAX_TAR_MEMBERS = 100_000
MAX_NODES = 1_000_000  # values visited while flattening (Burn's memo-bomb bound)
MAX_DEPTH = 1_000  # nesting of dicts/lists while flattening
MAX_EXPANDED_BYTES = 1 << 30  # a broadcast view may materialise to at most this (or its window)

from .legacy import LEGACY_MAGIC, LEGACY_PROTOCOL_VERSION  # noqa: E402
from .reader import PytorchReader  # noqa: E402

__all__ = [
    "LEGACY_MAGIC", "LEGACY_PROTOCOL_VERSION", "MAX_DEPTH", "MAX_EXPANDED_BYTES", "MAX_NODES", "MAX_PICKLE_BYTES",
    "MAX_SMALL_RECORD", "MAX_TAR_MEMBERS", "MAX_ZIP_DIRECTORY", "MAX_ZIP_ENTRIES", "PytorchReader",
]
