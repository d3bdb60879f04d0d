"""Burn's burnpack (`.bpk`) container: 10-byte header, CBOR metadata, 256-aligned tensor data.

Byte-compatible with burn-pack's writer and at least as strict as its reader (docs/burn-compatibility.md,
"The burnpack file").
"""

from __future__ import annotations

import itertools
import os
import struct
from array import array
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate, chain, compress, islice, repeat
from operator import add, and_, attrgetter, is_not, lt, ne, sub
from typing import Any, BinaryIO, ClassVar, TypeVar

from ..core import dtypes
from ..core.bytesource import ByteSource, FileSource
from ..core.dtypes import DType, Kind
from ..core.errors import FormatError, LimitExceededError, PlanError, UnsupportedDTypeError
from ..core.limits import DEFAULT_LIMITS, Limits
from ..core.scalars import SCALAR_KINDS, Scalar
from ..core.streaming import Ahead, write_all, write_tensor, write_zeros
from ..core.tensor import LazyTensor, stored, stored_many
from . import cbor
from .base import (
    Reader,
    Writer,
    WriterKind,
    check_u64_sizes,
    distinct_str_names,
    get_dtype,
    get_name,
    get_nbytes,
    get_shape,
    lengths_match,
    shapes_of,
    utf8_ok,
)

MAGIC = 0x4255524E  # "BURN" big-endian, stored little-endian: the file starts with b"NRUB"
VERSION = 1
HEADER_SIZE = 10
ALIGNMENT = 256
# Burn's own reader refuses files beyond these (burn-store), so the writer refuses to make them. The
# reader's bounds are `Limits` fields (max_metadata_bytes, max_tensors, max_tensor_bytes), by default these.
BURN_MAX_METADATA_SIZE = 100 * 1024 * 1024
BURN_MAX_TENSOR_COUNT = 100_000
BURN_MAX_TENSOR_SIZE = 10 * 1024**3
EXTENSION = ".bpk"


def align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def has_extension(path: str | os.PathLike[str]) -> bool:
    """Rust's `Path::extension().is_some()`: `model.` and `model.v1` have one, `.hidden` does not."""
    return os.path.splitext(os.path.basename(os.fspath(path)))[1] != ""


