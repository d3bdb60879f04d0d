"""Files of a many-file source read without holding them open: a few descriptors for any number of files.

A checkpoint of 1,000 shards or ranks must read under a common `ulimit -n` of 1,024, so no reader of
several files keeps one descriptor per file. Each file is opened once to learn its identity (device,
inode), size and permission bits, then closed; its bytes are read by opening it again through a
`Descriptors` table shared by the reader's files, which keeps at most `OPEN_FILES` open between reads
(least recently used closed first) and refuses a file whose identity or size changed since.

A tensor's `span` over such a file is a `ReopenedView` whose `fd` opens its file on demand, so unchanged
bytes are still copied in the kernel. A descriptor is closed only when it is none thread's most
recently asked-for one: every user of `span.fd` (streaming, casts, the PyTorch writer's CRC) asks for it
again right before each syscall, so the descriptor a thread is using is never closed (nor its number
reused) under it. The soft limit is OPEN_FILES plus one per thread reading.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict
from pathlib import Path

from .bytesource import ByteSource, FileSource, FileSpan, FileView, closed_error
from .errors import FormatError

OPEN_FILES = 4
"""Descriptors a table keeps open between reads (least recently used closed first)."""
SMALL_READ = 256 << 10
"""Reads up to this size are one pread rather than a map."""

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)


class ReopenedFile:
    """One file: its identity and size when it was first opened, and the table its descriptors come from."""

    __slots__ = ("fds", "identity", "label", "path", "size")

    def __init__(self, path: Path, size: int, identity: tuple[int, int], fds: Descriptors) -> None:
        self.path, self.size, self.identity, self.fds = path, size, identity, fds
        self.label = str(path)

    def view(self, offset: int, length: int) -> memoryview:
        """`length` bytes at `offset`, mapped when large (as `ByteSource.view`: a merge's band reader)."""
        return self.fds.read(self, offset, length, self.label)


class Descriptors:
    """The few descriptors of a reader's files open at a time; only this class closes them."""

    def __init__(self, limit: int = OPEN_FILES) -> None:
        self.limit = limit
        # keyed by the file object itself, not its id(): a file dropped while its descriptor is open must
        # not hand that descriptor to a new file that reuses the id
        self.open: OrderedDict[ReopenedFile, int] = OrderedDict()  # file -> fd
        self.pinned: dict[int, ReopenedFile] = {}  # thread id -> the file it asked for last
        self.lock = threading.Lock()
        self.closed = False

    def fd_for(self, file: ReopenedFile) -> int:
        """The file's descriptor, kept open until this thread asks for another file's."""
        with self.lock:
            self.pinned[threading.get_ident()] = file
            return self._fd(file)

    def _fd(self, file: ReopenedFile) -> int:
        if self.closed:
            raise closed_error(str(file.path))
        fd = self.open.get(file)
        if fd is not None:
            self.open.move_to_end(file)
            return fd
        try:  # non-blocking: a file swapped for a FIFO since must not block the open
            fd = os.open(file.path, _FLAGS)
        except OSError as e:
            raise FormatError(f"cannot open: {e.strerror}", file=str(file.path)) from None
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != file.identity or st.st_size != file.size:
            os.close(fd)
            raise FormatError("the file changed since its header was read", file=str(file.path))
        os.set_blocking(fd, True)
        self.open[file] = fd
        if len(self.open) > self.limit:
            alive = {t.ident for t in threading.enumerate()}  # a finished thread's pin is dropped
            self.pinned = {k: v for k, v in self.pinned.items() if k in alive}
            keep = {id(f) for f in self.pinned.values()} | {id(file)}
            for key in [k for k in self.open if id(k) not in keep][: len(self.open) - self.limit]:
                os.close(self.open.pop(key))
        return fd

    def read(self, file: ReopenedFile, offset: int, length: int, label: str) -> memoryview:
        """`length` bytes at `offset`: a pread when small, else a map (which holds its own reference
        to the file, so the descriptor may be closed while the view lives)."""
        if offset < 0 or length < 0 or offset + length > file.size:
            raise FormatError(f"read needs bytes [{offset}, {offset + length}) but the input has {file.size} bytes",
                              file=label)
        if length == 0:
            return memoryview(b"")
        with self.lock:
            fd = self._fd(file)
            if length <= SMALL_READ:
                data = os.pread(fd, length, offset)
                if len(data) != length:
                    raise FormatError(f"short read at offset {offset}", file=label)
                return memoryview(data)
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            try:
                mm = mmap.mmap(fd, length + offset - start, access=mmap.ACCESS_READ, offset=start)
            except (ValueError, OSError) as e:
                raise FormatError(f"cannot map bytes [{offset}, {offset + length}): {e}", file=label) from None
        if hasattr(mm, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
            mm.madvise(mmap.MADV_SEQUENTIAL)
        return memoryview(mm)[offset - start: offset - start + length]

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.pinned.clear()
            while self.open:
                os.close(self.open.popitem()[1])

    def __len__(self) -> int:
        return len(self.open)


class ReopenedView(FileView):
    """A tensor stored verbatim in a reopened file: its loader and its span (`source` is the `ReopenedFile`).

    `fd` is a property (it shadows FileSpan's slot, which stays unset): the file is opened when a
    writer asks. Equality and hashing use the file, never a descriptor number.
    """

    __slots__ = ()

    @property
    def fd(self) -> int:
        file: ReopenedFile = self.source  # type: ignore[assignment]
        return file.fds.fd_for(file)

    def __call__(self) -> memoryview:
        file: ReopenedFile = self.source  # type: ignore[assignment]
        return file.fds.read(file, self.offset, self.length, file.label)

    def __eq__(self, other: object) -> bool:
        return (type(other) is ReopenedView and other.source is self.source and other.offset == self.offset
                and other.length == self.length)

    def __hash__(self) -> int:
        return hash((id(self.source), self.offset, self.length))


_set_offset, _set_length, _set_view_source = (FileSpan.offset.__set__, FileSpan.length.__set__,  # type: ignore[attr-defined, misc]
                                              FileView.source.__set__)  # type: ignore[attr-defined]


def reopened_view(file: ReopenedFile, offset: int, length: int) -> ReopenedView:
    view = object.__new__(ReopenedView)
    _set_offset(view, offset)
    _set_length(view, length)
    _set_view_source(view, file)
    return view


class ReopenedBytes(ByteSource):
    """One reopened file as a ByteSource: a reader parses its header and reads its tensors through the
    table's descriptors, and a writer still sees spans it may copy in the kernel. Closing it releases
    nothing: the table (closed by the reader of all the files) owns the descriptors."""

    def __init__(self, file: ReopenedFile, mode: int | None = None) -> None:
        self.file = file
        self.path = file.path
        self.label = file.label
        self.size = file.size
        self.identity = file.identity
        self.mode = mode

    def view(self, offset: int, length: int) -> memoryview:
        return self.file.fds.read(self.file, offset, length, self.label)

    def read(self, offset: int, length: int, what: str = "read") -> bytes:
        self.check_range(offset, length, what)
        return bytes(self.view(offset, length))

    def span(self, offset: int, length: int) -> FileSpan | None:
        return reopened_view(self.file, offset, length)


def reopening(path: str | os.PathLike[str], fds: Descriptors) -> ReopenedBytes:
    """`path` as a source read through `fds`: opened here once (refused as `FileSource` refuses a FIFO,
    a device, a folder) for its identity, size and permission bits, then closed again."""
    first = FileSource(path)
    try:
        return ReopenedBytes(ReopenedFile(Path(path), first.size, first.identity, fds), first.mode)
    finally:
        first.close()
