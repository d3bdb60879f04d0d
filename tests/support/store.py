"""What the object-store tests share: the CLI in this process, a small model and its comparison, and a
tensor whose bytes fail part-way (interrupted uploads)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import numpy as np

from migrator.core import dtypes
from migrator.core.tensor import LazyTensor
from tests.support.cli import migrate_in_process


class Boom(Exception):
    """The injected failure."""


def failing_tensor(after: int, exc: type[BaseException] = Boom) -> LazyTensor:
    """A 12 MiB tensor whose bytes stop with `exc` after `after` bytes, sent in 1 MiB pieces: by then
    an upload has parts (or buffered blocks) in flight."""
    n = 12 << 20

    def chunks() -> Iterator[memoryview]:
        sent = 0
        while sent < after:
            yield memoryview(bytes(1 << 20))
            sent += 1 << 20
        raise exc("injected") if exc is Boom else exc()

    return LazyTensor("w", dtypes.BY_NAME["U8"], (n,), n, loader=lambda: bytes(n), chunks=chunks)


def cli(*args: str, check: int | None = 0) -> subprocess.CompletedProcess[str]:
    """`migrate ARGS` in this process (a new process per call would import the store's package again:
    seconds per test), its exit code checked against `check` unless None."""
    p = migrate_in_process(*args)
    if check is not None:
        assert p.returncode == check, p.stdout + p.stderr
    return p


def model(seed: int = 0, big: int = 1536) -> dict[str, np.ndarray]:
    """Three tensors; the first is 6 MiB (with `big` 1536): several read blocks, several upload parts."""
    rng = np.random.default_rng(seed)
    return {"encoder.weight": rng.standard_normal((big, 1024), dtype=np.float32),
            "encoder.bias": rng.standard_normal(1024, dtype=np.float32),
            "steps": np.arange(7, dtype=np.int64)}


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert np.array_equal(got[k], want[k]), k
