"""The legacy torch.save stream (torch < 1.6): magic, protocol, sys_info, main pickle, storage keys, data."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

from ...core.errors import FormatError, LimitExceededError, UnsafePickleError, UnsupportedDTypeError
from ..safepickle import values as sp
from .core import _Span
from .pickles import PickleContainer

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL_VERSION = 1001



class LegacyContainer(PickleContainer):
    """Opens a legacy stream (or explains why a plain pickle is not a checkpoint)."""

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
            raise self._err(f"legacy checkpoint with protocol version {sp.describe(version)} (expected 1001)")
        u = self._unpickler(view, start=u.pos, what="legacy sys_info")
        sys_info = u.load()
        self._apply_sys_info(sys_info)
        main = self._unpickler(view, start=u.pos, persistent=self._storage_pid, what="legacy main pickle")
        root = self._run_main(main)
        u = self._unpickler(view, start=main.pos, what="legacy storage key list")
        keys = u.load()
        if not isinstance(keys, list) or not all(type(k) is str or (type(k) is int and 0 <= k < 1 << 63)
                                                 for k in keys):  # str() of a 4 KiB int raises
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
