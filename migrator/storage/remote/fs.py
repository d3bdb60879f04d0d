"""The fsspec side of object-store URLs: which package a protocol needs, options, retries, errors.

fsspec is imported here and only here, on the first URL a run touches. Credentials are never taken
from a recipe: each protocol's own chain (environment variables, config files, instance roles)
supplies them, and `options.check_storage_options` refuses option keys that look like secrets.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, BinaryIO, TypeVar

from ...core.errors import FormatError, MigratorError
from . import protocol, redact
from .options import NO_STORAGE_OPTIONS, StorageOptions

EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure",
          "adl": "azure", "hf": "hf", "http": "http", "https": "http", "memory": "remote"}
PACKAGES = {"s3": "s3fs", "gcs": "gcsfs", "azure": "adlfs", "hf": "huggingface_hub", "http": "aiohttp",
            "remote": "fsspec"}

class StorageError(MigratorError):
    """An object store refused or failed a request (missing object, access denied, network)."""


class MissingExtraError(MigratorError):
    """A URL's protocol needs a package that is not installed."""


TIMEOUT_OPTIONS = ("connect_timeout", "timeout", "request_timeout")
"""Storage options migrator reads itself (never handed to fsspec): `Tuning.connect_timeout`, `.timeout`
and `.request_timeout`."""

TIMEOUT_ATTEMPTS = 1
"""Attempts of a request that timed out (the other transient failures get `Tuning.retries`): a server
that kept a request waiting `Tuning.timeout` seconds has had its chance, so a silent one costs one
timeout per request, not `retries` of them (fsspec's http HEAD falls back to a GET: two there)."""


@dataclass(frozen=True)
class Tuning:
    """How remote bytes move: block size and blocks in flight for reads, part size and parts in flight for
    uploads, attempts per request and the first back-off (doubled per retry), and how long a server may
    keep us waiting. From the environment: MIGRATOR_REMOTE_BLOCK_SIZE, _CONCURRENCY, _PART_SIZE,
    _UPLOAD_CONCURRENCY, _RETRIES, _BACKOFF, _CONNECT_TIMEOUT, _TIMEOUT, _REQUEST_TIMEOUT; a recipe's
    storage options `connect_timeout`, `timeout` and `request_timeout` override the last three for their
    URLs. The store clients' own retries are turned off (`_with_timeouts`): `with_retries` is the one
    layer, so the worst case of a request is known (`TIMEOUT_ATTEMPTS` timeouts)."""

    block_size: int = 16 << 20
    concurrency: int = 4
    part_size: int = 16 << 20
    retries: int = 4
    backoff: float = 0.25
    upload_concurrency: int = 8
    timeout: float = 30.0
    """Seconds to wait for a response's first or next bytes (a silent or stalled server)."""
    request_timeout: float = 600.0
    """Seconds one read request (a HEAD, a ranged GET of a block) may take in all: a server dripping a
    byte at a time never trips `timeout`, this ends it. A 16 MiB block at 600 s is 28 KB/s at least."""
    connect_timeout: float = 10.0
    """Seconds to open a connection (a host that drops the SYN, a firewalled port)."""

    @classmethod
    def from_env(cls) -> Tuning:
        def num(name: str, default: float, kind: Callable[[str], Any] = int) -> Any:
            raw = os.environ.get(f"MIGRATOR_REMOTE_{name}")
            if raw is None or raw == "":
                return default
            try:
                value = kind(raw)
            except ValueError:
                raise MigratorError(f"MIGRATOR_REMOTE_{name}={raw!r} is not a number") from None
            if value < 0:
                raise MigratorError(f"MIGRATOR_REMOTE_{name} must not be negative")
            return value

        def seconds(name: str, default: float) -> float:
            raw = os.environ.get(f"MIGRATOR_REMOTE_{name}")
            return default if raw is None or raw == "" else positive_seconds(raw, f"MIGRATOR_REMOTE_{name}")

        d = cls()
        block = max(64 << 10, num("BLOCK_SIZE", d.block_size)) // (64 << 10) * (64 << 10)  # whole elements
        part = max(5 << 20, num("PART_SIZE", d.part_size))  # S3's smallest part but the last
        return cls(block, max(1, num("CONCURRENCY", d.concurrency)), part, max(1, num("RETRIES", d.retries)),
                   num("BACKOFF", d.backoff, float), max(1, num("UPLOAD_CONCURRENCY", d.upload_concurrency)),
                   seconds("TIMEOUT", d.timeout), seconds("REQUEST_TIMEOUT", d.request_timeout),
                   seconds("CONNECT_TIMEOUT", d.connect_timeout))


