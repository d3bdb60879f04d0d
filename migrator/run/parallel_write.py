"""One output written by several workers at once, published once.

A single file (burnpack, SafeTensors): its layout is known from the plan (`Writer.layout`: the
header bytes, every tensor's offset, zeros between), so the driver writes the header into the
reserved scratch file of `atomic_output`, cuts the tensors into contiguous runs of about equal bytes,
and each worker writes its run at its own offsets (`pwrite` and `copy_file_range` with explicit
offsets, on the one scratch file: no shared file position). A run starts where the previous tensor
ends and writes the zero gaps before each of its tensors, so the runs cover the file exactly once and
the bytes are `write_to`'s whatever the number of workers.

A folder of shards: each shard is a whole file, written by one worker into the scratch folder of
`atomic_folder`; the driver writes the index and companion files.

Either way the driver publishes (one rename) only after every task has succeeded; a failed task
makes the atomic context remove the scratch, so nothing is published and an existing target stays.
Workers are threads here (`LocalRunner`): the copies and casts release the GIL (numpy, the C
kernels, the syscalls), so processes would only add start-up (benchmarks/RESULTS.md has the A/B).
`migrator.run.ray_executor.RayRunner` runs the same tasks as Ray tasks that re-plan from the recipe.

Peak memory grows to one tensor (plus its read-ahead) per worker.
"""

from __future__ import annotations

import bisect
import io
import json
import os
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..core.errors import OutputError
from ..core.streaming import Ahead, write_tensor, write_zeros
from ..core.tensor import LazyTensor
from ..files.write_options import DEFAULT_WRITE, WriteOptions
from ..formats.base import WriterKind
from ..storage.atomic import WRITE_BUFFER, atomic_output

if TYPE_CHECKING:
    from ..files.sharded_writer import ShardedWriter
    from ..formats.base import Writer
    from ..storage.atomic_folder import FolderScratch

FAULT_ENV = "MIGRATOR_TEST_FAULT"
"""Test hook: a JSON object {"kind": "raise" | "kill", "task": N, "marker": PATH} makes task N raise
at its start, or kill its own process (SIGKILL; a remote range task does it after writing its first
tensor), while the marker file does not exist yet (it is created first, so a retry succeeds).
Read by the driver and shipped inside the tasks, never by a worker's environment."""


class TaskError(OutputError):
    """A write task failed: nothing was published."""


@dataclass(frozen=True)
class RangeTask:
    """Tensors [lo, hi) of a single-file layout, written from byte `start` (the end of the tensor
    before `lo`, or of the header) to byte `end` (the end of tensor hi-1)."""

    index: int
    lo: int
    hi: int
    start: int
    end: int


@dataclass(frozen=True)
class ShardTask:
    """Shard `shard` of a sharded writer: file `name` of `size` bytes in the scratch folder."""

    index: int
    shard: int
    name: str
    size: int


class Runner(Protocol):
    """Runs write tasks; returns when all succeeded, raises TaskError (the first failure) otherwise."""

    workers: int

    def write_ranges(self, scratch: Path, fd: int, writer: Writer, tasks: Sequence[RangeTask],
                     start_writeback: bool) -> None: ...

    def write_shards(self, folder: FolderScratch, writer: ShardedWriter, tasks: Sequence[ShardTask]) -> None: ...


class PwriteFile(io.RawIOBase):
    """A raw writable view of a file descriptor from `position` on, writing with pwrite: several of
    these share one descriptor without sharing a file position. Never closes the descriptor."""

    def __init__(self, fd: int, position: int, start_writeback: bool) -> None:
        super().__init__()
        self._fd, self._pos = fd, position
        self.start_writeback = start_writeback  # read by streaming._start_writeback

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            self._pos = offset
        elif whence == os.SEEK_CUR:
            self._pos += offset
        else:
            raise io.UnsupportedOperation("seek from the end")
        return self._pos

    def write(self, b: Any) -> int:
        n = os.pwrite(self._fd, b, self._pos)
        self._pos += n
        return n


