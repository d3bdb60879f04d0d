"""PyTorch checkpoints (`torch.save`): zip (torch >= 1.6), legacy (pre-1.6 stream) and old tar.

The pickle is read by `migrator.safepickle` (no code from the file ever runs); storages are located
in the container without copying, and each tensor becomes a lazy view that honours the storage
offset and strides torch recorded, so values equal `torch.load`'s exactly:

* a C-contiguous tensor is a zero-copy window on the file (`tensor.stored`, kernel-copyable);
* a strided view (transposed, sliced with steps, expanded) gathers its elements with numpy
  `as_strided` over only its own storage window when materialised;
* big-endian zip checkpoints (`byteorder` = big) are byte-swapped when materialised; legacy and tar
  files from big-endian machines are refused, since their data order depends on the torch version.

Unsupported dtypes (complex128, quantized, sparse, ...) raise `UnsupportedDTypeError` at open
naming the tensor, but only for tensors inside the selection (`top_level_key`), so a checkpoint
can still be read for the parts that are supported.
"""

from __future__ import annotations

import contextlib
import struct
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .. import safepickle as sp
from ..bytesource import ByteSource
from ..dtypes import BY_TORCH
from ..errors import (
    FormatError,
    LimitExceededError,
    TensorNotFoundError,
    UnsafePickleError,
    UnsupportedDTypeError,
)
from ..scalars import Scalar
from ..tensor import LazyTensor, stored, stored_many
from .base import Reader, no_gc

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL_VERSION = 1001

MAX_PICKLE_BYTES = 1 << 30  # a data.pkl larger than this is not a state_dict
MAX_ZIP_ENTRIES = 1_000_000
MAX_ZIP_DIRECTORY = 256 << 20
MAX_SMALL_RECORD = 1 << 20  # byteorder, version, sys_info
MAX_TAR_MEMBERS = 100_000
MAX_NODES = 1_000_000  # values visited while flattening (Burn's memo-bomb bound)
MAX_DEPTH = 1_000  # nesting of dicts/lists while flattening
MAX_EXPANDED_BYTES = 1 << 30  # a broadcast view may materialise to at most this (or its window)

_SUPPORTED = dict(BY_TORCH)


class _Span(NamedTuple):
    """Where one storage's bytes lie in the source (a tuple: one per storage, made 100k times)."""

    offset: int
    nbytes: int


@dataclass(frozen=True)
class _ZipMember:
    name: str
    header_offset: int
    size: int
    compressed_size: int
    method: int
    flags: int
    crc: int


_RawMember = tuple[int, int, int, int, int, int]
"""A central-directory entry: (header_offset, size, compressed_size, method, flags, crc)."""

class _ZipDirectory(NamedTuple):
    """A parsed central directory. `data` maps a root folder ("archive/", or "") to two arrays indexed by
    storage number: header offset (-1: no such member) and size of `<root>data/<n>`, all stored, unencrypted
    members (16 bytes a storage instead of a name, a tuple and a dict slot); `members` holds the others."""

    members: dict[str, _RawMember]
    data: dict[str, tuple[array, array]]
    first: str | None  # the first entry's name (torch's root folder)


_CD_ENTRY = struct.Struct("<8xHH4xIIIHHHH6xI")  # flags, method, crc, sizes, name/extra/comment lengths, disk, offset
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, name and extra lengths


