"""ggml's block quantizations: every type llama.cpp writes dequantized to F32, five quantized from F32.

Each `_dq_*` takes blocks as a (n, type_size) uint8 array and returns (n, block_size) float32, with
the arithmetic of ggml's reference dequantizers (`dequantize_row_*` in ggml-quants.c) in the same
order of float32 operations, so results are bit-equal to ggml's and to gguf-py's. Each `_q_*`
quantizes (n, block_size) float32 blocks bit-equal to ggml's `quantize_row_*_ref`. Work is done a
slab of blocks at a time (`SLAB_BLOCKS`), so temporaries stay in cache whatever the tensor's size.

The K-quants (`K_QUANTIZED`: Q2_K..Q6_K) are quantized by the compiled kernels only
(`migrator/core/kernels/kquants.c`, bit-equal to ggml's reference quantizers): their fit is a search over
candidate scales per sub-block, element by element, which numpy would run at a few MB/s. Without the
kernels they are refused (`KQuantsUnavailableError`, raised when a plan chooses one). Large inputs
are split over the available CPUs (`quantize`), the loops running without the GIL.

Block layouts (bytes, little-endian): see each function. The IQ types index fixed grids (`grids.py`);
their sign patterns (`ksigns`) follow a rule and are made here.
"""

from __future__ import annotations

import base64
import itertools
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import numpy as np

from ...core.errors import UnsupportedDTypeError
from .constants import BY_NAME, QK_K, GGMLType

F32 = np.float32
SLAB_BLOCKS = 2048  # blocks per step: ~0.5 MiB of F32 output for 256-element blocks


def _f16(col: np.ndarray) -> np.ndarray:
    """A column of f16 scales stored as 2 bytes each (n, 2) -> (n, 1) float32."""
    return np.ascontiguousarray(col).view("<f2").astype(F32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 2k): the k low nibbles, then the k high nibbles (ggml's 4-bit order)."""
    return np.concatenate((qs & 0x0F, qs >> 4), axis=1)


def _bits(x: np.ndarray, count: int, width: int = 1) -> np.ndarray:
    """(..., k) unsigned ints -> (..., count, k): field i is bits [i*width, (i+1)*width) of each."""
    shifts = np.arange(0, count * width, width, dtype=x.dtype).reshape(count, 1)
    return (x[..., None, :] >> shifts) & x.dtype.type((1 << width) - 1)


def _bits_last(x: np.ndarray, count: int, width: int = 1) -> np.ndarray:
    """(..., k) unsigned ints -> (..., k, count): bits of each value along a new last axis."""
    shifts = np.arange(0, count * width, width, dtype=x.dtype)
    return (x[..., None] >> shifts) & x.dtype.type((1 << width) - 1)


# -- legacy 32-element types --------------------------------------------------------------------

def _dq_q4_0(b: np.ndarray) -> np.ndarray:  # d f16 | 16 bytes of nibbles
    q = _nibbles(b[:, 2:]).view(np.int8) - np.int8(8)
    return _f16(b[:, :2]) * q.astype(F32)


def _dq_q4_1(b: np.ndarray) -> np.ndarray:  # d f16 | m f16 | 16 bytes of nibbles
    return _f16(b[:, :2]) * _nibbles(b[:, 4:]).astype(F32) + _f16(b[:, 2:4])


def _q5(b: np.ndarray, qh_at: int) -> np.ndarray:
    """5-bit values: nibbles from the bytes after qh, the fifth bit j of element j from the u32 qh."""
    qh = np.ascontiguousarray(b[:, qh_at:qh_at + 4]).view("<u4")
    high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4
    return _nibbles(b[:, qh_at + 4:]) | high


def _dq_q5_0(b: np.ndarray) -> np.ndarray:  # d f16 | qh u32 | 16 bytes of nibbles
    return _f16(b[:, :2]) * (_q5(b, 2).view(np.int8) - np.int8(16)).astype(F32)


def _dq_q5_1(b: np.ndarray) -> np.ndarray:  # d f16 | m f16 | qh u32 | 16 bytes of nibbles
    return _f16(b[:, :2]) * _q5(b, 4).astype(F32) + _f16(b[:, 2:4])


def _dq_q8_0(b: np.ndarray) -> np.ndarray:  # d f16 | 32 x i8
    return b[:, 2:].view(np.int8).astype(F32) * _f16(b[:, :2])


# -- K-quants (256-element super-blocks) ----------------------------------------------------------

def _dq_q2_k(b: np.ndarray) -> np.ndarray:  # scales[16] | qs[64] | d f16 | dmin f16
    n = len(b)
    sc = b[:, :16]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (sc & 0x0F).astype(F32)).reshape(n, 16, 1)
    ml = (dmin * (sc >> 4).astype(F32)).reshape(n, 16, 1)
    q = _bits(b[:, 16:80].reshape(n, 2, 32), 4, 2).reshape(n, 16, 16).astype(F32)  # half, shift, byte
    return (dl * q - ml).reshape(n, QK_K)