def positive_seconds(value: object, where: str) -> float:
    """A timeout in seconds: a finite number above 0 (0 or inf would mean waiting forever)."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not (0 < seconds < math.inf):
        raise MigratorError(f"{where}={value!r}: expected a number of seconds above 0")
    return seconds


def tuning(url: str | None = None, storage: StorageOptions | None = None) -> Tuning:
    """The environment's tuning, with the timeouts of `url`'s storage options (a recipe's) when given."""
    tune = Tuning.from_env()
    if url is None:
        return tune
    options = (storage or NO_STORAGE_OPTIONS).for_url(url)
    for key in TIMEOUT_OPTIONS:
        if key in options:
            tune = replace(tune, **{key: positive_seconds(options[key], f"storage_options.{key}")})  # type: ignore[arg-type]
    return tune


def _with_timeouts(proto: str, options: dict[str, Any], tune: Tuning) -> dict[str, Any]:
    """`options` with the protocol's own connect and read timeouts set to `tune.timeout` (where the
    options do not set them): a silent server, or one that stops after the headers, fails the request.
    The whole request's deadline (`request_timeout`) is applied per call (`object_info`, `get_range`)."""
    t, connect = tune.timeout, tune.connect_timeout
    if proto in ("http", "https"):
        import aiohttp

        client = dict(options.get("client_kwargs") or {})
        client.setdefault("timeout", aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=t))
        options["client_kwargs"] = client
    elif proto in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", connect)
        config.setdefault("read_timeout", t)
        # botocore's retries (5 in legacy mode) times s3fs's (5) would turn one silent endpoint into 25
        # timeouts per request: with_retries is the only retry layer
        config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
        options["config_kwargs"] = config
    elif proto in ("gs", "gcs"):
        options.setdefault("requests_timeout", tune.request_timeout)
    elif proto in ("az", "abfs", "abfss"):
        options.setdefault("connection_timeout", connect)
        options.setdefault("read_timeout", t)
    return options


_FS_CACHE: dict[tuple[str, str], Any] = {}
# a forked worker (`run --jobs N`) must not reuse its parent's clients: their sessions belong to the
# parent's event loop thread, which the child does not have (fsspec resets its own loop after fork)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_FS_CACHE.clear)


_ENVIRONMENT_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_", "HF_", "FSSPEC_")


def _environment_key() -> str:
    """The variables a store client reads its endpoint, region and credentials from: a client made
    under other values (a changed AWS_ENDPOINT_URL, another profile) is not reused."""
    return repr(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENVIRONMENT_PREFIXES)))


def filesystem(url: str, storage: StorageOptions | None = None) -> tuple[Any, str]:
    """The fsspec filesystem for `url` (with its options from `storage`) and the path in it."""
    proto = protocol(url)
    extra = EXTRAS.get(proto)
    if extra is None or "::" in url:  # fsspec would open zip://, tar://, file:: chains over local files
        raise MigratorError(f"unsupported URL '{proto}://...'" + (" (chained URLs with '::' are not read)" if extra
                            else "") + ": migrator reads s3://, gs://, az://, hf://, http(s):// and memory:// URLs, "
                            "and local paths", file=redact(url))
    try:
        import fsspec
    except ImportError:
        raise MissingExtraError(f"{proto}:// URLs need fsspec: pip install 'migrator[{extra or 'remote'}]'",
                                file=redact(url)) from None
    options = {k: v for k, v in (storage or NO_STORAGE_OPTIONS).for_url(url).items() if k not in TIMEOUT_OPTIONS}
    tune = tuning(url, storage)
    key = (proto, repr(sorted(options.items())) + _environment_key() + repr((tune.timeout, tune.request_timeout)))
    fs = _FS_CACHE.get(key)
    if fs is None:
        try:
            cls = fsspec.get_filesystem_class(proto)
            # fsspec's own instance cache ignores the environment: ours is keyed by it
            fs = cls(**_with_timeouts(proto, options, tune), skip_instance_cache=True)
            if proto in ("s3", "s3a") and isinstance(getattr(fs, "retries", None), int):
                fs.retries = 1  # s3fs's own retry loop (a class attribute, 5): with_retries is the one layer
        except ImportError:
            pkg = PACKAGES.get(extra or "", f"the fsspec package for {proto}://")
            hint = f"pip install 'migrator[{extra}]'" if extra else "install the fsspec implementation for it"
            raise MissingExtraError(f"{proto}:// URLs need {pkg}: {hint}", file=redact(url)) from None
        except ValueError as e:
            raise MigratorError(f"unsupported URL protocol '{proto}': {e}", file=redact(url)) from None
        except TypeError as e:
            raise MigratorError(f"storage_options for {proto}:// not accepted: {redact(str(e))}",
                                file=redact(url)) from None
        _FS_CACHE[key] = fs
    path = url if proto in ("http", "https") else fs._strip_protocol(url)
    return fs, path


