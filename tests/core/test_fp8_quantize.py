"""FP8 quantization with scales (migrator/core/fp8_quantize.py) against compressed-tensors' own
`calculate_qparams` and `quantize` (0.20): every scale and every F8_E4M3 byte, in each weight dtype, for
the channel and the 128x128 block strategies, on awkward values (zeros, -0.0, all-zero rows, values at
the FP8 range's edge, subnormals) and shapes that are not whole blocks."""

from __future__ import annotations

import numpy as np
import pytest

from migrator.core import fp8_quantize as fq

torch = pytest.importorskip("torch")
ct_quant = pytest.importorskip("compressed_tensors.quantization")
from compressed_tensors.quantization.lifecycle.forward import quantize as ct_quantize  # noqa: E402
from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES  # noqa: E402
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def weights(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 0.05
    w[0, :] = 0.0  # an all-zero row: the scale becomes eps
    w[1, :3] = torch.tensor([-0.0, 0.0, -0.0])
    w[2, 0] = 3.0e-5  # small values: FP8 subnormals after scaling
    w[3, 5] = -7.5  # a row whose maximum is far above the rest
    w[min(4, rows - 1), :] = torch.linspace(-1.0, 1.0, cols)
    return w.to(dtype)


def oracle(w: torch.Tensor, scheme: str) -> tuple[torch.Tensor, torch.Tensor]:
    """compressed-tensors' scales (from min/max as its observers give them) and quantized weight."""
    args = PRESET_SCHEMES[scheme]["weights"]
    if scheme == "FP8_DYNAMIC":
        mn, mx = torch.amin(w, dim=1, keepdim=True), torch.amax(w, dim=1, keepdim=True)
    else:
        br, bc = args.block_structure
        nr, nc = -(-w.shape[0] // br), -(-w.shape[1] // bc)
        mn = torch.stack([torch.stack([w[i * br:(i + 1) * br, j * bc:(j + 1) * bc].min() for j in range(nc)])
                          for i in range(nr)])
        mx = torch.stack([torch.stack([w[i * br:(i + 1) * br, j * bc:(j + 1) * bc].max() for j in range(nc)])
                          for i in range(nr)])
    scale, zp = calculate_qparams(mn, mx, args)
    from compressed_tensors.quantization.utils import maybe_pad_tensor_for_block_quant

    x = maybe_pad_tensor_for_block_quant(w, tuple(args.block_structure)) if scheme == "FP8_BLOCK" else w
    q = ct_quantize(x=x, scale=scale, zero_point=zp, args=args, dtype=torch.float8_e4m3fn)
    return scale, q[:w.shape[0], :w.shape[1]]


def ours(w: torch.Tensor, scheme: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Scales and F8 bytes from migrator's functions, band by band as the writer streams them."""
    x = w.float().numpy()
    if scheme == "FP8_DYNAMIC":
        scales = np.concatenate([fq.scales_from_absmax(fq.channel_absmax(x[i:i + 7]), name)
                                 for i in range(0, x.shape[0], 7)])
        q = np.concatenate([fq.quantize_band(x[i:i + 7], scales[i:i + 7], name) for i in range(0, x.shape[0], 7)])
        return scales, q
    rows = []
    qs = []
    for i in range(0, x.shape[0], 128):
        band = x[i:i + 128]
        s = fq.scales_from_absmax(fq.block_absmax(band, 128), name)
        rows.append(s)
        qs.append(fq.quantize_band(band, fq.block_columns(s, band.shape[1], 128), name))
    return np.concatenate(rows), np.concatenate(qs)


@pytest.mark.parametrize("name", sorted(DTYPES))
@pytest.mark.parametrize(("scheme", "shape"), [("FP8_DYNAMIC", (37, 53)), ("FP8_BLOCK", (300, 200)),
                                               ("FP8_BLOCK", (128, 256))])
def test_scales_and_bytes_equal_compressed_tensors(scheme: str, shape: tuple[int, int], name: str) -> None:
    w = weights(*shape, DTYPES[name], seed=len(name) + shape[0])
    want_scale, want_q = oracle(w, scheme)
    assert want_scale.dtype == DTYPES[name]  # computed in the weight's dtype
    scales, q = ours(w, scheme, name)
    got_scale = torch.from_numpy(scales).to(DTYPES[name])
    assert torch.from_numpy(scales).equal(got_scale.float())  # our F32 holds values of the dtype exactly
    assert got_scale.contiguous().view(torch.uint8).equal(want_scale.contiguous().view(torch.uint8))
    assert q.view(np.uint8).tobytes() == want_q.view(torch.uint8).numpy().tobytes()


def test_edge_values_equal_compressed_tensors() -> None:
    """Values at the rounding edges of FP8 (halfway between neighbours, at 448, just above) in each dtype."""
    import ml_dtypes

    grid = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    grid = grid[np.isfinite(grid)]
    grid = np.sort(grid)
    mids = (grid[:-1] + grid[1:]) / 2  # ties: rounded to even
    row = np.concatenate([grid, mids, [448.0, 460.0, 464.0, -448.0, -470.0]]).astype(np.float32) / 448.0
    for name, dt in DTYPES.items():
        w = torch.from_numpy(np.stack([row, -row, row * 0.5])).to(dt)
        want_scale, want_q = oracle(w, "FP8_DYNAMIC")
        scales, q = ours(w, "FP8_DYNAMIC", name)
        assert torch.from_numpy(scales).to(dt).float().equal(want_scale.float()), name
        assert q.view(np.uint8).tobytes() == want_q.view(torch.uint8).numpy().tobytes(), name


def compiled_ours(w: torch.Tensor, scheme: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Scales and F8 bytes from the compiled loops, on the weight's stored bytes, band by band."""
    raw = w.contiguous().view(torch.uint8).numpy()
    rows, cols = w.shape
    item = raw.shape[1] // cols
    step = 7 if scheme == "FP8_DYNAMIC" else 128
    block = 0 if scheme == "FP8_DYNAMIC" else 128
    scales, qs = [], []
    for i in range(0, rows, step):
        band = raw[i:i + step].reshape(-1)
        n = band.size // (cols * item)
        s = fq.scales_from_absmax(fq.absmax_raw(band, name, n, cols, block), name)
        scales.append(s)
        qs.append(fq.quantize_raw(band, name, n, cols, s, block))
    return np.concatenate(scales), np.concatenate(qs)


needs_kernels = pytest.mark.skipif(fq.KERNELS is None, reason="the compiled kernels are not built")


@needs_kernels
@pytest.mark.parametrize("name", ["F32", "BF16"])
@pytest.mark.parametrize(("scheme", "shape"), [("FP8_DYNAMIC", (37, 53)), ("FP8_BLOCK", (300, 200))])
def test_compiled_loops_equal_compressed_tensors(scheme: str, shape: tuple[int, int], name: str) -> None:
    w = weights(*shape, DTYPES[name], seed=3 + shape[1])
    want_scale, want_q = oracle(w, scheme)
    scales, q = compiled_ours(w, scheme, name)
    assert torch.from_numpy(scales).to(DTYPES[name]).equal(want_scale)
    assert q.tobytes() == want_q.view(torch.uint8).numpy().tobytes()


@needs_kernels
def test_compiled_loops_give_the_numpy_bits_for_every_bf16_value() -> None:
    """Every finite BF16 value (and -0.0), under scales that send them below the FP8 subnormals, across its
    range and past 448: the compiled rounding and the numpy one agree bit for bit."""
    import ml_dtypes

    bits = np.arange(1 << 16, dtype=np.uint16)
    values = bits.view(ml_dtypes.bfloat16)
    values = values[np.isfinite(values.astype(np.float32))]
    row = values.reshape(1, -1)
    for scale in (1.0, 2.0 ** -12, 3.0e-3, 7.5, 2.0 ** 100):
        s = fq.scales_from_absmax(np.array([[scale * 448.0]], np.float32), "BF16")
        want = fq.quantize_band(row.astype(np.float32), s, "BF16").view(np.uint8)
        got = fq.quantize_raw(row.view(np.uint8).reshape(-1), "BF16", 1, row.shape[1], s, 0)
        assert got.tobytes() == want.tobytes(), scale
    f32 = np.random.default_rng(0).standard_normal(1 << 16).astype(np.float32) * np.float32(2.0) ** \
        np.random.default_rng(1).integers(-30, 12, 1 << 16).astype(np.float32)
    f32 = np.concatenate([f32, [0.0, -0.0, 448.0, -448.0, 2.0 ** -10, -(2.0 ** -9) * 1.5]]).astype(np.float32)
    s = np.array([[1.0]], np.float32)
    want = fq.quantize_band(f32.reshape(1, -1), s, "F32").view(np.uint8)
    got = fq.quantize_raw(f32.view(np.uint8), "F32", 1, f32.size, s, 0)
    assert got.tobytes() == want.tobytes()