def split_ranges(tensors: Sequence[LazyTensor], offsets: Sequence[int], header_end: int,
                 parts: int) -> list[RangeTask]:
    """Contiguous runs of tensors of about equal bytes (min(parts, tensors) of them, none empty),
    covering [header_end, end of the last tensor) exactly once. A tensor is never split: one much
    larger than the rest makes its run the longest."""
    n = len(tensors)
    if n == 0:
        return []
    ends = [off + t.nbytes for off, t in zip(offsets, tensors, strict=True)]
    done = [e - header_end for e in ends]  # bytes covered up to the end of each tensor
    total = done[-1]
    parts = max(1, min(parts, n))
    his: list[int] = []
    for k in range(1, parts):
        goal = -(-total * k // parts)  # run k ends at the first tensor reaching k/parts of the bytes
        hi = bisect.bisect_left(done, goal) + 1
        hi = min(max(hi, (his[-1] if his else 0) + 1), n - (parts - k))  # every run keeps a tensor
        his.append(hi)
    his.append(n)
    tasks: list[RangeTask] = []
    lo = 0
    for hi in his:
        start = ends[lo - 1] if lo else header_end
        tasks.append(RangeTask(len(tasks), lo, hi, start, ends[hi - 1]))
        lo = hi
    return tasks


def write_range(fd: int, tensors: Sequence[LazyTensor], offsets: Sequence[int], task: RangeTask, *,
                start_writeback: bool, cancel: threading.Event | None = None,
                after_first: Callable[[], None] | None = None) -> None:
    """Write one run (its zero gaps included) at its offsets of `fd`; exactly its bytes or an error.
    `after_first` is called once the first tensor's bytes are in the file (a test's fault point)."""
    raw = PwriteFile(fd, task.start, start_writeback)
    sink = io.BufferedWriter(raw, buffer_size=WRITE_BUFFER)
    pos = task.start
    with Ahead(tensors[task.lo : task.hi]) as ahead:
        for i in range(task.lo, task.hi):
            if cancel is not None and cancel.is_set():
                raise TaskError("stopped: another write task failed")
            t, off = tensors[i], offsets[i]
            write_zeros(sink, off - pos)
            write_tensor(sink, t, ahead)  # a BufferedWriter over a raw file
            pos = off + t.nbytes
            if after_first is not None and i == task.lo:
                sink.flush()
                after_first()
    sink.flush()
    if sink.tell() != task.end:
        raise OutputError(f"write task {task.index} ended at byte {sink.tell()}, planned {task.end}")


def write_shard(folder: FolderScratch, writer: ShardedWriter, task: ShardTask) -> Path:
    """Write one shard file whole into the scratch folder (created or truncated: a retried task
    writes it again); returns its path."""
    from ..storage.atomic import ScratchFile, UnsyncedScratchFile, reserve

    name, shard = writer.files[task.shard]
    if name != task.name or shard.total_size != task.size:
        raise TaskError(f"shard {task.shard} is planned as {name} ({shard.total_size} bytes), the driver planned "
                        f"{task.name} ({task.size} bytes): did a source change meanwhile?", file=str(folder.target))
    path = folder.path / name
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o666)
    with (ScratchFile if folder.fsync else UnsyncedScratchFile)(fd, "wb") as f:
        os.fchmod(fd, folder._mode(name, folder.mode_from))  # as FolderScratch.file sets it
        if task.size:
            reserve(fd, task.size, folder.target / name)
        sink = io.BufferedWriter(f, buffer_size=WRITE_BUFFER)
        shard.write_to(sink)
        sink.flush()
        if f.tell() != task.size:
            raise OutputError(f"wrote {f.tell()} bytes, planned {task.size}", file=str(folder.target / name))
        os.ftruncate(fd, task.size)
    return path


def fault_from_env() -> dict[str, Any] | None:
    text = os.environ.get(FAULT_ENV)
    return json.loads(text) if text else None


def inject_fault(fault: dict[str, Any] | None, index: int) -> None:
    """The test hook of FAULT_ENV, at the start of task `index`."""
    if not fault or fault.get("task") != index:
        return
    marker = fault.get("marker")
    if marker:
        try:
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            return  # already failed once: this is the retry
    if fault.get("kind") == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise TaskError(f"injected failure in write task {index}")