def _dq_q3_k(b: np.ndarray) -> np.ndarray:  # hmask[32] | qs[64] | scales[12] | d f16
    n = len(b)
    d = _f16(b[:, 108:110])
    low = _nibbles(b[:, 96:104])  # scale i's low 4 bits: byte i % 8, nibble i // 8
    high = _bits(b[:, 104:108], 4, 2).reshape(n, 16)  # its high 2 bits: byte 8 + i % 4, pair i // 4
    scales = ((low | (high << 4)).view(np.int8) - np.int8(32)).astype(F32)
    dl = (d * scales).reshape(n, 16, 1)
    low_q = _bits(b[:, 32:96].reshape(n, 2, 32), 4, 2).reshape(n, 16, 16)
    hmask = _bits(b[:, :32].reshape(n, 1, 32), 8).reshape(n, 16, 16) ^ np.uint8(1)  # bit set: no -4 offset
    q = (low_q.view(np.int8) - (hmask << 2).view(np.int8)).astype(F32)
    return (dl * q).reshape(n, QK_K)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins of Q4_K/Q5_K, from their 12 packed bytes."""
    lo_s, lo_m, mixed = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scales = np.concatenate((lo_s & 0x3F, (mixed & 0x0F) | ((lo_s >> 2) & 0x30)), axis=1)
    mins = np.concatenate((lo_m & 0x3F, (mixed >> 4) | ((lo_m >> 2) & 0x30)), axis=1)
    return scales, mins


def _dq_q4_k(b: np.ndarray) -> np.ndarray:  # d f16 | dmin f16 | scales[12] | qs[128]
    n = len(b)
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc.astype(F32)).reshape(n, 8, 1)
    dm = (_f16(b[:, 2:4]) * mn.astype(F32)).reshape(n, 8, 1)
    qs = b[:, 16:].reshape(n, 4, 1, 32)
    q = np.concatenate((qs & 0x0F, qs >> 4), axis=2).reshape(n, 8, 32).astype(F32)
    return (d * q - dm).reshape(n, QK_K)


def _dq_q5_k(b: np.ndarray) -> np.ndarray:  # d f16 | dmin f16 | scales[12] | qh[32] | qs[128]
    n = len(b)
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc.astype(F32)).reshape(n, 8, 1)
    dm = (_f16(b[:, 2:4]) * mn.astype(F32)).reshape(n, 8, 1)
    qs = b[:, 48:].reshape(n, 4, 1, 32)
    low = np.concatenate((qs & 0x0F, qs >> 4), axis=2).reshape(n, 8, 32)
    high = _bits(b[:, 16:48], 8)  # (n, 8, 32): sub-block i takes bit i of qh[j]
    q = (low | (high << 4)).astype(F32)
    return (d * q - dm).reshape(n, QK_K)


def _dq_q6_k(b: np.ndarray) -> np.ndarray:  # ql[128] | qh[64] | scales i8[16] | d f16
    n = len(b)
    d = (_f16(b[:, 208:210]) * b[:, 192:208].view(np.int8).astype(F32)).reshape(n, 16, 1)
    ql = b[:, :128].reshape(n, 2, 1, 64)
    low = np.concatenate((ql & 0x0F, ql >> 4), axis=2).reshape(n, 8, 32)
    high = _bits(b[:, 128:192].reshape(n, 2, 32), 4, 2).reshape(n, 8, 32)
    q = ((low | (high << 4)).view(np.int8) - np.int8(32)).reshape(n, 16, 16).astype(F32)
    return (d * q).reshape(n, QK_K)


# -- ternary and FP4 types -------------------------------------------------------------------------

_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def _dq_tq1_0(b: np.ndarray) -> np.ndarray:  # qs[48] | qh[4] | d f16: base-3 digits, 5 (4) a byte
    n = len(b)
    first = (b[:, :32].reshape(n, 1, 32) * _POW3.reshape(5, 1)).reshape(n, 160)
    second = (b[:, 32:48].reshape(n, 1, 16) * _POW3.reshape(5, 1)).reshape(n, 80)
    last = (b[:, 48:52].reshape(n, 1, 4) * _POW3[:4].reshape(4, 1)).reshape(n, 16)
    digits = np.concatenate((first, second, last), axis=1)  # byte * 3^k wraps mod 256: digit k on top
    q = ((digits.astype(np.uint16) * 3) >> 8).astype(np.int8) - np.int8(1)
    return _f16(b[:, 52:54]) * q.astype(F32)


def _dq_tq2_0(b: np.ndarray) -> np.ndarray:  # qs[64] | d f16: 2-bit values
    n = len(b)
    q = _bits(b[:, :64].reshape(n, 2, 32), 4, 2).reshape(n, QK_K).view(np.int8) - np.int8(1)
    return _f16(b[:, 64:66]) * q.astype(F32)


_E2M1_DOUBLED = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)


def _e8m0_half(e: np.ndarray) -> np.ndarray:
    """An E8M0 exponent byte as float32 2^(e-127) / 2 (ggml's e8m0_to_fp32_half)."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.view(F32)


def _dq_mxfp4(b: np.ndarray) -> np.ndarray:  # e8m0 | 16 bytes of E2M1 nibbles
    return _e8m0_half(b[:, :1]) * _E2M1_DOUBLED[_nibbles(b[:, 1:])].astype(F32)


def _ue4m3_half(x: np.ndarray) -> np.ndarray:
    """An unsigned E4M3 scale byte as float32, halved (NVFP4's values are doubled E2M1)."""
    exp = (x >> 3).astype(np.int32) & 0xF
    man = (x & 0x7).astype(F32)
    raw = np.where(exp == 0, man * F32(2.0 ** -9), (F32(1) + man / F32(8)) * np.ldexp(F32(1), exp - 7))
    return np.where((x == 0) | (x == 0x7F), F32(0), raw * F32(0.5)).astype(F32)


def _dq_nvfp4(b: np.ndarray) -> np.ndarray:  # 4 x ue4m3 | 4 x 8 bytes of E2M1 nibbles
    n = len(b)
    d = _ue4m3_half(b[:, :4]).reshape(n, 4, 1)
    qs = b[:, 4:].reshape(n, 4, 8)
    q = _E2M1_DOUBLED[np.concatenate((qs & 0x0F, qs >> 4), axis=2)].astype(F32)
    return (d * q).reshape(n, 64)


# -- IQ types ---------------------------------------------------------------------------------------

_IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)


