"""torch.save's zip container (torch >= 1.6): central directory, local headers and member data.

The central directory is parsed here so that member data can be mapped, never inflated or copied.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ...core.bytesource import ByteSource
from ...core.errors import FormatError, LimitExceededError
from ...core.limits import Limits
from .core import _Span
from .pickles import PickleContainer


@dataclass(frozen=True)
class _ZipMember:
    name: str
    header_offset: int
    size: int
    compressed_size: int
    method: int
    flags: int
    crc: int
    external_attr: int = 0


_RawMember = tuple[int, int, int, int, int, int, int]
"""A central-directory entry: (header_offset, size, compressed_size, method, flags, crc, external attributes)."""
_DOS_DIRECTORY = 0x10  # external attribute bit: torch's reader (miniz) then reads no bytes for the member

class _ZipDirectory(NamedTuple):
    """A parsed central directory. `data` maps a root folder ("archive/", or "") to two arrays indexed by
    storage number: header offset (-1: no such member) and size of `<root>data/<n>`, all stored, unencrypted
    members (16 bytes a storage instead of a name, a tuple and a dict slot); `members` holds the others.

    torch looks names up ignoring ASCII case, so no two names here differ only in case (the parse refuses
    such an archive); `folded` maps each member name, ASCII-lowercased, to its name."""

    members: dict[str, _RawMember]
    data: dict[str, tuple[array, array]]
    first: str | None  # the first entry's name (torch's root folder)
    folded: dict[str, str]


# flags, method, crc, sizes, name/extra/comment lengths, disk, external attributes, offset
_CD_ENTRY = struct.Struct("<8xHH4xIIIHHHH2xII")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_READ_GAP = 65536  # local headers less than this apart share a read ...
_READ_MAX = 1 << 20  # ... of at most this many bytes


def _fold(name: str) -> str:
    """A name as torch's (miniz's) lookup compares it: ASCII letters lowercased, nothing else changed."""
    return name.translate(_ASCII_LOWER)


class ZipContainer(PickleContainer):
    """Opens a zip checkpoint and locates its storages' bytes."""

    _zip_members: dict[str, _RawMember]
    _zip_folded: dict[str, str]

    def _open_zip(self) -> Any:
        directory = _read_zip_directory(self.source, self._limits)
        members = directory.members
        self._zip_members = members
        self._zip_folded = directory.folded
        pkl = _find_data_pkl(directory.first, members, self._zip_name)
        if pkl is None:
            raise self._err("zip archive without data.pkl: not a torch.save checkpoint")
        root = pkl[: -len("data.pkl")]
        if any(n.startswith(root + "code/") for n in members) or root + "constants.pkl" in members:
            raise self._err("this is a TorchScript archive (torch.jit.save), which holds code; load it with "
                            "torch.jit.load and save `model.state_dict()` with torch.save instead")
        self._zip_root = root
        folded_root = _fold(root)
        self._zip_data = next((a for r, a in directory.data.items() if _fold(r) == folded_root), None)
        del directory
        self._extra["archive_root"] = root.rstrip("/")
        for rec, key in ((".format_version", "format_version"), (".storage_alignment", "storage_alignment"),
                         ("version", "version")):
            name = self._zip_name(root + rec)
            if name is not None and members[name][1] <= 256:
                self._extra[key] = self._zip_read(self._zip_member(name)).decode("utf-8", "replace").strip()
        name = self._zip_name(root + "byteorder")
        if name is not None:
            order = self._zip_read(self._zip_member(name)).strip()
            if order not in (b"little", b"big"):
                raise self._err(f"unknown byteorder record {order[:20]!r}")
            self._swap = order == b"big"
        data = self._zip_read(self._zip_member(pkl), self._limits.max_pickle_bytes)
        result = self._run_main(self._unpickler(data, persistent=self._storage_pid, what=pkl))
        del data
        self._locate_storages()
        return result

    def _zip_name(self, name: str) -> str | None:
        """The member torch's lookup finds for `name` (ASCII case ignored), or None."""
        if name in self._zip_members:
            return name
        found = self._zip_folded.get(_fold(name))
        return found if found is not None and found in self._zip_members else None

    def _zip_member(self, name: str) -> _ZipMember:
        return _ZipMember(name, *self._zip_members[name])

    def _locate_storages(self) -> None:
        """Locate every stored `data/` member's bytes at once (`_local_starts`: a few large reads).

        Members whose local header is unreadable or bad are left for `_zip_span`, which raises the
        precise error only if a tensor needs them (torch reads only the members the pickle names).
        torch's numbered members (`_zip_data`) get their data offset written over their header offset,
        and their bit set in `_zip_found`; the others go to `_spans`.
        """
        size = self.source.size
        compact = self._zip_data
        if compact is not None:
            self._zip_found = bytearray(len(compact[0]))
            lhos = np.frombuffer(compact[0], dtype=np.int64)  # writable views: located offsets go in place
            sizes = np.frombuffer(compact[1], dtype=np.int64)
            found = np.frombuffer(self._zip_found, dtype=np.uint8)
            items = np.flatnonzero(lhos >= 0)
            starts = _local_starts(self.source, lhos[items])
            ok = (starts >= 0) & (starts + sizes[items] <= size)
            lhos[items[ok]] = starts[ok]
            found[items[ok]] = 1
        prefix = self._zip_root + "data/"
        cut = len(prefix)
        members = self._zip_members
        named = [(name, raw) for name, raw in members.items()
                 if name.startswith(prefix) and raw[3] == 0 and not raw[4] & 1 and raw[1] == raw[2]
                 and not raw[6] & _DOS_DIRECTORY]
        if not named:
            return
        starts = _local_starts(self.source, np.array([raw[0] for _, raw in named], dtype=np.int64))
        for (name, raw), start in zip(named, starts.tolist(), strict=True):
            if start >= 0 and start + raw[1] <= size:
                self._spans[name[cut:]] = _Span(start, raw[1])
                del members[name]  # located: only the others may still need their entry

    def _zip_data_offset(self, m: _ZipMember) -> int:
        """Validate a member (stored, in bounds) and return where its bytes start."""
        if m.flags & 1:
            raise self._err(f"zip member {m.name} is encrypted")
        if m.external_attr & _DOS_DIRECTORY or m.name.endswith("/"):
            raise self._err(f"zip member {m.name} is marked as a directory (torch reads no bytes for it)")
        if m.method != 0:
            raise self._err(f"zip member {m.name} is compressed (method {m.method}); torch.save stores "
                            "members uncompressed and migrator refuses to inflate them (zip-bomb guard)")
        if m.compressed_size != m.size:
            raise self._err(f"zip member {m.name}: stored size {m.compressed_size} != size {m.size}")
        src = self.source
        start = int(_local_starts(src, np.array([m.header_offset], dtype=np.int64))[0])
        if start == _HEADER_PAST_END:
            raise self._err(f"zip member {m.name}: local header at byte {m.header_offset} is past the end of "
                            f"the file ({src.size} bytes; truncated?)")
        if start == _HEADER_BAD:
            raise self._err(f"zip member {m.name}: bad local header signature")
        if start + m.size > src.size:
            raise self._err(f"zip member {m.name} needs bytes [{start}, {start + m.size}) but the file "
                            f"has {src.size} bytes (truncated?)")
        return start

    def _zip_read(self, m: _ZipMember, limit: int | None = None) -> bytes:
        """A small member, read whole and checked against its CRC-32 (tensor data is not read here)."""
        limit = self._limits.max_small_record_bytes if limit is None else limit
        if m.size > limit:
            raise LimitExceededError(f"zip member {m.name} has {m.size} bytes (limit {limit})", file=self.label)
        data = self.source.read(self._zip_data_offset(m), m.size, m.name)
        if zlib.crc32(data) != m.crc:
            raise self._err(f"zip member {m.name} fails its CRC-32 check (corrupt file)")
        return data

    def _zip_span(self, key: str, tensor: str) -> _Span:
        """The bytes of member `<root>data/<key>`: located at open, or located (and checked) now."""
        compact = self._zip_data
        if (compact is not None and len(key) <= 9 and key.isascii() and key.isdigit()
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
            name = self._zip_name(f"{self._zip_root}data/{key}")
            if name is None:
                raise self._err(f"storage '{key}' is missing from the archive (no member "
                                f"{self._zip_root}data/{key})", tensor)
            m = self._zip_member(name)
            span = _Span(self._zip_data_offset(m), m.size)
            self._spans[key] = span
        return span


_HEADER_PAST_END = -1  # `_local_starts`: the 30-byte local header does not fit in the file
_HEADER_BAD = -2  # ... the local header's signature is wrong


def _local_starts(src: ByteSource, lhos: np.ndarray) -> np.ndarray:
    """The local-header parser: where each member's data starts, given its local header offsets.

    The data follows the 30-byte header, its name and its extra field (their lengths are the local
    header's, as in torch's reader). Headers are read in file order, those less than `_READ_GAP` apart
    in one read of at most `_READ_MAX` bytes; an offset whose header cannot be read gives
    `_HEADER_PAST_END`, a wrong signature `_HEADER_BAD`.
    """
    out = np.full(len(lhos), _HEADER_PAST_END, dtype=np.int64)
    size = src.size
    inside = np.flatnonzero((lhos >= 0) & (lhos + 30 <= size))
    if not len(inside):
        return out
    at_hdr = lhos[inside]
    if len(at_hdr) > 1 and bool(np.any(at_hdr[1:] < at_hdr[:-1])):
        by_offset = np.argsort(at_hdr, kind="stable")
        inside, at_hdr = inside[by_offset], at_hdr[by_offset]
    gaps = np.flatnonzero(np.diff(at_hdr) > _READ_GAP) + 1  # a read ends before each of these
    i, n = 0, len(inside)
    while i < n:
        first = int(at_hdr[i])
        g = int(np.searchsorted(gaps, i, "right"))
        j = min(int(gaps[g]) if g < len(gaps) else n,
                max(i + 1, int(np.searchsorted(at_hdr, first + _READ_MAX - 30, "right"))))
        block = np.frombuffer(src.read(first, int(at_hdr[j - 1]) + 30 - first, "zip local headers"),
                              dtype=np.uint8)
        at = at_hdr[i:j] - first
        sig = (block[at] == 0x50) & (block[at + 1] == 0x4B) & (block[at + 2] == 3) & (block[at + 3] == 4)
        names = block[at + 26].astype(np.int64) | block[at + 27].astype(np.int64) << 8
        extras = block[at + 28].astype(np.int64) | block[at + 29].astype(np.int64) << 8
        out[inside[i:j]] = np.where(sig, at + first + 30 + names + extras, _HEADER_BAD)
        i = j
    return out


def _find_data_pkl(first: str | None, names: dict[str, Any], lookup: Callable[[str], str | None]) -> str | None:
    """torch names the root folder after the file; take the first entry's folder, as torch does.

    `lookup` finds a member as torch's lookup does (ASCII case ignored). torch refuses an archive
    whose first entry is not in a folder or whose folder has no data.pkl; migrator then also reads
    `data.pkl` at the top, or the shallowest `*/data.pkl`.
    """
    if first is not None:
        first_root = first.split("/", 1)[0] + "/" if "/" in first else ""
        found = lookup(first_root + "data.pkl")
        if found is not None:
            return found
    found = lookup("data.pkl")
    if found is not None:
        return found
    candidates = sorted((n for n in names if _fold(n).endswith("/data.pkl")), key=lambda n: (n.count("/"), n))
    return candidates[0] if candidates else None


def _read_zip_directory(src: ByteSource, limits: Limits) -> _ZipDirectory:
    """Find the end records as torch's reader does, check them, and parse the central directory.

    The end-of-central-directory record is the last signature with 22 bytes after it in the file's
    last 64 KiB + 22 (its comment length is not checked: a comment may hold another signature, and
    torch takes the last one). A zip64 locator right before it that points to a zip64 end record makes
    that record's counts and offsets the ones used, saturated or not, as in torch's reader.
    """
    label = src.label
    tail_len = min(src.size, 22 + 65535)
    tail = src.read(src.size - tail_len, tail_len, "zip end of central directory")
    eocd = tail.rfind(b"PK\x05\x06", 0, len(tail) - 18)  # a signature in the last 21 bytes has no room
    if eocd < 0:
        raise FormatError("zip archive without an end-of-central-directory record (truncated?)", file=label)
    eocd_pos = src.size - tail_len + eocd
    disk, cd_disk, n_disk, n_total, cd_size, cd_off, _ = struct.unpack_from("<HHHHIIH", tail, eocd + 4)
    dir_end = eocd_pos
    zip64 = _zip64_end(src, eocd_pos)
    if zip64 is not None:
        disk, cd_disk, n_disk, n_total, cd_size, cd_off, dir_end = zip64
    elif 0xFFFF in (n_disk, n_total) or 0xFFFFFFFF in (cd_size, cd_off):
        raise FormatError("zip64 archive without a readable zip64 end record", file=label)
    if disk != 0 or cd_disk != 0 or n_disk != n_total:
        raise FormatError("multi-part zip archives are not supported", file=label)
    if cd_off + cd_size > dir_end:
        raise FormatError(f"zip central directory [{cd_off}, {cd_off + cd_size}) runs past its end record",
                          file=label)
    if n_total > limits.max_zip_entries or n_total * 46 > cd_size or cd_size > limits.max_zip_directory_bytes:
        raise LimitExceededError(f"zip declares {n_total} entries in a {cd_size}-byte directory (limits: "
                                 f"max_zip_entries {limits.max_zip_entries}, max_zip_directory_bytes "
                                 f"{limits.max_zip_directory_bytes})", file=label)
    cd = src.read(cd_off, cd_size, "zip central directory")
    return _directory_entries(cd, n_total, cd_off, src.size, label)


def _zip64_end(src: ByteSource, eocd_pos: int) -> tuple[int, int, int, int, int, int, int] | None:
    """(disk, directory disk, entries here, entries, directory size, directory offset, record offset) of
    the zip64 end record, when a locator just before the end record points to one; else None."""
    loc_pos = eocd_pos - 20
    if loc_pos < 0:
        return None
    loc = src.read(loc_pos, 20, "zip64 locator")
    if loc[:4] != b"PK\x06\x07":
        return None
    _, z64_off, _ = struct.unpack_from("<IQI", loc, 4)
    if z64_off + 56 > loc_pos:
        return None
    rec = src.read(z64_off, 56, "zip64 end of central directory")
    if rec[:4] != b"PK\x06\x06":
        return None
    disk, cd_disk, n_disk, n_total, cd_size, cd_off = struct.unpack_from("<IIQQQQ", rec, 16)
    return disk, cd_disk, n_disk, n_total, cd_size, cd_off, z64_off


def _directory_entries(cd: bytes, n_total: int, cd_off: int, size: int, label: str) -> _ZipDirectory:
    """The central directory's entries, one by one; names that differ only in ASCII case are refused."""
    members: dict[str, _RawMember] = {}
    folded: dict[str, str] = {}
    compact: dict[bytes, tuple[array, array]] = {}  # root (b"archive/") -> header offsets, sizes by index
    first: str | None = None
    unpack = _CD_ENTRY.unpack_from
    p = 0
    n_cd = len(cd)
    for _ in range(n_total):
        if p + 46 > n_cd or not cd.startswith(b"PK\x01\x02", p):
            raise FormatError("corrupt zip central directory entry", file=label)
        flags, method, crc, csize, usize, nlen, xlen, clen, dstart, attr, lho = unpack(cd, p)
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
        numbered = None if attr & _DOS_DIRECTORY else _numbered(raw, method, flags, usize, csize, n_total)
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
        key = _fold(name)
        if key in folded:
            raise _ambiguous(folded[key], name, label)
        members[name] = (lho, usize, csize, method, flags, crc, attr)
        folded[key] = name
    roots = {r.decode("ascii"): a for r, a in compact.items()}
    _check_case(roots, folded, n_total, label)
    return _ZipDirectory(members, roots, first, folded)


def _ambiguous(a: str, b: str, label: str) -> FormatError:
    if a == b:  # a numbered storage and a member of the same name that is not one (compressed, ...)
        return FormatError(f"zip archive lists member {a} twice", file=label)
    return FormatError(f"ambiguous zip: members {a!r} and {b!r} differ only in case (torch's lookup ignores "
                       "case, and which one it reads is not defined)", file=label)


def _check_case(roots: dict[str, tuple[array, array]], folded: dict[str, str], n_total: int, label: str) -> None:
    """Refuse numbered storages whose names differ only in case from another member's."""
    seen: dict[str, str] = {}
    for root in roots:
        if _fold(root) in seen:
            raise FormatError(f"ambiguous zip: folders {seen[_fold(root)]!r} and {root!r} differ only in case "
                              "(torch's lookup ignores case)", file=label)
        seen[_fold(root)] = root
    for key, name in folded.items():
        cut = key.rfind("/data/")
        top = key[5:] if key.startswith("data/") else ""
        root, digits = (key[: cut + 1], key[cut + 6 :]) if cut >= 0 else ("", top)
        if (root in seen and digits.isascii() and digits.isdigit() and len(digits) <= 9
                and (digits[0] != "0" or len(digits) == 1) and int(digits) < n_total
                and roots[seen[root]][0][int(digits)] >= 0):
            raise _ambiguous(f"{seen[root]}data/{digits}", name, label)


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
