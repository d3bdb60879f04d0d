"""Atomic output files: a scratch file beside the target, fsync, rename, fsync of the folder.

The target is either the old file or the complete new one after any failure, including kill -9
and a full disk. Scratch files are named `<target>.migrator-<pid>-<n>.tmp`, so a later run can
recognise the ones a dead process left behind and remove them.

`fsync=False` skips both fsyncs (and the early writeback): the publish is still a rename of a
complete file, so a crash of migrator never leaves a partial target, but a power loss or kernel
crash soon after may lose the new file's data, like `cp` or `torch.save`.
"""

from __future__ import annotations

import contextlib
import errno
import io
import itertools
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from .errors import OutputError, SameFileError, TargetExistsError

WRITE_BUFFER = 1 << 20
SCRATCH_RE = re.compile(r"^(?P<target>.+)\.migrator-(?P<pid>\d+)-(?P<n>\d+)\.tmp$")
_counter = itertools.count()


def scratch_name(target: Path, pid: int, n: int) -> Path:
    return target.with_name(f"{target.name}.migrator-{pid}-{n}.tmp")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_scratch(target: Path) -> list[Path]:
    """Remove scratch files for `target` left by processes that no longer exist."""
    removed: list[Path] = []
    folder = target.parent
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        m = SCRATCH_RE.match(name)
        if not m or m["target"] != target.name or _pid_alive(int(m["pid"])):
            continue
        path = folder / name
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    return removed


def same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_target(target: Path, *, overwrite: bool, protect: Iterable[str | os.PathLike[str]] = ()) -> None:
    """Refuse a target that is a source being read, a folder, or an existing file without overwrite."""
    for src in protect:
        if same_file(target, Path(src)):
            raise SameFileError("refusing to write onto a file being read", file=str(target))
    if target.is_dir():
        raise OutputError("the target is a folder", file=str(target))
    if (target.exists() or target.is_symlink()) and not overwrite:
        raise TargetExistsError("already exists; to replace it pass --overwrite (or set target.overwrite: true in the "
                                "recipe, overwrite=True in Python)", file=str(target))


@contextlib.contextmanager
def atomic_output(
    target: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    protect: Iterable[str | os.PathLike[str]] = (),
    expected_size: int | None = None,
    fsync: bool = True,
) -> Iterator[BinaryIO]:
    """Yield a binary file (buffered; `.raw` is the file) to write the whole output into; publish it on success.

    `expected_size`, when known, is reserved up front (a full disk fails before any data is
    written) and checked at the end.
    """
    target = Path(target)
    protect = list(protect)
    check_target(target, overwrite=overwrite, protect=protect)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise OutputError(f"folder {folder} does not exist", file=str(target))
    clean_stale_scratch(target)
    scratch, fd = _create_scratch(target)
    published = False
    try:
        with (ScratchFile if fsync else UnsyncedScratchFile)(fd, "wb") as f:
            if expected_size:
                _reserve(fd, expected_size, target)
            # Small pieces (headers, padding, small tensors) gather in one buffer: a 100k-tensor model
            # would otherwise cost several syscalls per tensor. Large writes pass straight through.
            sink = io.BufferedWriter(f, buffer_size=WRITE_BUFFER)
            yield sink
            sink.flush()
            written = f.tell()
            if expected_size is not None and written != expected_size:
                raise OutputError(f"wrote {written} bytes, planned {expected_size}", file=str(target))
            os.ftruncate(fd, written)
            if fsync:
                os.fsync(fd)
        _publish(scratch, target, overwrite=overwrite)
        published = True
    except OSError as e:
        raise OutputError(_describe(e), file=str(target)) from e
    finally:
        if not published:
            with contextlib.suppress(OSError):
                scratch.unlink()
    if fsync:
        _fsync_dir(folder, target)


class ScratchFile(io.FileIO):
    """The unbuffered output file; `start_writeback` tells streaming.py to push pages to disk early,
    so the final fsync has little left to wait for."""

    start_writeback = True


class UnsyncedScratchFile(ScratchFile):
    """Without fsync there is nothing to wait for: leave writeback to the kernel, as `cp` does."""

    start_writeback = False


def _create_scratch(target: Path) -> tuple[Path, int]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(1000):
        scratch = scratch_name(target, os.getpid(), next(_counter))
        try:
            return scratch, os.open(scratch, flags, 0o666)
        except FileExistsError:
            continue
        except OSError as e:
            why = " (the folder is not writable)" if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else ""
            raise OutputError(f"cannot create scratch file {scratch.name} in folder {scratch.parent}: "
                              f"{_describe(e)}{why}", file=str(target)) from e
    raise OutputError("cannot find a free scratch file name", file=str(target))


def _reserve(fd: int, size: int, target: Path) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise OutputError(f"not enough space for {size} bytes: {_describe(e)}", file=str(target)) from e
        # EOPNOTSUPP/EINVAL on filesystems without preallocation: the write path still fails safely.


def _publish(scratch: Path, target: Path, *, overwrite: bool) -> None:
    if overwrite:
        os.replace(scratch, target)
        return
    # No-clobber publish: link fails if someone created the target meanwhile.
    try:
        os.link(scratch, target)
    except FileExistsError as e:
        raise TargetExistsError("appeared while writing; not replaced", file=str(target)) from e
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        if target.exists():
            raise TargetExistsError("appeared while writing; not replaced", file=str(target)) from e
        os.rename(scratch, target)
        return
    scratch.unlink()


def _fsync_dir(folder: Path, target: Path) -> None:
    try:
        dfd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as e:
        raise OutputError(f"saved, but syncing the folder failed (durability unconfirmed): {_describe(e)}",
                          file=str(target)) from e


def _describe(e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return "no space left on device"
    return e.strerror or str(e)
