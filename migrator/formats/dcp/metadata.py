"""A DCP checkpoint's `.metadata`: the pickle torch.distributed.checkpoint writes, read as plain data.

torch pickles a `Metadata` dataclass: `state_dict_metadata` (each flattened key: a tensor's dtype,
global size and chunks, or "bytes" for any other value), `storage_data` (each chunk's or value's file,
offset and length), `planner_data` (each flattened key's path in the nested state dict) and
`storage_meta`. The restricted interpreter (`formats.safepickle`) turns those classes into inert
`Record`s; this module reads their fields into the dataclasses below and refuses anything else: an
unknown class anywhere in the file, a field of the wrong type, a file name that leaves the folder, a
storage transform (compression) it cannot undo. Nothing from the file ever runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core.dtypes import BY_TORCH, DType
from ...core.errors import FormatError, LimitExceededError, UnsafePickleError
from ...core.limits import Limits
from ..safepickle import values as sp
from ..safepickle.vm import Unpickler
from .layout import METADATA_FILE

_M = "torch.distributed.checkpoint.metadata."
MEGATRON_CLASSES = frozenset({
    "torch.distributed.checkpoint.planner.SavePlan", "torch.distributed.checkpoint.planner.WriteItem",
    "torch.distributed.checkpoint.planner.WriteItemType", "torch.distributed.checkpoint.planner.TensorWriteData",
    "torch.distributed.checkpoint.planner.BytesIOWriteData",
    "megatron.core.dist_checkpointing.strategies.torch.MCoreSavePlan",
})
"""What megatron-core adds to `.metadata`, read as inert records and never used: 0.16 stores every rank's
`SavePlan` in `Metadata.all_local_plans` (to reuse a plan on the next save), older versions their own
`MCoreSavePlan` subclass there."""
MCORE_METADATA = "megatron.core.dist_checkpointing.strategies.torch.MCoreMetadata"
"""megatron-core <= 0.15's subclass of DCP's `Metadata` (its fields plus `mcore_data`): read as DCP's."""
_ROOTS = (_M + "Metadata", MCORE_METADATA)
METADATA_CLASSES = frozenset({
    _M + "Metadata", _M + "TensorStorageMetadata", _M + "BytesStorageMetadata", _M + "ChunkStorageMetadata",
    _M + "TensorProperties", _M + "MetadataIndex", _M + "StorageMeta", _M + "_MEM_FORMAT_ENCODING",
    "torch.distributed.checkpoint.filesystem._StorageInfo", "torch.distributed.checkpoint._hf_utils._HFStorageInfo",
    "torch.layout", MCORE_METADATA,
}) | MEGATRON_CLASSES
"""The only classes a `.metadata` may name (as `safepickle.Record`s); any other is refused."""
PATH_CLASSES = frozenset({"pathlib.PosixPath", "pathlib.WindowsPath", "pathlib.PurePosixPath",
                          "pathlib.PureWindowsPath"})
"""`StorageMeta.checkpoint_id` (where the checkpoint was saved): inert placeholders, never read."""

_INT64 = 1 << 63


@dataclass(frozen=True, slots=True)
class Chunk:
    """One rank's piece of a tensor: where it starts in the global tensor and its size."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Location:
    """Where a chunk's (or a value's) bytes are: a file of the folder, an offset and a length."""

    file: str
    offset: int
    length: int


@dataclass(slots=True)
class TensorEntry:
    name: str
    dtype: DType
    size: tuple[int, ...]
    chunks: list[Chunk]


@dataclass
class DcpMetadata:
    """What `.metadata` says, checked: every flattened key in the order torch stored them."""

    order: list[str]
    tensors: dict[str, TensorEntry]
    byte_values: list[str]
    locations: dict[tuple[str, tuple[int, ...] | None], Location]
    paths: dict[str, tuple[str | int, ...]]
    version: str | None = None
    files: list[str] = field(default_factory=list)
    mcore_data: dict[Any, Any] = field(default_factory=dict)
    """megatron-core <= 0.15's per-key notes (`nd_reformulated_orig_global_shape`), as plain data."""

    def location(self, name: str, offsets: tuple[int, ...] | None, label: str) -> Location:
        found = self.locations.get((name, offsets))
        if found is None:
            where = "its value" if offsets is None else f"its chunk at offset {list(offsets)}"
            raise FormatError(f"the metadata's storage_data does not say where {where} is stored", file=label,
                              tensor=name)
        return found




