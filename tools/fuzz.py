"""Long-running mutation fuzzer for migrator's readers and its recipe loader.

    .venv/bin/python tools/fuzz.py --reader burnpack --cases 100000
    .venv/bin/python tools/fuzz.py --reader safetensors --differential --cases 100000
    .venv/bin/python tools/fuzz.py --reader pytorch-zip --differential --cases 100000
    .venv/bin/python tools/fuzz.py --reader gguf --differential --cases 100000

Readers: burnpack, safetensors, pytorch-zip, pytorch-legacy, pytorch-tar, gguf, recipe. Seeds are made
on the spot (migrator's own writers; torch for the legacy, TAR and torch-written zip seeds) and
mutated by byte flips, truncations, insertions, deletions, splices and overwrites of length fields
with huge or negative values; the zip and TAR mutators can also repair CRCs and header checksums
so mutations reach the pickles behind them.

Every case must end in a `MigratorError` subclass or a correct result (every tensor's bytes have
the declared length, numpy views have the declared shape, and a re-encoded copy reads back equal).
Anything else is a crash, saved under `tools/fuzz-crashes/` (gitignored):

* another exception type (ValueError, IndexError, RecursionError, MemoryError, ...);
* a hang: SIGALRM fails a case after `--timeout` seconds; a hang inside C code, which a Python
  signal handler cannot interrupt, is ended by faulthandler's watchdog, and the input it was
  working on is kept in `.inflight-*` and reported by the next run;
* an allocation larger than the input justifies: tracemalloc's peak per case must stay below
  `--alloc-factor` x input size + 64 MiB (+ 3x the largest tensor touched, which a reader only
  declares within its limits). RLIMIT_AS is set as a backstop, so a runaway allocation becomes a
  MemoryError crash instead of taking the machine down.

`--differential` (safetensors, burnpack) reads every mutated input with the reader's header fast
path and with the reference parser alone, and counts any difference in tensors (bytes included),
metadata, scalars, extra() or error (type, message, tensor) as a failure. `--reader gguf
--differential` reads every mutated input migrator accepts with gguf-py's reader as well: both must
agree on tensor names, ggml types, shapes, stored bytes and key/values; every input migrator refuses
is given to gguf-py too, and counted as "both refuse" or "only gguf-py reads it" (not failures:
migrator refuses overlapping or misaligned data, truncated tensor data and claims past its limits,
which gguf-py reads or maps lazily). gguf-py gets --oracle-timeout seconds (default 1) on an input
migrator refuses: it loops over whatever count a header claims, and a refusal it would reach later
decides nothing about migrator.

This module is also imported by tests/formats/test_fuzz.py, which runs the same seeds, mutations and
checks under Hypothesis for a bounded number of cases.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import gc
import hashlib
import io
import json
import os
import pickle
import random
import re
import resource
import signal
import struct
import sys
import tarfile
import tempfile
import time
import traceback
import tracemalloc
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

import migrator  # noqa: E402
from migrator.core import dtypes  # noqa: E402
from migrator.core.errors import MigratorError  # noqa: E402
from migrator.core.tensor import from_numpy  # noqa: E402

READERS = ("burnpack", "safetensors", "pytorch-zip", "pytorch-legacy", "pytorch-tar", "gguf", "recipe")
FORMAT_OF = {"burnpack": "burnpack", "safetensors": "safetensors", "pytorch-zip": "pytorch",
             "pytorch-legacy": "pytorch", "pytorch-tar": "pytorch", "gguf": "gguf"}
CRASH_DIR = REPO / "tools" / "fuzz-crashes"
ALLOC_SLACK = 64 << 20
MATERIALISE_LIMIT = 256 << 20  # larger declared tensors are bound-checked, not materialised


class CaseTimeout(BaseException):
    """A case ran past its time limit."""


class AllocationExceeded(Exception):
    """A case allocated more than its input justifies."""


class WrongResult(Exception):
    """A case 'succeeded' with a result that contradicts itself."""


# ----------------------------------------------------------------------------------------------
# seeds


def _tiny_tensors() -> list[Any]:
    rng = np.random.default_rng(7)
    return [
        from_numpy("encoder.layer.0.weight", rng.standard_normal((3, 4)).astype(np.float32), param_id=5),
        from_numpy("encoder.layer.0.bias", np.arange(3, dtype=np.float16)),
        from_numpy("encoder.ids", np.array([1, -2, 3], dtype=np.int64)),
        from_numpy("mask", np.array([True, False])),
        from_numpy("scalar", np.array(2.5, dtype=np.float64)),
        from_numpy("empty", np.zeros((0, 3), dtype=np.uint8)),
    ]


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


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is in the dev extra
        raise SystemExit(f"torch is needed to make the legacy/TAR seeds: {e}") from None
    return torch


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


RECIPE_FULL = r"""# a recipe using every key
version: 1
description: every key
source:
  path: weights/model.pt
  format: auto
  top_level_key: state_dict
  contiguous_indices: true
  skip_enum_variants: false
