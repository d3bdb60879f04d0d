"""Streaming plumbing for computed weights: read tensors band by band, decode them, emit a computed tensor.

A computed weight (a merge, a LoRA fold) is a `LazyTensor` whose `chunks` yield its bytes a band at a
time: each input is read front to back once per pass (`BandReader`), decoded into the compute dtype
(`decode`: F32, or F64 when an input is F64), combined by a kernel, and the band's F32/F64 bytes are
handed on. `computed` wraps such a kernel; the caller rounds the result to its output dtype once, with
`casts.cast` (torch's round-to-nearest-even, bit for bit), so no intermediate value is ever rounded to
a narrow dtype.

A kernel that needs a whole-tensor statistic first (a norm, a k-th value) computes it in `prepare`,
which runs on the first request for bytes, by its own streamed pass over the inputs: a plan that is
never executed reads nothing.

Speed (benchmarks/RESULTS.md): a stored input is read through a memory map of each band (`BandReader`:
no copy into a buffer; the band's pages leave the process's RSS with the band), an input already in
the compute dtype is used as read (kernels never write into their inputs), and the bands of a tensor
are computed on the cast pool's threads (`casts.pipelined`, in order, a few bands ahead), numpy and
the compiled merge kernels releasing the GIL. A kernel whose bands depend on each other (DARE's
random stream) sets `parallel = False`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ...core import dtypes
from ...core.bytesource import FileView
from ...core.dtypes import DType
from ...core.errors import TensorBytesSizeMismatchError, UnsupportedDTypeError
from ...core.tensor import LazyTensor
from ..streams import Gathered, SequentialReader

if TYPE_CHECKING:
    import numpy as np

T = TypeVar("T")
R = TypeVar("R")

BAND_BYTES = 4 << 20
"""Target size of one band of one input: a few of these per input bound a merge's scratch memory."""

DECODABLE = frozenset({"F64", "F32", "F16", "BF16"})
"""Input dtypes a computation reads (Burn's FLEX32 is F32 bits and is read as F32)."""


def compute_dtype(inputs: Sequence[LazyTensor]) -> DType:
    """F64 when any input is F64, else F32: the precision every arithmetic step runs in."""
    return dtypes.F64 if any(t.dtype.name == "F64" for t in inputs) else dtypes.F32


def check_decodable(t: LazyTensor, what: str) -> None:
    """Refuse, naming the tensor, an input whose values cannot be computed on (ints, bools, quantized)."""
    if t.dtype.name not in DECODABLE and t.dtype.name != "FLEX32":
        raise UnsupportedDTypeError(f"{what} needs float inputs (F64, F32, F16, BF16), got {t.dtype.display}",
                                    file=t.origin, tensor=t.name)


def decode(raw: memoryview | bytes | bytearray, dtype: DType, compute: DType) -> np.ndarray:
    """Little-endian element bytes of `dtype` as an array in the compute dtype (exact widening). Bytes
    already in the compute dtype are not copied: the array may be read-only (a mapped band)."""
    import numpy as np

    name = "F32" if dtype.name == "FLEX32" else dtype.name
    src = np.frombuffer(raw, dtype=dtypes.BY_NAME[name].numpy())
    want = compute.numpy()
    return src if src.dtype == want else src.astype(want)


class BandReader(SequentialReader):
    """A tensor's bytes front to back: `read(n)` returns the next n bytes (one copy at most).

    A tensor stored verbatim in a file is read through a map of each band (`ByteSource.view`, which
    checks the range and unmaps when the band's last view is dropped); any other as `SequentialReader`
    reads it."""

    def __init__(self, tensor: LazyTensor) -> None:
        super().__init__(tensor)
        span = tensor.span if tensor.chunks is None else None
        self._mapped = span if isinstance(span, FileView) else None

    def read(self, n: int) -> memoryview:
        if self._mapped is None:
            return super().read(n)
        if self.pos + n > self.tensor.nbytes:
            raise TensorBytesSizeMismatchError(f"ended after {self.tensor.nbytes} bytes, {n} more wanted at "
                                               f"{self.pos}", file=self.tensor.origin, tensor=self.tensor.name)
        out = self._mapped.source.view(self._mapped.offset + self.pos, n)
        self.pos += n
        return out


