"""Run a plan: stream every tensor into the target writer, atomically, with progress on a terminal."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from .atomic import check_target
from .errors import MigratorError
from .formats import save_planned

if TYPE_CHECKING:
    from .plan import Plan


class MigrationError(MigratorError):
    """The plan has errors (missing tensors, shape mismatches, adapter failures): nothing was written."""


@dataclass
class RunResult:
    target: str
    tensors: int
    nbytes: int


def run_plan(plan: Plan, *, progress: bool | None = None) -> RunResult:
    """Write the plan's output; refuses (writing nothing) when the plan has fatal problems."""
    if plan.fatal or plan.writer is None:
        raise MigrationError("migration not written:\n  " + "\n  ".join(plan.fatal), file=str(plan.target_path))
    tensors = plan.writer.tensors
    written = save_planned(plan.writer, plan.target_path, overwrite=plan.overwrite, protect=_read_by(plan),
                           progress=progress_for(progress), fsync=plan.fsync)
    return RunResult(written, len(tensors), sum(t.nbytes for t in tensors))


def check_plan_target(plan: Plan) -> None:
    """Refuse up front what the write would refuse about its target (it exists and overwrite is off,
    it is a folder, it is a file the plan reads), so `migrate run` says so before its report."""
    if getattr(plan.writer, "sharded", False):
        from .atomic_folder import check_folder_target

        check_folder_target(plan.target_path, overwrite=plan.overwrite)
    elif plan.writer is not None:
        check_target(Path(plan.writer.resolve_path(plan.target_path)), overwrite=plan.overwrite,
                     protect=_read_by(plan))


def _read_by(plan: Plan) -> list[Path]:
    """The files the plan reads: the write must not replace them."""
    return [plan.source_path] + ([plan.template_path] if plan.template_path else [])


def progress_for(progress: bool | None) -> Callable[[BinaryIO, int], AbstractContextManager[None]] | None:
    """The progress bar when asked for (None: when stderr is a terminal), else nothing."""
    show = sys.stderr.isatty() if progress is None else progress
    return progress_bar if show else None


@contextlib.contextmanager
def progress_bar(sink: BinaryIO, total: int) -> Iterator[None]:
    """Poll the output's file offset from a thread: works for in-kernel copies too, costs nothing."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    fd = sink.fileno()
    stop = threading.Event()
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), transient=True, console=None) as bar:
        task = bar.add_task("writing", total=total)

        def poll() -> None:
            while not stop.wait(0.1):
                with contextlib.suppress(OSError):
                    bar.update(task, completed=os.lseek(fd, 0, os.SEEK_CUR))

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            bar.update(task, completed=total)
