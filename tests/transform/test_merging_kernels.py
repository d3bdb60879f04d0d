"""The compiled merge loops (migrator/core/kernels/merge.c) against the numpy code they replace: the same bits.

Each op is built twice over the same stored tensors (read through mapped bands, in several bands
computed on the cast pool's threads): once with the compiled kernels and once with them switched off
(the numpy path, itself checked against formulas, mergekit and PEFT in the other merge tests). Inputs
hold what changes the branches: NaN, infinities, zeros of both signs, and magnitudes tied at TIES's
k-th largest value."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from migrator import save
from migrator.core import casts, dtypes
from migrator.core.tensor import LazyTensor, from_numpy
from migrator.files.io import open_file
from migrator.ops.compute import arithmetic, bands

pytestmark = pytest.mark.skipif(arithmetic.merge_kernels() is None, reason="the compiled merge kernels are not built")

SHAPE = (301, 67)


def _awkward(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, 40, replace=False)] = 0.0
    flat[rng.choice(flat.size, 10, replace=False)] = -0.0
    flat[rng.choice(flat.size, 3, replace=False)] = np.nan
    flat[rng.choice(flat.size, 2, replace=False)] = np.inf
    flat[rng.choice(flat.size, 2, replace=False)] = -np.inf
    flat[::97] = np.float32(0.5)  # many equal magnitudes: ties at the threshold
    return x


@pytest.fixture
def stored(tmp_path: Path) -> Iterator[dict[str, LazyTensor]]:
    arrays = {"base": _awkward(1), "m1": _awkward(2), "m2": _awkward(3), "m3": _awkward(4)}
    arrays["m1"].reshape(-1)[::89] = arrays["base"].reshape(-1)[::89] + np.float32(0.5)  # |delta| ties
    save([from_numpy(k, v) for k, v in arrays.items()], tmp_path / "w.safetensors")
    with open_file(tmp_path / "w.safetensors") as reader:
        yield {t.name: t for t in reader.tensors}


@pytest.fixture(autouse=True)
def _many_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bands, "BAND_BYTES", 4096)  # about 20 bands a tensor


def _values(t: LazyTensor) -> np.ndarray:
    assert t.chunks is not None
    return np.frombuffer(b"".join(bytes(p) for p in t.chunks()), dtype=np.float32)


def _both(monkeypatch: pytest.MonkeyPatch, make: Callable[[], LazyTensor]) -> tuple[np.ndarray, np.ndarray]:
    compiled = _values(make())
    with monkeypatch.context() as m:
        m.setattr(casts, "kernels", None)
        assert arithmetic.merge_kernels() is None
        plain = _values(make())
    return compiled, plain


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.view(np.uint32).tolist() == b.view(np.uint32).tolist()


@pytest.mark.parametrize("normalize", [True, False])
def test_linear(monkeypatch: pytest.MonkeyPatch, stored: dict[str, LazyTensor], normalize: bool) -> None:
    inputs = [stored["base"], stored["m1"], stored["m2"]]
    _same_bits(*_both(monkeypatch, lambda: arithmetic.linear("w", inputs, [0.3, 0.7, 0.1], normalize=normalize)))


@pytest.mark.parametrize("t", [0.3, 0.75])
def test_slerp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, t: float) -> None:
    rng = np.random.default_rng(5)
    a = rng.standard_normal(SHAPE).astype(np.float32)
    b = (a * np.float32(0.2) + rng.standard_normal(SHAPE).astype(np.float32)).astype(np.float32)
    save([from_numpy("a", a), from_numpy("b", b)], tmp_path / "s.safetensors")
    with open_file(tmp_path / "s.safetensors") as reader:
        ta, tb = reader.tensors
        compiled, plain = _both(monkeypatch, lambda: arithmetic.slerp("w", ta, tb, t))
    # the norms are float64 sums in another order: the coefficients may differ in their last float32 bit
    np.testing.assert_allclose(compiled, plain, rtol=1e-6, atol=1e-7)


TASKS = {
    "ties": dict(densities=[0.3, 0.6, 1.0], sparsify="magnitude", consensus="sum", normalize=True),
    "ties rescaled, lambda": dict(densities=[0.5, 0.2, 0.05], sparsify="magnitude", consensus="sum", normalize=True,
                                  rescale=True, lambda_=0.8),
    "count consensus": dict(densities=[0.4, 0.4, 0.0], sparsify="magnitude", consensus="count", normalize=True),
    "task arithmetic": dict(normalize=False, lambda_=1.5),
    "task arithmetic normalized": dict(normalize=True),
    "magnitude, no consensus": dict(densities=[0.25, 0.5, 0.75], sparsify="magnitude"),
}


@pytest.mark.parametrize("case", list(TASKS))
def test_task_arithmetic(monkeypatch: pytest.MonkeyPatch, stored: dict[str, LazyTensor], case: str) -> None:
    models = [stored["m1"], stored["m2"], stored["m3"]]
    compiled, plain = _both(monkeypatch, lambda: arithmetic.task_arithmetic(
        "w", stored["base"], models, [1.0, 0.5, -0.25], arithmetic.DeltaMethod(**TASKS[case])))  # type: ignore[arg-type]
    if "rescaled" in case:  # the L1 sums are float64 in another order: the factors may differ in their last bit
        np.testing.assert_allclose(compiled, plain, rtol=1e-6, atol=1e-7)
    else:
        _same_bits(compiled, plain)


@pytest.mark.parametrize("density", [1e-6, 0.01, 0.3, 0.5, 0.999])
def test_kth_largest_is_partitions(stored: dict[str, LazyTensor], density: float) -> None:
    base, model = stored["base"], stored["m1"]
    magnitude = np.abs(np.frombuffer(bytes(model.data()), np.float32) - np.frombuffer(bytes(base.data()), np.float32))
    k = max(1, int(density * magnitude.size))
    expected = np.partition(magnitude, magnitude.size - k)[magnitude.size - k]
    native = arithmetic.merge_kernels()
    threshold, total, kept = arithmetic._kth_largest(native, base, model, k, 1000)
    assert np.float32(threshold).view(np.uint32) == expected.view(np.uint32)
    assert np.isnan(total)  # as numpy's sum of a |delta| holding NaN
    assert kept == pytest.approx(float(np.sum(magnitude, where=magnitude >= expected, dtype=np.float64)))


def test_kth_largest_sums_of_finite_deltas(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    base, model = (rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2))
    save([from_numpy("base", base), from_numpy("model", model)], tmp_path / "f.safetensors")
    magnitude = np.abs(model - base).reshape(-1)
    with open_file(tmp_path / "f.safetensors") as reader:
        tb, tm = reader.tensors
        for k in (1, 7, magnitude.size // 3, magnitude.size):
            threshold, total, kept = arithmetic._kth_largest(arithmetic.merge_kernels(), tb, tm, k, 1000)
            assert threshold == np.sort(magnitude)[::-1][k - 1]
            assert total == pytest.approx(float(magnitude.sum(dtype=np.float64)), rel=1e-12)
            assert kept == pytest.approx(float(magnitude[magnitude >= threshold].sum(dtype=np.float64)), rel=1e-12)


def test_bf16_inputs_decode_before_the_kernels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    a, b = (torch.from_numpy(_awkward(s)).to(torch.bfloat16) for s in (6, 7))
    save([from_numpy("a", a), from_numpy("b", b)], tmp_path / "h.safetensors")
    with open_file(tmp_path / "h.safetensors") as reader:
        ta, tb = reader.tensors
        assert ta.dtype == dtypes.BF16
        compiled, plain = _both(monkeypatch, lambda: arithmetic.linear("w", [ta, tb], [0.4, 0.6], out_dtype=dtypes.F32))
    _same_bits(compiled, plain)
