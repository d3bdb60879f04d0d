"""Dequantizing row bands of quantized weights: the loops every quantized scheme shares (issue 43).

A quantized weight is a matrix of codes, each row a little-endian bit stream of `bits`-bit codes
(FP8 bytes; E2M1 nibbles, low one first; compressed-tensors' int32 and MLX's uint32 words of packed
integers, read as bytes on a little-endian host), and a grid of scales, one per block of
`block_rows` x `block_cols` elements (per tensor, per row, per group of columns, per 2-D block; the
blocks at the right and bottom edges are cropped). An element is

    p = value(code) * scale      in float32: an FP8/E2M1 value, or the integer code - offset - zero
    p = mid(p)                   rounded to the reference's compute dtype (the scales' dtype)
    p = mid(p + bias)            with biases (MLX affine)
    out = cast(p, mid -> out)    torch's cast rules

which is the order of the references (compressed-tensors' `_dequantize` computes in the scale's dtype
and casts; its FP8 block dequantizer and transformers' MXFP4 one compute in float32; MLX rounds after
the product and after the sum): tests/core/test_dequant.py checks each against it bit for bit.

`dequantize_band` runs the compiled loop (kernels/dequant.c) when it was built, else numpy, which
gives the same bits. Both refuse a NaN, infinite or zero scale (or bias), and E8M0's 255, naming the
tensor and the scale's position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import native
from .errors import FormatError

F32, BF16, F16, E8M0 = "F32", "BF16", "F16", "F8_E8M0"
_FT = {F32: 0, BF16: 1, F16: 2, E8M0: 3}
_SIZE = {F32: 4, BF16: 2, F16: 2, E8M0: 1}
KINDS = {"int": 0, "e4m3": 1, "e5m2": 2, "e2m1": 3}
"""Code kinds: packed integers, F8_E4M3 (e4m3fn), F8_E5M2, E2M1 (FP4)."""


@dataclass(frozen=True)
class Codes:
    """What a code is: `kind` (a KINDS key), its width, and for integers the offset subtracted (2^(bits-1)
    for compressed-tensors' stored-unsigned signed values, 0 for MLX's unsigned ones)."""

    kind: str
    bits: int
    offset: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown code kind {self.kind!r}")
        want = {"e4m3": 8, "e5m2": 8, "e2m1": 4}.get(self.kind)
        if not 1 <= self.bits <= 8 or (want is not None and self.bits != want):
            raise ValueError(f"{self.kind} codes cannot be {self.bits} bits wide")


E4M3 = Codes("e4m3", 8)
E5M2 = Codes("e5m2", 8)
E2M1 = Codes("e2m1", 4)


def kernels() -> Any:
    """The compiled loops when built with `dequant_band`, else None (numpy only)."""
    k = native.kernels
    return k if k is not None and hasattr(k, "dequant_band") else None


def out_numpy_dtype(out: str) -> np.dtype[Any]:
    """The unsigned integer dtype holding `out`'s bit patterns."""
    return np.dtype(np.uint32) if out == F32 else np.dtype(np.uint16)


def dequantize_band(src: Any, codes: Codes, *, rows: int, row_bytes: int, cols: int, scales: np.ndarray,
                    scale_dtype: str, block: tuple[int, int], mid: str, out: str, col0: int = 0, row0: int = 0,
                    zeros: np.ndarray | None = None, biases: np.ndarray | None = None, name: str = "?",
                    use_kernels: bool = True) -> np.ndarray:
    """Rows [row0, row0 + rows) of a quantized matrix, output columns [col0, col0 + cols): a
    [rows, cols] array of `out`'s bit patterns (uint16 or uint32).

    `src` holds the band's rows, `row_bytes` bytes each. `scales` (a 2-D array of `scale_dtype`'s bytes or
    values, `scale_cols` wide) holds the scale rows the band touches: rows row0 // block_rows through
    (row0 + rows - 1) // block_rows of the whole grid. `zeros` (int8, the zero points as signed values)
    and `biases` (of `scale_dtype`) have the scales' layout. `mid` is the compute dtype, `out` the result's."""
    if mid not in (F32, BF16, F16) or out not in (F32, BF16, F16) or scale_dtype not in _FT:
        raise ValueError(f"bad dtypes: scales {scale_dtype}, compute {mid}, out {out}")
    scale_cols = scales.shape[-1] if scales.ndim else 1
    sbytes = np.ascontiguousarray(scales).reshape(-1).view(np.uint8)
    zbytes = None if zeros is None else np.ascontiguousarray(zeros, dtype=np.int8).reshape(-1).view(np.uint8)
    bbytes = None if biases is None else np.ascontiguousarray(biases).reshape(-1).view(np.uint8)
    raw = np.frombuffer(src, dtype=np.uint8) if not isinstance(src, np.ndarray) else src.reshape(-1).view(np.uint8)
    result = np.empty((rows, cols), dtype=out_numpy_dtype(out))
    br, bc = block
    k = kernels() if use_kernels else None
    if k is not None:
        bad = k.dequant_band(raw, result, KINDS[codes.kind], codes.bits, codes.offset, rows, row_bytes, col0, cols,
                             row0, br, bc, sbytes, _FT[scale_dtype], scale_cols, zbytes, bbytes, _FT[mid], _FT[out])
    else:
        bad = _band_numpy(raw, result, codes, rows, row_bytes, col0, cols, row0, br, bc, sbytes, scale_dtype,
                          scale_cols, zbytes, bbytes, mid, out)
    if bad >= 0:
        srow, scol = divmod(int(bad), scale_cols)
        what = "scale (or bias)" if biases is not None else "scale"
        raise FormatError(f"{what} [{row0 // br + srow}, {scol}] is NaN, infinite, zero or E8M0 255", tensor=name)
    return result


