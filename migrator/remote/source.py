"""Reading an object by ranged requests: headers in a request or two, tensor bytes in large blocks.

`RemoteSource` is a `ByteSource` like a local file's, so every reader works on it unchanged. What
differs is how bytes arrive:

- opening asks the object's size (one HEAD) and nothing else;
- the first read fetches the object's first `HEAD_BLOCK` bytes and keeps them, and a read that ends
  at the end (a zip's end records and central directory) its last `TAIL_BLOCK`: a SafeTensors or burnpack
  header costs two GETs at most (the first block, then the rest of a header larger than it);
- a tensor's bytes are fetched in `Tuning.block_size` blocks, `Tuning.concurrency` of them in flight,
  and handed out block by block (`BlockChunks`): a pass-through tensor is never held whole, so memory
  is blocks in flight x block size. A tensor that is transformed (a transpose needs all of it) is
  fetched whole into one buffer, by the same parallel blocks.

Every request is checked for length (a short body is a truncated or changed object) and retried with
back-off on transient failures (`fs.with_retries`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..bytesource import ByteSource
from ..errors import FormatError, MigratorError
from . import redact
from .fs import Tuning, check_length, filesystem, storage_error, tuning, with_retries

HEAD_BLOCK = 64 << 10
TAIL_BLOCK = 128 << 10
"""Kept from the object's end: a zip's end records (up to 64 KiB + 22 bytes) and a small directory."""


class RemoteSource(ByteSource):
    """An object read by ranged GETs (see the module docstring)."""

    def __init__(self, url: str, size: int | None = None, tune: Tuning | None = None) -> None:
        self.url = url
        self.path = url
        self.label = redact(url)
        self.tune = tune or tuning()
        self.fs, self.fs_path = filesystem(url)
        self.requests = 0  # ranged GETs made (tests count them)
        self.size = self._size() if size is None else size
        self._head: bytes | None = None
        self._tail: bytes | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def _size(self) -> int:
        def info() -> dict[str, Any]:
            return self.fs.info(self.fs_path)  # type: ignore[no-any-return]

        meta = with_retries(info, self.url, "cannot open", self.tune)
        if meta.get("type") == "directory":
            raise FormatError("is a folder (prefix), not an object", file=self.label)
        size = meta.get("size")
        if not isinstance(size, int):
            raise FormatError("the store does not report this object's size", file=self.label)
        return size

    def fetch(self, offset: int, length: int, what: str = "read") -> bytes:
        """Bytes [offset, offset + length) by one ranged GET (retried), checked for length."""
        if length == 0:
            return b""

        def get() -> bytes:
            with self._lock:
                self.requests += 1
            data = self.fs.cat_file(self.fs_path, start=offset, end=offset + length)
            return check_length(bytes(data), length, offset)

        return with_retries(get, self.url, what, self.tune)

    def _cached(self, offset: int, length: int) -> bytes | None:
        head = self._head
        if head is not None and offset + length <= len(head):
            return head[offset:offset + length]
        tail = self._tail
        if tail is not None:
            start = self.size - len(tail)
            if offset >= start:
                return tail[offset - start:offset - start + length]
        return None

    def read(self, offset: int, length: int, what: str = "read") -> bytes:
        self.check_range(offset, length, what)
        got = self._cached(offset, length)
        if got is not None:
            return got
        if self._head is None and offset < HEAD_BLOCK:
            self._head = self.fetch(0, min(self.size, HEAD_BLOCK), what)
            got = self._cached(offset, length)
            if got is not None:
                return got
        elif self._tail is None and offset + length == self.size and length <= TAIL_BLOCK:
            n = min(self.size, TAIL_BLOCK)
            self._tail = self.fetch(self.size - n, n, what)
            return self._cached(offset, length)  # type: ignore[return-value]
        if length > HEAD_BLOCK:
            return bytes(self.view(offset, length))
        return self.fetch(offset, length, what)

    def view(self, offset: int, length: int) -> memoryview:
        """The range whole, fetched by parallel blocks into one buffer (a tensor that is transformed)."""
        self.check_range(offset, length, "view")
        got = self._cached(offset, length)
        if got is not None:
            return memoryview(got)
        out = bytearray(length)
        done = 0
        for block in BlockChunks(self, offset, length)():
            out[done:done + len(block)] = block
            done += len(block)
        return memoryview(out).toreadonly()

    def chunker(self, offset: int, length: int) -> BlockChunks:
        """A stored tensor's `chunks`: its bytes block by block (`LazyTensor.chunks`)."""
        return BlockChunks(self, offset, length)

    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.tune.concurrency, thread_name_prefix="migrator-get")
            return self._pool

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class BlockChunks:
    """A range of a remote object as blocks, several fetched ahead on the source's thread pool.

    At most `concurrency` blocks are in flight or waiting beyond the one handed out; a consumer that
    stops early (an error, an interrupt) cancels the ones not started and waits for none.
    """

    __slots__ = ("length", "offset", "source")

    def __init__(self, source: RemoteSource, offset: int, length: int) -> None:
        self.source, self.offset, self.length = source, offset, length

    def __call__(self) -> Iterator[memoryview]:
        src = self.source
        bs = src.tune.block_size
        starts = range(self.offset, self.offset + self.length, bs)
        end = self.offset + self.length
        if len(starts) <= 1:
            if self.length:
                yield memoryview(src.fetch(self.offset, self.length, "tensor data"))
            return
        pool = src.pool()
        pending: deque[Future[bytes]] = deque()
        it = iter(starts)
        try:
            for s in it:
                pending.append(pool.submit(src.fetch, s, min(bs, end - s), "tensor data"))
                if len(pending) >= src.tune.concurrency:
                    break
            while pending:
                data = pending.popleft().result()
                nxt = next(it, None)
                if nxt is not None:
                    pending.append(pool.submit(src.fetch, nxt, min(bs, end - nxt), "tensor data"))
                yield memoryview(data)
        except MigratorError:
            raise
        except Exception as e:  # a pool error that is not a request's own
            raise storage_error(e, src.url, "tensor data") from None
        finally:
            for f in pending:
                f.cancel()
