"""A stored matrix's transpose streamed in output order with a bounded resident set: for diff.

The writer's streamed transpose (casts.transpose2d) maps its whole source tensor and lets each
band of output rows read a column band of it; the pages it touches stay mapped until the last
band, so the process holds the whole source tensor at the end. `migrate diff` promises memory
in the window size whatever the tensor, so here each output band is built tile by tile: a tile
is the source rows that fit in one window (a contiguous byte range of the stored span), its
column band is transposed into the output band by the same compiled kernels, and its pages are
then dropped from the process (MADV_DONTNEED: they stay in the page cache, so a later band that
needs the same pages faults them in again without reading the disk).

A cast before the transpose (a narrowing cast goes first: it halves the bytes moved) is applied
to each tile's source rows; a cast after it, to each band.

What holds at a time: one output band (<= the window, or one output row when a row is larger),
one tile of output and the mapped pages of one tile of source (each <= the window, or one source
row). The bytes are those of `casts.transpose2d` and of the casts around it, bit for bit.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Callable, Iterator

import numpy as np

from ..core import casts
from ..core.errors import TensorBytesSizeMismatchError
from ..core.tensor import Buffer, LazyTensor
from ..files.sharded import Reopened
from ..formats.pytorch.views import StridedView, swap_array

_PAGE = mmap.PAGESIZE
_MAP = mmap.ALLOCATIONGRANULARITY
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


MIN_PIECE = 1 << 20
"""Bands, tiles and blocks are sized for at least this many bytes whatever the window: the
windows are cut from the pieces anyway, and a tiny window (`--window 1KiB`) would otherwise mean
one Python step per element or so."""


def bounded_pieces(tensor: LazyTensor, size: int) -> Iterator[Buffer] | None:
    """`tensor`'s bytes as pieces of about `size` bytes (at least MIN_PIECE) holding about that
    many at a time, when it is the streamed transpose of a stored matrix, of a cast of one, or a
    cast of such a transpose, or a strided PyTorch view (also in a shard); None for any other
    tensor (stream it as usual)."""
    size = max(size, MIN_PIECE)
    loader = tensor.loader
    if isinstance(loader, StridedView):
        return _strided(loader, tensor, size)
    if isinstance(loader, Reopened):  # a shard tensor read from the shard opened again
        return loader.pieces(lambda t: _streamed(t, size))
    cast = casts.cast_source(tensor)
    if cast is not None:  # a cast after the transpose: each band cast on its own
        inner, convert = cast
        pieces = bounded_pieces(inner, size) if inner.chunks is not None else None
        return None if pieces is None else map(convert, pieces)
    found = casts.transpose_source(tensor)
    if found is None:
        return None
    base, half = found
    stored, convert_rows = base, None
    if base.span is None and not half:  # a cast before the transpose: each tile's rows cast first
        cast = casts.cast_source(base)
        if cast is None:
            return None
        stored, convert_rows = cast
    if stored.span is None or stored.chunks is not None or len(stored.shape) != 2:
        return None
    if stored.dtype.itemsize is None or base.dtype.itemsize is None:
        return None
    itemsize = base.dtype.itemsize
    if (not half and itemsize not in _UINT) or (half and casts.kernels is None):
        return None
    return _bands(stored, itemsize, 2 if half else itemsize, half, convert_rows, size)


def _bands(stored: LazyTensor, itemsize: int, out_size: int, half: bool,
           convert_rows: Callable[[memoryview], memoryview] | None, size: int) -> Iterator[memoryview]:
    """The bands of output rows of the transpose of `stored` (`[rows, cols]`), whose elements are
    `itemsize` bytes once `convert_rows` (a cast) has been applied to a tile's rows."""
    span = stored.span
    assert span is not None and stored.dtype.itemsize is not None
    rows, cols = stored.shape
    row_bytes = cols * stored.dtype.itemsize
    if span.length != rows * row_bytes:
        raise TensorBytesSizeMismatchError(f"stored span holds {span.length} bytes, its shape needs "
                                           f"{rows * row_bytes}", file=stored.origin, tensor=stored.name)
    width = max(1, min(cols, size // max(rows * out_size, 1)))  # output rows (source columns) per band
    per_tile = max(1, min(rows, size // max(cols * max(itemsize, stored.dtype.itemsize), 1)))  # source rows
    lead = span.offset % _MAP
    try:  # not populated: a tile touches only its column band's pages
        mm = mmap.mmap(span.fd, span.length + lead, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ,
                       offset=span.offset - lead)
    except (ValueError, OSError) as e:
        raise TensorBytesSizeMismatchError(f"cannot map bytes [{span.offset}, {span.offset + span.length}): {e}",
                                           file=stored.origin, tensor=stored.name) from None
    out_dtype = _UINT[out_size]
    whole = memoryview(mm)
    try:
        for first in range(0, cols, width):
            w = min(width, cols - first)
            band = np.empty((w, rows), dtype=out_dtype)
            for top in range(0, rows, per_tile):
                r = min(per_tile, rows - top)
                start = lead + top * row_bytes
                raw = whole[start:start + r * row_bytes]
                tile = band if r == rows else np.empty((w, r), dtype=out_dtype)
                if convert_rows is None:
                    _transpose(raw, tile, r, cols, itemsize, first, w, half)
                else:  # the cast reads only this tile's pages, then the kernel moves its output
                    _transpose(convert_rows(raw), tile, r, cols, itemsize, first, w, half)
                raw.release()
                if tile is not band:
                    band[:, top:top + r] = tile
                _drop(mm, start, r * row_bytes)
            yield band.reshape(-1).view(np.uint8).data
    finally:
        whole.release()
        mm.close()


def _streamed(tensor: LazyTensor, size: int) -> Iterator[Buffer]:
    """Any tensor's bytes in bounded pieces where this module knows how, else as casts streams them."""
    pieces = bounded_pieces(tensor, size)
    return casts.source_pieces(tensor, size) if pieces is None else pieces


def _strided(view: StridedView, tensor: LazyTensor, size: int) -> Iterator[memoryview] | None:
    """A strided PyTorch view's C-order bytes in bands of its first dim, each band copied in blocks
    whose storage pages are dropped once copied (None: the storage is not in a file)."""
    span = view.src.span(view.start, view.window) if view.window else None
    if span is None or not tensor.shape:
        return None
    return _strided_bands(view, span.fd, span.offset, span.length, tensor, size)


def _strided_bands(view: StridedView, fd: int, offset: int, length: int, tensor: LazyTensor,
                   size: int) -> Iterator[memoryview]:
    lead = offset % _MAP
    try:
        mm = mmap.mmap(fd, length + lead, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=offset - lead)
    except (ValueError, OSError) as e:
        raise TensorBytesSizeMismatchError(f"cannot map bytes [{offset}, {offset + length}): {e}",
                                           file=tensor.origin, tensor=tensor.name) from None
    dtype = np.dtype(_UINT[view.itemsize]) if view.itemsize in _UINT else np.dtype((np.void, view.itemsize))
    whole = np.frombuffer(mm, dtype=np.uint8)
    try:
        base = whole[lead:].view(dtype)
        arr = np.lib.stride_tricks.as_strided(base, shape=view.shape, strides=view.strides, writeable=False)
        row = tensor.nbytes // view.shape[0] if view.shape[0] else 0
        per_band = max(1, size // max(row, 1))
        origin = whole.ctypes.data
        for top in range(0, view.shape[0], per_band):
            src = arr[top:top + per_band]
            out = np.empty(src.shape, dtype=dtype)
            _copy_blocks(out, src, mm, origin, size)
            flat = out.reshape(-1).view(np.uint8)
            if view.swap:
                flat = swap_array(flat, view.unit)
            yield flat.data
    finally:
        del whole
        with contextlib.suppress(BufferError):  # a band's view still holds it (an exception inside a
            mm.close()  # copy): it is unmapped with that view


def _copy_blocks(out: np.ndarray, src: np.ndarray, mm: mmap.mmap, origin: int, size: int) -> None:
    """out[...] = src in blocks that each touch at most about `size` bytes of pages of `mm`, those
    pages dropped after each block. A block is halved along the dim that spans the most storage."""
    extent = sum((n - 1) * st for n, st in zip(src.shape, src.strides, strict=True)) + src.itemsize
    if min(extent, src.size * _PAGE) <= size or src.size <= 1:
        out[...] = src
        _drop(mm, src.ctypes.data - origin, extent)
        return
    axis = max(range(src.ndim), key=lambda i: (src.shape[i] - 1) * src.strides[i])
    half = src.shape[axis] // 2
    lo = (slice(None),) * axis + (slice(0, half),)
    hi = (slice(None),) * axis + (slice(half, None),)
    _copy_blocks(out[lo], src[lo], mm, origin, size)
    _copy_blocks(out[hi], src[hi], mm, origin, size)


def _transpose(raw: memoryview, out: np.ndarray, rows: int, cols: int, itemsize: int, first: int, width: int,
               half: bool) -> None:
    """Columns [first, first + width) of the `[rows, cols]` matrix in `raw`, transposed into `out`."""
    k = casts.kernels
    if half:
        k.transpose_f32_to_f16(raw, out, rows, cols, first, width)
    elif k is not None:
        k.transpose(raw, out, rows, cols, itemsize, first, width)
    else:
        src = np.frombuffer(raw, dtype=_UINT[itemsize]).reshape(rows, cols)
        out[...] = src[:, first:first + width].T


def _drop(mm: mmap.mmap, start: int, length: int) -> None:
    """Unmap the pages of [start, start + length) from this process (the page cache keeps them)."""
    lo = start - start % _PAGE
    hi = min(len(mm), -(-(start + length) // _PAGE) * _PAGE)
    if hi > lo:
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
