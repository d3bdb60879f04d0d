"""Writes a zip-format PyTorch state_dict that `torch.load(path, weights_only=True)` accepts.

The layout mirrors what `torch.save` writes (torch 2.x, protocol-2 pickle): `archive/data.pkl`
(an OrderedDict of `_rebuild_tensor_v2`/`_v3` calls whose persistent ids name storages),
`archive/.format_version`, `archive/.storage_alignment`, `archive/byteorder` = little, one
`archive/data/<i>` per storage, `archive/version`. Members are stored uncompressed with their data
aligned to 64 bytes (so torch can mmap them) and correct CRC-32s; zip64 records are used when an
offset or size needs them.

A zip local header holds its member's CRC-32. A file-backed tensor is read once in chunks for its
CRC just before its header, then moved by `streaming.write_tensor` in the kernel from the page
cache. A large computed tensor (cast, transpose) is streamed piece by piece, made ahead on a thread
(`streaming.Ahead`) and checksummed as written; its header's CRC field is filled in afterwards. A
small one, or any on a sink that cannot seek back, is made whole and checksummed before its header.

Without a `structure`, only tensors are written, as one flat OrderedDict: a state_dict must hold
nothing else for `load_state_dict`, so metadata and scalars are not carried into `.pt` (they are
listed in `dropped`). With one (`formats.pytorch.tree.Node`, a checkpoint's containers as the plan
placed its tensors), the pickle is that tree: dicts, OrderedDicts (with a state_dict's `_metadata`),
lists, tuples, None, bools, ints, floats and strings, each tensor in its slot, still with only the
globals and opcodes `torch.load(weights_only=True)` accepts.
"""

from __future__ import annotations

import builtins
import os
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from ..core.dtypes import DType
from ..core.errors import PlanError, TensorBytesSizeMismatchError, UnsupportedDTypeError
from ..core.scalars import Scalar
from ..core.streaming import SMALL_READ, Ahead, write_all, write_computed, write_tensor
from ..core.tensor import LazyTensor
from .base import Writer
from .pytorch.tree import Node, TensorSlot, is_ordered_dict

ARCHIVE = "archive"
ALIGNMENT = 64
_Z32 = 0xFFFFFFFF
_CRC_CHUNK = 4 << 20
_LOCAL_CRC_AT = 14  # offset of the CRC-32 field in a zip local file header

# dtypes torch still pickles through a legacy typed storage class (_rebuild_tensor_v2)
_TYPED_STORAGES = {
    "float64": "DoubleStorage", "float32": "FloatStorage", "float16": "HalfStorage",
    "bfloat16": "BFloat16Storage", "int64": "LongStorage", "int32": "IntStorage", "int16": "ShortStorage",
    "int8": "CharStorage", "uint8": "ByteStorage", "bool": "BoolStorage", "complex64": "ComplexFloatStorage",
}


@dataclass
class _Member:
    name: str
    offset: int  # local header
    header: int  # bytes of local header + name + extra
    size: int
    payload: bytes | None = None  # small records
    storage: int | None = None  # index into the storage table
    crc: int = 0

    @property
    def zip64(self) -> bool:
        return self.size >= _Z32

    @property
    def end(self) -> int:
        return self.offset + self.header + self.size


