"""Casts and transposes: bit-exact against torch's `.to(dtype)`, lazy, chunked."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import numpy as np
import pytest

from migrator.core import casts, dtypes
from migrator.core.dtypes import DType
from migrator.core.errors import UnsupportedDTypeError
from migrator.core.tensor import LazyTensor, from_numpy

torch = pytest.importorskip("torch")

UINT = {"F64": np.uint64, "F32": np.uint32, "FLEX32": np.uint32, "F16": np.uint16, "BF16": np.uint16}
SINT = {np.uint64: np.int64, np.uint32: np.int32, np.uint16: np.int16}
TORCH = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
FLOATS = ("F64", "F32", "F16", "BF16")
KERNELS = casts.kernels


@pytest.fixture(autouse=True, params=["kernels", "portable-kernels", "numpy"])
def cast_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every test here runs with the compiled loops (F16C, and the portable C loops other CPUs take)
    when they are built, and with the numpy path."""
    if request.param == "numpy":
        monkeypatch.setattr(casts, "kernels", None)
        yield request.param
        return
    if KERNELS is None:
        pytest.skip("migrator.core._kernels not built (test_kernels_built_when_a_compiler_exists says why)")
    monkeypatch.setattr(casts, "kernels", KERNELS)
    KERNELS.use_f16c(request.param == "kernels")
    try:
        yield request.param
    finally:
        KERNELS.use_f16c(True)


def _tensor(bits: np.ndarray, dtype: str) -> LazyTensor:
    return from_numpy("t", bits.astype(UINT[dtype]), dtype=dtypes.BY_NAME[dtype])


def ours(bits: np.ndarray, src: str, dst: str) -> np.ndarray:
    out = casts.cast(_tensor(bits, src), dtypes.BY_NAME[dst])
    assert out.dtype is dtypes.BY_NAME[dst] and out.shape == bits.shape
    return np.frombuffer(out.data(), dtype=UINT[dst])


def reference(bits: np.ndarray, src: str, dst: str) -> np.ndarray:
    """torch's bits (sizes here are multiples of 64, so every element takes torch's vector path)."""
    assert bits.size % 64 == 0
    u = bits.astype(UINT[src])
    t = torch.from_numpy(u.view(SINT[UINT[src]])).view(getattr(torch, TORCH[src]))
    r = t.to(getattr(torch, TORCH[dst]))
    return r.view(getattr(torch, np.dtype(SINT[UINT[dst]]).name)).numpy().view(UINT[dst])


def assert_same(bits: np.ndarray, src: str, dst: str) -> None:
    got, want = ours(bits, src, dst), reference(bits, src, dst)
    bad = np.nonzero(got != want)[0]
    if bad.size:
        i = bad[:5]
        pytest.fail(f"{src}->{dst}: {bad.size} of {bits.size} differ, e.g. input "
                    f"{[hex(int(x)) for x in bits[i]]}: ours {[hex(int(x)) for x in got[i]]}, "
                    f"torch {[hex(int(x)) for x in want[i]]}")