def resolve_read_path(path: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """Burn's reader rule: an extension-less path that does not exist means `path.bpk`."""
    if not has_extension(path) and not os.path.exists(path) and os.path.exists(os.fspath(path) + EXTENSION):
        return os.fspath(path) + EXTENSION
    return path


# ---------------------------------------------------------------------------------------- dtypes


def _dtype_to_cbor(dt: DType) -> Any:
    if dt.kind is Kind.QUANTIZED:
        assert dt.scheme is not None
        return {"QFloat": cbor.RawCbor(dt.scheme)}
    if dt.kind is Kind.BOOL:
        store = {"BOOL": "Native", "BOOL_U8": "U8", "BOOL_U32": "U32"}[dt.name]
        return {"Bool": store}
    if dt.burn_text is None:
        raise UnsupportedDTypeError(f"burnpack cannot hold {dt.display}")
    return dt.burn_text


def _dtype_from_cbor(value: Any) -> DType:
    if isinstance(value, str):
        dt = dtypes.BY_BURN_TEXT.get(value)
        if dt is not None and dt.kind is not Kind.QUANTIZED:
            return dt
        raise ValueError(f"unknown dtype {value!r}")
    if isinstance(value, cbor.CborMap) and len(value) == 1:
        (tag, inner), = value
        if tag == "Bool" and isinstance(inner, str) and inner in dtypes.BURN_BOOL_STORES:
            return dtypes.BURN_BOOL_STORES[inner]
        if tag == "QFloat" and isinstance(inner, cbor.CborMap):
            return dtypes.qfloat(cbor.encode(_plain(inner)))
    raise ValueError(f"unknown dtype {_plain(value)!r}")


def _plain(v: Any) -> Any:
    """CborMap -> dict (insertion order kept) for re-encoding and display."""
    if isinstance(v, cbor.CborMap):
        return {k: _plain(x) for k, x in v}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def describe_qfloat(dt: DType) -> Any:
    """The QFloat scheme as plain data, for `inspect`."""
    assert dt.scheme is not None
    return _plain(cbor.decode(dt.scheme))


# ------------------------------------------------------------------------------ reader fast path
# The metadata as Burn writes it: {"tensors": {name: {dtype, shape, data_offsets[, param_id]}},
# "metadata"?, "scalars"?}, "tensors" first, each descriptor's fields in that order. `_Scanner`
# reads exactly that grammar, byte by byte, without building a CborMap per tensor: each CBOR head is
# decoded as the generic decoder decodes it, so what it accepts decodes to the same values there.
# Anything outside the grammar (QFloat, tags, indefinite lengths, other fields or field orders, long
# names) raises `_NotMyShape`, and the generic decoder reads the file and gives its messages; any
# other exception is a bug. The rest of the root map always goes through the generic decoder.

_TEXT_DTYPES: dict[bytes, DType] = {
    **{cbor.encode(dt.burn_text): dt for dt in dtypes.ALL if dt.burn_text and dt.kind is not Kind.QUANTIZED},
    **{cbor.encode({"Bool": store}): dt for store, dt in dtypes.BURN_BOOL_STORES.items()},
}
_DTYPE_KEY, _SHAPE_KEY, _OFFSETS_KEY, _PARAM_ID_KEY = (cbor.encode(k) for k in ("dtype", "shape", "data_offsets",
                                                                                 "param_id"))
_OFFSETS_PAIR = _OFFSETS_KEY + b"\x82"  # "data_offsets": [start, end]
_UINT_WIDTH = {0x18: 1, 0x19: 2, 0x1A: 4, 0x1B: 8}  # an unsigned integer's head -> bytes after it
_MAX_KEY = 1 + len(_DTYPE_KEY) + max(map(len, _TEXT_DTYPES)) + len(_SHAPE_KEY) + 1 + 23 * 9
"""The longest descriptor prefix the scanner reads: map head, dtype, shape of at most 23 u64 dimensions."""
_PAD = b"\xff" * 64
"""Appended to the bytes scanned: 0xff (CBOR's "break") is no head the scanner accepts, so a read past
the end sees a byte that is not its shape instead of raising IndexError; 64 covers the longest step."""
_T = TypeVar("_T")
_Columns = tuple[list[str], Sequence[DType], Sequence[tuple[int, ...]], list[int], Sequence[int],
                 list[int | None] | None]
"""What `stored_many` takes: names, dtypes, shapes, offsets, lengths, param_ids."""
_BATCH = 8192  # descriptors encoded per batch by the writer: transient objects for 8k tensors, not all


class _NotMyShape(Exception):
    """Metadata outside the scanner's grammar: the generic decoder reads it (and explains any error)."""


def _describe(key: bytes, max_tensor_bytes: int) -> tuple[bool, DType, tuple[int, ...], int]:
    """(has param_id, dtype, shape, byte length) of a descriptor prefix: a 3- or 4-field map head,
    "dtype" and a known dtype, "shape" and an array of at most 23 unsigned integers, and nothing
    more; with the checks `_descriptor` makes on them. _NotMyShape for anything else."""
    if key[:1] not in (b"\xa3", b"\xa4") or not key.startswith(_DTYPE_KEY, 1):
        raise _NotMyShape
    pos = 1 + len(_DTYPE_KEY)
    found = next(((enc, dt) for enc, dt in _TEXT_DTYPES.items() if key.startswith(enc + _SHAPE_KEY, pos)), None)
    if found is None:
        raise _NotMyShape
    enc, dt = found
    pos += len(enc) + len(_SHAPE_KEY)
    head = key[pos] if pos < len(key) else 0
    if not 0x80 <= head <= 0x97:
        raise _NotMyShape
    pos += 1
    dims = []
    for _ in range(head - 0x80):
        b = key[pos] if pos < len(key) else 0xFF
        if b < 0x18:
            dims.append(b)
            pos += 1
            continue
        width = _UINT_WIDTH.get(b)
        if width is None or pos + 1 + width > len(key):
            raise _NotMyShape
        dims.append(int.from_bytes(key[pos + 1 : pos + 1 + width], "big"))
        pos += 1 + width
    if pos != len(key):
        raise _NotMyShape  # more than the shape before "data_offsets": another field order
    shape = tuple(dims)
    # every dtype here takes >= 1 byte per element, so this also refuses what `_descriptor`'s
    # element-count bound refuses
    nbytes = dt.nbytes(shape)
    if nbytes is None or nbytes > max_tensor_bytes:
        raise _NotMyShape
    return key[0] == 0xA4, dt, shape, nbytes


def _scan_descriptors(raw: bytes, pos: int, count: int) -> tuple[list[bytes], list[bytes], list[int], list[int],
                                                                  list[int | None], int]:
    """The `count` (name, descriptor) pairs from `pos`: names (UTF-8 bytes), descriptor prefixes (for
    `_describe`), starts, ends, param_ids, and the position after them; _NotMyShape if they are not
    all in the grammar."""
    end = len(raw)
    data = raw + _PAD
    find, from_bytes, width_of = data.find, int.from_bytes, _UINT_WIDTH.get
    pair, span = _OFFSETS_PAIR, _MAX_KEY + len(_OFFSETS_PAIR)
    names: list[bytes] = []
    keys: list[bytes] = []
    starts: list[int] = []
    ends: list[int] = []
    pids: list[int | None] = []
    for _ in range(count):  # unrolled: one pass per tensor is most of the scan's time
        h = data[pos]  # pos <= end here, and data has _PAD after end
        if 0x60 <= h <= 0x77:
            pos += 1
            name_end = pos + h - 0x60
        elif h == 0x78:
            pos += 2
            name_end = pos + data[pos - 1]
        elif h == 0x79:
            pos += 3
            name_end = pos + (data[pos - 2] << 8 | data[pos - 1])
        else:
            raise _NotMyShape
        if name_end > end:
            raise _NotMyShape
        k = find(pair, name_end, name_end + span)
        if k < 0:
            raise _NotMyShape
        names.append(data[pos:name_end])
        key = data[name_end:k]
        keys.append(key)
        pos = k + len(pair)
        b = data[pos]
        if b < 0x18:
            starts.append(b)
            pos += 1
        elif w := width_of(b):
            starts.append(from_bytes(data[pos + 1 : pos + 1 + w], "big"))
            pos += 1 + w
        else:
            raise _NotMyShape
        b = data[pos]
        if b < 0x18:
            ends.append(b)
            pos += 1
        elif w := width_of(b):
            ends.append(from_bytes(data[pos + 1 : pos + 1 + w], "big"))
            pos += 1 + w
        else:
            raise _NotMyShape
        if key[:1] == b"\xa4":  # a 4-field map: "param_id" follows the offsets (`_describe` checks the rest)
            if not data.startswith(_PARAM_ID_KEY, pos):
                raise _NotMyShape
            pos += len(_PARAM_ID_KEY)
            b = data[pos]
            if b < 0x18:
                pids.append(b)
                pos += 1
            elif w := width_of(b):
                pids.append(from_bytes(data[pos + 1 : pos + 1 + w], "big"))
                pos += 1 + w
            else:
                raise _NotMyShape
        else:
            pids.append(None)
        if pos > end:
            raise _NotMyShape
    return names, keys, starts, ends, pids, pos


def _reorder(column: list[_T], order: list[int]) -> list[_T]:
    return list(map(column.__getitem__, order))


def _tensor_map(raw: bytes) -> tuple[int, int] | None:
    """(tensor count, position of the first name) when the root is a map of 1-3 fields whose first
    is "tensors" holding a definite-length map; None otherwise."""
    if len(raw) < 10 or not 0xA1 <= raw[0] <= 0xA3 or raw[1:9] != b"\x67tensors":
        return None
    h = raw[9]
    if 0xA0 <= h <= 0xB7:
        return h - 0xA0, 10
    width = {0xB8: 1, 0xB9: 2, 0xBA: 4}.get(h)
    if width is None or len(raw) < 10 + width:
        return None
    return int.from_bytes(raw[10 : 10 + width], "big"), 10 + width


# ---------------------------------------------------------------------------------------- reader


class BurnpackReader(Reader):
    """Parses the header and metadata; tensor bytes stay in the file until asked for."""

    format: ClassVar[str] = "burnpack"
    fast_path: ClassVar[bool] = True  # False: always the generic decoder (tests compare the two)
    duplicate_names: list[Any]
    """Names the tensor map holds more than once, in first-seen order; the last entry of each is the
    one read (Burn's `BTreeMap` keeps the last too). `extra()` turns them into a warning."""

    def __init__(self, source: ByteSource, *, limits: Limits = DEFAULT_LIMITS) -> None:
        self.source = source
        self.limits = limits
        self.duplicate_names = []
        label = source.label
        size = source.size
        if isinstance(source, FileSource) and size > limits.max_file_bytes:
            raise LimitExceededError(f"Validation error: file is {size} bytes, over the {limits.max_file_bytes} "
                                     "limit (max_file_bytes)", file=label)
        if size < HEADER_SIZE:
            raise FormatError(f"Invalid header: insufficient bytes ({size} < {HEADER_SIZE})", file=label)
        magic, version, meta_size = struct.unpack("<IHI", source.read(0, HEADER_SIZE, "header"))
        if magic != MAGIC:
            raise FormatError(f"Invalid magic number 0x{magic:08X} (expected 0x{MAGIC:08X}, bytes 'NRUB')",
                              file=label)
        if version > VERSION:
            raise FormatError(f"Unsupported version {version} (this reader knows <= {VERSION})", file=label)
        if meta_size > limits.max_metadata_bytes:
            raise LimitExceededError(
                f"Validation error: metadata size {meta_size} exceeds the {limits.max_metadata_bytes} byte limit "
                "(max_metadata_bytes)", file=label)
        if HEADER_SIZE + meta_size > size:
            raise FormatError(f"Invalid header: metadata of {meta_size} bytes runs past the end of the "
                              f"{size}-byte input", file=label)
        self.version = version
        self.metadata_size = meta_size
        self.data_start = align(HEADER_SIZE + meta_size)
        raw = source.read(HEADER_SIZE, meta_size, "metadata")
        fast = self._fast(raw) if self.fast_path else None
        if fast is not None:
            del raw  # before the tensors are made: the peak is the metadata or the tensors, not both
            self.metadata, self.scalars, columns = fast
            self.tensors = stored_many(source, *columns)
            return
        try:
            root = cbor.decode(raw, limits=limits)
        except cbor.CborLimitError as e:
            raise LimitExceededError(f"Metadata deserialization error: {e}", file=label) from None
        except cbor.CborError as e:
            raise FormatError(f"Metadata deserialization error: {e}", file=label) from None
        del raw
        self.tensors, self.metadata, self.scalars = self._parse_root(root)

    def _fast(self, raw: bytes) -> tuple[dict[str, str], dict[str, Scalar], _Columns] | None:
        """Metadata, scalars and tensor columns (for `stored_many`, in data order) of metadata in Burn's
        shape, with every check `_parse_root` makes; None to leave it to the generic decoder."""
        found = _tensor_map(raw)
        if found is None:
            return None
        count, pos = found
        if count > self.limits.max_tensors:
            return None  # the generic path refuses it
        try:
            names_b, keys, starts, ends, pids, pos = _scan_descriptors(raw, pos, count)
            info = {key: _describe(key, self.limits.max_tensor_bytes) for key in set(keys)}
            metadata, scalars = self._fast_rest(raw, pos, raw[0] - 0xA1)
        except _NotMyShape:
            return None
        try:
            names = list(map(bytes.decode, names_b))
        except UnicodeDecodeError:
            return None  # the generic decoder names the bad text
        del names_b
        if len(set(names)) != count:  # a repeated name: the last one wins, as the generic path says
            return None
        described = list(map(info.__getitem__, keys))
        has_pids = any(d[0] for d in info.values())
        del keys, info
        if (list(map(sub, ends, starts)) != [d[3] for d in described]
                or any(map(and_, starts, repeat(ALIGNMENT - 1)))
                or (count and self.data_start + max(ends) > self.source.size)):
            return None
        # data order, as `_parse_root` sorts (by start, then end: zero-length tensors can share a start)
        if not all(map(lt, starts, islice(starts, 1, None))):  # not already in data order
            key = starts if len(set(starts)) == count else list(zip(starts, ends, strict=True))
            order = sorted(range(count), key=key.__getitem__)
            del key
            starts, ends, names = _reorder(starts, order), _reorder(ends, order), _reorder(names, order)
            described, pids = _reorder(described, order), _reorder(pids, order)
        nonempty = list(map(ne, starts, ends))
        s_ne, e_ne = list(compress(starts, nonempty)), list(compress(ends, nonempty))
        if any(map(lt, islice(s_ne, 1, None), e_ne)):  # no two non-empty tensors overlap
            return None
        del ends, nonempty, s_ne, e_ne
        _, dts, shapes, lengths = zip(*described, strict=True) if count else ((),) * 4
        return metadata, scalars, (names, dts, shapes, list(map(add, starts, repeat(self.data_start))), lengths,
                                   pids if has_pids else None)

    def _fast_rest(self, raw: bytes, pos: int, fields: int) -> tuple[dict[str, str], dict[str, Scalar]]:
        """The root map's other fields ("metadata", "scalars"), by the generic decoder; _NotMyShape for
        other fields, and for any error there (the generic path then reports it, in its order)."""
        rest: dict[str, Any] = {}
        try:
            for _ in range(fields):
                key, pos = cbor.decode_at(raw, pos, 1, limits=self.limits)
                if key not in ("metadata", "scalars") or key in rest:
                    raise _NotMyShape
                rest[key], pos = cbor.decode_at(raw, pos, 1, limits=self.limits)
            return (self._parse_metadata(rest.get("metadata", cbor.MISSING)),
                    self._parse_scalars(rest.get("scalars", cbor.MISSING)))
        except (cbor.CborError, FormatError):
            raise _NotMyShape from None

    def _fail(self, msg: str, tensor: str | None = None) -> FormatError:
        return FormatError(msg, file=self.label, tensor=tensor)

    def _parse_root(self, root: Any) -> tuple[list[LazyTensor], dict[str, str], dict[str, Scalar]]:
        if not isinstance(root, cbor.CborMap):
            raise self._fail("Metadata deserialization error: top level is not a map")
        try:
            tensors = root.get_unique("tensors", "metadata")
            meta = root.get_unique("metadata", "metadata")
            scalars = root.get_unique("scalars", "metadata")
        except cbor.CborError as e:
            raise self._fail(f"Metadata deserialization error: {e}") from None
        if tensors is cbor.MISSING:
            raise self._fail("Metadata deserialization error: missing field 'tensors'")
        if not isinstance(tensors, cbor.CborMap):
            raise self._fail("Metadata deserialization error: 'tensors' is not a map")
        entries = tensors.last_wins()
        if len(entries) != len(tensors):
            self.duplicate_names = _repeated(name for name, _ in tensors)
        if len(entries) > self.limits.max_tensors:
            raise LimitExceededError(f"Validation error: {len(entries)} tensors exceed the limit of "
                                     f"{self.limits.max_tensors} (max_tensors)", file=self.label)
        parsed = [self._descriptor(name, d) for name, d in entries.items()]
        self._check_layout(parsed)
        parsed.sort(key=lambda p: (p[3], p[4]))  # data order; a zero-length tensor precedes one at its start
        out = [stored(name, dt, shape, self.source, self.data_start + start, end - start, param_id=pid)
               for name, dt, shape, start, end, pid in parsed]
        return out, self._parse_metadata(meta), self._parse_scalars(scalars)

    def _descriptor(self, name: Any, d: Any) -> tuple[str, DType, tuple[int, ...], int, int, int | None]:
        if not isinstance(name, str):
            raise self._fail(f"Metadata deserialization error: tensor name {name!r} is not text")
        if not isinstance(d, cbor.CborMap):
            raise self._fail("Metadata deserialization error: descriptor is not a map", name)
        try:
            fields = {f: d.get_unique(f, "descriptor") for f in ("dtype", "shape", "data_offsets", "param_id")}
        except cbor.CborError as e:
            raise self._fail(f"Metadata deserialization error: {e}", name) from None
        for f in ("dtype", "shape", "data_offsets"):
            if fields[f] is cbor.MISSING:
                raise self._fail(f"Metadata deserialization error: missing field '{f}'", name)
        try:
            dt = _dtype_from_cbor(fields["dtype"])
        except ValueError as e:
            raise self._fail(f"Metadata deserialization error: {e}", name) from None
        shape, offsets, pid = fields["shape"], fields["data_offsets"], fields["param_id"]
        if not isinstance(shape, list) or not all(_is_u64(x) for x in shape):
            raise self._fail(f"Metadata deserialization error: shape {_plain(shape)!r} is not a list of u64", name)
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_u64(x) for x in offsets)):
            raise self._fail(f"Metadata deserialization error: data_offsets {_plain(offsets)!r} is not [start, end]",
                             name)
        if pid is cbor.MISSING or pid is None:
            pid = None
        elif not _is_u64(pid):
            raise self._fail(f"Metadata deserialization error: param_id {pid!r} is not a u64", name)
        start, end = offsets
        if end < start:
            raise self._fail(f"Validation error: corrupted offset data (end {end} < start {start})", name)
        max_bytes = self.limits.max_tensor_bytes
        if end - start > max_bytes:
            raise LimitExceededError(
                f"Validation error: {end - start} bytes exceed the {max_bytes}-byte tensor limit (max_tensor_bytes)",
                file=self.label, tensor=name)
        if self.data_start + end > self.source.size:
            raise self._fail(f"Validation error: File truncated: data [{self.data_start + start}, "
                             f"{self.data_start + end}) is past the end ({self.source.size} bytes)", name)
        if 0 not in shape:  # bounded product: a long list of huge dims would take quadratic time
            numel = 1
            for x in shape:
                numel *= x
                if numel > max_bytes * 8:
                    raise LimitExceededError(
                        f"Validation error: shape of {len(shape)} dimensions has more than {max_bytes * 8} "
                        "elements (8 x max_tensor_bytes)", file=self.label, tensor=name)
        want = dt.nbytes(tuple(shape))
        if dt.kind is not Kind.QUANTIZED and want != end - start:
            raise self._fail(f"Validation error: holds {end - start} bytes but shape {list(shape)} of "
                             f"{dt.display} needs {want}", name)
        if start % ALIGNMENT:
            raise self._fail(f"Validation error: data offset {start} is not {ALIGNMENT}-byte aligned", name)
        return name, dt, tuple(shape), start, end, pid

    def _check_layout(self, parsed: list[tuple[str, DType, tuple[int, ...], int, int, int | None]]) -> None:
        spans = sorted((s, e, n) for n, _, _, s, e, _ in parsed if e > s)
        for (s0, e0, n0), (s1, _e1, n1) in itertools.pairwise(spans):
            if s1 < e0:
                raise self._fail(f"Validation error: data of '{n1}' at {s1} overlaps '{n0}' [{s0}, {e0})", n1)

    def _parse_metadata(self, meta: Any) -> dict[str, str]:
        if meta is cbor.MISSING or meta is None:
            return {}
        if not isinstance(meta, cbor.CborMap) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in meta):
            raise self._fail("Metadata deserialization error: 'metadata' must map text to text")
        return meta.last_wins()

    def _parse_scalars(self, scalars: Any) -> dict[str, Scalar]:
        if scalars is cbor.MISSING or scalars is None:
            return {}
        if not isinstance(scalars, cbor.CborMap):
            raise self._fail("Metadata deserialization error: 'scalars' is not a map")
        out: dict[str, Scalar] = {}
        for key, v in scalars:
            if not isinstance(key, str) or not isinstance(v, cbor.CborMap) or len(v) != 1:
                raise self._fail(f"Metadata deserialization error: scalar {key!r} is not a tagged value")
            (kind, value), = v
            if kind not in SCALAR_KINDS:
                raise self._fail(f"Metadata deserialization error: scalar {key!r} has unknown variant {kind!r}")
            if kind == "Float" and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            try:
                out[key] = Scalar(kind, value)
            except ValueError as e:
                raise self._fail(f"Metadata deserialization error: scalar {key!r}: {e}") from None
        return out

    def extra(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "metadata_size": self.metadata_size,
                               "data_start": self.data_start}
        if self.duplicate_names:
            dups = self.duplicate_names
            shown = ", ".join(map(ascii, dups[:5])) + (f" and {len(dups) - 5} more" if len(dups) > 5 else "")
            out["warnings"] = [f"{len(dups)} tensor name(s) appear more than once in the metadata ({shown}): "
                               "for each, only the last entry is read, as Burn does"]
        return out