class PytorchReader(Reader):
    """Reads every torch.save container lazily; see the module docstring for the guarantees."""

    format = "pytorch"
    nested_keys = True  # top_level_key walks the pickled dicts

    def __init__(
        self,
        source: ByteSource,
        *,
        top_level_key: str | list[str] | tuple[str, ...] | None = None,
        limits: sp.Limits | None = None,
    ) -> None:
        self.source = source
        self.tensors: list[LazyTensor] = []
        self.metadata: dict[str, str] = {}
        self.scalars: dict[str, Scalar] = {}
        self._limits = limits if limits is not None else sp.DEFAULT_LIMITS  # read now: raisable (SECURITY.md)
        self._extra: dict[str, Any] = {}
        self._opaque: set[str] = set()
        self._protocol: int | None = None
        self._swap = False
        self._spans: dict[str, _Span] = {}  # storage key -> bytes
        self._first_dtype: dict[str, str | None] = {}  # storage key -> dtype of its first reference
        self._ignored: list[str] = []
        self._groups: dict[str, list[str]] = {}  # storage key -> names, for storages read by 2+ tensors
        self._layouts: dict[tuple[Any, ...], tuple[Any, int, int, bool, tuple[int, ...]]] = {}
        self._zip_data: tuple[array, array] | None = None  # see _ZipDirectory.data
        self._zip_found = bytearray()  # 1: _zip_data holds that storage's data offset, checked
        self._zip = False
        with no_gc():  # ~1M container objects stay alive until the end: rescans would cost ~30%
            root = self._open()
            selected, prefix = self._select(root, top_level_key)
            pending = self._flatten(selected, prefix)
            del root, selected  # the pickle's objects go before the tensors are made: a lower peak
            self.tensors = pending.build(self.source)
            del pending
        # what only the open needed (100k entries each for a 100k-tensor zip): the tensors keep the rest
        self._spans, self._first_dtype, self._layouts = {}, {}, {}
        self._zip_members: dict[str, _RawMember] = {}
        self._zip_data, self._zip_found = None, bytearray()
        self._tar_tensors: dict[str, sp.TensorRef] = {}
        self._extra.update(
            byteorder="big" if self._swap else "little",
            pickle_protocol=self._protocol,
            opaque_objects=sorted(self._opaque),
            ignored=self._ignored[:100],
        )

    # ------------------------------------------------------------------------------------------
    # public extras

    def extra(self) -> dict[str, Any]:
        return dict(self._extra)

    def shared_storages(self) -> list[list[str]]:
        """Groups of selected tensor names that read one storage (tied weights, views)."""
        return [names for names in self._groups.values() if len(names) > 1]

    # ------------------------------------------------------------------------------------------
    # containers

    def _err(self, message: str, tensor: str | None = None) -> FormatError:
        return FormatError(message, file=self.label, tensor=tensor)

    def _open(self) -> Any:
        src = self.source
        head = src.read(0, min(src.size, 512), "header")
        if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
            self._extra["container"] = "zip"
            self._zip = True
            return self._open_zip()
        if len(head) >= 262 and head[257:262] == b"ustar":
            self._extra["container"] = "tar"
            return self._open_tar()
        return self._open_pickle_stream()

    def _unpickler(self, data: bytes | memoryview, *, start: int = 0, end: int | None = None,
                   persistent: Any = None, what: str = "pickle") -> sp.Unpickler:
        return sp.Unpickler(data, label=self.label, start=start, end=end, persistent_load=persistent,
                            limits=self._limits, what=what)

    def _run_main(self, u: sp.Unpickler) -> Any:
        root = u.load()
        self._protocol = u.protocol  # None: protocol 0/1 pickles carry no PROTO opcode
        self._opaque |= u.opaque
        return root

    # -- zip -----------------------------------------------------------------------------------

    def _open_zip(self) -> Any:
        directory = _read_zip_directory(self.source)
        members = directory.members
        pkl = _find_data_pkl(directory.first, members)
        if pkl is None:
            raise self._err("zip archive without data.pkl: not a torch.save checkpoint")
        root = pkl[: -len("data.pkl")]
        if any(n.startswith(root + "code/") for n in members) or root + "constants.pkl" in members:
            raise self._err("this is a TorchScript archive (torch.jit.save), which holds code; load it with "
                            "torch.jit.load and save `model.state_dict()` with torch.save instead")
        self._zip_members = members
        self._zip_root = root
        self._zip_data = directory.data.get(root)
        del directory
        self._extra["archive_root"] = root.rstrip("/")
        for rec, key in ((".format_version", "format_version"), (".storage_alignment", "storage_alignment"),
                         ("version", "version")):
            if root + rec in members and members[root + rec][1] <= 256:
                self._extra[key] = self._zip_read(self._zip_member(root + rec)).decode("utf-8", "replace").strip()
        if root + "byteorder" in members:
            order = self._zip_read(self._zip_member(root + "byteorder")).strip()
            if order not in (b"little", b"big"):
                raise self._err(f"unknown byteorder record {order[:20]!r}")
            self._swap = order == b"big"
        data = self._zip_read(self._zip_member(pkl), MAX_PICKLE_BYTES)
        result = self._run_main(self._unpickler(data, persistent=self._storage_pid, what=pkl))
        del data
        self._prefetch_zip_spans()
        return result

    def _zip_member(self, name: str) -> _ZipMember:
        return _ZipMember(name, *self._zip_members[name])

    def _prefetch_zip_spans(self) -> None:
        """Locate every stored `data/` member's bytes with a few large reads instead of one per tensor.

        Only members that pass every check of `_zip_data_offset` are recorded; the others are left
        for `_zip_span`, which raises its precise error if a tensor needs them. torch's numbered members
        (`_zip_data`) get their data offset written over their header offset, and their bit set in
        `_zip_found`; the others go to `_spans`.
        """
        prefix = self._zip_root + "data/"
        cut = len(prefix)
        members = self._zip_members
        # (header offset, key, size) of the members not numbered in `_zip_data`
        todo: list[tuple[int, Any, int]] = [
            (raw[0], name[cut:], raw[1]) for name, raw in members.items()
            if name.startswith(prefix) and raw[3] == 0 and not raw[4] & 1 and raw[1] == raw[2]]
        compact = self._zip_data
        if compact is not None:
            self._zip_found = bytearray(len(compact[0]))
            if not self._prefetch_numbered(compact):
                return
        todo.sort()
        src, spans = self.source, self._spans
        size = src.size
        unpack = _LOCAL_HEADER.unpack_from
        it = iter(todo)
        pending = next(it, None)
        while pending is not None:
            group = []  # headers less than 64 KiB apart share a read of at most 1 MiB
            first = prev = -1
            while pending is not None:
                lho = pending[0]
                if first >= 0 and (lho - prev > 65536 or lho + 30 - first > 1 << 20):
                    break
                if first < 0:
                    first = lho
                prev = lho
                group.append(pending)
                pending = next(it, None)
            try:
                block = src.read(first, min(prev + 30, size) - first, "zip local headers")
            except FormatError:
                return
            for lho, key, nbytes in group:
                at = lho - first
                if at + 30 > len(block):
                    continue
                sig, nlen, xlen = unpack(block, at)
                start = lho + 30 + nlen + xlen
                if sig == b"PK\x03\x04" and start + nbytes <= size:
                    spans[key] = _Span(start, nbytes)
                    del members[prefix + key]  # located: only the others may still need their entry

    def _prefetch_numbered(self, compact: tuple[array, array]) -> bool:
        """`_prefetch_zip_spans` for torch's numbered members, each read's headers parsed at once by numpy.

        The same reads (headers in file order, less than 64 KiB apart, at most 1 MiB a read) and checks;
        False when a read failed (nothing after it is located, as in the per-member loop).
        """
        lhos = np.frombuffer(compact[0], dtype=np.int64)  # writable views: located offsets go back in place
        sizes = np.frombuffer(compact[1], dtype=np.int64)
        found = np.frombuffer(self._zip_found, dtype=np.uint8)
        items = np.flatnonzero(lhos >= 0)
        at_hdr = lhos[items]
        if len(at_hdr) > 1 and bool(np.any(at_hdr[1:] < at_hdr[:-1])):
            by_offset = np.argsort(at_hdr, kind="stable")
            items, at_hdr = items[by_offset], at_hdr[by_offset]
        gaps = np.flatnonzero(np.diff(at_hdr) > 65536) + 1  # a read ends before each of these
        src = self.source
        size = src.size
        i, n = 0, len(items)
        while i < n:
            first = int(at_hdr[i])
            g = int(np.searchsorted(gaps, i, "right"))
            j = min(int(gaps[g]) if g < len(gaps) else n,
                    int(np.searchsorted(at_hdr, first + (1 << 20) - 30, "right")))
            try:
                block = src.read(first, min(int(at_hdr[j - 1]) + 30, size) - first, "zip local headers")
            except FormatError:
                return False
            at = at_hdr[i:j] - first
            whole = np.flatnonzero(at + 30 <= len(block))
            at, idx = at[whole], items[i:j][whole]
            raw = np.frombuffer(block, dtype=np.uint8)
            sig = (raw[at] == 0x50) & (raw[at + 1] == 0x4B) & (raw[at + 2] == 3) & (raw[at + 3] == 4)
            names = raw[at + 26].astype(np.int64) | raw[at + 27].astype(np.int64) << 8
            extras = raw[at + 28].astype(np.int64) | raw[at + 29].astype(np.int64) << 8
            start = at + first + 30 + names + extras
            ok = sig & (start + sizes[idx] <= size)
            lhos[idx[ok]] = start[ok]
            found[idx[ok]] = 1
            i = j
        return True

    def _zip_data_offset(self, m: _ZipMember) -> int:
        """Validate a member (stored, in bounds) and return where its bytes start."""
        if m.flags & 1:
            raise self._err(f"zip member {m.name} is encrypted")
        if m.method != 0:
            raise self._err(f"zip member {m.name} is compressed (method {m.method}); torch.save stores "
                            "members uncompressed and migrator refuses to inflate them (zip-bomb guard)")
        if m.compressed_size != m.size:
            raise self._err(f"zip member {m.name}: stored size {m.compressed_size} != size {m.size}")
        src = self.source
        hdr = src.read(m.header_offset, 30, f"zip local header of {m.name}")
        if hdr[:4] != b"PK\x03\x04":
            raise self._err(f"zip member {m.name}: bad local header signature")
        nlen, xlen = struct.unpack_from("<HH", hdr, 26)
        start = m.header_offset + 30 + nlen + xlen
        if start + m.size > src.size:
            raise self._err(f"zip member {m.name} needs bytes [{start}, {start + m.size}) but the file "
                            f"has {src.size} bytes (truncated?)")
        return start

    def _zip_read(self, m: _ZipMember, limit: int = MAX_SMALL_RECORD) -> bytes:
        """A small member, read whole and checked against its CRC-32 (tensor data is not read here)."""
        if m.size > limit:
            raise LimitExceededError(f"zip member {m.name} has {m.size} bytes (limit {limit})", file=self.label)
        data = self.source.read(self._zip_data_offset(m), m.size, m.name)
        if zlib.crc32(data) != m.crc:
            raise self._err(f"zip member {m.name} fails its CRC-32 check (corrupt file)")
        return data

    def _zip_span(self, key: str, tensor: str) -> _Span:
        compact = self._zip_data
        if (compact is not None and key.isascii() and key.isdigit() and len(key) <= 9
                and (key[0] != "0" or len(key) == 1) and int(key) < len(compact[0])):
            i = int(key)
            if self._zip_found[i]:
                return _Span(compact[0][i], compact[1][i])
            if compact[0][i] >= 0:
                m = _ZipMember(f"{self._zip_root}data/{key}", compact[0][i], compact[1][i], compact[1][i], 0, 0, 0)
                start = self._zip_data_offset(m)
                compact[0][i] = start
                self._zip_found[i] = 1
                return _Span(start, m.size)
        span = self._spans.get(key)
        if span is None:
            name = f"{self._zip_root}data/{key}"
            if name not in self._zip_members:
                raise self._err(f"storage '{key}' is missing from the archive (no member {name})", tensor)
            m = self._zip_member(name)
            span = _Span(self._zip_data_offset(m), m.size)
            self._spans[key] = span
        return span

    # -- legacy and plain pickles -----------------------------------------------------------------

    def _open_pickle_stream(self) -> Any:
        src = self.source
        if src.size == 0:
            raise self._err("empty file: not a PyTorch checkpoint")
        view = src.view(0, src.size)
        first = self._unpickler(view, what="pickle")
        try:
            magic = first.load()
        except (UnsafePickleError, LimitExceededError):  # keep the precise type
            raise
        except FormatError as e:
            raise self._err(f"not a PyTorch checkpoint: not a zip or tar archive, not a legacy torch.save "
                            f"stream, and not a readable pickle ({e.detail})") from None
        if not (type(magic) is int and magic == LEGACY_MAGIC):
            raise self._plain_pickle_error(view)
        self._extra["container"] = "legacy"
        u = self._unpickler(view, start=first.pos, what="legacy protocol version")
        version = u.load()
        if version != LEGACY_PROTOCOL_VERSION:
            raise self._err(f"legacy checkpoint with protocol version {version!r} (expected 1001)")
        u = self._unpickler(view, start=u.pos, what="legacy sys_info")
        sys_info = u.load()
        self._apply_sys_info(sys_info)
        main = self._unpickler(view, start=u.pos, persistent=self._storage_pid, what="legacy main pickle")
        root = self._run_main(main)
        u = self._unpickler(view, start=main.pos, what="legacy storage key list")
        keys = u.load()
        if not isinstance(keys, list) or not all(isinstance(k, (str, int)) for k in keys):
            raise self._err("legacy checkpoint: the storage key list is not a list of keys")
        self._locate_legacy(keys, u.pos)
        return root

    def _plain_pickle_error(self, view: memoryview) -> FormatError:
        seen: list[Any] = []

        def record(pid: Any) -> Any:
            seen.append(pid)
            return None

        with contextlib.suppress(FormatError):
            self._unpickler(view, persistent=record).load()
        if seen:
            return self._err("a plain pickle that references tensor storages but has no data section "
                             "(not a torch.save file: tensor data cannot be located)")
        return self._err("a plain pickle without tensor data: not a PyTorch checkpoint")

    def _apply_sys_info(self, sys_info: Any) -> None:
        if not isinstance(sys_info, dict):
            raise self._err("sys_info is not a dict")
        # ints kept only within 64 bits: a 4 KiB pickled LONG would not even print (str() digit limit)
        self._extra["sys_info"] = {k: v for k, v in sys_info.items() if isinstance(k, str)
                                   and (isinstance(v, (bool, str)) or (type(v) is int and -(1 << 63) <= v < 1 << 64))}
        if sys_info.get("little_endian", True) is False:
            # torch >= 1.x converts legacy data to little-endian when saving and never swaps when
            # loading, but older versions wrote native order: the bytes' order cannot be known.
            raise self._err("legacy checkpoint written on a big-endian machine: its data byte order is "
                            "ambiguous; re-save it with torch.save (zip format) on that machine")

    def _locate_legacy(self, keys: list[Any], pos: int) -> None:
        """Walk the raw storages: each is an 8-byte LE element count, then count x element size."""
        src = self.source
        for raw_key in keys:
            key = str(raw_key)
            if key not in self._first_dtype:
                raise self._err(f"legacy checkpoint: storage '{key}' is listed but never referenced, so its "
                                "element size is unknown")
            dtype = self._first_dtype[key]
            esize = sp.ELEMENT_SIZES.get(dtype or "")
            if esize is None:
                raise UnsupportedDTypeError(f"storage '{key}' has an unknown element type; the storages after "
                                            "it cannot be located", file=self.label)
            (count,) = struct.unpack("<q", src.read(pos, 8, f"legacy storage '{key}' element count"))
            if count < 0:
                raise self._err(f"legacy storage '{key}' declares a negative element count")
            nbytes = count * esize
            src.check_range(pos + 8, nbytes, f"legacy storage '{key}' ({count} elements)")
            self._spans[key] = _Span(pos + 8, nbytes)
            pos += 8 + nbytes
        self._extra["data_end"] = pos

    # -- tar -------------------------------------------------------------------------------------

    def _open_tar(self) -> Any:
        members = _read_tar_members(self.source)
        for needed in ("pickle", "storages"):
            if needed not in members:
                raise self._err(f"tar checkpoint without a '{needed}' member")
        if "sys_info" in members:
            off, size = members["sys_info"]
            if size > MAX_SMALL_RECORD:
                raise LimitExceededError(f"tar sys_info of {size} bytes", file=self.label)
            self._apply_sys_info(self._unpickler(self.source.read(off, size), what="sys_info").load())
        self._tar_storage_types: dict[str, sp.StorageType | str] = {}
        self._read_tar_storages(*members["storages"])
        self._tar_tensors: dict[str, sp.TensorRef] = {}
        if "tensors" in members:
            self._read_tar_tensors(*members["tensors"])
        off, size = members["pickle"]
        view = self.source.view(off, size)
        return self._run_main(self._unpickler(view, persistent=self._tar_pid, what="tar pickle"))

    def _read_tar_storages(self, off: int, size: int) -> None:
        src = self.source
        view = src.view(off, size)
        u = self._unpickler(view, what="tar storages")
        count = u.load()
        if type(count) is not int or count < 0 or count > size:
            raise self._err("tar 'storages': bad storage count")
        pos = u.pos
        for _ in range(count):
            u = self._unpickler(view, start=pos, what="tar storage header")
            entry = u.load()
            if not (isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[0], (int, str))):
                raise self._err("tar 'storages': entry is not (key, location, storage type)")
            key, _location, stype = str(entry[0]), entry[1], entry[2]
            dtype = _storage_dtype(stype)
            esize = sp.ELEMENT_SIZES.get(dtype or "")
            if esize is None:
                raise UnsupportedDTypeError(f"tar storage '{key}' has unknown type {_type_name(stype)}",
                                            file=self.label)
            pos = u.pos
            if pos + 8 > size:
                raise self._err(f"tar storage '{key}': truncated element count")
            (n,) = struct.unpack("<q", bytes(view[pos : pos + 8]))
            if n < 0 or pos + 8 + n * esize > size:
                raise self._err(f"tar storage '{key}' declares {n} elements past the end of 'storages'")
            self._spans[key] = _Span(off + pos + 8, n * esize)
            self._first_dtype.setdefault(key, dtype)
            self._tar_storage_types[key] = stype
            pos += 8 + n * esize
        if pos < size:  # storage views (written by torch's old tar _save)
            views = self._unpickler(view, start=pos, what="tar storage views").load()
            if not isinstance(views, list):
                raise self._err("tar 'storages': storage views are not a list")
            for v in views:
                self._add_tar_view(v)

    def _add_tar_view(self, v: Any) -> None:
        if not (isinstance(v, tuple) and len(v) in (3, 4) and all(type(x) in (int, str) for x in v[:2])
                and all(type(x) is int and x >= 0 for x in v[2:])):
            raise self._err("tar storage view is not (key, root, offset[, numel])")
        target, root = str(v[0]), str(v[1])
        if root not in self._spans:
            raise self._err(f"tar storage view of unknown storage '{root}'")
        base, dtype = self._spans[root], self._first_dtype[root]
        esize = sp.ELEMENT_SIZES[dtype or ""]
        start = v[2] * esize
        nbytes = v[3] * esize if len(v) == 4 else base.nbytes - start
        if start + nbytes > base.nbytes or nbytes < 0:
            raise self._err(f"tar storage view '{target}' exceeds its root storage '{root}'")
        self._spans[target] = _Span(base.offset + start, nbytes)
        self._first_dtype[target] = dtype

    def _read_tar_tensors(self, off: int, size: int) -> None:
        view = self.source.view(off, size)
        u = self._unpickler(view, what="tar tensors")
        count = u.load()
        if type(count) is not int or count < 0 or count > size:
            raise self._err("tar 'tensors': bad tensor count")
        pos = u.pos
        for _ in range(count):
            u = self._unpickler(view, start=pos, what="tar tensor header")
            entry = u.load()
            if not (isinstance(entry, tuple) and len(entry) == 3 and type(entry[0]) in (int, str)
                    and type(entry[1]) in (int, str)):
                raise self._err("tar 'tensors': entry is not (key, storage id, tensor type)")
            key, sid = str(entry[0]), str(entry[1])
            pos = u.pos
            if pos + 8 > size:
                raise self._err(f"tar tensor '{key}': truncated metadata")
            (ndim,) = struct.unpack("<i", bytes(view[pos : pos + 4]))
            if not 0 <= ndim <= self._limits.max_dims:
                raise self._err(f"tar tensor '{key}': {ndim} dimensions")
            need = 8 + 16 * ndim + 8
            if pos + need > size:
                raise self._err(f"tar tensor '{key}': truncated metadata")
            vals = struct.unpack(f"<{2 * ndim + 1}q", bytes(view[pos + 8 : pos + need]))
            pos += need
            shape, stride, offset = vals[:ndim], vals[ndim : 2 * ndim], vals[-1]
            if min((*shape, *stride, offset), default=0) < 0:
                raise self._err(f"tar tensor '{key}': negative size, stride or offset")
            if sid not in self._spans:
                raise self._err(f"tar tensor '{key}' uses unknown storage '{sid}'")
            dtype = self._first_dtype[sid]
            ref = sp.StorageRef(sid, _type_name(self._tar_storage_types.get(sid, "?")), dtype, None, "cpu")
            self._tar_tensors[key] = sp.TensorRef(ref, offset, tuple(shape), tuple(stride))

    def _tar_pid(self, pid: Any) -> Any:
        if isinstance(pid, tuple):
            return self._storage_pid(pid)
        if type(pid) in (int, str):
            key = str(pid).strip()
            if key in self._tar_tensors:
                return self._tar_tensors[key]
            if key in self._spans:
                return sp.StorageRef(key, "storage", self._first_dtype[key], None, "cpu")
        raise self._err(f"tar pickle references unknown object {str(pid)[:40]!r}")

    # -- persistent ids ---------------------------------------------------------------------------

    def _storage_pid(self, pid: Any) -> sp.StorageRef:
        """('storage', StorageType, key, location, numel[, view_metadata]) -> a StorageRef."""
        if type(pid) is tuple and len(pid) == 5 and pid[0] == "storage":  # every torch.save tensor
            _, stype, key, location, numel = pid
            if (type(stype) is sp.StorageType and type(key) is str and type(location) is str
                    and type(numel) is int and 0 <= numel < 1 << 63):
                if not self._zip and key not in self._first_dtype:  # zip storages are located by name
                    self._first_dtype[key] = stype.dtype
                return sp.StorageRef(key, stype.name, stype.dtype, numel, location, None)
        if not isinstance(pid, tuple) or not pid:
            raise self._err(f"persistent id is a {type(pid).__name__}, expected a tuple")
        tag = pid[0].decode("ascii", "replace") if isinstance(pid[0], bytes) else pid[0]
        if tag == "module":
            name = pid[1].name if len(pid) > 1 and hasattr(pid[1], "name") else "a module"
            raise sp.WholeModelPickleError(
                f"the checkpoint pickles {name} (a whole nn.Module); save `model.state_dict()` instead",
                file=self.label)
        if tag != "storage" or len(pid) not in (5, 6):
            raise self._err(f"unknown persistent id {str(tag)[:40]!r} with {len(pid)} fields")
        stype, key, location, numel = pid[1:5]
        view = pid[5] if len(pid) == 6 else None
        if not isinstance(stype, (sp.StorageType, str)):
            raise self._err(f"persistent id storage type is {_type_name(stype)}, not a torch storage class")
        if type(key) not in (str, int) or not isinstance(location, (str, bytes)):
            raise self._err("persistent id: storage key / location have the wrong types")
        if type(numel) is not int or not 0 <= numel < 1 << 63:
            raise self._err("persistent id: storage size is not a non-negative 64-bit integer")
        key = str(key)
        dtype = _storage_dtype(stype)
        if not self._zip:
            self._first_dtype.setdefault(key, dtype)
        view_t: tuple[str, int, int] | None = None
        if view is not None:
            if not (isinstance(view, tuple) and len(view) == 3 and type(view[0]) in (str, int)
                    and type(view[1]) is int and type(view[2]) is int and 0 <= view[1] < 1 << 63
                    and 0 <= view[2] < 1 << 63):
                raise self._err("persistent id: storage view is not (key, offset, size)")
            view_t = (str(view[0]), view[1], view[2])
        loc = location.decode("ascii", "replace") if isinstance(location, bytes) else location
        return sp.StorageRef(key, _type_name(stype), dtype, numel, loc, view_t)

    # ------------------------------------------------------------------------------------------
    # selection and flattening

    def _select(self, root: Any, key: str | list[str] | tuple[str, ...] | None) -> tuple[Any, str]:
        if key is None or key == "" or key == []:
            return root, ""
        segments = [key] if isinstance(key, str) else [str(k) for k in key]
        node, path = root, []
        todo = segments
        dotted = isinstance(key, str)
        while todo:
            if dotted:
                seg, todo = _take_key(node, todo)
            else:
                seg, todo = todo[0], todo[1:]
            child = _child(node, seg)
            if child is _MISSING:
                where = ".".join(path) or "the top level"
                raise TensorNotFoundError(
                    f"key '{seg}' not found at {where}; available keys: {_list_keys(node)}", file=self.label)
            node = child
            path.append(seg)
        if not isinstance(node, (dict, list, tuple)):
            raise self._err(f"top-level key '{'.'.join(path)}' is a {_describe(node)}, not a dict of tensors")
        return node, ""

    def _flatten(self, root: Any, prefix: str) -> _Pending:
        """Walk the selection in order, checking every tensor; the tensors are made later (`_Pending`).

        A top-level name is a new string equal to the pickle's key, not that key object. The key sits
        in memory between its record's objects (storage and tensor refs, key strings), which all die once
        the tensors are made: kept, 100k names would pin ~20 MB of allocator pools that only objects of their
        size could reuse (100k.pt pt->bpk F16 peak RSS -10 MB). The copies go with what outlives the open.
        """
        if isinstance(root, (sp.TensorRef, sp.UnsupportedTensor)):
            raise self._err("the file holds a single tensor, not a dict of tensors (a state_dict); "
                            "save {'name': tensor} instead")
        if not isinstance(root, (dict, list, tuple)):
            raise self._err(f"the checkpoint holds a {_describe(root)}, not a dict of tensors")
        seen: set[str] = set()
        # TensorRef (hashed by identity) -> its first name; a name, not an index: 100k index ints would die
        # with this dict, each leaving a hole between the offsets made meanwhile (3 MB nothing reuses)
        built: dict[sp.TensorRef, str] = {}
        groups: dict[str, str | list[str]] = {}  # storage group -> its name, or its names once shared
        pending = _Pending()
        entries = pending.entries
        tensor_ref = sp.TensorRef
        visits = 0
        stack: list[tuple[str, Iterator[tuple[Any, Any]], int]] = [(prefix, _pairs(root), id(root))]
        on_path = {id(root)}
        while stack:
            base, it, cid = stack[-1]
            for key, value in it:  # the inner loop runs through a container's leaves without the stack
                visits += 1
                if visits > MAX_NODES:
                    raise LimitExceededError(f"more than {MAX_NODES} values in the checkpoint structure "
                                             "(shared references multiply; memo bomb?)", file=self.label)
                if type(key) is not str:
                    if type(key) is int:
                        key = str(key)
                    else:
                        self._ignored.append(f"{base}.<non-string key>" if base else "<non-string key>")
                        continue
                name = f"{base}.{key}" if base else "".join((key, ""))  # a copy: see the docstring
                if type(value) is tensor_ref:
                    if name in seen:
                        raise self._err(f"two entries flatten to the same name '{name}'")
                    seen.add(name)
                    prior = built.get(value)
                    if prior is None:
                        built[value] = name
                        self._tensor(name, value, pending)
                    else:  # the same tensor object under another name: same bytes
                        entries.append((prior, name))
                    group = value.storage.key  # the tensors of one storage share bytes
                    names = groups.get(group)
                    if names is None:
                        groups[group] = name
                    elif type(names) is str:
                        groups[group] = [names, name]
                    else:
                        names.append(name)
                    continue
                if isinstance(value, (dict, list, tuple)):
                    if id(value) in on_path:
                        raise self._err(f"'{name}' contains itself (cyclic structure)")
                    if len(stack) >= MAX_DEPTH:
                        raise LimitExceededError(f"'{name[:200]}' is nested more than {MAX_DEPTH} levels deep",
                                                 file=self.label)
                    on_path.add(id(value))
                    stack.append((name, _pairs(value), id(value)))
                    break
                self._leaf(name, value, seen)
            else:
                stack.pop()
                on_path.discard(cid)
        self._groups = {g: names for g, names in groups.items() if type(names) is list}
        return pending

    def _leaf(self, name: str, value: Any, seen: set[str]) -> None:
        """Everything but tensors and containers: metadata strings, scalars, refusals, ignored values."""
        if isinstance(value, (sp.UnsupportedTensor, str, bool, int, float)):
            if name in seen:
                raise self._err(f"two entries flatten to the same name '{name}'")
            seen.add(name)
        if isinstance(value, sp.UnsupportedTensor):
            what = f"{value.kind} tensors" + (f" (storage dtype {value.dtype})" if value.dtype else "")
            raise UnsupportedDTypeError(f"{what} are not supported", file=self.label, tensor=name)
        elif isinstance(value, str):
            self.metadata[name] = value
        elif isinstance(value, (bool, int, float)):
            try:
                self.scalars[name] = Scalar.of(value)
            except ValueError:
                self._ignored.append(name)  # an integer beyond 64 bits
        else:
            self._ignored.append(name)

    # ------------------------------------------------------------------------------------------
    # tensors

    def _numbered_span(self, ref: sp.StorageRef) -> tuple[int, int] | None:
        """`_storage_span` for what torch.save writes (a numbered zip member the prefetch located, its
        declared size within it, no view), without its checks' function calls; None for anything else."""
        key, found, numel = ref.key, self._zip_found, ref.numel
        if (ref.view is None and numel is not None and len(key) <= 9 and key.isdigit() and key.isascii()
                and (key[0] != "0" or len(key) == 1)):
            i = int(key)
            esize = sp.ELEMENT_SIZES.get(ref.dtype or "")
            if i < len(found) and found[i] and esize is not None:
                declared = numel * esize
                compact = self._zip_data
                if compact is not None and declared <= compact[1][i]:
                    return compact[0][i], declared
        return None

    def _storage_span(self, ref: sp.StorageRef, tensor: str) -> _Span:
        """The bytes a storage covers, resolving legacy storage views; checked against the declared size."""
        if self._zip:
            span = self._zip_span(ref.key, tensor)
        else:
            span = self._spans.get(ref.key)  # legacy and tar storages
            if span is None:
                raise self._err(f"storage '{ref.key}' has no data in the file", tensor)
        esize = sp.ELEMENT_SIZES.get(ref.dtype or "")
        if ref.numel is not None and esize is not None:
            declared = ref.numel * esize
            if ref.view is None and declared > span.nbytes:
                raise self._err(f"storage '{ref.key}' declares {declared} bytes but the file holds "
                                f"{span.nbytes} (truncated?)", tensor)
            if ref.view is None and declared != span.nbytes:
                span = _Span(span.offset, declared)
        if ref.view is not None:
            vkey, voff, vsize = ref.view
            if esize is None:
                raise UnsupportedDTypeError(f"storage view of unknown type {ref.storage_type}",
                                            file=self.label, tensor=tensor)
            start, nbytes = voff * esize, vsize * esize
            if start + nbytes > span.nbytes:
                raise self._err(f"storage view '{vkey}' exceeds its storage '{ref.key}'", tensor)
            span = _Span(span.offset + start, nbytes)  # views of one root share its key
        return span

    def _tensor(self, name: str, ref: sp.TensorRef, pending: _Pending) -> None:
        """Check `ref` and add its lazy tensor to `pending`."""
        dname = ref.dtype if ref.dtype is not None else ref.storage.dtype
        shape, stride = ref.size, ref.stride
        layout = self._layouts.get((dname, shape, stride))
        if layout is None:
            layout = self._layout(name, ref, dname)
        dt, nbytes, extent, contiguous, shape = layout  # one shape tuple for all tensors of that layout
        located = self._numbered_span(ref.storage)
        span_offset, span_nbytes = located if located is not None else self._storage_span(ref.storage, name)
        if nbytes == 0:
            pending.entries.append(LazyTensor(name, dt, shape, 0, loader=_empty, origin=self.label))
            return
        itemsize = dt.itemsize
        max_index = ref.offset + extent
        if (max_index + 1) * itemsize > span_nbytes:
            raise self._err(
                f"shape {list(shape)}, stride {list(ref.stride)} and offset {ref.offset} reach element "
                f"{max_index} but storage '{ref.storage.key}' holds {span_nbytes // itemsize} {dname} elements",
                name)
        start = span_offset + ref.offset * itemsize
        if contiguous and not self._swap:
            pending.add_stored(name, dt, shape, start, nbytes)
        else:
            pending.entries.append(self._view_tensor(name, ref, dt, nbytes, start, max_index))

    def _layout(self, name: str, ref: sp.TensorRef, dname: str | None) -> tuple[Any, int, int, bool,
                                                                                 tuple[int, ...]]:
        """dtype, byte length, furthest element, contiguity and shape of a (dtype, size, stride): cached,
        since a model repeats a few shapes many times (and the tensors share the first one's shape tuple)."""
        dt = _SUPPORTED.get(dname or "")
        if dt is None:
            what = f"torch dtype {dname}" if dname else f"storage type {ref.storage.storage_type}"
            raise UnsupportedDTypeError(f"{what} is not supported", file=self.label, tensor=name)
        assert dt.itemsize is not None
        shape, stride = ref.size, ref.stride
        nbytes = dt.nbytes(shape)
        assert nbytes is not None
        extent = sum((s - 1) * st for s, st in zip(shape, stride, strict=True)) if nbytes else 0
        layout = (dt, nbytes, extent, _is_contiguous(shape, stride), shape)
        self._layouts[(dname, shape, stride)] = layout
        return layout

    def _view_tensor(self, name: str, ref: sp.TensorRef, dt: Any, nbytes: int, start: int,
                     max_index: int) -> LazyTensor:
        """A tensor that is not a verbatim byte range: big-endian, or a strided view."""
        shape = ref.size
        itemsize = dt.itemsize
        label = self.label
        window = (max_index - ref.offset + 1) * itemsize
        src, swap = self.source, self._swap and itemsize > 1
        unit = itemsize // 2 if dt.kind.value == "complex" else itemsize
        if _is_contiguous(shape, ref.stride):
            if not swap:
                return stored(name, dt, shape, src, start, nbytes)
            return LazyTensor(name, dt, shape, nbytes, origin=label,
                              loader=lambda: _swapped(src.view(start, nbytes), unit))
        if nbytes > max(window, MAX_EXPANDED_BYTES):
            raise LimitExceededError(
                f"strided view of {window} storage bytes expands to {nbytes} bytes "
                f"(limit {MAX_EXPANDED_BYTES})", file=label, tensor=name)
        strides = tuple(st * itemsize for st in ref.stride)
        return LazyTensor(name, dt, shape, nbytes, origin=label,
                          loader=lambda: _gather(src, start, window, itemsize, shape, strides, swap, unit))


