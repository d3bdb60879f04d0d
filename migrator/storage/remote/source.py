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

import contextlib
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ...core.bytesource import ByteSource, closed_error
from ...core.errors import FormatError, MigratorError
from . import redact
from .fs import Tuning, check_length, filesystem, get_range, object_info, storage_error, tuning, with_retries
from .options import StorageOptions

HEAD_BLOCK = 64 << 10
TAIL_BLOCK = 128 << 10
"""Kept from the object's end: a zip's end records (up to 64 KiB + 22 bytes) and a small directory."""


class RemoteSource(ByteSource):
    """An object read by ranged GETs (see the module docstring)."""

    def __init__(self, url: str, size: int | None = None, tune: Tuning | None = None,
                 storage: StorageOptions | None = None) -> None:
        self.url = url
        self.path = url
        self.label = redact(url)
        self.tune = tune or tuning(url, storage)
        self.fs, self.fs_path = filesystem(url, storage)
        self.requests = 0  # ranged GETs made (tests count them)
        self.closed = False
        self.size = self._size() if size is None else size
        self._head: bytes | None = None
        self._tail: bytes | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._window: tuple[int, bytes] = (0, b"")  # the block small tensors were last read from
        self._window_lock = threading.Lock()
        self._streams: dict[int, tuple[Any, int]] = {}  # concurrency 1 on S3: per thread, an open-ended
        # GET read block by block, and where it stands

    def _size(self) -> int:
        def info() -> dict[str, Any]:
            return object_info(self.fs, self.fs_path, self.tune)

        meta = with_retries(info, self.url, "cannot open", self.tune)
        if meta.get("type") == "directory":
            raise FormatError("is a folder (prefix), not an object", file=self.label)
        size = meta.get("size")
        if not isinstance(size, int):
            raise FormatError("the store does not report this object's size", file=self.label)
        return size

    def fetch(self, offset: int, length: int, what: str = "read") -> bytes:
        """Bytes [offset, offset + length) by one ranged GET (retried), checked for length."""
        if self.closed:  # as a file's: what a closed reader listed is not read
            raise closed_error(self.label)
        if length == 0:
            return b""

        def get() -> bytes:
            with self._lock:
                self.requests += 1
            data = get_range(self.fs, self.fs_path, offset, offset + length, self.tune)
            return check_length(data, length, offset)

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
        if self.closed:
            raise closed_error(self.label)
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
        if self.closed:
            raise closed_error(self.label)
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

    @property
    def streams(self) -> bool:
        """Whether blocks come from one sequential GET (`MIGRATOR_REMOTE_CONCURRENCY=1` on S3)."""
        return self.tune.concurrency == 1 and hasattr(self.fs, "call_s3")

    def sequential(self, offset: int, length: int) -> bytes:
        """Bytes [offset, offset + length) from this thread's open-ended GET positioned there, opened
        (again) at `offset` when it is elsewhere: reading a file front to back costs one request. One
        stream per thread, so a thread computing casts ahead never moves the writer's stream. A failure
        reopens the stream where it stopped (retried as any request)."""
        if self.closed:
            raise closed_error(self.label)
        me = threading.get_ident()

        def read() -> bytes:
            from fsspec.asyn import sync

            body, at = self._streams.get(me, (None, -1))
            if body is None or at != offset:
                self._close_stream(me)
                with self._lock:
                    self.requests += 1
                bucket, key, _ = self.fs.split_path(self.fs_path)
                resp = self.fs.call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={offset}-",
                                       timeout=self.tune.request_timeout)
                body = resp["Body"]
                with self._lock:
                    self._streams[me] = (body, offset)

            async def exact() -> bytes:
                parts, got = [], 0
                while got < length:
                    piece = await body.read(length - got)
                    if not piece:
                        break
                    parts.append(piece)
                    got += len(piece)
                return b"".join(parts)

            try:
                data = check_length(sync(self.fs.loop, exact, timeout=self.tune.request_timeout), length, offset)
            except BaseException:
                self._close_stream(me)
                raise
            with self._lock:
                self._streams[me] = (body, offset + length)
            return data

        return with_retries(read, self.url, "tensor data", self.tune)

    def _close_stream(self, thread: int | None = None) -> None:
        """Close one thread's stream (None: every one), on the loop that owns its connection."""
        with self._lock:
            ids = list(self._streams) if thread is None else [thread] if thread in self._streams else []
            bodies = [self._streams.pop(i)[0] for i in ids]
        for body in bodies:
            with contextlib.suppress(Exception):
                self.fs.loop.call_soon_threadsafe(body.close)

    def small(self, offset: int, length: int) -> bytes:
        """A range shorter than a block, served from a block-sized window of the object read once:
        consecutive small tensors (written in data order) cost one GET per block, not one each."""
        if self.streams:  # the open stream is the read-ahead: a window would jump ahead of it
            return self.sequential(offset, length)
        with self._window_lock:
            start, data = self._window
            if not (start <= offset and offset + length <= start + len(data)):
                n = min(self.size - offset, max(length, self.tune.block_size))
                data = self.fetch(offset, n, "tensor data")
                start = offset
                self._window = (start, data)
            return data[offset - start:offset - start + length]

    def chunker(self, offset: int, length: int) -> BlockChunks:
        """A stored tensor's `chunks`: its bytes block by block (`LazyTensor.chunks`)."""
        return BlockChunks(self, offset, length)

    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.tune.concurrency, thread_name_prefix="migrator-get")
            return self._pool

    def close(self) -> None:
        self.closed = True
        self._close_stream()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class BlockChunks:
    """A range of a remote object as blocks, several fetched ahead on the source's thread pool.

    At most `concurrency` blocks are in flight or waiting beyond the one handed out; a consumer that
    stops early (an error, an interrupt) cancels the ones not started and waits for none.
    """

    __slots__ = ("length", "offset", "source")
    io_bound = True  # `streaming.Ahead` leaves these to the writer's thread: nothing to compute

    def __init__(self, source: RemoteSource, offset: int, length: int) -> None:
        self.source, self.offset, self.length = source, offset, length

    def __call__(self) -> Iterator[memoryview]:
        src = self.source
        bs = src.tune.block_size
        starts = range(self.offset, self.offset + self.length, bs)
        end = self.offset + self.length
        if src.streams:
            for s in starts:
                yield memoryview(src.sequential(s, min(bs, end - s)))
            return
        if len(starts) <= 1:
            if self.length:
                yield memoryview(src.small(self.offset, self.length) if self.length <= bs // 4
                                 else src.fetch(self.offset, self.length, "tensor data"))
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
            raise storage_error(e, src.url, "tensor data", src.tune) from None
        finally:
            for f in pending:
                f.cancel()