def _pad64(bits: np.ndarray) -> np.ndarray:
    return np.resize(bits, -(-bits.size // 64) * 64)


# ---- inputs -------------------------------------------------------------------------------------

ALL16 = np.arange(1 << 16, dtype=np.uint16)


def f32_inputs() -> np.ndarray:
    """~4M f32 bit patterns: random, plus every special class the roundings care about."""
    rng = np.random.default_rng(1234)
    parts = [rng.integers(0, 1 << 32, size=1 << 21, dtype=np.uint64).astype(np.uint32)]
    sign = rng.integers(0, 2, size=1 << 18, dtype=np.uint32) << 31
    mant = rng.integers(0, 1 << 23, size=1 << 18, dtype=np.uint32)
    parts.append(sign | 0x7F80_0000 | mant)  # NaNs (quiet and signalling, any payload)
    parts.append(sign | mant)  # f32 subnormals
    exps = rng.integers(100, 145, size=1 << 18, dtype=np.uint32) << 23  # f16 range and its edges
    parts.append(sign | exps | mant)
    hi = rng.integers(0, 1 << 19, size=1 << 18, dtype=np.uint32) << 13
    parts.append(hi | 0x1000)  # f16 ties
    parts.append((hi | 0x1000) ^ 1)  # just off a tie
    hi16 = rng.integers(0, 1 << 16, size=1 << 18, dtype=np.uint32) << 16
    parts.append(hi16 | 0x8000)  # bf16 ties
    parts.append((hi16 | 0x8000) - 1)
    around = np.arange(-4096, 4096, dtype=np.int64)
    for centre in (0x477F_E000, 0x4780_0000, 0x3380_0000, 0x3300_0000, 0x3880_0000, 0x7F7F_FFFF, 0x7F80_0000, 0):
        parts.append(((centre + around) & 0x7FFF_FFFF).astype(np.uint32))  # f16 overflow, subnormal, inf
        parts.append(((centre + around) & 0x7FFF_FFFF).astype(np.uint32) | 0x8000_0000)
    parts.append(np.array([0, 0x8000_0000, 0x7F80_0000, 0xFF80_0000, 0x7FC0_0000, 0xFFC0_0000,
                           0x7F80_0001, 0xFFFF_FFFF, 0x7F7F_FFFF, 0xFF7F_FFFF, 1, 0x8000_0001], dtype=np.uint32))
    return _pad64(np.concatenate(parts))


def f64_inputs() -> np.ndarray:
    rng = np.random.default_rng(99)
    low = rng.integers(0, 1 << 63, size=1 << 19, dtype=np.uint64)
    parts = [low | (rng.integers(0, 2, size=1 << 19, dtype=np.uint64) << 63)]
    sign = rng.integers(0, 2, size=1 << 16, dtype=np.uint64) << 63
    mant = rng.integers(0, 1 << 52, size=1 << 16, dtype=np.uint64)
    parts.append(sign | np.uint64(0x7FF0_0000_0000_0000) | mant)  # NaN payloads
    parts.append(sign | mant)  # subnormals
    exps = rng.integers(1000, 1100, size=1 << 16, dtype=np.uint64) << 52  # around f16/f32 ranges
    parts.append(sign | exps | mant)
    # double-rounding cases: f64 values a few ulps away from f16/bf16/f32 ties
    f32 = f32_inputs()[: 1 << 18]
    f32 = f32[np.isfinite(f32.view(np.float32))]
    base = f32.view(np.float32).astype(np.float64).view(np.uint64)
    for delta in (1, 2, 1000, 1 << 20):
        parts.append(base + np.uint64(delta))
        parts.append(base - np.uint64(delta))
    parts.append(np.array([0, 1 << 63, 0x7FF0_0000_0000_0000, 0xFFF0_0000_0000_0000, 0x7FF8_0000_0000_0000,
                           0x7FF0_0000_0000_0001, 0x7FEF_FFFF_FFFF_FFFF, 1], dtype=np.uint64))
    return _pad64(np.concatenate(parts))


# ---- bit-exactness ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("src", "dst"), [(s, d) for s in ("F16", "BF16") for d in FLOATS if s != d])
def test_exhaustive_half_inputs_match_torch(src: str, dst: str) -> None:
    assert_same(ALL16, src, dst)


@pytest.mark.parametrize("dst", ["F64", "F16", "BF16"])
def test_f32_inputs_match_torch(dst: str) -> None:
    assert_same(f32_inputs(), "F32", dst)


@pytest.mark.parametrize("dst", ["F32", "F16", "BF16"])
def test_f64_inputs_match_torch(dst: str) -> None:
    assert_same(f64_inputs(), "F64", dst)


def test_f64_to_f16_rounds_twice_like_torch() -> None:
    # 1 + 2^-11 + 2^-40: direct rounding gives 1 + 2^-10, torch (through f32, then a tie) gives 1.0
    x = np.full(64, 1 + 2**-11 + 2**-40)
    assert ours(x.view(np.uint64), "F64", "F16")[0] == 0x3C00
    assert x.astype(np.float16).view(np.uint16)[0] == 0x3C01  # numpy's direct rounding differs


def test_nan_rules() -> None:
    f32 = np.array([0x7F80_0001, 0xFFA1_2345, 0x7FC0_0000], dtype=np.uint32)
    assert [hex(v) for v in ours(f32, "F32", "F16")] == ["0x7e00", "0xff09", "0x7e00"]
    assert set(ours(f32, "F32", "BF16").tolist()) == {0xFFFF}
    f16 = np.array([0x7C01, 0xFE55], dtype=np.uint16)
    assert [hex(v) for v in ours(f16, "F16", "F32")] == ["0x7fc02000", "0xffcaa000"]
    assert set(ours(f16, "F16", "BF16").tolist()) == {0x7FC0}


def test_values_specials() -> None:
    x = np.array([0.0, -0.0, np.inf, -np.inf, 65504.0, 65520.0, 1e-8, -3e38, 2.0**-24, 2.0**-25], dtype=np.float32)
    h = np.frombuffer(casts.cast(from_numpy("x", x), dtypes.F16).data(), dtype=np.float16)
    assert h.view(np.uint16).tolist() == [0, 0x8000, 0x7C00, 0xFC00, 0x7BFF, 0x7C00, 0, 0xFC00, 1, 0]


# ---- FLEX32, passthrough, errors -------------------------------------------------------------------------

def test_flex32_is_f32_bits() -> None:
    x = np.array([1.5, -2.25, np.nan, 3e38], dtype=np.float32)
    t = from_numpy("x", x)
    flex = casts.cast(t, dtypes.FLEX32)
    assert flex.dtype is dtypes.FLEX32 and bytes(flex.data()) == x.tobytes()
    back = casts.cast(flex, dtypes.F16)
    assert bytes(back.data()) == bytes(casts.cast(t, dtypes.F16).data())


def test_same_dtype_and_non_float_unchanged() -> None:
    f = from_numpy("f", np.arange(4, dtype=np.float32))
    i = from_numpy("i", np.arange(4, dtype=np.int64))
    assert casts.cast(f, dtypes.F32) is f
    assert casts.cast(i, dtypes.F16) is i
    assert casts.cast(from_numpy("b", np.array([True])), dtypes.F32).dtype is dtypes.BOOL


def test_non_float_target_rejected() -> None:
    with pytest.raises(UnsupportedDTypeError, match="float dtype"):
        casts.cast(from_numpy("f", np.arange(4, dtype=np.float32)), dtypes.I32)


@pytest.mark.parametrize("other", [dtypes.F8_E4M3, dtypes.F8_E5M2])
def test_fp8_refused_both_ways(other: DType) -> None:
    f = from_numpy("f", np.arange(4, dtype=np.float32))
    with pytest.raises(UnsupportedDTypeError, match="castable"):
        casts.cast(f, other)
    import ml_dtypes

    e = from_numpy("e", np.zeros(4, dtype=ml_dtypes.float8_e4m3fn))
    with pytest.raises(UnsupportedDTypeError, match="castable"):
        casts.cast(e, dtypes.F32)


def test_chunked_conversion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(casts, "CHUNK_ELEMENTS", 7)
    x = np.random.default_rng(3).standard_normal(100).astype(np.float32)
    got = np.frombuffer(casts.cast(from_numpy("x", x), dtypes.BF16).data(), dtype=np.uint16)
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(got, want)


def test_empty_and_scalar() -> None:
    e = casts.cast(from_numpy("e", np.zeros((0, 3), dtype=np.float32)), dtypes.F16)
    assert e.shape == (0, 3) and e.nbytes == 0 and bytes(e.data()) == b""
    s = casts.cast(from_numpy("s", np.array(2.5, dtype=np.float64)), dtypes.BF16)
    assert s.shape == () and np.frombuffer(s.data(), dtype=np.uint16)[0] == 0x4020


def test_cast_is_lazy_and_keeps_identity() -> None:
    calls = []
    arr = np.arange(6, dtype=np.float32)

    def loader() -> memoryview:
        calls.append(1)
        return memoryview(arr.view(np.uint8))

    t = LazyTensor("a.b", dtypes.F32, (2, 3), 24, loader, param_id=7, origin="file.pt")
    c = casts.cast(t, dtypes.F16)
    assert calls == [] and c.nbytes == 12 and c.span is None
    assert (c.name, c.param_id, c.origin) == ("a.b", 7, "file.pt")
    assert np.frombuffer(c.data(), dtype=np.float16).tolist() == [0, 1, 2, 3, 4, 5]
    assert calls == [1]


# ---- transpose --------------------------------------------------------------------------------------

def _values(t: LazyTensor) -> list:
    return t.numpy().reshape(-1).tolist()


def test_transpose_catalogue_values() -> None:
    f32 = casts.transpose2d(from_numpy("w", np.arange(1, 7, dtype=np.float32).reshape(2, 3)))
    assert f32.shape == (3, 2) and _values(f32) == [1, 4, 2, 5, 3, 6]
    i32 = casts.transpose2d(from_numpy("w", np.arange(1, 7, dtype=np.int32).reshape(2, 3)))
    assert i32.dtype is dtypes.I32 and _values(i32) == [1, 4, 2, 5, 3, 6]
    f64 = casts.transpose2d(from_numpy("w", np.array([[1.0, 2.0], [3.0, 4.0]])))
    assert _values(f64) == [1, 3, 2, 4]


@pytest.mark.parametrize("shape", [(1, 1), (1, 700), (700, 1), (129, 257), (300, 1000), (1024, 128), (0, 5)])
@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32, np.float64, np.complex64])
def test_transpose_matches_numpy(shape: tuple[int, int], dtype: type) -> None:
    a = (np.random.default_rng(5).standard_normal(shape) * 50).astype(dtype)
    t = casts.transpose2d(from_numpy("w", a))
    assert t.shape == (shape[1], shape[0])
    assert bytes(t.data()) == np.ascontiguousarray(a.T).tobytes()