def _dq_iq4_nl(b: np.ndarray) -> np.ndarray:  # d f16 | 16 bytes of nibbles indexing the 16 values
    return _f16(b[:, :2]) * _IQ4_VALUES[_nibbles(b[:, 2:])].astype(F32)


def _dq_iq4_xs(b: np.ndarray) -> np.ndarray:  # d f16 | scales_h u16 | scales_l[4] | qs[128]
    n = len(b)
    high = _bits(np.ascontiguousarray(b[:, 2:4]).view("<u2"), 8, 2).reshape(n, 8).astype(np.uint8)
    low = _bits_last(b[:, 4:8], 2, 4).reshape(n, 8)
    scales = ((low | (high << 4)).view(np.int8) - np.int8(32)).astype(F32)
    dl = (_f16(b[:, :2]) * scales).reshape(n, 8, 1)
    qs = b[:, 8:].reshape(n, 8, 1, 16)
    q = np.concatenate((qs & 0x0F, qs >> 4), axis=2).reshape(n, 8, 32)
    return (dl * _IQ4_VALUES[q].astype(F32)).reshape(n, QK_K)


@cache
def _ksigns() -> np.ndarray:
    """The 128 sign patterns of the IQ2/IQ3 types: 7 sign bits plus an eighth that makes the count of
    negative signs even, as bits of a byte; expanded to (128, 8) float32 of +1/-1."""
    i = np.arange(128, dtype=np.uint8)
    parity = np.unpackbits(i[:, None], axis=1).sum(axis=1) & 1
    pattern = i | (parity.astype(np.uint8) << 7)
    bits = np.unpackbits(pattern[:, None], axis=1, bitorder="little")
    return np.where(bits == 0, F32(1), F32(-1))


