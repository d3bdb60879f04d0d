"""Lazy element-wise transforms on tensor bytes: float casts and 2-D transposes.

Both wrap a `LazyTensor`'s loader, so nothing is read or computed until a writer asks for the
bytes; a plan can describe a cast or a transpose of a 10 GB model without touching it.

Casts equal torch's ``tensor.to(dtype)`` bit for bit (tests/core/test_casts.py checks it on x86-64 CPU),
which is what a user who round-trips through PyTorch will compare against:

* finite values round to nearest, ties to even; overflow gives ±inf; subnormals and -0.0 are kept;
* F64 -> F16/BF16 round twice, through F32, as torch does (``double -> float -> half``), which
  differs from a direct rounding in rare halfway cases;
* NaN bit patterns follow torch's CPU kernels, which numpy and ml_dtypes do not:
  - to F16: sign kept, quiet bit set, payload truncated to its top 10 bits (F16C ``vcvtps2ph``);
  - F32/F64 -> BF16: every NaN becomes ``0xFFFF``; F16 -> BF16: every NaN becomes ``0x7FC0``;
  - F16 -> F32/F64: sign and payload kept, quiet bit set (F16C ``vcvtph2ps``).
    torch itself gives ``0x7FFFFFFF`` for the last ``numel % 8`` elements of a tensor on this
    path (its scalar tail loop); migrator uses the vector rule for every element.
* FLEX32 is F32 bits.

Only Burn's float dtypes (F64, F32, Flex32, F16, BF16) are castable: the FP8/FP6/FP4 types have
no Burn equivalent and torch and ml_dtypes disagree on their overflow behaviour.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from . import dtypes
from .cpus import available_cpus  # a name of this module: tests size the pool through it
from .dtypes import DType, Kind
from .errors import UnsupportedDTypeError
from .inorder import map_ahead
from .streaming import SMALL_READ, read_span
from .tensor import Buffer, LazyTensor

CHUNK_ELEMENTS = 1 << 20
"""Elements converted per step: scratch stays a few times 4 MiB whatever the tensor's size."""
STREAMED_ABOVE = 256 << 10
"""Casts larger than this get streamed `chunks`; a smaller one is written from its loader's one piece."""
CHUNK_BYTES = 1 << 20
"""Bytes per piece a streamed transpose yields (at least one tile band). Small enough that a band is
still in the shared L3 cache when the writer copies it into the page cache, while streaming.Ahead
computes the next ones (larger bands were slower: benchmarks/RESULTS.md)."""

def _load_kernels() -> Any:
    """The compiled loops (migrator/core/kernels/casts.c) if they were built; MIGRATOR_NO_KERNELS=1 turns them off."""
    if os.environ.get("MIGRATOR_NO_KERNELS"):
        return None
    try:
        from . import _kernels  # type: ignore[attr-defined]  # the C extension: no stub
    except ImportError:  # installed without a C compiler: numpy does the same work, bit for bit, slower
        return None
    return _kernels


kernels = _load_kernels()
"""`migrator.core._kernels` or None; tests switch it off to check both paths against torch."""

T = TypeVar("T")
R = TypeVar("R")
MAX_DEFAULT_WORKERS = 8
"""The default pool is at most this large: `pipelined` keeps `workers` pieces in flight (a few MiB
each), and the writer consumes them one at a time, so more threads than that only add memory."""
_pools: dict[int, ThreadPoolExecutor] = {}
_pool_lock = threading.Lock()


def default_workers() -> int:
    """The cast pool's size: `MIGRATOR_CAST_WORKERS` if set, else the available CPUs (at least 2, so
    one piece is computed while the previous one is written; at most MAX_DEFAULT_WORKERS)."""
    given = os.environ.get("MIGRATOR_CAST_WORKERS")
    if given:
        try:
            n = int(given)
        except ValueError:
            raise ValueError(f"MIGRATOR_CAST_WORKERS must be a positive integer, not {given!r}") from None
        if n < 1:
            raise ValueError(f"MIGRATOR_CAST_WORKERS must be a positive integer, not {given!r}")
        return n
    return min(max(2, available_cpus()), MAX_DEFAULT_WORKERS)


def _pool(workers: int) -> ThreadPoolExecutor:
    pool = _pools.get(workers)
    if pool is None:
        with _pool_lock:  # the writer's thread and streaming.Ahead's may both get here first
            pool = _pools.get(workers)
            if pool is None:
                pool = _pools[workers] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="migrator-cast")
    return pool