# ----------------------------------------------------------------------------------------------
# helpers


class _Pending:
    """The selection's tensors in order, as checked by `_flatten` but not made yet.

    A verbatim byte range (nearly every tensor) is a row of five columns, made by `stored_many` in one
    pass once the pickle's objects are gone; `entries` holds, per tensor, None (the next row), a tensor
    made already (views, empty, big-endian) or (first, name): the tensor named `first` again under `name`.
    """

    __slots__ = ("dtypes", "entries", "lengths", "names", "offsets", "shapes")

    def __init__(self) -> None:
        self.entries: list[Any] = []
        self.names: list[str] = []
        self.dtypes: list[Any] = []
        self.shapes: list[tuple[int, ...]] = []
        self.offsets: list[int] = []
        self.lengths: list[int] = []

    def add_stored(self, name: str, dtype: Any, shape: tuple[int, ...], offset: int, nbytes: int) -> None:
        self.entries.append(None)
        self.names.append(name)
        self.dtypes.append(dtype)
        self.shapes.append(shape)
        self.offsets.append(offset)
        self.lengths.append(nbytes)

    def build(self, source: ByteSource) -> list[LazyTensor]:
        made = stored_many(source, self.names, self.dtypes, self.shapes, self.offsets, self.lengths)
        self.names = self.dtypes = self.shapes = self.offsets = self.lengths = []
        if len(made) == len(self.entries):  # every entry a row (None): the rows are the tensors
            return made
        rows = iter(made)
        out: list[LazyTensor] = []
        by_name: dict[str, LazyTensor] = {}  # names are unique (`_flatten` checks)
        for e in self.entries:
            if e is None:
                t = next(rows)
            elif type(e) is tuple:
                t = by_name[e[0]].renamed(e[1])
            else:
                t = e
            out.append(t)
            by_name[t.name] = t
        return out


