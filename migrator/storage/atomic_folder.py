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

`overwrite` replaces a model, never the user's other files: an existing folder is replaced only when
it holds nothing but a model folder's parts (its weights: index, single weights file, numbered
shards, the shards its index names) and the files the new folder holds (`foreign_entries`); checked
up front and again right before the publish. Nor is the current folder (or one holding it) replaced:
the process, and the shell it was started from, would be left in a deleted folder.

`fsync=True` flushes every file, the scratch folder and the parent folder; `fsync=False` skips that
(the publish is still one rename of a complete folder).

As for single files (`migrator.storage.atomic`): no file being read (`protect`, by path or by the inode a
reader holds) may be in the folder that is replaced, nor may the run's other outputs (`outputs`,
e.g. a `--report` file) be in it; checked up front and again right before the publish. Each new
file gets the permission bits of the file of that name it replaces, else the read/write bits its
sources share (`mode_from`; a companion file: its own), masked by the umask, like `cp`.
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
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ..core.errors import OutputError, SameFileError, TargetExistsError
from .atomic import (
    WRITE_BUFFER,
    Protected,
    ScratchFile,
    UnsyncedScratchFile,
    _describe,
    _fsync_dir,
    _pid_alive,
    output_mode,
    reserve,
)

if TYPE_CHECKING:
    from .remote.options import StorageOptions

SCRATCH_DIR_RE = re.compile(r"^(?P<target>.+)\.migrator-(?P<pid>\d+)-(?P<n>\d+)\.tmpdir$")
# weights, an index, or a DCP checkpoint's files (`.metadata`, `__R_N.distcp`)
MODEL_FILE_RE = re.compile(r"(?:.*\.(safetensors|bin|pt|pth|bpk|gguf|index\.json|distcp)|\.metadata)$")
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


MAX_CHECKED_FILES = 100_000
"""Files of an existing target folder compared with the protected ones (a model folder has a few)."""


