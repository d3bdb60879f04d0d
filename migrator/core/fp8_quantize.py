"""Float weights to F8_E4M3 with scales, as compressed-tensors 0.20 quantizes them (no calibration data).

compressed-tensors computes in the weight's own dtype (BF16 weights give BF16 scales), so every step
here is one of its torch steps, rounded where torch rounds:

* scale: `calculate_qparams` of the block's (or row's) min and max: ``absmax / 448`` (the FP8 range
  ``bit_range / 2``, made the weight's dtype), a torch division in the weight's dtype: for BF16/F16 the
  F32 quotient rounded once to BF16/F16 (torch's CPU kernels divide reduced floats in F32); a zero
  scale becomes the scale dtype's epsilon (``torch.finfo(dtype).eps``), as it does;
* value: `quantize` -> ``x / scale`` in the weight's dtype (again the F32 quotient rounded to it),
  plus the symmetric zero point (``+ 0.0``, which makes -0.0 into +0.0 before rounding), clamped to
  [-448, 448], then rounded to F8_E4M3 (nearest, ties to even).

The channel strategy needs one scale per row: a band of rows is quantized on its own. The block
strategy needs one scale per 128x128 block: a band of 128 rows (the last may be shorter; the last
block column may be narrower, compressed-tensors pads it with zeros, which change no maximum).

NaN or inf weights have no scale: refused (`QuantizeError`) by the caller, who names the tensor.

F32 and BF16 bands go through the compiled loops (migrator/core/kernels/fp8_quantize.c) when they were
built, reading the stored bytes as they are; F16 bands, and every band without the kernels
(MIGRATOR_NO_KERNELS=1), through the numpy functions below, which give the same bits
(tests/core/test_fp8_quantize.py checks both against compressed-tensors).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

FP8_MAX = 448.0
"""The largest F8_E4M3 (e4m3fn) value: compressed-tensors' ``FP8_E4M3_DATA.max``."""

SCALE_DTYPES = ("F32", "BF16", "F16")
"""The weight dtypes quantized (the scale has the weight's dtype)."""


def np_dtype(name: str) -> np.dtype:
    import ml_dtypes

    return np.dtype({"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}[name])


def _eps(name: str) -> np.float32:
    """torch.finfo(dtype).eps of the scale's dtype: what a zero scale becomes."""
    return np.float32({"F32": 2.0 ** -23, "F16": 2.0 ** -10, "BF16": 2.0 ** -7}[name])


def _in_dtype(values: np.ndarray, name: str) -> np.ndarray:
    """F32 values rounded to `name` (nearest, ties to even) and widened back to F32 (exact)."""
    if name == "F32":
        return values
    return values.astype(np_dtype(name)).astype(np.float32)


def as_f32(raw: np.ndarray, name: str) -> np.ndarray:
    """A band of `name` elements (an array of that dtype) as F32 (exact)."""
    return raw if raw.dtype == np.float32 else raw.astype(np.float32)


def scales_from_absmax(absmax: np.ndarray, name: str) -> np.ndarray:
    """`calculate_qparams`' scale of each max |x| (F32 array, exact): ``absmax / 448`` in `name`, zeros
    made epsilon; returned as F32 holding values of `name`."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale = _in_dtype(absmax / np.float32(FP8_MAX), name)
    return np.where(scale == 0, _eps(name), scale).astype(np.float32)


def channel_absmax(band: np.ndarray) -> np.ndarray:
    """max |x| of each row of an F32 band [rows, cols] -> [rows, 1] (0 for an empty row)."""
    if band.shape[1] == 0:
        return np.zeros((band.shape[0], 1), dtype=np.float32)
    return np.abs(band).max(axis=1, keepdims=True)


def block_absmax(band: np.ndarray, block: int) -> np.ndarray:
    """max |x| of each `block`-wide column block of an F32 band of at most `block` rows -> [1, blocks]."""
    rows, cols = band.shape
    n = -(-cols // block)
    out = np.zeros((1, n), dtype=np.float32)
    if rows == 0 or cols == 0:
        return out
    whole = cols // block
    if whole:
        out[0, :whole] = np.abs(band[:, :whole * block]).reshape(rows, whole, block).max(axis=(0, 2))
    if whole < n:
        out[0, whole] = np.abs(band[:, whole * block:]).max()
    return out


def quantize_band(band: np.ndarray, scales: np.ndarray, name: str) -> np.ndarray:
    """F8_E4M3 of an F32 band (values of dtype `name`) divided by `scales` (F32 holding `name` values,
    broadcastable to the band): compressed-tensors' `quantize` step by step (module docstring)."""
    import ml_dtypes

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = _in_dtype(band / scales, name)
    q += np.float32(0.0)  # the symmetric zero point: -0.0 becomes +0.0, as in compressed-tensors
    np.clip(q, -FP8_MAX, FP8_MAX, out=q)
    return q.astype(ml_dtypes.float8_e4m3fn)


def block_columns(scales_row: np.ndarray, cols: int, block: int) -> np.ndarray:
    """A band's [1, blocks] scales as one scale per column [1, cols]."""
    return np.repeat(scales_row, block, axis=1)[:, :cols]


_KINDS = {"F32": 0, "BF16": 1}


def _load_kernels() -> Any:
    if os.environ.get("MIGRATOR_NO_KERNELS"):
        return None
    try:
        from . import _kernels  # type: ignore[attr-defined]  # the C extension: no stub
    except ImportError:
        return None
    return _kernels if hasattr(_kernels, "fp8_quantize") else None


KERNELS = _load_kernels()
"""The compiled loops, or None (then numpy does the same work)."""


def compiled(name: str) -> bool:
    """Whether bands of dtype `name` go through the compiled loops."""
    return KERNELS is not None and name in _KINDS


def absmax_raw(raw: Any, name: str, rows: int, cols: int, block: int) -> np.ndarray:
    """The compiled max |x| of a band's stored bytes: [rows, 1] per row (block 0), or [1, blocks] per
    `block`-wide column block (`compiled(name)` must hold)."""
    groups = -(-cols // block) if block else rows
    out = np.empty(groups, dtype=np.float32)
    KERNELS.fp8_absmax(raw, _KINDS[name], rows, cols, block, out)
    return out.reshape((rows, 1) if not block else (1, groups))


def quantize_raw(raw: Any, name: str, rows: int, cols: int, scales: np.ndarray, block: int) -> np.ndarray:
    """The compiled `quantize_band` of a band's stored bytes: `scales` [rows, 1] (block 0) or [1, blocks]."""
    out = np.empty((rows, cols), dtype=np.uint8)
    KERNELS.fp8_quantize(raw, _KINDS[name], rows, cols, np.ascontiguousarray(scales, dtype=np.float32), block, out)
    return out
