"""DCP written with the Hugging Face storage layout: one SafeTensors file per rank and shard, each
tensor a chunk placed by its `saved_offsets`, as one checkpoint of global tensors.

torch's `HuggingFaceStorageWriter(save_distributed=True)` writes, per rank R and output file F of N,
`shard-0000R-model-0000F-of-0000N.safetensors` (in the folder, or its `sharded/` subfolder when it
consolidates too) and no `.metadata`: each file's SafeTensors metadata `DCP_SHARDING_INFO` (JSON)
gives every tensor's offsets in the global tensor, whose shape is where the chunks end. The chunks
are joined as a DCP checkpoint's are (`formats.dcp.assemble`: checked to tile the tensor, rows
streamed). Without sharding info a tensor is whole in its file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.errors import FormatError, LimitExceededError
from ..core.limits import DEFAULT_LIMITS, Limits
from ..core.reopening import reopening
from ..formats.base import Reader
from ..formats.bounded_json import load_bounded_json
from ..formats.dcp.assemble import Piece, assemble
from .ranks import RanksReader
from .single import reader_over

SHARDING_KEY = "DCP_SHARDING_INFO"
OFFSETS_KEY = "saved_offsets"


def _offsets(reader: Reader, label: str, limits: Limits) -> dict[str, tuple[int, ...]]:
    raw = reader.metadata.get(SHARDING_KEY)
    if raw is None:
        return {}
    info = load_bounded_json(raw.encode("utf-8", "surrogatepass"), limits, label, SHARDING_KEY)
    if not isinstance(info, dict):
        raise FormatError(f"{SHARDING_KEY} is not a JSON object", file=label)
    out: dict[str, tuple[int, ...]] = {}
    for name, entry in info.items():
        offsets = entry.get(OFFSETS_KEY) if isinstance(entry, dict) else None
        if not isinstance(offsets, list) or not all(type(o) is int and o >= 0 for o in offsets):
            raise FormatError(f"{SHARDING_KEY}: {OFFSETS_KEY} of '{name}' is not a list of indices", file=label,
                              tensor=str(name))
        if any(o >= 1 << 63 for o in offsets):  # torch's int64: and no message prints thousands of digits
            raise FormatError(f"{SHARDING_KEY}: {OFFSETS_KEY} of '{name}' holds an offset beyond 2^63", file=label,
                              tensor=str(name))
        out[str(name)] = tuple(offsets)
    return out


class DcpSafetensorsReader(RanksReader):
    """Every rank's SafeTensors shard as one checkpoint of global tensors, named by their keys."""

    format = "dcp"

    def __init__(self, files: Sequence[Path], *, limits: Limits = DEFAULT_LIMITS) -> None:
        if len(files) > limits.max_shards:
            raise LimitExceededError(f"{len(files)} shard files, over the {limits.max_shards} limit (max_shards)",
                                     file=str(files[0].parent))
        super().__init__(files, limits=limits)

    def _open_rank(self, f: Path) -> Reader:
        return reader_over(reopening(f, self.fds), f, "safetensors", self.limits, {})

    def _adopt(self, first: Reader) -> None:
        pass  # each file's metadata is its own sharding info, not the checkpoint's

    def _join(self, label: str) -> None:
        pieces: dict[str, list[Piece]] = {}
        for f, r in zip(self.files, self.readers, strict=True):
            placed = _offsets(r, str(f), self.limits)
            for t in r.tensors:
                offsets = placed.get(t.name, (0,) * len(t.shape))
                if len(offsets) != len(t.shape):
                    raise FormatError(f"{OFFSETS_KEY} {list(offsets)} for a tensor of {len(t.shape)} dimensions",
                                      file=str(f), tensor=t.name)
                pieces.setdefault(t.name, []).append(Piece(offsets, tuple(t.shape), str(f), t))
        for name, chunks in pieces.items():
            first = chunks[0].tensor
            if any(p.tensor.dtype is not first.dtype for p in chunks):
                odd = next(p for p in chunks if p.tensor.dtype is not first.dtype)
                raise FormatError(f"chunks of different dtypes: {first.dtype.display} in {chunks[0].file}, "
                                  f"{odd.tensor.dtype.display} in {odd.file}", file=label, tensor=name)
            if any(len(p.offsets) != len(first.shape) for p in chunks):
                raise FormatError("chunks of different ranks (numbers of dimensions)", file=label, tensor=name)
            shape = tuple(max(p.offsets[d] + p.sizes[d] for p in chunks) for d in range(len(first.shape)))
            self.tensors.append(assemble(name, first.dtype, shape, chunks, label, self.limits))

    def extra(self) -> dict[str, Any]:
        return {"container": "dcp-safetensors", "files": [{"file": str(f)} for f in self.files]}
