"""The allow-list: the globals a checkpoint may name, each an inert handler that only builds data.

Tensor rebuild functions, storage classes, dtypes, `OrderedDict`, a few builtins and numpy
reductions, and DeepSpeed's `ZeroStageEnum` (read as an int). Any other global resolves to `Opaque`;
`_is_gadget` says which of those are refused as soon as they are called (code-running modules)
instead of becoming a `Placeholder`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .values import (
    _DTYPE_ALIASES,
    _PLACEHOLDER_SIZE,
    _SET_SIZE,
    _STORAGE_DTYPES,
    ELEMENT_SIZES,
    Builtin,
    Device,
    DTensorRef,
    Handler,
    NumpyArray,
    NumpyDtype,
    ODict,
    Opaque,
    Record,
    ShardedTensorRef,
    StorageRef,
    StorageType,
    TensorRef,
    TorchDtype,
    TorchType,
    UnsupportedTensor,
    _tname,
)

if TYPE_CHECKING:
    from .machine import Machine



_MODULE_ALIASES = {
    "__builtin__": "builtins",
    "copy_reg": "copyreg",
    "numpy._core.multiarray": "numpy.core.multiarray",
    "numpy.core.numeric": "numpy.core.multiarray",
    "numpy._core.numeric": "numpy.core.multiarray",
}

_DANGEROUS_MODULES = frozenset({
    "os", "posix", "nt", "sys", "subprocess", "builtins", "shutil", "socket", "importlib", "runpy",
    "pty", "ctypes", "pickle", "_pickle", "marshal", "code", "codecs", "_codecs", "io", "_io",
    "multiprocessing", "threading", "signal", "webbrowser", "urllib", "http", "tempfile", "types",
    "functools", "operator", "copyreg", "inspect", "pdb", "timeit", "platform", "asyncio", "glob",
    "zipimport", "pkgutil", "site", "sysconfig", "distutils", "setuptools", "pip",
    "commands", "popen2", "cPickle",  # Python 2 names (pickle maps subprocess to commands below protocol 3)
})

_COPYREG_CONSTRUCTORS = frozenset({"copyreg._reconstructor", "copyreg.__newobj__", "copyreg.__newobj_ex__"})

_TENSOR_WRAPPERS = frozenset({"torch.nn.parameter.Parameter", "torch.autograd.variable.Variable",
                              "torch.nn.parameter.Buffer"})


def _as_tensor(m: Machine, value: Any, what: str) -> TensorRef | UnsupportedTensor | DTensorRef:
    if isinstance(value, (TensorRef, UnsupportedTensor, DTensorRef)):
        return value
    raise m.error(f"{what} expects a tensor, got {_tname(value)}")


def _int_arg(m: Machine, v: Any, what: str, *, lo: int = 0) -> int:
    if type(v) is not int or v < lo:
        raise m.error(f"{what} must be an integer >= {lo}, got {_tname(v)}")
    if v >= _INT64_LIMIT:  # torch keeps sizes, strides and offsets in int64
        raise m.error(f"{what} does not fit in 64 bits")
    return v


_INT64_LIMIT = 1 << 63


def _shape_arg(m: Machine, v: Any, what: str, *, lo: int = 0) -> tuple[int, ...]:
    if not isinstance(v, (tuple, list)):
        raise m.error(f"{what} must be a tuple of integers, got {_tname(v)}")
    if len(v) > m.limits.max_dims:
        raise m.limit(f"{what} has {len(v)} dimensions (limit {m.limits.max_dims})")
    return tuple(_int_arg(m, d, what, lo=lo) for d in v)


def _tensor(m: Machine, fn: str, storage: Any, offset: Any, size: Any, stride: Any,
            dtype: Any = None) -> TensorRef:
    if not isinstance(storage, StorageRef):
        raise m.error(f"{fn}: the storage argument must come from a storage persistent id, "
                      f"got {_tname(storage)}")
    shape = _shape_arg(m, size, f"{fn} size")
    strides = _shape_arg(m, stride, f"{fn} stride")
    if len(strides) != len(shape):
        raise m.error(f"{fn}: {len(shape)} sizes but {len(strides)} strides")
    dname = None
    if dtype is not None:
        if not isinstance(dtype, TorchDtype):
            raise m.error(f"{fn}: dtype must be a torch dtype, got {_tname(dtype)}")
        dname = dtype.name
    return TensorRef(storage, _int_arg(m, offset, f"{fn} storage_offset"), shape, strides, dname)


def _h_rebuild_tensor(m: Machine, a: tuple, kw: dict) -> TensorRef:
    if len(a) != 4 or kw:
        raise m.error("_rebuild_tensor expects (storage, offset, size, stride)")
    return _tensor(m, "_rebuild_tensor", *a)


def _h_rebuild_tensor_v2(m: Machine, a: tuple, kw: dict) -> TensorRef:
    if not 6 <= len(a) <= 7 or kw:
        raise m.error("_rebuild_tensor_v2 expects 6 or 7 arguments")
    t = _tensor(m, "_rebuild_tensor_v2", *a[:4])
    t.requires_grad = a[4] is True
    return t


def _h_rebuild_tensor_v3(m: Machine, a: tuple, kw: dict) -> TensorRef:
    if not 7 <= len(a) <= 8 or kw:
        raise m.error("_rebuild_tensor_v3 expects 7 or 8 arguments")
    t = _tensor(m, "_rebuild_tensor_v3", a[0], a[1], a[2], a[3], dtype=a[6])
    t.requires_grad = a[4] is True
    return t


def _h_rebuild_parameter(m: Machine, a: tuple, kw: dict) -> Any:
    if not 1 <= len(a) <= 4 or kw:
        raise m.error("_rebuild_parameter expects (data, requires_grad, hooks[, state])")
    t = _as_tensor(m, a[0], "_rebuild_parameter")
    if isinstance(t, TensorRef) and len(a) > 1:
        t.requires_grad = a[1] is True
    return t


def _h_rebuild_from_type(m: Machine, a: tuple, kw: dict) -> Any:
    if len(a) != 4 or kw:
        raise m.error("_rebuild_from_type(_v2) expects (func, type, args, state)")
    func, new_type, args, _state = a
    if not isinstance(new_type, (TorchType, Opaque)):
        raise m.error(f"_rebuild_from_type: the type must be a class, got {_tname(new_type)}")
    if m._depth >= m.limits.max_key_depth:  # each level is Python frames: bounded before recursion is
        raise m.limit(f"_rebuild_from_type calls nested deeper than {m.limits.max_key_depth}")
    m._depth += 1
    try:
        result = m.call(func, args, None, "_rebuild_from_type")
    finally:
        m._depth -= 1
    if isinstance(result, UnsupportedTensor) and isinstance(new_type, Opaque) and new_type.name in _DTENSOR_CLASSES:
        return _dtensor(m, args, _state)
    if isinstance(result, UnsupportedTensor) and isinstance(new_type, Opaque) \
            and new_type.name in SHARDED_TENSOR_CLASSES:
        return _sharded_tensor(m, args, _state)
    return _as_tensor(m, result, "_rebuild_from_type")


_DTENSOR_CLASSES = frozenset({"torch.distributed.tensor.DTensor", "torch.distributed.tensor._api.DTensor",
                              "torch.distributed._tensor.api.DTensor", "torch.distributed._tensor.DTensor"})


def _dtensor(m: Machine, args: Any, state: Any) -> DTensorRef:
    """A DTensor as torch pickles it: `_rebuild_wrapper_subclass(cls, dtype, size, stride, offset, layout,
    device, requires_grad)` with the state {"_local_tensor": tensor, "_spec": DTensorSpec}; kept as data."""
    if not isinstance(args, tuple) or len(args) < 3 or not isinstance(args[1], TorchDtype):
        raise m.error("DTensor: expected (class, dtype, size, ...) to rebuild it from")
    size = _shape_arg(m, args[2], "DTensor size")
    if isinstance(state, tuple) and len(state) == 2:  # (dict state, slots state): DTensor's fields are slots
        state = {**(state[0] if isinstance(state[0], dict) else {}),
                 **(state[1] if isinstance(state[1], dict) else {})}
    if not isinstance(state, dict) or not isinstance(state.get("_local_tensor"), TensorRef):
        raise m.error("DTensor without a local tensor in its state")
    spec = state.get("_spec")
    if not isinstance(spec, Record):
        raise m.error("DTensor without a DTensorSpec in its state")
    return DTensorRef(state["_local_tensor"], size, args[1].name, spec)


SHARDED_TENSOR_CLASSES = frozenset({"torch.distributed._shard.sharded_tensor.api.ShardedTensor",
                                    "torch.distributed._shard.sharded_tensor.ShardedTensor"})


def _sharded_tensor(m: Machine, args: Any, state: Any) -> ShardedTensorRef:
    """A ShardedTensor as torch pickles it: `_rebuild_wrapper_subclass(cls, dtype, size, ...)` with the state
    its `__getstate__` gives, (local shards, ShardedTensorMetadata, ProcessGroupState, sharding spec,
    init_rrefs); each local shard a `Shard` record of {"tensor", "metadata"}. Kept as data."""
    if not isinstance(args, tuple) or len(args) < 3 or not isinstance(args[1], TorchDtype):
        raise m.error("ShardedTensor: expected (class, dtype, size, ...) to rebuild it from")
    size = _shape_arg(m, args[2], "ShardedTensor size")
    if not isinstance(state, tuple) or len(state) < 3 or not isinstance(state[0], list):
        raise m.error("ShardedTensor without its (local shards, metadata, process group) state")
    shards: list[tuple[TensorRef, Any]] = []
    for shard in state[0]:
        fields = _record_fields(shard) if isinstance(shard, Record) and shard.name == _SHARD else None
        tensor = fields.get("tensor") if fields else None
        if fields is None or not isinstance(tensor, TensorRef):
            raise m.error("a ShardedTensor's local shard is not a Shard of a tensor")
        shards.append((tensor, fields.get("metadata")))
    return ShardedTensorRef(shards, size, args[1].name, state[1], state[2])


_SHARD = "torch.distributed._shard.sharded_tensor.shard.Shard"
_PROCESS_GROUP_STATE = "torch.distributed._shard.sharded_tensor.api.ShardedTensor.ProcessGroupState"


def _record_fields(rec: Record) -> dict[str, Any]:
    """A record's BUILD state as one dict: a slotted dataclass's state is (dict or None, slots dict)."""
    state = rec.state
    if isinstance(state, tuple) and len(state) == 2:
        return {**(state[0] if isinstance(state[0], dict) else {}), **(state[1] if isinstance(state[1], dict) else {})}
    return state if isinstance(state, dict) else {}


def _h_getattr(m: Machine, a: tuple, kw: dict) -> Builtin:
    """`getattr(ShardedTensor, "ProcessGroupState")`, the one getattr torch pickles (a nested dataclass
    is found from its class): the record class, nothing looked up. Any other getattr runs code: refused."""
    if not kw and len(a) == 2 and isinstance(a[0], Opaque) and a[0].name in SHARDED_TENSOR_CLASSES \
            and a[1] == "ProcessGroupState":
        return _record_class(_PROCESS_GROUP_STATE)
    raise m.unsafe("refusing to call 'builtins.getattr': migrator never runs code from a pickle; only tensors, "
                   "containers and plain values are read")


def _unsupported(kind: str) -> Handler:
    def handler(m: Machine, a: tuple, kw: dict) -> UnsupportedTensor:
        dtype = None
        if a and isinstance(a[0], StorageRef):
            dtype = a[0].dtype
        return UnsupportedTensor(kind, dtype)

    return handler


def _h_ordered_dict(m: Machine, a: tuple, kw: dict) -> ODict:
    d = ODict()
    if kw or len(a) > 1:
        raise m.error("OrderedDict expects at most one argument")
    if a:
        _fill_pairs(m, d, a[0], "OrderedDict")
    return d


def _h_defaultdict(m: Machine, a: tuple, kw: dict) -> ODict:
    if kw or len(a) > 2:
        raise m.error("defaultdict expects (factory[, items])")
    d = ODict()  # the factory is never called: only stored items matter
    if len(a) == 2:
        _fill_pairs(m, d, a[1], "defaultdict")
    return d


def _fill_pairs(m: Machine, d: dict, src: Any, what: str) -> None:
    if isinstance(src, dict):
        for k, v in src.items():
            d[k] = v
        return
    if not isinstance(src, (list, tuple)):
        raise m.error(f"{what} expects a list of pairs, got {_tname(src)}")
    counts = m.hash_counts(d)
    for pair in src:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise m.error(f"{what} expects (key, value) pairs")
        d[m.key(pair[0], counts, d)] = pair[1]


def _sequence_arg(m: Machine, a: tuple, kw: dict, what: str) -> list[Any]:
    if kw or len(a) > 1:
        raise m.error(f"{what} expects at most one argument")
    if not a:
        return []
    src = a[0]
    if isinstance(src, (list, tuple, set, frozenset)):
        return list(src)
    if isinstance(src, dict):
        return list(src.keys())
    raise m.error(f"{what} of a {_tname(src)} is not supported")


def _h_set(m: Machine, a: tuple, kw: dict) -> set:
    m.charge(_SET_SIZE)
    counts: dict[int, int] = {}
    members: set[Any] = set()
    for x in _sequence_arg(m, a, kw, "set"):
        members.add(m.key(x, counts, members))
    return members


def _h_frozenset(m: Machine, a: tuple, kw: dict) -> frozenset:
    return _make_frozenset(m, _sequence_arg(m, a, kw, "frozenset"))


def _h_list(m: Machine, a: tuple, kw: dict) -> list:
    return _sequence_arg(m, a, kw, "list")


def _h_tuple(m: Machine, a: tuple, kw: dict) -> tuple:
    return tuple(_sequence_arg(m, a, kw, "tuple"))


def _h_dict(m: Machine, a: tuple, kw: dict) -> dict:
    d: dict[Any, Any] = {}
    if len(a) > 1:
        raise m.error("dict expects at most one argument")
    if a:
        _fill_pairs(m, d, a[0], "dict")
    for k, v in kw.items():
        d[k] = v
    return d


_TEXT_ENCODINGS = {"latin1": "latin-1", "latin-1": "latin-1", "utf-8": "utf-8", "utf8": "utf-8",
                   "ascii": "ascii"}


def _bytes_from(m: Machine, a: tuple, kw: dict, what: str) -> bytes:
    if kw:
        raise m.error(f"{what} takes no keyword arguments here")
    if not a:
        return b""
    if len(a) == 1 and isinstance(a[0], (bytes, bytearray)):
        return bytes(a[0])
    if len(a) == 2 and isinstance(a[0], str) and isinstance(a[1], str) and a[1].lower() in _TEXT_ENCODINGS:
        try:
            return a[0].encode(_TEXT_ENCODINGS[a[1].lower()])
        except UnicodeEncodeError:
            raise m.error(f"{what}: text does not fit encoding {a[1]}") from None
    raise m.error(f"{what} accepts only bytes or (text, encoding) here")  # never bytes(n): no allocation bombs


def _h_codecs_encode(m: Machine, a: tuple, kw: dict) -> bytes:
    if len(a) == 1 and isinstance(a[0], str):
        a = (a[0], "utf-8")
    return _bytes_from(m, a, kw, "_codecs.encode")


def _h_bytes(m: Machine, a: tuple, kw: dict) -> bytes:
    return _bytes_from(m, a, kw, "bytes")


def _h_bytearray(m: Machine, a: tuple, kw: dict) -> bytearray:
    return bytearray(_bytes_from(m, a, kw, "bytearray"))


def _h_complex(m: Machine, a: tuple, kw: dict) -> complex:
    if kw or not 1 <= len(a) <= 2 or not all(type(x) in (int, float) for x in a):
        raise m.error("complex expects one or two numbers")
    if any(type(x) is int and not -_FLOAT_INT_LIMIT < x < _FLOAT_INT_LIMIT for x in a):
        raise m.error("complex: an integer argument does not fit in a float")
    return complex(*a)


_FLOAT_INT_LIMIT = 1 << 1023  # integers below this convert to a finite float


def _h_slice(m: Machine, a: tuple, kw: dict) -> slice:
    if kw or not 1 <= len(a) <= 3 or not all(x is None or type(x) is int for x in a):
        raise m.error("slice expects up to three integers or None")
    return slice(*a)


def _h_size(m: Machine, a: tuple, kw: dict) -> tuple[int, ...]:
    if kw or len(a) > 1:
        raise m.error("torch.Size expects one sequence")
    return _shape_arg(m, a[0] if a else (), "torch.Size")


def _h_device(m: Machine, a: tuple, kw: dict) -> Device:
    if (kw or not 1 <= len(a) <= 2 or not isinstance(a[0], str) or len(a[0]) > 64
            or (len(a) == 2 and (type(a[1]) is not int or not -1 <= a[1] < 1 << 16))):
        raise m.error("torch.device expects (type[, index]) with a short type name and a small index")
    return Device(a[0] if len(a) == 1 else f"{a[0]}:{a[1]}")


_NUMPY_CODES = frozenset({"b1", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8"})


def _h_numpy_dtype(m: Machine, a: tuple, kw: dict) -> NumpyDtype:
    if kw or not 1 <= len(a) <= 3 or not isinstance(a[0], str) or len(a[0]) > 64:
        raise m.error("numpy.dtype expects (code, align, copy)")
    return NumpyDtype(a[0], known=a[0] in _NUMPY_CODES)


def _h_numpy_scalar(m: Machine, a: tuple, kw: dict) -> Any:
    """numpy.core.multiarray.scalar(dtype, raw): decoded from the raw bytes, numpy's pickle code unused."""
    if kw or len(a) != 2 or not isinstance(a[0], NumpyDtype):
        raise m.error("numpy scalar expects (dtype, bytes)")
    dt, raw = a
    if not dt.known or not isinstance(raw, (bytes, bytearray)):
        return Opaque(f"numpy scalar of dtype {dt.code}")
    order = "<" if dt.byteorder in ("|", "=") else dt.byteorder
    npdt = np.dtype(order + dt.code)
    if len(raw) != npdt.itemsize:
        raise m.error(f"numpy scalar of dtype {dt.code} with {len(raw)} bytes")
    return np.frombuffer(raw, dtype=npdt)[0].item()