@cache
def grid(name: str) -> np.ndarray:
    """The IQ type's lookup grid as float32 rows (decoded once from `grids.py`)."""
    from .grids import GRIDS

    shape, text = GRIDS[name]
    raw = zlib.decompress(base64.b64decode("".join(text)))
    return np.frombuffer(raw, dtype=np.int8).reshape(shape).astype(F32)


def _sign_bits(s: np.ndarray) -> np.ndarray:
    """(n, k) bytes of explicit sign bits -> (n, k, 8) float32 +1/-1."""
    bits = np.unpackbits(s[..., None], axis=-1, bitorder="little")
    return np.where(bits == 0, F32(1), F32(-1))


def _iq_scale(d: np.ndarray, s: np.ndarray, factor: float) -> np.ndarray:
    return d * (F32(0.5) + s.astype(F32)) * F32(factor)


def _dq_iq2_xxs(b: np.ndarray) -> np.ndarray:  # d f16 | 8 x (4 grid bytes, u32 of 4x7 sign bits + scale)
    n = len(b)
    aux = np.ascontiguousarray(b[:, 2:]).view("<u4").reshape(n, 8, 2)
    db = _iq_scale(_f16(b[:, :2]), aux[..., 1] >> 28, 0.25).reshape(n, 8, 1, 1)
    signs = _ksigns()[_bits_last(aux[..., 1], 4, 7)]  # (n, 8, 4, 8)
    rows = grid("IQ2_XXS")[b[:, 2:].reshape(n, 8, 2, 4)[:, :, 0, :]]  # (n, 8, 4, 8)
    return (db * rows * signs).reshape(n, QK_K)


def _dq_iq2_xs(b: np.ndarray) -> np.ndarray:  # d f16 | qs u16[32] (9-bit index, 7 sign bits) | scales[8]
    n = len(b)
    qs = np.ascontiguousarray(b[:, 2:66]).view("<u2")
    db = _iq_scale(_f16(b[:, :2]), _bits_last(b[:, 66:74], 2, 4).reshape(n, 16), 0.25).reshape(n, 16, 1, 1)
    signs = _ksigns()[qs >> 9].reshape(n, 16, 2, 8)
    rows = grid("IQ2_XS")[qs & 511].reshape(n, 16, 2, 8)
    return (db * rows * signs).reshape(n, QK_K)


def _dq_iq2_s(b: np.ndarray) -> np.ndarray:  # d f16 | qs[32] | signs[32] | qh[8] | scales[8]
    n = len(b)
    db = _iq_scale(_f16(b[:, :2]), _bits_last(b[:, 74:82], 2, 4).reshape(n, 16), 0.25).reshape(n, 16, 1, 1)
    signs = _sign_bits(b[:, 34:66]).reshape(n, 16, 2, 8)
    index = b[:, 2:34].astype(np.uint16) | (_bits_last(b[:, 66:74], 4, 2).reshape(n, 32).astype(np.uint16) << 8)
    rows = grid("IQ2_S")[index].reshape(n, 16, 2, 8)
    return (db * rows * signs).reshape(n, QK_K)


def _dq_iq3_xxs(b: np.ndarray) -> np.ndarray:  # d f16 | qs[64] grid indices | u32[8] of 4x7 sign bits + scale
    n = len(b)
    aux = np.ascontiguousarray(b[:, 66:98]).view("<u4")
    db = _iq_scale(_f16(b[:, :2]), aux >> 28, 0.5).reshape(n, 8, 1, 1)
    signs = _ksigns()[_bits_last(aux, 4, 7)]  # (n, 8, 4, 8)
    rows = grid("IQ3_XXS")[b[:, 2:66]].reshape(n, 8, 4, 8)
    return (db * rows * signs).reshape(n, QK_K)


