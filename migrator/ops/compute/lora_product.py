"""Rows of `scaling * (B @ A)` in F32 with the bits torch's CPU matmul gives (so PEFT's merge_and_unload).

torch 2.13's CPU F32 matmul (MKL's sgemm) does not sum the r products of an element in one fixed way;
measured on an AVX2+FMA x86-64 (docs/merging.md, "Matching PEFT", has the evidence), for the product
`B @ A` of B [m, r] and A [r, n] as PEFT computes it:

- m >= 4 and n >= 12 (every real LoRA layer): acc = +0, then acc = fma(b_k, a_k, acc) for k in
  order, one rounding per step. A rank above 192 is summed in blocks, each such a chain from +0,
  the block sums added in order: two blocks of r // 2 products up to r = 384 (and a block of one
  product left when r is odd), blocks of 192 above. The sum is then added to +0: a chain that
  underflows to -0 (a tiny negative exact sum) comes out +0;
- smaller products: acc = +0, then acc = acc + b_k * a_k, the product and the sum each rounded; this
  is torch's result for m = 1, for n in {2, 3, 4, 8} and for most small products of rank < 8, not
  for all (n = 1 above rank 4, and n in {5, 6, 7, 9, 10, 11} and m in {2, 3} at larger ranks take
  other orders, not reproduced here);
- rank 1 with m, n >= 2: just b_0 * a_0 (torch keeps a -0 there that +0 + (-0) would lose).

With 2 torch threads MKL also gives the last rows of a product of 5 to 11 rows (m in {5, 6, 7, 9, 10,
11}) the small-product sum; this follows the single-thread rule.

The compiled kernel (migrator/core/kernels/lora.c) computes these orders with `fmaf`; without it the
numpy code here gives the same bits: F32 numpy products and sums are IEEE's, and a fused step is the
F64 sum of the F32 accumulator and the exact F64 product, rounded to F32. That double rounding can
differ from one rounding only where the F64 sum lands on a midpoint between two F32 values while the
exact sum does not; a cheap bit test per step finds those (and the sums outside F32's normal range,
where the F32 rounding drops more bits), and `_fma` settles them with the error term of the F64 sum
(Knuth's two-sum). The F64 path (F64 adapters) is numpy's matmul, in OpenBLAS's order: not torch's
bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FUSED, PLAIN, PRODUCT = 0, 1, 2
"""The kernel's modes: fma chain, rounded products summed in order, rank 1's lone product."""

NEEDED = ("lora_band",)


def lora_kernels() -> Any:
    """`migrator.core._kernels` when built with `lora_band` (and not switched off), else None."""
    from ...core import casts

    k = casts.kernels
    return k if k is not None and all(hasattr(k, n) for n in NEEDED) else None


def torch_order(m: int, rank: int, n: int) -> tuple[int, int]:
    """(mode, block) of torch's CPU sum for PEFT's product B [m, rank] @ A [rank, n] (the module doc)."""
    if rank == 1:
        return (PRODUCT if m >= 2 and n >= 2 else PLAIN), 1
    if m >= 4 and n >= 12:
        return FUSED, (rank if rank <= 192 else rank // 2 if rank <= 384 else 192)
    return PLAIN, rank


def _fma(x: np.ndarray, y: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """F32 fma(x, y, acc), each rounded once: x a column [rows, 1], y a row [1, cols], acc [rows, cols]."""
    p = x.astype(np.float64) * y.astype(np.float64)  # exact: 24 + 24 significant bits fit in 53
    z = acc.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + z
        v = s - p
        e = (p - (s - v)) + (z - v)  # two-sum: p + z == s + e exactly (finite values)
        r = s.astype(np.float32)
        back = r.astype(np.float64)
        suspect = (e != 0) & (back != s)  # inexact twice: the only place double rounding can err
        if not suspect.any():
            return r
        toward = np.where(s > back, np.float32(np.inf), np.float32(-np.inf))
        other = np.nextafter(r, toward)
        midpoint = suspect & ((back + other.astype(np.float64)) * 0.5 == s)
        # a tie broken to even by the second rounding; the exact sum s + e lies on e's side of s
        flip = midpoint & ((e > 0) == (other > r))
    return np.where(flip, other, r)


_LOW29 = np.uint64((1 << 29) - 1)  # the F64 significand bits an F32 rounding drops
_HALF29 = np.uint64(1 << 28)  # those bits at an F32 midpoint
_ABS = np.uint64((1 << 63) - 1)
_NORMAL_LO = np.uint64(((1023 - 126) << 52) - 1)  # |s| bits - 1 below this: nonzero under F32's normal range
_NORMAL_SPAN = np.uint64((1151 - (1023 - 126)) << 52)  # from there, the bits of F32's normal range
_CHUNK = 1 << 15  # elements of the fallback's F64 scratch arrays: they stay in the L2 cache


def _fused_chain(b: np.ndarray, a: np.ndarray) -> np.ndarray:
    """The fma chain from +0 over all of b's columns and a's rows, in F32, exactly (the module doc).

    A cheap screen per step finds the F64 sums whose F32 rounding could be a double rounding: on an
    F32 midpoint, or outside F32's normal range (subnormal results drop more bits; overflow, NaN);
    those few go through the exact `_fma`."""
    rows, cols, rank = b.shape[0], a.shape[1], a.shape[0]
    b64, a64 = b.astype(np.float64), a.astype(np.float64)
    out = np.empty((rows, cols), dtype=np.float32)
    step = max(1, _CHUNK // max(1, cols))
    p = np.empty((min(step, rows), cols), dtype=np.float64)
    s, w = np.empty_like(p), np.empty(p.shape, dtype=np.uint64)
    for i in range(0, rows, step):
        n = min(step, rows - i)
        acc = np.zeros((n, cols), dtype=np.float32)
        pk, sk, wk, u = p[:n], s[:n], w[:n], s[:n].view(np.uint64)
        for k in range(rank):
            np.multiply(b64[i:i + n, k:k + 1], a64[k:k + 1], out=pk)  # exact
            np.add(pk, acc, out=sk)  # one F64 rounding
            np.bitwise_and(u, _ABS, out=wk)
            np.subtract(wk, _NORMAL_LO + np.uint64(1), out=wk)  # wraps for |s| below F32's normal range
            odd = wk >= _NORMAL_SPAN
            np.bitwise_and(u, _LOW29, out=wk)
            odd |= wk == _HALF29
            odd &= sk != 0  # a zero sum is exact (signs included) in both formats
            if odd.any():
                fixed = _fma(b[i:i + n, k:k + 1], a[k:k + 1], acc)[odd]  # before acc moves on
                np.copyto(acc, sk, casting="unsafe")
                acc[odd] = fixed
            else:
                np.copyto(acc, sk, casting="unsafe")
        out[i:i + n] = acc
    return out


def numpy_product(b: np.ndarray, a: np.ndarray, mode: int, block: int) -> np.ndarray:
    """b @ a in F32 in the order of `mode` (the kernel's, without it)."""
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are results like any other here
        return _numpy_product(b, a, mode, block)


def _numpy_product(b: np.ndarray, a: np.ndarray, mode: int, block: int) -> np.ndarray:
    rank = a.shape[0]
    if mode == PRODUCT:
        return b[:, :1] * a[:1]
    total = np.zeros((b.shape[0], a.shape[1]), dtype=np.float32)
    for k0 in range(0, rank, block):
        k1 = min(rank, k0 + block)
        if mode == FUSED:
            acc = _fused_chain(b[:, k0:k1], a[k0:k1])
        else:
            acc = np.zeros_like(total)
            for k in range(k0, k1):
                acc += b[:, k:k + 1] * a[k:k + 1]  # the product rounded, then the sum: two ufuncs
        total = acc if k0 == 0 else total + acc
    total += np.float32(0)  # MKL adds its sums to +0: an underflow to -0 comes out +0 (plain: no effect)
    return total


def scaled_product(b: np.ndarray, a: np.ndarray, mode: int, block: int, scaling: float) -> np.ndarray:
    """scaling * (b @ a) for F32 b [rows, rank] and a [rank, cols], as torch: the product, then the
    multiply by scaling rounded to F32."""
    kernels = lora_kernels()
    if kernels is not None:
        out = np.empty((b.shape[0], a.shape[1]), dtype=np.float32)
        kernels.lora_band(np.ascontiguousarray(b), np.ascontiguousarray(a), out, a.shape[0], mode, block, scaling)
        return out
    product = numpy_product(b, a, mode, block)
    with np.errstate(over="ignore"):
        product *= np.float32(scaling)
    return product