_MISSING = object()


def _empty() -> bytes:
    return b""


def _pairs(node: Any) -> Iterator[tuple[Any, Any]]:
    """(key, value) of a dict, (index, value) of a list or tuple."""
    return iter(node.items()) if isinstance(node, dict) else enumerate(node)


_UINTS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _gather(src: ByteSource, start: int, window: int, itemsize: int, shape: tuple[int, ...],
            strides: tuple[int, ...], swap: bool, unit: int) -> memoryview:
    """Copy a strided view's elements into C order; reads only the view's own storage window."""
    buf = src.view(start, window)
    if itemsize in _UINTS:
        base = np.frombuffer(buf, dtype=_UINTS[itemsize])
    else:
        base = np.frombuffer(buf, dtype=np.dtype((np.void, itemsize)))
    arr = np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides, writeable=False)
    out = np.ascontiguousarray(arr)
    if swap:
        out = _swap_array(out.reshape(-1).view(np.uint8), unit)
    return memoryview(out.reshape(-1).view(np.uint8))


def _swap_array(raw: np.ndarray, unit: int) -> np.ndarray:
    return raw.view(_UINTS[unit]).byteswap().view(np.uint8)


def _swapped(view: memoryview, unit: int) -> memoryview:
    """Big-endian storage bytes as the little-endian bytes migrator hands out."""
    return memoryview(_swap_array(np.frombuffer(view, dtype=np.uint8), unit))