T = TypeVar("T")


def describe(e: BaseException) -> str:
    """An exception as a short message with any URL's user-info removed: its first line (azure-core
    appends the request id, the error code and the response's XML on lines of their own)."""
    text = str(e).strip().split("\n", 1)[0].strip() or type(e).__name__
    return redact(f"{type(e).__name__}: {text}" if type(e).__name__ not in text else text)


def http_status(e: BaseException | None) -> int | None:
    """The HTTP status behind an error, looked for along its causes (fsspec wraps a 403 in a
    FileNotFoundError, s3fs a ClientError in an OSError, adlfs an azure-core HttpResponseError,
    whose status is `status_code`, in a RuntimeError)."""
    seen = 0
    while e is not None and seen < 8:
        for attr in ("status", "status_code"):
            status = getattr(e, attr, None)
            if isinstance(status, int) and not isinstance(status, bool):
                return status
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(code, int):
                return code
        e = e.__cause__ or e.__context__
        seen += 1
    return None


def timed_out(e: BaseException | None) -> BaseException | None:
    """The timeout behind an error, looked for along its causes (fsspec's http turns a HEAD that timed
    out into a FileNotFoundError; botocore's timeouts are not TimeoutErrors but say so in their name)."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, TimeoutError) or "Timeout" in type(e).__name__:
            return e
        e = e.__cause__ or e.__context__
        seen += 1
    return None


def is_permanent(e: BaseException) -> bool:
    """Errors a retry cannot fix: missing object, access denied, a failed condition, a bad request."""
    if timed_out(e) is not None:
        return False
    if isinstance(e, FileNotFoundError | FileExistsError | PermissionError | IsADirectoryError | NotADirectoryError
                  | ValueError):
        return True
    status = http_status(e)
    return isinstance(status, int) and 400 <= status < 500 and status not in (408, 429)


def storage_error(e: BaseException, url: str, what: str, tune: Tuning | None = None) -> MigratorError:
    """The error to raise for a failed request, naming the object (credentials redacted)."""
    from ...core.errors import TargetExistsError

    label = redact(url)
    late = timed_out(e)
    if late is not None:
        tune = tune or tuning(url)
        from fsspec.exceptions import FSTimeoutError

        inner = late.__cause__ if isinstance(late, FSTimeoutError) else None
        # fsspec wraps every timeout of the loop in an FSTimeoutError: the deadline's own is a bare
        # TimeoutError (asyncio.wait_for) or none; a connect or read timeout is the client's subclass
        if isinstance(late, FSTimeoutError) and (inner is None or type(inner) is TimeoutError):
            return StorageError(f"{what}: timed out after {tune.request_timeout:g} s: the request did not complete "
                                "(MIGRATOR_REMOTE_REQUEST_TIMEOUT, storage option request_timeout)", file=label)
        return StorageError(f"{what}: timed out waiting for the server to connect ({tune.connect_timeout:g} s) or "
                            f"send ({tune.timeout:g} s) (MIGRATOR_REMOTE_CONNECT_TIMEOUT and _TIMEOUT, storage options "
                            "connect_timeout and timeout)", file=label)
    status = http_status(e)
    if isinstance(e, FileExistsError) or status == 412:
        return TargetExistsError("target was created by someone else while this run wrote it; nothing was "
                                 "replaced", file=label)
    if status in (401, 403) or isinstance(e, PermissionError):
        return StorageError(f"{what}: access denied ({describe(e)}); credentials come from the environment "
                            "or the protocol's config files (AWS_PROFILE, ...), never from the recipe", file=label)
    if isinstance(e, FileNotFoundError) or status == 404:
        return StorageError(f"{what}: no such object", file=label)
    return StorageError(f"{what}: {describe(e)}", file=label)


def with_retries(call: Callable[[], T], url: str, what: str, tune: Tuning | None = None) -> T:
    """`call()`, retried with exponential back-off on transient failures (dropped connections, short
    reads, 5xx); a permanent one (404, 403) or the last attempt's raises a `StorageError`."""
    tune = tune or tuning()
    delay = tune.backoff
    timeouts = 0
    for attempt in range(1, tune.retries + 1):
        try:
            return call()
        except MigratorError:
            raise
        except Exception as e:
            timeouts += timed_out(e) is not None
            if is_permanent(e) or attempt == tune.retries or timeouts == TIMEOUT_ATTEMPTS:
                err = storage_error(e, url, what, tune)
                if attempt > 1:
                    err = type(err)(f"{err.detail} (after {attempt} attempts)", file=err.file)
                raise err from None
        if delay:
            time.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")


