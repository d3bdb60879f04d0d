"""The CPUs this process may use: what sizes the cast pool, the GGUF quantizer's pool and the
default number of parallel jobs (`migrate run --jobs`)."""

from __future__ import annotations

import os


def available_cpus() -> int:
    """The CPUs this process may run on, at least 1: Python's own count where it has one (3.13+:
    the affinity mask, or `-X cpu_count` / PYTHON_CPU_COUNT when the user set it), else the
    affinity mask (as `nproc` counts), else the machine's count. Never the machine's count where
    a mask is known: a container or `taskset` can make it far larger than what is usable."""
    counter = getattr(os, "process_cpu_count", None)  # Python 3.13+
    if counter is not None:
        n = counter()
    else:
        try:
            n = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not on Linux
            n = os.cpu_count()
    return max(1, n or 1)
