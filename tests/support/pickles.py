"""Shared test helpers (pickles); moved from the test files that first needed them."""

from __future__ import annotations

import io
import pickle
import struct
import tracemalloc
import zipfile
from pathlib import Path

import fuzz
import numpy as np
import pytest

import migrator
from migrator.core.errors import MigratorError
from migrator.core.limits import DEFAULT_LIMITS, Limits
from migrator.formats import pytorch

torch = pytest.importorskip("torch")


MiB = 1 << 20


BUDGETS = {"pickle": (80, 8 * MiB), "file": (16, 8 * MiB)}


def touch_all(reader: migrator.files.io.Reader) -> None:
    for t in reader.tensors:
        t.data()
        if t.dtype.numpy_name is not None:
            t.numpy()


def outcome(path: Path, *, fmt: str = "auto", budget: str = "file", seconds: float = 20,
            limits: Limits = DEFAULT_LIMITS) -> BaseException:
    """Open `path` and touch every tensor; return the error, checking time and allocation bounds."""
    size = path.stat().st_size
    factor, const = BUDGETS[budget]
    err: BaseException | None = None
    tracemalloc.start()
    try:
        with fuzz.time_limit(seconds), migrator.open_file(path, format=fmt, limits=limits) as r:
            touch_all(r)
    except Exception as e:  # the type is what the test checks
        err = e
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak <= factor * size + const, f"{path.name}: peak {peak} bytes for a {size}-byte input"
    assert err is not None, f"{path.name} was accepted"
    assert isinstance(err, MigratorError), f"{path.name}: untyped {type(err).__name__}: {err}"
    assert path.name in str(err), f"{path.name}: the error does not name the file: {err}"
    return err


def u(text: str | bytes) -> bytes:
    """BINUNICODE."""
    raw = text.encode() if isinstance(text, str) else text
    return b"X" + struct.pack("<I", len(raw)) + raw


P2, P4 = b"\x80\x02", b"\x80\x04"


STORAGE_PID = b"(" + u("storage") + b"ctorch\nFloatStorage\n" + u("0") + u("cpu") + b"K\x02tQ"


REBUILD = (b"ctorch._utils\n_rebuild_tensor_v2\n(" + STORAGE_PID + b"K\x00K\x02\x85K\x01\x85\x89"
           b"ccollections\nOrderedDict\n)RtR")  # _rebuild_tensor_v2(storage '0' (2 floats), 0, (2,), (1,), False, {})


def in_zip(payload: bytes) -> bytes:
    """A real torch.save zip ({'w': torch.ones(2)}) with its data.pkl replaced (CRCs correct)."""
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf)
    out = io.BytesIO()
    with zipfile.ZipFile(buf) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, payload if info.filename.endswith("data.pkl") else zin.read(info))
    return out.getvalue()


def in_legacy(payload: bytes) -> bytes:
    """A legacy torch.save stream whose main pickle is `payload`; storage '0' holds 2 floats."""
    head = b"".join(pickle.dumps(x, protocol=2) for x in (
        pytorch.LEGACY_MAGIC, pytorch.LEGACY_PROTOCOL_VERSION,
        {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 8}}))
    tail = pickle.dumps(["0"], protocol=2) + struct.pack("<q", 2) + np.ones(2, np.float32).tobytes()
    return head + payload + tail