def _h_numpy_reconstruct(m: Machine, a: tuple, kw: dict) -> NumpyArray:
    if kw or len(a) != 3 or not isinstance(a[0], TorchType) or a[0].name != "numpy.ndarray":
        raise m.error("numpy _reconstruct expects (numpy.ndarray, shape, typecode)")
    return NumpyArray()


def _h_numpy_frombuffer(m: Machine, a: tuple, kw: dict) -> NumpyArray:
    """numpy's protocol-5 reduction (buffer, dtype, shape, order): recorded, never rebuilt."""
    if kw or len(a) != 4 or not isinstance(a[2], tuple):
        raise m.error("numpy _frombuffer expects (buffer, dtype, shape, order)")
    dtype = a[1] if isinstance(a[1], NumpyDtype) else None
    return NumpyArray(_shape_arg(m, a[2], "numpy array shape"), dtype)


def _record_class(name: str) -> Builtin:
    """A plain-data class: calling it (NEWOBJ, REDUCE) makes a `Record` of its arguments; BUILD gives it
    its state. Nothing of the class is imported or run."""

    def handler(m: Machine, a: tuple, kw: dict) -> Record:
        if kw:
            raise m.error(f"{name} takes no keyword arguments here")
        m.charge(_PLACEHOLDER_SIZE)
        return Record(name, a)

    return Builtin(name, handler)