def test_transpose_of_bf16_and_nan_bits_is_exact() -> None:
    bits = np.arange(1 << 16, dtype=np.uint16).reshape(256, 256)
    t = casts.transpose2d(from_numpy("w", bits, dtype=dtypes.BF16))
    assert t.dtype is dtypes.BF16
    assert np.array_equal(np.frombuffer(t.data(), dtype=np.uint16).reshape(256, 256), bits.T)


def test_transpose_is_lazy_and_rejects_bad_input() -> None:
    calls = []

    def loader() -> bytes:
        calls.append(1)
        return np.arange(6, dtype=np.float32).tobytes()

    t = casts.transpose2d(LazyTensor("fc.weight", dtypes.F32, (2, 3), 24, loader))
    assert calls == [] and t.shape == (3, 2)
    assert _values(t) == [0, 3, 1, 4, 2, 5] and calls == [1]
    with pytest.raises(ValueError, match="rank-2"):
        casts.transpose2d(from_numpy("v", np.zeros(3, dtype=np.float32)))
    with pytest.raises(UnsupportedDTypeError):
        casts.transpose2d(LazyTensor("q", dtypes.F4, (2, 2), 2, lambda: b"\0\0"))


# ---- compiled kernels and streaming -------------------------------------------------------------------

def test_kernels_built_when_a_compiler_exists(cast_path: str) -> None:
    """The numpy fallback is for machines without a C compiler, not a silent way to lose 5x speed."""
    if os.environ.get("MIGRATOR_NO_KERNELS"):
        pytest.skip("MIGRATOR_NO_KERNELS is set")
    if shutil.which("cc") or shutil.which("gcc"):
        assert KERNELS is not None, "a C compiler exists but migrator.core._kernels is missing: rerun the install"


