"""Atomic output folders: every file written into a scratch folder beside the target, then one rename.

After any failure, kill -9 and a full disk included, the target is either absent / the old folder
complete, or the new folder complete: never old and new shards mixed, never an index naming a shard
that is not there. Scratch folders are named `<target>.migrator-<pid>-<n>.tmpdir`, so a later run
removes the ones a dead process left.

Publishing:
- no target yet: `renameat2(RENAME_NOREPLACE)` (Linux), so a folder that appears meanwhile is never
  replaced; elsewhere a check then `rename`, which may replace a folder created in between if it is empty.
- `overwrite` of an existing folder: on Linux `renameat2(RENAME_EXCHANGE)` swaps the two folders in
  one step, then the old one (now at the scratch name) is removed. Where that call is missing the
  old folder is first renamed aside, then the new one renamed in: a crash between the two renames
  leaves no target, with the old folder complete at its aside name (`...tmpdir`, removed by the next run).

Only a folder that is empty or holds model files (weights, an index) is replaced: `overwrite` on a
mistyped path must not delete an unrelated tree.

`fsync=True` flushes every file, the scratch folder and the parent folder; `fsync=False` skips that
(the publish is still one rename of a complete folder).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import io
import itertools
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO

from .atomic import WRITE_BUFFER, ScratchFile, UnsyncedScratchFile, _describe, _fsync_dir, _pid_alive, _reserve
from .errors import OutputError, TargetExistsError

SCRATCH_DIR_RE = re.compile(r"^(?P<target>.+)\.migrator-(?P<pid>\d+)-(?P<n>\d+)\.tmpdir$")
MODEL_FILE_RE = re.compile(r".*\.(safetensors|bin|pt|pth|bpk|index\.json)$")
_counter = itertools.count()
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
_AT_FDCWD = -100
_SYSCALL_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "arm64": 276}


def scratch_dir_name(target: Path, pid: int, n: int) -> Path:
    return target.with_name(f"{target.name}.migrator-{pid}-{n}.tmpdir")


def clean_stale_folders(target: Path) -> list[Path]:
    """Remove scratch folders for `target` left by processes that no longer exist."""
    removed: list[Path] = []
    try:
        names = os.listdir(target.parent)
    except OSError:
        return removed
    for name in names:
        m = SCRATCH_DIR_RE.match(name)
        if not m or m["target"] != target.name or _pid_alive(int(m["pid"])):
            continue
        path = target.parent / name
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            removed.append(path)
    return removed


def check_folder_target(target: Path, *, overwrite: bool) -> None:
    """Refuse a target that is a file, an existing folder without overwrite, or a folder that is no model folder."""
    if os.path.lexists(target) and (target.is_symlink() or not target.is_dir()):
        raise OutputError("the target exists and is not a folder (a sharded output is a folder)", file=str(target))
    if not target.is_dir():
        return
    if not overwrite:
        raise TargetExistsError("already exists; to replace it pass --overwrite (or set target.overwrite: true in "
                                "the recipe)", file=str(target))
    try:
        names = os.listdir(target)
    except OSError as e:
        raise OutputError(f"cannot list the existing target folder: {_describe(e)}", file=str(target)) from e
    if names and not any(MODEL_FILE_RE.match(n) for n in names):
        raise OutputError("refusing to replace a folder that holds no model files (weights or an index); "
                          "remove it yourself or choose another target", file=str(target))


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """renameat2(2); False when this system has no such call (then the caller falls back)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    args = (_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags)
    if fn is not None:
        fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
        rc = fn(*args)
    else:
        number = _SYSCALL_RENAMEAT2.get(os.uname().machine)
        if number is None:
            return False
        rc = libc.syscall(ctypes.c_long(number), ctypes.c_int(args[0]), ctypes.c_char_p(args[1]),
                          ctypes.c_int(args[2]), ctypes.c_char_p(args[3]), ctypes.c_uint(flags))
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # old kernel, or a filesystem without the flag
        return False
    raise OSError(err, os.strerror(err), str(dst))


