"""`core.cpus.available_cpus`: the one count of usable CPUs (the cast pool, the quantizer's pool,
`run --jobs`' default). The oracle is the affinity mask the test itself sets on a child process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this system")
def test_a_process_limited_to_one_cpu_counts_one() -> None:
    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
            "from migrator.core.cpus import available_cpus\n"
            "from migrator.core import casts\n"
            "from migrator.run.jobs import available_cpus as jobs_cpus\n"
            "print(available_cpus(), casts.available_cpus(), jobs_cpus())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1", "1"]  # os.cpu_count() would say the machine's count


def test_the_count_is_the_affinity_mask_here() -> None:
    from migrator.core.cpus import available_cpus

    if hasattr(os, "sched_getaffinity") and not hasattr(os, "process_cpu_count"):
        assert available_cpus() == len(os.sched_getaffinity(0))
    assert available_cpus() >= 1
