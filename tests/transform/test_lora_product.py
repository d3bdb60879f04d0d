"""The LoRA delta (lora_product.py, kernel migrator/core/kernels/lora.c) against torch's CPU matmul: same bits.

PEFT's merge_and_unload computes `(B @ A) * scaling` with torch; each shape here is computed by torch
(one thread: the rule lora_product.py states is the single-thread one) and by migrator, with the
compiled kernel and with it switched off (the numpy fallback), and compared as bit patterns (a -0 is
not a +0). The grid covers both sides of every boundary of the rule (4 rows, 12 columns, ranks 192
and 384) and real layer shapes; numpy's own matmul (what lora.py used before: OpenBLAS's order here)
fails most of them."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from migrator.core import casts
from migrator.core.tensor import from_numpy
from migrator.ops.compute import lora_product
from migrator.ops.compute.lora import Fold, fold
from migrator.ops.compute.lora_product import scaled_product, torch_order

torch = pytest.importorskip("torch")

from tests.support.torch_order import torch_sums_in_order  # noqa: E402

KERNELS = lora_product.lora_kernels()
NATIVE = KERNELS is not None
_BUILT = pytest.mark.skipif(not NATIVE, reason="kernels not built")
PATHS = [pytest.param(True, id="kernel", marks=_BUILT), pytest.param("portable", id="portable-kernel", marks=_BUILT),
         pytest.param(False, id="numpy")]

# (rows of B, rank, columns of A): PEFT's B [out, r] @ A [r, in]
FUSED = [(4, 16, 12), (5, 3, 13), (12, 2, 12), (37, 5, 300), (64, 16, 64), (256, 8, 256), (300, 7, 517),
         (1024, 16, 1024), (512, 32, 2048), (2048, 64, 256), (128, 128, 96), (64, 192, 40), (40, 193, 64),
         (64, 256, 64), (33, 300, 70), (64, 384, 64), (48, 385, 48), (40, 512, 36), (20, 1000, 24)]
PLAIN = [(16, 2, 8), (16, 4, 8), (64, 16, 8), (64, 64, 8), (16, 16, 4), (64, 5, 11), (3, 2, 64), (2, 4, 300),
         (8, 3, 7), (100, 2, 2), (1, 16, 4096), (1, 300, 512), (64, 4, 1)]
RANK1 = [(4, 1, 12), (2, 1, 2), (16, 1, 8)]
BIG = [(4096, 16, 4096)]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def _inputs(m: int, r: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng([m, r, n, seed])
    return (g.standard_normal((m, r)).astype(np.float32) * 0.1, g.standard_normal((r, n)).astype(np.float32))


def _torch(b: np.ndarray, a: np.ndarray, scaling: float) -> np.ndarray:
    if not torch_sums_in_order():  # the rule is this machine's torch's; on another CPU it may not be
        pytest.skip("this machine's torch sums a LoRA product in another order (docs/merging.md)")
    out: np.ndarray = ((torch.from_numpy(b) @ torch.from_numpy(a)) * scaling).numpy()
    return out


@pytest.fixture(autouse=True)
def _fma_back_on() -> Iterator[None]:
    yield
    if NATIVE:
        KERNELS.lora_use_fma(True)


def _path(native: bool | str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel with its AVX2+FMA loops (True), its portable loops ("portable"), or numpy (False)."""
    if not native:
        monkeypatch.setattr(casts, "kernels", None)
    elif native == "portable":
        KERNELS.lora_use_fma(False)


