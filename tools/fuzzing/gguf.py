"""The GGUF family: seeds written by migrator and by gguf-py, the counts and lengths of a GGUF header, and
`--reader gguf --differential`: migrator's reader against gguf-py's on every mutated input."""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
import struct
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

import migrator
from migrator.core.errors import MigratorError
from migrator.core.tensor import from_numpy

from .common import CaseTimeout, _tiny_tensors, time_limit


def gguf_seeds() -> list[bytes]:
    """migrator-written GGUF (typed key/values, quantized tensors) and, with gguf-py installed, a file
    it writes holding a K-quant and an IQ tensor (random blocks) at a custom alignment."""
    from migrator.formats.gguf.constants import ValueType
    from migrator.formats.gguf.header import Value
    from migrator.formats.gguf.writer import GGUFWriter

    ts = _tiny_tensors()
    rng = np.random.default_rng(5)
    w = from_numpy("blk.0.attn_q.weight", rng.standard_normal((4, 64)).astype(np.float32))
    meta: dict[str, str] = {"general.architecture": "llama", "general.name": "fuzz \u2713", "llama.block_count": "1",
                            "tokenizer.ggml.tokens": Value(ValueType.ARRAY, ["<s>", "a", "\u00e9"], ValueType.STRING),
                            "tokenizer.ggml.scores": Value(ValueType.ARRAY, np.float32([0, -1, 2.5]),
                                                           ValueType.FLOAT32)}
    out = [migrator.to_bytes([*ts[:2], w], "gguf", metadata=meta), migrator.to_bytes([], "gguf")]
    for rule in ("Q8_0", "Q4_1"):
        buf = io.BytesIO()
        GGUFWriter([ts[0], w], metadata=meta, quantize={".*": rule}).write_to(buf)
        out.append(buf.getvalue())
    try:
        import gguf
    except ImportError:
        return out
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "seed.gguf")
        gw = gguf.GGUFWriter(path, "llama")
        gw.add_custom_alignment(64)
        gw.add_array("nested", [[1, 2], [3]])
        for name, size in (("Q4_K", 144), ("IQ2_XS", 74)):
            blocks = rng.integers(0, 256, (2, size), dtype=np.uint8)
            blocks[:, :2] = np.float16([0.5, -0.25]).view(np.uint8).reshape(2, 2)
            gw.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType[name])
        gw.write_header_to_file()
        gw.write_kv_data_to_file()
        gw.write_tensors_to_file()
        gw.close()
        out.append(Path(path).read_bytes())
    return out


def gguf_fields(data: bytes) -> list[tuple[int, int, str]]:
    """The tensor and key/value counts, then every u64 that looks like a string length or a small count."""
    out = [(8, 8, "<"), (16, 8, "<")]
    for p in range(24, min(len(data) - 8, 4096), 4):
        v = int.from_bytes(data[p:p + 8], "little")
        if 0 < v < 4096:
            out.append((p, 8, "<"))
    return out


# ----------------------------------------------------------------------------------------------
# --reader gguf --differential: migrator's GGUF reader against gguf-py's


def _comparable(v: Any) -> Any:
    """Floats as their bits (NaN equals itself), lists item by item."""
    if isinstance(v, list):
        return [_comparable(x) for x in v]
    if isinstance(v, float):
        return struct.pack("<d", v)
    return v


def _gguf_py_facts(path: Path) -> tuple[Any, ...]:
    """What gguf-py's reader gives: per tensor (name, ggml type, PyTorch-order shape, stored bytes),
    and per key (value types, contents); a key whose strings are not UTF-8 is compared as None."""
    import gguf

    r = gguf.GGUFReader(str(path))
    tensors = [(t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape.tolist())),
                np.asarray(t.data).tobytes()) for t in r.tensors]
    fields = {}
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            contents = f.contents()
        except UnicodeDecodeError:
            contents = None
        fields[key] = ([int(t) for t in f.types], _comparable(contents))
    return tensors, fields


def _utf8_clean(s: str) -> bool:
    return not any(0xDC80 <= ord(c) <= 0xDCFF for c in s)  # no surrogate escape of an undecodable byte


def _value_types(v: Any) -> list[int]:
    """A value's type tags as gguf-py lists them (arrays: the item types down the first items, none
    for an empty array)."""
    from migrator.formats.gguf.constants import ValueType

    out = [int(v.type)]
    # gguf-py lists an array's item type from its first item: an empty array shows none
    while v.type is ValueType.ARRAY and v.item_type is not None and len(v.data):
        out.append(int(v.item_type))
        if v.item_type is not ValueType.ARRAY:
            break
        v = v.data[0]
    return out


def _value_contents(v: Any) -> Any:
    """A value as gguf-py's `contents()` gives it (arrays of arrays flattened)."""
    from migrator.formats.gguf.constants import ValueType

    if v.type is not ValueType.ARRAY:
        if isinstance(v.data, str):
            return v.data if _utf8_clean(v.data) else None
        return _comparable(v.data.item() if hasattr(v.data, "item") else v.data)
    if v.item_type is ValueType.ARRAY:
        return [x for item in v.data for x in (_value_contents(item) or [])]
    items = v.data.tolist() if hasattr(v.data, "tolist") else list(v.data)
    if v.item_type is ValueType.STRING and not all(map(_utf8_clean, items)):
        return None
    return _comparable(items)


