"""The old tar torch.save format: sys_info, pickle, tensors and storages members (tar/pax/GNU headers)."""

from __future__ import annotations

import struct
from typing import Any

from ...core.bytesource import ByteSource
from ...core.errors import FormatError, LimitExceededError, UnsupportedDTypeError
from ...core.limits import Limits
from ..safepickle import values as sp
from .core import _Span, _storage_dtype, _type_name
from .pickles import PickleContainer


class TarContainer(PickleContainer):
    """Opens a tar checkpoint; its storages and tensor records are read before the main pickle."""

    _tar_storage_types: dict[str, sp.StorageType | str]
    _tar_tensors: dict[str, sp.TensorRef]

    def _open_tar(self) -> Any:
        members = _read_tar_members(self.source, self._limits)
        for needed in ("pickle", "storages"):
            if needed not in members:
                raise self._err(f"tar checkpoint without a '{needed}' member")
        if "sys_info" in members:
            off, size = members["sys_info"]
            if size > self._limits.max_small_record_bytes:
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


def _read_tar_members(src: ByteSource, limits: Limits) -> dict[str, tuple[int, int]]:
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
        if count > limits.max_tar_members:
            raise LimitExceededError(f"more than {limits.max_tar_members} tar members", file=label)
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
