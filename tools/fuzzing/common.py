"""What every part of the fuzzer shares: the readers it knows, its exceptions, the per-case alarm, the
tiny tensors the seeds are made of, and torch for the seeds that need it."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

import numpy as np

from migrator.core.tensor import from_numpy

from . import REPO

READERS = ("burnpack", "safetensors", "pytorch-zip", "pytorch-legacy", "pytorch-tar", "gguf", "megatron-legacy",
           "torch-dist", "recipe")
FORMAT_OF = {"burnpack": "burnpack", "safetensors": "safetensors", "pytorch-zip": "pytorch",
             "pytorch-legacy": "pytorch", "pytorch-tar": "pytorch", "gguf": "gguf", "megatron-legacy": "auto",
             "torch-dist": "auto"}
CRASH_DIR = REPO / "tools" / "fuzz-crashes"
ALLOC_SLACK = 64 << 20
MATERIALISE_LIMIT = 256 << 20  # larger declared tensors are bound-checked, not materialised


class CaseTimeout(BaseException):
    """A case ran past its time limit."""


class AllocationExceeded(Exception):
    """A case allocated more than its input justifies."""


class WrongResult(Exception):
    """A case 'succeeded' with a result that contradicts itself."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise CaseTimeout in the main thread after `seconds` (SIGALRM; main thread only)."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"case ran longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _tiny_tensors() -> list[Any]:
    rng = np.random.default_rng(7)
    return [
        from_numpy("encoder.layer.0.weight", rng.standard_normal((3, 4)).astype(np.float32), param_id=5),
        from_numpy("encoder.layer.0.bias", np.arange(3, dtype=np.float16)),
        from_numpy("encoder.ids", np.array([1, -2, 3], dtype=np.int64)),
        from_numpy("mask", np.array([True, False])),
        from_numpy("scalar", np.array(2.5, dtype=np.float64)),
        from_numpy("empty", np.zeros((0, 3), dtype=np.uint8)),
    ]


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is in the dev extra
        raise SystemExit(f"torch is needed to make the legacy/TAR seeds: {e}") from None
    return torch