remap:
  - from: '^model\.'
    to: ''
  - from: '^transformer\.h\.(\d+)\.'
    to: 'transformer.layer$1.'
  - from: '^(?P<block>\w+)\.w$'
    to: '\g<block>.weight'
    syntax: python
filter:
  include: [{regex: '^encoder\.'}, {path: decoder.scale}, {predicate: 'pkg.module:func'}]
  exclude: [{regex: '\.num_batches_tracked$'}]
modules:
  Linear: ['\.(query|key|value)$']
  BatchNorm: ['\.bn\d+$']
adapters: [pytorch_to_burn, {half_precision: {with: [BatchNorm], without: [Embedding]}}, {float_cast: {to: BF16}}]
dtype: {cast: F16}
target:
  path: out/model.bpk
  format: auto
  template: init.bpk
  template_format: burnpack
  overwrite: false
  metadata: {description: my model}
  clear_metadata: false
  scalars: {epoch: {int: 42}, lr: {float: 0.001}, n: {uint: 7}, ok: {bool: true}}
allow_partial: false
validate: true
"""

RECIPE_ANCHORS = """version: 1
source: &src {path: a.safetensors, format: safetensors}
remap: [{from: 'a', to: 'b'}, {from: '(?<x>y)', to: '${x}z'}]
dtype: template
target: {<<: *src, path: b.bpk, scalars: none, template: t.bpk}
"""


def recipe_seeds() -> list[bytes]:
    out = [RECIPE_FULL.encode(), RECIPE_ANCHORS.encode(), b"version: 1\nsource: {path: a.pt}\ntarget: {path: b.bpk}\n"]
    for p in sorted((REPO / "recipes").glob("*.yaml")):
        out.append(p.read_bytes())
    return out


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


SEEDS: dict[str, Callable[[], list[bytes]]] = {
    "burnpack": burnpack_seeds, "safetensors": safetensors_seeds, "pytorch-zip": pytorch_zip_seeds,
    "pytorch-legacy": pytorch_legacy_seeds, "pytorch-tar": pytorch_tar_seeds, "gguf": gguf_seeds,
    "recipe": recipe_seeds,
}


def build_seeds(reader: str) -> list[bytes]:
    """Valid inputs for `reader`; each must pass `exercise` unchanged (checked by the tests)."""
    return SEEDS[reader]()


# ----------------------------------------------------------------------------------------------
# mutations: each op is a plain tuple so Hypothesis and the random loop share one interpreter

INTERESTING = (0, 1, 2, 7, 8, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000,
               0xFFFFFFFF, 1 << 32, 1 << 40, 1 << 53, (1 << 62), (1 << 63) - 1, 1 << 63, (1 << 64) - 1, -1, -2,
               -256, -(1 << 31), -(1 << 63))
JSON_NUMBERS = ("-1", "0", "1", "18446744073709551615", "18446744073709551616", "9223372036854775808",
                "1e400", "-0", "1.5", "99999999999999999999999999999999999999", "4294967296", "1" + "0" * 5000)
YAML_TOKENS = ("", "~", "null", "true", "false", "0", "-1", "1.5", "1e999", ".nan", ".inf", "18446744073709551616",
               "-9223372036854775809", "[]", "{}", "[a, b]", "{a: 1}", "'('", "'[z-a]'", "'\\p{L}'", "'(?<n>x)'",
               "'a(?i)b'", "'$1'", "'\\g<9>'", "'\\1'", "&x 1", "*x", "*nope", "!!python/object/apply:os.system ['x']",
               "!!binary aGk=", "!!set {a}", "!!timestamp 2001-01-01", "2001-01-01", "|\n  block", ">-", "'\\x00'",
               "\"\\ud800\"", "{cast: F16}", "{cast: I8}", "{cast: F8_E4M3}", "{float_cast: {to: U8}}",
               "[pytorch_to_burn, {half_precision: {without: [Foo]}}]", "{half_precision: {with: [1]}}",
               "/dev/null", "..", "x.bpk", "a.pt", "'  '", "x" * 300, "[[[[[[[[1]]]]]]]]", "{? [a]: b}",
               "{1: 2}", "{null: 1}", "{true: x}", "[*x, *x]", "<<: {a: 1}", "{regex: '^a'}", "{path: a, regex: b}",
               "{predicate: 'os:system'}", "keep", "template", "none", "auto", "burnpack", "pytorch", "rust",
               "python", "1", "2", "'1'", "0x1F", "0o17", "+1", "1_000", "1:20", "=", "? a", "- x", "\t", "\x00",
               "\ufeff", "#", "%YAML 1.1", "---", "...")


def _op_at(data: bytes, pos: int) -> int:
    return pos % (len(data) + 1)


def apply_op(data: bytes, op: tuple[Any, ...], reader: str, seeds: Sequence[bytes] = ()) -> bytes:
    """Apply one mutation; ops whose positions exceed the input wrap around (never fail)."""
    kind = op[0]
    if kind == "flip":
        if not data:
            return data
        p = op[1] % len(data)
        return data[:p] + bytes([data[p] ^ (1 << (op[2] % 8))]) + data[p + 1 :]
    if kind == "set":
        if not data:
            return data
        p = op[1] % len(data)
        return data[:p] + bytes([op[2] % 256]) + data[p + 1 :]
    if kind == "truncate":
        return data[: _op_at(data, op[1])]
    if kind == "insert":
        p = _op_at(data, op[1])
        return data[:p] + op[2] + data[p:]
    if kind == "delete":
        p = _op_at(data, op[1])
        return data[:p] + data[p + op[2] :]
    if kind == "dup":  # copy a chunk over another place (repeats structure: duplicate names, entries)
        if not data:
            return data
        p, n, q = op[1] % len(data), op[2], _op_at(data, op[3])
        return data[:q] + data[p : p + n] + data[q:]
    if kind == "int":  # overwrite `width` bytes at any position with an interesting integer
        return _put_int(data, _op_at(data, op[1]), op[2], op[3], op[4])
    if kind == "field":  # overwrite a length/offset/count field found by format-aware scanning
        fields = length_fields(data, reader)
        if not fields:
            return data
        pos, width, order = fields[op[1] % len(fields)]
        return _put_int(data, pos, width, op[2], order)
    if kind == "splice":
        if not seeds:
            return data
        other = seeds[op[1] % len(seeds)]
        return data[: _op_at(data, op[2])] + other[_op_at(other, op[3]) :]
    if kind == "json-num":
        return _replace_nth(data, rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?", op[1], op[2].encode())
    if kind == "zip-pkl":
        return _mutate_zip_member(data, op[1], reader, seeds)
    if kind == "tar-fix":
        return fix_tar_checksums(data)
    if kind == "tar-size":
        return _tar_size(data, op[1], op[2])
    if kind == "yaml-line":
        return _yaml_line(data, op[1], op[2], op[3])
    raise ValueError(f"unknown mutation {kind}")


def apply_ops(data: bytes, ops: Sequence[tuple[Any, ...]], reader: str, seeds: Sequence[bytes] = ()) -> bytes:
    for op in ops:
        data = apply_op(data, op, reader, seeds)
    return data


def _put_int(data: bytes, pos: int, width: int, value: int, order: str) -> bytes:
    raw = (value % (1 << (8 * width))).to_bytes(width, "little" if order == "<" else "big")
    return data[:pos] + raw + data[pos + width :]


def _replace_nth(data: bytes, pattern: bytes, n: int, repl: bytes) -> bytes:
    matches = list(re.finditer(pattern, data[:4096]))
    if not matches:
        return data
    m = matches[n % len(matches)]
    return data[: m.start()] + repl + data[m.end() :]


def length_fields(data: bytes, reader: str) -> list[tuple[int, int, str]]:
    """(position, width, byte order) of fields that hold lengths, offsets or counts."""
    if reader == "burnpack":
        out = [(6, 4, "<"), (4, 2, "<")]
        end = min(len(data), 10 + (int.from_bytes(data[6:10], "little") if len(data) >= 10 else 0), 8192)
        for p in range(10, end):
            info = data[p] & 31
            if 24 <= info <= 27 and data[p] >> 5 != 7:
                out.append((p + 1, 1 << (info - 24), ">"))
        return out
    if reader == "safetensors":
        return [(0, 8, "<"), (0, 4, "<"), (4, 4, "<")]
    if reader == "pytorch-zip":
        return _zip_fields(data)
    if reader == "pytorch-tar":
        return _pickle_fields(data, 512) if len(data) > 512 else []
    if reader == "pytorch-legacy":
        return _pickle_fields(data, 0)
    if reader == "gguf":  # the counts, then every u64 that looks like a string length or a small count
        out = [(8, 8, "<"), (16, 8, "<")]
        for p in range(24, min(len(data) - 8, 4096), 4):
            v = int.from_bytes(data[p:p + 8], "little")
            if 0 < v < 4096:
                out.append((p, 8, "<"))
        return out
    return []


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


def _yaml_line(data: bytes, how: int, line: int, token: int) -> bytes:
    """Line-level recipe edits: replace a value or a key, duplicate, drop, re-indent, insert."""
    lines = data.split(b"\n")
    i = line % len(lines)
    tok = YAML_TOKENS[token % len(YAML_TOKENS)].encode("utf-8", "surrogatepass")
    text = lines[i]
    how %= 7
    if how == 0 and b":" in text:  # value
        key, _, _ = text.partition(b":")
        lines[i] = key + b": " + tok
    elif how == 1 and b":" in text:  # key
        indent = len(text) - len(text.lstrip(b" -"))
        _, _, value = text.partition(b":")
        lines[i] = text[:indent] + tok + b":" + value
    elif how == 2:
        lines.insert(i, text)
    elif how == 3:
        del lines[i]
    elif how == 4:
        lines[i] = b" " * (token % 5) + text.lstrip(b" ")
    elif how == 5:
        lines.insert(i, tok)
    else:  # a list item's value
        lines[i] = re.sub(rb"\[[^\]]*\]", lambda m: b"[" + tok + b"]", text, count=1)
    return b"\n".join(lines)


def random_ops(rng: random.Random, data: bytes, reader: str) -> list[tuple[Any, ...]]:
    """1-4 random mutations, weighted towards the ones that reach deep."""
    ops: list[tuple[Any, ...]] = []
    n = len(data) or 1
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
        r = rng.random()
        value = rng.choice((*INTERESTING, n, n - 1, n + 1, rng.getrandbits(64)))
        if reader == "recipe" and r < 0.45:
            ops.append(("yaml-line", rng.randrange(7), rng.randrange(1 << 16), rng.randrange(1 << 16)))
        elif reader == "pytorch-zip" and r < 0.4:
            ops.append(("zip-pkl", [_byte_op(rng, 512) for _ in range(rng.choice((1, 1, 2)))]))
        elif reader == "pytorch-tar" and r < 0.15:
            ops.append(("tar-size", rng.randrange(8), value))
        elif reader == "safetensors" and r < 0.25:
            ops.append(("json-num", rng.randrange(256), rng.choice(JSON_NUMBERS)))
        elif r < 0.6:
            ops.append(_byte_op(rng, n))
        elif r < 0.8:
            ops.append(("field", rng.randrange(1 << 16), value))
        elif r < 0.9:
            ops.append(("int", rng.randrange(n), rng.choice((1, 2, 4, 8)), value, rng.choice("<>")))
        else:
            ops.append(("splice", rng.randrange(64), rng.randrange(n), rng.randrange(1 << 16)))
    if reader == "pytorch-tar" and rng.random() < 0.6:
        ops.append(("tar-fix",))
    return ops


def _byte_op(rng: random.Random, n: int) -> tuple[Any, ...]:
    k = rng.randrange(6)
    pos = rng.randrange(max(n, 1))
    if k == 0:
        return ("flip", pos, rng.randrange(8))
    if k == 1:
        return ("set", pos, rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256))))
    if k == 2:
        return ("truncate", pos)
    if k == 3:
        return ("insert", pos, rng.randbytes(rng.choice((1, 1, 2, 4, 8, 64))))
    if k == 4:
        return ("delete", pos, rng.choice((1, 2, 4, 8, 64)))
    return ("dup", pos, rng.choice((1, 4, 16, 64, 256)), rng.randrange(max(n, 1)))


# ----------------------------------------------------------------------------------------------
# running one case


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise CaseTimeout in the main thread after `seconds` (SIGALRM; main thread only)."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"case ran longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclass
class CaseResult:
    outcome: str  # "ok" or the exception's class name
    error: BaseException | None
    peak: int  # tracemalloc peak above the case's start, bytes (0 when not measured)
    budget: int


def alloc_budget(size: int, factor: int, largest_tensor: int) -> int:
    return factor * size + ALLOC_SLACK + 3 * largest_tensor


def exercise(reader: str, data: bytes, *, path: Path | None = None, auto: bool = False,
             largest: list[int] | None = None) -> None:
    """Open `data` with the reader and touch everything; raises whatever the code under test raises.

    `path`: write the input there and open the file (FileSource, mmaps) instead of the buffer.
    `largest` (out): receives the largest tensor byte count touched (for the allocation budget).
    """
    if reader == "recipe":
        _exercise_recipe(data, path)
        return
    fmt = "auto" if auto else FORMAT_OF[reader]
    src: Any = data
    if path is not None:
        path.write_bytes(data)
        src = path
    with migrator.open_file(src, format=fmt) as r:
        _check_reader(r, len(data), largest)
        _round_trip(r)


def _check_reader(r: Any, size: int, largest: list[int] | None) -> None:
    from migrator.analysis.inspect import summarize
    from migrator.core.limits import DEFAULT_LIMITS

    json.dumps(summarize(r), default=str)  # what `migrate inspect --json` prints
    assert isinstance(r.metadata, dict) and isinstance(r.scalars, dict)
    names = r.names()
    if len(set(names)) != len(names):
        raise WrongResult(f"duplicate tensor names {names}")
    for t in r.tensors:
        want = t.dtype.nbytes(t.shape)
        if want is not None and want != t.nbytes:
            raise WrongResult(f"{t.name}: declares {t.nbytes} bytes, shape/dtype need {want}")
        if t.nbytes > max(size, DEFAULT_LIMITS.max_expanded_bytes):
            raise WrongResult(f"{t.name}: declares {t.nbytes} bytes from a {size}-byte input")
        if t.nbytes > MATERIALISE_LIMIT:
            continue
        if largest is not None:
            largest[0] = max(largest[0], t.nbytes)
        buf = t.data()
        if len(buf) != t.nbytes:
            raise WrongResult(f"{t.name}: {len(buf)} bytes, declared {t.nbytes}")
        if t.dtype.numpy_name is not None:
            arr = t.numpy()
            if arr.shape != t.shape:
                raise WrongResult(f"{t.name}: numpy shape {arr.shape} != {t.shape}")
            del arr
        del buf
        _transforms(t)


def _transforms(t: Any) -> None:
    """What a recipe does to a tensor: a float cast (dtype: {cast: F16}) and a Linear transpose."""
    from migrator.core import casts

    made = []
    if t.dtype.name in casts.CASTABLE:
        made += [casts.cast(t, to) for to in (dtypes.F16, dtypes.BF16, dtypes.F64)]
    if len(t.shape) == 2 and t.dtype.itemsize is not None:
        made.append(casts.transpose2d(t))
    for d in made:
        whole = bytes(d.data())
        if len(whole) != d.nbytes:
            raise WrongResult(f"{t.name}: {d.dtype.display}{list(d.shape)} has {len(whole)} bytes, not {d.nbytes}")
        if d.chunks is not None and b"".join(bytes(c) for c in d.chunks()) != whole:
            raise WrongResult(f"{t.name}: streamed chunks differ from the whole for {d.dtype.display}")


def _round_trip(r: Any) -> None:
    """A file that opened must re-encode and read back equal (or be refused with a typed error).

    Written again in its own format (metadata and scalars kept where the format holds them) and,
    for SafeTensors and PyTorch sources, also as burnpack, which exercises the writers on whatever
    names and values a hostile file can smuggle in.
    """
    fmt = r.format
    targets = [fmt] if fmt == "burnpack" else [fmt, "burnpack"]
    for out in targets:
        same = out == fmt
        meta = r.metadata if same and out != "pytorch" else None
        scalars = r.scalars if out == "burnpack" else None
        try:
            blob = migrator.to_bytes(r.tensors, out, metadata=meta, scalars=scalars)
        except MigratorError:
            continue  # e.g. a dtype or name the writer refuses: fine, it is typed
        with migrator.open_file(blob, format=out) as back:
            a = {t.name: t for t in r.tensors}
            b = {t.name: t for t in back.tensors}
            if set(a) != set(b):
                raise WrongResult(f"re-encoded ({out}) names differ: {sorted(set(a) ^ set(b))[:5]}")
            for name, t in a.items():
                u = b[name]
                if (t.dtype.name, t.shape) != (u.dtype.name, u.shape) or bytes(t.data()) != bytes(u.data()):
                    raise WrongResult(f"{name}: re-encoded ({out}) tensor differs")
            got, want = back.metadata, meta
            if out == "gguf" and meta is not None:  # the writer computes these two from the tensors it writes
                got = {k: v for k, v in got.items() if k not in _GGUF_COMPUTED}
                want = {k: v for k, v in meta.items() if k not in _GGUF_COMPUTED}
            if want is not None and got != want:
                raise WrongResult(f"re-encoded ({out}) metadata differs")
            if scalars is not None and _scalar_keys(back.scalars) != _scalar_keys(scalars):
                raise WrongResult(f"re-encoded ({out}) scalars differ")


_GGUF_COMPUTED = ("general.file_type", "general.quantization_version")


def _scalar_keys(scalars: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """Scalars compared bit for bit (a NaN equals itself)."""
    return {k: (s.kind, struct.pack("<d", s.value) if isinstance(s.value, float) else s.value)
            for k, s in scalars.items()}


def _exercise_recipe(data: bytes, path: Path | None) -> None:
    from migrator.recipe.loader import load_recipe, parse_recipe

    if path is not None:
        path.write_bytes(data)
        loaded = load_recipe(path)
    else:
        loaded = parse_recipe(data.decode("utf-8", "replace"), base_dir=Path(tempfile.gettempdir()))
    r = loaded.recipe
    r.dump()
    _ = (loaded.source_path, loaded.target_path, loaded.template_path, loaded.warnings)


def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def _reset_peak_rss() -> bool:
    """Linux: writing 5 to clear_refs resets VmHWM (peak RSS) to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def run_case(reader: str, data: bytes, *, timeout: float = 5.0, alloc_factor: int = 16, measure: str = "tracemalloc",
             path: Path | None = None, auto: bool = False) -> CaseResult:
    """One case under a time limit and an allocation check; reports what happened, never raises.

    measure: "tracemalloc" (peak of Python and numpy allocations during the case; precise, ~2x
    slower), "rss" (peak resident set size during the case, reset through /proc/self/clear_refs;
    cheap, counts every page touched) or "none".
    """
    largest = [0]
    err: BaseException | None = None
    started = False
    base = 0
    if measure == "tracemalloc":
        if not tracemalloc.is_tracing():
            tracemalloc.start()
            started = True
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
    elif measure == "rss":
        # Garbage of earlier cases freed during this one would lower RSS and hide an allocation
        # (the peak only counts what rises above the starting RSS): collect it first.
        gc.collect()
        if not _reset_peak_rss():
            measure = "none"
        else:
            base = _vm("VmRSS")
    try:
        with time_limit(timeout):
            exercise(reader, data, path=path, auto=auto, largest=largest)
    except (Exception, CaseTimeout) as e:  # KeyboardInterrupt/SystemExit still stop the run
        err = e
    peak = 0
    if measure == "tracemalloc":
        peak = tracemalloc.get_traced_memory()[1] - base
        if started:
            tracemalloc.stop()
    elif measure == "rss":
        peak = _vm("VmHWM") - base
    budget = alloc_budget(len(data), alloc_factor, largest[0])
    if peak > budget and (err is None or isinstance(err, MigratorError)):
        err = AllocationExceeded(f"peak {peak} bytes > budget {budget} for a {len(data)}-byte input")
    if err is None:
        return CaseResult("ok", None, peak, budget)
    return CaseResult(type(err).__name__, err, peak, budget)


