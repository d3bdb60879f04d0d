"""Where each parameter's fp32 master lies in the ranks' flat partitions, and its bytes read from there.

The arithmetic is DeepSpeed's own layout (the one its `zero_to_fp32.py` undoes), written out here:

* ZeRO-1/2: each parameter group is one flat vector, its parameters one after another in
  `param_shapes` order (each followed by its `param_alignment_paddings` entry, when the file has
  them), split into one contiguous slice per rank (`single_partition_of_fp32_groups`); the last
  slices may be shorter (DeepSpeed pads the whole vector to a multiple of 2 x world size and saves
  each rank's part without the padding). A parameter is the elements [offset, offset + numel) of
  the concatenation of every rank's slice of its group, so it may span several ranks.
* ZeRO-3: every parameter is split on its own: ceil(numel / world size) elements per rank, the
  last rank's part padded. Each rank's flat groups (`fp32_flat_groups`) hold its part of every
  parameter one after another, in `param_shapes` order across groups (one part may span two
  groups). A parameter is its part on rank 0, then on rank 1, ..., cut to numel.

`Piece`s are element ranges of one (rank, group) tensor; `RankFiles` turns them into byte ranges of
the rank files and reads them, so a parameter's loader reads only its own bytes, never a whole
flat group.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ...core.dtypes import DType
from ...core.errors import FormatError
from ...core.tensor import LazyTensor

READ_STEP = 8 << 20
"""A streamed parameter's bytes are read and handed on in pieces of at most this many bytes."""


@dataclass(frozen=True, slots=True)
class Piece:
    """`count` elements from `start` of rank `rank`'s flat tensor number `group`."""

    rank: int
    group: int
    start: int
    count: int


class LayoutError(FormatError):
    """The shapes and the partitions disagree (a parameter reaches past them, or elements are left)."""


def _split(bounds: Sequence[int], start: int, count: int, owner: Sequence[tuple[int, int]]) -> list[Piece]:
    """[start, start + count) of a vector made of consecutive parts (`bounds`: each part's first
    element, then the end), as pieces of those parts (`owner`: each part's (rank, group))."""
    pieces: list[Piece] = []
    end = start + count
    i = 0
    while count and i < len(owner):
        lo, hi = bounds[i], bounds[i + 1]
        if hi > start and lo < end:
            a, b = max(lo, start), min(hi, end)
            rank, group = owner[i]
            pieces.append(Piece(rank, group, a - lo, b - a))
        i += 1
    return pieces