def pipelined(fn: Callable[[T], R], items: Iterable[T], ahead: int | None = None,
              workers: int | None = None) -> Iterator[R]:
    """`map(fn, items)` computed up to `ahead` items in advance on `workers` threads, yielded in order.

    numpy releases the GIL in casts and copies, and writing releases it in the syscall, so the next
    pieces are computed while the current one is written. At most `ahead + 1` results are alive at
    once, which keeps memory bounded. `workers` defaults to `default_workers()`, `ahead` to `workers`.
    """
    n = default_workers() if workers is None else workers
    if n < 1:
        raise ValueError(f"workers must be >= 1, not {n}")
    ahead = n if ahead is None else ahead
    yield from map_ahead(_pool(n), fn, items, ahead)


_FLOAT = Kind.FLOAT  # a module global is read faster than an enum member
CASTABLE: frozenset[str] = frozenset({"F64", "F32", "FLEX32", "F16", "BF16"})

_UINT: dict[int, np.dtype[Any]] = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}
_BITS_OF = {"F64": 8, "F32": 4, "FLEX32": 4, "F16": 2, "BF16": 2}

_F16_NAN = np.uint16(0x7E00)
_BF16_NAN_FROM_F32 = np.uint16(0xFFFF)
_BF16_NAN_FROM_F16 = np.uint16(0x7FC0)


def _to_f32(bits: np.ndarray, src: str) -> np.ndarray:
    """Source bit patterns -> float32 values, the way torch widens them."""
    if src in ("F32", "FLEX32"):
        return bits.view(np.float32)
    if src == "F64":
        return bits.view(np.float64).astype(np.float32)
    if src == "BF16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    if kernels is not None:
        out = np.empty(bits.shape, dtype=np.uint32)
        kernels.f16_to_f32(bits, out)
        return out.view(np.float32)
    # F16: exact, but numpy keeps signalling NaNs signalling; the hardware quiets them
    out = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(out)
    if nan.any():
        u = out.view(np.uint32)
        u[nan] |= np.uint32(0x0040_0000)
    return out


