"""Shared test helpers (burnpack); moved from the test files that first needed them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

cbor2 = pytest.importorskip("cbor2")
np = pytest.importorskip("numpy")


def parse_burnpack(path: Path) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """An independent reader: the top-level CBOR keys in order, the CBOR map, and each tensor (F32 or I64)."""
    data = path.read_bytes()
    assert data[:4] == b"NRUB" and int.from_bytes(data[4:6], "little") == 1
    size = int.from_bytes(data[6:10], "little")
    meta = cbor2.loads(data[10:10 + size])
    start = -(-(10 + size) // 256) * 256
    arrays = {}
    for name, d in meta["tensors"].items():
        lo, hi = d["data_offsets"]
        assert (start + lo) % 256 == 0
        dtype = {"F32": "<f4", "I64": "<i8"}[d["dtype"]]
        arrays[name] = np.frombuffer(data[start + lo:start + hi], dtype=dtype).reshape(d["shape"])
    return list(meta), meta, arrays
