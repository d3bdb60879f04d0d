"""What every read of one plan is given: the reader limits (`core.limits`, the command line's `--limit`)
and the storage options of its URLs (a recipe's `storage_options:`), as one value.

A plan is compiled with one `ReadContext`; whatever it opens (its sources, a template, the hashes of
its sources) is given the same. The public `open_file(..., limits=, storage=)` takes the two apart
(`options()`); the readers that need both (a URL's, shards on a store, a DCP checkpoint) take one
`ReadContext` again, and a local file's codec the limits alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.limits import DEFAULT_LIMITS, Limits

if TYPE_CHECKING:  # a local run never imports the remote package
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
