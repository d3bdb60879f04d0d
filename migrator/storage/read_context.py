"""What every read of one plan is given: the reader limits (`core.limits`, the command line's `--limit`)
and the storage options of its URLs (a recipe's `storage_options:`), as one value.

A plan is compiled with one `ReadContext`; whatever it opens (its sources, a template, the hashes of
its sources) is given the same. Below `plan/` the codecs still take the two apart (`open_file(...,
limits=, storage=)`): `options()` is that seam.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.limits import DEFAULT_LIMITS, Limits
from .remote.options import StorageOptions


@dataclass(frozen=True)
class ReadContext:
    limits: Limits = DEFAULT_LIMITS
    storage: StorageOptions | None = None

    def options(self) -> dict[str, Any]:
        """`open_file`'s keywords for this context."""
        return {"limits": self.limits, "storage": self.storage}


DEFAULT_READ = ReadContext()
"""Default limits, no storage options (local paths, or URLs with the fsspec defaults)."""