class LocalRunner:
    """Write tasks on threads of this process, the plan's own readers and writer shared."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self.fault = fault_from_env()

    def _run(self, jobs: Sequence[Any], fn: Any) -> list[Any]:
        cancel = threading.Event()
        with ThreadPoolExecutor(max_workers=min(self.workers, len(jobs)) or 1,
                                thread_name_prefix="migrator-write") as pool:
            futures = [pool.submit(fn, job, cancel) for job in jobs]
            try:
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                failed = [f for f in futures if f in done and f.exception() is not None]
                if failed:
                    cancel.set()
                    wait(futures)
                    exc = failed[0].exception()
                    assert exc is not None
                    raise exc
            except BaseException:
                cancel.set()  # Ctrl-C: the other tasks stop at their next tensor, then the scratch goes
                for f in futures:
                    f.cancel()
                raise
        return [f.result() for f in futures]

    def write_ranges(self, scratch: Path, fd: int, writer: Writer, tasks: Sequence[RangeTask],
                     start_writeback: bool) -> None:
        _, tensors, offsets = writer.layout()

        def one(task: RangeTask, cancel: threading.Event) -> None:
            inject_fault(self.fault, task.index)
            write_range(fd, tensors, offsets, task, start_writeback=start_writeback, cancel=cancel)

        self._run(tasks, one)

    def write_shards(self, folder: FolderScratch, writer: ShardedWriter, tasks: Sequence[ShardTask]) -> None:
        def one(task: ShardTask, cancel: threading.Event) -> Path:
            if cancel.is_set():
                raise TaskError("stopped: another write task failed")
            inject_fault(self.fault, task.index)
            return write_shard(folder, writer, task)

        folder.written += self._run(tasks, one)


def save_file_parallel(writer: Writer, path: str | os.PathLike[str], runner: Runner,
                       options: WriteOptions = DEFAULT_WRITE) -> str:
    """`files.io.save_planned` of a single-file writer with a `layout`, its tensors written by `runner`'s
    workers into the one reserved scratch file; published once, after every task succeeded. `options`:
    all but `progress` and `storage` (a local file, written by workers)."""
    from ..core.streaming import write_all
    from ..files.io import protected_files

    o = options
    out = writer.resolve_path(path)
    prefix, tensors, offsets = writer.layout()
    total = writer.total_size
    with atomic_output(out, overwrite=o.overwrite, protect=protected_files(o.protect), outputs=o.outputs,
                       expected_size=total, fsync=o.fsync, mode_from=o.mode_from,
                       make_folders=o.make_folders) as sink:
        write_all(sink, memoryview(prefix))
        sink.flush()
        raw = sink.raw  # type: ignore[attr-defined]
        tasks = split_ranges(tensors, offsets, len(prefix), runner.workers)
        if tasks:
            runner.write_ranges(Path(raw.scratch_path), raw.fileno(), writer, tasks, raw.start_writeback)
        sink.seek(total)  # the zeros after the last tensor (an empty burnpack's padding) are the reserved space
    return out


def save_folder_parallel(writer: ShardedWriter, path: str | os.PathLike[str], runner: Runner,
                         options: WriteOptions = DEFAULT_WRITE) -> str:
    """`sharded_writer.save_sharded` with the shards written by `runner`'s workers; the driver writes
    the index and the companion files, and publishes after every shard task succeeded. `options`: all
    but `progress`, `make_folders` and `storage`."""
    from ..files.io import protected_files
    from ..files.sharded import model_parts
    from ..files.sharded_writer import finish_folder
    from ..storage.atomic_folder import atomic_folder

    out = writer.resolve_path(path)
    o = options
    with atomic_folder(out, overwrite=o.overwrite, fsync=o.fsync, protect=protected_files(o.protect),
                       outputs=o.outputs, mode_from=o.mode_from, names=writer.names(), owned=model_parts) as folder:
        tasks = [ShardTask(i, i, name, shard.total_size) for i, (name, shard) in enumerate(writer.files)]
        runner.write_shards(folder, writer, tasks)
        finish_folder(folder, writer)
    return out


def can_split(writer: Writer | None) -> bool:
    """Whether `writer`'s output can be written by several workers (a layout, or shards)."""
    return writer is not None and writer.kind in (WriterKind.FOLDER, WriterKind.LAID_OUT)


def task_json(task: RangeTask | ShardTask) -> dict[str, Any]:
    return {"type": type(task).__name__, **asdict(task)}


def task_from_json(doc: dict[str, Any]) -> RangeTask | ShardTask:
    fields = {k: v for k, v in doc.items() if k != "type"}
    return RangeTask(**fields) if doc["type"] == "RangeTask" else ShardTask(**fields)


def describe_failure(task: RangeTask | ShardTask, error: BaseException | str) -> str:
    what = f"shard {task.name}" if isinstance(task, ShardTask) else f"tensors {task.lo}-{task.hi - 1}"
    return f"write task {task.index} ({what}) failed: {error}"


__all__ = ["FAULT_ENV", "LocalRunner", "PwriteFile", "RangeTask", "Runner", "ShardTask", "TaskError", "can_split",
           "save_file_parallel", "save_folder_parallel", "split_ranges", "write_range"]