def _is_contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for size, st in zip(reversed(shape), reversed(stride), strict=True):
        if size != 1 and st != expected:
            return False
        expected *= size
    return True


def _storage_dtype(stype: Any) -> str | None:
    if isinstance(stype, sp.StorageType):
        return stype.dtype
    if isinstance(stype, str):
        return sp.storage_type_dtype(stype.rpartition(".")[2])
    return None


def _type_name(v: Any) -> str:
    if isinstance(v, (sp.StorageType, sp.Opaque, sp.TorchType)):
        return v.name
    if isinstance(v, str):
        return v
    return type(v).__name__


def _describe(v: Any) -> str:
    if isinstance(v, sp.TensorRef):
        return "tensor"
    if isinstance(v, sp.Opaque):
        return f"opaque object {v.name}"
    return type(v).__name__


def _child(node: Any, seg: str) -> Any:
    if isinstance(node, dict):
        if seg in node:
            return node[seg]
        if seg.lstrip("-").isdigit() and int(seg) in node:
            return node[int(seg)]
        return _MISSING
    if isinstance(node, (list, tuple)) and seg.isdigit() and int(seg) < len(node):
        return node[int(seg)]
    return _MISSING


def _take_key(node: Any, segments: list[str]) -> tuple[str, list[str]]:
    """Split a dotted path: the longest run of segments that is a key here wins (keys may hold dots)."""
    parts = segments[0].split(".") if len(segments) == 1 else segments
    for i in range(len(parts), 0, -1):
        seg = ".".join(parts[:i])
        if _child(node, seg) is not _MISSING:
            return seg, ([".".join(parts[i:])] if i < len(parts) else [])
    return parts[0], []


