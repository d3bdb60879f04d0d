"""Run a plan: stream every tensor into the target writer, atomically, with progress on a terminal."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, BinaryIO

from ..core.errors import MigratorError, not_written
from ..files.io import save_planned, writer_class
from ..files.targets import check_target, target_problems
from ..files.write_options import WriteOptions
from ..formats.base import WriterKind
from ..plan.outputs import plan_outputs
from ..storage.atomic import Protected
from ..storage.remote import as_path, is_url

if TYPE_CHECKING:
    from ..plan.build import Plan
    from .parallel_write import Runner


class MigrationError(MigratorError):
    """The plan has errors (missing tensors, shape mismatches, adapter failures): nothing was written."""


@dataclass
class RunResult:
    target: str
    tensors: int
    nbytes: int
    record: str | None = None  # Burn's optimizer record, published with the model


def run_plan(plan: Plan, *, progress: bool | None = None,
             outputs: Iterable[str | os.PathLike[str]] = (), runner: Runner | None = None) -> RunResult:
    """Write the plan's output; refuses (writing nothing) when the plan has fatal problems.

    `outputs` are the run's other outputs (a `--report` file): the target may not be one of them.
    A missing target folder is created. With a `runner` (`migrator.run.parallel_write`), its workers write
    the tensors or shards (a PyTorch single file, whose zip has no precomputed layout, is written here).
    """
    if plan.fatal or plan.writer is None:
        raise MigrationError(not_written(plan.fatal), file=str(plan.target_path))
    tensors = plan.writer.tensors
    if plan.record is not None and plan.record_path is not None:  # a model and Burn's optimizer record
        from ..files.io import save_planned_together

        if is_url(plan.target_path) or is_url(plan.record_path):
            raise MigrationError("a model with Burn's optimizer record is written to local files only",
                                 file=str(plan.target_path))
        # Burn's LR scheduler record (when the checkpoint has one Burn has), the optimizer record, then the
        # model, the commit point: published as one
        parts = [*([(plan.scheduler, plan.scheduler_path)] if plan.scheduler is not None
                   and plan.scheduler_path is not None else []),
                 (plan.record, plan.record_path), (plan.writer, plan.target_path)]
        written = save_planned_together(parts, overwrite=plan.overwrite, protect=read_by(plan), outputs=outputs,
                                        fsync=plan.fsync, mode_from=plan.source_modes(), make_folders=True)
        return RunResult(written, len(tensors), sum(t.nbytes for t in tensors),
                         plan.record.resolve_path(plan.record_path))
    write = WriteOptions(overwrite=plan.overwrite, protect=read_by(plan), outputs=tuple(outputs), fsync=plan.fsync,
                         mode_from=plan.source_modes(), make_folders=True, storage=plan.storage)
    if runner is not None and not is_url(plan.target_path):  # an upload is parallel in its parts already
        from .parallel_write import save_file_parallel, save_folder_parallel

        if plan.writer.kind is WriterKind.FOLDER:
            written = save_folder_parallel(plan.writer, plan.target_path, runner, write)  # type: ignore[arg-type]
            return RunResult(written, len(tensors), sum(t.nbytes for t in tensors))
        if plan.writer.kind is WriterKind.LAID_OUT:
            written = save_file_parallel(plan.writer, plan.target_path, runner, write)
            return RunResult(written, len(tensors), sum(t.nbytes for t in tensors))
    written = save_planned(plan.writer, plan.target_path, replace(write, progress=progress_for(progress)))
    return RunResult(written, len(tensors), sum(t.nbytes for t in tensors))


def check_plan_target(plan: Plan, outputs: Iterable[str | os.PathLike[str]] = ()) -> None:
    """Refuse up front what the writes would refuse about the plan's outputs (`plan.outputs.plan_outputs`:
    the target, Burn's optimizer record): one exists and overwrite is off, one is a folder or a special
    file, a file the plan reads, another of its outputs or of the run's (`outputs`: a `--report`), so
    `migrate run` says so before anything is written."""
    if plan.writer is not None and plan.writer.kind is WriterKind.FOLDER:
        from ..files.targets import check_folder_target

        check_folder_target(plan.target_path, overwrite=plan.overwrite, protect=read_by(plan), outputs=outputs,
                            names=plan.writer.names(), storage=plan.storage)  # type: ignore[attr-defined]
    elif plan.writer is not None:
        files = [as_path(o.path) for o in plan_outputs(plan)]
        for i, path in enumerate(files):
            check_target(path, overwrite=plan.overwrite, protect=read_by(plan),
                         outputs=[*outputs, *files[:i], *files[i + 1:]], storage=plan.storage)


def plan_target_problems(plan: Plan) -> list[str]:
    """What a run of `plan` would refuse about its outputs, as messages (for `validate`, `plan`)."""
    # a folder of shards: the folder publish's own checks
    if plan.writer is not None and plan.writer.kind is WriterKind.FOLDER:
        from ..files.targets import check_folder_target

        try:
            check_folder_target(plan.target_path, overwrite=plan.overwrite, protect=read_by(plan),
                                names=plan.writer.names(), storage=plan.storage)  # type: ignore[attr-defined]
        except MigratorError as e:
            return [str(e)]
        return []
    if plan.writer is None:
        return target_problems(as_path(writer_class(plan.target_format).resolve_path(plan.target_path)),
                               overwrite=plan.overwrite, protect=read_by(plan), storage=plan.storage)
    problems: list[str] = []
    files = [as_path(o.path) for o in plan_outputs(plan)]
    for i, path in enumerate(files):
        if any(os.path.abspath(path) == os.path.abspath(other) for other in files[:i]):
            problems.append(f"{path}: the optimizer record and the model would be the same file")
        problems += target_problems(path, overwrite=plan.overwrite, protect=read_by(plan), storage=plan.storage)
    return problems


def read_by(plan: Plan) -> list[Protected]:
    """The files the plan reads, by path and by the inode each reader holds open: no output may
    replace them (a symlink or hard link to one included). Besides sources and template: the recipe
    and the model config it reads (`plan.read_also`), and the companion files copied."""
    files: list[Protected] = [plan.source_path, *(path for _, path in plan.inputs[1:]), *plan.read_also]
    if plan.template_path is not None:
        files.append(plan.template_path)
    if plan.writer is not None:
        files += [src for src in plan.writer.companion_sources if not is_url(src)]
    for r in plan.file_readers():
        files += [r.source.identity] if r.source.identity is not None else list(r.source.identities)
    return files


def progress_for(progress: bool | None) -> Callable[[BinaryIO, int], AbstractContextManager[None]] | None:
    """The progress bar when asked for (None: when stderr is a terminal), else nothing."""
    show = sys.stderr.isatty() if progress is None else progress
    return progress_bar if show else None


@contextlib.contextmanager
def progress_bar(sink: BinaryIO, total: int) -> Iterator[None]:
    """Poll the output's file offset from a thread: works for in-kernel copies too, costs nothing.
    An upload to an object store has no descriptor: its `tell()` (bytes handed to the upload) is
    polled instead. Sizes in IEC units (MiB), as everywhere in migrator; the label is literal text,
    never markup."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    try:
        fd = sink.fileno()

        def position() -> int:
            return os.lseek(fd, 0, os.SEEK_CUR)
    except OSError:  # io.UnsupportedOperation: an upload
        position = sink.tell
    stop = threading.Event()
    done, speed = progress_columns()
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), done, speed,
                  TimeRemainingColumn(), transient=True, console=None) as bar:
        task = bar.add_task("writing", total=total)

        def poll() -> None:
            while not stop.wait(0.1):
                with contextlib.suppress(OSError):
                    bar.update(task, completed=position())

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            bar.update(task, completed=total)


def progress_columns() -> tuple[Any, Any]:
    """Rich columns for bytes done/total and speed in IEC units (Rich's own are SI: MB)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    from ..core.display import human_bytes

    class Done(ProgressColumn):
        def render(self, task: Any) -> Text:
            return Text(f"{human_bytes(int(task.completed))}/{human_bytes(int(task.total or 0))}")

    class Speed(ProgressColumn):
        def render(self, task: Any) -> Text:
            rate = task.finished_speed or task.speed
            return Text("?" if rate is None else f"{human_bytes(int(rate))}/s")

    return Done(), Speed()
