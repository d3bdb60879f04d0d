"""`--executor ray`: jobs and write tasks as Ray tasks (`pip install 'migrator[ray]'`).

Ray is imported only here, and only when asked for. Paths must be on storage every node sees (a
shared file system here): workers read the sources and write into the driver's scratch file or
folder themselves.

- Many jobs: each job is one task running the whole `migrate run` of its recipe (plan, write,
  atomic publish) on a worker; jobs are independent, so each publishes its own output.
- One job split into write tasks (`RayRunner`): the driver plans, reserves the scratch file (or
  creates the scratch folder) and writes the header (or index); each task re-plans the job from its
  recipe (headers only), checks the plan agrees with the driver's, and writes its byte range (or
  shard). The driver publishes once, when every task succeeded; on the first failure it cancels the
  rest, waits for the running ones to end, and the scratch is removed: nothing is published.

A task whose worker process dies (killed, out of memory) is retried by Ray (`max_retries`, 3 by
default): a range or shard written again gives the same bytes. An exception in a task is not
retried: it is the run's error, naming the task.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import MigratorError
from .parallel_write import (
    RangeTask,
    ShardTask,
    TaskError,
    describe_failure,
    fault_from_env,
    inject_fault,
    task_from_json,
    task_json,
    write_range,
    write_shard,
)

if TYPE_CHECKING:
    from ..files.sharded_writer import ShardedWriter
    from ..formats.base import Writer
    from ..plan.build import Plan
    from ..storage.atomic_folder import FolderScratch

TASK_RETRIES = 3
CONNECT_TIMEOUT = 5.0
"""Seconds to wait for a TCP answer at a `host:port` Ray address before giving up on it."""


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a `host:port`, `[v6]:port` or `ray://host:port` address; None for `auto`,
    `local` and anything else Ray resolves itself."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or not host or "/" in rest:
        return None
    return host.strip("[]"), int(port)


def check_reachable(address: str, node_ip: Callable[[], str]) -> None:
    """Refuse a `host:port` address where nothing accepts a connection within CONNECT_TIMEOUT.

    Without this, `ray.init` keeps retrying a wrong address for minutes, printing warnings. Ray
    connects to a loopback host through this node's address (`node_ip`), so both are tried: the
    address is refused only when neither answers."""
    parsed = _host_port(address)
    if parsed is None:
        return
    host, port = parsed
    hosts = [host]
    with contextlib.suppress(OSError):
        if ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
            hosts.append(node_ip())
    why = ""
    for h in hosts:
        try:
            socket.create_connection((h, port), timeout=CONNECT_TIMEOUT).close()
            return
        except OSError as e:
            why = e.strerror or type(e).__name__
    raise MigratorError(f"cannot join Ray at {address}: nothing answers there ({why}); start a head there "
                        "(`ray start --head`), or give --ray-address auto to find a local one")


def ray_module(address: str | None = None) -> Any:
    """Ray, connected: to `address` (or $RAY_ADDRESS), else to the instance this process already
    started, else a new local one."""
    try:
        import ray
    except ImportError:
        raise MigratorError("--executor ray needs Ray: pip install 'migrator[ray]'") from None
    if not ray.is_initialized():
        where = address or os.environ.get("RAY_ADDRESS") or None
        if where:
            check_reachable(where, ray.util.get_node_ip_address)
        try:
            ray.init(address=where, include_dashboard=False, log_to_driver=False, configure_logging=False)
        except Exception as e:  # no cluster there, a version mismatch...: the user's setting, said plainly
            raise MigratorError(f"cannot start or join Ray{f' at {where}' if where else ''}: {e}") from None
    return ray


def _cause(e: BaseException) -> BaseException:
    """The exception a task raised, out of Ray's wrapper (RayTaskError keeps it as `cause`)."""
    return getattr(e, "cause", None) or e


def _write_task(job: dict[str, Any], task: dict[str, Any], scratch: str, fault: dict[str, Any] | None) -> int:
    return run_remote_task(job, task, scratch, fault)


