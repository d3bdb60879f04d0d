"""The compiled band loops (core/dequant.py, kernels/dequant.c) plugged into the schemes' `band_bits`.

The FP8 schemes (`fp8`, compressed-tensors `float-quantized`) compute their bands in numpy
(`dequantize`); the loop here gives the same bits straight into the output dtype, one 2-D matrix of
the weight at a time (a band of an expert-stacked weight may span matrices). The schemes of this
branch's modules (pack-quantized, MXFP4, MLX) call `core.dequant` themselves, kernel first.

A case the loop does not take returns None and numpy runs: no compiled kernels, an F64 output, and a
product rounded to F16 then written as BF16 (torch's F16 -> BF16 cast quiets a NaN to 0x7FC0, the
numpy path rounds from float32: the two differ on NaN codes only, and the numpy path is the one
tested against the references there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...core import dequant as dq
from ...core.dtypes import DType
from .scheme import KERNELS, Band, QuantizedWeight, Scheme

if TYPE_CHECKING:
    import numpy as np

OUT = frozenset({"F32", "BF16", "F16"})


def banded_matrices(weight: QuantizedWeight, band: Band, grid_of: Callable[[int], np.ndarray],
                    run: Callable[[int, int, int, np.ndarray], np.ndarray], out: np.ndarray) -> np.ndarray:
    """Fill `out` ([band rows, columns]) matrix by matrix: `grid_of(m)` is matrix m's 2-D scale grid,
    `run(lo, hi, row0, grid)` computes the band's rows [lo, hi) (row0: the first one's row in its matrix)."""
    matrix_rows = weight.shape[-2] if len(weight.shape) > 1 else 1
    r = band.start
    while r < band.stop:
        m, row0 = divmod(r, matrix_rows)
        end = min(band.stop, (m + 1) * matrix_rows)
        out[r - band.start:end - band.start] = run(r - band.start, end - band.start, row0, grid_of(m))
        r = end
    return out


def fp8_bits(scheme: Scheme, weight: QuantizedWeight, band: Band, to: DType) -> np.ndarray | None:
    """An F8_E4M3 weight's band times its block scales, in `to`'s bits (both FP8 schemes)."""
    import numpy as np

    mid = "F32" if scheme.name == "fp8" else weight.info["scale_dtype"].name
    if dq.kernels() is None or to.name not in OUT or (mid == "F16" and to.name == "BF16"):
        return None
    block = weight.info["block"]
    scale_dtype = weight.info["scale_dtype"].name
    scales = band.parts["scale"]
    codes = band.parts["weight"].view(np.uint8)
    cols = weight.columns
    if scales.size == 1:
        def grid_of(m: int) -> np.ndarray:
            return scales.reshape(1, 1)
    else:
        per_matrix = scales.reshape(-1, scales.shape[-2], scales.shape[-1])

        def grid_of(m: int) -> np.ndarray:
            return per_matrix[m]

    def run(lo: int, hi: int, row0: int, grid: np.ndarray) -> np.ndarray:
        n = hi - lo
        first, last = row0 // block[0], (row0 + n - 1) // block[0]
        return dq.dequantize_band(codes[lo:hi], dq.E4M3, rows=n, row_bytes=cols, cols=cols, row0=row0,
                                  scales=grid[first:last + 1], scale_dtype=scale_dtype, block=block, mid=mid,
                                  out=to.name, name=weight.parts["scale"])

    out = np.empty((band.stop - band.start, cols), dtype=dq.out_numpy_dtype(to.name))
    return banded_matrices(weight, band, grid_of, run, out)


KERNELS["fp8"] = fp8_bits
KERNELS["compressed-tensors float-quantized"] = fp8_bits
