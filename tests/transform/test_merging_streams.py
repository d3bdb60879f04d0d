"""The merge ops stream: bands of a few rows, inputs that only yield pieces, results independent of the band.

The oracle for each op is its formula written out in numpy (or torch for BF16 rounding) on whole
arrays; the ops under test only ever see the inputs' pieces (a loader that would hand out the whole
tensor raises)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import pytest

from migrator.core import dtypes
from migrator.core.errors import UnsupportedDTypeError
from migrator.core.tensor import LazyTensor, from_numpy
from migrator.ops.compute import arithmetic
from migrator.ops.compute.lora import Fold, fold


def _pieces_only(name: str, array: np.ndarray, piece: int = 40) -> LazyTensor:
    """A tensor that yields its bytes `piece` bytes at a time and refuses to hand them out whole."""
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8).tobytes()

    def chunks() -> Iterator[memoryview]:
        for i in range(0, len(raw), piece):
            yield memoryview(raw[i:i + piece])

    def whole() -> memoryview:
        raise AssertionError(f"{name} was read whole")

    return LazyTensor(name, dtypes.from_numpy(array.dtype), tuple(array.shape), len(raw), whole, chunks=chunks)


def _streamed(t: LazyTensor) -> np.ndarray:
    """The bytes as a writer takes them (a small cast's loader converts the computed tensor's pieces)."""
    raw = b"".join(bytes(p) for p in t.chunks()) if t.chunks is not None else bytes(t.data())
    return np.frombuffer(raw, dtype=t.dtype.numpy()).reshape(t.shape)


@pytest.fixture(autouse=True)
def _small_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("migrator.ops.compute.bands.BAND_BYTES", 96)


RNG = np.random.default_rng(0)
A, B, C = (RNG.standard_normal((37, 11)).astype(np.float32) for _ in range(3))


def test_linear_and_scale_stream_from_pieces() -> None:
    out = arithmetic.linear("w", [_pieces_only("a", A), _pieces_only("b", B)], [0.25, 0.5])
    expected = (A * np.float32(0.25) + B * np.float32(0.5)) / np.float32(0.75)
    assert np.array_equal(_streamed(out), expected)
    assert np.array_equal(_streamed(arithmetic.scale("w", _pieces_only("a", A), 3.0)), A * np.float32(3))


def test_ties_keeps_the_top_density_share_per_model() -> None:
    base, m1, m2 = (_pieces_only(n, x) for n, x in (("base", A), ("m1", B), ("m2", C)))
    out = _streamed(arithmetic.task_arithmetic("w", base, [m1, m2], [1.0, 0.5], arithmetic.DeltaMethod(
        densities=[0.3, 0.6], sparsify="magnitude", consensus="sum", normalize=True)))
    deltas = []
    for x, density, w in ((B, 0.3, 1.0), (C, 0.6, 0.5)):
        d = x - A
        k = int(density * d.size)
        keep = np.abs(d) >= np.sort(np.abs(d).reshape(-1))[::-1][k - 1]
        assert keep.sum() == k
        deltas.append(np.where(keep, d, 0) * np.float32(w))
    majority = np.where(deltas[0] + deltas[1] >= 0, 1, -1)
    agree = [np.sign(d) == majority for d in deltas]
    mixed = sum(np.where(a, d, 0) for a, d in zip(agree, deltas, strict=True))
    weight = agree[0] * np.float32(1.0) + agree[1] * np.float32(0.5)
    expected = A + mixed / np.where(weight == 0, 1, weight)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)


def test_slerp_formula() -> None:
    out = _streamed(arithmetic.slerp("w", _pieces_only("a", A), _pieces_only("b", B), 0.3))
    a, b = A.astype(np.float64).reshape(-1), B.astype(np.float64).reshape(-1)
    theta = np.arccos(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    expected = (np.sin(0.7 * theta) * a + np.sin(0.3 * theta) * b) / np.sin(theta)
    np.testing.assert_allclose(out.reshape(-1), expected, rtol=0, atol=1e-6)


def test_f64_inputs_compute_in_f64() -> None:
    a64, b64 = A.astype(np.float64), B.astype(np.float64)
    out = arithmetic.linear("w", [_pieces_only("a", a64), _pieces_only("b", b64)], [1 / 3, 2 / 3], normalize=False)
    assert out.dtype.name == "F64"
    assert np.array_equal(_streamed(out), a64 * (1 / 3) + b64 * (2 / 3))


def test_bf16_output_rounds_once_to_nearest_even() -> None:
    torch = pytest.importorskip("torch")
    out = arithmetic.linear("w", [_pieces_only("a", A), _pieces_only("b", B)], [0.1, 0.9], normalize=False,
                            out_dtype=dtypes.BF16)
    f32 = A * np.float32(0.1) + B * np.float32(0.9)
    expected = torch.from_numpy(f32).to(torch.bfloat16).view(torch.int16).numpy()
    assert np.array_equal(_streamed(out).view(np.int16), expected)


@pytest.mark.parametrize("form", ["linear", "transposed"])
def test_dora_fold_streams(form: str) -> None:
    w = RNG.standard_normal((23, 9)).astype(np.float32)
    if form == "linear":
        a, b = RNG.standard_normal((3, 9)).astype(np.float32), RNG.standard_normal((23, 3)).astype(np.float32)
        delta = (b @ a) * np.float32(0.5)
        m = RNG.random(23).astype(np.float32) + 1
        v = w + delta
        expected = (m / np.linalg.norm(v, axis=1))[:, None] * v
    else:
        a, b = RNG.standard_normal((3, 23)).astype(np.float32), RNG.standard_normal((9, 3)).astype(np.float32)
        delta = (b @ a).T * np.float32(0.5)
        m = RNG.random(9).astype(np.float32) + 1
        v = w + delta
        expected = v * (m / np.linalg.norm(v, axis=0))[None, :]
    lora = Fold(from_numpy("A", a), from_numpy("B", b), 0.5, form, from_numpy("m", m))  # type: ignore[arg-type]
    out = _streamed(fold("w", _pieces_only("w", w), lora))
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)


def test_integer_inputs_are_refused_by_name() -> None:
    with pytest.raises(UnsupportedDTypeError, match=r"tensor 'steps'.*needs float inputs.*I64"):
        arithmetic.linear("steps", [from_numpy("steps", np.arange(3))], [1.0])


def test_empty_tensors() -> None:
    e = np.zeros((0, 4), np.float32)
    for out in (arithmetic.linear("e", [from_numpy("e", e), from_numpy("e", e)], [1, 1]),
                arithmetic.slerp("e", from_numpy("e", e), from_numpy("e", e), 0.5),
                arithmetic.task_arithmetic("e", from_numpy("e", e), [from_numpy("e", e)], [1.0], arithmetic.DeltaMethod(
                    densities=[0.5], sparsify="magnitude", consensus="sum"))):
        assert out.shape == (0, 4) and out.nbytes == 0 and bytes(out.data()) == b""


@pytest.mark.parametrize("rescale", ["density", "l1", False])
def test_dare_keeps_what_the_sampler_draws(rescale: str | bool) -> None:
    """Kept elements are exactly those whose draw is < density; kept deltas times 1/density (the DARE paper),
    the L1 ratio (mergekit) or 1."""
    base, model = _pieces_only("base", A), _pieces_only("m", B)
    out = _streamed(arithmetic.task_arithmetic("layer.w", base, [model], [1.0], arithmetic.DeltaMethod(
        densities=[0.4], sparsify="random", rescale=rescale, seed=123)))  # type: ignore[arg-type]
    key = int.from_bytes(hashlib.sha256(b"123\x00layer.w\x001").digest()[:16], "little")  # the documented key
    draws = np.random.Generator(np.random.Philox(key=key)).random(A.size)
    keep = (draws < 0.4).reshape(A.shape)
    d = B - A
    factor = {"density": np.float32(1 / 0.4), False: np.float32(1),
              "l1": np.float32(np.abs(d).sum(dtype=np.float64) / np.abs(d[keep]).sum(dtype=np.float64))}[rescale]
    assert np.array_equal(out != A, keep)
    expected = A + np.where(keep, d * factor, np.float32(0))
    if rescale == "l1":  # the ratio is summed in another order than here
        np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)
    else:
        assert np.array_equal(out, expected)
    assert abs(keep.mean() - 0.4) < 5 * np.sqrt(0.4 * 0.6 / keep.size)
