"""What a file holds, as plain data: the `migrate inspect` view."""

from __future__ import annotations

import os
from typing import Any

from ..core.dtypes import Kind
from ..files.io import Reader, open_file
from ..formats.burnpack import describe_qfloat
from ..formats.registry import is_format


def summarize(reader: Reader) -> dict[str, Any]:
    """A JSON-ready description: format, tensors in data order, metadata, scalars, totals."""
    tensors = []
    locations = reader.locations  # a sharded source: each tensor's shard and offset
    shards = reader.shards
    for i, t in enumerate(reader.tensors):
        entry: dict[str, Any] = {"name": t.name, "dtype": t.dtype.display, "shape": list(t.shape),
                                 "nbytes": t.nbytes, "offset": t.span.offset if t.span else None}
        stored = reader.ggml_type(t)  # GGUF: the type each tensor is stored in
        if stored is not None:
            entry["ggml_type"] = stored
            # dequantized on read: its blocks' place and size in the file (nbytes is the tensor as read)
            entry["stored_nbytes"] = getattr(t.loader, "length", t.nbytes)
            if entry["offset"] is None:
                entry["offset"] = getattr(t.loader, "offset", None)
        if locations is not None and shards is not None:
            shard, entry["offset"] = locations[i]
            entry["file"] = str(shards[shard].path)
        if t.param_id is not None:
            entry["param_id"] = t.param_id
        if t.dtype.kind is Kind.QUANTIZED:
            entry["scheme"] = describe_qfloat(t.dtype)
        tensors.append(entry)
    out: dict[str, Any] = {
        "path": reader.path,
        "format": reader.format,
        "file_size": reader.source.size,
        "tensors": tensors,
        "metadata": dict(reader.metadata),
        "scalars": {k: v.to_json() for k, v in reader.scalars.items()},
        "totals": {"tensors": len(tensors), "nbytes": sum(t.nbytes for t in reader.tensors),
                   **({"stored_nbytes": sum(t["stored_nbytes"] for t in tensors)}
                      if any("stored_nbytes" in t for t in tensors) else {})},
        "details": reader.extra(),
    }
    if is_format(reader.format, for_burn=True) and isinstance(reader.path, str | os.PathLike) and reader.metadata:
        from ..plan.burn_pair import check_pair  # a model or Burn optimizer record written as a pair

        pair = check_pair(reader.path, dict(reader.metadata))
        if pair is not None:
            out["pair"] = pair
    return out


def inspect_file(path: str | os.PathLike[str], *, format: str = "auto", **options: Any) -> dict[str, Any]:
    with open_file(path, format, **options) as reader:
        return summarize(reader)