def _f32_to_f16(f: np.ndarray) -> np.ndarray:
    if kernels is not None:
        out = np.empty(f.shape, dtype=np.uint16)
        kernels.f32_to_f16(np.ascontiguousarray(f), out)
        return out
    out = f.astype(np.float16).view(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        u = f.view(np.uint32)[nan]
        out[nan] = ((u >> 16) & 0x8000).astype(np.uint16) | _F16_NAN | ((u >> 13) & 0x3FF).astype(np.uint16)
    return out


def _f32_to_bf16(f: np.ndarray, nan_bits: np.uint16) -> np.ndarray:
    if kernels is not None:
        out = np.empty(f.shape, dtype=np.uint16)
        kernels.f32_to_bf16(np.ascontiguousarray(f), out, int(nan_bits))
        return out
    u = f.view(np.uint32)
    # round to nearest even on the bit pattern: exact for finite values, overflows to inf
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = nan_bits
    return rounded


def _converter(src: str, dst: str) -> Callable[[np.ndarray], np.ndarray]:
    """A function from a chunk of source bit patterns to a chunk of target bit patterns."""
    if dst == "F64":
        return lambda b: _to_f32(b, src).astype(np.float64).view(np.uint64)
    if dst in ("F32", "FLEX32"):
        return lambda b: _to_f32(b, src).view(np.uint32)
    if dst == "F16":
        return lambda b: _f32_to_f16(_to_f32(b, src))
    nan_bits = _BF16_NAN_FROM_F16 if src == "F16" else _BF16_NAN_FROM_F32
    return lambda b: _f32_to_bf16(_to_f32(b, src), nan_bits)


def from_f32(values: np.ndarray, to: DType) -> np.ndarray:
    """float32 values as `to`'s bit patterns (unsigned ints of its width), rounded as `cast` rounds
    an F32 tensor (torch's `.to(dtype)`): what a computed tensor (a dequantized weight) is written as."""
    if to.name not in CASTABLE:
        raise UnsupportedDTypeError(f"cannot compute {to.display} values: only "
                                    f"{', '.join(dtypes.BY_NAME[n].display for n in sorted(CASTABLE))} are")
    return _converter("F32", to.name)(np.ascontiguousarray(values, dtype=np.float32).view(np.uint32))


def rounded_f32(values: np.ndarray, to: DType) -> np.ndarray:
    """float32 values rounded to `to` (F16, BF16; F32 as they are) and widened back to float32, as torch
    computes an F16 or BF16 product (in float, rounded once to the operands' dtype)."""
    if to.name in ("F32", "FLEX32"):
        return values
    if to.name not in ("F16", "BF16"):
        raise UnsupportedDTypeError(f"cannot round values to {to.display}")
    return _to_f32(from_f32(values, to), to.name)


def cast(tensor: LazyTensor, to: DType) -> LazyTensor:
    """A lazy float -> float cast; non-float tensors and tensors already `to` come back unchanged."""
    src = tensor.dtype
    if src.kind is not _FLOAT or src == to:
        return tensor
    if to.kind is not _FLOAT:
        raise UnsupportedDTypeError(f"cast target must be a float dtype, got {to.display}",
                                    file=tensor.origin, tensor=tensor.name)
    if src.name not in CASTABLE or to.name not in CASTABLE:
        # FP8 codes are a quantized model's weights: their scales, not a cast, give the values
        hint = ("; a quantized model's F8 weights are dequantized with their scales when its folder's config.json "
                "declares quantization_config (read the model folder, not one of its files)"
                if src.name.startswith("F8_") else "")
        raise UnsupportedDTypeError(
            f"cannot cast {src.display} to {to.display}: only "
            f"{', '.join(dtypes.BY_NAME[n].display for n in sorted(CASTABLE))} are castable{hint}",
            file=tensor.origin, tensor=tensor.name)
    transposed = tensor.chunks
    if isinstance(transposed, _TransposedChunks) and _BITS_OF[to.name] < _BITS_OF[src.name]:
        # A cast is element-wise, so it commutes with a transpose bit for bit: narrow first and
        # the transpose moves half (or a quarter) of the bytes.
        inner = transposed.base
        if kernels is not None and src.name in ("F32", "FLEX32") and to.name == "F16":
            # the commonest case (a Linear weight saved as F16) in one pass: read, convert, transpose
            nbytes = tensor.nbytes // 2
            chunks = _TransposedHalfChunks(inner) if nbytes > STREAMED_ABOVE else None
            return LazyTensor(tensor.name, to, tensor.shape, nbytes, _TransposedHalf(inner), None,
                              tensor.param_id, tensor.origin, chunks)
        inner = LazyTensor(tensor.name, inner.dtype, inner.shape, inner.nbytes, inner.loader, inner.span,
                           tensor.param_id, tensor.origin, inner.chunks)
        return transpose2d(cast(inner, to))
    return _cast_kind(src.name, to.name).make(tensor, to)


def caster(src: DType, to: DType) -> Callable[[LazyTensor], LazyTensor] | None:
    """`cast(t, to)` for many tensors of dtype `src`, checked once for the pair rather than per tensor.

    None when `cast` must decide per tensor: the pair is not a plain float cast (no-op or an error
    naming the tensor). The function still hands a transposed tensor to `cast`, which narrows first.
    """
    if src.kind is not _FLOAT or src == to or to.kind is not _FLOAT or src.name not in CASTABLE \
            or to.name not in CASTABLE:
        return None
    make = _cast_kind(src.name, to.name).make

    def one(tensor: LazyTensor) -> LazyTensor:
        if isinstance(tensor.chunks, _TransposedChunks):
            return cast(tensor, to)
        return make(tensor, to)

    return one


class _CastKind:
    """What every cast between two dtypes shares (one per pair): element widths and converters."""

    __slots__ = ("convert", "direct", "dst_uint", "src_uint")

    def __init__(self, src: str, dst: str) -> None:
        self.src_uint, self.dst_uint = _UINT[_BITS_OF[src]], _UINT[_BITS_OF[dst]]
        self.convert = _converter(src, dst)
        self.direct = _DIRECT.get((src, dst))

    def make(self, tensor: LazyTensor, to: DType) -> LazyTensor:
        """The cast tensor (the pair already checked); direct construction: 100k-tensor plans make 100k."""
        job = _Cast(tensor, self)
        nbytes = tensor.nbytes // self.src_uint.itemsize * self.dst_uint.itemsize  # element count x new width
        return LazyTensor(tensor.name, to, tensor.shape, nbytes, job, None, tensor.param_id, tensor.origin,
                          _streamed(job.pieces, nbytes))


def _streamed(pieces: Callable[[], Iterator[memoryview]], nbytes: int) -> Callable[[], Iterator[memoryview]] | None:
    """A cast tensor's `chunks`, or None up to STREAMED_ABOVE bytes: its loader's one piece is written
    as is, and a 100k-tensor plan keeps no bound method per tensor (~4 MiB)."""
    return pieces if nbytes > STREAMED_ABOVE else None


_CAST_KINDS: dict[tuple[str, str], _CastKind] = {}


def _cast_kind(src: str, dst: str) -> _CastKind:
    kind = _CAST_KINDS.get((src, dst))
    if kind is None:
        kind = _CAST_KINDS[(src, dst)] = _CastKind(src, dst)
    return kind


class _Cast:
    """The loader of a cast tensor (slotted, not closures: a 100k-tensor plan makes 100k of these)."""

    __slots__ = ("kind", "tensor")

    def __init__(self, tensor: LazyTensor, kind: _CastKind) -> None:
        self.tensor, self.kind = tensor, kind

    def convert_piece(self, piece: Buffer) -> memoryview:
        k, kind = kernels, self.kind
        if k is not None and kind.direct is not None:  # no numpy: its per-call cost dominates small tensors
            return kind.direct(k, piece, len(piece) // kind.src_uint.itemsize * kind.dst_uint.itemsize)
        with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf and NaNs are intended
            return kind.convert(np.frombuffer(piece, dtype=kind.src_uint)).view(np.uint8).data

    def pieces(self) -> Iterator[memoryview]:
        step = CHUNK_ELEMENTS * self.kind.src_uint.itemsize
        pieces = source_pieces(self.tensor, step)
        if self.tensor.nbytes <= step:  # one piece: no thread hand-off
            return map(self.convert_piece, pieces)
        return pipelined(self.convert_piece, pieces)

    def __call__(self) -> memoryview:
        pieces = self.pieces()
        first = next(pieces, None)
        if first is None:
            return memoryview(b"")
        second = next(pieces, None)
        if second is None:  # one piece (every small tensor): it is the result, no copy
            return first
        out = np.empty(self.tensor.numel * self.kind.dst_uint.itemsize, dtype=np.uint8)
        pos = 0
        for piece in itertools.chain((first, second), pieces):
            out[pos:pos + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
            pos += len(piece)
        return out.data


def _out_buffer(n: int) -> memoryview:
    """A writable buffer of n bytes: a bytearray when small (cheap to make), else uninitialised numpy."""
    return memoryview(bytearray(n)) if n <= 65536 else np.empty(n, dtype=np.uint8).data


def _direct(kernel: str, *extra: int) -> Callable[[Any, Buffer, int], memoryview]:
    """piece -> a fresh n-byte buffer filled by the compiled `kernel(piece, out, *extra)`."""

    def run(k: Any, piece: Buffer, n: int) -> memoryview:
        out = _out_buffer(n)
        getattr(k, kernel)(piece, out, *extra)
        return out

    return run


_f32_to_f16_direct = _direct("f32_to_f16")
_f16_to_f32_direct = _direct("f16_to_f32")
_f32_to_bf16_direct = _direct("f32_to_bf16", int(_BF16_NAN_FROM_F32))
_DIRECT: dict[tuple[str, str], Callable[[Any, Buffer, int], memoryview]] = {
    ("F32", "F16"): _f32_to_f16_direct, ("FLEX32", "F16"): _f32_to_f16_direct,
    ("F16", "F32"): _f16_to_f32_direct, ("F16", "FLEX32"): _f16_to_f32_direct,
    ("F32", "BF16"): _f32_to_bf16_direct, ("FLEX32", "BF16"): _f32_to_bf16_direct,
}
"""Casts the compiled kernels do straight from the source bytes (the same functions the numpy path calls)."""


def source_pieces(tensor: LazyTensor, step: int) -> Iterator[Buffer]:
    """A tensor's bytes in whole-element pieces of about `step` bytes, holding one piece at a time.

    A computed tensor streams its own pieces; a file-backed one is read with `pread` into fresh
    buffers (no mapping stays resident, and a consumer may keep a piece while the next is read);
    anything else is sliced from its `data()` view, which is released at the end.
    """
    if tensor.chunks is not None:
        yield from tensor.chunks()
        return
    span = tensor.span
    if span is not None:
        for start in range(0, span.length, step):
            yield read_span(tensor, start, min(step, span.length - start))
        return
    data = tensor.data()
    try:
        for start in range(0, len(data), step):
            yield data[start:start + step]
    finally:
        data.release()


def whole(tensor: LazyTensor) -> memoryview:
    """All of a tensor's bytes: read when small and stored in a file, else its `data()` view (a map)."""
    span = tensor.span
    if span is not None and span.length <= SMALL_READ:
        return read_span(tensor)
    return tensor.data()


def _block_size(itemsize: int) -> int:
    """Tile edge giving ~32-64 KiB tiles: fits L1/L2 for both the read and the write side."""
    return 64 if itemsize >= 8 else 128 if itemsize >= 2 else 256


def transpose_bytes(raw: memoryview | bytes | bytearray, rows: int, cols: int, itemsize: int) -> np.ndarray:
    """`[rows, cols]` elements of `itemsize` bytes -> a C-contiguous `[cols, rows]` array.

    A tiled copy: numpy's plain ``ascontiguousarray(a.T)`` strides through memory column by
    column, which is several times slower on large matrices (benchmarks/RESULTS.md).
    """
    return _band(raw, _matrix(raw, rows, cols, itemsize), 0, cols)


def transpose_bands(raw: memoryview | bytes | bytearray, rows: int, cols: int,
                    itemsize: int) -> Iterator[np.ndarray]:
    """The `[cols, rows]` transpose as consecutive bands of output rows of about CHUNK_BYTES each."""
    src = _matrix(raw, rows, cols, itemsize)
    band = _band_columns(rows, itemsize, _block_size(itemsize))
    return _map_bands(lambda first, width: _band(raw, src, first, width), cols, band)


def _band_columns(rows: int, itemsize: int, block: int) -> int:
    """Source columns per band: about CHUNK_BYTES of `[cols, rows]` output, a multiple of `block`."""
    return max(block, CHUNK_BYTES // max(rows * itemsize, 1) // block * block)


def _map_bands(one: Callable[[int, int], R], cols: int, band: int) -> Iterator[R]:
    """`one(first, width)` over consecutive bands of `band` columns: on the worker threads when
    there are several, inline (no thread hand-off) when there is one."""
    starts = range(0, cols, band)

    def run(j: int) -> R:
        return one(j, min(band, cols - j))

    return map(run, starts) if len(starts) == 1 else pipelined(run, starts)


def _half_band(raw: memoryview, rows: int, cols: int, first: int, width: int) -> np.ndarray:
    """Columns [first, first + width) of a `[rows, cols]` F32 matrix, transposed and cast to F16 bits."""
    out = np.empty((width, rows), dtype=np.uint16)
    kernels.transpose_f32_to_f16(raw, out, rows, cols, first, width)
    return out


def _matrix(raw: memoryview | bytes | bytearray, rows: int, cols: int, itemsize: int) -> np.ndarray:
    if itemsize in _UINT:
        return np.frombuffer(raw, dtype=_UINT[itemsize], count=rows * cols).reshape(rows, cols)
    # e.g. 16-byte elements: move them as byte rows
    return np.frombuffer(raw, dtype=np.uint8, count=rows * cols * itemsize).reshape(rows, cols, itemsize)


def _band(raw: memoryview | bytes | bytearray, src: np.ndarray, first: int, width: int) -> np.ndarray:
    """Columns [first, first + width) of `src` (a view of `raw`), transposed into a new array."""
    rows, cols = src.shape[:2]
    out = np.empty((width, rows, *src.shape[2:]), dtype=src.dtype)
    if kernels is not None and src.ndim == 2 and len(raw) == src.nbytes:
        kernels.transpose(raw, out, rows, cols, src.dtype.itemsize, first, width)
    else:
        _transpose_into(out, src[:, first:first + width])
    return out


def _transpose_into(out: np.ndarray, src: np.ndarray) -> None:
    """out = src.T, tile by tile so both sides stay in cache."""
    rows, cols = src.shape[:2]
    block = _block_size(src.dtype.itemsize * (src.shape[2] if src.ndim == 3 else 1))
    if rows <= block or cols <= block:
        out[...] = src.swapaxes(0, 1)
        return
    for i in range(0, rows, block):
        tile_rows = src[i:i + block]
        for j in range(0, cols, block):
            out[j:j + block, i:i + block] = tile_rows[:, j:j + block].swapaxes(0, 1)


def transpose2d(tensor: LazyTensor) -> LazyTensor:
    """A lazy `[a, b] -> [b, a]` transpose on raw element bytes (any byte-sized dtype, as Burn)."""
    if len(tensor.shape) != 2:
        raise ValueError(f"transpose2d needs a rank-2 tensor, '{tensor.name}' has shape {list(tensor.shape)}")
    itemsize = tensor.dtype.itemsize
    if itemsize is None:
        raise UnsupportedDTypeError(f"cannot transpose {tensor.dtype.display} elements (not byte-sized)",
                                    file=tensor.origin, tensor=tensor.name)
    rows, cols = tensor.shape
    if rows == 0 or cols == 0:  # nothing to move (and numpy refuses shapes like [2**62, 0])
        return tensor.derived(dtype=tensor.dtype, shape=(cols, rows), loader=lambda: memoryview(b""),
                              chunks=lambda: iter(()))

    return LazyTensor(tensor.name, tensor.dtype, (cols, rows), tensor.nbytes, _Transposed(tensor), None,
                      tensor.param_id, tensor.origin, _TransposedChunks(tensor))


def cast_source(tensor: LazyTensor) -> tuple[LazyTensor, Callable[[Buffer], memoryview]] | None:
    """(the tensor a cast reads, the function casting a piece of its bytes), or None when `tensor`
    is not a cast: with `transpose_source`, lets diff rebuild a cast and transposed tensor from
    bounded pieces of the stored one."""
    job = tensor.loader
    return (job.tensor, job.convert_piece) if isinstance(job, _Cast) else None


def transpose_source(tensor: LazyTensor) -> tuple[LazyTensor, bool] | None:
    """(the `[rows, cols]` tensor a streamed 2-D transpose reads, whether it also casts F32 to F16),
    or None when `tensor` is not one: lets a reader that holds only a window at a time (diff) make
    the same bands tile by tile instead of mapping the whole source."""
    chunks = tensor.chunks
    if isinstance(chunks, _TransposedChunks | _TransposedHalfChunks):
        return chunks.base, isinstance(chunks, _TransposedHalfChunks)
    return None


class _Transposed:
    """The loader of a transposed tensor: the whole `[cols, rows]` result at once."""

    __slots__ = ("base",)

    def __init__(self, base: LazyTensor) -> None:
        self.base = base

    def __call__(self) -> memoryview:
        base = self.base
        rows, cols = base.shape
        raw = whole(base)
        return transpose_bytes(raw, rows, cols, base.dtype.itemsize or 1).reshape(-1).view(np.uint8).data


class _TransposedChunks(_Transposed):
    """The streamed bands of a 2-D transpose; keeps its `base` so a later narrowing cast can go first."""

    __slots__ = ()

    def __call__(self) -> Iterator[memoryview]:  # type: ignore[override]
        base = self.base
        rows, cols = base.shape
        # A transpose reads its whole source; the source's map is dropped with the exhausted bands.
        for band in transpose_bands(whole(base), rows, cols, base.dtype.itemsize or 1):
            yield band.reshape(-1).view(np.uint8).data


class _TransposedHalf(_Transposed):
    """The loader of an F32 matrix transposed and cast to F16 by the compiled kernel in one pass."""

    __slots__ = ()

    def __call__(self) -> memoryview:
        rows, cols = self.base.shape
        return _half_band(whole(self.base), rows, cols, 0, cols).reshape(-1).view(np.uint8).data


class _TransposedHalfChunks(_TransposedHalf):
    """Its streamed bands of about CHUNK_BYTES of output, computed on the worker threads."""

    __slots__ = ()

    def __call__(self) -> Iterator[memoryview]:  # type: ignore[override]
        rows, cols = self.base.shape
        raw = whole(self.base)  # a map of the source tensor, dropped with the exhausted bands
        band = _band_columns(rows, 2, 8)
        for half in _map_bands(lambda first, width: _half_band(raw, rows, cols, first, width), cols, band):
            yield half.reshape(-1).view(np.uint8).data
