"""The burnpack and SafeTensors family: seeds, the length fields of their headers, the JSON numbers a
SafeTensors header is mutated with, and `--differential`: each header fast path against its reference
parser."""

from __future__ import annotations

import hashlib
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

import migrator
from migrator.core import dtypes
from migrator.core.tensor import from_numpy

from .common import CaseTimeout, _tiny_tensors, time_limit


def burnpack_seeds() -> list[bytes]:
    from migrator.core.scalars import Scalar

    ts = _tiny_tensors()
    bf16 = from_numpy("bf", np.arange(4, dtype=np.float32), dtype=dtypes.FLEX32)
    return [
        migrator.to_bytes(ts, "burnpack", metadata={"format": "burnpack", "producer": "fuzz"},
                          scalars={"epoch": Scalar("Int", 3), "lr": Scalar("Float", 0.5),
                                   "big": Scalar("UInt", 2**64 - 1), "flag": Scalar("Bool", True)}),
        migrator.to_bytes([*ts[:2], bf16], "burnpack"),
        migrator.to_bytes([], "burnpack"),
    ]


def safetensors_seeds() -> list[bytes]:
    ts = _tiny_tensors()
    return [
        migrator.to_bytes(ts, "safetensors", metadata={"format": "pt", "note": "fuzz ✓"}),
        migrator.to_bytes(ts[:2], "safetensors"),
        migrator.to_bytes([from_numpy("c", np.array([1 + 2j], dtype=np.complex64))], "safetensors"),
    ]


JSON_NUMBERS = ("-1", "0", "1", "18446744073709551615", "18446744073709551616", "9223372036854775808",
                "1e400", "-0", "1.5", "99999999999999999999999999999999999999", "4294967296", "1" + "0" * 5000)


def header_fields(data: bytes, reader: str) -> list[tuple[int, int, str]]:
    """(position, width, byte order) of the header fields holding lengths and counts."""
    if reader == "burnpack":
        out = [(6, 4, "<"), (4, 2, "<")]
        end = min(len(data), 10 + (int.from_bytes(data[6:10], "little") if len(data) >= 10 else 0), 8192)
        for p in range(10, end):
            info = data[p] & 31
            if 24 <= info <= 27 and data[p] >> 5 != 7:
                out.append((p + 1, 1 << (info - 24), ">"))
        return out
    return [(0, 8, "<"), (0, 4, "<"), (4, 4, "<")]  # SafeTensors


# ----------------------------------------------------------------------------------------------
# --differential: the header fast paths against the reference parsers (SafeTensors, burnpack)

DIFFERENTIAL_READERS = ("safetensors", "burnpack")


def _header_reader_classes(reader: str) -> tuple[type, type]:
    """(the reader as shipped, the same reader with its fast path switched off)."""
    from migrator.formats.burnpack import BurnpackReader
    from migrator.formats.safetensors import SafetensorsReader

    base: type = SafetensorsReader if reader == "safetensors" else BurnpackReader
    return base, type(f"Reference{base.__name__}", (base,), {"fast_path": False})


def _stored_facts(t: Any) -> tuple[Any, ...]:
    view = t.loader
    return (t.name, t.dtype, t.shape, t.nbytes, t.span, t.param_id, t.origin, type(view),
            getattr(view, "offset", None), getattr(view, "length", None), bytes(t.data()))


def differential_outcome(cls: type, data: bytes) -> tuple[Any, ...]:
    """Everything a header reader gives for `data`: tensors (with their bytes), metadata, scalars and
    extra(), or its error's type, message and tensor. A non-MigratorError is returned too: the two
    paths must then fail the same way (and the ordinary fuzz mode reports it as a crash)."""
    from migrator.core.bytesource import MemorySource

    try:
        r = cls(MemorySource(data))
    except Exception as e:
        return ("error", type(e).__name__, str(e), getattr(e, "tensor", None))
    return ("ok", [_stored_facts(t) for t in r.tensors], r.metadata, repr(r.scalars), r.extra())


def fast_path_taken(reader: str, data: bytes) -> bool:
    """Whether the fast path itself (not its fallback) accepted `data`."""
    from migrator.core.bytesource import MemorySource

    _, reference = _header_reader_classes(reader)
    try:
        r = reference(MemorySource(data))
    except Exception:
        return False
    start = 8 if reader == "safetensors" else 10
    size = r.header_size if reader == "safetensors" else r.metadata_size
    return r._fast(data[start:start + size]) is not None


def run_differential(reader: str, cases: int, rng: random.Random, timeout: float, crash_dir: Path,
                     max_seconds: float | None) -> dict[str, Any]:
    """Mutated inputs read by both paths; every difference is saved and counted."""
    from .mutations import apply_ops, build_seeds, random_ops

    shipped, reference = _header_reader_classes(reader)
    pool = list(build_seeds(reader))
    counts: Counter[str] = Counter()
    started = time.monotonic()
    n = 0
    for n in range(1, cases + 1):
        base = rng.choice(pool)
        data = apply_ops(base, random_ops(rng, base, reader), reader, pool)
        try:
            with time_limit(timeout):
                fast, full = differential_outcome(shipped, data), differential_outcome(reference, data)
                taken = fast[0] == "ok" and fast_path_taken(reader, data)
        except CaseTimeout:
            counts["timeout"] += 1
            (crash_dir / f"{reader}-differential-timeout-{hashlib.sha1(data).hexdigest()[:12]}.bin").write_bytes(data)
            continue
        if fast != full:
            counts["different"] += 1
            name = f"{reader}-differential-{hashlib.sha1(data).hexdigest()[:12]}.bin"
            (crash_dir / name).write_bytes(data)
            print(f"[{n}] DIFFERENT -> {crash_dir / name}\n  fast: {str(fast)[:300]}\n  full: {str(full)[:300]}",
                  file=sys.stderr, flush=True)
        counts["fast path" if taken else ("fallback, ok" if fast[0] == "ok" else f"error {fast[1]}")] += 1
        if fast[0] == "ok" and len(pool) < 512 and data not in pool and rng.random() < 0.2:
            pool.append(data)
        if n % 10_000 == 0:
            print(f"[{n}] {n / (time.monotonic() - started):.0f} cases/s {dict(counts.most_common(6))}",
                  file=sys.stderr, flush=True)
        if max_seconds and time.monotonic() - started > max_seconds:
            break
    return {"reader": reader, "mode": "differential", "cases": n, "seconds": round(time.monotonic() - started, 1),
            "differences": counts["different"], "timeouts": counts["timeout"],
            "outcomes": dict(counts.most_common())}
