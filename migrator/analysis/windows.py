"""A tensor's bytes as consecutive fixed-size windows, each mapped or gathered on its own.

`migrate diff` and `inspect --stats` look at every byte of a model but keep none of it: what they
hold at a time is one window per tensor side, whatever the tensor's size. A tensor stored verbatim
in a file (a shard included) is mapped one window at a time, populated in one call
(MAP_POPULATE: no page fault per page) and unmapped when the consumer drops it; measured faster
than `pread` into a buffer, which copies every byte once more (benchmarks/RESULTS.md). A
computed tensor (a cast, a transpose from a plan) streams its own pieces, which are gathered
into windows of one reused buffer; the transpose of a stored matrix (with or without its fused
F16 cast) is rebuilt tile by tile by tiles.py, so it holds a few windows, not its source tensor.
So is a strided PyTorch view (band by band, each band copied in blocks whose pages are then
dropped), also inside a shard. A tensor that is none of these is sliced from its `data()` view,
and so is a computed tensor whose op reads its input whole (a transpose of another computed
tensor, a general permute): there memory follows that tensor's size.

A window is only valid until the next one is asked for (the buffer is reused): consumers compare
or reduce it and move on. Full windows gathered here are the `bytearray` itself, not a view of
it: `bytearray == other` compares with memcmp, while two memoryviews compare element by element
(over ten times slower).
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

from ..core.errors import TensorBytesSizeMismatchError
from ..core.inorder import map_ahead
from ..core.tensor import LazyTensor

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

Window = bytes | bytearray | memoryview
T = TypeVar("T")
R = TypeVar("R")
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_PAGE = mmap.ALLOCATIONGRANULARITY
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
SMALL = 256 << 10
"""Tensors up to this size are read with one pread."""
AHEAD = 1
"""Windows of a stored tensor mapped ahead on a worker thread (mmap releases the GIL while the
kernel fills the page tables), so mapping the next window overlaps with using this one."""

DEFAULT_WINDOW = 4 << 20
"""Bytes per window and side. Large enough that per-window costs (a syscall, a few numpy calls)
vanish, small enough that two windows still sit in the L3 cache while compared."""


def windows(tensor: LazyTensor, size: int) -> Iterator[Window]:
    """The tensor's `nbytes` bytes as windows of `size` bytes (the last one shorter); exactly
    `nbytes` bytes or an error naming the tensor."""
    if size <= 0:
        raise ValueError("window size must be positive")
    if tensor.nbytes == 0:
        return iter(())
    span = tensor.span
    if span is not None and tensor.chunks is None:
        return _read_span(tensor, size)
    return _gathered(tensor, size)


def _read_span(tensor: LazyTensor, size: int) -> Iterator[Window]:
    span = tensor.span
    assert span is not None
    fd, base, length = span.fd, span.offset, span.length
    if length <= min(size, SMALL):  # one pread: cheaper than a map
        data = os.pread(fd, length, base)
        if len(data) != length:
            raise _short(tensor, len(data))
        yield data
        return

    def mapped(start: int) -> memoryview:
        want = min(size, length - start)
        offset = base + start
        lead = offset % _PAGE
        try:
            mm = mmap.mmap(fd, want + lead, flags=_MAP_FLAGS, prot=mmap.PROT_READ, offset=offset - lead)
        except (ValueError, OSError) as e:  # e.g. the file was truncated after it was opened
            raise TensorBytesSizeMismatchError(f"cannot map bytes [{offset}, {offset + want}): {e}",
                                               file=tensor.origin, tensor=tensor.name) from None
        # No explicit unmap: the consumer may still hold arrays over the previous window; the map
        # goes when the last of them does.
        return memoryview(mm)[lead:lead + want]

    starts = range(0, length, size)
    if len(starts) == 1 or not AHEAD:
        yield from map(mapped, starts)
        return
    yield from ahead(mapped, starts, AHEAD)


def ahead(fn: Callable[[T], R], items: Iterable[T], n: int = 1) -> Iterator[R]:
    """`map(fn, items)` with up to `n` items computed in advance on a worker thread, yielded in
    order. Its own two workers, not casts.py's pool: casts imports numpy, which stats of a float
    model never needs."""
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                from concurrent.futures import ThreadPoolExecutor

                _pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="migrator-window")
    yield from map_ahead(_pool, fn, items, n)


def _gathered(tensor: LazyTensor, size: int) -> Iterator[Window]:
    """Pieces of any size regrouped into `size`-byte windows; a piece that is exactly a window
    (the common case when both sizes are powers of two) is passed on without a copy."""
    raw: bytearray | None = None
    buf: memoryview | None = None
    fill = 0
    total = 0
    for piece in _pieces(tensor, size):
        view = memoryview(piece).cast("B")
        total += len(view)
        if total > tensor.nbytes:
            raise TensorBytesSizeMismatchError(f"produced more than the {tensor.nbytes} bytes it declares",
                                               file=tensor.origin, tensor=tensor.name)
        pos = 0
        if fill == 0:
            while len(view) - pos >= size:
                yield view[pos:pos + size]
                pos += size
        while pos < len(view):
            if buf is None:
                raw = bytearray(min(size, tensor.nbytes))
                buf = memoryview(raw)
            k = min(len(buf) - fill, len(view) - pos)
            buf[fill:fill + k] = view[pos:pos + k]
            fill += k
            pos += k
            if fill == len(buf):
                yield raw  # type: ignore[misc]
                fill = 0
    if total != tensor.nbytes:
        raise _short(tensor, total)
    if fill:
        assert buf is not None
        yield buf[:fill]


def _pieces(tensor: LazyTensor, size: int) -> Iterator[memoryview]:
    from .tiles import bounded_pieces  # computed or strided tensors only: numpy is loaded already

    pieces = bounded_pieces(tensor, size)
    if pieces is None and tensor.chunks is not None:
        pieces = tensor.chunks()
    if pieces is not None:
        for piece in pieces:
            yield memoryview(piece)
        return
    data = tensor.data()
    try:
        for start in range(0, len(data), size):
            yield data[start:start + size]
    finally:
        data.release()


def _short(tensor: LazyTensor, got: int) -> TensorBytesSizeMismatchError:
    return TensorBytesSizeMismatchError(f"source ended after {got} of {tensor.nbytes} bytes",
                                        file=tensor.origin, tensor=tensor.name)
