"""SafeTensors reader and writer: library compatibility, header validation, laziness, atomic saves."""

from __future__ import annotations

import io
import json
import os
import re
import struct
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path
from typing import ClassVar

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load as st_load_bytes
from safetensors.numpy import save as st_save_numpy
from safetensors.numpy import save_file as st_save_file_numpy

from migrator.core import dtypes
from migrator.core.bytesource import FileSource, MemorySource
from migrator.core.dtypes import DType
from migrator.core.errors import (
    FormatError,
    LimitExceededError,
    PlanError,
    SameFileError,
    TargetExistsError,
    TensorNotFoundError,
    UnsupportedDTypeError,
)
from migrator.core.tensor import LazyTensor, from_numpy
from migrator.files.io import open_file, save, to_bytes
from migrator.formats.safetensors import LIBRARY_DTYPE_ORDER, SafetensorsReader, SafetensorsWriter
from tests.support.fixtures import REPO, fixture_file

RNG = np.random.default_rng(1234)
ST_DTYPES = [d for d in dtypes.ALL if d.safetensors]


# -- helpers ------------------------------------------------------------------------------------


def raw(name: str, dtype: DType, shape: tuple[int, ...], data: bytes | None = None) -> LazyTensor:
    """A tensor from raw bytes (random when not given): works for types numpy cannot view."""
    nbytes = dtype.nbytes(shape)
    assert nbytes is not None
    if data is None:
        data = RNG.bytes(nbytes)
    return LazyTensor(name, dtype, shape, len(data), loader=lambda: data)


def tensor_bytes(t: LazyTensor) -> bytes:
    return bytes(t.data())


def read_bytes(data: bytes, **options: object) -> SafetensorsReader:
    reader = open_file(data, **options)
    assert isinstance(reader, SafetensorsReader)
    return reader


def read_path(path: Path, **options: object) -> SafetensorsReader:
    reader = open_file(path, format="safetensors", **options)
    assert isinstance(reader, SafetensorsReader)
    return reader


