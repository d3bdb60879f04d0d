"""A block of rows of a rank's tensor, as a lazy tensor of its own (a rank's half of SwiGLU's [gate_r; up_r])."""

from __future__ import annotations

from ...core.bytesource import ByteSource
from ...core.tensor import LazyTensor, stored


class _Rows:
    """The loader of a row block of a tensor stored other than verbatim: the whole tensor read, then cut."""

    __slots__ = ("start", "stop", "tensor")

    def __init__(self, tensor: LazyTensor, start: int, stop: int) -> None:
        self.tensor, self.start, self.stop = tensor, start, stop

    def __call__(self) -> bytes:
        data = self.tensor.data()
        try:
            return bytes(data[self.start:self.stop])
        finally:
            data.release()


def row_slice(t: LazyTensor, start: int, stop: int, source: ByteSource) -> LazyTensor:
    """Rows `start:stop` (dim 0) of `t`, read from `source` (the file `t` is stored in)."""
    row = t.nbytes // t.shape[0] if t.shape and t.shape[0] else 0
    shape = (stop - start, *t.shape[1:])
    nbytes = row * (stop - start)
    if t.span is not None and t.span.length == t.nbytes:  # verbatim in the file: a narrower span of it
        return stored(t.name, t.dtype, shape, source, t.span.offset + start * row, nbytes)
    return LazyTensor(t.name, t.dtype, shape, nbytes, _Rows(t, start * row, stop * row), origin=t.origin)