class PytorchWriter(Writer):
    """Plans a torch.save-compatible zip archive up front, then streams it."""

    format = "pytorch"
    default_extension = ".pt"

    def __init__(
        self,
        tensors: Sequence[LazyTensor],
        *,
        metadata: Mapping[str, str] | None = None,
        scalars: Mapping[str, Scalar] | None = None,
        force_zip64: bool = False,
        structure: Node | None = None,
    ) -> None:
        super().__init__(tensors, metadata=metadata, scalars=scalars)
        self.dropped = sorted(self.metadata) + sorted(self.scalars)
        self._force_zip64 = force_zip64
        self._structure = structure
        seen: set[str] = set()
        for t in self.tensors:
            if t.name in seen:
                raise PlanError("duplicate tensor name", tensor=t.name)
            seen.add(t.name)
            _torch_dtype(t)
            expected = t.dtype.nbytes(t.shape)
            if expected != t.nbytes:
                raise PlanError(f"declares {t.nbytes} bytes but {t.dtype.display}{list(t.shape)} needs "
                                f"{expected}", file=t.origin, tensor=t.name)
            if expected == 0:  # only an empty tensor can declare sizes torch cannot hold (see below)
                _check_torch_sizes(t)
            try:
                t.name.encode("utf-8")
            except UnicodeEncodeError:
                raise PlanError("name is not valid UTF-8 text", tensor=t.name) from None
        if structure is not None:
            _check_slots(structure, seen)
        # One storage per distinct byte range: tensors that were tied in the source stay tied.
        self._storage_of: list[int] = []
        self._storages: list[LazyTensor] = []
        by_span: dict[tuple[object, int, int, str], int] = {}
        for t in self.tensors:
            key = span_key(t) if t.span is not None else None
            if key is not None and key in by_span:
                self._storage_of.append(by_span[key])
                continue
            idx = len(self._storages)
            self._storages.append(t)
            self._storage_of.append(idx)
            if key is not None:
                by_span[key] = idx
        self._pickle = self._build_pickle()
        self._plan()

    # ------------------------------------------------------------------------------------------

    @property
    def total_size(self) -> int:
        return self._total

    def shared_storages(self) -> list[list[str]]:
        """Groups of tensor names written into one storage."""
        groups: dict[int, list[str]] = {}
        for t, s in zip(self.tensors, self._storage_of, strict=True):
            groups.setdefault(s, []).append(t.name)
        return [g for g in groups.values() if len(g) > 1]

    def _plan(self) -> None:
        records: list[tuple[str, bytes | None, int | None]] = [
            (f"{ARCHIVE}/data.pkl", self._pickle, None),
            (f"{ARCHIVE}/.format_version", b"1", None),
            (f"{ARCHIVE}/.storage_alignment", str(ALIGNMENT).encode(), None),
            (f"{ARCHIVE}/byteorder", b"little", None),
        ]
        records += [(f"{ARCHIVE}/data/{i}", None, i) for i in range(len(self._storages))]
        records.append((f"{ARCHIVE}/version", b"3\n", None))
        self._members: list[_Member] = []
        pos = 0
        for name, payload, storage in records:
            size = len(payload) if payload is not None else self._storages[storage].nbytes  # type: ignore[index]
            m = _Member(name, pos, 0, size, payload, storage)
            if payload is not None:
                m.crc = zlib.crc32(payload)
            m.header = len(self._local_header(m))
            self._members.append(m)
            pos = m.end
        self._cd_offset = pos
        self._cd_size = sum(len(self._central_entry(m)) for m in self._members)
        self._total = pos + self._cd_size + len(self._end_records())

    # ------------------------------------------------------------------------------------------
    # zip records

    def _zip64_needed(self, m: _Member) -> bool:
        return self._force_zip64 or m.zip64

    def _local_header(self, m: _Member) -> bytes:
        name = m.name.encode()
        z64 = self._zip64_needed(m)
        extra = struct.pack("<HHQQ", 1, 16, m.size, m.size) if z64 else b""
        size32 = _Z32 if z64 else m.size
        fixed = 30 + len(name) + len(extra)
        start = m.offset + fixed
        if start % ALIGNMENT:
            pad = (-(start + 4)) % ALIGNMENT
            extra += struct.pack("<HH", 0x4246, pad) + b"Z" * pad  # 'FB' padding field, as torch writes
        return struct.pack("<IHHHHHIIIHH", 0x04034B50, 45 if z64 else 20, 0, 0, 0, 0, m.crc, size32, size32,
                           len(name), len(extra)) + name + extra

    def _central_entry(self, m: _Member) -> bytes:
        name = m.name.encode()
        big_size = self._force_zip64 or m.size >= _Z32
        big_off = self._force_zip64 or m.offset >= _Z32
        vals = ([m.size, m.size] if big_size else []) + ([m.offset] if big_off else [])
        extra = struct.pack(f"<HH{len(vals)}Q", 1, 8 * len(vals), *vals) if vals else b""
        size32 = _Z32 if big_size else m.size
        return struct.pack(
            "<IHHHHHHIIIHHHHHII", 0x02014B50, 45 if vals else 20, 45 if vals else 20, 0, 0, 0, 0, m.crc,
            size32, size32, len(name), len(extra), 0, 0, 0, 0, _Z32 if big_off else m.offset,
        ) + name + extra

    def _end_records(self) -> bytes:
        n = len(self._members)
        cd_off, cd_size = self._cd_offset, self._cd_size
        z64 = self._force_zip64 or n >= 0xFFFF or cd_off >= _Z32 or cd_size >= _Z32
        out = b""
        if z64:
            z64_off = cd_off + cd_size
            out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, cd_size, cd_off)
            out += struct.pack("<IIQI", 0x07064B50, 0, z64_off, 1)
        out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF),
                           min(cd_size, _Z32), min(cd_off, _Z32), 0)
        return out

    # ------------------------------------------------------------------------------------------
    # pickle

    def _build_pickle(self) -> bytes:
        p = _Pickle()
        p.raw(b"\x80\x02")
        if self._structure is not None:
            self._emit_structure(p, self._structure)
            p.raw(b".")
            return p.getvalue()
        p.global_("collections", "OrderedDict")
        p.raw(b")R")
        p.put()
        for batch_start in range(0, len(self.tensors), 1000):
            p.raw(b"(")
            for i in range(batch_start, min(batch_start + 1000, len(self.tensors))):
                p.unicode(self.tensors[i].name)
                self._emit_tensor(p, i)
            p.raw(b"u")
        p.raw(b".")
        return p.getvalue()

    def _emit_tensor(self, p: _Pickle, i: int) -> None:
        """`_rebuild_tensor_v2(storage, 0, shape, strides, False, OrderedDict())` (v3 with its dtype for
        dtypes without a typed storage class), as torch.save writes a contiguous tensor."""
        t, s = self.tensors[i], self._storage_of[i]
        storage = self._storages[s]
        dtype_name = _torch_dtype(t)
        typed = _TYPED_STORAGES.get(dtype_name)
        p.global_("torch._utils", "_rebuild_tensor_v2" if typed else "_rebuild_tensor_v3")
        p.raw(b"((")
        p.unicode("storage")
        if typed:
            p.global_("torch", typed)
            numel = storage.nbytes // (storage.dtype.itemsize or 1)
        else:
            p.global_("torch.storage", "UntypedStorage")
            numel = storage.nbytes
        p.unicode(str(s))
        p.unicode("cpu")
        p.int(numel)
        p.raw(b"tQ")
        p.int(0)
        p.tuple(t.shape)
        p.tuple(_contiguous_strides(t.shape))
        p.raw(b"\x89")  # requires_grad False
        p.global_("collections", "OrderedDict")
        p.raw(b")R")  # backward hooks: an empty OrderedDict, as torch writes
        if not typed:
            p.global_("torch", dtype_name)
        p.raw(b"tR")

    def _emit_structure(self, p: _Pickle, root: Node) -> None:
        """The checkpoint's containers with their values, each tensor where its slot is; only opcodes and
        globals torch.load(weights_only=True) accepts. A loop, not recursion: nesting may go 1000 deep.
        A container without tensors is memoized: where the source shared it, the output shares it too."""
        index = {t.name: i for i, t in enumerate(self.tensors)}
        memo: dict[int, int] = {}  # id(Node) -> memo index, for Nodes without tensors
        _open(p, root, memo)
        stack: list[tuple[Node, int]] = [(root, 0)]
        while stack:
            node, i = stack.pop()
            while i < len(node.values):
                if i and i % 1000 == 0 and node.kind != "tuple":  # a mark's items stay on the stack: batches
                    p.raw(b"u(" if node.kind != "list" else b"e(")
                if node.kind in ("dict", "odict"):
                    _plain(p, node.keys[i])
                value = node.values[i]
                i += 1
                if isinstance(value, Node) and id(value) in memo:
                    p.get(memo[id(value)])
                elif isinstance(value, Node):
                    stack.append((node, i))
                    _open(p, value, memo)
                    node, i = value, 0
                elif isinstance(value, TensorSlot):
                    self._emit_tensor(p, index[value.name])
                else:
                    self._emit_value(p, value)
            _close(p, node, memo)

    def _emit_value(self, p: _Pickle, value: Any) -> None:
        """A leaf of the structure that is no tensor: a plain value."""
        _plain(p, value)

    # ------------------------------------------------------------------------------------------
    # streaming

    def write_to(self, sink: BinaryIO) -> None:
        seekable = _seekable(sink)
        # where the archive starts: 0 for a file of its own, the item's offset inside a DCP `.distcp` file
        self._base = sink.tell() if seekable else 0
        with Ahead(self._storages if seekable else ()) as ahead:
            for m in self._members:
                if m.payload is not None:
                    write_all(sink, self._local_header(m))
                    write_all(sink, m.payload)
                    continue
                assert m.storage is not None
                tensor = self._storages[m.storage]
                if tensor.span is not None:
                    m.crc = _crc_span(tensor)
                    write_all(sink, self._local_header(m))
                    write_tensor(sink, tensor)  # file-backed: copied in the kernel where possible
                elif seekable and tensor.nbytes > SMALL_READ:  # a small one: cheaper whole than seeking back
                    self._stream_computed(sink, m, tensor, ahead)
                else:
                    self._write_computed_whole(sink, m, tensor)
        for m in self._members:
            write_all(sink, self._central_entry(m))
        write_all(sink, self._end_records())

    def _stream_computed(self, sink: BinaryIO, m: _Member, tensor: LazyTensor, ahead: Ahead) -> None:
        """Stream a computed tensor piece by piece (made ahead on a thread), checksumming as it goes,
        then fill in its local header's CRC field: no whole-tensor buffer, no second pass."""
        write_all(sink, self._local_header(m))  # CRC 0 for now
        crc = 0

        def checksum(view: memoryview) -> None:
            nonlocal crc
            crc = zlib.crc32(view, crc)

        write_computed(sink, tensor, ahead, checksum)
        m.crc = crc
        sink.seek(self._base + m.offset + _LOCAL_CRC_AT)
        write_all(sink, struct.pack("<I", crc))
        sink.seek(self._base + m.end)

    def _write_computed_whole(self, sink: BinaryIO, m: _Member, tensor: LazyTensor) -> None:
        """For a sink that cannot seek back: the whole tensor at once, checksummed before its header."""
        view = tensor.data()
        try:
            m.crc = _crc(view)
            write_all(sink, self._local_header(m))
            for start in range(0, len(view), _CRC_CHUNK):
                write_all(sink, view[start : start + _CRC_CHUNK])
        finally:
            view.release()