def _repeated(names: Iterable[Any]) -> list[Any]:
    """The values seen more than once, each once, in first-seen order."""
    seen: set[Any] = set()
    repeated: dict[Any, None] = {}
    for n in names:
        if n in seen:
            repeated[n] = None
        seen.add(n)
    return list(repeated)


_PARAM_ID = attrgetter("param_id")
_DESCRIPTOR_ROOM = 96
"""Most bytes a tensor's header entry takes besides its name, dtype and shape dims: the name's head (9),
the descriptor's map head and keys (1 + 6 + 6 + 13 + 9), the shape's and offsets' heads (9 + 1), two
offsets and a param_id (3 x 9): 81, rounded up."""


def _is_u64(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 64


# ---------------------------------------------------------------------------------------- writer


class BurnpackWriter(Writer):
    """Plans offsets and the CBOR from declared lengths, then streams tensors in the given order.

    Writes exactly the metadata it is given (callers add `default_metadata()` when they want
    Burn-store-like defaults), so a file rewritten unchanged stays byte-identical.
    """

    format: ClassVar[str] = "burnpack"
    default_extension: ClassVar[str] = EXTENSION
    kind = WriterKind.LAID_OUT

    def __init__(
        self,
        tensors: Sequence[LazyTensor],
        *,
        metadata: Mapping[str, str] | None = None,
        scalars: Mapping[str, Scalar] | None = None,
    ) -> None:
        super().__init__(tensors, metadata=metadata, scalars=scalars)
        self._cbor: bytearray | None = None
        self._starts = self._plan_offsets()
        check_u64_sizes(self.tensors, "Burn cannot hold it")
        self._check_header()
        self._end = max(map(add, self._starts, map(get_nbytes, self.tensors)), default=0)

    def _check_header(self) -> None:
        """What encoding the header could fail on, without encoding it (`migrate plan` never needs its
        bytes: ~0.5 s at 100k tensors). Its size is bounded from above; only a header that might pass
        the limit is encoded now, to know."""
        names = _check_text(self.tensors, self.metadata, self.scalars)
        for k, v in self.metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise PlanError(f"metadata entry {k!r}: {v!r} is not text -> text")
        if self.header_bound(names) > BURN_MAX_METADATA_SIZE:
            self._cbor = self._plan_cbor()  # raises when it is over the limit

    def header_bound(self, names: list[str]) -> int:
        """At least the header's length in bytes, from the names' UTF-8 length and the widest entry."""
        distinct = {id(dt): dt for dt in map(get_dtype, self.tensors)}.values()  # each distinct dtype once
        per_tensor = (max((len(cbor.encode(_dtype_to_cbor(dt))) for dt in distinct), default=0)
                      + 9 * max(map(len, map(get_shape, self.tensors)), default=0) + _DESCRIPTOR_ROOM)
        text = sum(len(k.encode()) + len(v.encode()) + 18 for k, v in self.metadata.items())
        text += sum(len(k.encode()) + len(s.kind) + 40 for k, s in self.scalars.items())
        return 64 + len("".join(names).encode()) + len(self.tensors) * per_tensor + text

    @property
    def header(self) -> bytearray:
        """The CBOR metadata, encoded on first use."""
        if self._cbor is None:
            self._cbor = self._plan_cbor()
        return self._cbor

    @property
    def data_start(self) -> int:
        return align(HEADER_SIZE + len(self.header))

    def _plan_offsets(self) -> array[int]:
        if len(self.tensors) > BURN_MAX_TENSOR_COUNT:
            raise PlanError(f"{len(self.tensors)} tensors exceed burnpack's limit of {BURN_MAX_TENSOR_COUNT}")
        starts = self._fast_offsets()
        return starts if starts is not None else array("q", self._checked_offsets())

    def _fast_offsets(self) -> array[int] | None:
        """`_checked_offsets` per distinct name set, dtype and shape instead of per tensor; None when
        any tensor fails (the per-tensor loop then says which and why)."""
        tensors = self.tensors
        if distinct_str_names(tensors) is None:
            return None
        dts = list(map(get_dtype, tensors))
        distinct = dict(zip(map(id, dts), dts, strict=True)).values()  # each distinct dtype once
        try:
            for dt in distinct:
                _dtype_to_cbor(dt)
        except UnsupportedDTypeError:
            return None
        nbytes = list(map(get_nbytes, tensors))
        if nbytes and max(nbytes) > BURN_MAX_TENSOR_SIZE:
            return None
        if any(dt.kind is Kind.QUANTIZED for dt in distinct):
            return None  # QFloat lengths are not shape x size: the per-tensor loop
        if not lengths_match(tensors, dts):
            return None
        aligned = {nb: align(nb) for nb in set(nbytes)}  # each start is aligned, so the next is start + align(n)
        # an array, not a list of ints: 8 bytes per tensor instead of ~36 (a 100k plan keeps it)
        return array("q", accumulate(map(aligned.__getitem__, nbytes[:-1]), initial=0)) if nbytes else array("q")

    def _checked_offsets(self) -> list[int]:
        seen: set[str] = set()
        storable: set[tuple[str, Any]] = set()
        starts: list[int] = []
        cursor = 0
        for t in self.tensors:
            if t.name in seen:
                raise PlanError(f"Duplicate tensor name '{t.name}'", tensor=t.name)
            seen.add(t.name)
            if (t.dtype.name, t.dtype.scheme) not in storable:
                _dtype_to_cbor_checked(t)
                storable.add((t.dtype.name, t.dtype.scheme))
            if t.dtype.kind is not Kind.QUANTIZED:
                need = t.dtype.nbytes(t.shape)
                if need != t.nbytes:
                    raise PlanError(f"declares {t.nbytes} bytes but its shape {list(t.shape)} and dtype "
                                    f"{t.dtype.display} need {need}", tensor=t.name)
            if t.nbytes > BURN_MAX_TENSOR_SIZE:
                raise PlanError(f"{t.nbytes} bytes exceed burnpack's {BURN_MAX_TENSOR_SIZE}-byte tensor limit",
                                tensor=t.name)
            start = align(cursor)
            starts.append(start)
            cursor = start + t.nbytes
        return starts

    def _plan_cbor(self) -> bytearray:
        """The header; `_check_header` has checked what it needs (names and metadata are text)."""
        # The root map {"tensors": {name: descriptor}, "metadata"?, "scalars"?} is encoded entry by
        # entry: per tensor, its name, a descriptor prefix {dtype, shape, data_offsets: [ shared by all
        # tensors of one dtype, shape and param_id presence (serde's field order), its offsets and its
        # param_id; a batch of tensors at a time, in name order: a 100k-tensor header is never a tree.
        out = bytearray(cbor.head(5, 1 + bool(self.metadata) + bool(self.scalars)))
        cbor.encode_into(out, "tensors")
        out += cbor.head(5, len(self.tensors))
        k_dtype, k_shape, k_offsets, k_param_id = (cbor.encode(k) for k in ("dtype", "shape", "data_offsets",
                                                                               "param_id"))
        encoded_dtypes: dict[tuple[str, Any], bytes] = {}
        prefixes: dict[tuple[int, tuple[int, ...], bool], bytes] = {}

        def prefix(t: LazyTensor, shape: tuple[int, ...]) -> bytes:
            key = (id(t.dtype), shape, t.param_id is not None)
            found = prefixes.get(key)
            if found is None:
                dt_key = (t.dtype.name, t.dtype.scheme)
                dtype = encoded_dtypes.get(dt_key)
                if dtype is None:
                    dtype = encoded_dtypes[dt_key] = cbor.encode(_dtype_to_cbor(t.dtype))
                found = prefixes[key] = (cbor.head(5, 4 if key[2] else 3) + k_dtype + dtype + k_shape
                                         + cbor.encode(list(t.shape)) + k_offsets + cbor.head(4, 2))
            return found

        def param_id(t: LazyTensor) -> bytes:
            return b"" if t.param_id is None else k_param_id + cbor.encode(t.param_id)

        # UTF-8 byte order is code point order: sorting the (checked) names sorts their encodings
        names = list(map(get_name, self.tensors))
        order = sorted(range(len(names)), key=names.__getitem__)
        text_heads: dict[int, bytes] = {}
        pids = any(map(is_not, map(_PARAM_ID, self.tensors), repeat(None)))
        for i in range(0, len(order), _BATCH):
            batch = order[i : i + _BATCH]
            tensors = list(map(self.tensors.__getitem__, batch))
            starts = list(map(self._starts.__getitem__, batch))
            name_b = list(map(str.encode, map(names.__getitem__, batch)))
            for n in set(map(len, name_b)).difference(text_heads):
                text_heads[n] = cbor.head(3, n)
            out += b"".join(chain.from_iterable(zip(
                map(text_heads.__getitem__, map(len, name_b)), name_b, map(prefix, tensors, shapes_of(tensors)),
                map(cbor.encode_uint, starts), map(cbor.encode_uint, map(add, starts, map(get_nbytes, tensors))),
                map(param_id, tensors) if pids else repeat(b""), strict=False)))
        if self.metadata:
            cbor.encode_into(out, "metadata")
            cbor.encode_into(out, {k: self.metadata[k] for k in sorted(self.metadata, key=str.encode)})
        if self.scalars:
            cbor.encode_into(out, "scalars")
            cbor.encode_into(out, {k: {s.kind: s.value} for k, s in
                                   sorted(self.scalars.items(), key=lambda kv: kv[0].encode())})
        if len(out) > BURN_MAX_METADATA_SIZE:
            raise PlanError(f"metadata of {len(out)} bytes exceeds the {BURN_MAX_METADATA_SIZE}-byte limit")
        return out  # not copied into bytes: a 100k-tensor header is ~6 MiB

    @property
    def total_size(self) -> int:
        return self.data_start + self._end

    def write_to(self, sink: BinaryIO) -> None:
        header = self.header
        write_all(sink, memoryview(struct.pack("<IHI", MAGIC, VERSION, len(header))))
        write_all(sink, memoryview(header))
        pos = HEADER_SIZE + len(header)
        data_start = self.data_start  # a property: read once, not twice per tensor
        with Ahead(self.tensors) as ahead:
            for t, start in zip(self.tensors, self._starts, strict=True):
                write_zeros(sink, data_start + start - pos)
                write_tensor(sink, t, ahead)
                pos = data_start + start + t.nbytes
        write_zeros(sink, data_start + self._end - pos)  # an empty pack is still padded to the data start

    def layout(self) -> tuple[bytes, list[LazyTensor], list[int]]:
        """What `write_to` writes, as placed pieces: the bytes before the data (header and CBOR), the
        tensors in write order and each one's file offset; every other byte up to `total_size` is zero.
        Workers writing disjoint ranges of it (`migrator.run.parallel_write`) give `write_to`'s bytes."""
        header = self.header
        data_start = self.data_start
        return (struct.pack("<IHI", MAGIC, VERSION, len(header)) + bytes(header), self.tensors,
                [data_start + s for s in self._starts])

    @staticmethod
    def resolve_path(path: str | os.PathLike[str]) -> str:
        p = os.fspath(path)
        return p if has_extension(p) else p + EXTENSION


def _check_text(tensors: Sequence[LazyTensor], metadata: Mapping[str, str],
                scalars: Mapping[str, Scalar]) -> list[str]:
    """Names and metadata become CBOR text: a lone surrogate (a pickle's BINUNICODE may hold one) cannot.
    Returns the tensors' names."""
    names = list(map(get_name, tensors))
    if not (set(map(type, names)) <= {str} and utf8_ok("".join(names))):  # all at once; then find which
        for t in tensors:
            if not utf8_ok(t.name):
                raise PlanError(f"tensor name {t.name!a} is not valid Unicode text (it cannot be written as "
                                "UTF-8)", tensor=t.name)
    for k, v in [*metadata.items(), *((k, "") for k in scalars)]:
        if isinstance(k, str) and isinstance(v, str) and not (utf8_ok(k) and utf8_ok(v)):
            raise PlanError(f"metadata or scalar entry {k!a} is not valid Unicode text (it cannot be written as "
                            "UTF-8)")
    return names


def _dtype_to_cbor_checked(t: LazyTensor) -> None:
    try:
        _dtype_to_cbor(t.dtype)
    except UnsupportedDTypeError as e:
        raise UnsupportedDTypeError(e.detail + " (cast it to a Burn dtype first)", tensor=t.name) from None


