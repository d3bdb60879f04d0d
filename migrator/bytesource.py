"""Random access to the bytes of a file or an in-memory buffer, without reading it whole.

Tensor data is handed out as views of a per-tensor memory map, so a tensor's pages leave the
process's RSS as soon as its view is dropped: holding one mapping of the whole file would keep every
page touched so far resident.
"""

from __future__ import annotations

import mmap
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from .errors import FormatError

_PAGE = mmap.ALLOCATIONGRANULARITY


@dataclass(frozen=True, slots=True)
class FileSpan:
    """Bytes that lie verbatim in an open file: lets a writer copy them in the kernel."""

    fd: int
    offset: int
    length: int


class FileView(FileSpan):
    """A file span that is also the loader of the tensor stored there (`LazyTensor.loader`, `.span`).

    One object per stored tensor rather than a span plus a loader: a 100k-tensor model keeps
    100k of these. Equal to another FileView over the same bytes, as spans compare.
    """

    __slots__ = ("source",)
    source: ByteSource

    def __call__(self) -> memoryview:
        return self.source.view(self.offset, self.length)


def file_view(source: ByteSource, fd: int, offset: int, length: int) -> FileView:
    """A FileView of `length` bytes at `offset` in `source`, whose descriptor is `fd`."""
    view = FileView(fd, offset, length)
    _set_source(view, source)
    return view


_set_source = FileView.source.__set__  # type: ignore[attr-defined]  # frozen: plain assignment raises


class ByteSource(ABC):
    """Bounded reads and zero-copy views over some bytes."""

    label: str
    size: int

    def check_range(self, offset: int, length: int, what: str) -> None:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise FormatError(
                f"{what} needs bytes [{offset}, {offset + length}) but the input has {self.size} bytes",
                file=self.label,
            )

    def read(self, offset: int, length: int, what: str = "read") -> bytes:
        """Copy out a small range (headers, pickles); the range is checked first."""
        self.check_range(offset, length, what)
        return bytes(self.view(offset, length))

    @abstractmethod
    def view(self, offset: int, length: int) -> memoryview:
        """A read-only zero-copy view of a range (checked by callers with `check_range`)."""

    def span(self, offset: int, length: int) -> FileSpan | None:
        """Where the range lies in an open file, if it does."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the underlying file, if any."""

    def __enter__(self) -> ByteSource:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class FileSource(ByteSource):
    """A file kept open by descriptor; each view maps only the pages it covers."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.label = str(path)
        try:
            self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise FormatError(f"cannot open: {e.strerror}", file=self.label) from e
        st = os.fstat(self.fd)
        if not _is_regular(st.st_mode):
            os.close(self.fd)
            raise FormatError("not a regular file", file=self.label)
        self.size = st.st_size

    def view(self, offset: int, length: int) -> memoryview:
        self.check_range(offset, length, "view")
        if length == 0:
            return memoryview(b"")
        start = offset - offset % _PAGE
        try:
            mm = mmap.mmap(self.fd, length + (offset - start), access=mmap.ACCESS_READ, offset=start)
        except (ValueError, OSError) as e:  # e.g. the file was truncated after it was opened
            raise FormatError(f"cannot map bytes [{offset}, {offset + length}): {e}", file=self.label) from None
        if hasattr(mm, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
            mm.madvise(mmap.MADV_SEQUENTIAL)
        # The view keeps the map alive; the map is unmapped when the last view is released.
        return memoryview(mm)[offset - start : offset - start + length]

    def read(self, offset: int, length: int, what: str = "read") -> bytes:
        self.check_range(offset, length, what)
        data = os.pread(self.fd, length, offset)
        if len(data) != length:  # the file shrank under us
            raise FormatError(f"{what}: short read at offset {offset}", file=self.label)
        return data

    def span(self, offset: int, length: int) -> FileSpan | None:
        return FileSpan(self.fd, offset, length)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class MemorySource(ByteSource):
    """Bytes already in memory (`from_bytes`): views are zero-copy slices."""

    def __init__(self, data: bytes | bytearray | memoryview, label: str = "<memory>") -> None:
        self._data = memoryview(data).cast("B")
        self.label = label
        self.size = len(self._data)

    def view(self, offset: int, length: int) -> memoryview:
        self.check_range(offset, length, "view")
        return self._data[offset : offset + length].toreadonly()


def _is_regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)


def open_source(src: str | os.PathLike[str] | bytes | bytearray | memoryview | ByteSource) -> ByteSource:
    """Open a path or wrap a buffer."""
    if isinstance(src, ByteSource):
        return src
    if isinstance(src, (bytes, bytearray, memoryview)):
        return MemorySource(src)
    return FileSource(src)