class RayRunner:
    """`parallel_write.Runner` on Ray: one task per byte range or shard, re-planned on the worker."""

    def __init__(self, job: dict[str, Any], workers: int | None, address: str | None) -> None:
        self.ray = ray_module(address)
        self.job = job  # the recipe, its `RunOptions` (executor local: no tasks inside tasks) and the engine
        self.workers = workers or max(1, int(self.ray.cluster_resources().get("CPU", 1)))
        self.fault = fault_from_env()

    def _run(self, tasks: Sequence[RangeTask | ShardTask], scratch: Path) -> None:
        ray = self.ray
        remote = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(_write_task)
        refs = {remote.remote(self.job, task_json(t), str(scratch), self.fault): t for t in tasks}
        pending = list(refs)
        failure: BaseException | None = None
        try:
            while pending and failure is None:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    try:
                        ray.get(ref)
                    except Exception as e:
                        failure = TaskError(describe_failure(refs[ref], _cause(e)))
                        failure.__cause__ = e
                        break
        except BaseException as e:  # Ctrl-C in the driver: stop every task before the scratch goes
            failure = failure or e
        if failure is not None:
            for ref in pending:
                ray.cancel(ref)
            for ref in pending:  # a task still writing must end before the scratch is removed
                try:
                    ray.get(ref)
                except Exception:  # cancelled or failed: its error is not the first
                    continue
            raise failure

    def write_ranges(self, scratch: Path, fd: int, writer: Writer, tasks: Sequence[RangeTask],
                     start_writeback: bool) -> None:
        self._run(tasks, scratch)

    def write_shards(self, folder: FolderScratch, writer: ShardedWriter, tasks: Sequence[ShardTask]) -> None:
        self._run(tasks, folder.path)
        folder.written += [folder.path / t.name for t in tasks]


def run_remote_task(job: dict[str, Any], task_doc: dict[str, Any], scratch: str,
                    fault: dict[str, Any] | None) -> int:
    """A write task in another process (a Ray worker): re-plan the job from its recipe (headers
    only: the job's `engine`, `recipe.run_recipe`, with `use=`), check the plan agrees with the
    driver's, write the task's bytes into the driver's scratch file or folder; returns the bytes
    written. The driver publishes; this never does."""
    from dataclasses import replace

    task = task_from_json(task_doc)
    shard = isinstance(task, ShardTask)
    mid_task = fault is not None and fault.get("kind") == "kill" and not shard
    if not mid_task:
        inject_fault(fault, task.index)  # a range task's kill comes after its first tensor is written
    options = job["options"]
    # the range tasks never write the header, the only bytes the sources' hashes go into
    outcome = job["engine"](job["recipe"], replace(options, hash_sources=options.hash_sources and shard),
                            use=lambda plan: _write_part(plan, task, scratch, fault if mid_task else None))
    if outcome.error is not None:
        raise outcome.error
    return int(outcome.value)


def _write_part(plan: Plan, task: RangeTask | ShardTask, scratch: str, fault: dict[str, Any] | None) -> int:
    """One task's byte range (or shard) of the re-planned job, into the driver's scratch."""
    from ..storage.atomic_folder import FolderScratch

    writer = plan.writer
    if writer is None:
        raise TaskError("the plan has errors here, none on the driver: did a source change meanwhile?\n  "
                        + "\n  ".join(plan.fatal), file=str(plan.target_path))
    if isinstance(task, ShardTask):
        folder = FolderScratch(Path(scratch), Path(plan.target_path), plan.fsync, overwrite=plan.overwrite,
                               mode_from=plan.source_modes())
        path = write_shard(folder, writer, task)  # type: ignore[arg-type]
        return os.path.getsize(path)
    prefix, tensors, offsets = writer.layout()
    if task.hi > len(tensors) or (offsets[task.hi - 1] + tensors[task.hi - 1].nbytes != task.end) or (
            (offsets[task.lo - 1] + tensors[task.lo - 1].nbytes if task.lo else len(prefix)) != task.start):
        raise TaskError(f"write task {task.index}: the tensors are planned at other offsets here than on the "
                        "driver: did a source change meanwhile?", file=str(plan.target_path))
    fd = os.open(scratch, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
    try:
        write_range(fd, tensors, offsets, task, start_writeback=plan.fsync,
                    after_first=(lambda: inject_fault(fault, task.index)) if fault is not None else None)
    finally:
        os.close(fd)  # on a network file system, close sends the pages to the server
    return task.end - task.start