def _open(p: _Pickle, node: Node, memo: dict[int, int]) -> None:
    """A container's start; one without tensors is memoized here (a tuple once it is built)."""
    if node.kind == "tuple":
        p.raw(b"(")
        return
    if node.kind == "odict":
        p.global_("collections", "OrderedDict")
        p.raw(b")R")
    else:
        p.raw(b"}" if node.kind == "dict" else b"]")
    if not node.tensors:
        memo[id(node)] = p.put()
    p.raw(b"(")


def _close(p: _Pickle, node: Node, memo: dict[int, int]) -> None:
    p.raw({"dict": b"u", "odict": b"u", "list": b"e", "tuple": b"t"}[node.kind])
    if node.kind == "tuple" and not node.tensors:
        memo[id(node)] = p.put()
    if node.attrs:  # an OrderedDict's BUILD state (a state_dict's _metadata), as torch.save writes it
        _plain(p, node.attrs)
        p.raw(b"b")


def _plain(p: _Pickle, value: object) -> None:
    """None, a bool, int, float or str; or a dict of those (at most 3 deep: a state_dict's _metadata,
    which `tree._module_versions` checked)."""
    if value is None:
        p.raw(b"N")
    elif value is True or value is False:
        p.raw(b"\x88" if value else b"\x89")
    elif type(value) is int:
        p.int(value)
    elif type(value) is float:
        p.raw(b"G" + struct.pack(">d", value))
    elif type(value) is str:
        p.unicode(value)
    elif isinstance(value, dict):  # an OrderedDict stays one, a dict a dict
        if is_ordered_dict(value):
            p.global_("collections", "OrderedDict")
            p.raw(b")R(")
        else:
            p.raw(b"}(")
        for k, v in value.items():
            _plain(p, k)
            _plain(p, v)
        p.raw(b"u")
    else:
        raise TypeError(f"not a plain value: {type(value).__name__}")


