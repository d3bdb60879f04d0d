"""One way for a test to bound a hang: SIGALRM raises in the main thread. A safety net that turns a
hang into a failure, never a timing assert (what the test checks does not depend on it)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def alarm(seconds: int, why: str) -> Iterator[None]:
    """Raise TimeoutError(`why`) if the block is still running after `seconds`."""
    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(why)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