def elements_per_band(inputs: Sequence[LazyTensor], compute: DType, row: int = 1) -> int:
    """How many elements (a multiple of `row`) one band holds: BAND_BYTES of the widest stream."""
    widest = max([compute.itemsize or 4] + [t.dtype.itemsize or 4 for t in inputs])
    rows = max(1, BAND_BYTES // max(1, widest * row))
    return rows * row


def read_bands(inputs: Sequence[LazyTensor], compute: DType, step: int) -> Iterator[tuple[int, list[np.ndarray]]]:
    """(first element, [each input's next `step` elements decoded]) over equally sized inputs, in order."""
    readers = [BandReader(t) for t in inputs]
    total = inputs[0].numel if inputs else 0
    for start in range(0, total, step):
        n = min(step, total - start)
        yield start, [decode(r.read(n * (t.dtype.itemsize or 4)), t.dtype, compute)
                      for r, t in zip(readers, inputs, strict=True)]


class Kernel:
    """What a computed tensor does: `prepare` (an optional first pass) and `band` (one band's values).

    Each streamed pass calls `begin()` once and hands what it returns (a pass's own state, e.g. random
    streams positioned at the tensor's start) to every `band(state, start, arrays)`, with the band's first
    flat element index and the inputs' decoded elements (flat, in the compute dtype, possibly read-only:
    never written into); `band` returns the output's elements for the same positions. Two passes (a
    writer's read-ahead thread and a loader) never share state. With `parallel`, bands of one pass run on
    several threads at once (the state must then be read-only)."""

    inputs: Sequence[LazyTensor]
    step: int
    parallel: bool = True

    def prepare(self) -> None:
        """A first pass over the inputs, when a whole-tensor statistic is needed (default: none)."""

    def begin(self) -> Any:
        """A new pass's state (default: none)."""
        return None

    def band(self, state: Any, start: int, arrays: list[np.ndarray]) -> np.ndarray:
        raise NotImplementedError


class _Stream:
    """The `chunks` of a computed tensor: prepare once, then one band of output per band of input."""

    __slots__ = ("compute", "kernel", "lock", "prepared")

    def __init__(self, kernel: Kernel, compute: DType) -> None:
        self.kernel, self.compute, self.prepared = kernel, compute, False
        self.lock = threading.Lock()

    def __call__(self) -> Iterator[memoryview]:
        import numpy as np

        k = self.kernel
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # inf/NaN propagate like torch
            with self.lock:
                if not self.prepared:
                    k.prepare()
                    self.prepared = True
            state = k.begin()
        want = self.compute.numpy()

        def one(item: tuple[int, list[np.ndarray]]) -> memoryview:
            out = np.ascontiguousarray(k.band(state, item[0], item[1]), dtype=want)
            return out.reshape(-1).view(np.uint8).data

        yield from over_bands(one, read_bands(k.inputs, self.compute, k.step), k.parallel)


def over_bands(fn: Callable[[T], R], items: Iterable[T], parallel: bool = True) -> Iterator[R]:
    """`map(fn, items)` in order, inf/NaN propagating silently (numpy's error state is per thread): on the
    cast pool's threads, a few bands ahead, when `parallel`, else on this thread."""
    import numpy as np

    from ...core.casts import pipelined

    def quiet(item: T) -> R:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return fn(item)

    yield from pipelined(quiet, items) if parallel else map(quiet, items)


def computed(name: str, shape: tuple[int, ...], kernel: Kernel, compute: DType, out_dtype: DType,
             origin: str | None = None) -> LazyTensor:
    """A lazy tensor whose values `kernel` computes in `compute`, rounded once to `out_dtype`."""
    from ...core.casts import cast

    nbytes = compute.nbytes(shape)
    assert nbytes is not None
    stream = _Stream(kernel, compute)
    wide = LazyTensor(name, compute, shape, nbytes, Gathered(stream, nbytes), None, None, origin, stream)
    return cast(wide, out_dtype)


def whole_values(t: LazyTensor, compute: DType) -> np.ndarray:
    """All of one tensor's elements decoded (flat): for the small inputs (LoRA A and B, a magnitude vector)
    and for the one step that needs a whole tensor at once (TIES's k-th magnitude)."""
    import numpy as np

    out = np.empty(t.numel, dtype=compute.numpy())
    for start, (values,) in read_bands([t], compute, elements_per_band([t], compute)):
        out[start:start + values.size] = values
    return out