class ShortRead(OSError):
    """A ranged read returned fewer bytes than asked: retried, then reported as a truncated object."""


def check_length(data: bytes, want: int, offset: int) -> bytes:
    if len(data) != want:
        raise ShortRead(f"object ended early: got {len(data)} of {want} bytes at offset {offset} (truncated, or "
                        "changed while read?)")
    return data


STREAM_BLOCK = 8 << 20


def stream_size(src: str | os.PathLike[str], storage: StorageOptions | None = None) -> int:
    """The size of a local file or of a store object (`stream_blocks` checks it is what it reads)."""
    from . import is_url

    if not is_url(src):
        return os.stat(src).st_size
    url = str(src)
    fs, path = filesystem(url, storage)
    tune = tuning(url, storage)
    return with_retries(lambda: int(object_info(fs, path, tune)["size"]), url, "cannot open", tune)


def stream_blocks(src: str | os.PathLike[str], what: str = "file", size: int | None = None,
                  storage: StorageOptions | None = None) -> Iterator[bytes]:
    """A local file or a store object, read front to back in STREAM_BLOCK blocks (a store object
    through fsspec, uncached, so at most one block is held); the bytes are checked to add up to its
    size (`size`, when the caller has it from `stream_size`, else asked here), so an object changed
    or cut meanwhile is an error, not a short copy."""
    from . import is_url

    if size is None:
        size = stream_size(src, storage)
    if is_url(src):  # ranged GETs, each bounded, timed and retried like every other read of an object
        url = str(src)
        fs, path = filesystem(url, storage)
        tune = tuning(url, storage)
        for start in range(0, size, STREAM_BLOCK):
            n = min(STREAM_BLOCK, size - start)

            def ranged(start: int = start, n: int = n) -> bytes:
                return check_length(get_range(fs, path, start, start + n, tune), n, start)

            yield with_retries(ranged, url, what, tune)
        return
    f = open(src, "rb")  # noqa: SIM115  # closed below, after the generator's last block
    done = 0
    try:
        while block := f.read(STREAM_BLOCK):
            done += len(block)
            yield block
    finally:
        f.close()
    if done != size:
        raise FormatError(f"{what} changed while it was read: {done} bytes, {size} expected", file=redact(str(src)))


def copy_companion(src: str | os.PathLike[str], sink: BinaryIO, size: int | None = None,
                   storage: StorageOptions | None = None) -> None:
    """Copy a companion file, local or on a store, into `sink` (`fs.stream_blocks`: byte for byte,
    in blocks, checked against its size, `size` if the caller already asked for it)."""
    for block in stream_blocks(src, "companion file", size, storage):
        sink.write(block)


def deadline(fs: Any, tune: Tuning) -> dict[str, Any]:
    """fsspec's `timeout=` for a call of an async filesystem's sync method (a HEAD, a ranged GET, a
    listing): the whole call is cancelled after `request_timeout` seconds (a synchronous filesystem,
    hf://, relies on its own timeouts)."""
    return {"timeout": tune.request_timeout} if getattr(fs, "async_impl", False) else {}


def object_info(fs: Any, path: str, tune: Tuning) -> dict[str, Any]:
    """`fs.info(path)` within the request deadline. Over http(s), one HEAD, then a GET only if the
    HEAD failed otherwise than by a timeout or gave no size: fsspec's own `info` asks again with a
    GET after a HEAD timed out, so a silent server cost two read timeouts (60 s where 30 are said)."""
    if type(fs).__name__ == "HTTPFileSystem":
        from fsspec.asyn import sync

        return sync(fs.loop, _http_info, fs, path, timeout=tune.request_timeout)
    return fs.info(path, **deadline(fs, tune))


