"""core/dequant.py's band loops, compiled (kernels/dequant.c) and numpy, against the references bit for bit:
compressed-tensors 0.20 (its FP8 block dequantizer, its `dequantize`, its pack-quantized decompressor),
transformers' MXFP4 dequantization (`convert_moe_packed_tensors`), torch's FP8/E8M0 casts and MLX's
`dequantize` (CPU). Every test runs both paths; fixed seeds, edge codes (NaN, inf, subnormals)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from migrator.core import dequant as dq
from migrator.core.errors import FormatError

TORCH = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


@pytest.fixture(params=["kernel", "numpy"])
def use_kernels(request: pytest.FixtureRequest) -> Iterator[bool]:
    if request.param == "kernel" and dq.kernels() is None:
        pytest.skip("migrator.core._kernels not built with dequant_band")
    yield request.param == "kernel"


def bits_of(t: torch.Tensor) -> np.ndarray:
    """A float tensor's bit patterns as an unsigned numpy array."""
    if t.dtype == torch.float32:
        return t.contiguous().view(torch.int32).numpy().view(np.uint32)
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def same(got: np.ndarray, want: np.ndarray, dtype: str) -> bool:
    """Bit equality, except the bits of NaNs rounded to BF16 on the way: torch gives 0xFFFF in its vector
    loops and 0x7FC0 in their scalar tails (which elements fall there depends on how it splits the
    tensor); dequant.py follows the vector rule for every element (as casts.py does). NaNs must still
    be NaNs at the same places."""
    f = {"F32": np.float32, "BF16": None, "F16": np.float16}[dtype]
    as_float = (lambda a: (a.astype(np.uint32) << 16).view(np.float32)) if f is None else (lambda a: a.view(f))
    nan = np.isnan(as_float(want))
    return bool(np.array_equal(nan, np.isnan(as_float(got))) and np.array_equal(got[~nan], want[~nan]))


def torch_bits(raw: np.ndarray, dtype: str) -> torch.Tensor:
    """Scale bytes of `dtype` (numpy) -> the torch tensor of those values."""
    if dtype == "F32":
        return torch.from_numpy(raw.view(np.float32).copy())
    return torch.from_numpy(raw.view(np.int16).copy()).view(TORCH[dtype])