def _check_slots(root: Node, names: set[str]) -> None:
    """Every tensor in exactly one slot, every slot a tensor: else the pickle would not hold the data."""
    placed: set[str] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        for v in node.values:
            if isinstance(v, Node):
                todo.append(v)
            elif isinstance(v, TensorSlot):
                if v.name not in names:
                    raise PlanError("the checkpoint structure names a tensor that is not written", tensor=v.name)
                if v.name in placed:
                    raise PlanError("the checkpoint structure holds this tensor twice", tensor=v.name)
                placed.add(v.name)
    if len(placed) != len(names):
        missing = sorted(names - placed)
        raise PlanError("the checkpoint structure has no place for this tensor", tensor=missing[0])


def _seekable(sink: BinaryIO) -> bool:
    try:
        return bool(sink.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def _torch_dtype(t: LazyTensor) -> str:
    dt: DType = t.dtype
    if dt.torch_name is None:
        raise UnsupportedDTypeError(f"PyTorch has no dtype for {dt.display}; cast it first (e.g. to F32 "
                                    "or U8) before writing .pt", file=t.origin, tensor=t.name)
    return dt.torch_name


_I64_MAX, _U64_MAX = (1 << 63) - 1, (1 << 64) - 1


def _check_torch_sizes(t: LazyTensor) -> None:
    """Refuse what torch.load cannot rebuild: sizes and strides are int64, and the element count is
    multiplied out left to right in uint64, so an overflow before a 0 still fails ([2**40, 2**40, 0]).
    A tensor with bytes has sizes bounded by its byte count; only empty ones need this."""
    numel = 1
    for d in t.shape:
        if d > _I64_MAX:
            raise PlanError(f"shape {list(t.shape)}: dimension {d} does not fit torch's int64 sizes (torch.load "
                            "could not read the file)", file=t.origin, tensor=t.name)
        numel *= d
        if numel > _U64_MAX:
            raise PlanError(f"shape {list(t.shape)}: torch's element count overflows 64 bits (torch.load "
                            "could not read the file)", file=t.origin, tensor=t.name)
    if max(_contiguous_strides(t.shape), default=0) > _I64_MAX:
        raise PlanError(f"shape {list(t.shape)}: its strides do not fit torch's int64 (torch.load could not "
                        "read the file)", file=t.origin, tensor=t.name)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


def _crc(view: memoryview) -> int:
    crc = 0
    for start in range(0, len(view), _CRC_CHUNK):
        crc = zlib.crc32(view[start : start + _CRC_CHUNK], crc)
    return crc


def span_key(t: LazyTensor) -> tuple[object, int, int, str]:
    """Which stored bytes a tensor is: its span's source object where it has one (a sharded source's
    descriptors are opened and closed per shard, so their numbers are reused), else the descriptor."""
    span = t.span
    assert span is not None
    source = getattr(span, "source", None)
    return (span.fd if source is None else source, span.offset, span.length, t.dtype.name)


def _crc_span(tensor: LazyTensor) -> int:
    """CRC-32 of a file-backed tensor read in chunks with pread: no mapping of the whole tensor stays
    resident, and the kernel copy that follows finds the pages in the page cache."""
    span = tensor.span
    assert span is not None
    crc, done = 0, 0
    buf = bytearray(min(_CRC_CHUNK, span.length))
    view = memoryview(buf)
    while done < span.length:
        n = os.preadv(span.fd, [view[: min(len(buf), span.length - done)]], span.offset + done)
        if n <= 0:
            raise TensorBytesSizeMismatchError(f"source ended after {done} of {span.length} bytes",
                                               file=tensor.origin, tensor=tensor.name)
        crc = zlib.crc32(view[:n], crc)
        done += n
    return crc


class _Pickle:
    """A tiny protocol-2 pickle emitter with a memo for repeated globals and strings."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._memo: dict[tuple[str, str], int] = {}
        self._next = 0

    def raw(self, b: bytes) -> None:
        self._parts.append(b)

    def put(self) -> int:
        idx = self._next
        self._next += 1
        self._parts.append(b"q" + bytes([idx]) if idx < 256 else b"r" + struct.pack("<I", idx))
        return idx

    def get(self, idx: int) -> None:
        self._parts.append(b"h" + bytes([idx]) if idx < 256 else b"j" + struct.pack("<I", idx))

    def global_(self, module: str, name: str) -> None:
        key = ("g", f"{module}\n{name}")
        if key in self._memo:
            self.get(self._memo[key])
            return
        self.raw(b"c" + f"{module}\n{name}\n".encode())
        self._memo[key] = self.put()

    def unicode(self, s: str) -> None:
        key = ("s", s)
        if key in self._memo:
            self.get(self._memo[key])
            return
        b = s.encode("utf-8")
        self.raw(b"X" + struct.pack("<I", len(b)) + b)
        if s in ("storage", "cpu"):
            self._memo[key] = self.put()

    def int(self, v: int) -> None:
        if 0 <= v < 256:
            self.raw(b"K" + bytes([v]))
        elif 0 <= v < 65536:
            self.raw(b"M" + struct.pack("<H", v))
        elif -(2**31) <= v < 2**31:
            self.raw(b"J" + struct.pack("<i", v))
        else:
            n = (v.bit_length() + 8) // 8
            self.raw(b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True))

    def tuple(self, values: builtins.tuple[builtins.int, ...]) -> None:
        if not values:
            self.raw(b")")
            return
        if len(values) <= 3:
            for v in values:
                self.int(v)
            self.raw(bytes([0x84 + len(values)]))
            return
        self.raw(b"(")
        for v in values:
            self.int(v)
        self.raw(b"t")

    def getvalue(self) -> bytes:
        return b"".join(self._parts)
