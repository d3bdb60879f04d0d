"""Atomic writes to object stores, beside `migrator.storage.atomic` (local files) behind the same interface.

`remote_output(url, ...)` yields a write-only, non-seekable sink; the object exists only once the
block ends without an error, complete:

- S3 (`s3://`): a multipart upload streamed part by part (`Tuning.part_size`, raised for outputs
  over 10,000 parts; `Tuning.upload_concurrency` parts in flight, each sent from the buffer it was
  filled in, so memory is at most (parts in flight + 1) x part size). The object appears only with
  CompleteMultipartUpload; any error or interrupt (KeyboardInterrupt included) aborts the upload, so
  no part is left stored. An output smaller than one part is one PutObject, atomic by itself.
  Without `overwrite` the publishing request carries `If-None-Match: *`, so a concurrent writer
  cannot be overwritten: one of two racing runs fails with "exists". (A HEAD before the upload
  refuses an existing object early, before any byte is sent.)
- other stores (`gs://`, `az://`, `memory://`, ...): the bytes go to a scratch object
  `<key>.migrator-<pid>-<n>.tmp` through fsspec's own streamed upload, which is then moved onto the
  key (a server-side copy creates the object whole) and removed on any failure. Without
  `overwrite` the check is a HEAD before the move: racy (two runs may both pass it), documented as such.

A run killed by SIGKILL cannot abort its S3 upload: its parts stay until a bucket lifecycle rule
(AbortIncompleteMultipartUpload) removes them; the object itself never appears.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO, TypeVar

from ...core.errors import MigratorError, OutputError, SameFileError, TargetExistsError
from . import READ_ONLY, protocol, redact, url_of
from .fs import Tuning, deadline, describe, filesystem, http_status, storage_error, tuning, with_retries
from .options import StorageOptions

T = TypeVar("T")

_counter = itertools.count()
MISSING_CONTAINER = "the bucket or container does not exist"
MAX_PARTS = 10_000


def exists(url: str, storage: StorageOptions | None = None) -> bool:
    fs, path = filesystem(url, storage)
    with contextlib.suppress(AttributeError, TypeError):
        fs.invalidate_cache(path)
    try:
        tune = tuning(url, storage)
        return bool(with_retries(lambda: fs.exists(path, **deadline(fs, tune)), url, "cannot check the target", tune))
    except FileNotFoundError:
        return False


def delete(url: str, storage: StorageOptions | None = None) -> None:
    fs, path = filesystem(url, storage)
    try:
        fs.rm_file(path)
    except FileNotFoundError:
        return
    except Exception as e:
        raise OutputError(f"cannot delete: {describe(e)}", file=redact(url)) from None


def target_problems(url: str, *, overwrite: bool, protect: Iterable[object] = (),
                    storage: StorageOptions | None = None) -> list[str]:
    """What a write to `url` would refuse (for `validate` and `plan`): read-only protocol, the object
    exists without overwrite, the object is one the run reads."""
    try:
        check_remote_target(url, overwrite=overwrite, protect=protect, storage=storage)
    except (OutputError, TargetExistsError, SameFileError) as e:
        return [str(e)]
    return []


def check_remote_target(url: str, *, overwrite: bool, protect: Iterable[object] = (),
                        storage: StorageOptions | None = None) -> None:
    label = redact(url)
    if protocol(url) in READ_ONLY:
        raise OutputError(f"{protocol(url)}:// is read-only: write to s3://, gs://, az://, memory:// or a local path",
                          file=label)
    for p in protect:
        if isinstance(p, str | os.PathLike) and _same_url(p, url):
            raise SameFileError("the target is a file this run reads", file=label)
    if not overwrite and exists(url, storage):
        raise TargetExistsError("target exists; use --overwrite (target.overwrite: true) to replace it", file=label)


def _same_url(p: str | os.PathLike[str], url: str) -> bool:
    from . import is_url

    return is_url(p) and url_of(p).rstrip("/") == url.rstrip("/")


@contextlib.contextmanager
def remote_output(url: str, *, overwrite: bool = False, expected_size: int | None = None,
                  protect: Iterable[object] = (), tune: Tuning | None = None,
                  storage: StorageOptions | None = None) -> Iterator[BinaryIO]:
    """A sink whose bytes become the object `url` only when the block succeeds (module docstring)."""
    check_remote_target(url, overwrite=overwrite, protect=protect, storage=storage)
    tune = tune or tuning()
    sink: _Sink = (S3Upload(url, overwrite, tune, expected_size, storage) if protocol(url) in ("s3", "s3a")
                   else ScratchObjectUpload(url, overwrite, storage))
    try:
        yield sink  # type: ignore[misc]
        if expected_size is not None and sink.position != expected_size:
            raise OutputError(f"wrote {sink.position} bytes, planned {expected_size}", file=sink.label)
        sink.publish()
    except BaseException:
        sink.abort()
        raise


class _Sink(io.RawIOBase):
    """The write side every writer sees: sequential writes, no seek, no descriptor."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.label = redact(url)
        self.position = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.position

    def fileno(self) -> int:
        raise io.UnsupportedOperation("an object-store upload has no file descriptor")

    def publish(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError


class _PartBody(io.RawIOBase):
    """A part's bytes as a seekable reader over the upload's own buffer, so nothing copies the part.

    A `bytes` body would be wrapped by botocore in a `BytesIO` whose buffer aiohttp takes
    (`getbuffer()`), which unshares it: a second full copy of every part in flight. A plain reader is
    streamed by aiohttp chunk by chunk instead, and botocore computes its checksum the same way.
    """

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def __len__(self) -> int:
        return len(self._view)

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b: Any) -> int:
        out = memoryview(b).cast("B")
        n = max(0, min(len(out), len(self._view) - self._pos))
        out[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        data = bytes(self._view[self._pos:end]) if end > self._pos else b""
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)