def _list_keys(node: Any) -> str:
    if isinstance(node, dict):
        keys = [str(k) for k in node if isinstance(k, (str, int))]
    elif isinstance(node, (list, tuple)):
        keys = [str(i) for i in range(len(node))]
    else:
        return f"none ({_describe(node)})"
    shown = ", ".join(repr(k[:100]) for k in keys[:50])
    return shown + (f", ... ({len(keys)} in all)" if len(keys) > 50 else "") if keys else "none"


def _find_data_pkl(first: str | None, names: dict[str, Any]) -> str | None:
    """torch names the root folder after the file; take the first entry's folder, as torch does."""
    if first is not None:
        first_root = first.split("/", 1)[0] + "/" if "/" in first else ""
        if first_root + "data.pkl" in names:
            return first_root + "data.pkl"
    if "data.pkl" in names:
        return "data.pkl"
    candidates = sorted((n for n in names if n.endswith("/data.pkl")), key=lambda n: (n.count("/"), n))
    return candidates[0] if candidates else None


# ----------------------------------------------------------------------------------------------
# zip central directory (parsed here so that member data can be mapped, never inflated or copied)


def _read_zip_directory(src: ByteSource) -> _ZipDirectory:
    """Every member, parsed in one loop: torch's `<root>/data/<n>` storages (stored, unencrypted, with a
    canonical decimal `n` below the entry count) go to `_ZipDirectory.data` as two integers each; the
    others are plain tuples (see `_RawMember`) keyed by name."""
    label = src.label
    tail_len = min(src.size, 22 + 65535)
    tail = src.read(src.size - tail_len, tail_len, "zip end of central directory")
    eocd = -1
    i = tail.rfind(b"PK\x05\x06")
    while i >= 0:
        if i + 22 <= len(tail):
            (clen,) = struct.unpack_from("<H", tail, i + 20)
            if i + 22 + clen <= len(tail):
                eocd = i
                break
        i = tail.rfind(b"PK\x05\x06", 0, i)
    if eocd < 0:
        raise FormatError("zip archive without an end-of-central-directory record (truncated?)", file=label)
    eocd_pos = src.size - tail_len + eocd
    disk, cd_disk, n_disk, n_total, cd_size, cd_off, _ = struct.unpack_from("<HHHHIIH", tail, eocd + 4)
    dir_end = eocd_pos
    if 0xFFFF in (n_disk, n_total) or 0xFFFFFFFF in (cd_size, cd_off):
        loc_pos = eocd_pos - 20
        loc = src.read(loc_pos, 20, "zip64 locator") if loc_pos >= 0 else b""
        if loc[:4] != b"PK\x06\x07":
            raise FormatError("zip64 archive without a zip64 locator", file=label)
        _, z64_off, _ = struct.unpack_from("<IQI", loc, 4)
        if z64_off + 56 > loc_pos:
            raise FormatError("zip64 end record offset out of range", file=label)
        rec = src.read(z64_off, 56, "zip64 end of central directory")
        if rec[:4] != b"PK\x06\x06":
            raise FormatError("bad zip64 end-of-central-directory signature", file=label)
        disk, cd_disk, n_disk, n_total, cd_size, cd_off = struct.unpack_from("<IIQQQQ", rec, 16)
        dir_end = z64_off
    if disk != 0 or cd_disk != 0 or n_disk != n_total:
        raise FormatError("multi-part zip archives are not supported", file=label)
    if cd_off + cd_size > dir_end:
        raise FormatError(f"zip central directory [{cd_off}, {cd_off + cd_size}) runs past its end record",
                          file=label)
    if n_total > MAX_ZIP_ENTRIES or n_total * 46 > cd_size or cd_size > MAX_ZIP_DIRECTORY:
        raise LimitExceededError(f"zip declares {n_total} entries in a {cd_size}-byte directory", file=label)
    cd = src.read(cd_off, cd_size, "zip central directory")
    quick = _numbered_directory(cd, n_total, cd_off, src.size)
    return quick if quick is not None else _directory_entries(cd, n_total, cd_off, src.size, label)