async def _http_info(fs: Any, url: str) -> dict[str, Any]:
    """fsspec's http `_info`, except that a HEAD that timed out is not followed by a GET."""
    from fsspec.implementations.http import _file_info

    info: dict[str, Any] = {}
    session = await fs.set_session()
    for policy in ("head", "get"):
        try:
            info.update(await _file_info(fs.encode_url(url), size_policy=policy, session=session, **fs.kwargs))
            if info.get("size") is not None:
                break
        except Exception as exc:
            if timed_out(exc) is not None:  # the server had its `timeout`: no second request
                raise
            if policy == "get":
                raise FileNotFoundError(url) from exc
    return {"name": url, "size": None, **info, "type": "file"}


def get_range(fs: Any, path: str, start: int, end: int, tune: Tuning) -> bytes:
    """Bytes [start, end) of an object by one ranged request within the request deadline, never reading
    more than that over http(s) and S3 (a server that ignores Range, or runs on past it, is cut off)."""
    kind = type(fs).__name__
    if kind in ("HTTPFileSystem", "S3FileSystem"):
        from fsspec.asyn import sync

        get = _http_range if kind == "HTTPFileSystem" else _s3_range
        return sync(fs.loop, get, fs, path, start, end, timeout=tune.request_timeout)
    return bytes(fs.cat_file(path, start=start, end=end, **deadline(fs, tune)))


_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-")


def _check_range(url: str, start: int, end: int, status: int, content_range: str | None) -> None:
    """A response to a ranged request must hold the bytes asked for: a 206 (or a range header) starting
    at `start`, or, for a range from 0, the whole object (a 200, whose first bytes are those)."""
    m = _CONTENT_RANGE.match(content_range or "")
    if (m is not None and int(m.group(1)) == start) or (m is None and status != 206 and start == 0):
        return
    raise StorageError(f"the server ignored the Range of a request (asked bytes {start}-{end - 1}, got status "
                       f"{status}, Content-Range {content_range!r}): this server cannot serve parts of the object",
                       file=redact(url))


async def _read_at_most(read: Callable[[int], Any], want: int) -> tuple[bytes, bool]:
    """Up to `want` bytes from `read(n)` (an async read of at most n bytes; b"" at the end), and whether
    the body ended there. Never more than asked is read, whatever the response declared."""
    parts: list[bytes] = []
    got = 0
    while got < want:
        piece = await read(min(want - got, 1 << 20))
        if not piece:
            return b"".join(parts), True
        parts.append(piece)
        got += len(piece)
    return b"".join(parts), False


async def _http_range(fs: Any, url: str, start: int, end: int) -> bytes:
    """One ranged GET over http(s) that reads at most `end - start` bytes of the body and then hangs up.

    fsspec's own `cat_file` reads whatever body comes: a server ignoring Range would send the whole
    object (gigabytes) for a 64 KiB header. Here a 200 (the whole object) is accepted only for a range
    starting at 0, whose bytes are then the body's first ones; any other 200, or a 206 for another
    start, is an error, and a longer body than asked is cut off (the connection is closed, not drained).
    """
    kw = dict(fs.kwargs)
    headers = dict(kw.pop("headers", None) or {})
    headers["Range"] = f"bytes={start}-{end - 1}"
    session = await fs.set_session()
    async with session.get(fs.encode_url(url), headers=headers, **kw) as r:
        fs._raise_not_found_for_status(r, url)
        try:
            _check_range(url, start, end, r.status, r.headers.get("Content-Range"))
        except StorageError:
            r.close()
            raise
        data, ended = await _read_at_most(r.content.read, end - start)
        if not ended and not r.content.at_eof():  # more than asked: stop reading, drop the connection
            r.close()
    return data


async def _s3_range(fs: Any, path: str, start: int, end: int) -> bytes:
    """`_http_range` for S3 (an S3-compatible endpoint may ignore Range too): one GetObject, at most the
    range's bytes read from its body, which is then closed (the connection dropped, not drained)."""
    bucket, key, version = fs.split_path(path)
    extra = {"VersionId": version} if version else {}
    resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **extra,
                             **fs.req_kw)
    body = resp["Body"]
    try:
        status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        _check_range(f"s3://{path}", start, end, status, resp.get("ContentRange"))
        data, _ = await _read_at_most(body.read, end - start)
    finally:
        body.close()
    return data