def _migrator_gguf_facts(path: Path, data: bytes) -> tuple[Any, ...]:
    with migrator.open_file(path, format="gguf") as r:
        tensors = []
        for t in r.tensors:
            loader = t.loader
            raw = data[loader.offset:loader.offset + loader.length] if hasattr(loader, "gtype") else bytes(t.data())
            tensors.append((t.name, r.ggml_type(t), t.shape, raw))
        fields = {k: (_value_types(v), _value_contents(v)) for k, v in r.header.metadata.items()}
    return tensors, fields


def differential_gguf(cases: int, rng: random.Random, timeout: float, crash_dir: Path,
                      max_seconds: float | None, oracle_timeout: float = 1.0) -> dict[str, Any]:
    """Mutated GGUF inputs: every one migrator accepts must read the same in gguf-py.

    migrator has `timeout` per case (running past it is a failure). gguf-py reads every input too:
    an accepted one within `timeout` (gguf-py running past it is a difference), a refused one within
    `oracle_timeout` only, since gguf-py loops over whatever count a header claims (minutes for
    2**40 array items) and whether it would finally refuse it does not decide anything about
    migrator: such a case is counted as "both refuse (gguf-py ran out of time)"."""
    from .mutations import apply_ops, build_seeds, random_ops

    pool = list(build_seeds("gguf"))
    counts: Counter[str] = Counter()
    only_theirs: Counter[str] = Counter()  # why migrator refused what gguf-py reads
    scratch = Path(tempfile.mkdtemp(prefix="migrator-fuzz-gguf-"))
    path = scratch / "case.gguf"
    started = time.monotonic()
    slowest = (0.0, "")
    n = 0
    for n in range(1, cases + 1):
        base = rng.choice(pool)
        data = apply_ops(base, random_ops(rng, base, "gguf"), "gguf", pool)
        path.write_bytes(data)
        ours: Any = None
        theirs: Any = None
        refusal: MigratorError | None = None
        case_started = time.monotonic()
        try:
            with time_limit(timeout):
                ours = _migrator_gguf_facts(path, data)
        except MigratorError as e:
            refusal = e
        except CaseTimeout:
            counts["timeout"] += 1
            (crash_dir / f"gguf-differential-timeout-{hashlib.sha1(data).hexdigest()[:12]}.bin").write_bytes(data)
            continue
        took = time.monotonic() - case_started
        if took > slowest[0]:
            slowest = (took, hashlib.sha1(data).hexdigest()[:12])
        try:
            with time_limit(timeout if refusal is None else oracle_timeout):
                theirs = _gguf_py_facts(path)
        except CaseTimeout:
            theirs = ("timeout",)
        except Exception as e:  # any refusal of gguf-py's
            theirs = ("error", type(e).__name__, str(e)[:200])
        if refusal is not None:  # accept/reject agreement: does gguf-py read what migrator refuses?
            if theirs == ("timeout",):
                counts["both refuse (gguf-py ran out of time)"] += 1
            elif theirs[0] == "error":
                counts["both refuse"] += 1
            else:
                counts[f"only gguf-py reads it (migrator: {type(refusal).__name__})"] += 1
                only_theirs[_refusal_kind(str(refusal))] += 1
            continue
        if ours != theirs:
            counts["different"] += 1
            name = f"gguf-differential-{hashlib.sha1(data).hexdigest()[:12]}.bin"
            (crash_dir / name).write_bytes(data)
            print(f"[{n}] DIFFERENT -> {crash_dir / name}\n  migrator: {str(ours)[:300]}\n"
                  f"  gguf-py: {str(theirs)[:300]}", file=sys.stderr, flush=True)
        else:
            counts["same"] += 1
            if len(pool) < 512 and data not in pool and rng.random() < 0.2:
                pool.append(data)
        if max_seconds and time.monotonic() - started > max_seconds:
            break
    path.unlink(missing_ok=True)
    scratch.rmdir()
    return {"reader": "gguf", "mode": "differential (gguf-py)", "cases": n,
            "seconds": round(time.monotonic() - started, 1), "differences": counts["different"],
            "timeouts": counts["timeout"], "slowest_migrator_case": {"seconds": round(slowest[0], 3),
                                                                     "sha1": slowest[1]},
            "outcomes": dict(counts.most_common()), "only_gguf_py_reads": dict(only_theirs.most_common())}


def _refusal_kind(message: str) -> str:
    """What migrator refused, in a few words (for the summary of what gguf-py reads and migrator does
    not): the message's wording after the file name, its numbers dropped."""
    text = message.rsplit(": ", 1)[-1] if ": " in message else message
    return re.sub(r"\d+", "N", re.sub(r"'[^']*'", "'...'", text))[:70]
