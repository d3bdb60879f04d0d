"""Moving one tensor's bytes into an output, in the kernel where they pass through unchanged."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

from . import crashpoints
from .errors import TensorBytesSizeMismatchError
from .tensor import LazyTensor

CHUNK = 8 << 20  # 8 MiB, like Burn's windowed writes
WRITEBACK_STEP = 32 << 20  # start writing back every 32 MiB instead of leaving it all to the final fsync
SMALL_READ = 256 << 10
"""Stored spans up to this size are read with one pread: cheaper than mapping them (casts.py), or
than a flush + kernel copy (write_tensor)."""
AHEAD_BYTES = 8 << 20
"""Computed bytes `Ahead` may hold beyond the piece being written. Kept well inside the L3 cache, so
the writer copies pieces from cache, not DRAM (a larger budget was slower: benchmarks/RESULTS.md)."""
_ZEROS = bytes(4096)
_kernel_copy_ok = hasattr(os, "copy_file_range")


def write_zeros(sink: BinaryIO, n: int) -> None:
    while n > 0:
        k = min(n, len(_ZEROS))
        write_all(sink, memoryview(_ZEROS)[:k])
        n -= k


def write_tensor(sink: BinaryIO, tensor: LazyTensor, ahead: Ahead | None = None) -> None:
    """Append the tensor's bytes to `sink`; exactly `tensor.nbytes` bytes or an error.

    In order of preference: a kernel copy of a verbatim file span, the tensor's own pieces (a
    streamed cast or transpose), or its whole `data()` view written in chunks and then dropped.
    Writeback of the output is started as each 32 MiB step completes; small tensors skip that
    bookkeeping (a position query is a syscall) and leave their few pages to the final fsync.
    With `ahead`, a computed tensor's pieces come from its thread, made while earlier ones were written.
    """
    span = tensor.span
    small = tensor.nbytes <= SMALL_READ
    if span is not None and small and tensor.nbytes:
        write_all(sink, read_span(tensor))
    else:
        start = None if small else _position(sink)
        if not (tensor.nbytes and span is not None and _copy_in_kernel(sink, tensor, start)):
            _write_pieces(sink, tensor, ahead, None, start)
    crashpoints.tensor_written()


def write_computed(sink: BinaryIO, tensor: LazyTensor, ahead: Ahead | None = None,
                   each: Callable[[memoryview], object] | None = None) -> None:
    """Append a tensor's computed pieces (`computed_pieces`), calling `each` on every piece first
    (a checksum); exactly `tensor.nbytes` bytes or an error.

    A large tensor's pieces go past a buffered writer straight to its raw file (the buffer would
    copy each piece in and out again), with writeback started every 32 MiB. Small ones, or any on
    an in-memory sink, go through the sink.
    """
    _write_pieces(sink, tensor, ahead, each, None if tensor.nbytes <= SMALL_READ else _position(sink))
    crashpoints.tensor_written()


def _write_pieces(sink: BinaryIO, tensor: LazyTensor, ahead: Ahead | None,
                  each: Callable[[memoryview], object] | None, start: int | None) -> None:
    """`write_computed` from a known file position (None: small, or a sink without one)."""
    out = sink if start is None else _unbuffered(sink)
    pos = start
    written = 0
    for view in computed_pieces(tensor, ahead):
        if each is not None:
            each(view)
        write_all(out, view)
        written += len(view)
        if pos is not None:
            _start_writeback(sink, pos, pos + len(view))
            pos += len(view)
    if start is not None and out is not sink:
        sink.seek(start + written)  # written past the buffer: it must know where the file is
    if written != tensor.nbytes:
        raise TensorBytesSizeMismatchError(f"produced {written} bytes but declares {tensor.nbytes}",
                                           file=tensor.origin, tensor=tensor.name)


def computed_pieces(tensor: LazyTensor, ahead: Ahead | None = None) -> Iterator[memoryview]:
    """A tensor's bytes as it computes them: from `ahead`'s thread, from its own streamed pieces
    (a cast or transpose), CHUNK preads of its file span, or CHUNK slices of its whole `data()` view,
    released at the end."""
    if tensor.chunks is not None:
        pieces = ahead.take(tensor) if ahead is not None else None
        for piece in tensor.chunks() if pieces is None else pieces:
            yield memoryview(piece).cast("B")
        return
    span = tensor.span
    if span is not None:  # stored in a file: pread pieces (a sink without a descriptor, e.g. an upload), so
        for start in range(0, span.length, CHUNK):  # no mapping of the whole tensor stays resident
            yield read_span(tensor, start, min(CHUNK, span.length - start))
        return
    data = tensor.data()
    try:
        for offset in range(0, len(data), CHUNK):
            yield data[offset : offset + CHUNK]
    finally:
        data.release()


def read_span(tensor: LazyTensor, start: int = 0, length: int | None = None) -> memoryview:
    """`length` bytes (default: to the end) of a file-backed tensor's span from `start`, read with one
    pread into a fresh buffer: nothing stays mapped, and the caller may keep it."""
    span = tensor.span
    assert span is not None
    n = span.length - start if length is None else length
    data = os.pread(span.fd, n, span.offset + start)
    if len(data) != n:
        raise TensorBytesSizeMismatchError(f"source ended after {start + len(data)} of {span.length} bytes",
                                           file=tensor.origin, tensor=tensor.name)
    return memoryview(data)


def _unbuffered(sink: BinaryIO) -> BinaryIO:
    """The raw file under a buffered writer, its buffer emptied first; any other sink itself."""
    raw = getattr(sink, "raw", None)
    if raw is None or not isinstance(sink, io.BufferedWriter):
        return sink
    sink.flush()
    return raw


def _position(sink: BinaryIO) -> int | None:
    try:
        sink.fileno()
        return sink.tell()
    except (AttributeError, OSError, ValueError):
        return None  # an in-memory sink


def _start_writeback(sink: BinaryIO, start: int, end: int) -> None:
    """Ask the kernel to start writing back each completed 32 MiB step of the output.

    The final fsync then has little left to wait for: device writes overlap with copying
    (benchmarks/RESULTS.md). POSIX_FADV_DONTNEED starts asynchronous writeback of dirty pages and
    drops only pages already clean.
    """
    first = start - start % WRITEBACK_STEP
    last = end - end % WRITEBACK_STEP
    raw = getattr(sink, "raw", sink)
    if last > first and hasattr(os, "posix_fadvise") and getattr(raw, "start_writeback", True):
        with contextlib.suppress(OSError):  # advice only
            os.posix_fadvise(sink.fileno(), first, last - first, os.POSIX_FADV_DONTNEED)


def write_all(sink: BinaryIO, chunk: bytes | bytearray | memoryview) -> None:
    """Write everything: a raw (unbuffered) file may accept only part of a large write."""
    while len(chunk):
        n = sink.write(chunk)
        if n is None:  # buffered writers write everything
            return
        chunk = chunk[n:]


def _copy_in_kernel(sink: BinaryIO, tensor: LazyTensor, pos: int | None) -> bool:
    """copy_file_range from the source file; False when the kernel or filesystem can't.

    Copied in WRITEBACK_STEP pieces so writeback of a large tensor starts while it is copied.
    """
    global _kernel_copy_ok
    if not _kernel_copy_ok or pos is None:
        return False
    out_fd = sink.fileno()
    span = tensor.span
    assert span is not None
    sink.flush()
    done = 0
    while done < span.length:
        try:
            n = os.copy_file_range(span.fd, out_fd, min(span.length - done, WRITEBACK_STEP), span.offset + done,
                                   pos + done)
        except OSError as e:
            if done == 0 and e.errno in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP,
                                         errno.EBADF, errno.EPERM):
                _kernel_copy_ok = e.errno not in (errno.ENOSYS,)
                return False
            raise
        if n == 0:
            raise TensorBytesSizeMismatchError(
                f"source ended after {done} of {span.length} bytes", file=tensor.origin, tensor=tensor.name
            )
        _start_writeback(sink, pos + done, pos + done + n)
        done += n
    sink.seek(pos + done)  # explicit offsets leave the file position alone: a buffered sink must know it moved
    return True


class Ahead:
    """Computes the pieces of the coming large computed tensors on a thread while earlier ones are written.

    A writer that handles tensors one at a time leaves a core idle: a transpose or cast (which
    releases the GIL in numpy or the kernels) waits for the previous tensor's write (which releases
    it in the syscall), and the other way round. This thread runs the computed tensors' `chunks()` in
    write order, at most AHEAD_BYTES ahead of the writer; the writer `take`s each one's pieces in the
    same order. Tensors the writer copies from a file span, and small computed ones (a thread
    hand-off per tensor costs more than it saves), stay on the writer's thread.

    Errors raised while computing a tensor are raised by `take` for that tensor, so they surface at
    the same point as without this thread. `close` (on any exit: a write error, an interrupt) stops
    the thread and waits for it, so no source is read after the writer returns.
    """

    def __init__(self, tensors: Sequence[LazyTensor], budget: int = AHEAD_BYTES) -> None:
        self._wanted = [t for t in tensors if t.span is None and t.chunks is not None and t.nbytes > SMALL_READ
                        and not getattr(t.chunks, "io_bound", False)]  # a remote object's blocks: I/O only
        self._budget = budget
        self._next = 0
        self._items: deque[tuple[int, memoryview | BaseException | None]] = deque()
        self._held = 0
        self._stop = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        if len(self._wanted) > 1:  # one computed tensor: nothing to overlap with
            self._thread = threading.Thread(target=self._produce, name="migrator-ahead", daemon=True)
            self._thread.start()

    def __enter__(self) -> Ahead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._items.clear()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _put(self, index: int, item: memoryview | BaseException | None) -> bool:
        """Queue one item, waiting while the budget is spent; False once the writer has stopped."""
        size = len(item) if isinstance(item, memoryview) else 0
        with self._cond:
            while self._held and self._held + size > self._budget and not self._stop:
                self._cond.wait()
            if self._stop:
                return False
            self._items.append((index, item))
            self._held += size
            self._cond.notify_all()
        return True

    def _produce(self) -> None:
        for index, tensor in enumerate(self._wanted):
            assert tensor.chunks is not None
            try:  # a generator left unfinished is closed (its source map dropped) as this frame ends
                for piece in tensor.chunks():
                    if not self._put(index, memoryview(piece).cast("B")):
                        return
            except BaseException as e:  # handed to the writer, raised when it reaches this tensor
                self._put(index, e)
                return
            if not self._put(index, None):
                return

    def _alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def take(self, tensor: LazyTensor) -> Iterator[memoryview] | None:
        """The tensor's pieces, if this thread computes it (the writer asks in write order); else None."""
        index = self._next
        if self._thread is None or index >= len(self._wanted) or self._wanted[index] is not tensor:
            return None
        self._next += 1
        return self._pieces(index)

    def _pieces(self, index: int) -> Iterator[memoryview]:
        while True:
            with self._cond:
                while not self._items:
                    if not self._cond.wait(1.0) and not self._items and not self._alive():
                        raise RuntimeError("migrator-ahead thread ended without its pieces")  # a bug, not input
                got, item = self._items.popleft()
                assert got == index, (got, index)
                if isinstance(item, memoryview):
                    self._held -= len(item)
                    self._cond.notify_all()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
