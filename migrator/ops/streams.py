"""What the ops' byte movers share: a tensor read front to back, a streamed output's loader.

Every op output is a LazyTensor whose `chunks` stream its bytes; each op's module holds its own mover
and says how it streams (shapes are checked before any of these is made, by the op's `build`). Each
reader is sequential, so an input that is itself computed is streamed once per output, never held
whole; peak memory is a few bands (BAND) plus, for a general permute, the input's map.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from ..core.errors import TensorBytesSizeMismatchError
from ..core.tensor import Buffer, LazyTensor

BAND = 4 << 20
"""Target bytes of one streamed piece: well inside the L3 cache, and a few of them fit the memory bound."""
STRIDED_READ = 4 << 10
"""A stored tensor's kept part of a row at least this long is read on its own (a pread per row into the
band); shorter ones come with their whole rows."""


def prod(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


class SequentialReader:
    """Reads a tensor's bytes front to back: `read(n)` the next n bytes, `skip(n)` past them.

    A stored tensor is read with pread at any offset (a skip costs nothing); any other one is
    consumed from its own pieces (chunks, or slices of its `data()` view)."""

    def __init__(self, tensor: LazyTensor) -> None:
        self.tensor = tensor
        self.pos = 0
        self._pieces: Iterator[memoryview] | None = None
        self._left = memoryview(b"")

    def _next_piece(self, done: int = 0) -> memoryview:
        """The next piece of the tensor's own pieces; `done`: bytes of the current read already gathered."""
        if self._pieces is None:
            from ..core.casts import source_pieces

            self._pieces = (memoryview(p).cast("B") for p in source_pieces(self.tensor, BAND))
        piece = next(self._pieces, None)
        if piece is None:
            raise TensorBytesSizeMismatchError(f"ended after {self.pos + done} of {self.tensor.nbytes} bytes",
                                               file=self.tensor.origin, tensor=self.tensor.name)
        return piece

    def read(self, n: int) -> memoryview:
        t = self.tensor
        if t.span is not None:
            from ..core.streaming import read_span

            out = read_span(t, self.pos, n) if n else memoryview(b"")
            self.pos += n
            return out
        if len(self._left) >= n:
            out, self._left = self._left[:n], self._left[n:]
            self.pos += n
            return out
        buf = bytearray(n)
        done = 0
        while done < n:
            if not self._left:
                self._left = self._next_piece(done)
            k = min(n - done, len(self._left))
            buf[done:done + k] = self._left[:k]
            self._left = self._left[k:]
            done += k
        self.pos += n
        return memoryview(buf)

    def skip(self, n: int) -> None:
        if self.tensor.span is not None:
            self.pos += n
            return
        while n:
            if not self._left:
                self._left = self._next_piece()
            k = min(n, len(self._left))
            self._left = self._left[k:]
            self.pos += k
            n -= k

    def pieces(self, n: int) -> Iterator[memoryview]:
        """The next n bytes as pieces of at most BAND bytes."""
        while n:
            k = min(n, BAND)
            yield self.read(k)
            n -= k


class Gathered:
    """The loader of a streamed output (an op's, a merge's): its pieces gathered into one buffer. A
    writer normally streams the pieces instead; this is for a caller that asks for the whole tensor."""

    __slots__ = ("chunks", "nbytes")

    def __init__(self, chunks: Callable[[], Iterator[Buffer]], nbytes: int) -> None:
        self.chunks, self.nbytes = chunks, nbytes

    def __call__(self) -> memoryview:
        buf = bytearray(self.nbytes)
        done = 0
        for piece in self.chunks():
            k = len(piece)
            buf[done:done + k] = piece
            done += k
        return memoryview(buf)[:done]


class Chunks:
    """A streamed output's `chunks`: a fresh generator per call (the writer, or its read-ahead thread)."""

    __slots__ = ()

    def __call__(self) -> Iterator[memoryview]:
        raise NotImplementedError


def made(name: str, like: LazyTensor, shape: tuple[int, ...], chunks: Chunks,
          param_id: int | None = None) -> LazyTensor:
    nbytes = like.dtype.nbytes(shape)
    assert nbytes is not None  # byte-sized dtypes only (checked when planned)
    return LazyTensor(name, like.dtype, shape, nbytes, Gathered(chunks, nbytes), None, param_id, like.origin, chunks)


def itemsize(t: LazyTensor) -> int:
    size = t.dtype.itemsize
    assert size is not None  # byte-sized dtypes only (checked when planned)
    return size