class S3Upload(_Sink):
    """A multipart upload fed by sequential writes (see the module docstring).

    Parts are filled in place in a pool of at most `upload_concurrency + 1` part-sized buffers: one
    being filled, the others in flight. A buffer is reused only after its part was sent, so memory
    is bounded by (parts in flight + 1) x part size, and no part is copied on its way to the socket.
    """

    def __init__(self, url: str, overwrite: bool, tune: Tuning, expected_size: int | None = None,
                 storage: StorageOptions | None = None) -> None:
        super().__init__(url)
        self.fs, path = filesystem(url, storage)
        self.bucket, self.key, _ = self.fs.split_path(path)
        self.overwrite = overwrite
        self.tune = tune
        # S3 takes at most 10,000 parts: a larger output gets larger parts (whole MiB)
        need = -(-(expected_size or 0) // MAX_PARTS)
        self.part_size = max(tune.part_size, -(-need // (1 << 20)) << 20)
        self._inflight = max(1, tune.upload_concurrency)
        self._free: list[bytearray] = []
        self._cur: bytearray | None = None
        self._fill = 0
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self._pending: deque[tuple[Future[dict[str, Any]], bytearray]] = deque()
        self._pool: ThreadPoolExecutor | None = None
        self._done = False

    def _call(self, method: str, body: memoryview | None = None, **kwargs: Any) -> Any:
        def attempt() -> Any:  # a fresh reader per attempt: a failed one may have consumed its body
            extra = {} if body is None else {"Body": _PartBody(body)}
            return self.fs.call_s3(method, Bucket=self.bucket, Key=self.key, **extra, **kwargs,
                                   **deadline(self.fs, self.tune))

        return with_retries(attempt, self.url, method.replace("_", " "), self.tune)

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        n = len(view)
        self.position += n
        size = self.part_size
        while len(view):
            if self._cur is None:
                self._cur = self._free.pop() if self._free else bytearray(size)
            take = min(size - self._fill, len(view))
            self._cur[self._fill:self._fill + take] = view[:take]
            self._fill += take
            view = view[take:]
            if self._fill == size:
                self._send_current()
        return n

    def _send_current(self) -> None:
        buf, filled = self._cur, self._fill
        assert buf is not None
        self._cur, self._fill = None, 0
        if self._upload_id is None:
            self._upload_id = self._call("create_multipart_upload")["UploadId"]
            self._pool = ThreadPoolExecutor(self._inflight, thread_name_prefix="migrator-put")
        assert self._pool is not None
        while len(self._pending) >= self._inflight:
            self._collect()
        number = len(self._parts) + len(self._pending) + 1
        future = self._pool.submit(self._upload_part, number, memoryview(buf)[:filled])
        self._pending.append((future, buf))

    def _collect(self) -> None:
        """Wait for the oldest part in flight; its buffer becomes free for the next part."""
        future, buf = self._pending.popleft()
        self._parts.append(future.result())
        self._free.append(buf)

    def _upload_part(self, number: int, data: memoryview) -> dict[str, Any]:
        out = self._call("upload_part", data, UploadId=self._upload_id, PartNumber=number)
        return {"PartNumber": number, "ETag": out["ETag"]}

    def publish(self) -> None:
        cond: dict[str, Any] = {} if self.overwrite else {"IfNoneMatch": "*"}  # failed: TargetExistsError
        if self._upload_id is None:  # smaller than one part: one request
            data = memoryview(self._cur or b"")[:self._fill]
            self._call("put_object", data, **cond)
        else:
            if self._fill:
                self._send_current()
            while self._pending:
                self._collect()
            self._call("complete_multipart_upload", UploadId=self._upload_id,
                       MultipartUpload={"Parts": self._parts}, **cond)
        self._done = True
        self._shutdown()
        self._cur, self._free = None, []
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(self.fs.split_path(self.fs._strip_protocol(self.url))[0])

    def _shutdown(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def abort(self) -> None:
        """Stop the parts in flight and abort the upload, so no part stays stored."""
        if self._done:
            return
        self._done = True
        for f, _ in self._pending:
            f.cancel()
        self._shutdown()  # the parts already being sent finish (or fail) before the abort
        self._pending.clear()
        if self._upload_id is not None:
            try:
                self.fs.call_s3("abort_multipart_upload", Bucket=self.bucket, Key=self.key,
                                UploadId=self._upload_id)
            except Exception as e:
                raise OutputError(f"could not abort multipart upload {self._upload_id} ({describe(e)}); its "
                                  "parts stay until aborted or a lifecycle rule removes them", file=self.label) from e


class ScratchObjectUpload(_Sink):
    """Any other fsspec store: stream into a scratch object, then move it onto the key.

    Every store request (opening the upload, the parts the client flushes while writing, closing it,
    the move) that fails is an `OutputError` naming the target, never the client's own exception:
    a missing bucket, say, surfaces only when the first bytes are flushed."""

    def __init__(self, url: str, overwrite: bool, storage: StorageOptions | None = None) -> None:
        super().__init__(url)
        self.fs, self.path = filesystem(url, storage)
        self.tune = tuning(url, storage)
        self.overwrite = overwrite
        self.scratch = f"{self.path}.migrator-{os.getpid()}-{next(_counter)}.tmp"
        self._f = self._request(lambda: self.fs.open(self.scratch, "wb"), "cannot start the upload")
        self._closed = False

    def _request(self, call: Callable[[], T], what: str, missing: str = MISSING_CONTAINER) -> T:
        try:
            return call()
        except Exception as e:
            raise upload_error(e, self.url, what, missing) from None

    def write(self, b: Any) -> int:
        n = len(b) if not isinstance(b, memoryview) else b.nbytes
        self._request(lambda: self._f.write(b), "cannot upload")  # sends a block once the buffer is full
        self.position += n
        return n

    def publish(self) -> None:
        self._request(self._f.close, "cannot upload")
        self._closed = True
        if not self.overwrite and self._request(lambda: self.fs.exists(self.path, **deadline(self.fs, self.tune)),
                                                "cannot check the target"):
            # racy: see the module docstring
            raise TargetExistsError("target was created by someone else while this run wrote it; nothing was "
                                    "replaced", file=self.label)
        self._request(lambda: self.fs.mv(self.scratch, self.path), "cannot move the upload onto the target",
                      missing="the uploaded scratch object disappeared")

    def abort(self) -> None:
        if not self._closed:
            self._closed = True
            f = self._f
            with contextlib.suppress(Exception):
                if hasattr(f, "discard"):
                    f.discard()
            # A buffered fsspec file flushes what it holds when closed, and its `__del__` closes it: an
            # aborted file left open would commit the scratch object when garbage collected, after
            # the removal below (adlfs's and gcsfs's small uploads, whose `discard` is a no-op).
            # Marked as flushed already, closing it only releases its client.
            if hasattr(f, "forced"):
                f.forced = True
            with contextlib.suppress(Exception):
                f.close()
        with contextlib.suppress(Exception):
            self.fs.rm_file(self.scratch)


def upload_error(e: BaseException, url: str, what: str, missing: str = MISSING_CONTAINER) -> MigratorError:
    """A failed upload request as an error naming the target: a store's own errors (adlfs raises a
    RuntimeError around azure-core's) never reach the user raw. A 404 on an upload is `missing` (the
    bucket or container, for a new object); a failed condition stays a `TargetExistsError`."""
    if isinstance(e, MigratorError):
        return e
    label = redact(url)
    if isinstance(e, FileNotFoundError) or http_status(e) == 404:
        return OutputError(f"{what}: {missing}", file=label)
    err = storage_error(e, url, what)
    return err if isinstance(err, TargetExistsError) else OutputError(err.detail, file=label)
