"""The readers' header fast paths against their full parsers.

The fast paths accept only the common shape of a header and hand everything else to the full parser,
so on any input both must give the same tensors (every slot), metadata and scalars, or the same error.
Each case below is read both ways; the headers are generated, mutated at random, and built to hit
each fallback condition.
"""

from __future__ import annotations

import io
import json
import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save as st_save_numpy

from migrator.core import dtypes
from migrator.core import tensor as tensor_mod
from migrator.core.bytesource import FileSource, MemorySource
from migrator.core.errors import PlanError
from migrator.core.limits import DEFAULT_LIMITS
from migrator.core.scalars import Scalar
from migrator.core.tensor import LazyTensor, stored, stored_many
from migrator.files.io import open_file, to_bytes
from migrator.formats import burnpack, cbor
from migrator.formats import safetensors as st_mod
from migrator.formats.burnpack import BurnpackReader
from migrator.formats.safetensors import SafetensorsReader, SafetensorsWriter

ST_DTYPES = [d for d in dtypes.ALL if d.safetensors]


class SlowSafetensors(SafetensorsReader):
    fast_path = False


def tensor_facts(t: LazyTensor) -> tuple[Any, ...]:
    """Every slot of a stored tensor (the loader by what it maps), and its bytes."""
    view = t.loader
    return (type(t), t.name, t.dtype, t.shape, t.nbytes, t.span, t.param_id, t.origin, t.chunks, type(view),
            view.source, view.offset, view.length, bytes(t.data()))  # type: ignore[attr-defined]


def outcome(make: Callable[[], Any]) -> tuple[Any, ...]:
    """What a reader gives: its tensors, metadata, scalars and extra(), or its error."""
    try:
        r = make()
    except Exception as e:  # whatever either path raises, compared
        return ("error", type(e), str(e), getattr(e, "tensor", None))
    return ("ok", [tensor_facts(t) for t in r.tensors], r.metadata, repr(r.scalars), r.extra())  # repr: NaN


def st_both(data: bytes) -> tuple[Any, ...]:
    """Read `data` with and without the fast path; they must agree. Returns the outcome."""
    src = MemorySource(data)
    fast = outcome(lambda: SafetensorsReader(src))
    slow = outcome(lambda: SlowSafetensors(src))
    assert fast == slow
    return fast


def st_fast_taken(data: bytes) -> bool:
    """Whether the fast path (not the fallback) parses this valid file."""
    r = SlowSafetensors(MemorySource(data))
    return r._fast(data[8 : 8 + r.header_size]) is not None


def frame(header: bytes | str, data: bytes = b"") -> bytes:
    body = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(body)) + body + data


def st_bytes(tensors: list[LazyTensor], **options: Any) -> bytes:
    buf = io.BytesIO()
    SafetensorsWriter(tensors, **options).write_to(buf)
    return buf.getvalue()


def split(file: bytes) -> tuple[bytes, bytes]:
    (n,) = struct.unpack("<Q", file[:8])
    return file[8 : 8 + n], file[8 + n :]


# -- generated models ------------------------------------------------------------------------------

NAME_CHARS = "abcxyz019._-/:,{}[] é中😀"


def random_tensors(rng: random.Random, n: int, *, plain_names: bool = False) -> dict[str, LazyTensor]:
    out: dict[str, LazyTensor] = {}
    for i in range(n):
        name = f"t{i}" if plain_names else "".join(rng.choice(NAME_CHARS) for _ in range(rng.randrange(0, 12))) + str(i)
        dt = rng.choice(ST_DTYPES)
        shape = tuple(rng.choice([0, 1, 2, 3, 8]) for _ in range(rng.randrange(0, 4)))
        numel = int(np.prod(shape)) if shape else 1
        assert dt.bits is not None
        if numel * dt.bits % 8:
            shape = (*shape, 8)
            numel *= 8
        nbytes = numel * dt.bits // 8
        data = rng.randbytes(nbytes)
        out[name] = LazyTensor(name, dt, shape, nbytes, loader=lambda d=data: d)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_generated_headers_take_the_fast_path_and_agree(seed: int) -> None:
    rng = random.Random(seed)
    tensors = list(random_tensors(rng, rng.randrange(1, 40)).values())
    meta = {"format": "pt", "k" + str(seed): "v } , \" é"[: rng.randrange(0, 9)]} if seed % 2 else None
    for order in ("library", "given"):
        data = st_bytes(tensors, metadata=meta, order=order)
        res = st_both(data)
        assert res[0] == "ok"
        names = [f[1] for f in res[1]]
        assert sorted(names) == sorted(t.name for t in tensors)
        assert st_fast_taken(data)


@pytest.mark.parametrize("seed", range(6))
def test_library_files_take_the_fast_path_and_match_safe_open(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for i in range(int(rng.integers(1, 30))):
        dt = rng.choice(["float32", "float16", "int64", "uint8", "bool", "float64", "int8"])
        shape = tuple(int(x) for x in rng.integers(0, 4, size=int(rng.integers(0, 4))))
        arrays[f"layer.{i}.w{rng.integers(0, 99)}"] = rng.standard_normal(shape).astype(dt)
    meta = {"format": "np", "seed": str(seed)} if seed % 2 else None
    data = st_save_numpy(arrays, metadata=meta)
    assert st_fast_taken(data)
    res = st_both(data)
    path = tmp_path / "lib.safetensors"
    path.write_bytes(data)
    with safe_open(str(path), framework="numpy") as f:
        assert sorted(f.keys()) == sorted(fact[1] for fact in res[1])
        assert (f.metadata() or {}) == res[2]
        by_name = {fact[1]: fact for fact in res[1]}
        for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            sl = f.get_slice(name)
            assert tuple(sl.get_shape()) == by_name[name][3]
            assert sl.get_dtype() == by_name[name][2].safetensors
            assert np.array_equal(f.get_tensor(name), arrays[name])
            assert by_name[name][-1] == arrays[name].tobytes()


def test_file_source_spans_agree(tmp_path: Path) -> None:
    tensors = list(random_tensors(random.Random(7), 25).values())
    path = tmp_path / "f.safetensors"
    path.write_bytes(to_bytes(tensors, "safetensors"))
    with FileSource(path) as src:
        fast = outcome(lambda: SafetensorsReader(src))
        slow = outcome(lambda: SlowSafetensors(src))
        assert fast == slow
        assert all(f[5] is not None and f[5].fd == src.fd for f in fast[1])  # kernel-copyable spans


def test_stored_many_equals_stored(tmp_path: Path) -> None:
    path = tmp_path / "x.bin"
    path.write_bytes(bytes(range(256)) * 4)
    with FileSource(path) as fsrc:
        for src in (fsrc, MemorySource(bytes(1024), "mem")):
            names, dts, shapes = ["a", "b", "c"], [dtypes.F32, dtypes.U8, dtypes.I16], [(2,), (3, 1), ()]
            offsets, lengths, pids = [0, 8, 11], [8, 3, 2], [None, 7, 2**64 - 1]
            bulk = stored_many(src, names, dts, shapes, offsets, lengths, pids)
            one = [stored(*args, param_id=p) for *args, p in
                   zip(names, dts, shapes, [src] * 3, offsets, lengths, pids, strict=True)]
            assert [tensor_facts(t) for t in bulk] == [tensor_facts(t) for t in one]


def test_stored_many_without_bulk_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensor_mod, "_SLOTTED", False)
    src = MemorySource(bytes(16))
    bulk = stored_many(src, ["a", "b"], [dtypes.U8] * 2, [(4,), (4,)], [0, 4], [4, 4])
    assert [tensor_facts(t) for t in bulk] == [tensor_facts(stored(n, dtypes.U8, (4,), src, o, 4))
                                              for n, o in (("a", 0), ("b", 4))]


