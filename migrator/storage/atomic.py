"""Atomic output files: a scratch file beside the target, fsync, rename, fsync of the folder.

Every file migrator writes (tensor outputs, `--report` JSON, `schema -o`) goes through
`atomic_output`, so each gets the same guarantees:

- the target is either the old file or the complete new one after any failure, including kill -9
  and a full disk;
- an existing target is refused without `overwrite`; a folder, FIFO, device or socket is refused
  even with it (a symlink is replaced, not followed, unless it leads to one of those);
- a target that is, by inode or by resolved path (symlinks and hard links included), a file being
  read (`protect`) or another output of the same run (`outputs`) is refused;
- the scratch file is created 0600; the published file keeps the permission bits of the file it
  replaces, and a new file gets the read/write bits common to its sources (`mode_from`) masked by
  the umask, as `cp` does (no sources: 0666 masked by the umask).

Scratch files are named `<target>.migrator-<pid>-<n>.tmp`, so a later run can recognise the ones a
dead process left behind and remove them; a name whose pid is not one a process can have is some
other program's file and is left alone.

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
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from ..core import crashpoints
from ..core.errors import MigratorError, OutputError, SameFileError, TargetExistsError

WRITE_BUFFER = 1 << 20
SCRATCH_RE = re.compile(r"^(?P<target>.+)\.migrator-(?P<pid>\d+)-(?P<n>\d+)\.tmp$")
_counter = itertools.count()
PID_MAX = 1 << 22
"""Linux's PID_MAX_LIMIT: no process has a larger pid; a scratch name with one is not ours."""

Protected = str | os.PathLike[str] | tuple[int, int]
"""A file the write must not replace: a path, or the (st_dev, st_ino) of a file held open."""


def scratch_name(target: Path, pid: int, n: int) -> Path:
    return target.with_name(f"{target.name}.migrator-{pid}-{n}.tmp")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process, or not a pid at all: never ours to clean
    return True


def _scratch_pid(text: str) -> int | None:
    """The pid in a scratch name, or None when no process of ours can have written it (a leading
    zero, 0, or beyond the kernel's pid limit: the file is someone else's)."""
    if len(text) > 7 or text.startswith("0"):
        return None
    pid = int(text)
    return pid if 0 < pid <= PID_MAX else None


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
        if not m or m["target"] != target.name:
            continue
        pid = _scratch_pid(m["pid"])
        if pid is None or _pid_alive(pid):
            continue
        path = folder / name
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(path).st_mode):  # only files: a folder or link of that name is not ours
                path.unlink()
                removed.append(path)
    return removed


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether writing one would write the other: the same inode when both exist (hard links,
    symlinks to it), else the same resolved path (a target not written yet, a dangling symlink).
    The one rule for every "is the output one of the inputs?" check (target checks here, a recipe's
    target against its sources, a command line's paths)."""
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
    except (OSError, ValueError):  # unreadable: the paths decide
        pass
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):  # an embedded NUL, a loop: as written
        return os.path.abspath(a) == os.path.abspath(b)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _is(target: Path, other: Protected) -> bool:
    """Whether writing `target` would write onto `other`: the same inode (hard links, symlinks to
    it), or the same resolved path (a target that does not exist yet, a dangling symlink)."""
    if isinstance(other, tuple):
        return _identity(target) == other
    return same_file(target, other)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_target(target: Path, *, overwrite: bool, protect: Iterable[Protected] = (),
                 outputs: Iterable[str | os.PathLike[str]] = ()) -> None:
    """Refuse a target that is a file being read (`protect`), another output of the same run
    (`outputs`), a folder or special file, or an existing file without overwrite."""
    check_distinct(target, protect, outputs)
    try:
        st = os.lstat(target)
    except (FileNotFoundError, NotADirectoryError):  # nothing there yet (a missing folder is the folder's problem)
        return
    except OSError as e:
        raise OutputError(f"cannot check the target: {_describe(e)}", file=str(target)) from e
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        with contextlib.suppress(OSError):
            mode = os.stat(target).st_mode  # the link is replaced, but not a link to a folder or a device
    if stat.S_ISDIR(mode):
        raise OutputError("the target is a folder", file=str(target))
    if not stat.S_ISREG(mode) and not stat.S_ISLNK(mode):
        raise OutputError(f"the target is {_kind(mode)}; refusing to replace it (even with --overwrite)",
                          file=str(target))
    if not overwrite:
        raise TargetExistsError("already exists; to replace it pass --overwrite (or set target.overwrite: true in the "
                                "recipe, overwrite=True in Python)", file=str(target))