def _dq_iq3_s(b: np.ndarray) -> np.ndarray:  # d f16 | qs[64] | qh[8] | signs[32] | scales[4]
    n = len(b)
    scales = _bits_last(b[:, 106:110], 2, 4).reshape(n, 8)
    db = (_f16(b[:, :2]) * (np.uint8(1) + np.uint8(2) * scales)).reshape(n, 8, 1, 1)
    signs = _sign_bits(b[:, 74:106]).reshape(n, 8, 4, 8)
    index = b[:, 2:66].astype(np.uint16) | (_bits_last(b[:, 66:74], 8).reshape(n, 64).astype(np.uint16) << 8)
    rows = grid("IQ3_S")[index].reshape(n, 8, 4, 8)
    return (db * rows * signs).reshape(n, QK_K)


def _iq1_delta(flag: np.ndarray) -> np.ndarray:
    return np.where(flag == 0, F32(0.125), F32(-0.125))


def _dq_iq1_s(b: np.ndarray) -> np.ndarray:  # d f16 | qs[32] | qh u16[8] (3 index bits x4, 3-bit scale, sign)
    n = len(b)
    qh = np.ascontiguousarray(b[:, 34:50]).view("<u2")
    dl = (_f16(b[:, :2]) * (np.uint16(2) * ((qh >> 12) & 7) + np.uint16(1))).reshape(n, 8, 1, 1)
    delta = _iq1_delta(qh & 0x8000).reshape(n, 8, 1, 1)
    index = b[:, 2:34].astype(np.uint16) | (_bits_last(qh, 4, 3).reshape(n, 32) << 8)
    rows = grid("IQ1_S")[index].reshape(n, 8, 4, 8)
    return (dl * (rows + delta)).reshape(n, QK_K)


def _dq_iq1_m(b: np.ndarray) -> np.ndarray:  # qs[32] | qh[16] | scales u16[4] (3-bit scales; f16 d in top nibbles)
    n = len(b)
    sc = np.ascontiguousarray(b[:, 48:56]).view("<u2")
    top = (sc & np.uint16(0xF000)) >> np.array([12, 8, 4, 0], dtype=np.uint16)
    d = np.bitwise_or.reduce(top, axis=1).view("<f2").astype(F32).reshape(n, 1)
    dl = (d * (np.uint16(2) * _bits_last(sc, 4, 3).reshape(n, 16) + np.uint16(1))).reshape(n, 8, 2, 1, 1)
    qh = _bits_last(b[:, 32:48], 2, 4).reshape(n, 32)
    index = b[:, :32].astype(np.uint16) | ((qh & 7).astype(np.uint16) << 8)
    delta = _iq1_delta(qh & 0x08).reshape(n, 8, 2, 2, 1)
    rows = grid("IQ1_S")[index].reshape(n, 8, 2, 2, 8)
    return (dl * (rows + delta)).reshape(n, QK_K)


DEQUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Q4_0": _dq_q4_0, "Q4_1": _dq_q4_1, "Q5_0": _dq_q5_0, "Q5_1": _dq_q5_1, "Q8_0": _dq_q8_0,
    "Q2_K": _dq_q2_k, "Q3_K": _dq_q3_k, "Q4_K": _dq_q4_k, "Q5_K": _dq_q5_k, "Q6_K": _dq_q6_k,
    "TQ1_0": _dq_tq1_0, "TQ2_0": _dq_tq2_0, "MXFP4": _dq_mxfp4, "NVFP4": _dq_nvfp4,
    "IQ4_NL": _dq_iq4_nl, "IQ4_XS": _dq_iq4_xs, "IQ2_XXS": _dq_iq2_xxs, "IQ2_XS": _dq_iq2_xs,
    "IQ2_S": _dq_iq2_s, "IQ3_XXS": _dq_iq3_xxs, "IQ3_S": _dq_iq3_s, "IQ1_S": _dq_iq1_s, "IQ1_M": _dq_iq1_m,
}