@pytest.mark.parametrize(("rows", "cols"), [(300, 1000), (4100, 9), (9, 70000)])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_streamed_transpose_bands(monkeypatch: pytest.MonkeyPatch, rows: int, cols: int, dtype: type) -> None:
    monkeypatch.setattr(casts, "CHUNK_BYTES", 4096)  # many bands, each a column range of the source
    a = np.random.default_rng(8).integers(0, 255, size=(rows, cols)).astype(dtype)
    t = casts.transpose2d(from_numpy("w", a))
    assert t.chunks is not None
    streamed = b"".join(bytes(p) for p in t.chunks())
    assert streamed == np.ascontiguousarray(a.T).tobytes() == bytes(t.data())


@pytest.mark.parametrize("chunk", [8 << 20, 1000])  # one band, or many ragged ones
@pytest.mark.parametrize("dst", ["F16", "BF16", "F64"])
def test_cast_of_a_transpose_equals_transpose_of_the_cast(monkeypatch: pytest.MonkeyPatch, dst: str,
                                                          chunk: int) -> None:
    """Narrowing casts go before the transpose (F32 -> F16: one fused kernel pass); same bits as torch."""
    monkeypatch.setattr(casts, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(casts, "STREAMED_ABOVE", 0)  # small as it is, stream it
    bits = f32_inputs()[: 67 * 1001].reshape(67, 1001)
    x = from_numpy("w", bits, dtype=dtypes.F32)
    t = LazyTensor("renamed.w", x.dtype, x.shape, x.nbytes, x.loader, param_id=3, origin="f.pt")
    out = casts.cast(casts.transpose2d(t), dtypes.BY_NAME[dst])
    assert (out.name, out.param_id, out.origin, out.shape, out.dtype.name) == ("renamed.w", 3, "f.pt", (1001, 67), dst)
    want = np.ascontiguousarray(reference(_pad64(bits.reshape(-1)), "F32", dst)[:bits.size].reshape(67, 1001).T)
    assert np.array_equal(np.frombuffer(out.data(), dtype=UINT[dst]), want.reshape(-1))
    assert np.array_equal(np.frombuffer(b"".join(bytes(p) for p in out.chunks()), dtype=UINT[dst]),
                          want.reshape(-1))


def test_kernel_rejects_mismatched_buffers() -> None:
    if KERNELS is None:
        pytest.skip("migrator.core._kernels not built")
    with pytest.raises(ValueError, match="buffer sizes"):
        KERNELS.f32_to_f16(np.zeros(4, np.uint32), np.zeros(3, np.uint16))
    with pytest.raises(ValueError, match="does not match"):
        KERNELS.transpose(np.zeros(12, np.uint8), np.zeros(12, np.uint8), 3, 5, 1, 0, 5)
    with pytest.raises(ValueError, match="band"):
        KERNELS.transpose(np.zeros(12, np.uint8), np.zeros(12, np.uint8), 3, 4, 1, 2, 3)
    with pytest.raises(BufferError):  # read-only target
        KERNELS.f32_to_f16(np.zeros(4, np.uint32), bytes(8))


@pytest.mark.parametrize("n", [1, 7, 9, 1001])
def test_odd_lengths_take_the_tail_loops(n: int) -> None:
    """The vector loops work 8 at a time; the rest go through the scalar rules, checked here."""
    bits = np.concatenate([f32_inputs()[-n:], f32_inputs()[:64]])[:n]
    want = reference(_pad64(bits), "F32", "F16")[:n]
    assert np.array_equal(ours(bits, "F32", "F16"), want)
    h = ALL16[-n:]
    assert np.array_equal(ours(h, "F16", "F32"), reference(_pad64(h), "F16", "F32")[:n])


@pytest.mark.parametrize("small_read", [0, 1 << 20])  # mapped, or read with pread
@pytest.mark.parametrize("dst", [None, "F16", "BF16"])
def test_file_backed_transposes_read_or_map_the_same(tmp_path, monkeypatch: pytest.MonkeyPatch, small_read: int,
                                                     dst: str | None) -> None:
    from migrator import open_file, save

    monkeypatch.setattr(casts, "SMALL_READ", small_read)
    monkeypatch.setattr(casts, "STREAMED_ABOVE", 0)
    a = np.random.default_rng(4).standard_normal((33, 70)).astype(np.float32)
    save([from_numpy("w", a)], tmp_path / "m.safetensors")
    with open_file(tmp_path / "m.safetensors") as r:
        t = casts.transpose2d(r["w"])
        if dst is not None:
            t = casts.cast(t, dtypes.BY_NAME[dst])
        want = torch.from_numpy(a).t().contiguous()
        if dst is not None:
            want = want.to(getattr(torch, TORCH[dst]))
        want_bytes = want.view(torch.int16 if dst else torch.int32).numpy().tobytes()
        assert bytes(t.data()) == want_bytes
        assert b"".join(bytes(p) for p in t.chunks()) == want_bytes


def test_small_casts_have_no_chunks_and_large_ones_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small cast is written from its loader (no per-tensor chunks object); a large one streams."""
    monkeypatch.setattr(casts, "CHUNK_ELEMENTS", 1000)  # several pieces for the large one
    small = casts.cast(from_numpy("s", np.ones((16, 16), np.float32)), dtypes.BY_NAME["F16"])
    fused = casts.cast(casts.transpose2d(from_numpy("t", np.ones((16, 16), np.float32))), dtypes.BY_NAME["F16"])
    assert small.chunks is None
    if casts.kernels is not None:  # without them the narrowed tensor is transposed, which keeps its chunks
        assert fused.chunks is None
    assert bytes(fused.data()) == np.ones((16, 16), np.float16).tobytes()
    big = f32_inputs()[: casts.STREAMED_ABOVE // 2 + 8]
    large = casts.cast(from_numpy("l", big, dtype=dtypes.F32), dtypes.BY_NAME["F16"])
    assert large.chunks is not None
    pieces = [bytes(p) for p in large.chunks()]
    assert len(pieces) > 1
    want = reference(_pad64(big), "F32", "F16")[: big.size].tobytes()
    assert b"".join(pieces) == bytes(large.data()) == want