def check_distinct(target: Path, protect: Iterable[Protected] = (),
                   outputs: Iterable[str | os.PathLike[str]] = ()) -> None:
    """Refuse a target that is a file being read or another output of the same run."""
    for src in protect:
        if _is(target, src):
            raise SameFileError("refusing to write onto a file being read", file=str(target))
    for out in outputs:
        if _is(target, out):
            raise SameFileError(f"refusing to write two outputs of one run to one file (also {out})",
                                file=str(target))


def target_problems(target: Path, *, overwrite: bool, protect: Iterable[Protected] = (),
                    outputs: Iterable[str | os.PathLike[str]] = ()) -> list[str]:
    """What a write to `target` would refuse, as messages, without writing: `check_target`'s
    refusals, and a folder that cannot be created or written (for `validate` and `plan`)."""
    try:
        check_target(target, overwrite=overwrite, protect=protect, outputs=outputs)
    except MigratorError as e:
        return [str(e)]
    folder = _folder(target)
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent  # the nearest existing folder: the run creates the missing ones
    if not folder.is_dir():
        return [f"{target}: cannot create its folder: {folder} is not a folder"]
    if not os.access(folder, os.W_OK | os.X_OK):
        return [f"{target}: folder {folder} is not writable"]
    return []


def _folder(target: Path) -> Path:
    return target.parent if str(target.parent) else Path(".")


