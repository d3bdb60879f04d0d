"""Files that belong together (a model and Burn's optimizer record), written whole, then published in order.

POSIX renames one path at a time, so two files cannot change in one step. What this gives instead:

- every file is written whole into its own scratch file (`atomic.atomic_output`'s: created 0600,
  reserved, size-checked, fsynced) before any is renamed, and every check a publish makes (an
  existing target without overwrite, a file being read, another output) is made for all of them
  first: an error in any publishes none;
- the files are then renamed in the order given, the last one being the commit point (the model):
  a failure of a later rename puts back what the earlier ones replaced (their old files were kept
  by a hard link, `aside`), so an error still publishes none;
- a kill between two renames (no code runs then) leaves the earlier files new and the later ones
  old. The writer's caller makes that state detectable: a pair carries one stamp in both files and
  ids that no pair it replaces carries (`plan.burn_pair`), so a reader tells the halves apart and
  Burn applies none of a record to a model it was not written with.

Crash points (`core.crashpoints`), in order: `scratch-created` (every scratch file exists),
`tensor:N`, `written` (every byte of every file in its scratch file), `synced`, `published:K` (the
first K files renamed into place, the rest not yet), `published` (all of them), `done`.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from ..core import crashpoints
from ..core.errors import OutputError, TargetExistsError
from .atomic import (
    WRITE_BUFFER,
    Protected,
    ScratchFile,
    UnsyncedScratchFile,
    _describe,
    _folder,
    _fsync_dir,
    _make_folders,
    _publish,
    _remove_folders,
    check_distinct,
    check_target,
    clean_stale_scratch,
    create_scratch,
    output_mode,
    reserve,
    scratch_name,
)

_aside_counter = itertools.count(1 << 20)  # apart from atomic's scratch counter: never the same name


@contextlib.contextmanager
def atomic_outputs(targets: Sequence[str | os.PathLike[str]], *, overwrite: bool = False,
                   protect: Iterable[Protected] = (), outputs: Iterable[str | os.PathLike[str]] = (),
                   expected_sizes: Sequence[int | None] | None = None, fsync: bool = True,
                   mode_from: Iterable[str | os.PathLike[str] | int] = (),
                   make_folders: bool = False) -> Iterator[list[BinaryIO]]:
    """Yield one buffered sink per target; publish them all, in order, when the block ends without an
    error (see the module docstring). `protect`, `outputs`, `mode_from`, `make_folders`: as
    `atomic.atomic_output`; no target may be another of `targets` either."""
    paths = [Path(t) for t in targets]
    protect, outputs, mode_from = list(protect), list(outputs), list(mode_from)
    sizes = list(expected_sizes) if expected_sizes is not None else [None] * len(paths)
    others = [[*outputs, *(q for j, q in enumerate(paths) if j != i)] for i in range(len(paths))]
    for path, also in zip(paths, others, strict=True):
        check_target(path, overwrite=overwrite, protect=protect, outputs=also)
    created: list[Path] = []
    scratches: list[tuple[Path, int]] = []
    published = 0
    asides: list[tuple[Path | None, bool]] = []  # per file renamed: its old file's link, whether it had one
    try:
        for path in paths:
            folder = _folder(path)
            if make_folders:
                created += _make_folders(folder, path)
            elif not folder.is_dir():
                raise OutputError(f"folder {folder} does not exist", file=str(path))
            clean_stale_scratch(path)
        for path in paths:
            scratches.append(create_scratch(path, created if make_folders else None))
        crashpoints.reached("scratch-created")
        with contextlib.ExitStack() as files:
            raws = [files.enter_context((ScratchFile if fsync else UnsyncedScratchFile)(fd, "wb", closefd=True))
                    for _, fd in scratches]
            for raw, (scratch, _), size, path in zip(raws, scratches, sizes, paths, strict=True):
                raw.scratch_path = scratch
                if size:
                    reserve(raw.fileno(), size, path)
            sinks = [io.BufferedWriter(raw, buffer_size=WRITE_BUFFER) for raw in raws]
            yield list(sinks)
            for sink in sinks:
                sink.flush()
            crashpoints.reached("written")
            for raw, size, path, also in zip(raws, sizes, paths, others, strict=True):
                written = raw.tell()
                if size is not None and written != size:
                    raise OutputError(f"wrote {written} bytes, planned {size}", file=str(path))
                os.ftruncate(raw.fileno(), written)
                check_distinct(path, protect, also)  # again: a link to a source may have appeared meanwhile
                os.fchmod(raw.fileno(), output_mode(path, overwrite=overwrite, mode_from=mode_from))
                if fsync:
                    os.fsync(raw.fileno())
        crashpoints.reached("synced")
        if not overwrite:  # no-clobber: refused before the first rename, not between two
            for path in paths:
                if os.path.lexists(path):
                    raise TargetExistsError("appeared while writing; not replaced", file=str(path))
        for i, ((scratch, _), path) in enumerate(zip(scratches, paths, strict=True)):
            asides.append((_keep_aside(path) if i < len(paths) - 1 else None, os.path.lexists(path)))
            _publish(scratch, path, overwrite=overwrite)
            published += 1
            if published < len(paths):
                crashpoints.reached(f"published:{published}")
        crashpoints.reached("published")
    except OSError as e:
        raise OutputError(_describe(e), file=str(paths[min(published, len(paths) - 1)])) from e
    finally:
        if published < len(paths):
            _undo(paths[:published], asides)
            for scratch, _ in scratches:
                with contextlib.suppress(OSError):
                    scratch.unlink()
            _remove_folders(created)
        for aside, _ in asides:
            if aside is not None:
                with contextlib.suppress(OSError):
                    aside.unlink()
    if fsync:
        for folder in dict.fromkeys(_folder(p) for p in paths):
            _fsync_dir(folder, paths[-1])
    crashpoints.reached("done")


def _keep_aside(path: Path) -> Path | None:
    """A hard link to the file `path` holds before it is replaced (None: there is none, or this
    filesystem has no hard links), so a failed later rename can put it back. Named as a scratch file
    of `path`: a run killed meanwhile leaves it for the next run to remove."""
    if not os.path.isfile(path) or os.path.islink(path):
        return None
    aside = scratch_name(path, os.getpid(), next(_aside_counter))
    try:
        os.link(path, aside)
    except OSError:
        return None
    return aside


def _undo(published: Sequence[Path], asides: Sequence[tuple[Path | None, bool]]) -> None:
    """Put back what the renames before a failed one replaced: the old file (from its aside link),
    or no file where there was none. (An old symlink, or a file on a filesystem without hard links,
    cannot be put back: the new file stays, its stamp telling it apart.)"""
    for path, (aside, existed) in zip(published, asides, strict=False):
        with contextlib.suppress(OSError):
            if aside is not None:
                os.replace(aside, path)
            elif not existed:
                os.unlink(path)
