"""A pickled FSDP1 `ShardedTensor` read as data: the global size and dtype, every rank's shard (offsets,
sizes, the rank it is placed on), this rank's local shards and the process group it was saved from.

torch.save of FSDP1's SHARDED_STATE_DICT (and of FSDP.optim_state_dict under it) pickles each value as
a ShardedTensor whose `ShardedTensorMetadata` lists every shard of the whole tensor, so a set of
rank files can be joined exactly (`files/sharded_tensor_ranks.py`). LOCAL_STATE_DICT pickles FSDP's
flattened `_flat_param`s instead: the parameters' names and shapes are not in the file, so it is
refused here, whatever else is asked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...core.errors import LOCAL_SHARD_SEP, FormatError
from ..safepickle import values as sp
from .dtensor import _fields

LOCAL_SEP = LOCAL_SHARD_SEP
"""Between a ShardedTensor's name and its local shard's index, in the rank reader's own tensor names:
no key torch writes holds a NUL, so these never meet a real name (`local_name`); errors show such a
name as the ShardedTensor's and the shard's index (`core.errors.shown_tensor`)."""


def local_name(name: str, index: int) -> str:
    """The reader's name for local shard `index` of the ShardedTensor `name`."""
    return f"{name}{LOCAL_SEP}{index}"


@dataclass(frozen=True, slots=True)
class ShardPlace:
    """One shard: where it starts and how big it is in the global tensor, the rank holding it."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    rank: int


@dataclass(frozen=True, slots=True)
class ShardedLayout:
    """What a ShardedTensor says of itself: global shape and dtype, every shard (in the metadata's
    order), this file's local shards (in the order of its local tensors), the saving rank and world
    size (None when the process group state is unreadable)."""

    size: tuple[int, ...]
    dtype: str | None
    shards: tuple[ShardPlace, ...]
    local: tuple[ShardPlace, ...]
    rank: int | None
    world: int | None


_FLAT = re.compile(r"(?:^|\.)(?:_flat_param|flat_param(?:_\d+)?)$")
"""FSDP's flattened parameter (`FLAT_PARAM`, and the `flat_param_<n>` of its first releases)."""

LOCAL_STATE_DICT = ("the file holds FSDP LOCAL_STATE_DICT flat parameters: the original parameters' names and shapes "
                    "are not in the file, so it cannot be consolidated; save SHARDED_STATE_DICT (through "
                    "torch.distributed.checkpoint) or FULL_STATE_DICT instead")


def _int(v: Any) -> int | None:
    return v if type(v) is int and 0 <= v < 1 << 62 else None


def _dims(v: Any, ndim: int) -> tuple[int, ...] | None:
    if isinstance(v, (tuple, list)) and len(v) == ndim and all(_int(x) is not None for x in v):
        return tuple(v)
    return None


def _placement_rank(v: Any) -> int | None:
    """The rank of a `_remote_device` (its `_rank` field), or of its text form `rank:K/device`."""
    if isinstance(v, sp.Record):
        return _int(_fields(v).get("_rank"))
    if type(v) is str:
        m = re.fullmatch(r"rank:(\d{1,9})/[\w:]{1,32}", v)
        return int(m[1]) if m else None
    return None


def _place(rec: Any, ndim: int, label: str, name: str) -> ShardPlace:
    f = _fields(rec) if isinstance(rec, sp.Record) and rec.name.endswith(".ShardMetadata") else None
    if f is None:
        raise FormatError(f"a ShardedTensor shard's metadata is {sp.describe(rec)}, not a ShardMetadata",
                          file=label, tensor=name)
    offsets, sizes = _dims(f.get("shard_offsets"), ndim), _dims(f.get("shard_sizes"), ndim)
    rank = _placement_rank(f.get("placement"))
    if offsets is None or sizes is None or rank is None:
        raise FormatError(f"a ShardedTensor shard without {ndim} offsets, {ndim} sizes and a rank placement",
                          file=label, tensor=name)
    return ShardPlace(offsets, sizes, rank)


def sharded_layout(ref: sp.ShardedTensorRef, label: str, name: str) -> ShardedLayout:
    """The layout a pickled ShardedTensor describes (refused, naming the tensor, when unreadable; refused
    as LOCAL_STATE_DICT when it is FSDP's flat parameter)."""
    if _FLAT.search(name):
        raise FormatError(LOCAL_STATE_DICT, file=label, tensor=name)
    ndim = len(ref.size)
    meta = _fields(ref.metadata) if isinstance(ref.metadata, sp.Record) else {}
    raw = meta.get("shards_metadata")
    if not isinstance(raw, list) or not raw:
        raise FormatError("a ShardedTensor without the metadata of its shards", file=label, tensor=name)
    size = _dims(meta.get("size"), ndim)
    if size != ref.size:
        raise FormatError(f"a ShardedTensor of size {list(ref.size)} whose metadata says "
                          f"{list(size) if size is not None else 'nothing readable'}", file=label, tensor=name)
    shards = tuple(_place(s, ndim, label, name) for s in raw)
    local = tuple(_place(md, ndim, label, name) for _, md in ref.shards)
    group = _fields(ref.group) if isinstance(ref.group, sp.Record) else {}
    rank, world = _int(group.get("global_rank")), _int(group.get("global_world_size"))
    return ShardedLayout(ref.size, ref.dtype, shards, local, rank, world if world else None)