def _umask() -> int:
    """The process's umask, read without changing it where Linux allows (no window for threads)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def output_mode(target: Path, *, overwrite: bool, mode_from: Iterable[str | os.PathLike[str] | int] = ()) -> int:
    """The permission bits to publish `target` with: those of the regular file it replaces; for a
    new file, the read/write bits every source has (0666 when none), masked by the umask."""
    if overwrite:
        with contextlib.suppress(OSError):
            st = os.stat(target)
            if stat.S_ISREG(st.st_mode):
                return stat.S_IMODE(st.st_mode) & 0o777
    mode = 0o666
    for src in mode_from:
        if isinstance(src, int):
            mode &= src
        else:
            with contextlib.suppress(OSError):
                mode &= os.stat(src).st_mode
    return mode & 0o666 & ~_umask()


def _make_folders(folder: Path, target: Path) -> list[Path]:
    """Create `folder` and its missing parents; returns those created, deepest first."""
    missing = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            continue
        except OSError as e:
            _remove_folders([m for m in missing if m.is_dir()])
            raise OutputError(f"cannot create folder {d}: {_describe(e)}", file=str(target)) from e
    return missing


def _remove_folders(created: list[Path]) -> None:
    for d in created:  # deepest first; a folder someone has put something in meanwhile stays
        with contextlib.suppress(OSError):
            os.rmdir(d)


@contextlib.contextmanager
def atomic_output(
    target: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    protect: Iterable[Protected] = (),
    outputs: Iterable[str | os.PathLike[str]] = (),
    expected_size: int | None = None,
    fsync: bool = True,
    mode_from: Iterable[str | os.PathLike[str] | int] = (),
    make_folders: bool = False,
) -> Iterator[BinaryIO]:
    """Yield a binary file (buffered; `.raw` is the file) to write the whole output into; publish it on success.

    `protect` are files being read and `outputs` the run's other outputs: none may be the target.
    `expected_size`, when known, is reserved up front (a full disk fails before any data is
    written) and checked at the end. `mode_from` are the sources whose permissions a new file
    gets (see the module docstring). `make_folders` creates a missing target folder (removed again
    if nothing is published).
    """
    target = Path(target)
    protect, outputs, mode_from = list(protect), list(outputs), list(mode_from)
    check_target(target, overwrite=overwrite, protect=protect, outputs=outputs)
    folder = _folder(target)
    created: list[Path] = []
    if make_folders:
        created = _make_folders(folder, target)
    elif not folder.is_dir():
        raise OutputError(f"folder {folder} does not exist", file=str(target))
    clean_stale_scratch(target)
    try:
        scratch, fd = create_scratch(target, created if make_folders else None)
        crashpoints.reached("scratch-created")
    except BaseException:
        _remove_folders(created)
        raise
    published = False
    try:
        with (ScratchFile if fsync else UnsyncedScratchFile)(fd, "wb") as f:
            f.scratch_path = scratch  # for workers that open the scratch file themselves (parallel_write)
            if expected_size:
                reserve(fd, expected_size, target)
            # Small pieces (headers, padding, small tensors) gather in one buffer: a 100k-tensor model
            # would otherwise cost several syscalls per tensor. Large writes pass straight through.
            sink = io.BufferedWriter(f, buffer_size=WRITE_BUFFER)
            yield sink
            sink.flush()
            crashpoints.reached("written")
            written = f.tell()
            if expected_size is not None and written != expected_size:
                raise OutputError(f"wrote {written} bytes, planned {expected_size}", file=str(target))
            os.ftruncate(fd, written)
            check_distinct(target, protect, outputs)  # again: a link to a source may have appeared meanwhile
            os.fchmod(fd, output_mode(target, overwrite=overwrite, mode_from=mode_from))
            if fsync:
                os.fsync(fd)
            crashpoints.reached("synced")
        _publish(scratch, target, overwrite=overwrite)
        published = True
        crashpoints.reached("published")
    except OSError as e:
        raise OutputError(_describe(e), file=str(target)) from e
    finally:
        if not published:
            with contextlib.suppress(OSError):
                scratch.unlink()
            _remove_folders(created)
    if fsync:
        _fsync_dir(folder, target)
    crashpoints.reached("done")


def write_file(target: str | os.PathLike[str], data: bytes, *, overwrite: bool = False,
               protect: Iterable[Protected] = (), outputs: Iterable[str | os.PathLike[str]] = (),
               fsync: bool = True, mode_from: Iterable[str | os.PathLike[str] | int] = (),
               make_folders: bool = False) -> None:
    """Write a small whole file (a report, a schema) through `atomic_output`."""
    with atomic_output(target, overwrite=overwrite, protect=protect, outputs=outputs, expected_size=len(data),
                       fsync=fsync, mode_from=mode_from, make_folders=make_folders) as f:
        f.write(data)


class ScratchFile(io.FileIO):
    """The unbuffered output file; `start_writeback` tells streaming.py to push pages to disk early,
    so the final fsync has little left to wait for."""

    start_writeback = True
    scratch_path: Path | None = None


class UnsyncedScratchFile(ScratchFile):
    """Without fsync there is nothing to wait for: leave writeback to the kernel, as `cp` does."""

    start_writeback = False


def create_scratch(target: Path, created: list[Path] | None = None) -> tuple[Path, int]:
    """The scratch file of `target`. `created`: the folders this write made (None: it makes none).
    A folder made here can be removed before the scratch file is in it, by another write (another
    job of the same run) that failed after making that folder too and removes the empty folders it
    made: it is made again, so that job's failure does not cost this one its output."""
    for attempt in range(3):
        try:
            return _create_scratch(target)
        except OutputError as e:
            if created is None or attempt == 2 or not isinstance(e.__cause__, FileNotFoundError):
                raise
            created += [d for d in _make_folders(_folder(target), target) if d not in created]
    raise AssertionError("unreachable")


def _create_scratch(target: Path) -> tuple[Path, int]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(1000):
        scratch = scratch_name(target, os.getpid(), next(_counter))
        try:
            return scratch, os.open(scratch, flags, 0o600)  # private while written: fchmod'd before publishing
        except FileExistsError:
            continue
        except OSError as e:
            why = " (the folder is not writable)" if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else ""
            raise OutputError(f"cannot create scratch file {scratch.name} in folder {scratch.parent}: "
                              f"{_describe(e)}{why}", file=str(target)) from e
    raise OutputError("cannot find a free scratch file name", file=str(target))


def reserve(fd: int, size: int, target: Path) -> None:
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