def _directory_entries(cd: bytes, n_total: int, cd_off: int, size: int, label: str) -> _ZipDirectory:
    """The central directory's entries, one by one (the reference for `_numbered_directory`)."""
    members: dict[str, _RawMember] = {}
    compact: dict[bytes, tuple[array, array]] = {}  # root (b"archive/") -> header offsets, sizes by index
    first: str | None = None
    unpack = _CD_ENTRY.unpack_from
    p = 0
    n_cd = len(cd)
    for _ in range(n_total):
        if p + 46 > n_cd or not cd.startswith(b"PK\x01\x02", p):
            raise FormatError("corrupt zip central directory entry", file=label)
        flags, method, crc, csize, usize, nlen, xlen, clen, dstart, lho = unpack(cd, p)
        q = p + 46 + nlen
        if q + xlen + clen > n_cd:
            raise FormatError("corrupt zip central directory entry (lengths)", file=label)
        raw = cd[p + 46 : q]
        if 0xFFFFFFFF in (csize, usize, lho) or dstart == 0xFFFF:
            name = _member_name(raw, flags)
            usize, csize, lho = _zip64_extra(cd[q : q + xlen], usize, csize, lho, name, label)
        p = q + xlen + clen
        if lho + 30 > cd_off or csize > size:
            name = _member_name(raw, flags)
            raise FormatError(f"zip member {name} lies outside the archive data", file=label)
        if first is None:
            first = _member_name(raw, flags)
        numbered = _numbered(raw, method, flags, usize, csize, n_total)
        if numbered is not None:
            root, idx = numbered
            arrays = compact.get(root)
            if arrays is None and len(compact) < 4:  # a few roots at most (torch writes one): the rest as tuples
                arrays = compact[root] = (array("q", [-1]) * n_total, array("q", [0]) * n_total)
            if arrays is not None:
                if arrays[0][idx] >= 0:
                    raise FormatError(f"zip archive lists member {raw.decode('ascii')} twice", file=label)
                arrays[0][idx] = lho
                arrays[1][idx] = usize
                continue
        name = _member_name(raw, flags)
        if name in members:
            raise FormatError(f"zip archive lists member {name} twice", file=label)
        members[name] = (lho, usize, csize, method, flags, crc)
    return _ZipDirectory(members, {r.decode("ascii"): a for r, a in compact.items()}, first)


def _member_name(raw: bytes, flags: int) -> str:
    """A central-directory name: UTF-8 if the entry says so (flag bit 11), else cp437."""
    return raw.decode("utf-8" if flags & 0x800 else "cp437", "replace")


def _numbered(raw: bytes, method: int, flags: int, usize: int, csize: int, n_total: int) -> tuple[bytes, int] | None:
    """(root, n) for torch's storages, "<root>/data/<n>": one ASCII folder (or none), n canonical and < n_total,
    stored and unencrypted; None for any other member."""
    cut = raw.rfind(b"/data/")
    digits = raw[cut + 6 :] if cut >= 0 else raw[5:] if raw.startswith(b"data/") else b""
    if (digits.isdigit() and len(digits) <= 9 and (digits[0] != 0x30 or len(digits) == 1)
            and method == 0 and not flags & 1 and usize == csize):
        root = raw[: cut + 1] if cut >= 0 else b""
        idx = int(digits)
        if idx < n_total and root.count(b"/") <= 1 and root.isascii():
            return root, idx
    return None