def _ours(b: np.ndarray, a: np.ndarray, scaling: float, native: bool | str,
          monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    _path(native, monkeypatch)
    return scaled_product(b, a, *torch_order(b.shape[0], a.shape[0], a.shape[1]), scaling)


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize("shape", FUSED + PLAIN + RANK1, ids=str)
def test_matches_torch(shape: tuple[int, int, int], native: bool | str, monkeypatch: pytest.MonkeyPatch) -> None:
    b, a = _inputs(*shape)
    assert np.array_equal(_bits(_ours(b, a, 1.625, native, monkeypatch)), _bits(_torch(b, a, 1.625)))


@pytest.mark.skipif(not NATIVE, reason="kernels not built")
@pytest.mark.parametrize("shape", BIG, ids=str)
def test_llama_sized_matches_torch(shape: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    b, a = _inputs(*shape)
    assert np.array_equal(_bits(_ours(b, a, 2.0, True, monkeypatch)), _bits(_torch(b, a, 2.0)))


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize("rank", [1, 3])
def test_signed_zeros(rank: int, native: bool | str, monkeypatch: pytest.MonkeyPatch) -> None:
    """-1 * 0 products: torch keeps the -0 at rank 1 and sums from +0 above (a -0 W stays -0 or not)."""
    b, a = -np.ones((8, rank), np.float32), np.zeros((rank, 16), np.float32)
    a[:, ::3] = -0.0
    ours, theirs = _ours(b, a, 0.5, native, monkeypatch), _torch(b, a, 0.5)
    assert np.array_equal(_bits(ours), _bits(theirs))
    assert np.signbit(theirs).any() == (rank == 1)


@pytest.mark.parametrize("native", PATHS)
def test_fma_double_rounding_case(native: bool | str, monkeypatch: pytest.MonkeyPatch) -> None:
    """fma(1 + 2^-23, 2^-24 - 2^-47, 1 + 2^-23): the exact sum lies just below the midpoint between
    1 + 2^-23 and 1 + 2^-22, its F64 rounding on it, and a second rounding (to even) would go up."""
    x, y, acc = np.float32(1 + 2.0**-23), np.float32(2.0**-24 - 2.0**-47), np.float32(1 + 2.0**-23)
    assert np.float32(np.float64(acc) + np.float64(x) * np.float64(y)) == np.float32(1 + 2.0**-22)
    b = np.tile(np.array([[1.0, x]], np.float32), (4, 1))
    a = np.tile(np.array([[acc], [y]], np.float32), (1, 12))
    ours, theirs = _ours(b, a, 1.0, native, monkeypatch), _torch(b, a, 1.0)
    assert np.array_equal(_bits(ours), _bits(theirs))
    assert np.all(theirs == np.float32(1 + 2.0**-23))


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize("scale", [2.0**-70, 2.0**-64, 2.0**64], ids=["subnormal", "near-subnormal", "overflow"])
def test_extreme_magnitudes(scale: float, native: bool | str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sums in F32's subnormal range (a rounding that drops more than 29 F64 bits; some chains there
    underflow to -0, which torch returns as +0) and past F32's largest value (inf, and NaN from
    inf - inf: compared as NaN, its sign bit is not specified)."""
    b, a = _inputs(256, 16, 256, seed=3)
    b, a = b * np.float32(scale), a * np.float32(scale)
    ours, theirs = _ours(b, a, 1.0, native, monkeypatch), _torch(b, a, 1.0)
    nan = np.isnan(theirs)
    assert np.array_equal(nan, np.isnan(ours))
    assert np.array_equal(_bits(ours)[~nan], _bits(theirs)[~nan])
    if scale < 1:
        assert (np.abs(theirs) < np.finfo(np.float32).tiny).mean() > 0.5
    else:
        assert np.isinf(theirs).any()

@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize(("form", "shape"), [("linear", (512, 16, 1024)), ("transposed", (1024, 16, 512)),
                                             ("transposed", (16, 2, 8)), ("linear", (16, 2, 8)),
                                             ("transposed", (64, 16, 8))], ids=str)
def test_fold_bands_match_torch(form: str, shape: tuple[int, int, int], native: bool,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """fold() in bands of a few rows, both layouts: W + (B @ A) * s (transposed for Conv1D/Embedding)."""
    monkeypatch.setattr("migrator.ops.compute.bands.BAND_BYTES", 4096)
    _path(native, monkeypatch)
    m, r, n = shape
    b, a = _inputs(m, r, n, seed=1)
    delta = _torch(b, a, 0.75)
    w = np.random.default_rng(2).standard_normal((m, n)).astype(np.float32)
    if form == "transposed":
        w, delta = np.ascontiguousarray(w.T), delta.T
    theirs = (torch.from_numpy(w) + torch.from_numpy(np.ascontiguousarray(delta))).numpy()
    lora = Fold(from_numpy("A", a), from_numpy("B", b), 0.75, form)  # type: ignore[arg-type]
    ours = fold("W", from_numpy("W", w), lora).numpy()
    assert np.array_equal(_bits(ours), _bits(theirs))



@pytest.mark.skipif(not NATIVE, reason="kernels not built")
@pytest.mark.parametrize("fma", [True, False], ids=["avx2-fma", "portable"])
@pytest.mark.parametrize("mode", [lora_product.FUSED, lora_product.PLAIN])
def test_kernel_equals_fallback_every_mode(mode: int, fma: bool) -> None:
    """Both modes on every layout the kernel has (4-row blocks of 16 columns, single rows, tile edges,
    long sums in blocks): the numpy fallback's bits (checked against torch above)."""
    for rows, rank, cols, block in [(9, 16, 64, 16), (8, 5, 300, 5), (7, 3, 33, 3), (1, 2, 17, 2), (4, 64, 16, 64),
                                    (13, 200, 40, 100), (6, 7, 3, 7), (5, 400, 20, 192), (12, 6, 48, 4)]:
        b, a = _inputs(rows, rank, cols, seed=mode)
        out = np.empty((rows, cols), np.float32)
        KERNELS.lora_use_fma(fma)
        KERNELS.lora_band(b, a, out, rank, mode, block, 0.375)
        expected = lora_product.numpy_product(b, a, mode, block) * np.float32(0.375)
        assert np.array_equal(_bits(out), _bits(expected)), (rows, rank, cols, block)


@pytest.mark.skipif(not NATIVE, reason="kernels not built")
def test_kernel_refuses_bad_buffers() -> None:
    kernels = KERNELS
    b, a = np.ones((3, 2), np.float32), np.ones((2, 5), np.float32)
    out = np.zeros((3, 5), np.float32)
    kernels.lora_band(b, a, out, 2, 0, 2, 0.5)
    assert np.all(out == 1.0)
    for args, message in [((b, a, out[:2], 2, 0, 2, 1.0), "must be float32"),
                          ((b, a[:, :4].copy(), out, 2, 0, 2, 1.0), "must be float32"),
                          ((b, a, out, 0, 0, 2, 1.0), "at least 1"), ((b, a, out, 2, 3, 2, 1.0), "mode"),
                          ((b, a, out, 2, 0, 0, 1.0), "at least 1"), ((b, a, out, 2, 2, 2, 1.0), "rank 1")]:
        with pytest.raises(ValueError, match=message):
            kernels.lora_band(*args)
    whole = np.zeros(30, np.float32)  # out over a's own bytes
    with pytest.raises(ValueError, match="overlaps"):
        kernels.lora_band(b, whole[:10], whole[5:20], 2, 0, 2, 1.0)
    with pytest.raises(ValueError, match="overlaps"):
        kernels.lora_band(b, whole[5:15], whole[:15], 2, 0, 2, 1.0)