def is_failure(res: CaseResult) -> bool:
    """Anything but success or a typed migrator error."""
    return res.error is not None and not isinstance(res.error, MigratorError)


# ----------------------------------------------------------------------------------------------
# the loop


def _signature(err: BaseException) -> str:
    tb = traceback.extract_tb(err.__traceback__)
    where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb) if "migrator" in f.filename),
                 f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else "?")
    return f"{type(err).__name__}@{where}"


def _set_memory_backstop(extra: int) -> None:
    """RLIMIT_AS = what the process maps now + `extra`: a runaway allocation fails as MemoryError."""
    vm = _vm("VmSize")
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = vm + extra
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    resource.setrlimit(resource.RLIMIT_AS, (want, hard))


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


# ----------------------------------------------------------------------------------------------
# differential: the pickle record scanner against the opcode loop


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


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reader", choices=READERS, required=True)
    p.add_argument("--cases", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=None, help="random seed (default: time)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per case")
    p.add_argument("--alloc-factor", type=int, default=16, help="allowed peak = factor x input + 64 MiB")
    p.add_argument("--measure", choices=("rss", "tracemalloc", "none"), default="rss",
                   help="allocation check per case: peak RSS (default, cheap) or tracemalloc (precise, slower)")
    p.add_argument("--memory-backstop", type=int, default=4 << 30, help="RLIMIT_AS headroom in bytes")
    p.add_argument("--max-seconds", type=float, default=None, help="stop after this long")
    p.add_argument("--oracle-timeout", type=float, default=1.0,
                   help="--reader gguf --differential: seconds gguf-py gets on an input migrator refuses")
    p.add_argument("--report", type=Path, default=None, help="write the summary as JSON here too")
    p.add_argument("--crash-dir", type=Path, default=CRASH_DIR)
    p.add_argument("--differential", action="store_true",
                   help="compare fast and reference paths on every mutated input (safetensors, burnpack: the "
                        "header fast path against the reference parser; pytorch-*: the pickle record scanner "
                        "against the opcode loop; gguf: migrator's reader against gguf-py's)")
    args = p.parse_args(argv)

    seed = args.seed if args.seed is not None else int(time.time())
    if args.differential and args.reader.startswith("pytorch"):
        summary = differential_pickle(args.cases, seed, args.timeout)
        print(json.dumps(summary))
        return 1 if summary["differences"] else 0
    rng = random.Random(seed)
    crash_dir: Path = args.crash_dir
    crash_dir.mkdir(parents=True, exist_ok=True)
    if args.differential and args.reader == "gguf":
        # gguf-py is not bounded: it allocates what a hostile header claims (the backstop turns that into a
        # MemoryError, one more way for it to refuse, instead of the machine's OOM killer)
        _set_memory_backstop(args.memory_backstop)
        summary = {"seed": seed, **differential_gguf(args.cases, rng, args.timeout, crash_dir, args.max_seconds,
                                                     args.oracle_timeout)}
        print(json.dumps(summary, indent=2))
        if args.report:
            args.report.write_text(json.dumps(summary, indent=2) + "\n")
        return 1 if summary["differences"] or summary["timeouts"] else 0
    if args.differential:
        if args.reader not in DIFFERENTIAL_READERS:
            p.error(f"--differential compares header fast paths: --reader {' or '.join(DIFFERENTIAL_READERS)}")
        _set_memory_backstop(args.memory_backstop)
        summary = {"seed": seed, **run_differential(args.reader, args.cases, rng, args.timeout, crash_dir,
                                                    args.max_seconds)}
        print(json.dumps(summary, indent=2))
        print(f"differential {args.reader}: {summary['cases']} cases, {summary['differences']} differences, "
              f"{summary['timeouts']} timeouts, fast path taken in {summary['outcomes'].get('fast path', 0)}")
        if args.report:
            args.report.write_text(json.dumps(summary, indent=2) + "\n")
        return 1 if summary["differences"] or summary["timeouts"] else 0
    inflight = crash_dir / f".inflight-{args.reader}-{os.getpid()}.bin"
    for old in crash_dir.glob(f".inflight-{args.reader}-*.bin"):  # a previous run died inside a case
        target = crash_dir / f"{args.reader}-died-{hashlib.sha1(old.read_bytes()).hexdigest()[:12]}.bin"
        old.replace(target)
        print(f"previous run died on an input (hang in C code or hard crash): saved {target}", file=sys.stderr)

    seeds = build_seeds(args.reader)
    for s in seeds:
        res = run_case(args.reader, s, timeout=30, measure="none")
        if res.error is not None:
            raise SystemExit(f"seed does not pass: {res.outcome}: {res.error}")
    _set_memory_backstop(args.memory_backstop)
    if args.measure == "tracemalloc":
        tracemalloc.start()
    scratch = Path(tempfile.mkdtemp(prefix="migrator-fuzz-"))
    pool = list(seeds)  # grows with mutated inputs that still open: deeper corpus
    outcomes: Counter[str] = Counter()
    signatures: dict[str, str] = {}
    started = time.monotonic()
    n = 0
    try:
        for n in range(1, args.cases + 1):
            base = rng.choice(pool)
            data = apply_ops(base, random_ops(rng, base, args.reader), args.reader, pool)
            path = scratch / ("in.yaml" if args.reader == "recipe" else "in.bin") if n % 16 == 0 else None
            inflight.write_bytes(data)
            faulthandler.dump_traceback_later(args.timeout * 6 + 30, exit=True)
            res = run_case(args.reader, data, timeout=args.timeout, alloc_factor=args.alloc_factor,
                           measure=args.measure, path=path, auto=n % 8 == 0)
            faulthandler.cancel_dump_traceback_later()
            if res.error is None and len(pool) < 512 and data not in pool and rng.random() < 0.2:
                pool.append(data)
            key = res.outcome if not is_failure(res) else f"FAIL {res.outcome}"
            outcomes[key] += 1
            if is_failure(res):
                assert res.error is not None
                sig = _signature(res.error)
                if sig not in signatures:
                    name = f"{args.reader}-{res.outcome}-{hashlib.sha1(data).hexdigest()[:12]}.bin"
                    (crash_dir / name).write_bytes(data)
                    signatures[sig] = name
                    print(f"[{n}] NEW FAILURE {sig}: {str(res.error)[:300]} -> {crash_dir / name}",
                          file=sys.stderr, flush=True)
            if n % 10_000 == 0:
                rate = n / (time.monotonic() - started)
                print(f"[{n}] {rate:.0f} cases/s {dict(outcomes.most_common(8))}", file=sys.stderr, flush=True)
            if args.max_seconds and time.monotonic() - started > args.max_seconds:
                break
    finally:
        with contextlib.suppress(OSError):
            inflight.unlink()
        for f in scratch.iterdir():
            f.unlink()
        scratch.rmdir()
    elapsed = time.monotonic() - started
    summary = {"reader": args.reader, "seed": seed, "cases": n, "seconds": round(elapsed, 1),
               "outcomes": dict(outcomes.most_common()), "failures": sorted(signatures.items()),
               "pool": len(pool)}
    print(json.dumps(summary, indent=2))
    if args.report:
        args.report.write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if signatures else 0


if __name__ == "__main__":
    sys.exit(main())
