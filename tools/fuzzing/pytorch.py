"""The PyTorch family (zip, legacy, TAR containers and the pickles inside): seeds made by migrator and by
torch, the length fields of zip headers and pickle opcodes, the zip and TAR mutations that keep CRCs
and checksums right, and `--differential`: the pickle record scanner against the opcode loop."""

from __future__ import annotations

import hashlib
import io
import pickle
import random
import re
import struct
import sys
import tarfile
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import migrator
import migrator.core.errors

from .common import CRASH_DIR, _tiny_tensors, _torch, time_limit


def _torch_state() -> dict[str, Any]:
    torch = _torch()
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    return {
        "w": base,
        "wt": base.t(),  # strided view of a shared storage
        "row": base[1],  # storage offset
        "half": torch.tensor([1.5, -2.0], dtype=torch.float16),
        "ids": torch.tensor([7, 8], dtype=torch.int64),
        "nested": {"b": torch.ones(2, dtype=torch.bfloat16), "n": 3, "s": "text"},
        "lst": [torch.zeros(1, dtype=torch.uint8)],
        "exp": torch.ones(1).expand(4),  # stride 0
    }


def pytorch_zip_seeds() -> list[bytes]:
    ts = _tiny_tensors()
    out = [migrator.to_bytes([t for t in ts if t.name != "empty"], "pytorch")]
    torch = _torch()
    for proto in (2, 4):
        buf = io.BytesIO()
        torch.save(_torch_state(), buf, pickle_protocol=proto)
        out.append(buf.getvalue())
    return out


def pytorch_legacy_seeds() -> list[bytes]:
    torch = _torch()
    out = []
    for proto in (2, 1):
        buf = io.BytesIO()
        torch.save(_torch_state(), buf, pickle_protocol=proto, _use_new_zipfile_serialization=False)
        out.append(buf.getvalue())
    return out


class _TensorMark:
    def __init__(self, key: int) -> None:
        self.key = key


def _pickle_with_pids(obj: Any, pid: Callable[[Any], Any]) -> bytes:
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=2)
    p.persistent_id = pid  # type: ignore[method-assign]
    p.dump(obj)
    return buf.getvalue()