def zero12_pieces(shapes: Sequence[dict[str, tuple[int, ...]]], lengths: Sequence[Sequence[int]],
                  paddings: Sequence[Sequence[int]] | None, label: str) -> dict[str, list[Piece]]:
    """ZeRO-1/2: each parameter's pieces. `shapes`: per group, name -> shape; `lengths[rank][group]`:
    the numel of that rank's slice; `paddings`: per group, the alignment padding after each parameter."""
    world = len(lengths)
    out: dict[str, list[Piece]] = {}
    for g, group in enumerate(shapes):
        sizes = [lengths[r][g] for r in range(world)]
        bounds = [0]
        for n in sizes:
            bounds.append(bounds[-1] + n)
        total = bounds[-1]
        owner = [(r, g) for r in range(world)]
        pads = paddings[g] if paddings is not None else None
        if pads is not None and len(pads) != len(group):
            raise LayoutError(f"group {g} has {len(group)} parameters but {len(pads)} alignment paddings", file=label)
        offset = 0
        for i, (name, shape) in enumerate(group.items()):
            n = math.prod(shape)
            if offset + n > total:
                raise LayoutError(f"shape {list(shape)} needs elements [{offset}, {offset + n}) of parameter group "
                                  f"{g}, but its partitions hold {total} ({' + '.join(map(str, sizes))})",
                                  file=label, tensor=name)
            out[name] = _split(bounds, offset, n, owner)
            offset += n + (pads[i] if pads is not None else 0)
        align = 2 * world  # DeepSpeed pads a group to this multiple: both ends must agree once aligned
        if -(-offset // align) != -(-total // align):
            raise LayoutError(f"the shapes of parameter group {g} take {offset} elements but its partitions hold "
                              f"{total}: the partitions do not match param_shapes", file=label)
    return out


def zero3_pieces(shapes: Sequence[dict[str, tuple[int, ...]]], lengths: Sequence[Sequence[int]],
                 label: str) -> dict[str, list[Piece]]:
    """ZeRO-3: each parameter's pieces, rank by rank. `lengths[rank][group]` must agree across ranks."""
    world = len(lengths)
    bounds = [0]
    for n in lengths[0]:
        bounds.append(bounds[-1] + n)
    total = bounds[-1]
    out: dict[str, list[Piece]] = {}
    offset = 0
    for group in shapes:
        for name, shape in group.items():
            n = math.prod(shape)
            part = -(-n // world)
            if offset + part > total:
                raise LayoutError(f"shape {list(shape)} needs elements [{offset}, {offset + part}) of each rank's "
                                  f"partitions (flat groups), but they hold {total}", file=label, tensor=name)
            pieces: list[Piece] = []
            for r in range(world):
                take = max(0, min(part, n - r * part))  # the last ranks' padding is not the parameter's
                pieces += _split(bounds, offset, take, [(r, g) for g in range(len(lengths[0]))])
            out[name] = pieces
            offset += part
    if offset != total:
        raise LayoutError(f"the shapes take {offset} elements of each rank's flat groups but they hold {total}: "
                          "the partitions do not match param_shapes", file=label)
    return out


@dataclass(frozen=True, slots=True)
class Span:
    """A byte range of one file (an index into `RankFiles.paths`)."""

    file: int
    offset: int
    nbytes: int


class RankFiles:
    """The checkpoint's files, each opened only while one of its ranges is read (a ZeRO-3 run of 512
    ranks has 1,024 of them), and checked to be the very file that was parsed (device, inode, size)."""

    def __init__(self, paths: Sequence[str], identities: Sequence[tuple[int, int]], sizes: Sequence[int]) -> None:
        self.paths = list(paths)
        self.identities = list(identities)
        self.sizes = list(sizes)
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _open(self, i: int, tensor: str) -> int:
        from ...core.errors import ReaderClosedError

        if self._closed:
            raise ReaderClosedError("the checkpoint was closed", file=self.paths[i], tensor=tensor)
        try:
            fd = os.open(self.paths[i], os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise FormatError(f"cannot open: {e.strerror}", file=self.paths[i], tensor=tensor) from None
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != self.identities[i] or st.st_size != self.sizes[i]:
            os.close(fd)
            raise FormatError("the file changed since the checkpoint was opened", file=self.paths[i], tensor=tensor)
        return fd

    def read_into(self, spans: Sequence[Span], out: memoryview, tensor: str) -> None:
        """Fill `out` with the spans' bytes, one after another."""
        at = 0
        fds: dict[int, int] = {}
        try:
            for s in spans:
                fd = fds.get(s.file)
                if fd is None:
                    fd = fds[s.file] = self._open(s.file, tensor)
                got = os.preadv(fd, [out[at: at + s.nbytes]], s.offset)
                if got != s.nbytes:
                    raise FormatError(f"short read at offset {s.offset} (truncated?)", file=self.paths[s.file],
                                      tensor=tensor)
                at += s.nbytes
        finally:
            for fd in fds.values():
                os.close(fd)


class Gathered:
    """The loader (and `chunks`) of a parameter rebuilt from byte ranges of the rank files."""

    __slots__ = ("files", "name", "nbytes", "spans")

    def __init__(self, files: RankFiles, spans: Sequence[Span], nbytes: int, name: str) -> None:
        self.files, self.spans, self.nbytes, self.name = files, list(spans), nbytes, name

    def __call__(self) -> memoryview:
        buf = bytearray(self.nbytes)
        self.files.read_into(self.spans, memoryview(buf), self.name)
        return memoryview(buf)

    def chunks(self) -> Iterator[memoryview]:
        for s in self.spans:
            for at in range(0, s.nbytes, READ_STEP):
                n = min(READ_STEP, s.nbytes - at)
                buf = bytearray(n)
                self.files.read_into([Span(s.file, s.offset + at, n)], memoryview(buf), self.name)
                yield memoryview(buf)


def gathered(name: str, dtype: DType, shape: tuple[int, ...], files: RankFiles, spans: Sequence[Span],
             origin: str) -> LazyTensor:
    nbytes = dtype.nbytes(shape)
    assert nbytes is not None and nbytes == sum(s.nbytes for s in spans)
    loader = Gathered(files, spans, nbytes, name)
    return LazyTensor(name, dtype, shape, nbytes, loader, origin=origin,
                      chunks=loader.chunks if nbytes > READ_STEP else None)