def read_metadata(data: bytes, label: str, limits: Limits) -> DcpMetadata:
    """Interpret `.metadata` (already read, size-bounded) and check it."""
    u = Unpickler(data, label=label, limits=limits, what=METADATA_FILE)
    root = u.load()
    if u.opaque - PATH_CLASSES:
        name = sorted(u.opaque - PATH_CLASSES)[0]
        raise UnsafePickleError(f"{METADATA_FILE} names '{name}', which is not a DCP metadata class; migrator reads "
                                "only the classes torch.distributed.checkpoint (and megatron-core) write there, "
                                "and runs no code", file=label)
    _refuse_other_records(root, label, limits)
    if not isinstance(root, sp.Record) or root.name not in _ROOTS:
        raise FormatError(f"{METADATA_FILE} holds {sp.describe(root)}, not a DCP Metadata", file=label)
    state = _fields(root, label)
    sdm = state.get("state_dict_metadata")
    if not isinstance(sdm, dict):
        raise FormatError("Metadata.state_dict_metadata is not a dict", file=label)
    order: list[str] = []
    tensors: dict[str, TensorEntry] = {}
    byte_values: list[str] = []
    for name, entry in sdm.items():
        if type(name) is not str:
            raise FormatError("Metadata.state_dict_metadata has a key that is not a string", file=label)
        order.append(name)
        if isinstance(entry, sp.Record) and entry.name == _M + "BytesStorageMetadata":
            byte_values.append(name)
        elif isinstance(entry, sp.Record) and entry.name == _M + "TensorStorageMetadata":
            tensors[name] = _tensor_entry(name, entry, label, limits)
        else:
            raise FormatError(f"state_dict_metadata entry is {sp.describe(entry)}, not tensor or bytes storage "
                              "metadata", file=label, tensor=name)
    locations, files = _storage_data(state.get("storage_data"), label, limits)
    paths = _planner_data(state.get("planner_data"), label)
    version = state.get("version")
    mcore = state.get("mcore_data")
    return DcpMetadata(order, tensors, byte_values, locations, paths,
                       version if isinstance(version, str) else None, files,
                       mcore if isinstance(mcore, dict) else {})


def _refuse_other_records(root: Any, label: str, limits: Limits) -> None:
    """Every object of the file must be plain data or a record of a DCP metadata class (a DTensor spec
    or anything else allow-listed for other files has no business here)."""
    todo, seen, visits = [root], set(), 0
    while todo:
        node = todo.pop()
        visits += 1
        if visits > limits.max_nodes:
            raise LimitExceededError(f"more than {limits.max_nodes} values in {METADATA_FILE} (max_nodes)", file=label)
        if isinstance(node, sp.Record):
            if node.name not in METADATA_CLASSES:
                raise UnsafePickleError(f"{METADATA_FILE} holds a '{node.name}' object, which is not a DCP metadata "
                                        "class", file=label)
            if id(node) not in seen:
                seen.add(id(node))
                todo.extend(node.args)
                todo.append(node.state)
        elif isinstance(node, sp.Placeholder) and node.name in PATH_CLASSES:
            continue
        elif isinstance(node, (sp.Placeholder, sp.Opaque, sp.TensorRef, sp.UnsupportedTensor, sp.StorageType,
                               sp.TorchType, sp.Builtin, sp.DTensorRef, sp.NumpyArray)):
            raise UnsafePickleError(f"{METADATA_FILE} holds {sp.describe(node)}, which DCP metadata never holds",
                                    file=label)
        elif isinstance(node, dict) and id(node) not in seen:
            seen.add(id(node))
            for k, v in node.items():
                todo.append(k)
                todo.append(v)
        elif isinstance(node, (list, tuple, set, frozenset)) and id(node) not in seen:
            seen.add(id(node))
            todo.extend(node)


def _fields(rec: sp.Record, label: str) -> dict[str, Any]:
    """A dataclass record's fields: BUILD's dict state (torch pickles dataclasses so)."""
    state = rec.state
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):  # (dict, slots)
        state = state[0]
    if state is None:
        return {}
    if not isinstance(state, dict) or not all(type(k) is str for k in state):
        raise FormatError(f"{rec.name.rpartition('.')[2]} has a state of {sp.describe(state)}, not its fields",
                          file=label)
    return state


def _dims(v: Any, what: str, label: str, name: str | None, limits: Limits) -> tuple[int, ...]:
    if not isinstance(v, (tuple, list)) or len(v) > limits.max_dims:
        raise FormatError(f"{what} is not a tuple of at most {limits.max_dims} integers", file=label, tensor=name)
    if not all(type(d) is int and 0 <= d < _INT64 for d in v):
        raise FormatError(f"{what} holds a value that is not a non-negative 64-bit integer", file=label, tensor=name)
    return tuple(v)


