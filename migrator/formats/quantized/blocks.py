"""The arithmetic the block-scaled schemes share: FP8 codes as float32, scales as float32 (checked),
and a band's scale per element.

Every scale layout of FP8 is a grid of blocks over each 2-D matrix of the weight: a block of `bh` rows
and `bw` columns shares one scale, and the grid's last row and column of blocks are cropped to the
matrix (DeepSeek-V3's and compressed-tensors' `block` strategy); a per-tensor scale is one block the
size of the matrix, a per-channel scale a block of one row. `expanded` gives each element of a band
of rows its block's scale, whatever leading (expert) dimensions the weight has.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from ...core.dtypes import DType
from .scheme import QuantizationError

FLOAT_SCALES = frozenset({"F32", "BF16", "F16"})
"""Scale dtypes read as they are (F8_E8M0 is read as the power of two it codes)."""


@cache
def _e4m3_table() -> np.ndarray:
    """The float32 value of each of the 256 F8_E4M3 (fn) codes (NaN at 0x7F and 0xFF, with torch's bits:
    the sign and payload kept, which an F16 or F32 output shows; the compiled loop gives the same)."""
    from ...core.dequant import code_values

    return code_values("e4m3")


@cache
def _e4m3_pairs() -> np.ndarray:
    """The two float32 values of every pair of F8_E4M3 codes read as one little-endian uint16 (low byte
    first), as one uint64 each: 512 KiB, one lookup per two codes."""
    table = _e4m3_table()
    index = np.arange(65536)
    return np.stack([table[index & 0xFF], table[index >> 8]], axis=1).view(np.uint64).reshape(-1)


def e4m3_values(codes: np.ndarray) -> np.ndarray:
    """F8_E4M3 codes (any dtype of one byte) as float32, exactly, in the codes' shape."""
    raw = np.ascontiguousarray(codes).view(np.uint8)
    if raw.size % 2 == 0 and raw.ndim and raw.shape[-1] % 2 == 0:  # pairs of codes: half the lookups
        return np.take(_e4m3_pairs(), raw.view("<u2")).view(np.float32).reshape(raw.shape)
    return np.take(_e4m3_table(), raw)  # take: about twice as fast as indexing


def scale_values(scales: np.ndarray, dtype: DType) -> np.ndarray:
    """Stored scales as float32: F32/BF16/F16 exactly, F8_E8M0 as 2**(code - 127) (code 255 is NaN)."""
    if dtype.name == "F8_E8M0":
        codes = scales.view(np.uint8).astype(np.int32)
        nan = codes == 255
        out = np.ldexp(1.0, np.where(nan, 127, codes) - 127).astype(np.float32)  # 2**-127 is an F32 subnormal
        out[nan] = np.nan
        return out
    return scales.astype(np.float32)


def check_scales(values: np.ndarray, name: str, file: str | None, *, power_of_two: bool = False,
                 code_255: bool = False) -> None:
    """Refuse scales no weight was quantized with: NaN, infinite or zero (every value of its block
    would be lost), and with `power_of_two` (a `ue8m0` declaration) any that is not a power of two."""
    flat = values.reshape(-1)
    bad = ~np.isfinite(flat)
    if bad.any():
        i = int(np.argmax(bad))
        what = "E8M0 code 255 (NaN)" if code_255 else str(float(flat[i]))
        raise QuantizationError(f"scale {what} at flat index {i}: a scale must be finite", file=file, tensor=name)
    zero = flat == 0
    if zero.any():
        i = int(np.argmax(zero))
        raise QuantizationError(f"scale 0 at flat index {i}: a zero scale loses its whole block", file=file,
                                tensor=name)
    if power_of_two:
        mantissa = np.frexp(flat)[0]
        off = np.abs(mantissa) != 0.5
        if off.any():
            i = int(np.argmax(off))
            raise QuantizationError(f"scale {float(flat[i])} at flat index {i} is not a power of two, as scale_fmt "
                                    "ue8m0 declares", file=file, tensor=name)


def grid(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    """The scale grid of a weight of `shape` in blocks of `block`: leading dims, then the blocks
    (last row and column cropped: ceil)."""
    rows, cols = shape[-2], shape[-1]
    return (*shape[:-2], -(-rows // block[0]), -(-cols // block[1]))


def expanded(scales: np.ndarray, start: int, stop: int, matrix_rows: int, block: tuple[int, int],
             columns: int) -> np.ndarray:
    """Each element's scale over rows [start, stop) of the weight seen as (rows, columns): `scales`
    is the grid flattened to 2-D ((leading * block rows), block columns), `matrix_rows` the rows of
    one 2-D matrix (the weight's second-to-last dimension)."""
    bh, bw = block
    grid_rows = -(-matrix_rows // bh)
    rows = np.arange(start, stop, dtype=np.int64)
    index = (rows // matrix_rows) * grid_rows + (rows % matrix_rows) // bh
    per_row = scales[index]  # (band rows, block columns)
    if per_row.shape[1] == 1:
        return per_row  # one scale per row: broadcast
    return np.repeat(per_row, bw, axis=1)[:, :columns]
