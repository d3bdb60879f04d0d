"""The cast pool: sized from the CPUs this process may use, overridable, results in order."""

from __future__ import annotations

import os
import threading

import pytest

from migrator.core import casts


def test_available_cpus_is_the_affinity_mask() -> None:
    if hasattr(os, "process_cpu_count"):
        assert casts.available_cpus() == os.process_cpu_count()
    elif hasattr(os, "sched_getaffinity"):
        assert casts.available_cpus() == len(os.sched_getaffinity(0))
    else:
        assert casts.available_cpus() == (os.cpu_count() or 1)


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