def _h_get_layout(m: Machine, a: tuple, kw: dict) -> Record:
    """`torch.serialization._get_layout("torch.strided")`: the layout's name, as a record."""
    if kw or len(a) != 1 or not isinstance(a[0], str) or a[0] not in _LAYOUTS:
        raise m.error("_get_layout expects one layout name such as 'torch.strided'")
    return Record("torch.layout", (a[0],))


_LAYOUTS = frozenset({"torch.strided", "torch.sparse_coo", "torch.sparse_csr", "torch.sparse_csc",
                      "torch.sparse_bsr", "torch.sparse_bsc", "torch._mkldnn", "torch.jagged"})

RECORD_CLASSES = (
    # what torch.distributed.checkpoint writes in `.metadata` (torch 2.x)
    "torch.distributed.checkpoint.metadata.Metadata",
    "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
    "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
    "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
    "torch.distributed.checkpoint.metadata.TensorProperties",
    "torch.distributed.checkpoint.metadata.MetadataIndex",
    "torch.distributed.checkpoint.metadata.StorageMeta",
    "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    "torch.distributed.checkpoint._hf_utils._HFStorageInfo",
    # what megatron-core adds there: 0.16 keeps every rank's SavePlan in `Metadata.all_local_plans`,
    # <= 0.15 pickled its own Metadata subclass (with `mcore_data`) and SavePlan subclass
    "torch.distributed.checkpoint.planner.SavePlan",
    "torch.distributed.checkpoint.planner.WriteItem",
    "torch.distributed.checkpoint.planner.WriteItemType",
    "torch.distributed.checkpoint.planner.TensorWriteData",
    "torch.distributed.checkpoint.planner.BytesIOWriteData",
    "megatron.core.dist_checkpointing.strategies.torch.MCoreMetadata",
    "megatron.core.dist_checkpointing.strategies.torch.MCoreSavePlan",
    # what a pickled DTensor's spec holds (per-rank torch.save files)
    "torch.distributed.tensor._dtensor_spec.DTensorSpec",
    "torch.distributed.tensor._dtensor_spec.TensorMeta",
    "torch.distributed.tensor._dtensor_spec.ShardOrderEntry",
    "torch.distributed.tensor.placement_types.Shard",
    "torch.distributed.tensor.placement_types.Replicate",
    "torch.distributed.tensor.placement_types.Partial",
    "torch.distributed.tensor.placement_types._StridedShard",
    "torch.distributed._tensor.placement_types.Shard",
    "torch.distributed._tensor.placement_types.Replicate",
    "torch.distributed._tensor.placement_types._StridedShard",
    "torch.distributed._tensor.placement_types.DTensorSpec",
    "torch.distributed._tensor.placement_types.TensorMeta",
    "torch.distributed.device_mesh.DeviceMesh",
    "torch.distributed._mesh_layout._MeshLayout",
    "torch.distributed._mesh_layout._FlatLayout",
    # what a pickled ShardedTensor holds (FSDP1's per-rank torch.save files), `_sharded_tensor`
    _SHARD,
    "torch.distributed._shard.metadata.ShardMetadata",
    "torch.distributed.remote_device._remote_device",
    "torch.distributed._shard.sharded_tensor.metadata.ShardedTensorMetadata",
    "torch.distributed._shard.sharded_tensor.metadata.TensorProperties",
    "torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING",
    "torch.distributed._shard.sharding_spec.chunk_sharding_spec.ChunkShardingSpec",
    "torch.distributed._shard.sharding_spec.api.EnumerableShardingSpec",
    # Megatron-LM's checkpoint `args` (the script's parsed arguments): its fields, read as data
    "argparse.Namespace",
)
"""Classes whose objects are read as `Record`s: plain data (sizes, offsets, names, placements)."""