def _publish(scratch: Path, target: Path, *, overwrite: bool) -> Path | None:
    """Put `scratch` at `target`; returns the old folder's new place when one was replaced."""
    if not os.path.lexists(target):
        try:
            if _renameat2(scratch, target, RENAME_NOREPLACE):
                return None
        except FileExistsError:
            raise TargetExistsError("appeared while writing; not replaced", file=str(target)) from None
        if os.path.lexists(target):
            raise TargetExistsError("appeared while writing; not replaced", file=str(target))
        os.rename(scratch, target)
        return None
    if not overwrite:
        raise TargetExistsError("appeared while writing; not replaced", file=str(target))
    if _renameat2(scratch, target, RENAME_EXCHANGE):
        return scratch  # the old folder now sits at the scratch name
    aside = scratch_dir_name(target, os.getpid(), next(_counter))
    os.rename(target, aside)
    os.rename(scratch, target)
    return aside


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) * path.is_dir())
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FolderScratch:
    """The scratch folder being filled: files are created in it exclusively and written whole."""

    def __init__(self, path: Path, target: Path, fsync: bool) -> None:
        self.path, self.target, self.fsync = path, target, fsync
        self.written: list[Path] = []  # flushed together by `sync`, before the publish

    def sync(self) -> None:
        """fsync every file written, then the folder. Deferred to the end so that a shard's last
        writeback overlaps with writing the next one instead of stalling it."""
        for path in self.written:
            _fsync_path(path)
        _fsync_path(self.path)

    @contextlib.contextmanager
    def file(self, name: str, expected_size: int | None = None) -> Iterator[BinaryIO]:
        """A new file `name` in the scratch folder, buffered like `atomic_output`'s, checked and synced at the end."""
        path = self.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(path, flags, 0o666)
        with (ScratchFile if self.fsync else UnsyncedScratchFile)(fd, "wb") as f:
            if expected_size:
                _reserve(fd, expected_size, self.target / name)
            sink = io.BufferedWriter(f, buffer_size=WRITE_BUFFER)
            yield sink
            sink.flush()
            written = f.tell()
            if expected_size is not None and written != expected_size:
                raise OutputError(f"wrote {written} bytes, planned {expected_size}", file=str(self.target / name))
            os.ftruncate(fd, written)
        self.written.append(path)

    def copy(self, src: Path, name: str) -> None:
        """A companion file, byte for byte."""
        path = self.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, path)
        self.written.append(path)


@contextlib.contextmanager
def atomic_folder(target: str | os.PathLike[str], *, overwrite: bool = False,
                  fsync: bool = True) -> Iterator[FolderScratch]:
    """Yield a scratch folder to write the whole output into; publish it as `target` on success."""
    target = Path(os.path.normpath(target))
    check_folder_target(target, overwrite=overwrite)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create folder {target.parent}: {_describe(e)}", file=str(target)) from e
    clean_stale_folders(target)
    scratch = None
    for _ in range(1000):
        candidate = scratch_dir_name(target, os.getpid(), next(_counter))
        try:
            os.mkdir(candidate)
            scratch = candidate
            break
        except FileExistsError:
            continue
        except OSError as e:
            raise OutputError(f"cannot create scratch folder {candidate.name} in {target.parent}: {_describe(e)}",
                              file=str(target)) from e
    if scratch is None:
        raise OutputError("cannot find a free scratch folder name", file=str(target))
    old: Path | None = None
    published = False
    try:
        folder = FolderScratch(scratch, target, fsync)
        yield folder
        if fsync:
            folder.sync()
        old = _publish(scratch, target, overwrite=overwrite)
        published = True
    except OSError as e:
        raise OutputError(_describe(e), file=str(target)) from e
    finally:
        if not published:
            shutil.rmtree(scratch, ignore_errors=True)
    if fsync:
        _fsync_dir(target.parent, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_sharded(writer: object, path: str | os.PathLike[str], *, overwrite: bool = False,
                 progress: Callable[[BinaryIO, int], AbstractContextManager[None]] | None = None,
                 fsync: bool = True) -> str:
    """Write a `ShardedWriter`'s shards, index and companion files as one folder, atomically."""
    from .formats.sharded_writer import ShardedWriter

    assert isinstance(writer, ShardedWriter)
    out = writer.resolve_path(path)
    with atomic_folder(out, overwrite=overwrite, fsync=fsync) as folder:
        for name, shard in writer.files:
            with folder.file(name, shard.total_size) as sink:
                if progress is None:
                    shard.write_to(sink)
                else:
                    with progress(sink, shard.total_size):
                        shard.write_to(sink)
        if writer.index is not None:
            data = writer.index_bytes()
            with folder.file(writer.index_name, len(data)) as sink:
                sink.write(data)
        for src, name in writer.copies:
            folder.copy(src, name)
    return out
