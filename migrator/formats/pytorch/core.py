"""What the torch.save containers and the flattening share: the reader's state, errors, persistent ids, sys_info.

Running the interpreter over a container's pickles is `pickles.py`'s: the flattening and the view
builder work on what it built (`safepickle.values`), so they need not import the interpreter."""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any, NamedTuple

from ...core.errors import FormatError
from ...core.limits import Limits
from ..base import Reader
from ..safepickle import values as sp


class _Span(NamedTuple):
    """Where one storage's bytes lie in the source (a tuple: one per storage, made 100k times)."""

    offset: int
    nbytes: int



class ReaderCore(Reader):
    """The state the container readers and the flattening share (set up by `PytorchReader.__init__`)."""

    _limits: Limits
    _extra: dict[str, Any]
    _opaque: set[str]
    _protocol: int | None
    _swap: bool
    _spans: dict[str, _Span]
    _first_dtype: dict[str, str | None]
    _ignored: list[str]
    _groups: dict[str, list[str]]
    _layouts: dict[tuple[Any, ...], tuple[Any, int, int, bool, tuple[int, ...]]]
    _zip_data: tuple[array, array] | None
    _zip_found: bytearray
    _zip: bool
    _zip_root: str
    _storage_refs: dict[Any, sp.StorageRef]  # a storage key -> its first reference (see _storage_pid)

    if TYPE_CHECKING:  # defined by `Flattener` and `ZipContainer`, which every reader built on this core is
        def _placeholder_error(self, name: str, value: sp.Placeholder | sp.Opaque) -> FormatError: ...
        def _zip_span(self, key: str, tensor: str) -> _Span: ...

    def _err(self, message: str, tensor: str | None = None) -> FormatError:
        return FormatError(message, file=self.label, tensor=tensor)

    # -- persistent ids ---------------------------------------------------------------------------

    def _storage_pid(self, pid: Any) -> Any:
        """('storage', StorageType, key, location, numel[, view_metadata]) -> a StorageRef.

        A key's first reference fixes its storage, as in torch.load: a later reference to that key
        with another storage type or size gets the first one's (torch keeps the storage it loaded
        first and ignores the later id's type and size). Exceptions, also torch's: a first storage of
        0 bytes is not kept (zip: the next reference is loaded anew; legacy: each later reference gets
        an empty storage of its own type), and a legacy storage view is typed by its own id.
        """
        if type(pid) is tuple and len(pid) == 5 and pid[0] == "storage":  # every torch.save tensor
            _, stype, key, location, numel = pid
            if (type(stype) is sp.StorageType and type(key) is str and type(location) is str
                    and type(numel) is int and 0 <= numel < 1 << 63):
                first = self._storage_refs.get(key)
                if first is not None and first.numel:
                    return first
                if not self._zip and key not in self._first_dtype:  # zip storages are located by name
                    self._first_dtype[key] = stype.dtype
                ref = sp.StorageRef(key, stype.name, stype.dtype, numel, location, None)
                if first is None or self._zip:
                    self._storage_refs[key] = ref
                return ref
        return self._slow_storage_pid(pid)

    def _slow_storage_pid(self, pid: Any) -> sp.StorageRef | sp.Opaque:
        """`_storage_pid` for every other shape of persistent id (legacy ids, bytes, int keys, refusals)."""
        if not isinstance(pid, tuple) or not pid:
            raise self._err(f"persistent id is a {type(pid).__name__}, expected a tuple")
        tag = pid[0].decode("ascii", "replace") if isinstance(pid[0], bytes) else pid[0]
        if tag == "module":  # legacy torch.save(model) names each module class so: a class, never loaded
            name = pid[1].name if len(pid) > 1 and isinstance(pid[1], sp.Opaque) else "an nn.Module class"
            self._opaque.add(name)
            return sp.Opaque(name, module=True)  # only an error where the selection holds its instances
        if tag != "storage" or len(pid) not in (5, 6):
            raise self._err(f"unknown persistent id {sp.describe(tag)} with {len(pid)} fields")
        stype, key, location, numel = pid[1:5]
        view = pid[5] if len(pid) == 6 else None
        if not isinstance(stype, (sp.StorageType, str)):
            raise self._err(f"persistent id storage type is {_type_name(stype)}, not a torch storage class")
        if type(key) not in (str, int) or not isinstance(location, (str, bytes)):
            raise self._err("persistent id: storage key / location have the wrong types")
        if type(key) is int and not 0 <= key < 1 << 63:  # str() of a 4 KiB integer raises ValueError
            raise self._err("persistent id: storage key is an integer outside 0..2**63-1")
        if type(numel) is not int or not 0 <= numel < 1 << 63:
            raise self._err("persistent id: storage size is not a non-negative 64-bit integer")
        raw_key, key = key, str(key)
        first = self._storage_refs.get(raw_key)
        if first is not None and first.numel and view is None:
            return first
        dtype = _storage_dtype(stype)
        if not self._zip:
            self._first_dtype.setdefault(key, dtype)
        view_t: tuple[str, int, int] | None = None
        if view is not None:
            if not (isinstance(view, tuple) and len(view) == 3
                    and (type(view[0]) is str or (type(view[0]) is int and 0 <= view[0] < 1 << 63))
                    and type(view[1]) is int and type(view[2]) is int and 0 <= view[1] < 1 << 63
                    and 0 <= view[2] < 1 << 63):
                raise self._err("persistent id: storage view is not (key, offset, size)")
            view_t = (str(view[0]), view[1], view[2])
        loc = location.decode("ascii", "replace") if isinstance(location, bytes) else location
        if first is None or (self._zip and not first.numel):
            self._storage_refs[raw_key] = sp.StorageRef(key, _type_name(stype), dtype, numel, loc, None)
        return sp.StorageRef(key, _type_name(stype), dtype, numel, loc, view_t)


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