def _kernels() -> Any:
    """The compiled loops (migrator._kernels) when built with `gguf_blocks`, else None (numpy only)."""
    from ...core.native import kernels

    return kernels if kernels is not None and hasattr(kernels, "gguf_blocks") else None


def dequantize(raw: bytes | bytearray | memoryview | np.ndarray, gtype: GGMLType,
               out: np.ndarray | None = None) -> np.ndarray:
    """Blocks of `gtype` (whole blocks, as bytes) -> a flat float32 array, a slab at a time
    (or in one call of a compiled loop, for the types `kernels/gguf.c` and `kquants.c` have: the same bits)."""
    fn = DEQUANTIZERS[gtype.name]
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(-1, gtype.type_size)
    n = len(blocks)
    if out is None:
        out = np.empty(n * gtype.block_size, dtype=F32)
    k = _kernels()
    if k is not None and k.gguf_blocks(f"dequantize {gtype.name}", blocks, out):
        return out
    rows = out.reshape(n, gtype.block_size)
    with np.errstate(over="ignore", invalid="ignore"):  # inf or NaN scales give inf/NaN values, as in ggml
        for i in range(0, n, SLAB_BLOCKS):
            rows[i:i + SLAB_BLOCKS] = fn(blocks[i:i + SLAB_BLOCKS])
    return out


# -- quantizers ---------------------------------------------------------------------------------

def _round_away(x: np.ndarray) -> np.ndarray:
    """Round half away from zero (C's roundf), exactly: rint, then ties moved away from zero."""
    r = np.rint(x)
    tie = np.abs(x - np.trunc(x)) == F32(0.5)
    return np.where(tie, np.trunc(x) + np.sign(x), r)


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, F32(0), F32(1) / d)


def _as_f16_bytes(d: np.ndarray) -> np.ndarray:
    return d.astype("<f2").view(np.uint8).reshape(len(d), 2)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    half = q.shape[1] // 2
    return q[:, :half] | (q[:, half:] << np.uint8(4))


def _pack_high_bits(q: np.ndarray) -> np.ndarray:
    """Bit 4 of each of 32 values, as a little-endian u32 (bytes)."""
    return np.packbits((q >> np.uint8(4)) & np.uint8(1), axis=1, bitorder="little")


def _signed_max(x: np.ndarray) -> np.ndarray:
    """Per block, the value of largest magnitude (the first one, on ties), with its sign."""
    return np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)


def _q_q8_0(x: np.ndarray) -> np.ndarray:
    d = np.abs(x).max(axis=1, keepdims=True) / F32(127)
    q = _round_away(x * _inverse(d)).astype(np.int8).view(np.uint8)
    return np.concatenate((_as_f16_bytes(d), q), axis=1)


def _q_q4_0(x: np.ndarray) -> np.ndarray:
    d = _signed_max(x) / F32(-8)
    q = np.trunc(x * _inverse(d) + F32(8.5)).astype(np.uint8).clip(0, 15)
    return np.concatenate((_as_f16_bytes(d), _pack_nibbles(q)), axis=1)


def _q_q4_1(x: np.ndarray) -> np.ndarray:
    hi, lo = x.max(axis=1, keepdims=True), x.min(axis=1, keepdims=True)
    d = (hi - lo) / F32(15)
    q = np.trunc((x - lo) * _inverse(d) + F32(0.5)).astype(np.uint8).clip(0, 15)
    return np.concatenate((_as_f16_bytes(d), _as_f16_bytes(lo), _pack_nibbles(q)), axis=1)


def _q_q5_0(x: np.ndarray) -> np.ndarray:
    d = _signed_max(x) / F32(-16)
    q = np.trunc(x * _inverse(d) + F32(16.5)).astype(np.uint8).clip(0, 31)
    return np.concatenate((_as_f16_bytes(d), _pack_high_bits(q), _pack_nibbles(q & np.uint8(0x0F))), axis=1)


