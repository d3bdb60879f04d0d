"""The compiled transpose loops on their own, band by band, against numpy.

Not in test_casts.py: its fixture also runs every test on the numpy path, which has no kernel.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from migrator.core import casts

KERNELS = casts.kernels


@pytest.fixture(params=["vector", "portable"])
def kernels(request: pytest.FixtureRequest) -> Iterator[object]:
    """The kernels with their AVX/F16C loops allowed, then with only the portable (SSE2) ones."""
    if KERNELS is None:
        pytest.skip("migrator.core._kernels not built (test_casts.test_kernels_built_when_a_compiler_exists says why)")
    KERNELS.use_f16c(request.param == "vector")
    try:
        yield KERNELS
    finally:
        KERNELS.use_f16c(True)


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
def test_kernel_transposes_random_bands(kernels: object, itemsize: int) -> None:
    """Bands at any offset and width, rows and columns around the 8x8 / 4x4 register blocks and the
    32-item tiles."""
    rng = np.random.default_rng(itemsize)
    dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize]
    for _ in range(60):
        rows, cols = (int(n) for n in rng.choice([1, 3, 7, 8, 9, 15, 16, 31, 33, 64, 65, 130], size=2))
        first = int(rng.integers(0, cols))
        width = int(rng.integers(1, cols - first + 1))
        a = rng.integers(0, 2**(8 * itemsize) - 1, size=(rows, cols), dtype=np.uint64).astype(dtype)
        out = np.full(width * rows, 7, dtype=dtype)
        kernels.transpose(a, out, rows, cols, itemsize, first, width)  # type: ignore[attr-defined]
        assert np.array_equal(out.reshape(width, rows), a[:, first:first + width].T), (rows, cols, first, width)


# Offsets 1-7 bytes past an aligned start: a tensor in a mapped SafeTensors file begins right after a
# header of any length. Under `make ubsan` a typed (misaligned) load or store here fails the run.
ODD_OFFSETS = (1, 2, 3, 5, 7)


def _at_offset(data: bytes, offset: int) -> memoryview:
    """`data` copied into a fresh buffer so that it starts `offset` bytes past an 8-aligned address."""
    store = np.zeros(len(data) + 16, dtype=np.uint8)
    start = (-store.ctypes.data % 8) + offset
    store[start:start + len(data)] = np.frombuffer(data, dtype=np.uint8)
    return memoryview(store)[start:start + len(data)]


@pytest.mark.parametrize("offset", ODD_OFFSETS)
@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_kernel_transposes_misaligned_buffers(kernels: object, itemsize: int, offset: int) -> None:
    rng = np.random.default_rng(offset)
    dtype = {2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize]
    rows, cols = 37, 70
    a = rng.integers(0, 2**(8 * itemsize) - 1, size=(rows, cols), dtype=np.uint64).astype(dtype)
    src = _at_offset(a.tobytes(), offset)
    out = _at_offset(bytes(rows * 61 * itemsize), (offset + 3) % 8)
    kernels.transpose(src, out, rows, cols, itemsize, 5, 61)  # type: ignore[attr-defined]
    assert np.array_equal(np.frombuffer(out, dtype=dtype).reshape(61, rows), a[:, 5:66].T)


@pytest.mark.parametrize("offset", ODD_OFFSETS)
def test_kernel_casts_misaligned_buffers(kernels: object, offset: int) -> None:
    """Finite values only: for them numpy's IEEE round-to-nearest-even is the rule (NaNs are
    test_casts.py's business, against torch)."""
    rng = np.random.default_rng(100 + offset)
    f = (rng.standard_normal(1003) * 1000).astype(np.float32)
    h = f.astype(np.float16)
    src, out = _at_offset(f.tobytes(), offset), _at_offset(bytes(2 * f.size), (offset + 1) % 8)
    kernels.f32_to_f16(src, out)  # type: ignore[attr-defined]
    assert np.frombuffer(out, dtype=np.uint16).tolist() == h.view(np.uint16).tolist()
    back = _at_offset(bytes(4 * f.size), (offset + 2) % 8)
    kernels.f16_to_f32(_at_offset(h.tobytes(), offset), back)  # type: ignore[attr-defined]
    assert np.frombuffer(back, dtype=np.float32).tolist() == h.astype(np.float32).tolist()
    bf = _at_offset(bytes(2 * f.size), (offset + 5) % 8)
    kernels.f32_to_bf16(src, bf, 0xFFFF)  # type: ignore[attr-defined]
    want = ((f.view(np.uint32).astype(np.uint64) + 0x7FFF + ((f.view(np.uint32) >> 16) & 1)) >> 16).astype(np.uint16)
    assert np.frombuffer(bf, dtype=np.uint16).tolist() == want.tolist()
    rows, cols = 17, 59
    m = f[:rows * cols].reshape(rows, cols)
    t = _at_offset(bytes(2 * rows * 50), (offset + 6) % 8)
    kernels.transpose_f32_to_f16(_at_offset(m.tobytes(), offset), t, rows, cols, 9, 50)  # type: ignore[attr-defined]
    want_t = m[:, 9:59].T.astype(np.float16).view(np.uint16)
    assert np.array_equal(np.frombuffer(t, dtype=np.uint16).reshape(50, rows), want_t)


def test_kernels_refuse_overlapping_buffers(kernels: object) -> None:
    """The loops assume the source and target do not overlap (`restrict`): such a call is refused."""
    store = memoryview(bytearray(4096))
    with pytest.raises(ValueError, match="overlap"):
        kernels.f32_to_f16(store[:2048], store[1024:2048])  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="overlap"):
        kernels.transpose(store[:1024], store[512:1536], 16, 16, 4, 0, 16)  # type: ignore[attr-defined]
    kernels.f32_to_f16(store[:2048], store[2048:3072])  # type: ignore[attr-defined]  # adjacent is fine