def test_a_large_header() -> None:
    tensors = list(random_tensors(random.Random(3), 36_000, plain_names=True).values())
    data = to_bytes(tensors, "safetensors")
    assert st_fast_taken(data)
    st_both(data)


# -- every fallback condition ----------------------------------------------------------------------

BASE = {"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "U8", "shape": [1, 3], "data_offsets": [8, 11]}}
DATA = bytes(range(11))
COMPACT = json.dumps(BASE, separators=(",", ":"))


def compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def e(dtype: str, shape: list[Any], start: Any, end: Any) -> str:
    return f'{{"dtype":"{dtype}","shape":{compact(shape)},"data_offsets":[{start},{end}]}}'


A, B = e("F32", [2], 0, 8), e("U8", [1, 3], 8, 11)
# (case, header text, data, whether it is valid) -- every one must agree fast vs full; the valid ones
# that the fast path must leave to the full parser are asserted to do so.
FALLBACKS: list[tuple[str, str, bytes, bool]] = [
    ("escaped name", '{"\\u0061":' + A + ',"b":' + B + "}", DATA, True),
    ("escaped slash in name", '{"a\\/x":' + A + ',"b":' + B + "}", DATA, True),
    ("control char in name", '{"a\x01":' + A + ',"b":' + B + "}", DATA, False),
    ("raw tab in name", '{"a\t":' + A + ',"b":' + B + "}", DATA, False),
    ("duplicate name", '{"a":' + A + ',"a":' + B + "}", DATA, False),
    ("space after colon", '{"a": ' + A + ',"b":' + B + "}", DATA, True),
    ("space after comma", '{"a":' + A + ', "b":' + B + "}", DATA, True),
    ("newline inside", '{"a":' + A + ',\n"b":' + B + "}", DATA, True),
    ("leading space", ' {"a":' + A + ',"b":' + B + "}", DATA, True),
    ("trailing tab", '{"a":' + A + ',"b":' + B + "}\t", DATA, True),
    ("eight trailing spaces", '{"a":' + A + ',"b":' + B + "}" + " " * 8, DATA, True),
    ("seven trailing spaces", '{"a":' + A + ',"b":' + B + "}" + " " * 7, DATA, True),
    ("trailing comma", '{"a":' + A + ',"b":' + B + ",}", DATA, False),
    ("trailing garbage", '{"a":' + A + ',"b":' + B + "}x", DATA, False),
    ("two objects", '{"a":' + A + '}{"b":' + B + "}", DATA, False),
    ("missing comma", '{"a":' + A + '"b":' + B + "}", DATA, False),
    ("unknown field", '{"a":' + A[:-1] + ',"x":1},"b":' + B + "}", DATA, False),
    ("fields reordered", '{"a":{"shape":[2],"dtype":"F32","data_offsets":[0,8]},"b":' + B + "}", DATA, True),
    ("missing field", '{"a":{"dtype":"F32","shape":[2]},"b":' + B + "}", DATA, False),
    ("repeated field", '{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":' + B + "}",
     DATA, False),
    ("entries out of data order", '{"b":' + B + ',"a":' + A + "}", DATA, True),
    ("metadata last", '{"a":' + A + ',"b":' + B + ',"__metadata__":{"format":"pt"}}', DATA, True),
    ("metadata null", '{"__metadata__":null,"a":' + A + ',"b":' + B + "}", DATA, True),
    ("metadata empty", '{"__metadata__":{},"a":' + A + ',"b":' + B + "}", DATA, True),
    ("metadata only", '{"__metadata__":{"k":"v"}}', b"", True),
    ("metadata escaped", '{"__metadata__":{"k":"a\\nb"},"a":' + A + ',"b":' + B + "}", DATA, True),
    ("metadata duplicate key", '{"__metadata__":{"k":"v","k":"w"},"a":' + A + "}", DATA[:8], False),
    ("metadata twice", '{"__metadata__":{},"__metadata__":{},"a":' + A + "}", DATA[:8], False),
    ("metadata int", '{"__metadata__":{"k":1},"a":' + A + "}", DATA[:8], False),
    ("metadata then nothing", '{"__metadata__":{},}', b"", False),
    ("metadata as entry", '{"__metadata__":' + A + "}", DATA[:8], False),
    ("entry named like metadata", '{"a":' + A + ',"__metadata__":' + e("U8", [3], 8, 11) + "}", DATA, False),
    ("empty header", "{}", b"", True),
    ("empty header with data", "{}", b"x", False),
    ("empty with spaces", "{}      ", b"", True),
    ("leading zero", '{"a":' + e("F32", ["02"], 0, 8) + "}", DATA[:8], False),
    ("leading zero offset", '{"a":' + e("F32", [2], "00", 8) + "}", DATA[:8], False),
    ("negative dim", '{"a":' + e("F32", [-2], 0, 8) + "}", DATA[:8], False),
    ("float dim", '{"a":' + e("F32", [2.0], 0, 8) + "}", DATA[:8], False),
    ("exponent dim", '{"a":{"dtype":"F32","shape":[2e0],"data_offsets":[0,8]}}', DATA[:8], False),
    ("bool dim", '{"a":' + e("F32", [True], 0, 4) + "}", DATA[:4], False),
    ("17 dims", '{"a":' + e("U8", [1] * 17, 0, 1) + "}", b"x", True),
    ("16 dims", '{"a":' + e("U8", [1] * 16, 0, 1) + "}", b"x", True),
    ("20-digit dim", '{"a":' + e("U8", [0, 10**19], 0, 0) + "}", b"", True),
    ("19-digit dims overflow", '{"a":' + e("F64", [10**18, 10**18], 0, 0) + "}", b"", False),
    ("dim beyond 64 bits", '{"a":' + e("U8", [0, 2**64], 0, 0) + "}", b"", False),
    ("offset beyond 64 bits", '{"a":' + e("U8", [1], 2**64, 2**64 + 1) + "}", b"x", False),
    ("unknown dtype", '{"a":' + e("F128", [2], 0, 8) + "}", DATA[:8], False),
    ("lowercase dtype", '{"a":' + e("f32", [2], 0, 8) + "}", DATA[:8], False),
    ("dtype not a string", '{"a":{"dtype":3,"shape":[2],"data_offsets":[0,8]}}', DATA[:8], False),
    ("sub-byte", '{"a":' + e("F4", [3], 0, 1) + "}", b"x", False),
    ("sub-byte whole", '{"a":' + e("F4", [4], 0, 2) + "}", b"xy", True),
    ("f6 whole", '{"a":' + e("F6_E3M2", [4], 0, 3) + "}", b"xyz", True),
    ("gap at start", '{"a":' + e("F32", [2], 1, 9) + "}", DATA[:9], False),
    ("gap between", '{"a":' + A + ',"b":' + e("U8", [1, 3], 9, 12) + "}", DATA + b"z", False),
    ("overlap", '{"a":' + A + ',"b":' + e("U8", [1, 3], 7, 10) + "}", DATA, False),
    ("size mismatch", '{"a":' + e("F32", [3], 0, 8) + "}", DATA[:8], False),
    ("end before start", '{"a":' + e("U8", [0], 1, 0) + "}", b"x", False),
    ("data too long", '{"a":' + A + "}", DATA[:9], False),
    ("data too short", '{"a":' + A + ',"b":' + B + "}", DATA[:10], False),
    ("zero-length tensors", '{"z":' + e("F32", [0], 0, 0) + ',"y":' + e("I8", [2, 0], 0, 0) + ',"a":' + A
     + ',"w":' + e("U8", [0], 8, 8) + "}", DATA[:8], True),
    ("zero-length last", '{"a":' + A + ',"z":' + e("U8", [0], 8, 8) + "}", DATA[:8], True),
    ("zero-length after", '{"a":' + A + ',"z":' + e("U8", [0], 0, 0) + "}", DATA[:8], True),
    ("name with brace comma quote", '{"a},":' + A + ',"b":' + B + "}", DATA, True),
    ("name with brace comma", '{"a},":' + A + ',"},":' + B + "}", DATA, True),
    ("unicode names", '{"é":' + A + ',"😀":' + B + "}", DATA, True),
    ("empty name", '{"":' + A + ',"b":' + B + "}", DATA, True),
    ("nan", '{"__metadata__":NaN}', b"", False),
    ("not an object", '["a"]', b"", False),
    ("bom", "\ufeff" + COMPACT, b"", False),
]


@pytest.mark.parametrize(("case", "text", "data", "valid"), FALLBACKS, ids=[c[0] for c in FALLBACKS])
def test_each_fallback_condition_agrees(case: str, text: str, data: bytes, valid: bool) -> None:
    res = st_both(frame(text, data))
    assert (res[0] == "ok") == valid, res


def test_invalid_utf8_in_name_and_metadata() -> None:
    for header in (b'{"a\xff":' + A.encode() + b"}", b'{"__metadata__":{"k":"\xc3"},"a":' + A.encode() + b"}",
                   b'{"a":' + A.encode() + b',"\xed\xa0\x80":' + B.encode() + b"}"):
        res = st_both(frame(header, DATA))
        assert res[0] == "error" and "not UTF-8" in res[2]


def test_the_bulk_checks_take_every_valid_header_in_the_common_field_order() -> None:
    for case, text, data, valid in FALLBACKS:
        if valid:  # fields in another order than dtype, shape, data_offsets: the per-entry checks
            assert st_fast_taken(frame(text, data)) == (case != "fields reordered"), case


# -- random mutations ------------------------------------------------------------------------------

TOKENS = [b",", b":", b"{", b"}", b"[", b"]", b'"', b"\\", b" ", b"0", b"1", b"9", b"-", b".", b"e",
          b"\x00", b"\xff", b"\xc3\xa9", b"__metadata__", b'"dtype"', b'"F32"', b'"U8"', b'"F4"', b"null",
          b"18446744073709551616", b"99999999999999999999", b"}," + b'"', b'"shape":[', b"true"]


def mutate(rng: random.Random, header: bytes) -> bytes:
    out = bytearray(header)
    for _ in range(rng.randrange(1, 4)):
        pos = rng.randrange(0, len(out) + 1)
        op = rng.random()
        if op < 0.35 and out:
            del out[pos : pos + rng.randrange(1, 4)]
        elif op < 0.7:
            out[pos:pos] = rng.choice(TOKENS)
        elif out:
            out[min(pos, len(out) - 1)] = rng.randrange(256) if rng.random() < 0.3 else rng.choice(b'0123456789,:{}[]"')
    return bytes(out)


def test_random_mutations_agree() -> None:
    rng = random.Random(2024)
    seeds = [to_bytes(list(random_tensors(random.Random(s), 6).values()), "safetensors",
                      metadata={"m": "v"} if s % 2 else None) for s in range(8)]
    seeds.append(st_save_numpy({"x": np.zeros((2, 3), np.float32), "y": np.arange(4, dtype=np.int16)}))
    outcomes = {"ok": 0, "error": 0, "fast": 0}
    for i in range(3000):
        header, data = split(seeds[i % len(seeds)])
        new = mutate(rng, header)
        if rng.random() < 0.3:  # keep the library's 8-byte padding
            new += b" " * (-len(new) % 8)
        file = frame(new, data)
        kind = st_both(file)[0]
        outcomes[kind] += 1
        outcomes["fast"] += kind == "ok" and st_fast_taken(file)
    # every kind was exercised: errors, mutants the full parser accepts, mutants the fast path accepts
    assert outcomes["error"] > 1000 and outcomes["ok"] > 50 and outcomes["fast"] > 20, outcomes


def test_size_overflow_is_refused_even_where_the_file_could_hold_it() -> None:
    # U8 x 2**61 is 2**64 bits: the library's checked_mul refuses it, whatever the file size says
    header = frame('{"a":' + e("U8", [2**61], 0, 2**61) + "}")

    class Huge(MemorySource):
        def __init__(self) -> None:
            super().__init__(header)
            self.size = len(header) + 2**61

    fast = outcome(lambda: SafetensorsReader(Huge()))
    slow = outcome(lambda: SlowSafetensors(Huge()))
    assert fast == slow
    assert fast[0] == "error" and "overflows 64-bit sizes" in fast[2]


# == burnpack ======================================================================================

BURN_DTYPES = [d for d in dtypes.ALL if d.burn_text or d.kind is dtypes.Kind.BOOL]


class SlowBurnpack(BurnpackReader):
    fast_path = False


def bp_both(data: bytes) -> tuple[Any, ...]:
    src = MemorySource(data)
    fast = outcome(lambda: BurnpackReader(src))
    slow = outcome(lambda: SlowBurnpack(src))
    assert fast == slow
    return fast


def bp_fast_taken(data: bytes) -> bool:
    r = SlowBurnpack(MemorySource(data))
    return r._fast(data[burnpack.HEADER_SIZE : burnpack.HEADER_SIZE + r.metadata_size]) is not None


def bp_pack(meta: bytes, data: bytes = b"") -> bytes:
    body = struct.pack("<IHI", burnpack.MAGIC, 1, len(meta)) + meta
    return body + bytes(burnpack.align(len(body)) - len(body)) + data


def bp_split(file: bytes) -> tuple[bytes, bytes]:
    (n,) = struct.unpack("<I", file[6:10])
    return file[10 : 10 + n], file[burnpack.align(10 + n) :]


def random_burn_tensors(rng: random.Random, n: int) -> list[LazyTensor]:
    out = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.1:
            name = "long." * rng.randrange(5, 80) + str(i)  # 1- and 2-byte length heads
        elif kind < 0.15:
            name = "x" * 300 + str(i)
        else:
            name = "".join(rng.choice(NAME_CHARS + "£¤") for _ in range(rng.randrange(0, 10))) + str(i)
        dt = rng.choice(BURN_DTYPES)
        shape = tuple(rng.choice([0, 1, 2, 3, 300]) for _ in range(rng.randrange(0, 4)))
        nbytes = dt.nbytes(shape)
        assert nbytes is not None
        data = rng.randbytes(nbytes)
        pid = rng.choice([None, rng.randrange(2**64), rng.randrange(30)])
        out.append(LazyTensor(name, dt, shape, nbytes, loader=lambda d=data: d, param_id=pid))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_burnpack_generated_files_take_the_fast_path_and_agree(seed: int) -> None:
    rng = random.Random(seed)
    tensors = random_burn_tensors(rng, rng.randrange(0, 40))
    meta = {"format": "burnpack", "k": "v £"} if seed % 2 else None
    scalars = {"lr": Scalar("Float", 0.5), "step": Scalar("UInt", 3)} if seed % 3 == 0 else None
    data = to_bytes(tensors, "burnpack", metadata=meta, scalars=scalars)
    res = bp_both(data)
    assert res[0] == "ok"
    assert sorted(f[1] for f in res[1]) == sorted(t.name for t in tensors)
    assert bp_fast_taken(data)


def test_burnpack_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(burnpack, "_BATCH", 3)
    data = to_bytes(random_burn_tensors(random.Random(5), 20), "burnpack")
    assert bp_fast_taken(data)
    bp_both(data)


def gpt2_named(layers: int, d: int) -> list[tuple[str, tuple[int, ...]]]:
    """GPT-2's tensor names and shapes, `12 * layers + 4` tensors (the benchmarks' many-tensor models)."""
    out: list[tuple[str, tuple[int, ...]]] = [("wte.weight", (64, d)), ("wpe.weight", (64, d))]
    for i in range(layers):
        for name, shape in (("ln_1.weight", (d,)), ("ln_1.bias", (d,)), ("attn.c_attn.weight", (3 * d, d)),
                            ("attn.c_attn.bias", (3 * d,)), ("attn.c_proj.weight", (d, d)), ("attn.c_proj.bias", (d,)),
                            ("ln_2.weight", (d,)), ("ln_2.bias", (d,)), ("mlp.c_fc.weight", (4 * d, d)),
                            ("mlp.c_fc.bias", (4 * d,)), ("mlp.c_proj.weight", (d, 4 * d)), ("mlp.c_proj.bias", (d,))):
            out.append((f"h.{i}.{name}", shape))
    return [*out, ("ln_f.weight", (d,)), ("ln_f.bias", (d,))]


def test_a_gpt2_shaped_header_takes_the_fast_path_and_agrees() -> None:
    """The shape of the benchmarks' many-tensor models (GPT-2 names; 250 blocks, not 833, for the slow
    parser's sake); param_ids on half the tensors."""
    shapes = gpt2_named(250, 4)
    tensors = []
    for i, (name, shape) in enumerate(shapes):
        nbytes = 4 * int(np.prod(shape))
        tensors.append(LazyTensor(name, dtypes.F32, shape, nbytes, loader=lambda n=nbytes: bytes(n),
                                  param_id=(i * 2654435761) % 2**64 if i % 2 else None))
    assert len(tensors) == 3004
    data = to_bytes(tensors, "burnpack", metadata={"format": "burnpack", "producer": "burn"})
    res = bp_both(data)
    assert res[0] == "ok" and [f[1] for f in res[1]] == [name for name, _ in shapes]
    assert bp_fast_taken(data)


def enc(*items: Any) -> bytes:
    """CBOR of the items one after another (dicts keep their order)."""
    return b"".join(cbor.encode(i) for i in items)


def root(entries: bytes, count: int, *rest: bytes, fields: int | None = None) -> bytes:
    n = 1 + len(rest) // 2 if fields is None else fields
    return cbor.head(5, n) + enc("tensors") + cbor.head(5, count) + entries + b"".join(rest)


def d(dtype: Any = "F32", shape: list[int] | None = None, offsets: tuple[int, int] = (0, 16), **more: Any) -> dict:
    return {"dtype": dtype, "shape": [2, 2] if shape is None else shape, "data_offsets": list(offsets), **more}


W16 = bytes(range(16))
TWO = enc("a", d(), "b", d("U8", [3], (256, 259)))
TWO_DATA = W16 + bytes(240) + b"xyz"
HUGE_NAME = "n" * 70_000
FAKE = b"z\xa3\x65dtype\x63F32\x65shape\x82\x02\x02\x6cdata_offsets\x82\x00\x10"
QFLOAT_SCHEME = bytes.fromhex("a5 65 76616c7565 63 513846 65 73746f7265 a1 69 5061636b6564553332 00 64 6d6f6465"
                              " 69 53796d6d6574726963 66 74656e736f72 f6 65 626c6f636b f6".replace(" ", ""))

# (case, metadata bytes, data, valid)
BP_FALLBACKS: list[tuple[str, bytes, bytes, bool]] = [
    ("plain", root(TWO, 2), TWO_DATA, True),
    ("with param_id", root(enc("a", d(param_id=7), "b", d("U8", [3], (256, 259), param_id=2**64 - 1)), 2),
     TWO_DATA, True),
    ("param_id null", root(enc("a", d(param_id=None)), 1), W16, True),
    ("param_id negative", root(enc("a", d(param_id=-1)), 1), W16, False),
    ("param_id text", root(enc("a", d(param_id="x")), 1), W16, False),
    # the descriptor ends after 3 fields; "param_id", 1 are then trailing bytes of the 1-entry root
    ("map head 3 with param_id", root(enc("a") + b"\xa3" + enc("dtype", "F32", "shape", [2, 2], "data_offsets",
                                                             [0, 16], "param_id", 1), 1), W16, True),
    ("map head 4 without param_id", root(enc("a") + b"\xa4" + enc("dtype", "F32", "shape", [2, 2], "data_offsets",
                                                                 [0, 16]) + enc("b", d("U8", [3], (256, 259))), 2),
     TWO_DATA, False),
    ("fields reordered", root(enc("a", {"shape": [2, 2], "dtype": "F32", "data_offsets": [0, 16]}), 1), W16, True),
    ("unknown field", root(enc("a", d(extra=1)), 1), W16, True),
    ("repeated field", root(enc("a") + b"\xa4" + enc("dtype", "F32", "dtype", "F32", "shape", [2, 2],
                                                     "data_offsets", [0, 16]), 1), W16, False),
    ("missing field", root(enc("a", {"dtype": "F32", "shape": [2, 2]}), 1), W16, False),
    ("repeated name keeps last", root(enc("a", d("U8", [3], (256, 259)), "a", d()), 2), TWO_DATA, True),
    ("repeated name valid", root(enc("a", d("U8", [3], (0, 3)), "a", d()), 2), W16, True),
    ("tensors not first", cbor.head(5, 2) + enc("metadata", {"k": "v"}, "tensors", {"a": d()}), W16, True),
    ("unknown root key", root(TWO, 2, enc("other"), enc(1)), TWO_DATA, True),
    ("tensors twice", root(TWO, 2, enc("tensors"), enc({})), TWO_DATA, False),
    ("metadata twice", root(TWO, 2, enc("metadata"), enc({}), enc("metadata"), enc({})), TWO_DATA, False),
    ("metadata and scalars", root(TWO, 2, enc("metadata"), enc({"k": "v"}), enc("scalars"),
                                  enc({"s": {"Float": 0.5}, "i": {"Int": -3}})), TWO_DATA, True),
    ("metadata null", root(TWO, 2, enc("metadata"), enc(None)), TWO_DATA, True),
    ("metadata not text", root(TWO, 2, enc("metadata"), enc({"k": 1})), TWO_DATA, False),
    ("scalars unknown variant", root(TWO, 2, enc("scalars"), enc({"s": {"Complex": 1}})), TWO_DATA, False),
    ("root head counts too many", root(TWO, 2, fields=2), TWO_DATA, False),
    ("root head counts too few", root(TWO, 2, enc("metadata"), enc({"k": "v"}), fields=1), TWO_DATA, True),
    ("trailing bytes after root", root(TWO, 2) + b"\xff\x00junk", TWO_DATA, True),
    ("truncated metadata", root(TWO, 2, enc("metadata"), enc({"k": "v"}))[:-2], TWO_DATA, False),
    ("tensors count too high", root(TWO, 3), TWO_DATA, False),
    ("tensors count too low", root(TWO, 1), TWO_DATA, True),  # the rest is trailing bytes
    ("tensors empty", root(b"", 0), b"", True),
    ("tensors empty with metadata", root(b"", 0, enc("metadata"), enc({"a": "b"})), b"", True),
    ("no tensors", cbor.head(5, 0), b"", False),
    ("tensors not a map", root(b"", 0)[:-1] + b"\x80", b"", False),
    ("indefinite descriptor", root(enc("a") + b"\xbf" + enc("dtype", "F32", "shape", [2, 2], "data_offsets",
                                                             [0, 16]) + b"\xff", 1), W16, True),
    ("indefinite tensors map", b"\xa1" + enc("tensors") + b"\xbf" + enc("a", d()) + b"\xff", W16, True),
    ("indefinite shape", root(enc("a") + b"\xa3" + enc("dtype", "F32", "shape") + b"\x9f\x02\x02\xff"
                              + enc("data_offsets", [0, 16]), 1), W16, True),
    ("non-minimal ints", root(enc("a") + b"\xa3" + enc("dtype", "F32", "shape") + b"\x82\x18\x02\x19\x00\x02"
                              + enc("data_offsets") + b"\x82\x1a\x00\x00\x00\x00\x1b" + (16).to_bytes(8, "big"), 1),
     W16, True),
    ("non-minimal name head", root(b"\x78\x01a" + enc(d()), 1), W16, True),
    ("non-minimal count", b"\xa1" + enc("tensors") + b"\xb9\x00\x01" + enc("a", d()), W16, True),
    ("tag on descriptor", root(enc("a") + b"\xc0" + enc(d()), 1), W16, True),
    ("tag on offset", root(enc("a") + b"\xa3" + enc("dtype", "F32", "shape", [2, 2], "data_offsets")
                           + b"\x82\xc1\x00\x10", 1), W16, True),
    ("shape head counts more", root(enc("a") + b"\xa3" + enc("dtype", "F32", "shape") + b"\x83\x02\x02"
                                    + enc("data_offsets", [0, 16]), 1), W16, False),
    ("shape head counts fewer", root(enc("a") + b"\xa3" + enc("dtype", "F32", "shape") + b"\x81\x02\x02"
                                     + enc("data_offsets", [0, 16]), 1), W16, False),
    ("negative dim", root(enc("a", d(shape=[-2, 2])), 1), W16, False),
    ("float dim", root(enc("a", d(shape=[2.0, 2])), 1), W16, False),
    ("24 dims", root(enc("a", d("U8", [1] * 24, (0, 1))), 1), b"x", True),
    ("23 dims", root(enc("a", d("U8", [1] * 23, (0, 1))), 1), b"x", True),
    ("shape bomb", root(enc("a", d("U8", [2**64 - 1] * 20, (0, 1))), 1), b"x", False),
    ("huge empty shape", root(enc("a", d("U8", [2**64 - 1] * 20 + [0], (0, 0))), 1), b"", True),
    ("unknown dtype", root(enc("a", d("F128")), 1), W16, False),
    ("qfloat text dtype", root(enc("a", d("QFloat")), 1), W16, False),
    ("lowercase dtype", root(enc("a", d("f32")), 1), W16, False),
    ("bool stores", root(enc("n", d({"Bool": "Native"}, [3], (0, 3)), "u", d({"Bool": "U32"}, [1], (256, 260)),
                              "e", d({"Bool": "U8"}, [0], (256, 256))), 3), b"abc" + bytes(253) + b"abcd", True),
    ("bad bool store", root(enc("a", d({"Bool": "U16"}, [1], (0, 2))), 1), b"xy", False),
    ("qfloat", root(enc("q") + b"\xa3" + enc("dtype") + b"\xa1\x66QFloat" + QFLOAT_SCHEME
                    + enc("shape", [4], "data_offsets", [0, 8]), 1), bytes(8), True),
    ("misaligned", root(enc("a", d(offsets=(8, 24))), 1), W16 + W16, False),
    ("size mismatch", root(enc("a", d(offsets=(0, 12))), 1), W16, False),
    ("end before start", root(enc("a", d("U8", [0], (256, 0))), 1), W16, False),
    ("over the tensor limit", root(enc("a", d("U8", [11 * 1024**3], (0, 11 * 1024**3))), 1), W16, False),
    ("truncated data", root(TWO, 2), TWO_DATA[:-1], False),
    ("overlap", root(enc("a", d(), "b", d("U8", [8], (0, 8))), 2), W16, False),
    ("zero-length tensors share a start", root(enc("z", d("U8", [0], (256, 256)), "a", d(), "y",
                                                   d("F32", [0, 3], (0, 0)), "b", d("U8", [3], (256, 259))), 4),
     TWO_DATA, True),
    ("names out of data order", root(enc("b", d("U8", [3], (0, 3)), "a", d(offsets=(256, 272))), 2),
     b"xyz" + bytes(253) + W16, True),
    ("name with descriptor bytes", root(enc("x\xa3" + "\x65dtype", d()), 1), W16, True),
    # UTF-8 text cannot hold a descriptor's bytes (a shape head is a continuation byte after ASCII),
    # but it can hold a descriptor's start: the matcher leaves such a name to the generic decoder ...
    ("name with descriptor-like text", root(enc("£edtypecF32eshape\x82\x02\x02ldata_offsets\x82\x00\x10", d()), 1),
     W16, True),
    # ... so a name that does is not UTF-8: the matcher stops early, the head disagrees, the decoder refuses it
    ("name holding a descriptor", root(cbor.head(3, len(FAKE)) + FAKE + enc(d()), 1), W16, False),
    ("name of 70000 bytes", root(enc(HUGE_NAME, d()), 1), W16, True),
    ("invalid utf-8 name", root(b"\x62\xc3\x28" + enc(d()), 1), W16, False),
    ("surrogate name", root(b"\x63\xed\xa0\x80" + enc(d()), 1), W16, False),
    ("byte-string name", root(b"\x41a" + enc(d()), 1), W16, False),
    ("int name", root(b"\x01" + enc(d()), 1), W16, False),
    ("truncated descriptor", root(TWO, 2)[:-3], TWO_DATA, False),
]


@pytest.mark.parametrize(("case", "meta", "data", "valid"), BP_FALLBACKS, ids=[c[0] for c in BP_FALLBACKS])
def test_burnpack_each_fallback_condition_agrees(case: str, meta: bytes, data: bytes, valid: bool) -> None:
    res = bp_both(bp_pack(meta, data))
    assert (res[0] == "ok") == valid, res


def test_burnpack_fast_path_takes_burn_shapes_only() -> None:
    fast = {"plain", "with param_id", "metadata and scalars", "metadata null", "tensors empty", "bool stores",
            "tensors empty with metadata", "non-minimal ints", "non-minimal name head", "non-minimal count",
            "23 dims", "huge empty shape", "zero-length tensors share a start", "names out of data order",
            "trailing bytes after root", "root head counts too few",
            "tensors count too low",
            "map head 3 with param_id",  # the map ends before "param_id": trailing bytes, as the decoder reads it
            "name with descriptor bytes", "name with descriptor-like text"}  # names are read by their length
    for case, meta, data, valid in BP_FALLBACKS:
        if valid:
            assert bp_fast_taken(bp_pack(meta, data)) == (case in fast), case


def test_burnpack_count_limit_agrees() -> None:
    n = DEFAULT_LIMITS.max_tensors + 1
    entry = cbor.encode({"dtype": "U8", "shape": [0], "data_offsets": [0, 0]})
    body = b"\xa1\x67tensors\xba" + n.to_bytes(4, "big") + b"".join(cbor.encode(f"t{i}") + entry for i in range(n))
    res = bp_both(bp_pack(body))
    assert res[0] == "error" and "100001 tensors" in res[2]


BP_TOKENS = [b"\x00", b"\x17", b"\x18", b"\x19\x01", b"\x1b", b"\x60", b"\x61a", b"\x78", b"\x80", b"\x82",
             b"\x97", b"\x98", b"\x9f", b"\xa0", b"\xa3", b"\xa4", b"\xb9", b"\xbf", b"\xc0", b"\xf6", b"\xff",
             b"\x68param_id\x01", b"\x65dtype", b"\x63F32", b"\x62U8", b"\xa1\x64Bool\x62U8", b"\x65shape",
             b"\x6cdata_offsets", b"\x19\x01\x00", b"\x61a\xa3\x65dtype\x62U8\x65shape\x80\x6cdata_offsets\x82\x00\x01"]


def bp_mutate(rng: random.Random, meta: bytes) -> bytes:
    out = bytearray(meta)
    for _ in range(rng.randrange(1, 4)):
        pos = rng.randrange(0, len(out) + 1)
        op = rng.random()
        if op < 0.3 and out:
            del out[pos : pos + rng.randrange(1, 3)]
        elif op < 0.6:
            out[pos:pos] = rng.choice(BP_TOKENS)
        elif out:
            i = min(pos, len(out) - 1)
            out[i] = rng.randrange(256) if rng.random() < 0.5 else out[i] ^ (1 << rng.randrange(8))
    return bytes(out)


def test_burnpack_random_mutations_agree() -> None:
    rng = random.Random(99)
    seeds = [to_bytes(random_burn_tensors(random.Random(s), 5), "burnpack",
                      metadata={"m": "v"} if s % 2 else None,
                      scalars={"x": Scalar("Bool", True)} if s % 3 == 0 else None) for s in range(8)]
    outcomes = {"ok": 0, "error": 0, "fast": 0}
    for i in range(3000):
        meta, data = bp_split(seeds[i % len(seeds)])
        file = bp_pack(bp_mutate(rng, meta), data)
        kind = bp_both(file)[0]
        outcomes[kind] += 1
        outcomes["fast"] += kind == "ok" and bp_fast_taken(file)
    assert outcomes["error"] > 1000 and outcomes["ok"] > 50 and outcomes["fast"] > 20, outcomes


def test_burnpack_tensor_size_limit_even_where_the_file_could_hold_it() -> None:
    n = DEFAULT_LIMITS.max_tensor_bytes + 256
    file = bp_pack(root(enc("a", d("U8", [n], (0, n))), 1))

    class Huge(MemorySource):
        def __init__(self) -> None:
            super().__init__(file)
            self.size = len(file) + n

    fast = outcome(lambda: BurnpackReader(Huge()))
    assert fast == outcome(lambda: SlowBurnpack(Huge()))
    assert fast[0] == "error" and "tensor limit" in fast[2]


# == writers: the per-distinct-value checks against the per-tensor ones ===========================


def writer_outcome(make: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        w = make()
    except Exception as e:  # whatever either path raises, compared
        return ("error", type(e), str(e), getattr(e, "tensor", None))
    buf = io.BytesIO()
    try:
        w.write_to(buf)
    except Exception as e:  # a tensor whose loader contradicts its declared length
        return ("write error", w.total_size, type(e), str(e), buf.getvalue())
    return ("ok", w.total_size, buf.getvalue())


def bad_tensor_lists() -> list[list[LazyTensor]]:
    ok = [LazyTensor(f"t{i}", dtypes.F32, (2,), 8, loader=lambda: bytes(8)) for i in range(5)]
    lt = LazyTensor
    return [
        ok,
        [],
        [*ok, lt("t1", dtypes.U8, (1,), 1, loader=lambda: b"x")],  # duplicate
        [*ok, lt("__metadata__", dtypes.U8, (1,), 1, loader=lambda: b"x")],
        [*ok, lt("bad\ud800", dtypes.U8, (1,), 1, loader=lambda: b"x")],  # lone surrogate
        [*ok, lt("q", dtypes.F32, (3,), 8, loader=lambda: bytes(8))],  # wrong length
        [*ok, lt("f4", dtypes.F4, (3,), 2, loader=lambda: bytes(2))],  # partial byte
        [*ok, lt("f4", dtypes.F4, (3,), 1, loader=lambda: bytes(1))],  # partial byte, length rounded down
        [*ok, lt("fnuz", dtypes.F8_E4M3FNUZ, (1,), 1, loader=lambda: b"x")],  # no SafeTensors name
        [*ok, lt("flex", dtypes.FLEX32, (1,), 4, loader=lambda: bytes(4)), lt("b", dtypes.BOOL_U8, (2,), 2,
                                                                            loader=lambda: bytes(2))],
        [*ok, lt("qf", dtypes.qfloat(b"\xa0"), (4,), 8, loader=lambda: bytes(8))],
        [*ok, lt("big", dtypes.F64, (2**40, 2**40), 2**83, loader=lambda: b"")],
        [lt("z", dtypes.F32, (2, 0), 0, loader=lambda: b""), *ok, lt("\x01é", dtypes.I8, (), 1, loader=lambda: b"x")],
    ]


@pytest.mark.parametrize("case", range(len(bad_tensor_lists())))
@pytest.mark.parametrize("order", ["library", "given"])
def test_safetensors_writer_fast_checks_agree(case: int, order: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tensors = bad_tensor_lists()[case]
    meta = {"format": "pt"} if case % 2 else None
    fast = writer_outcome(lambda: SafetensorsWriter(tensors, metadata=meta, order=order))  # type: ignore[arg-type]
    monkeypatch.setattr(SafetensorsWriter, "_fast_checks", lambda self: None)
    slow = writer_outcome(lambda: SafetensorsWriter(tensors, metadata=meta, order=order))  # type: ignore[arg-type]
    assert fast == slow


@pytest.mark.parametrize("seed", range(4))
def test_safetensors_writer_matches_the_library_on_generated_models(seed: int) -> None:
    rng = np.random.default_rng(seed)
    arrays = {f"m.{i}.{'é' if i % 7 == 0 else 'w'}": rng.standard_normal(tuple(rng.integers(0, 4, size=2)))
              .astype(rng.choice(["float32", "float16", "int8", "bool", "uint64"])) for i in range(300)}
    from migrator.core.tensor import from_numpy

    assert st_bytes([from_numpy(k, v) for k, v in arrays.items()]) == st_save_numpy(arrays)


def burn_reference_cbor(w: burnpack.BurnpackWriter) -> bytes:
    """The writer's CBOR built the plain way: a dict tree through the generic encoder."""
    descs = {}
    for t, start in sorted(zip(w.tensors, w._starts, strict=True), key=lambda p: p[0].name.encode()):
        desc = {"dtype": burnpack._dtype_to_cbor(t.dtype), "shape": list(t.shape),
                "data_offsets": [start, start + t.nbytes]}
        if t.param_id is not None:
            desc["param_id"] = t.param_id
        descs[t.name] = desc
    root = {"tensors": descs}
    if w.metadata:
        root["metadata"] = {k: w.metadata[k] for k in sorted(w.metadata)}
    if w.scalars:
        root["scalars"] = {k: {v.kind: v.value} for k, v in sorted(w.scalars.items())}
    return cbor.encode(root)


@pytest.mark.parametrize("seed", range(8))
def test_burnpack_writer_cbor_equals_the_plain_encoding(seed: int) -> None:
    rng = random.Random(seed)
    tensors = random_burn_tensors(rng, rng.randrange(0, 300))
    if seed % 2:
        tensors.append(LazyTensor("qf", dtypes.qfloat(QFLOAT_SCHEME), (4,), 13, loader=lambda: bytes(13)))
    w = burnpack.BurnpackWriter(tensors, metadata={"b": "1", "a": "é"} if seed % 3 else None,
                                scalars={"lr": Scalar("Float", 1e-3)} if seed % 4 == 0 else None)
    assert w.header == burn_reference_cbor(w)
    assert w.header_bound([t.name for t in tensors]) >= len(w.header)
    monkey = burnpack.BurnpackWriter._fast_offsets
    try:
        burnpack.BurnpackWriter._fast_offsets = lambda self: None  # type: ignore[method-assign]
        assert burnpack.BurnpackWriter(tensors, metadata=w.metadata, scalars=w.scalars)._starts == w._starts
    finally:
        burnpack.BurnpackWriter._fast_offsets = monkey  # type: ignore[method-assign]


@pytest.mark.parametrize("case", range(len(bad_tensor_lists())))
def test_burnpack_writer_fast_checks_agree(case: int, monkeypatch: pytest.MonkeyPatch) -> None:
    tensors = bad_tensor_lists()[case]
    if case == 1:
        tensors = [LazyTensor(f"p{i}", dtypes.U8, (1,), 1, loader=lambda: b"x", param_id=i) for i in range(3)]
    extra = [LazyTensor("huge", dtypes.U8, (burnpack.BURN_MAX_TENSOR_SIZE + 1,), burnpack.BURN_MAX_TENSOR_SIZE + 1,
                        loader=lambda: b"")] if case == 2 else []
    fast = writer_outcome(lambda: burnpack.BurnpackWriter(tensors + extra))
    monkeypatch.setattr(burnpack.BurnpackWriter, "_fast_offsets", lambda self: None)
    assert fast == writer_outcome(lambda: burnpack.BurnpackWriter(tensors + extra))


def test_burnpack_writer_names_the_tensor_that_cannot_be_utf8() -> None:
    from migrator.core.errors import PlanError

    ok = [LazyTensor(f"t{i}", dtypes.U8, (1,), 1, loader=lambda: b"x") for i in range(3)]
    with pytest.raises(PlanError, match="not valid Unicode text") as info:
        burnpack.BurnpackWriter([*ok, LazyTensor("b\udc80d", dtypes.U8, (1,), 1, loader=lambda: b"x")])
    assert info.value.tensor == "b\udc80d"  # type: ignore[attr-defined]


def test_a_header_without_entry_boundaries_is_not_scanned_whole() -> None:
    # 4 MB of well-formed entries behind an error json.loads stops at at once: nothing is built
    # from the entries before the header is refused
    import tracemalloc

    one = '"a":' + e("U8", [1], 0, 1)
    header = "{x " + ", ".join([one] * 80_000) + "}"
    data = frame(header, b"x")
    tracemalloc.start()
    try:
        res = outcome(lambda: SafetensorsReader(MemorySource(data)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert res[0] == "error" and "not valid JSON" in res[2]
    assert peak < 3 * len(data)  # the header, its text for json.loads, little else


def test_writers_take_list_shapes_like_before() -> None:
    # LazyTensor declares a tuple, but a list (unhashable) was always accepted by the writers
    tensors = [LazyTensor("a", dtypes.F32, [2, 2], 16, loader=lambda: bytes(16)),  # type: ignore[arg-type]
               LazyTensor("b", dtypes.U8, (3,), 3, loader=lambda: b"xyz")]
    st = st_bytes(tensors)
    assert [(t.name, t.shape) for t in SafetensorsReader(MemorySource(st)).tensors] == [("a", (2, 2)), ("b", (3,))]
    bp = to_bytes(tensors, "burnpack")
    assert [(t.name, t.shape) for t in BurnpackReader(MemorySource(bp)).tensors] == [("a", (2, 2)), ("b", (3,))]


def test_readers_and_writers_leave_the_collector_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the command line tunes the collector: a library call never pauses or freezes it."""
    import gc

    def refuse(*_: Any) -> None:
        raise AssertionError("a library call tuned the garbage collector")

    for name in ("disable", "enable", "freeze", "unfreeze", "set_threshold"):
        monkeypatch.setattr(gc, name, refuse)
    good = to_bytes(list(random_tensors(random.Random(1), 5).values()), "safetensors")
    for data in (good, frame("{x}")):
        assert outcome(lambda d=data: SafetensorsReader(MemorySource(d)))[0] in ("ok", "error")  # type: ignore[misc]
    assert outcome(lambda: BurnpackReader(MemorySource(to_bytes([], "burnpack"))))[0] == "ok"
    writer_outcome(lambda: st_mod.SafetensorsWriter([]))
    writer_outcome(lambda: burnpack.BurnpackWriter([]))
    pt = to_bytes([LazyTensor("w", dtypes.F32, (2,), 8, loader=lambda: bytes(8))], "pytorch")
    assert len(open_file(pt)) == 1


def widest_entries(n: int) -> list[LazyTensor]:
    """Tensors whose header entries take the most bytes each: 8-byte dims, offsets and param_ids."""
    dim = 2**40
    return [LazyTensor(f"t{i}.é", dtypes.F64, (dim, 0, dim, 0), 0, loader=bytes, param_id=2**64 - 1 - i)
            for i in range(n)]


def test_burnpack_header_bound_holds_for_the_widest_entries() -> None:
    tensors = widest_entries(50)
    w = burnpack.BurnpackWriter(tensors, metadata={"k" * 300: "v" * 70_000},
                                scalars={"s": Scalar("Int", -(2**63)), "f": Scalar("Float", 1e300)})
    assert w.header == burn_reference_cbor(w)
    assert w.header_bound([t.name for t in tensors]) >= len(w.header)


@pytest.mark.parametrize("over", [False, True])
def test_burnpack_writer_checks_the_header_limit_when_constructed(over: bool, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    """The header is encoded lazily, but a header over the limit still fails in the constructor, and one
    whose bound is over the limit but whose bytes are not is accepted."""
    tensors = widest_entries(40)
    size = len(burnpack.BurnpackWriter(tensors).header)
    monkeypatch.setattr(burnpack, "BURN_MAX_METADATA_SIZE", size - 1 if over else size)
    if over:
        with pytest.raises(PlanError, match="exceeds the"):
            burnpack.BurnpackWriter(tensors)
    else:
        assert burnpack.BurnpackWriter(tensors).header_bound([t.name for t in tensors]) > size
        assert len(burnpack.BurnpackWriter(tensors).header) == size


def test_burnpack_scanner_says_not_my_shape_and_nothing_else() -> None:
    """Every prefix and every one-byte change of Burn-shaped metadata either scans or raises
    `_NotMyShape`: the scanner has no blanket fallback, so any other exception would be a bug here."""
    meta = root(enc("a", d(param_id=7), "b" * 30, d("U8", [3], (256, 259)), "c", d("BF16", [2**40, 0], (512, 512))),
                3, enc("metadata"), enc({"k": "v"}))
    assert burnpack._tensor_map(meta) == (3, 10)
    count, pos = 3, 10
    names, _, starts, ends, pids, _ = burnpack._scan_descriptors(meta, pos, count)
    assert (names, starts, ends, pids) == ([b"a", b"b" * 30, b"c"], [0, 256, 512], [16, 259, 512], [7, None, None])
    variants = [meta[:cut] for cut in range(len(meta))]
    variants += [meta[:i] + bytes([b]) + meta[i + 1 :] for i in range(10, len(meta)) for b in (0x00, 0x18, 0x7F, 0xFF)]
    scanned = 0
    for data in variants:
        try:
            burnpack._scan_descriptors(data, pos, count)
            scanned += 1
        except burnpack._NotMyShape:
            pass
    assert scanned > 0 and scanned < len(variants)