def _q_q5_1(x: np.ndarray) -> np.ndarray:
    hi, lo = x.max(axis=1, keepdims=True), x.min(axis=1, keepdims=True)
    d = (hi - lo) / F32(31)
    q = np.trunc((x - lo) * _inverse(d) + F32(0.5)).astype(np.uint8).clip(0, 31)
    return np.concatenate((_as_f16_bytes(d), _as_f16_bytes(lo), _pack_high_bits(q), _pack_nibbles(q & np.uint8(0x0F))),
                          axis=1)


QUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Q8_0": _q_q8_0, "Q4_0": _q_q4_0, "Q4_1": _q_q4_1, "Q5_0": _q_q5_0, "Q5_1": _q_q5_1,
}


K_QUANTIZED = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
"""Quantized by the compiled kernels only (bit-equal to ggml's `quantize_row_*_ref`)."""
SPLIT_VALUES = 1 << 20
"""A K-quant input of at least this many values (4 MiB of F32) is split over the available CPUs: the
K-quant fits run at ~70-150 MB/s a core, slower than reading and writing."""
_split_pool: list[ThreadPoolExecutor] = []
_split_lock = threading.Lock()


class KQuantsUnavailableError(UnsupportedDTypeError):
    """A K-quant output without the compiled kernels."""


def require_kernels(name: str) -> None:
    """Raise KQuantsUnavailableError when `name` is a K-quant and the compiled kernels are not built."""
    if name in K_QUANTIZED and _kernels() is None:
        raise KQuantsUnavailableError(
            f"writing {name} needs migrator's compiled kernels (migrator/core/kernels/), which are not built "
            "or are switched off (MIGRATOR_NO_KERNELS): reinstall with a C compiler, or choose Q8_0/Q4_0/Q4_1/"
            "Q5_0/Q5_1")


def _workers() -> int:
    from ...core.cpus import available_cpus

    return min(available_cpus(), 8)


def _pool() -> ThreadPoolExecutor:
    """Threads for the other parts of a split input (their tasks wait on nothing, so they always finish)."""
    with _split_lock:
        if not _split_pool:
            _split_pool.append(ThreadPoolExecutor(max_workers=max(1, _workers() - 1),
                                                  thread_name_prefix="migrator-quantize"))
        return _split_pool[0]


def _quantize_split(k: Any, kind: str, x: np.ndarray, out: np.ndarray, type_size: int) -> None:
    """One kernel call per part of the blocks: the first in this thread, the others on the pool."""
    n = len(x)
    parts = min(_workers(), n)
    bounds = [n * i // parts for i in range(parts + 1)]
    rows = out.reshape(n, type_size)
    futures = [_pool().submit(k.gguf_blocks, kind, x[a:b], rows[a:b]) for a, b in itertools.pairwise(bounds[1:])]
    try:
        k.gguf_blocks(kind, x[:bounds[1]], rows[:bounds[1]])
    finally:
        for f in futures:
            f.result()


def quantize(values: np.ndarray, gtype: GGMLType, out: np.ndarray | None = None) -> np.ndarray:
    """Float32 values (a multiple of the block size) -> the blocks' bytes, as a flat uint8 array."""
    x = np.ascontiguousarray(values, dtype=F32).reshape(-1, gtype.block_size)
    n = len(x)
    if out is None:
        out = np.empty(n * gtype.type_size, dtype=np.uint8)
    k = _kernels()
    kind = f"quantize {gtype.name}"
    if gtype.name in K_QUANTIZED:
        require_kernels(gtype.name)
        if x.size >= SPLIT_VALUES and _workers() > 1:
            _quantize_split(k, kind, x, out, gtype.type_size)
        else:
            k.gguf_blocks(kind, x, out)
        return out
    fn = QUANTIZERS[gtype.name]
    if k is not None and k.gguf_blocks(kind, x, out):
        return out
    rows = out.reshape(n, gtype.type_size)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf inputs: ggml's casts are undefined too
        for i in range(0, n, SLAB_BLOCKS):
            rows[i:i + SLAB_BLOCKS] = fn(x[i:i + SLAB_BLOCKS])
    return out


def quantizable(name: str) -> bool:
    return name in QUANTIZERS or name in K_QUANTIZED


def readable(name: str) -> bool:
    t = BY_NAME.get(name)
    return t is not None and (not t.quantized or name in DEQUANTIZERS)