def pytorch_tar_seeds() -> list[bytes]:
    """The old tar layout as torch <= 0.3 wrote it (same construction as tests/formats/test_pytorch_reader.py)."""
    torch = _torch()
    root_a = np.arange(24, dtype=np.float32)
    root_b = np.array([7, -8, 9], dtype=np.int64)
    storages = [(1001, torch.FloatStorage, root_a), (1002, torch.LongStorage, root_b)]
    views = [(2001, 1001, 4, 12)]
    tensors = [(11, 1001, (4, 6), (6, 1), 0), (12, 1001, (6, 4), (1, 6), 0), (13, 2001, (3, 2), (2, 1), 1),
               (14, 1002, (3,), (1,), 0)]
    obj = {"a": _TensorMark(11), "a_t": _TensorMark(12), "view": _TensorMark(13),
           "sub": {"longs": _TensorMark(14)}, "epoch": 9}
    sys_info = pickle.dumps({"protocol_version": 1001, "little_endian": True,
                             "type_sizes": {"short": 2, "int": 4, "long": 8}}, protocol=2)
    main = _pickle_with_pids(obj, lambda o: str(o.key) if isinstance(o, _TensorMark) else None)
    tbl = pickle.dumps(len(tensors), protocol=2)
    for key, sid, size, stride, off in tensors:
        tbl += pickle.dumps((key, sid, torch.FloatTensor), protocol=2)
        tbl += struct.pack("<i", len(size)) + b"\0" * 4
        tbl += struct.pack(f"<{len(size)}q", *size) + struct.pack(f"<{len(size)}q", *stride)
        tbl += struct.pack("<q", off)
    st = pickle.dumps(len(storages), protocol=2)
    for key, cls, arr in storages:
        st += pickle.dumps((key, "cpu", cls), protocol=2) + struct.pack("<q", arr.size) + arr.tobytes()
    st += pickle.dumps(views, protocol=2)
    out = []
    for fmt in (tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
            for name, data in (("sys_info", sys_info), ("pickle", main), ("tensors", tbl), ("storages", st)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        out.append(buf.getvalue())
    return out


def pytorch_fields(data: bytes, reader: str) -> list[tuple[int, int, str]]:
    """(position, width, byte order) of the zip headers' or the pickles' length, offset and count fields."""
    if reader == "pytorch-zip":
        return _zip_fields(data)
    if reader == "pytorch-tar":
        return _pickle_fields(data, 512) if len(data) > 512 else []
    return _pickle_fields(data, 0)  # pytorch-legacy


def _zip_fields(data: bytes) -> list[tuple[int, int, str]]:
    out: list[tuple[int, int, str]] = []
    for m in re.finditer(rb"PK\x01\x02", data):  # central directory: crc, sizes, name/extra/comment, offset
        p = m.start()
        out += [(p + 16, 4, "<"), (p + 20, 4, "<"), (p + 24, 4, "<"), (p + 28, 2, "<"), (p + 30, 2, "<"),
                (p + 32, 2, "<"), (p + 42, 4, "<"), (p + 10, 2, "<"), (p + 8, 2, "<")]
    for m in re.finditer(rb"PK\x03\x04", data):  # local header: sizes, name/extra lengths
        p = m.start()
        out += [(p + 18, 4, "<"), (p + 22, 4, "<"), (p + 26, 2, "<"), (p + 28, 2, "<")]
    for m in re.finditer(rb"PK\x05\x06", data):  # end of central directory: counts, size, offset
        p = m.start()
        out += [(p + 8, 2, "<"), (p + 10, 2, "<"), (p + 12, 4, "<"), (p + 16, 4, "<"), (p + 20, 2, "<")]
    return out


def _pickle_fields(data: bytes, start: int) -> list[tuple[int, int, str]]:
    """Argument fields of pickle opcodes (lengths, ints, memo indices) in consecutive pickles."""
    import pickletools

    widths = {-2: 1, -3: 4, -4: 4, -5: 8}
    out: list[tuple[int, int, str]] = []
    pos = start
    for _ in range(8):  # a legacy file is several pickles in a row, then raw storages
        if pos >= len(data):
            break
        try:
            last = pos
            for op, _arg, p in pickletools.genops(io.BytesIO(data[pos:])):
                n = op.arg.n if op.arg is not None else 0
                if n in widths:
                    out.append((pos + p + 1, widths[n], "<"))
                elif n in (1, 2, 4, 8):
                    out.append((pos + p + 1, n, "<"))
                last = pos + p
            pos = last + 1
            out.append((pos, 8, "<"))  # a legacy storage's element count follows the key list
        except Exception:
            break
    return out


def _zip_replace_member(data: bytes, name: str, payload: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as zin, zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            body = payload if info.filename == name else zin.read(info)
            zout.writestr(zipfile.ZipInfo(info.filename), body)
    return buf.getvalue()


def _mutate_zip_member(data: bytes, inner: Sequence[tuple[Any, ...]], reader: str, seeds: Sequence[bytes]) -> bytes:
    """Mutate data.pkl (or another small member) and rebuild the zip with correct CRCs."""
    from .mutations import apply_ops

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            names = [n for n in z.namelist() if not re.search(r"/data/\d+$", n)]
            pkl = next((n for n in names if n.endswith("data.pkl")), names[0] if names else None)
            if pkl is None:
                return data
            body = z.read(pkl)
        return _zip_replace_member(data, pkl, apply_ops(body, inner, "pytorch-legacy"))
    except Exception:  # not a readable zip any more: leave it to the byte mutators
        return data


def _tar_headers(data: bytes) -> list[int]:
    out, pos = [], 0
    while pos + 512 <= len(data) and len(out) < 64:
        hdr = data[pos : pos + 512]
        if hdr == bytes(512):
            break
        out.append(pos)
        try:
            size = int(hdr[124:136].replace(b"\0", b" ").strip() or b"0", 8)
        except ValueError:
            break
        pos += 512 + (size + 511) // 512 * 512
    return out


def fix_tar_checksums(data: bytes) -> bytes:
    """Recompute every reachable TAR header checksum, so mutations get past it."""
    buf = bytearray(data)
    for pos in _tar_headers(data):
        hdr = buf[pos : pos + 512]
        hdr[148:156] = b" " * 8
        buf[pos + 148 : pos + 156] = b"%06o\0 " % sum(hdr)
    return bytes(buf)


def _tar_size(data: bytes, k: int, value: int) -> bytes:
    heads = _tar_headers(data)
    if not heads:
        return data
    pos = heads[k % len(heads)]
    if 0 <= value < 8**11:
        field = b"%011o\0" % value
    elif value >= 0:  # GNU base-256
        field = b"\x80" + (value % (1 << 88)).to_bytes(11, "big")
    else:
        field = (value % (1 << 96)).to_bytes(12, "big")
    return fix_tar_checksums(data[: pos + 124] + field[:12] + data[pos + 136 :])


# ----------------------------------------------------------------------------------------------
# --differential: the pickle record scanner against the opcode loop


PICKLE_TIGHT_LIMITS = (  # limits a record can hit half-way, so the scanner's "room" checks are exercised too
    None, {"max_objects": 500}, {"max_memo": 20}, {"max_marks": 2}, {"max_marks": 3}, {"max_stack": 7},
    {"max_stack": 9}, {"max_dims": 1},
)


PICKLE_OPS = b"()tQRqrhjKMJ\x8a\x85\x86\x87\x88\x89NXcu.\x94\x8c0"  # what the record scanner parses


def pickle_seeds() -> list[bytes]:
    """The main pickles (data.pkl) of the zip seeds and of a 300-tensor torch.save (LONG_BINPUT memo)."""
    out = []
    torch = _torch()
    big = {f"m.{i}": torch.full((i % 3 + 1,), float(i)) for i in range(300)}
    buf = io.BytesIO()
    torch.save(big, buf)
    for raw in [*pytorch_zip_seeds(), buf.getvalue()]:
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            out.append(z.read(next(n for n in z.namelist() if n.endswith("data.pkl"))))
    return out


def mutate_pickle(data: bytes, rng: random.Random) -> bytes:
    """A few edits biased towards what the record scanner parses: opcodes, lengths, memo indices."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(buf))
        kind = rng.random()
        if kind < 0.35:
            buf[i] = rng.choice(PICKLE_OPS)
        elif kind < 0.6:
            buf[i] = rng.randrange(256)
        elif kind < 0.75:
            del buf[i : i + rng.randint(1, 8)]
        elif kind < 0.9:
            j = rng.randrange(len(buf))
            buf[i:i] = buf[j : j + rng.randint(1, 16)]
        else:
            buf[i : i + 4] = struct.pack("<I", rng.choice([0, 1, 255, 256, 65535, 1 << 31, (1 << 32) - 1]))
    return bytes(buf)


def _pickle_storage(pid: Any) -> Any:
    """A persistent_load like the zip reader's: a StorageRef for storage ids, a typed error otherwise."""
    from migrator.formats import safepickle as sp

    if not isinstance(pid, tuple) or len(pid) not in (5, 6) or pid[0] != "storage":
        raise migrator.core.errors.FormatError(f"bad persistent id {sp.describe(pid)}")
    stype, key = pid[1], pid[2]
    return sp.StorageRef(key if type(key) is str else "?", getattr(stype, "name", "?"),
                         getattr(stype, "dtype", None), pid[4] if type(pid[4]) is int else None, "cpu")


def pickle_graph(v: Any, seen: dict[int, int] | None = None) -> Any:
    """A comparable form of an unpickled value (shared references become back-references)."""
    from migrator.formats import safepickle as sp

    seen = {} if seen is None else seen
    todo: list[Any] = []  # iterative: mutated inputs nest deeply
    out: list[Any] = []

    def visit(x: Any) -> Any:
        if isinstance(x, (sp.TensorRef, sp.StorageRef, dict, list, tuple)):
            if id(x) in seen:
                return ("ref", seen[id(x)])
            seen[id(x)] = len(seen)
        if isinstance(x, sp.TensorRef):
            return ("T", visit(x.storage), x.offset, x.size, x.stride, x.dtype, x.requires_grad)
        if isinstance(x, sp.StorageRef):
            return ("S", x.key, x.storage_type, x.dtype, x.numel, x.location, x.view)
        if isinstance(x, dict):
            attrs = x.attrs if isinstance(x, sp.ODict) else {}
            node: list[Any] = [type(x).__name__, len(x), sorted(attrs)]
            todo.extend((node, k, val) for k, val in x.items())
            return node
        if isinstance(x, (list, tuple)):
            node = [type(x).__name__, len(x)]
            todo.extend((node, None, val) for val in x)
            return node
        if isinstance(x, (sp.Opaque, sp.Placeholder, sp.UnsupportedTensor, sp.NumpyArray, sp.NumpyDtype)):
            return (type(x).__name__, repr(x), getattr(x, "module", None))
        if isinstance(x, float) and x != x:
            return ("nan",)
        return (type(x).__name__, x if not isinstance(x, int) else sp.describe(x))

    out.append(visit(v))
    while todo:
        node, k, val = todo.pop()
        node.append((visit(k) if k is not None else None, visit(val)))
    return out


def pickle_outcome(data: bytes, fast: bool, limits: dict[str, int] | None) -> Any:
    """What one run of the interpreter gives: the value, counts and position, or the error."""
    from migrator.formats import safepickle as sp

    u = sp.Unpickler(data, persistent_load=_pickle_storage, limits=sp.Limits(**limits) if limits else sp.DEFAULT_LIMITS,
                     fast=fast)
    try:
        result = u.load()
    except migrator.core.errors.MigratorError as e:
        return ("error", type(e).__name__, str(e))
    return ("ok", pickle_graph(result), u.objects, u.spent, u.placeholders, u.pos, u.protocol, sorted(u.opaque))


def differential_pickle(cases: int, seed: int, timeout: float) -> dict[str, Any]:
    """`cases` mutated pickles, each run with the record scanner and without: the same value, counts and
    position, or the same error (type and message), else a difference (saved under CRASH_DIR)."""
    rng = random.Random(seed)
    seeds = pickle_seeds()
    outcomes: Counter[str] = Counter()
    differences: list[str] = []
    started = time.monotonic()
    for n in range(cases):
        data = mutate_pickle(rng.choice(seeds), rng) if n else seeds[0]
        limits = PICKLE_TIGHT_LIMITS[n % len(PICKLE_TIGHT_LIMITS)]
        try:
            with time_limit(timeout):
                fast, general = pickle_outcome(data, True, limits), pickle_outcome(data, False, limits)
        except Exception as e:  # any other exception is a crash of one of the paths
            fast, general = ("crash", type(e).__name__, str(e)[:200]), None
        if fast == general:
            outcomes["same " + fast[0]] += 1
            continue
        outcomes["DIFFERENT"] += 1
        name = f"pickle-differential-{hashlib.sha1(data).hexdigest()[:12]}.bin"
        CRASH_DIR.mkdir(parents=True, exist_ok=True)
        (CRASH_DIR / name).write_bytes(data)
        differences.append(name)
        print(f"[{n}] DIFFERENT (limits {limits}): scanner {str(fast)[:200]} / loop {str(general)[:200]} -> {name}",
              file=sys.stderr, flush=True)
    return {"differential": "pickle", "seed": seed, "cases": cases, "seconds": round(time.monotonic() - started, 1),
            "outcomes": dict(outcomes.most_common()), "differences": len(differences)}
