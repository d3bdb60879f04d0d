"""PyTorch checkpoints (`torch.save`): zip (torch >= 1.6), legacy (pre-1.6 stream) and old tar.

The pickle is read by `formats.safepickle` (no code from the file ever runs); storages are located in
the container without copying, and each tensor becomes a lazy view that honours the storage
offset and strides torch recorded, so values equal `torch.load`'s exactly:

* a C-contiguous tensor is a zero-copy window on the file (`tensor.stored`, kernel-copyable);
* a strided view (transposed, sliced with steps, expanded) gathers its elements with numpy
  `as_strided` over only its own storage window when materialised;
* big-endian zip checkpoints (`byteorder` = big) are byte-swapped when materialised; legacy and tar
  files from big-endian machines are refused, since their data order depends on the torch version.

Unsupported dtypes (complex128, quantized, sparse, ...) raise `UnsupportedDTypeError` at open
naming the tensor, but only for tensors inside the selection (`top_level_key`), so a checkpoint
can still be read for the parts that are supported. Its bounds are `migrator.core.limits.Limits`
fields (`max_pickle_bytes`, `max_zip_entries`, `max_nodes`, ...), read from the reader's `limits`.
"""

from __future__ import annotations

from .legacy import LEGACY_MAGIC, LEGACY_PROTOCOL_VERSION
from .reader import PytorchReader

__all__ = ["LEGACY_MAGIC", "LEGACY_PROTOCOL_VERSION", "PytorchReader"]