def decode_e8m0(raw: Any, name: str = "?", use_kernels: bool = True) -> np.ndarray:
    """E8M0 bytes -> float32 2^(e-127) (0 -> the subnormal 2^-127); 255 (E8M0's NaN) is refused."""
    b = np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw.reshape(-1).view(np.uint8)
    out = np.empty(b.shape, dtype=np.uint32)
    k = kernels() if use_kernels else None
    if k is not None:
        bad = k.e8m0_to_f32(b, out)
    else:
        hit = np.flatnonzero(b == 255)
        bad = int(hit[0]) if hit.size else -1
        out[:] = np.where(b == 0, np.uint32(0x0040_0000), b.astype(np.uint32) << 23)
    if bad >= 0:
        raise FormatError(f"E8M0 scale {bad} is 255 (NaN)", tensor=name)
    return out.view(np.float32)


def code_values(kind: str) -> np.ndarray:
    """The float32 value of every code of an FP8 or E2M1 `kind`, as torch widens them (a NaN code keeps
    its sign and payload: E4M3's 0x7F is 0x7FF00000, not numpy's or ml_dtypes' canonical NaN)."""
    return _code_bits(kind).view(np.float32)


def unpack_codes(raw: np.ndarray, bits: int, count: int) -> np.ndarray:
    """[rows, row_bytes] bytes -> [rows, count] unsigned codes (uint32): each row a little-endian bit
    stream of `bits`-bit fields (compressed-tensors' and MLX's packing)."""
    return _unpack(raw, bits, 0, count)


# -- the numpy path: the same rules as dequant.c, whole arrays at a time --------------------------------

def _code_bits(kind: str) -> np.ndarray:
    """Every code of `kind` -> its float32 bits, as torch widens FP8 (dequant.c's code_bits)."""
    if kind == "e2m1":
        mags = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32).view(np.uint32)
        c = np.arange(16, dtype=np.uint32)
        return ((c & 8) << 28) | mags[c & 7]
    c = np.arange(256, dtype=np.uint32)
    if kind == "e5m2":
        return _f16_to_f32_bits((c << 8).astype(np.uint16))
    sign, e, m = (c & 0x80) << 24, (c >> 3) & 0xF, c & 7
    sub = (m.astype(np.float32) * np.float32(0.001953125)).view(np.uint32)
    bits = np.where(e > 0, ((e + 120) << 23) | (m << 20), sub)
    return sign | np.where((e == 15) & (m == 7), np.uint32(0x7FF0_0000), bits)


def _f16_to_f32_bits(h: np.ndarray) -> np.ndarray:
    f = h.view(np.float16).astype(np.float32).view(np.uint32)
    return np.where(np.isnan(f.view(np.float32)), f | np.uint32(0x0040_0000), f)


def _f32_to_f16_bits(u: np.ndarray) -> np.ndarray:
    f = u.view(np.float32)
    with np.errstate(over="ignore"):
        h = f.astype(np.float16).view(np.uint16)
    nan_bits = (((u >> 16) & 0x8000) | 0x7E00 | ((u >> 13) & 0x3FF)).astype(np.uint16)
    return np.where(np.isnan(f), nan_bits, h)


