"""The cast pool: sized from the CPUs this process may use, overridable, results in order."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from migrator.core import casts

AFFINITY = """
import os, sys
from migrator.core import casts
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # this process may now run on one CPU only
os.environ.pop("MIGRATOR_CAST_WORKERS", None)
print(casts.available_cpus(), casts.default_workers(), os.cpu_count())
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity to set on this platform")
def test_available_cpus_follows_the_affinity_mask_not_the_machine() -> None:
    """Pinned to one CPU (as `taskset -c 0` or a container's cpuset would), the process counts one, however
    many the machine has: the pool is sized from what it may use. In a child process, so this one keeps
    its mask."""
    out = subprocess.run([sys.executable, "-c", AFFINITY], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    cpus, workers, machine = map(int, out.stdout.split())
    assert (cpus, workers) == (1, 2), out.stdout  # 2: one piece computed while the previous one is written
    assert machine >= cpus


def test_default_workers_from_the_cpus_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MIGRATOR_CAST_WORKERS", raising=False)
    monkeypatch.setattr(casts, "available_cpus", lambda: 1)
    assert casts.default_workers() == 2  # one piece computed while the previous one is written
    monkeypatch.setattr(casts, "available_cpus", lambda: 64)
    assert casts.default_workers() == casts.MAX_DEFAULT_WORKERS
    monkeypatch.setattr(casts, "available_cpus", lambda: 3)
    assert casts.default_workers() == 3
    monkeypatch.setenv("MIGRATOR_CAST_WORKERS", "5")
    assert casts.default_workers() == 5
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv("MIGRATOR_CAST_WORKERS", bad)
        with pytest.raises(ValueError, match="MIGRATOR_CAST_WORKERS"):
            casts.default_workers()


@pytest.mark.parametrize("workers", [1, 3])
def test_pipelined_keeps_order_on_that_many_threads(workers: int) -> None:
    names: set[str] = set()

    def square(x: int) -> int:
        names.add(threading.current_thread().name)
        return x * x

    assert list(casts.pipelined(square, range(200), workers=workers)) == [x * x for x in range(200)]
    assert all(n.startswith("migrator-cast") for n in names)
    assert len(names) <= workers
    with pytest.raises(ValueError, match="workers"):
        list(casts.pipelined(square, range(3), workers=0))