def _numbered_directory(cd: bytes, n_total: int, cd_off: int, size: int) -> _ZipDirectory | None:
    """`_read_zip_directory`'s loop for a directory as torch writes it, with numpy: the storages under the
    first entry's folder are parsed all at once, the few other entries one by one.

    None whenever the loop could do anything else (raise, see zip64 fields, a second root or a name that
    holds an entry signature), and the loop then runs: the result, when there is one, is the loop's.
    """
    buf = np.frombuffer(cd, dtype=np.uint8)
    n_cd = len(buf)
    if n_total == 0 or n_cd < 46:
        return None
    at = np.flatnonzero(buf[: n_cd - 3] == 0x50)
    at = at[(buf[at + 1] == 0x4B) & (buf[at + 2] == 1) & (buf[at + 3] == 2)]
    at = at[at + 46 <= n_cd]
    if len(at) < n_total or at[0] != 0:
        return None
    at = at[:n_total]

    def u16(off: int) -> np.ndarray:
        return buf[at + off].astype(np.int64) | buf[at + off + 1].astype(np.int64) << 8

    def u32(off: int) -> np.ndarray:
        return u16(off) | u16(off + 2) << 16

    flags, method, csize, usize, nlen = u16(8), u16(10), u32(20), u32(24), u16(28)
    ends = at + 46 + nlen + u16(30) + u16(32)
    lho = u32(42)
    if (not np.array_equal(ends[:-1], at[1:]) or ends[-1] > n_cd  # one entry after another, no stray signature
            or np.any((csize == 0xFFFFFFFF) | (usize == 0xFFFFFFFF) | (lho == 0xFFFFFFFF) | (u16(34) == 0xFFFF))
            or np.any((lho + 30 > cd_off) | (csize > size))):
        return None
    first_raw = cd[46 : 46 + int(nlen[0])]
    first = _member_name(first_raw, int(flags[0]))
    root = first_raw.split(b"/", 1)[0] + b"/" if b"/" in first_raw else b""
    if not root.isascii():
        return None
    prefix = root + b"data/"
    # the prefix, then 1 to 9 digits, canonical, below n_total: column by column (a few MB at most)
    name_at = at + 46
    ndig = nlen - len(prefix)
    ok = (ndig >= 1) & (ndig <= 9) & (method == 0) & (flags & 1 == 0) & (usize == csize)
    for j, byte in enumerate(prefix):
        ok &= buf[np.minimum(name_at + j, n_cd - 1)] == byte
    number = np.zeros(len(at), dtype=np.int64)
    for j in range(9):
        digit = buf[np.minimum(name_at + len(prefix) + j, n_cd - 1)].astype(np.int64) - 0x30
        used = j < ndig
        ok &= ~used | ((digit >= 0) & (digit <= 9))
        if j == 0:
            ok &= (digit != 0) | (ndig == 1)
        number = np.where(used, number * 10 + digit, number)
    ok &= number < n_total
    numbered = np.flatnonzero(ok)
    idx = number[numbered]
    if len(idx) and np.bincount(idx).max() > 1:  # a storage listed twice: the loop names it
        return None
    members: dict[str, _RawMember] = {}
    for p in at[~ok].tolist():
        f, m, crc, c, u, n, _, _, _, h = _CD_ENTRY.unpack_from(cd, p)
        raw = cd[p + 46 : p + 46 + n]
        name = _member_name(raw, f)
        if _numbered(raw, m, f, u, c, n_total) is not None or name in members:
            return None
        members[name] = (h, u, c, m, f, crc)
    data: dict[str, tuple[array, array]] = {}
    if len(idx):
        offsets = np.full(n_total, -1, dtype=np.int64)
        sizes = np.zeros(n_total, dtype=np.int64)
        offsets[idx] = lho[numbered]
        sizes[idx] = usize[numbered]
        data[root.decode("ascii")] = (array("q", offsets.tobytes()), array("q", sizes.tobytes()))
    return _ZipDirectory(members, data, first)


def _zip64_extra(extra: bytes, usize: int, csize: int, lho: int, name: str, label: str) -> tuple[int, int, int]:
    q = 0
    while q + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, q)
        body = extra[q + 4 : q + 4 + size]
        q += 4 + size
        if tag != 0x0001:
            continue
        vals = []
        for i in range(0, len(body) - 7, 8):
            vals.append(struct.unpack_from("<Q", body, i)[0])
        it = iter(vals)
        try:
            if usize == 0xFFFFFFFF:
                usize = next(it)
            if csize == 0xFFFFFFFF:
                csize = next(it)
            if lho == 0xFFFFFFFF:
                lho = next(it)
        except StopIteration:
            raise FormatError(f"zip member {name}: short zip64 extra field", file=label) from None
        return usize, csize, lho
    raise FormatError(f"zip member {name}: 32-bit fields saturated but no zip64 extra field", file=label)


# ----------------------------------------------------------------------------------------------
# tar (old torch.save format: sys_info, pickle, tensors, storages)


def _read_tar_members(src: ByteSource) -> dict[str, tuple[int, int]]:
    label = src.label
    members: dict[str, tuple[int, int]] = {}
    pos = 0
    pax: dict[str, str] = {}
    long_name: str | None = None
    count = 0
    while pos + 512 <= src.size:
        hdr = src.read(pos, 512, "tar header")
        if hdr == bytes(512):
            break
        count += 1
        if count > MAX_TAR_MEMBERS:
            raise LimitExceededError(f"more than {MAX_TAR_MEMBERS} tar members", file=label)
        stored_sum = _tar_number(hdr[148:156], label)
        if stored_sum != sum(hdr[:148]) + 256 + sum(hdr[156:]):
            raise FormatError(f"tar header at byte {pos}: bad checksum", file=label)
        size = _tar_number(hdr[124:136], label)
        if "size" in pax:
            try:
                size = int(pax["size"])
            except ValueError:
                raise FormatError("tar pax header: bad size", file=label) from None
        kind = hdr[156:157]
        data = pos + 512
        if size < 0 or data + size > src.size:
            raise FormatError(f"tar member at byte {pos} declares {size} bytes past the end of the file "
                              "(truncated?)", file=label)
        name = hdr[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
        if hdr[257:262] == b"ustar" and hdr[345:500].strip(b"\0"):
            name = hdr[345:500].split(b"\0", 1)[0].decode("utf-8", "replace") + "/" + name
        if kind == b"x":
            if size > 1 << 20:
                raise LimitExceededError("tar pax header larger than 1 MiB", file=label)
            pax = _parse_pax(src.read(data, size), label)
        elif kind == b"L":
            if size > 1 << 16:
                raise LimitExceededError("tar long name larger than 64 KiB", file=label)
            long_name = src.read(data, size).split(b"\0", 1)[0].decode("utf-8", "replace")
        elif kind == b"g":
            pass
        else:
            if long_name is not None:
                name = long_name
            name = pax.get("path", name)
            while name.startswith("./"):
                name = name[2:]
            if kind in (b"0", b"\0", b"7") and "@PaxHeader" not in name:
                members[name] = (data, size)
            pax, long_name = {}, None
        pos = data + (size + 511) // 512 * 512
    return members


def _tar_number(field: bytes, label: str) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256
        value = int.from_bytes(field, "big") & ~(0x80 << (8 * (len(field) - 1)))
        return value
    text = field.replace(b"\0", b" ").strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise FormatError("tar header: bad number field (not a tar file?)", file=label) from None


def _parse_pax(data: bytes, label: str) -> dict[str, str]:
    out: dict[str, str] = {}
    p = 0
    while p < len(data):
        sp_ = data.find(b" ", p)
        if sp_ < 0:
            break
        try:
            n = int(data[p:sp_])
        except ValueError:
            raise FormatError("tar pax header: bad record length", file=label) from None
        if n <= 0 or p + n > len(data):
            raise FormatError("tar pax header: bad record length", file=label)
        rec = data[sp_ + 1 : p + n - 1].decode("utf-8", "replace")
        k, _, v = rec.partition("=")
        out[k] = v
        p += n
    return out
