"""The compiled transpose loops on their own, band by band, against numpy.

Not in test_casts.py: its fixture also runs every test on the numpy path, which has no kernel.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from migrator import casts

KERNELS = casts.kernels


@pytest.fixture(params=["vector", "portable"])
def kernels(request: pytest.FixtureRequest) -> Iterator[object]:
    """The kernels with their AVX/F16C loops allowed, then with only the portable (SSE2) ones."""
    if KERNELS is None:
        pytest.skip("migrator._kernels not built (test_casts.test_kernels_built_when_a_compiler_exists says why)")
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