def scales_of(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Positive scales spread over many binades, as `dtype`'s bytes (uint16 / float32)."""
    s = torch.from_numpy(((rng.random(shape) + 0.1) * 2.0 ** rng.integers(-14, 3, shape)).astype(np.float32))
    return bits_of(s.to(TORCH[dtype])).copy() if dtype != "F32" else s.numpy().copy()


# -- FP8 --------------------------------------------------------------------------------------------

def fp8_codes(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Random FP8 bytes with every code (NaN, inf, subnormals, -0) present."""
    c = rng.integers(0, 256, size=shape, dtype=np.uint8)
    c.reshape(-1)[:256] = np.arange(256, dtype=np.uint8)
    return c


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_widening_equals_torch(use_kernels: bool, fmt: str) -> None:
    """Scale 1 per tensor, to F32: the codes alone, every one of the 256, NaN payloads included."""
    codes = np.arange(256, dtype=np.uint8).reshape(1, 256)
    tdt = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
    want = bits_of(torch.from_numpy(codes).view(tdt).to(torch.float32))
    got = dq.dequantize_band(codes, dq.Codes(fmt, 8), rows=1, row_bytes=256, cols=256,
                             scales=np.ones((1, 1), np.float32), scale_dtype="F32", block=(1, 256), mid="F32",
                             out="F32", use_kernels=use_kernels)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("out", ["BF16", "F16", "F32"])
@pytest.mark.parametrize("shape,block", [((300, 260), (128, 128)), ((256, 384), (128, 128)), ((37, 50), (16, 8))])
def test_fp8_block_equals_compressed_tensors_block_dequantizer(use_kernels: bool, out: str, shape: tuple[int, int],
                                                               block: tuple[int, int]) -> None:
    """DeepSeek-style F8_E4M3 weights x float32 `weight_scale_inv` per block (edges cropped), through
    compressed-tensors' FP8BlockDequantizer (float32 product, then the cast)."""
    from compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer import FP8BlockDequantizer

    rng = np.random.default_rng(sum(shape) + block[0])
    codes = fp8_codes(rng, shape)
    grid = (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    sc = scales_of(rng, grid, "F32")
    oracle = FP8BlockDequantizer(weight_block_size=block, dtype=TORCH[out])
    fp8 = torch.from_numpy(codes).view(torch.float8_e4m3fn)
    want = bits_of(oracle._create_dequantized_weight(fp8, torch.from_numpy(sc)))
    got = dq.dequantize_band(codes, dq.E4M3, rows=shape[0], row_bytes=shape[1], cols=shape[1], scales=sc,
                             scale_dtype="F32", block=block, mid="F32", out=out, use_kernels=use_kernels)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("strategy", ["tensor", "channel", "block"])
@pytest.mark.parametrize("scale_dtype", ["BF16", "F16", "F32"])
@pytest.mark.parametrize("out", ["BF16", "F16", "F32"])
def test_fp8_strategies_equal_compressed_tensors_dequantize(use_kernels: bool, strategy: str, scale_dtype: str,
                                                            out: str) -> None:
    """compressed-tensors float-quantized weights: its `dequantize` computes in the scale's dtype, then casts."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    rng = np.random.default_rng(len(strategy) * 7 + len(scale_dtype) + len(out))
    rows, cols = 70, 200
    codes = fp8_codes(rng, (rows, cols))
    args = {"tensor": dict(strategy="tensor"), "channel": dict(strategy="channel"),
            "block": dict(strategy="block", block_structure=[32, 64])}[strategy]
    grid, block = {"tensor": ((1, 1), (rows, cols)), "channel": ((rows, 1), (1, cols)),
                   "block": ((3, 4), (32, 64))}[strategy]
    sc = scales_of(rng, grid, scale_dtype)
    st = torch_bits(sc, scale_dtype)
    qargs = QuantizationArgs(num_bits=8, type="float", symmetric=True, **args)
    fp8 = torch.from_numpy(codes).view(torch.float8_e4m3fn)
    want = bits_of(dequantize(fp8, st.reshape(-1) if strategy == "tensor" else st, args=qargs).to(TORCH[out]))
    got = dq.dequantize_band(codes, dq.E4M3, rows=rows, row_bytes=cols, cols=cols, scales=sc, scale_dtype=scale_dtype,
                             block=block, mid=scale_dtype, out=out, use_kernels=use_kernels)
    assert same(got, want, out) if scale_dtype == "BF16" else np.array_equal(got, want)


def test_bands_and_column_windows_equal_the_whole(use_kernels: bool) -> None:
    """Any band of rows (row0 anywhere inside a block) and any window of columns equals that slice of
    the whole result; the band gets the scale rows it touches only."""
    rng = np.random.default_rng(5)
    rows, cols, br, bc = 200, 150, 32, 16
    codes = fp8_codes(rng, (rows, cols))
    sc = scales_of(rng, (-(-rows // br), -(-cols // bc)), "BF16")
    whole = dq.dequantize_band(codes, dq.E5M2, rows=rows, row_bytes=cols, cols=cols, scales=sc, scale_dtype="BF16",
                               block=(br, bc), mid="BF16", out="F16", use_kernels=use_kernels)
    for _ in range(25):
        r0 = int(rng.integers(0, rows))
        n = int(rng.integers(1, rows - r0 + 1))
        c0 = int(rng.integers(0, cols))
        w = int(rng.integers(1, cols - c0 + 1))
        band = np.ascontiguousarray(codes[r0:r0 + n])
        got = dq.dequantize_band(band, dq.E5M2, rows=n, row_bytes=cols, col0=c0, cols=w, row0=r0,
                                 scales=sc[r0 // br:(r0 + n - 1) // br + 1], scale_dtype="BF16", block=(br, bc),
                                 mid="BF16", out="F16", use_kernels=use_kernels)
        assert np.array_equal(got, whole[r0:r0 + n, c0:c0 + w]), (r0, n, c0, w)


# -- E8M0 and MXFP4 ---------------------------------------------------------------------------------

def test_e8m0_decode_equals_torch_and_refuses_255(use_kernels: bool) -> None:
    e = np.arange(255, dtype=np.uint8)
    want = bits_of(torch.from_numpy(e).view(torch.float8_e8m0fnu).to(torch.float32))
    assert np.array_equal(dq.decode_e8m0(e, use_kernels=use_kernels).view(np.uint32), want)
    with pytest.raises(FormatError, match="E8M0 scale 3 is 255") as err:
        dq.decode_e8m0(np.array([1, 2, 3, 255, 255], np.uint8), name="model.w_scales", use_kernels=use_kernels)
    assert err.value.tensor == "model.w_scales"


@pytest.mark.parametrize("out", ["BF16", "F32", "F16"])
def test_mxfp4_equals_transformers(use_kernels: bool, out: str) -> None:
    """gpt-oss `*_blocks` [E, rows, G, 16] + `*_scales` [E, rows, G] -> transformers' [E, G*32, rows]: per
    expert, the band's columns transposed. Scales at the ends of the range (0: a float32 subnormal;
    254 with a 6: float32 overflow to inf)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rng = np.random.default_rng(11)
    e, rows, g = 2, 24, 3
    blocks = rng.integers(0, 256, size=(e, rows, g, 16), dtype=np.uint8)
    scales = rng.integers(100, 150, size=(e, rows, g), dtype=np.uint8)
    scales[0, 0, :] = [0, 1, 254]
    scales[1, 3, :] = [127, 253, 2]
    want = bits_of(convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=TORCH[out]))
    for x in range(e):
        got = dq.dequantize_band(blocks[x], dq.E2M1, rows=rows, row_bytes=g * 16, cols=g * 32, scales=scales[x],
                                 scale_dtype="F8_E8M0", block=(1, 32), mid="F32", out=out, use_kernels=use_kernels)
        assert np.array_equal(got.T, want[x])


# -- packed integers --------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [4, 8, 2, 3])
@pytest.mark.parametrize("strategy,symmetric",
                         [("group", True), ("group", False), ("channel", True), ("channel", False)])
@pytest.mark.parametrize("scale_dtype", ["BF16", "F16", "F32"])
def test_pack_quantized_equals_compressed_tensors(use_kernels: bool, bits: int, strategy: str, symmetric: bool,
                                                  scale_dtype: str) -> None:
    """compressed-tensors `pack-quantized`: int32 words of dense `bits`-bit fields (stored + 2^(bits-1)),
    group or channel scales, zero points packed down the rows; its decompressor is the oracle."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    rng = np.random.default_rng(bits * 100 + len(strategy) + symmetric + len(scale_dtype))
    rows, cols, gs = 20, 96 if bits != 3 else 100, 32
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1))
    q = rng.integers(lo, hi, size=(rows, cols), dtype=np.int8)
    groups = -(-cols // gs) if strategy == "group" else 1
    if strategy == "group" and cols % gs:
        cols = cols - cols % gs
        q = q[:, :cols].copy()
        groups = cols // gs
    sc = scales_of(rng, (rows, groups), scale_dtype)
    zp = rng.integers(lo, hi, size=(rows, groups), dtype=np.int8)
    args = dict(num_bits=bits, type="int", symmetric=symmetric, strategy=strategy)
    if strategy == "group":
        args["group_size"] = gs
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args))
    packed = pack_to_int32(torch.from_numpy(q), bits)
    state = {"weight_packed": packed, "weight_scale": torch_bits(sc, scale_dtype),
             "weight_shape": torch.tensor([rows, cols])}
    if not symmetric:
        state["weight_zero_point"] = pack_to_int32(torch.from_numpy(zp), bits, packed_dim=0)
    want = bits_of(PackedQuantizationCompressor.decompress(state, scheme)["weight"])
    raw = packed.numpy().view(np.uint8)
    got = dq.dequantize_band(raw, dq.Codes("int", bits, 1 << (bits - 1)), rows=rows, row_bytes=raw.shape[1], cols=cols,
                             scales=sc, scale_dtype=scale_dtype, block=(1, gs if strategy == "group" else cols),
                             zeros=None if symmetric else zp, mid=scale_dtype, out=scale_dtype, use_kernels=use_kernels)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_mlx_affine_equals_mlx_dequantize(use_kernels: bool, bits: int, group: int, dtype: str) -> None:
    """MLX affine: uint32 words of `bits`-bit codes, `scales` and `biases` per group; mx.dequantize (CPU)."""
    mx = pytest.importorskip("mlx.core")
    mdt = {"BF16": mx.bfloat16, "F16": mx.float16, "F32": mx.float32}[dtype]
    rng = np.random.default_rng(bits * 1000 + group + len(dtype))
    rows, cols = 16, 256
    w = mx.array(rng.standard_normal((rows, cols)).astype(np.float32)).astype(mdt)
    wq, s, b = mx.quantize(w, group_size=group, bits=bits)
    want = np.array(mx.dequantize(wq, s, b, group_size=group, bits=bits).astype(mx.float32))
    as_bits = {"F32": lambda a: np.array(a.astype(mx.float32)).view(np.uint32),
               "BF16": lambda a: np.array(a.view(mx.uint16)), "F16": lambda a: np.array(a.view(mx.uint16))}[dtype]
    raw = np.array(wq).view(np.uint8)
    got = dq.dequantize_band(raw, dq.Codes("int", bits), rows=rows, row_bytes=raw.shape[1], cols=cols,
                             scales=as_bits(s), biases=as_bits(b), scale_dtype=dtype, block=(1, group), mid=dtype,
                             out="F32", use_kernels=use_kernels)
    assert np.array_equal(got, want.view(np.uint32))
    native = dq.dequantize_band(raw, dq.Codes("int", bits), rows=rows, row_bytes=raw.shape[1], cols=cols,
                                scales=as_bits(s), biases=as_bits(b), scale_dtype=dtype, block=(1, group), mid=dtype,
                                out=dtype, use_kernels=use_kernels)
    assert np.array_equal(native, as_bits(mx.dequantize(wq, s, b, group_size=group, bits=bits)))


# -- refusals and buffers ---------------------------------------------------------------------------

@pytest.mark.parametrize("bad,where", [(np.nan, "[2, 1]"), (np.inf, "[2, 1]"), (0.0, "[2, 1]")])
def test_bad_scales_are_refused_naming_the_tensor(use_kernels: bool, bad: float, where: str) -> None:
    rng = np.random.default_rng(3)
    codes = fp8_codes(rng, (40, 40))
    sc = scales_of(rng, (4, 4), "F32")
    sc[2, 1] = bad
    sc[3, 0] = np.nan  # later in the blocks' order: the first one is named
    with pytest.raises(FormatError, match=rf"scale {re.escape(where)} is NaN") as err:
        dq.dequantize_band(codes, dq.E4M3, rows=40, row_bytes=40, cols=40, scales=sc, scale_dtype="F32", block=(10, 10),
                           mid="F32", out="BF16", name="layers.0.w", use_kernels=use_kernels)
    assert err.value.tensor == "layers.0.w"
    # a band that does not touch the bad block is fine, and reports absolute positions when it does
    dq.dequantize_band(codes[:20], dq.E4M3, rows=20, row_bytes=40, cols=40, scales=sc[:2], scale_dtype="F32",
                       block=(10, 10), mid="F32", out="BF16", use_kernels=use_kernels)
    with pytest.raises(FormatError, match=r"scale \[2, 1\]"):
        dq.dequantize_band(codes[20:], dq.E4M3, rows=20, row_bytes=40, cols=40, row0=20, scales=sc[2:],
                           scale_dtype="F32", block=(10, 10), mid="F32", out="BF16", use_kernels=use_kernels)


def test_e8m0_255_and_nan_bias_are_refused(use_kernels: bool) -> None:
    blocks = np.zeros((2, 16), np.uint8)
    with pytest.raises(FormatError, match=r"scale \[1, 0\]"):
        dq.dequantize_band(blocks, dq.E2M1, rows=2, row_bytes=16, cols=32, scales=np.array([[127], [255]], np.uint8),
                           scale_dtype="F8_E8M0", block=(1, 32), mid="F32", out="BF16", use_kernels=use_kernels)
    with pytest.raises(FormatError, match=r"scale \(or bias\) \[0, 1\]"):
        dq.dequantize_band(np.zeros((1, 8), np.uint8), dq.Codes("int", 4), rows=1, row_bytes=8, cols=16,
                           scales=np.ones((1, 2), np.float32), biases=np.array([[0, np.inf]], np.float32),
                           scale_dtype="F32", block=(1, 8), mid="F32", out="F32", use_kernels=use_kernels)


def test_kernel_refuses_bad_geometry() -> None:
    k = dq.kernels()
    if k is None:
        pytest.skip("kernels not built")
    one = np.ones(1, np.float32).view(np.uint8)
    out = np.empty(16, np.uint16)
    with pytest.raises(ValueError, match="geometry"):  # 16 codes of 4 bits do not fit in 4 bytes
        k.dequant_band(np.zeros(4, np.uint8), out, 0, 4, 8, 1, 4, 0, 16, 0, 1, 16, one, 0, 1, None, None, 0, 1)
    with pytest.raises(ValueError, match="do not match"):  # a scale row short
        k.dequant_band(np.zeros(16, np.uint8), out, 0, 4, 8, 2, 8, 0, 8, 0, 1, 8, one, 0, 1, None, None, 0, 1)


ODD_OFFSETS = (1, 3, 5)


def _at_offset(data: bytes, offset: int) -> memoryview:
    store = np.zeros(len(data) + 16, dtype=np.uint8)
    start = (-store.ctypes.data % 8) + offset
    store[start:start + len(data)] = np.frombuffer(data, dtype=np.uint8)
    return memoryview(store)[start:start + len(data)]


@pytest.mark.parametrize("offset", ODD_OFFSETS)
def test_kernel_reads_and_writes_misaligned_buffers(offset: int) -> None:
    """Under `make ubsan` a typed (misaligned) load or store here fails the run."""
    k = dq.kernels()
    if k is None:
        pytest.skip("kernels not built")
    rng = np.random.default_rng(offset)
    codes = fp8_codes(rng, (33, 70))
    sc = scales_of(rng, (3, 5), "BF16")
    want = dq.dequantize_band(codes, dq.E4M3, rows=33, row_bytes=70, cols=70, scales=sc, scale_dtype="BF16",
                              block=(16, 16), mid="F32", out="F32", use_kernels=False)
    src, scales = _at_offset(codes.tobytes(), offset), _at_offset(sc.tobytes(), (offset + 2) % 8)
    out = _at_offset(bytes(33 * 70 * 4), (offset + 1) % 8)
    assert k.dequant_band(src, out, 1, 8, 0, 33, 70, 0, 70, 0, 16, 16, scales, 1, 5, None, None, 0, 0) == -1
    assert np.array_equal(np.frombuffer(out, dtype=np.uint32).reshape(33, 70), want)