def _h_zero_stage(m: Machine, a: tuple, kw: dict) -> int:
    """DeepSpeed's `ZeroStageEnum(n)` (an int Enum in its optimizer states): the stage as a plain int."""
    if kw or len(a) != 1 or type(a[0]) is not int or not 0 <= a[0] <= 3:
        raise m.error("ZeroStageEnum expects one stage number 0-3")
    return a[0]


def _builtin(name: str, fn: Handler | None) -> Builtin:
    return Builtin(name, fn)


def _make_table() -> dict[tuple[str, str], Any]:
    t: dict[tuple[str, str], Any] = {}
    u = "torch._utils"
    for fname, fn in (("_rebuild_tensor", _h_rebuild_tensor), ("_rebuild_tensor_v2", _h_rebuild_tensor_v2),
                      ("_rebuild_tensor_v3", _h_rebuild_tensor_v3),
                      ("_rebuild_parameter", _h_rebuild_parameter),
                      ("_rebuild_parameter_with_state", _h_rebuild_parameter)):
        t[(u, fname)] = _builtin(f"{u}.{fname}", fn)
    for kind, fname in (("quantized", "_rebuild_qtensor"), ("sparse", "_rebuild_sparse_tensor"),
                        ("sparse CSR", "_rebuild_sparse_csr_tensor"), ("nested", "_rebuild_nested_tensor"),
                        ("meta (no data)", "_rebuild_meta_tensor_no_storage"),
                        ("wrapper subclass", "_rebuild_wrapper_subclass"),
                        ("numpy-backed device", "_rebuild_device_tensor_from_numpy"),
                        ("device", "_rebuild_device_tensor_from_cpu_tensor"),
                        ("XLA", "_rebuild_xla_tensor"), ("MKL-DNN", "_rebuild_mkldnn_tensor")):
        t[(u, fname)] = _builtin(f"{u}.{fname}", _unsupported(kind))
    for mod in ("torch._tensor", "torch.tensor"):
        t[(mod, "_rebuild_from_type_v2")] = _builtin(f"{mod}._rebuild_from_type_v2", _h_rebuild_from_type)
        t[(mod, "_rebuild_from_type")] = _builtin(f"{mod}._rebuild_from_type", _h_rebuild_from_type)
    for mod in ("torch", "torch.cuda", "torch.storage"):
        for sname, dt in _STORAGE_DTYPES.items():
            t[(mod, sname)] = StorageType(sname, dt)
    for dname in ELEMENT_SIZES:
        t[("torch", dname)] = TorchDtype(dname)
    for alias, dname in _DTYPE_ALIASES.items():
        t[("torch", alias)] = TorchDtype(dname)
    t[("torch", "Size")] = _builtin("torch.Size", _h_size)
    t[("torch", "device")] = _builtin("torch.device", _h_device)
    for name in ("torch.Tensor", "torch.nn.parameter.Parameter", "torch.nn.parameter.Buffer",
                 "torch.autograd.variable.Variable", "numpy.ndarray"):
        mod, _, short = name.rpartition(".")
        t[(mod, short)] = TorchType(name)
    t[("torch.nn", "Parameter")] = TorchType("torch.nn.parameter.Parameter")
    for prefix in ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool"):
        for mod in ("torch", "torch.cuda"):  # legacy tar files name the tensor class
            t[(mod, f"{prefix}Tensor")] = TorchType(f"{mod}.{prefix}Tensor")
    for name in RECORD_CLASSES:
        mod, _, short = name.rpartition(".")
        t[(mod, short)] = _record_class(name)
    # protocol 4 names a nested class by its qualified name (STACK_GLOBAL module, "Outer.Inner"), where
    # protocols 2-3 pickle getattr(Outer, "Inner") (`_h_getattr`): the same record class either way
    t[(_PROCESS_GROUP_STATE[:-len(".ShardedTensor.ProcessGroupState")], "ShardedTensor.ProcessGroupState")] = \
        _record_class(_PROCESS_GROUP_STATE)
    t[("torch.serialization", "_get_layout")] = _builtin("torch.serialization._get_layout", _h_get_layout)
    t[("collections", "OrderedDict")] = _builtin("collections.OrderedDict", _h_ordered_dict)
    t[("collections", "defaultdict")] = _builtin("collections.defaultdict", _h_defaultdict)
    t[("builtins", "set")] = _builtin("builtins.set", _h_set)
    t[("builtins", "frozenset")] = _builtin("builtins.frozenset", _h_frozenset)
    t[("builtins", "list")] = _builtin("builtins.list", _h_list)
    t[("builtins", "tuple")] = _builtin("builtins.tuple", _h_tuple)
    t[("builtins", "dict")] = _builtin("builtins.dict", _h_dict)
    t[("builtins", "bytes")] = _builtin("builtins.bytes", _h_bytes)
    t[("builtins", "bytearray")] = _builtin("builtins.bytearray", _h_bytearray)
    t[("builtins", "complex")] = _builtin("builtins.complex", _h_complex)
    t[("builtins", "slice")] = _builtin("builtins.slice", _h_slice)
    t[("builtins", "getattr")] = _builtin("builtins.getattr", _h_getattr)
    t[("_codecs", "encode")] = _builtin("_codecs.encode", _h_codecs_encode)
    t[("numpy", "dtype")] = _builtin("numpy.dtype", _h_numpy_dtype)
    zero = "deepspeed.runtime.zero.config"  # the only DeepSpeed class whose value a ZeRO reader needs
    t[(zero, "ZeroStageEnum")] = _builtin(f"{zero}.ZeroStageEnum", _h_zero_stage)
    t[("numpy.core.multiarray", "scalar")] = _builtin("numpy.core.multiarray.scalar", _h_numpy_scalar)
    t[("numpy.core.multiarray", "_frombuffer")] = _builtin("numpy.core.numeric._frombuffer", _h_numpy_frombuffer)
    t[("numpy.core.multiarray", "_reconstruct")] = _builtin("numpy.core.multiarray._reconstruct",
                                                            _h_numpy_reconstruct)
    return t