def _inside(path: str | os.PathLike[str], folder: Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def check_folder_distinct(target: Path, protect: Iterable[Protected] = (),
                          outputs: Iterable[str | os.PathLike[str]] = ()) -> None:
    """Refuse a folder target that holds (or is) a file being read, or another output of the run."""
    protect = list(protect)
    for out in outputs:
        if _inside(out, target):
            raise SameFileError(f"refusing to write another output of this run inside the output folder ({out})",
                                file=str(target))
    for p in protect:
        if not isinstance(p, tuple) and _inside(p, target):
            raise SameFileError(f"refusing to replace a folder holding a file being read ({p})", file=str(target))
    identities = {p for p in protect if isinstance(p, tuple)}
    if not identities or not target.is_dir() or target.is_symlink():
        return
    seen = 0
    for folder, dirs, files in os.walk(target):  # symlinked folders are not followed; a linked file is
        for name in files + dirs:
            seen += 1
            if seen > MAX_CHECKED_FILES:
                raise OutputError(f"the existing target folder holds over {MAX_CHECKED_FILES} files; refusing to "
                                  "replace it", file=str(target))
            with contextlib.suppress(OSError):
                st = os.stat(os.path.join(folder, name))
                if (st.st_dev, st.st_ino) in identities:
                    raise SameFileError("refusing to replace a folder holding a file being read "
                                        f"({os.path.join(folder, name)})", file=str(target))


Owned = Callable[[Path], Iterable[str]]
"""The names at an existing folder's top that belong to the model already there (`files.sharded.
model_parts`: its weights, shards and indexes). The caller knows what a model folder is made of;
publishing a folder does not."""


def check_folder_target(target: Path, *, overwrite: bool, protect: Iterable[Protected] = (),
                        outputs: Iterable[str | os.PathLike[str]] = (), names: Iterable[str] | None = None,
                        owned: Owned | None = None) -> None:
    """Refuse a target that is a file, an existing folder without overwrite, the current folder (or one
    holding it), or a folder holding files that are not a model's (`foreign_entries`; `names`: the
    relative paths the new folder will hold, None when not known yet: then a folder without any
    model file is refused); and one holding a file being read or another output (`check_folder_distinct`)."""
    check_folder_distinct(target, protect, outputs)
    if os.path.lexists(target) and (target.is_symlink() or not target.is_dir()):
        raise OutputError("the target exists and is not a folder (a sharded output is a folder)", file=str(target))
    if not target.is_dir():
        return
    if not overwrite:
        raise TargetExistsError("already exists; to replace it pass --overwrite (or set target.overwrite: true in "
                                "the recipe)", file=str(target))
    with contextlib.suppress(OSError):  # a current folder that was deleted holds nothing of the target
        if _inside(os.getcwd(), target):
            raise OutputError("refusing to replace the current folder (or a folder holding it): the folder is "
                              "published whole, which would leave you in a deleted folder; write to a new "
                              "folder, or run from outside it", file=str(target))
    if names is not None:
        check_no_foreign(target, names, owned)
        return
    try:
        listed = os.listdir(target)
    except OSError as e:
        raise OutputError(f"cannot list the existing target folder: {_describe(e)}", file=str(target)) from e
    if listed and not any(MODEL_FILE_RE.match(n) for n in listed):
        raise OutputError("refusing to replace a folder that holds no model files (weights or an index); "
                          "remove it yourself or choose another target", file=str(target))


MAX_FOREIGN_SHOWN = 8


def check_no_foreign(target: Path, names: Iterable[str], owned: Owned | None = None) -> None:
    """Refuse to replace the folder `target` when it holds anything `foreign_entries` finds."""
    foreign = foreign_entries(target, names, owned)
    if foreign:
        shown = ", ".join(foreign[:MAX_FOREIGN_SHOWN])
        more = f" and {len(foreign) - MAX_FOREIGN_SHOWN} more" if len(foreign) > MAX_FOREIGN_SHOWN else ""
        raise OutputError(f"refusing to replace the folder: it holds files that are not part of a model folder "
                          f"({shown}{more}); --overwrite replaces a model's weights, its index and the companion "
                          "files asked for, and never deletes other files: move them out or choose another target",
                          file=str(target))


def foreign_entries(target: Path, names: Iterable[str], owned: Owned | None = None) -> list[str]:
    """What the existing folder `target` holds beyond a model folder's parts: the weights at its top
    (`owned`: `files.sharded.model_parts`) and the files the new folder holds (`names`, relative
    paths, and the folders leading to them). These are the user's files, which publishing the new
    folder in its place would delete. Sorted; a subfolder holding nothing allowed is one entry, `name/`."""
    allowed = {os.path.normpath(n) for n in names}
    needed: set[str] = set()  # the folders leading to a new file
    for n in allowed:
        while n := os.path.dirname(n):
            needed.add(n)
    try:
        top = os.listdir(target)
    except OSError as e:
        raise OutputError(f"cannot list the existing target folder: {_describe(e)}", file=str(target)) from e
    parts = set(owned(target)) if owned is not None else set()
    foreign: list[str] = []
    pending = [""]
    seen = 0
    while pending:
        rel_dir = pending.pop()
        try:
            entries = os.listdir(target / rel_dir) if rel_dir else top
        except OSError as e:
            raise OutputError(f"cannot list the existing target folder: {_describe(e)}", file=str(target)) from e
        for name in entries:
            seen += 1
            if seen > MAX_CHECKED_FILES:
                raise OutputError(f"the existing target folder holds over {MAX_CHECKED_FILES} files; refusing to "
                                  "replace it", file=str(target))
            rel = os.path.join(rel_dir, name)
            try:
                is_dir = stat.S_ISDIR(os.lstat(target / rel).st_mode)
            except OSError:
                continue  # gone meanwhile
            if is_dir and rel in needed:
                pending.append(rel)
            elif is_dir:
                foreign.append(rel + "/")
            elif rel not in allowed and (rel_dir or name not in parts):
                foreign.append(rel)
    return sorted(foreign)


def _names_in(folder: Path) -> list[str]:
    """Relative paths of the files under `folder` (the scratch folder: what the new folder holds)."""
    return [os.path.relpath(os.path.join(d, f), folder) for d, _, files in os.walk(folder) for f in files]


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

    def __init__(self, path: Path, target: Path, fsync: bool, *, overwrite: bool = False,
                 mode_from: Iterable[str | os.PathLike[str] | int] = ()) -> None:
        self.path, self.target, self.fsync = path, target, fsync
        self.overwrite, self.mode_from = overwrite, list(mode_from)
        self.written: list[Path] = []  # flushed together by `sync`, before the publish

    def _mode(self, name: str, mode_from: Iterable[str | os.PathLike[str] | int]) -> int:
        """As `atomic.output_mode`: the replaced file's bits (same name in the old folder), else the
        sources' shared read/write bits, masked by the umask."""
        return output_mode(self.target / name, overwrite=self.overwrite, mode_from=mode_from)

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
            os.fchmod(fd, self._mode(name, self.mode_from))
            if expected_size:
                reserve(fd, expected_size, self.target / name)
            sink = io.BufferedWriter(f, buffer_size=WRITE_BUFFER)
            yield sink
            sink.flush()
            written = f.tell()
            if expected_size is not None and written != expected_size:
                raise OutputError(f"wrote {written} bytes, planned {expected_size}", file=str(self.target / name))
            os.ftruncate(fd, written)
        self.written.append(path)

    def copy(self, src: Path, name: str, storage: StorageOptions | None = None) -> None:
        """A companion file, byte for byte: a local one copied by the kernel (and given its
        permission bits, as `cp` does), an object on a store streamed in (with its options from
        `storage`)."""
        from .remote import is_url

        path = self.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if is_url(src):
            from .remote.fs import copy_companion
            with open(path, "xb") as sink:
                copy_companion(src, sink, storage=storage)
            os.chmod(path, self._mode(name, []))
        else:
            shutil.copyfile(src, path)
            os.chmod(path, self._mode(name, [src]))
        self.written.append(path)


@contextlib.contextmanager
def atomic_folder(target: str | os.PathLike[str], *, overwrite: bool = False, fsync: bool = True,
                  protect: Iterable[Protected] = (), outputs: Iterable[str | os.PathLike[str]] = (),
                  mode_from: Iterable[str | os.PathLike[str] | int] = (),
                  names: Iterable[str] | None = None, owned: Owned | None = None) -> Iterator[FolderScratch]:
    """Yield a scratch folder to write the whole output into; publish it as `target` on success.
    `protect`, `outputs`, `mode_from`: see the module docstring; `names`: the files the new folder
    will hold, when known up front (an old folder holding anything else is refused before writing;
    it is checked against what the scratch folder holds right before the publish in any case)."""
    target = Path(os.path.normpath(os.path.abspath(target)))
    protect, outputs = list(protect), list(outputs)
    names = None if names is None else list(names)
    check_folder_target(target, overwrite=overwrite, protect=protect, outputs=outputs, names=names, owned=owned)
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
        folder = FolderScratch(scratch, target, fsync, overwrite=overwrite, mode_from=mode_from)
        yield folder
        if fsync:
            folder.sync()
        check_folder_distinct(target, protect, outputs)  # again: a link to a source may have appeared meanwhile
        if overwrite and target.is_dir() and not target.is_symlink():  # again: a file may have been added meanwhile
            check_no_foreign(target, [*(names or ()), *_names_in(scratch)], owned)
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