def craft(header: object, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A SafeTensors file from a header (dict or literal JSON text) and a data section."""
    text = header if isinstance(header, str) else json.dumps(header)
    body = text.encode("utf-8")
    return struct.pack("<Q", len(body) if length is None else length) + body + data


def entry(dtype: str, shape: list[int], start: int, end: int) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [start, end]}


def assert_same_array(a: np.ndarray, b: np.ndarray) -> None:
    """Bit-exact equality (NaN payloads included) plus dtype and shape."""
    assert a.dtype == b.dtype
    assert a.shape == b.shape
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


# -- round trips --------------------------------------------------------------------------------


def _shape_for(d: DType) -> tuple[int, ...]:
    return (3, 4) if d.bits and d.bits >= 8 else (2, 4)  # 8 sub-byte values fill whole bytes


@pytest.mark.parametrize("dtype", ST_DTYPES, ids=lambda d: d.display)
def test_round_trip_every_dtype(dtype: DType) -> None:
    t = raw("t", dtype, _shape_for(dtype))
    back = read_bytes(to_bytes([t], "safetensors"))
    (r,) = back.tensors
    assert (r.name, r.dtype, r.shape, r.nbytes) == ("t", dtype, t.shape, t.nbytes)
    assert tensor_bytes(r) == tensor_bytes(t)
    if dtype.numpy_name:  # numpy view, NaN-aware via bytes
        assert_same_array(r.numpy(), t.numpy())


def test_round_trip_special_floats_are_bit_exact() -> None:
    # NaNs with payloads and signs: only a byte-level comparison tells them apart
    f32_bits = [0x7FC00000, 0xFFC00000, 0x7FC00001, 0xFFBADBAD, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001]
    f64_bits = [0x7FF8000000000001, 0xFFF0000000000000, 0x8000000000000000, 0x7FF4000000000000]
    arrays = {
        "f32": np.array(f32_bits, np.uint32).view(np.float32),
        "f64": np.array(f64_bits, np.uint64).view(np.float64),
        "f16": np.array([0x7E01, 0xFC00, 0x8000, 0x7C00], np.uint16).view(np.float16),
        "bf16": np.array([0x7FC1, 0xFF80, 0x8000, 0x0001], np.uint16).view(ml_dtypes.bfloat16),
        "e4m3": np.array([np.nan, 448, -448, 0.0, -0.0], ml_dtypes.float8_e4m3fn),
        "e5m2": np.array([np.nan, np.inf, -np.inf, 57344.0, -0.0], ml_dtypes.float8_e5m2),
    }
    back = read_bytes(to_bytes([from_numpy(k, v) for k, v in arrays.items()], "safetensors"))
    for name, arr in arrays.items():
        assert_same_array(back[name].numpy(), arr)


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (0, 0), (1,)])
def test_zero_dim_and_empty_tensors(shape: tuple[int, ...]) -> None:
    arr = RNG.standard_normal(shape).astype(np.float32) if shape else np.array(2.5, np.float32)
    tensors = [from_numpy("a", arr), from_numpy("b", np.zeros(shape, np.int16)), from_numpy("c", np.ones(1, np.uint8))]
    back = read_bytes(to_bytes(tensors, "safetensors"))
    for t in tensors:
        assert back[t.name].shape == shape or t.name == "c"
        assert_same_array(back[t.name].numpy(), t.numpy())


def test_burn_only_dtypes_are_written_like_burn() -> None:
    """Flex32 -> F32 (same bits); Bool(U8) / Bool(U32) -> U8 / U32, as Burn writes them."""
    flex = raw("flex", dtypes.FLEX32, (4,), np.arange(4, dtype="<f4").tobytes())
    b8 = raw("b8", dtypes.BOOL_U8, (3,), bytes([0, 1, 1]))
    b32 = raw("b32", dtypes.BOOL_U32, (2,), np.array([1, 0], "<u4").tobytes())
    back = read_bytes(to_bytes([flex, b8, b32], "safetensors"))
    assert (back["flex"].dtype, back["b8"].dtype, back["b32"].dtype) == (dtypes.F32, dtypes.U8, dtypes.U32)
    for t in (flex, b8, b32):
        assert tensor_bytes(back[t.name]) == tensor_bytes(t)


def test_large_tensor_round_trip_through_files(tmp_path: Path) -> None:
    big = RNG.integers(0, 2**32, size=(16 << 20,), dtype=np.uint32).view(np.float32)  # 64 MiB
    src = tmp_path / "big.safetensors"
    save([from_numpy("big", big), from_numpy("small", np.arange(5, dtype=np.int64))], src)
    assert src.stat().st_size > 64 << 20
    with read_path(src) as r:
        assert_same_array(r["big"].numpy(), big)
        # file -> file copies each tensor's span (in the kernel where possible); bytes must not change
        out = tmp_path / "copy.safetensors"
        save(r.tensors, out, metadata=r.metadata)
    assert out.read_bytes() == src.read_bytes()


# -- files written by the safetensors library ---------------------------------------------------


def test_reads_files_written_by_library_numpy(tmp_path: Path) -> None:
    arrays = {
        "f64": RNG.standard_normal((2, 3)),
        "f32": RNG.standard_normal((4,)).astype(np.float32),
        "f16": RNG.standard_normal((5, 1)).astype(np.float16),
        "bf16": RNG.standard_normal((3,)).astype(ml_dtypes.bfloat16),
        "e4m3": RNG.standard_normal((6,)).astype(ml_dtypes.float8_e4m3fn),
        "e5m2": RNG.standard_normal((6,)).astype(ml_dtypes.float8_e5m2),
        "i64": RNG.integers(-(2**63), 2**63 - 1, size=(3,), dtype=np.int64),
        "i8": np.array([-128, 0, 127], np.int8),
        "u16": np.array([0, 65535], np.uint16),
        "u64": np.array([2**64 - 1], np.uint64),
        "c64": (RNG.standard_normal(3) + 1j * RNG.standard_normal(3)).astype(np.complex64),
        "bool": np.array([[True, False], [False, True]]),
        "scalar": np.array(7, np.int32),
        "empty": np.zeros((0, 4), np.float32),
    }
    path = tmp_path / "lib.safetensors"
    st_save_file_numpy(arrays, str(path), metadata={"format": "np", "note": "héllo"})
    with read_path(path) as r:
        assert sorted(r.names()) == sorted(arrays)
        assert r.metadata == {"format": "np", "note": "héllo"}
        for name, arr in arrays.items():
            assert_same_array(r[name].numpy(), arr)
        # data order is the order of the offsets
        offsets = [t.span.offset for t in r.tensors if t.span is not None]
        assert offsets == sorted(offsets)


def _torch_bytes(t: object) -> bytes:
    import torch

    assert isinstance(t, torch.Tensor)
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _torch_tensors() -> dict[str, object]:
    import torch

    g = torch.Generator().manual_seed(0)
    def u8(*shape: int) -> torch.Tensor:
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)

    return {
        "bf16": torch.randn(3, 4, generator=g).to(torch.bfloat16),
        "f16": torch.randn(5, generator=g).half(),
        "f32": torch.randn(2, 2, 2, generator=g),
        "f64": torch.randn(3, generator=g).double(),
        "e4m3": u8(4, 2).view(torch.float8_e4m3fn),
        "e5m2": u8(7).view(torch.float8_e5m2),
        "e8m0": u8(3).view(torch.float8_e8m0fnu),
        "f4": u8(2, 3).view(torch.float4_e2m1fn_x2),
        "u16": torch.tensor([1, 65535], dtype=torch.uint16),
        "u32": torch.tensor([4_000_000_000], dtype=torch.uint32),
        "u64": torch.tensor([1, 2], dtype=torch.uint64),
        "i16": torch.tensor([-5, 5], dtype=torch.int16),
        "c64": torch.randn(3, dtype=torch.complex64, generator=g),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3, dtype=torch.bfloat16),
    }


def _torch_shape(t: object) -> tuple[int, ...]:
    import torch

    assert isinstance(t, torch.Tensor)
    shape = tuple(t.shape)
    if t.dtype == torch.float4_e2m1fn_x2:  # two F4 values per torch element
        shape = (*shape[:-1], 2 * shape[-1])
    return shape


_TORCH_TO_ST = {"bf16": "BF16", "f16": "F16", "f32": "F32", "f64": "F64", "e4m3": "F8_E4M3", "e5m2": "F8_E5M2",
                "e8m0": "F8_E8M0", "f4": "F4", "u16": "U16", "u32": "U32", "u64": "U64", "i16": "I16",
                "c64": "C64", "bool": "BOOL", "scalar": "F32", "empty": "BF16"}


def test_reads_files_written_by_library_torch(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from safetensors.torch import save_file

    tensors = _torch_tensors()
    path = tmp_path / "torch.safetensors"
    save_file(tensors, str(path), metadata={"k": "v"})  # type: ignore[arg-type]
    with read_path(path) as r:
        assert r.metadata == {"k": "v"}
        assert sorted(r.names()) == sorted(tensors)
        for name, t in tensors.items():
            ours = r[name]
            assert ours.dtype.safetensors == _TORCH_TO_ST[name]
            assert ours.shape == _torch_shape(t)
            assert tensor_bytes(ours) == _torch_bytes(t)


# -- files we write, read by the library --------------------------------------------------------


def test_our_files_load_in_safe_open_numpy(tmp_path: Path) -> None:
    arrays = {
        "w": RNG.standard_normal((4, 3)).astype(np.float32),
        "x": np.array([np.nan, np.inf, -0.0], np.float64),
        "h": RNG.standard_normal(5).astype(np.float16),
        "i": np.array([-1, 2**31 - 1], np.int32),
        "u": np.array([7], np.uint32),
        "c": np.array([1 + 2j], np.complex64),
        "b": np.array([True, False]),
        "s": np.array(1.5, np.float32),
        "e": np.zeros((2, 0), np.int8),
    }
    meta = {"format": "migrator", "ünïcode": "värde", "empty": ""}
    path = tmp_path / "ours.safetensors"
    save([from_numpy(k, v) for k, v in arrays.items()], path, metadata=meta)
    with safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == meta
        assert sorted(f.keys()) == sorted(arrays)
        for name, arr in arrays.items():
            assert_same_array(f.get_tensor(name), arr)


def test_our_files_load_in_safe_open_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    tensors = _torch_tensors()
    ours = []
    for name, t in tensors.items():
        dt = dtypes.BY_SAFETENSORS[_TORCH_TO_ST[name]]
        ours.append(raw(name, dt, _torch_shape(t), _torch_bytes(t)))
    path = tmp_path / "ours.safetensors"
    save(ours, path, metadata={"a": "1"})
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"a": "1"}
        for name, t in tensors.items():
            got = f.get_tensor(name)
            assert got.dtype == t.dtype and got.shape == t.shape  # type: ignore[attr-defined]
            assert _torch_bytes(got) == _torch_bytes(t)
            if t.dtype.is_floating_point and t.dtype.itemsize > 1:  # type: ignore[attr-defined]
                torch.testing.assert_close(got, t, rtol=0, atol=0, equal_nan=True)


# -- byte-identical output ----------------------------------------------------------------------

MIXES: dict[str, dict[str, np.ndarray]] = {
    "native": {
        "z.scalar": np.array(3, np.int64),
        "weight": RNG.standard_normal((3, 5)).astype(np.float32),
        "bias": RNG.standard_normal(5).astype(np.float32),
        "half": RNG.standard_normal((2, 2)).astype(np.float16),
        "double": RNG.standard_normal(3),
        "mask": np.array([True, False, True]),
        "bytes": np.arange(7, dtype=np.uint8),
        "i8": np.arange(-3, 3, dtype=np.int8),
        "u16": np.arange(4, dtype=np.uint16),
        "i16": np.arange(4, dtype=np.int16),
        "u32": np.arange(4, dtype=np.uint32),
        "i32": np.arange(4, dtype=np.int32),
        "u64": np.arange(4, dtype=np.uint64),
        "c64": np.ones(2, np.complex64),
        "empty": np.zeros((0,), np.float32),
        "empty2": np.zeros((4, 0), np.int64),
    },
    "ml_dtypes": {
        "bf": RNG.standard_normal(9).astype(ml_dtypes.bfloat16),
        "e4m3": RNG.standard_normal(3).astype(ml_dtypes.float8_e4m3fn),
        "e5m2": RNG.standard_normal(3).astype(ml_dtypes.float8_e5m2),
        "f32": np.zeros(1, np.float32),
        "a0": np.array(1, np.uint8),
    },
    "names": {
        'quote"back\\slash': np.zeros(1, np.float32),
        "ctrl\x01\x1f\n\t\r\b\f\x7f": np.zeros(1, np.float32),
        "slash/é/中文/😀": np.zeros(1, np.float32),
        "B": np.zeros(1, np.float32),
        "a": np.zeros(1, np.float32),
        "": np.zeros(2, np.float32),
        "ä": np.zeros(1, np.float32),
        "\uffff": np.zeros(1, np.float32),
        "\U00010000": np.zeros(1, np.float32),
    },
    "only_empty": {"x": np.zeros((0,), np.float64), "y": np.zeros((0, 2), np.float32)},
    "nothing": {},
}


@pytest.mark.parametrize("mix", list(MIXES))
def test_byte_identical_to_library_numpy(mix: str) -> None:
    arrays = MIXES[mix]
    given = [from_numpy(k, v) for k, v in reversed(arrays.items())]
    ours = to_bytes(given, "safetensors")
    assert ours == st_save_numpy(arrays)
    assert SafetensorsWriter(given).total_size == len(ours)


@pytest.mark.parametrize("name_len", range(1, 17))
def test_header_padding_matches_library(name_len: int) -> None:
    arrays = {"n" * name_len: np.zeros(3, np.int16), "m": np.array(1.0, np.float32)}
    ours = to_bytes([from_numpy(k, v) for k, v in arrays.items()], "safetensors")
    assert ours == st_save_numpy(arrays)
    (n,) = struct.unpack("<Q", ours[:8])
    assert n % 8 == 0


def test_byte_identical_with_single_key_metadata() -> None:
    arrays = {"a": np.ones(2, np.float32)}
    ours = to_bytes([from_numpy("a", arrays["a"])], "safetensors", metadata={"clé": "välue\n"})
    assert ours == st_save_numpy(arrays, metadata={"clé": "välue\n"})


def test_byte_identical_to_library_torch() -> None:
    pytest.importorskip("torch")
    from safetensors.torch import save as st_save_torch

    tensors = _torch_tensors()
    ours = [raw(k, dtypes.BY_SAFETENSORS[_TORCH_TO_ST[k]], _torch_shape(t), _torch_bytes(t))
            for k, t in tensors.items()]
    assert to_bytes(ours, "safetensors") == st_save_torch(tensors)  # type: ignore[arg-type]


def test_library_dtype_order_covers_every_safetensors_dtype() -> None:
    assert sorted(LIBRARY_DTYPE_ORDER) == sorted(d.safetensors for d in ST_DTYPES)
    ts = [raw(f"t_{d.display}", d, (8,)) for d in ST_DTYPES]
    r = read_bytes(to_bytes(ts, "safetensors"))
    assert [t.dtype.safetensors for t in r.tensors] == list(reversed(LIBRARY_DTYPE_ORDER))


def test_given_order_and_metadata_layout() -> None:
    ts = [from_numpy("z", np.zeros(1, np.uint8)), from_numpy("a", np.zeros(1, np.float64))]
    data = to_bytes(ts, "safetensors")
    assert read_bytes(data).names() == ["a", "z"]
    w = SafetensorsWriter(ts, order="given", metadata={"b": "2", "a": "1"})
    buf = io.BytesIO()
    w.write_to(buf)
    out = buf.getvalue()
    assert len(out) == w.total_size
    r = read_bytes(out)
    assert r.names() == ["z", "a"]
    assert r.metadata == {"a": "1", "b": "2"}
    (n,) = struct.unpack("<Q", out[:8])
    assert out[8 : 8 + n].startswith(b'{"__metadata__":{"a":"1","b":"2"},"z":')
    assert b"__metadata__" not in to_bytes(ts, "safetensors", metadata={})


def test_fixture_multi_layer_matches_safe_open() -> None:
    path = fixture_file("safetensors", "multi_layer.safetensors")
    with read_path(path) as r, safe_open(str(path), framework="numpy") as f:
        assert sorted(r.names()) == sorted(f.keys())
        assert r.metadata == (f.metadata() or {})
        for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            assert_same_array(r[name].numpy(), f.get_tensor(name))
        assert {t.name: t.shape for t in r.values()}["fc1.weight"] == (16, 256)
        buf = io.BytesIO()
        SafetensorsWriter(r.tensors, metadata=r.metadata).write_to(buf)
    assert buf.getvalue() == path.read_bytes()  # re-writing a library file reproduces it


# -- header validation --------------------------------------------------------------------------

U8_1 = entry("U8", [1], 0, 1)

BAD_HEADERS: list[tuple[str, bytes, type[Exception], str, str | None]] = [
    ("short file", b"\x01\x00\x00", FormatError, "too short", None),
    ("over limit", craft("{}", length=100_000_001), LimitExceededError, "at most 100000000", None),
    ("past end", craft("{}", length=50), FormatError, "only 2 bytes follow", None),
    ("not utf8", craft("{}")[:8] + b"{\xff", FormatError, "not UTF-8", None),
    ("bad json", craft('{"a": '), FormatError, "not valid JSON", None),
    ("trailing", craft('{}x'), FormatError, "not valid JSON", None),
    ("nan", craft('{"__metadata__": NaN}'), FormatError, "not valid JSON", None),
    ("array", craft("[]"), FormatError, "must be a JSON object", None),
    ("string", craft('"x"'), FormatError, "must be a JSON object", None),
    ("dup tensor", craft(f'{{"w": {json.dumps(U8_1)}, "w": {json.dumps(entry("U8", [1], 1, 2))}}}', b"ab"),
     FormatError, "duplicate tensor name", "w"),
    ("dup metadata", craft('{"__metadata__": {}, "__metadata__": {}}'), FormatError, "repeats __metadata__", None),
    ("metadata list", craft({"__metadata__": ["a"]}), FormatError, "__metadata__ must be an object", None),
    ("metadata int", craft({"__metadata__": {"k": 1}}), FormatError, "value for 'k' must be a string", None),
    ("metadata dup", craft('{"__metadata__": {"k": "a", "k": "b"}}'), FormatError, "repeats the key 'k'", None),
    ("entry not object", craft({"w": [1]}), FormatError, "must be an object", "w"),
    ("missing dtype", craft({"w": {"shape": [1], "data_offsets": [0, 1]}}, b"a"), FormatError, "lacks dtype", "w"),
    ("missing offsets", craft({"w": {"dtype": "U8", "shape": [1]}}, b"a"), FormatError, "lacks data_offsets", "w"),
    ("unknown field", craft({"w": {**U8_1, "extra": 1}}, b"a"), FormatError, "unknown field(s) extra", "w"),
    ("dup field", craft('{"w": {"dtype": "U8", "dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', b"a"),
     FormatError, "repeats the field 'dtype'", "w"),
    ("dtype int", craft({"w": {**U8_1, "dtype": 3}}, b"a"), FormatError, "dtype must be a string", "w"),
    ("dtype unknown", craft({"w": {**U8_1, "dtype": "F128"}}, b"a"), UnsupportedDTypeError,
     "unknown SafeTensors dtype 'F128'", "w"),
    ("dtype lowercase", craft({"w": {**U8_1, "dtype": "f32"}}, b"a"), UnsupportedDTypeError, "'f32'", "w"),
    ("shape not list", craft({"w": {**U8_1, "shape": 1}}, b"a"), FormatError, "shape must be a list", "w"),
    ("shape negative", craft({"w": {**U8_1, "shape": [-1]}}, b"a"), FormatError, "non-negative integers", "w"),
    ("shape float", craft({"w": {**U8_1, "shape": [1.0]}}, b"a"), FormatError, "non-negative integers", "w"),
    ("shape bool", craft({"w": {**U8_1, "shape": [True]}}, b"a"), FormatError, "non-negative integers", "w"),
    ("shape huge dim", craft({"w": entry("U8", [0, 2**64], 0, 0)}), LimitExceededError, "beyond 64 bits", "w"),
    ("shape overflow", craft({"w": entry("F64", [2**31, 2**31, 8], 0, 0)}), LimitExceededError, "overflows", "w"),
    ("offsets short", craft({"w": {**U8_1, "data_offsets": [0]}}, b"a"), FormatError, "[start, end]", "w"),
    ("offsets negative", craft({"w": {**U8_1, "data_offsets": [-1, 0]}}, b"a"), FormatError, "[start, end]", "w"),
    ("offsets string", craft({"w": {**U8_1, "data_offsets": "0,1"}}, b"a"), FormatError, "[start, end]", "w"),
    ("end before start", craft({"w": entry("U8", [0], 1, 0)}, b"a"), FormatError, "end before", "w"),
    ("gap at start", craft({"w": entry("U8", [1], 1, 2)}, b"ab"), FormatError, "leave a gap", "w"),
    ("gap between", craft({"a": U8_1, "b": entry("U8", [1], 2, 3)}, b"abc"), FormatError, "leave a gap", "b"),
    ("overlap", craft({"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 1, 3)}, b"abc"), FormatError,
     "overlap", "b"),
    ("size mismatch", craft({"w": entry("F32", [2], 0, 4)}, b"abcd"), FormatError, "cover 4 bytes", "w"),
    ("sub-byte", craft({"w": entry("F4", [3], 0, 1)}, b"a"), FormatError, "not a whole number of bytes", "w"),
    ("f6 sub-byte", craft({"w": entry("F6_E3M2", [2], 0, 1)}, b"a"), FormatError, "12 bits", "w"),
    ("data too long", craft({"w": U8_1}, b"ab"), FormatError, "data section has 2 bytes but the tensors cover 1",
     None),
    ("data too short", craft({"w": entry("U8", [3], 0, 3)}, b"ab"), FormatError, "run past the end", "w"),
    ("no tensors but data", craft("{}", b"x"), FormatError, "the tensors cover 0", None),
    ("deep nesting", craft('{"__metadata__": ' + "[" * 100_000 + "]" * 100_000 + "}"), FormatError, "", None),
    ("huge int", craft('{"w": {"dtype": "U8", "shape": [' + "9" * 5000 + '], "data_offsets": [0, 1]}}', b"a"),
     FormatError, "", None),
]


@pytest.mark.parametrize(("case", "data", "error", "message", "tensor"), BAD_HEADERS,
                         ids=[c[0] for c in BAD_HEADERS])
def test_bad_header_is_a_typed_error(tmp_path: Path, case: str, data: bytes, error: type[Exception],
                                     message: str, tensor: str | None) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(error) as info:
        read_path(path)
    text = str(info.value)
    assert str(path) in text
    assert message in text
    if tensor is not None:
        assert f"tensor '{tensor}'" in text
        assert info.value.tensor == tensor  # type: ignore[attr-defined]


def test_huge_header_length_fails_without_allocating() -> None:
    data = struct.pack("<Q", 2**63) + b"{}" + b"\0" * 64
    tracemalloc.start()
    try:
        with pytest.raises(LimitExceededError, match="9223372036854775808"):
            read_bytes(data, format="safetensors")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    with pytest.raises(LimitExceededError):
        read_bytes(struct.pack("<Q", 2**64 - 1) + b"{}", format="safetensors")


def test_header_length_is_checked_before_reading() -> None:
    class Counting(MemorySource):
        requested: ClassVar[list[tuple[int, int]]] = []

        def read(self, offset: int, length: int, what: str = "read") -> bytes:
            self.requested.append((offset, length))
            return super().read(offset, length, what)

    src = Counting(craft("{}", length=10_000_000) + b"{}")
    with pytest.raises(FormatError, match="only 4 bytes follow"):
        SafetensorsReader(src)
    assert src.requested == [(0, 8)]


def test_accepted_header_variants() -> None:
    # What the library accepts: null metadata, whitespace around the object, out-of-order entries.
    b_entry, a_entry = json.dumps(entry("U8", [1], 1, 2)), json.dumps(U8_1)
    text = f' {{"__metadata__": null, "b": {b_entry}, "a": {a_entry}}} '
    r = read_bytes(craft(text, b"xy"), format="safetensors")
    assert r.metadata == {}
    assert r.names() == ["a", "b"]  # data order, not header order
    assert bytes(r["b"].data()) == b"y"
    assert read_bytes(craft("{}"), format="safetensors").tensors == []
    only_meta = read_bytes(craft({"__metadata__": {"k": "v"}}), format="safetensors")
    assert (only_meta.tensors, only_meta.metadata) == ([], {"k": "v"})
    empties = read_bytes(craft({"e2": entry("F32", [0], 0, 0), "e1": entry("I8", [2, 0], 0, 0), "x": U8_1}, b"q"))
    assert empties.names() == ["e2", "e1", "x"]


def test_extra_reports_header_size() -> None:
    data = to_bytes([from_numpy("a", np.zeros(3, np.float32))], "safetensors")
    (n,) = struct.unpack("<Q", data[:8])
    r = read_bytes(data)
    assert r.extra() == {"header_size": n, "data_start": 8 + n}
    assert r.scalars == {}
    assert r.format == "safetensors"


# -- laziness and memory ------------------------------------------------------------------------


def test_reader_is_lazy_and_zero_copy(tmp_path: Path) -> None:
    class Recording(MemorySource):
        def __init__(self, data: bytes) -> None:
            super().__init__(data)
            self.views: list[tuple[int, int]] = []

        def view(self, offset: int, length: int) -> memoryview:
            self.views.append((offset, length))
            return super().view(offset, length)

        def read(self, offset: int, length: int, what: str = "read") -> bytes:
            self.views.append((offset, length))
            return bytes(super().view(offset, length))

    data = to_bytes([from_numpy("a", np.arange(1000, dtype=np.float32)), from_numpy("b", np.ones(10))],
                    "safetensors")
    (n,) = struct.unpack("<Q", data[:8])
    src = Recording(data)
    r = SafetensorsReader(src)
    assert all(off + length <= 8 + n for off, length in src.views)  # only the header was read
    view = r["a"].data()
    assert isinstance(view, memoryview) and view.readonly
    assert src.views[-1] == (r["a"].span.offset if r["a"].span else 8 + n + 80, 4000)

    path = tmp_path / "f.safetensors"
    path.write_bytes(data)
    with read_path(path) as fr:
        spans = [t.span for t in fr.values()]
        assert all(s is not None for s in spans)
        assert [(s.offset, s.length) for s in spans if s] == [(8 + n, 80), (8 + n + 80, 4000)]
        arr = fr["a"].numpy()
        assert not arr.flags.writeable and not arr.flags.owndata  # a view of the mapping


MEMORY_SCRIPT = textwrap.dedent("""
    import hashlib, resource, sys
    sys.path.insert(0, sys.argv[2])
    from migrator.files.io import open_file

    def peak_kib():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    reader = open_file(sys.argv[1], format="safetensors")
    before = peak_kib()
    digest = hashlib.sha256()
    for t in reader.tensors:
        data = t.data()
        digest.update(data)  # touches every page of the tensor
        data.release()
        del data
    print(peak_kib() - before, digest.hexdigest())
""")


@pytest.mark.slow
def test_reading_tensor_by_tensor_keeps_memory_bounded(tmp_path: Path) -> None:
    import hashlib

    chunk = 4 << 20
    count = 50  # 200 MiB in all
    pattern = np.frombuffer(RNG.bytes(chunk), np.uint8)

    def make(i: int) -> LazyTensor:
        return LazyTensor(f"layer{i:03d}.weight", dtypes.F32, (chunk // 4,), chunk,
                          loader=lambda: (pattern + np.uint8(i)).data)

    path = tmp_path / "big.safetensors"
    save([make(i) for i in range(count)], path)
    expected = hashlib.sha256()
    for i in range(count):
        expected.update((pattern + np.uint8(i)).tobytes())
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(path), str(REPO)],
                         capture_output=True, text=True, check=True, timeout=300)
    growth_kib, digest = out.stdout.split()
    assert digest == expected.hexdigest()
    file_kib = path.stat().st_size // 1024
    assert int(growth_kib) < file_kib // 8, f"peak RSS grew {growth_kib} KiB reading a {file_kib} KiB file"


# -- in-memory buffers and the format registry -------------------------------------------------


def test_open_file_and_to_bytes_in_memory() -> None:
    tensors = [from_numpy("x", np.arange(6, dtype=np.int32).reshape(2, 3))]
    data = to_bytes(tensors, "safetensors", metadata={"m": "1"})
    for buf in (data, bytearray(data), memoryview(data)):
        with open_file(buf) as r:
            assert isinstance(r, SafetensorsReader)
            assert r.metadata == {"m": "1"}
            assert r.path is None
            assert_same_array(r["x"].numpy(), tensors[0].numpy())
    with pytest.raises(TensorNotFoundError, match="tensor 'nope'"):
        read_bytes(data)["nope"]


def test_open_file_auto_detects_paths(tmp_path: Path) -> None:
    pytest.importorskip("migrator.formats.burnpack")  # open_file(path) consults burnpack's path rules
    path = tmp_path / "weights.safetensors"
    save([from_numpy("x", np.ones(2, np.float32))], path)
    with open_file(path) as r:
        assert isinstance(r, SafetensorsReader)
        assert r.path == str(path)


def test_top_level_key() -> None:
    data = to_bytes([from_numpy("model.a", np.zeros(1, np.float32)), from_numpy("model.b.c", np.ones(2, np.int8)),
                     from_numpy("optim.a", np.zeros(1, np.float32)), from_numpy("model", np.zeros(1))],
                    "safetensors")
    r = read_bytes(data, top_level_key="model")
    assert sorted(r.names()) == ["a", "b.c"]
    assert_same_array(r["b.c"].numpy(), np.ones(2, np.int8))
    with pytest.raises(TensorNotFoundError, match=r"no tensor is named 'missing\.\*'"):
        read_bytes(data, top_level_key="missing")
    with pytest.raises(ValueError, match="empty"):
        read_bytes(data, top_level_key="")
    with pytest.raises(TypeError):
        read_bytes(data, top_level_key=3)
    with pytest.raises(TypeError):
        read_bytes(data, no_such_option=True)


# -- writer planning errors ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [dtypes.F8_E4M3FNUZ, dtypes.F8_E5M2FNUZ, dtypes.qfloat(b"\xa0")],
                         ids=lambda d: d.name)
def test_writer_refuses_dtypes_without_safetensors_name(dtype: DType) -> None:
    t = LazyTensor("bad.weight", dtype, (4,), 4, loader=lambda: bytes(4))
    with pytest.raises(UnsupportedDTypeError, match=r"tensor 'bad\.weight'"):
        SafetensorsWriter([from_numpy("ok", np.zeros(1)), t])


def test_writer_planning_errors() -> None:
    ok = from_numpy("a", np.zeros(2, np.float32))
    with pytest.raises(PlanError, match="Duplicate tensor name 'a'"):
        SafetensorsWriter([ok, from_numpy("a", np.zeros(1, np.int8))])
    lying = LazyTensor("w", dtypes.F32, (2, 3), 20, loader=lambda: bytes(20))
    with pytest.raises(PlanError, match=r"tensor 'w'.*declares 20 bytes .* need 24"):
        SafetensorsWriter([lying])
    with pytest.raises(PlanError, match="not a whole number of bytes"):
        SafetensorsWriter([LazyTensor("f4", dtypes.F4, (3,), 2, loader=lambda: bytes(2))])
    with pytest.raises(PlanError, match="strings to strings"):
        SafetensorsWriter([ok], metadata={"epoch": 3})  # type: ignore[dict-item]
    with pytest.raises(PlanError, match="strings to strings"):
        SafetensorsWriter([ok], metadata={1: "x"})  # type: ignore[dict-item]
    with pytest.raises(PlanError, match="UTF-8"):
        SafetensorsWriter([from_numpy("bad\udc80", np.zeros(1))])
    with pytest.raises(PlanError, match="reserved"):
        SafetensorsWriter([from_numpy("__metadata__", np.zeros(1))])
    with pytest.raises(PlanError, match="scalars"):
        from migrator.core.scalars import Scalar

        SafetensorsWriter([ok], scalars={"epoch": Scalar.of(3)})
    with pytest.raises(PlanError, match="order"):
        SafetensorsWriter([ok], order="sorted")  # type: ignore[arg-type]


def test_short_writes_are_completed() -> None:
    class Trickle(io.RawIOBase):
        def __init__(self) -> None:
            self.buf = bytearray()

        def writable(self) -> bool:
            return True

        def write(self, b: object) -> int:
            mv = memoryview(b).cast("B")  # type: ignore[arg-type]
            self.buf += mv[:3]
            return min(3, len(mv))

    ts = [from_numpy("a", np.arange(10, dtype=np.float32)), from_numpy("b", np.arange(3, dtype=np.int64))]
    sink = Trickle()
    SafetensorsWriter(ts).write_to(sink)  # type: ignore[arg-type]
    assert bytes(sink.buf) == to_bytes(ts, "safetensors")


# -- atomic saves -------------------------------------------------------------------------------


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".migrator-" in p.name)


def test_save_refuses_to_overwrite_and_is_atomic(tmp_path: Path) -> None:
    target = tmp_path / "out.safetensors"
    target.write_bytes(b"precious")
    ts = [from_numpy("a", np.ones(3, np.float32))]
    with pytest.raises(TargetExistsError, match="already exists"):
        save(ts, target)
    assert target.read_bytes() == b"precious"

    def boom() -> bytes:
        raise RuntimeError("producer failed")

    failing = [*ts, LazyTensor("b", dtypes.U8, (2,), 2, loader=boom)]
    with pytest.raises(RuntimeError, match="producer failed"):
        save(failing, target, overwrite=True)
    assert target.read_bytes() == b"precious"
    assert _leftovers(tmp_path) == []

    with pytest.raises(PlanError):  # planning fails before a file is created
        save([*ts, *ts], tmp_path / "never.safetensors")
    assert not (tmp_path / "never.safetensors").exists()

    assert save(ts, target, overwrite=True) == str(target)
    assert target.read_bytes() == to_bytes(ts, "safetensors")
    fresh = tmp_path / "fresh.st"
    save(ts, fresh)
    assert fresh.read_bytes() == to_bytes(ts, "safetensors")
    assert _leftovers(tmp_path) == []


def test_save_refuses_to_write_onto_its_source(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save([from_numpy("a", np.ones(3, np.float32))], path)
    before = path.read_bytes()
    with read_path(path) as r, pytest.raises(SameFileError, match="being read"):
        save(r.tensors, path, overwrite=True, protect=[path])
    assert path.read_bytes() == before
    assert os.path.getsize(path) == len(before)


def test_reader_context_closes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    save([from_numpy("a", np.ones(3, np.float32))], path)
    with read_path(path) as r:
        assert r.label == str(path)
        assert r.path == str(path)
        source = r.source
        assert isinstance(source, FileSource) and source.fd >= 0
    assert source.fd == -1


# -- lone surrogates (`\ud800`): the library refuses them, and so does the reader ------------------

_ONE = {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}


@pytest.mark.parametrize(("header", "where"), [
    ({"a\ud800": _ONE}, "a tensor name"),
    ({"x": _ONE, "\udfffb": {**_ONE, "data_offsets": [1, 2]}}, "a tensor name"),
    ({"__metadata__": {"k\udc00": "v"}, "a": _ONE}, "__metadata__ key"),
    ({"__metadata__": {"k": "v\ud800"}, "a": _ONE}, "__metadata__ value of 'k'"),
    ({"__metadata__": {"k": "\udbff"}, "a": _ONE}, "__metadata__ value of 'k'"),
    ({"a": {**_ONE, "dtype": "U8\ud800"}}, "the entry of tensor 'a'"),
])
def test_lone_surrogate_escapes_are_refused_like_the_library(header: dict, where: str) -> None:
    data = craft(header, bytes(2 if len(header) - ("__metadata__" in header) > 1 else 1))
    with pytest.raises(Exception, match="Error while deserializing"):  # the library's own refusal
        st_load_bytes(data)
    with pytest.raises(FormatError, match=f"{re.escape(where)} holds a lone surrogate escape") as e:
        read_bytes(data)
    assert e.value.file is not None and "\\u" in str(e.value)  # printable: the escape, not the character
    str(e.value).encode("utf-8")


def test_surrogate_pairs_are_text_and_read() -> None:
    data = craft({"__metadata__": {"k": "\U0001f600"}, "\U0001f600": _ONE}, b"\x07")  # json.dumps escapes them
    assert b"\\ud83d\\ude00" in data
    r = read_bytes(data)
    assert r.metadata == {"k": "\U0001f600"} and r.names() == ["\U0001f600"]
    assert st_load_bytes(data)["\U0001f600"].tolist() == [7]
