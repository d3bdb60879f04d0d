"""torch.save's zip container (torch >= 1.6): central directory, local headers and member data.

The central directory is parsed here so that member data can be mapped, never inflated or copied.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ... import safepickle as sp
from ...bytesource import ByteSource
from ...errors import FormatError, LimitExceededError
from .. import pytorch as _pkg  # the MAX_* knobs are the package's attributes (SECURITY.md), read at open
from .core import ReaderCore, _Span


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


class ZipContainer(ReaderCore):
    """Opens a zip checkpoint and locates its storages' bytes."""

    _zip_members: dict[str, _RawMember]

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
        data = self._zip_read(self._zip_member(pkl), _pkg.MAX_PICKLE_BYTES)
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

    def _zip_read(self, m: _ZipMember, limit: int = _pkg.MAX_SMALL_RECORD) -> bytes:
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
    if n_total > _pkg.MAX_ZIP_ENTRIES or n_total * 46 > cd_size or cd_size > _pkg.MAX_ZIP_DIRECTORY:
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
