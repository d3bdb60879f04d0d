"""Random access to the bytes of a file or an in-memory buffer, without reading it whole.

Tensor data is handed out as views of a per-tensor memory map, so a tensor's pages leave the
process's RSS as soon as its view is dropped: holding one mapping of the whole file would keep every
page touched so far resident.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from .errors import FormatError, ReaderClosedError

_PAGE = mmap.ALLOCATIONGRANULARITY


@dataclass(frozen=True, slots=True)
class FileSpan:
    """Bytes that lie verbatim in an open file: lets a writer copy them in the kernel."""

    fd: int
    offset: int
    length: int


_span_fd = vars(FileSpan)["fd"]  # the slot's own descriptor (FileView's `fd` is a property over it)


def closed_error(label: str) -> ReaderClosedError:
    return ReaderClosedError("read after its reader was closed: read or save the tensors of a reader before "
                             "closing it (inside its `with` block)", file=label)


class FileView(FileSpan):
    """A file span that is also the loader of the tensor stored there (`LazyTensor.loader`, `.span`).

    One object per stored tensor rather than a span plus a loader: a 100k-tensor model keeps
    100k of these. Equal to another FileView over the same bytes, as spans compare.

    `fd` is checked against the source's descriptor on every use: once the reader is closed its
    number may belong to another file, and a kernel copy from it would copy that file's bytes.
    """

    __slots__ = ("source",)
    source: ByteSource

    @property
    def fd(self) -> int:
        fd: int = _span_fd.__get__(self)
        if getattr(self.source, "fd", fd) != fd:
            raise closed_error(self.source.label)
        return fd

    def __call__(self) -> memoryview:
        return self.source.view(self.offset, self.length)


def file_view(source: ByteSource, fd: int, offset: int, length: int) -> FileView:
    """A FileView of `length` bytes at `offset` in `source`, whose descriptor is `fd`."""
    view = object.__new__(FileView)
    _span_fd.__set__(view, fd)
    _set_offset(view, offset)
    _set_length(view, length)
    _set_source(view, source)
    return view


# frozen: plain assignment raises
_set_source = vars(FileView)["source"].__set__
_set_offset, _set_length = vars(FileSpan)["offset"].__set__, vars(FileSpan)["length"].__set__


class ByteSource(ABC):
    """Bounded reads and zero-copy views over some bytes."""

    label: str
    size: int
    # What a source says of the files it reads (declared here so a run reads them as attributes):
    identity: tuple[int, int] | None = None
    """(device, inode) of the one open file read, so no output replaces it through another path."""
    identities: Sequence[tuple[int, int]] = ()
    """(device, inode) of each file read, for a source of several (a folder of shards)."""
    mode: int | None = None
    """The permission bits of the file(s) read: an output gets no more than they allow."""

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

    identity: tuple[int, int]
    mode: int

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.label = str(path)
        # A FIFO would block open() until a writer comes, and opening a device can act on it
        # (rewind a tape): refuse special files by stat first, and open without blocking in case
        # the path was swapped since; fstat of what was opened is what counts.
        try:
            mode = os.stat(self.path).st_mode
            if not _is_regular(mode):
                raise FormatError(not_regular(mode), file=self.label)
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise FormatError(f"cannot open: {e.strerror}", file=self.label) from e
        st = os.fstat(self.fd)
        if not _is_regular(st.st_mode):
            os.close(self.fd)
            raise FormatError(not_regular(st.st_mode), file=self.label)
        os.set_blocking(self.fd, True)
        self.size = st.st_size
        self.identity = (st.st_dev, st.st_ino)
        self.mode = st.st_mode

    def view(self, offset: int, length: int) -> memoryview:
        if self.fd < 0:  # mmap would map anonymous zeros for descriptor -1
            raise closed_error(self.label)
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
        if self.fd < 0:
            raise closed_error(self.label)
        self.check_range(offset, length, what)
        data = os.pread(self.fd, length, offset)
        if len(data) != length:  # the file shrank under us
            raise FormatError(f"{what}: short read at offset {offset}", file=self.label)
        return data

    def span(self, offset: int, length: int) -> FileSpan | None:
        if self.fd < 0:
            raise closed_error(self.label)
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
        self.closed = False

    def view(self, offset: int, length: int) -> memoryview:
        if self.closed:  # as a file's: what a closed reader listed is not read
            raise closed_error(self.label)
        self.check_range(offset, length, "view")
        return self._data[offset : offset + length].toreadonly()

    def close(self) -> None:
        self.closed = True


def _is_regular(mode: int) -> bool:
    return stat.S_ISREG(mode)


def not_regular(mode: int) -> str:
    kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "a special file")
    return f"not a regular file ({kind}); only regular files are read"


def read_regular(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """At most `max_bytes` + 1 bytes of a small file (a config, a recipe, a tokenizer file), opened
    non-blocking and refused unless it is a regular file: reading a FIFO blocks forever and a device
    (/dev/zero) never ends. Raises OSError; its strerror says why (callers show it)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, not_regular(st.st_mode))
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(max_bytes + 1)
    finally:
        os.close(fd)


def read_short_text(path: str | os.PathLike[str], max_bytes: int, encoding: str, what: str) -> str:
    """The stripped text of a one-line file a checkpoint folder names its step with (DeepSpeed's
    `latest`, Megatron's tracker file), read as `read_regular` reads: "" when it is longer than
    `max_bytes` or not text in `encoding` (the caller's refusal says what the file must hold);
    FormatError "cannot read {what}: ..." naming the file when it cannot be read."""
    try:
        raw = read_regular(path, max_bytes)
    except OSError as e:
        raise FormatError(f"cannot read {what}: {e.strerror}", file=str(path)) from None
    if len(raw) > max_bytes:
        return ""
    try:
        return raw.decode(encoding).strip()
    except UnicodeDecodeError:
        return ""


def open_source(src: str | os.PathLike[str] | bytes | bytearray | memoryview | ByteSource) -> ByteSource:
    """Open a path or wrap a buffer."""
    if isinstance(src, ByteSource):
        return src
    if isinstance(src, (bytes, bytearray, memoryview)):
        return MemorySource(src)
    return FileSource(src)


class FileSet(ByteSource):
    """The `source` of a reader of many files (shards, rank files): its label and total size (bytes
    are read per file, through each file's own source), the (device, inode) of every file (no output
    may replace one) and the permission bits they share (a new output gets no more, as for a
    single-file source). `kind` names it in the error of a whole-source read ("a sharded source")."""

    def __init__(self, path: str, size: int, identities: Sequence[tuple[int, int]] = (), mode: int = 0o666,
                 kind: str = "a sharded source") -> None:
        self.path = path
        self.label = path
        self.size = size
        self.identities = list(identities)
        self.mode = mode
        self.kind = kind

    def view(self, offset: int, length: int) -> memoryview:
        raise FormatError(f"{self.kind} has no single byte range; read its tensors", file=self.label)