def _tensor_entry(name: str, rec: sp.Record, label: str, limits: Limits) -> TensorEntry:
    f = _fields(rec, label)
    size = _dims(f.get("size"), "size", label, name, limits)
    props = f.get("properties")
    if not isinstance(props, sp.Record) or props.name != _M + "TensorProperties":
        raise FormatError("tensor metadata without TensorProperties", file=label, tensor=name)
    pstate = props.state  # TensorProperties pickles (dtype, layout, requires_grad, memory_format, pin_memory)
    dtype_v = pstate[0] if isinstance(pstate, tuple) and pstate else (
        pstate.get("dtype") if isinstance(pstate, dict) else None)
    layout = pstate[1] if isinstance(pstate, tuple) and len(pstate) > 1 else (
        pstate.get("layout") if isinstance(pstate, dict) else None)
    if not isinstance(dtype_v, sp.TorchDtype):
        raise FormatError("TensorProperties without a torch dtype", file=label, tensor=name)
    if isinstance(layout, sp.Record) and layout.args != ("torch.strided",):
        raise FormatError(f"tensors of layout {layout.args[0] if layout.args else '?'} are not supported (only "
                          "dense, strided tensors)", file=label, tensor=name)
    dtype = BY_TORCH.get(dtype_v.name)
    if dtype is None:
        from ...core.errors import UnsupportedDTypeError

        raise UnsupportedDTypeError(f"torch dtype {dtype_v.name} is not supported", file=label, tensor=name)
    raw_chunks = f.get("chunks")
    if not isinstance(raw_chunks, list):
        raise FormatError("tensor metadata without a list of chunks", file=label, tensor=name)
    if len(raw_chunks) > limits.max_shards:
        raise LimitExceededError(f"{len(raw_chunks)} chunks, over the {limits.max_shards} limit (max_shards)",
                                 file=label, tensor=name)
    chunks = []
    for c in raw_chunks:
        if not isinstance(c, sp.Record) or c.name != _M + "ChunkStorageMetadata":
            raise FormatError(f"a chunk is {sp.describe(c)}, not ChunkStorageMetadata", file=label, tensor=name)
        cf = _fields(c, label)
        offsets = _dims(cf.get("offsets"), "a chunk's offsets", label, name, limits)
        sizes = _dims(cf.get("sizes"), "a chunk's sizes", label, name, limits)
        if len(offsets) != len(size) or len(sizes) != len(size):
            raise FormatError(f"a chunk at offset {list(offsets)} has {len(sizes)} dimensions, the tensor {len(size)}",
                              file=label, tensor=name)
        chunks.append(Chunk(offsets, sizes))
    return TensorEntry(name, dtype, size, chunks)


def _storage_data(raw: Any, label: str,
                  limits: Limits) -> tuple[dict[tuple[str, tuple[int, ...] | None], Location], list[str]]:
    """MetadataIndex(fqn, offset, index) -> _StorageInfo(relative_path, offset, length): keyed by (fqn,
    offset) as torch looks them up (the index is only a hint there)."""
    if not isinstance(raw, dict):
        raise FormatError("Metadata.storage_data is not a dict", file=label)
    out: dict[tuple[str, tuple[int, ...] | None], Location] = {}
    files: dict[str, None] = {}
    for key, info in raw.items():
        if not isinstance(key, sp.Record) or key.name != _M + "MetadataIndex":
            raise FormatError(f"a storage_data key is {sp.describe(key)}, not a MetadataIndex", file=label)
        kf = _fields(key, label)
        fqn = kf.get("fqn")
        if type(fqn) is not str:
            raise FormatError("a MetadataIndex without a string fqn", file=label)
        off = kf.get("offset")
        offsets = None if off is None else _dims(off, "a MetadataIndex offset", label, fqn, limits)
        if not isinstance(info, sp.Record) or not info.name.endswith("._StorageInfo"):
            raise FormatError(f"storage_data entry is {sp.describe(info)}, not a _StorageInfo", file=label,
                              tensor=fqn)
        sf = _fields(info, label)
        path, start, length = sf.get("relative_path"), sf.get("offset"), sf.get("length")
        if type(path) is not str or type(start) is not int or type(length) is not int or not (
                0 <= start < _INT64 and 0 <= length < _INT64):
            raise FormatError("a _StorageInfo without (relative_path, offset, length)", file=label, tensor=fqn)
        problem = _file_name_problem(path)
        if problem is not None:
            raise FormatError(f"storage file '{path[:200]}' {problem}", file=label, tensor=fqn)
        if sf.get("transform_descriptors"):
            raise FormatError(f"its bytes were written through storage transforms "
                              f"{sf['transform_descriptors']!r} (e.g. compression), which migrator does not undo",
                              file=label, tensor=fqn)
        out[(fqn, offsets)] = Location(path, start, length)
        files[path] = None
    return out, list(files)


def _file_name_problem(name: str) -> str | None:
    """torch writes flat names (`__0_0.distcp`) into the checkpoint's folder: anything else is refused."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
        return "is not a plain file name inside the checkpoint's folder"
    if name == METADATA_FILE:
        return "is the metadata file itself"
    return None


def _planner_data(raw: Any, label: str) -> dict[str, tuple[str | int, ...]]:
    """Each flattened key's path in the nested state dict (`("optim", "param_groups", 0, "lr")`)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise FormatError("Metadata.planner_data is not a dict", file=label)
    out: dict[str, tuple[str | int, ...]] = {}
    for k, v in raw.items():
        if type(k) is not str:
            continue
        if (not isinstance(v, (tuple, list)) or not v
                or not all(type(p) is str or (type(p) is int and 0 <= p < 1 << 31) for p in v)):
            raise FormatError("planner_data maps a key to something that is not a path of names and indices",
                              file=label, tensor=k)
        out[k] = tuple(v)
    return out
