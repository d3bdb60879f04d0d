"""`map` over a thread pool, a bounded number of items ahead, results in input order.

Shared by casts.py (computed pieces) and windows.py (mapped windows); kept free of numpy so the
window reader, which stats of a float model use without numpy, can take it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def map_ahead(pool: Executor, fn: Callable[[T], R], items: Iterable[T], ahead: int) -> Iterator[R]:
    """`fn(item)` for each item, at most `ahead + 1` of them submitted and not yet yielded; an early
    stop (the consumer closing the generator, or an error) cancels what has not started."""
    pending: deque[Future[R]] = deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) > ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()
