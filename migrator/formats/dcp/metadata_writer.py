"""`.metadata` written without torch: the pickle of `torch.distributed.checkpoint.metadata.Metadata`.

torch's `FileSystemReader.read_metadata` unpickles `.metadata` with `pickle.load` and the loader
then looks each chunk up in `storage_data` by `MetadataIndex(fqn, offset)`. This module emits, as
protocol 2 (what `pickle.dumps(metadata, protocol=2)` writes for those dataclasses: the class, an
empty tuple and NEWOBJ, then BUILD with its fields), exactly the classes torch writes there:

* `Metadata(state_dict_metadata, planner_data, storage_data, storage_meta, version)`;
* per key a `TensorStorageMetadata(properties, size, chunks)` (`TensorProperties` pickles its state
  as the tuple `(dtype, layout, requires_grad, _MEM_FORMAT_ENCODING, pin_memory)`, the layout
  through `torch.serialization._get_layout`; sizes and offsets are `torch.Size`s) or a
  `BytesStorageMetadata()`;
* `storage_data`: `MetadataIndex(fqn, offset, index)` -> `filesystem._StorageInfo(relative_path,
  offset, length)` (no `transform_descriptors`: torch leaves the field out when nothing transformed
  the bytes);
* `planner_data`: each key's path in the nested state dict (`("optim", "param_groups", 0, "lr")`),
  what `dcp_to_torch_save` rebuilds the nested dict from;
* `storage_meta`: a `StorageMeta` with no checkpoint id nor save id (the loader sets its load id),
  `version` torch 2.13's "1.0.0".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..pytorch_writer import _Pickle

DCP_VERSION = "1.0.0"
"""`filesystem.CURRENT_DCP_VERSION` of torch 2.4 to 2.13: what torch writes and reads."""
_M = "torch.distributed.checkpoint.metadata"
_FS = "torch.distributed.checkpoint.filesystem"
_BATCH = 1000  # SETITEMS / APPENDS batches, as pickle writes them


@dataclass(frozen=True, slots=True)
class Entry:
    """One flattened key: a tensor (its torch dtype name and global size; one chunk, the whole tensor) or,
    with `dtype` None, a value stored as bytes; where its bytes are and its path in the nested dict."""

    fqn: str
    path: tuple[str | int, ...]
    dtype: str | None
    size: tuple[int, ...]
    file: str
    offset: int
    length: int


def metadata_bytes(entries: Sequence[Entry]) -> bytes:
    """The `.metadata` pickle of `entries` (in state-dict order)."""
    p = _Pickle()
    p.raw(b"\x80\x02")
    _object(p, _M, "Metadata")
    p.raw(b"}")
    p.put()
    p.raw(b"(")
    p.unicode("state_dict_metadata")
    _dict(p, entries, _storage_metadata)
    p.unicode("planner_data")
    _dict(p, entries, _path)
    p.unicode("storage_data")
    _dict(p, entries, _storage_data)
    p.unicode("storage_meta")
    _object(p, _M, "StorageMeta")
    p.raw(b"}(")
    for key in ("checkpoint_id", "save_id", "load_id"):
        p.unicode(key)
        p.raw(b"N")
    p.unicode("modules")
    p.raw(b"]ub")
    p.unicode("version")
    p.unicode(DCP_VERSION)
    p.raw(b"ub.")
    return p.getvalue()


def _object(p: _Pickle, module: str, name: str) -> None:
    """`cls.__new__(cls)`, protocol 2's NEWOBJ with no arguments: its fields come by BUILD."""
    p.global_(module, name)
    p.raw(b")\x81")


def _dict(p: _Pickle, entries: Sequence[Entry], item: Callable[[_Pickle, Entry], None]) -> None:
    """A dict with one item per entry (`item` emits its key and value)."""
    p.raw(b"}")
    for start in range(0, len(entries), _BATCH):
        p.raw(b"(")
        for e in entries[start:start + _BATCH]:
            item(p, e)
        p.raw(b"u")


def _size(p: _Pickle, dims: tuple[int, ...]) -> None:
    """`torch.Size(dims)`: torch.Size reduces to its class and the tuple."""
    p.global_("torch", "Size")
    p.tuple(dims)
    p.raw(b"\x85R")


def _storage_metadata(p: _Pickle, e: Entry) -> None:
    p.unicode(e.fqn)
    if e.dtype is None:
        _object(p, _M, "BytesStorageMetadata")
        return
    _object(p, _M, "TensorStorageMetadata")
    p.raw(b"}(")
    p.unicode("properties")
    _object(p, _M, "TensorProperties")
    p.raw(b"(")
    p.global_("torch", e.dtype)
    p.global_("torch.serialization", "_get_layout")
    p.unicode("torch.strided")
    p.raw(b"\x85R\x89")  # layout, requires_grad False
    p.global_(_M, "_MEM_FORMAT_ENCODING")
    p.int(0)  # TORCH_CONTIGUOUS_FORMAT
    p.raw(b"\x85R\x89tb")  # pin_memory False; BUILD with the state tuple (TensorProperties.__setstate__)
    p.unicode("size")
    _size(p, e.size)
    p.unicode("chunks")
    p.raw(b"]")
    _object(p, _M, "ChunkStorageMetadata")
    p.raw(b"}(")
    p.unicode("offsets")
    _size(p, (0,) * len(e.size))
    p.unicode("sizes")
    _size(p, e.size)
    p.raw(b"ubaub")  # the chunk's fields, appended to chunks; the tensor's fields


def _path(p: _Pickle, e: Entry) -> None:
    p.unicode(e.fqn)
    p.raw(b"(")
    for part in e.path:
        if isinstance(part, str):
            p.unicode(part)
        else:
            p.int(part)
    p.raw(b"t")


def _storage_data(p: _Pickle, e: Entry) -> None:
    _index(p, e)
    _storage_info(p, e)


def _index(p: _Pickle, e: Entry) -> None:
    """`MetadataIndex(fqn, offset, index)`: a tensor's only chunk starts at 0 (index 0); a value has none."""
    _object(p, _M, "MetadataIndex")
    p.raw(b"}(")
    p.unicode("fqn")
    p.unicode(e.fqn)
    p.unicode("offset")
    if e.dtype is None:
        p.raw(b"N")
    else:
        _size(p, (0,) * len(e.size))
    p.unicode("index")
    p.raw(b"N" if e.dtype is None else b"K\x00")
    p.raw(b"ub")


def _storage_info(p: _Pickle, e: Entry) -> None:
    _object(p, _FS, "_StorageInfo")
    p.raw(b"}(")
    p.unicode("relative_path")
    p.unicode(e.file)
    p.unicode("offset")
    p.int(e.offset)
    p.unicode("length")
    p.int(e.length)
    p.raw(b"ub")