def _rne_bf16(u: np.ndarray) -> np.ndarray:
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _round_to(p: np.ndarray, ft: str) -> np.ndarray:
    u = p.view(np.uint32)
    if ft == BF16:
        r = _rne_bf16(u).astype(np.uint32) << 16
        return np.where(np.isnan(p), np.uint32(0xFFFF_0000), r).view(np.float32)  # torch's vector rule
    if ft == F16:
        return _f16_to_f32_bits(_f32_to_f16_bits(u)).view(np.float32)
    return p


def _cast_out(p: np.ndarray, mid: str, out: str) -> np.ndarray:
    u = p.view(np.uint32)
    if out == F32:
        return u
    if out == F16:
        return _f32_to_f16_bits(u)
    if mid == BF16:
        return (u >> 16).astype(np.uint16)
    return np.where(np.isnan(p), np.uint16(0x7FC0 if mid == F16 else 0xFFFF), _rne_bf16(u))


def _floats(raw: np.ndarray, ft: str) -> np.ndarray:
    """Scale or bias bytes -> float32 values (E8M0 255 -> NaN, refused with the other NaNs)."""
    if ft == F32:
        return raw.view("<f4")
    if ft == BF16:
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    if ft == F16:
        return _f16_to_f32_bits(raw.view("<u2")).view(np.float32)
    e = raw.astype(np.uint32)
    bits = np.where(e == 0, np.uint32(0x0040_0000), e << 23)
    return np.where(e == 255, np.uint32(0x7FC0_0000), bits).view(np.float32)


def _unpack(raw: np.ndarray, bits: int, col0: int, cols: int) -> np.ndarray:
    """[rows, row_bytes] bytes -> [rows, cols] codes (uint32) at bit positions (col0 + j) * bits."""
    if bits == 8:
        return raw[:, col0:col0 + cols].astype(np.uint32)
    pos = (col0 + np.arange(cols, dtype=np.int64)) * bits
    at, shift = pos >> 3, (pos & 7).astype(np.uint32)
    padded = np.concatenate([raw, np.zeros((raw.shape[0], 1), dtype=np.uint8)], axis=1).astype(np.uint32)
    word = padded[:, at] | (padded[:, at + 1] << 8)
    return (word >> shift) & np.uint32((1 << bits) - 1)


def _band_numpy(raw: np.ndarray, result: np.ndarray, codes: Codes, rows: int, row_bytes: int, col0: int, cols: int,
                row0: int, br: int, bc: int, sbytes: np.ndarray, scale_dtype: str, scale_cols: int,
                zbytes: np.ndarray | None, bbytes: np.ndarray | None, mid: str, out: str) -> int:
    if rows == 0 or cols == 0:
        return -1
    if raw.size != rows * row_bytes or (col0 + cols) * codes.bits > row_bytes * 8:
        raise ValueError("dequant_band: buffers do not match the band")
    first_sr = row0 // br
    srows = (row0 + rows - 1) // br - first_sr + 1
    s = _floats(sbytes, scale_dtype).reshape(srows, scale_cols)
    b = None if bbytes is None else _floats(bbytes, scale_dtype).reshape(srows, scale_cols)
    # the scales the band uses, in dequant.c's order (block rows, then block columns): the first bad one
    c_lo, c_hi = col0 // bc, (col0 + cols - 1) // bc + 1
    bad = ~np.isfinite(s[:, c_lo:c_hi]) | (s[:, c_lo:c_hi] == 0)
    if b is not None:
        bad |= ~np.isfinite(b[:, c_lo:c_hi])
    if bad.any():
        r, c = divmod(int(np.argmax(bad.reshape(-1))), c_hi - c_lo)
        return r * scale_cols + c + c_lo
    ri = (row0 + np.arange(rows)) // br - first_sr
    ci = (col0 + np.arange(cols)) // bc
    q = _unpack(raw.reshape(rows, row_bytes), codes.bits, col0, cols)
    if codes.kind == "int":
        v = q.astype(np.int32) - np.int32(codes.offset)
        if zbytes is not None:
            v -= zbytes.view(np.int8).reshape(srows, scale_cols)[ri][:, ci].astype(np.int32)
        x = v.astype(np.float32)
    else:
        x = _code_bits(codes.kind)[q].view(np.float32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        p = _round_to(x * s[ri][:, ci], mid)
        if b is not None:
            p = _round_to(p + b[ri][:, ci], mid)
    result[...] = _cast_out(p, mid, out)
    return -1