_TABLE = _make_table()
_REBUILD_V2 = _TABLE[("torch._utils", "_rebuild_tensor_v2")]
_ORDERED_DICT = _TABLE[("collections", "OrderedDict")]


def _resolve(module: str, name: str) -> Any:
    return _TABLE.get((module, name))



def _private_module(top: str) -> bool:
    """A top-level module named with one leading underscore: the standard library's C halves
    (`_operator`, `_functools`, `_posixsubprocess`, `_thread`, `_ctypes`, ...) are as code-running as
    their public names, and a checkpoint's data never needs one the allow-list does not name
    (`_codecs.encode` is allow-listed, so resolved before this). `__main__`, where a script's own
    classes live, stays a placeholder."""
    return top.startswith("_") and not top.startswith("__")


def _is_gadget(name: str) -> bool:
    """Globals whose call could run code under pickle: refused at once, never a placeholder.

    Anything in a code-running module of the standard library, and torch's functions (torch's
    classes outside the allow-list, such as `torch.nn` modules, become placeholders).
    """
    module, _, short = name.rpartition(".")
    top = module.split(".")[0]
    if top in _DANGEROUS_MODULES or _private_module(top):
        return True
    return top == "torch" and not short[:1].isupper()


def _make_frozenset(m: Machine, items: list[Any]) -> frozenset:
    m.charge(_SET_SIZE)
    counts: dict[int, int] = {}
    members: set[Any] = set()
    for x in items:
        members.add(m.key(x, counts, members))
    return frozenset(members)
