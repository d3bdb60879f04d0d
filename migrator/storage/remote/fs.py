"""The fsspec side of object-store URLs: which package a protocol needs, options, retries, errors.

fsspec is imported here and only here, on the first URL a run touches. Credentials are never taken
from a recipe: each protocol's own chain (environment variables, config files, instance roles)
supplies them, and `options.check_storage_options` refuses option keys that look like secrets.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

from ...core.errors import FormatError, MigratorError
from . import protocol, redact
from .options import options_for

EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure",
          "adl": "azure", "hf": "hf", "http": "http", "https": "http", "memory": "remote"}
PACKAGES = {"s3": "s3fs", "gcs": "gcsfs", "azure": "adlfs", "hf": "huggingface_hub", "http": "aiohttp",
            "remote": "fsspec"}

class StorageError(MigratorError):
    """An object store refused or failed a request (missing object, access denied, network)."""


class MissingExtraError(MigratorError):
    """A URL's protocol needs a package that is not installed."""


@dataclass(frozen=True)
class Tuning:
    """How remote bytes move: block size and blocks in flight for reads, part size and parts in flight for
    uploads, attempts per request and the first back-off (doubled per retry). From the environment:
    MIGRATOR_REMOTE_BLOCK_SIZE, _CONCURRENCY, _PART_SIZE, _UPLOAD_CONCURRENCY, _RETRIES, _BACKOFF."""

    block_size: int = 16 << 20
    concurrency: int = 4
    part_size: int = 16 << 20
    retries: int = 4
    backoff: float = 0.25
    upload_concurrency: int = 8

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

        d = cls()
        block = max(64 << 10, num("BLOCK_SIZE", d.block_size)) // (64 << 10) * (64 << 10)  # whole elements
        part = max(5 << 20, num("PART_SIZE", d.part_size))  # S3's smallest part but the last
        return cls(block, max(1, num("CONCURRENCY", d.concurrency)), part, max(1, num("RETRIES", d.retries)),
                   num("BACKOFF", d.backoff, float), max(1, num("UPLOAD_CONCURRENCY", d.upload_concurrency)))


def tuning() -> Tuning:
    return Tuning.from_env()


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


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem for `url` (with its registered options) and the path in it."""
    proto = protocol(url)
    extra = EXTRAS.get(proto)
    try:
        import fsspec
    except ImportError:
        raise MissingExtraError(f"{proto}:// URLs need fsspec: pip install 'migrator[{extra or 'remote'}]'",
                                file=redact(url)) from None
    options = options_for(url)
    key = (proto, repr(sorted(options.items())) + _environment_key())
    fs = _FS_CACHE.get(key)
    if fs is None:
        try:
            cls = fsspec.get_filesystem_class(proto)
            # fsspec's own instance cache ignores the environment: ours is keyed by it
            fs = cls(**options, skip_instance_cache=True)
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


def is_permanent(e: BaseException) -> bool:
    """Errors a retry cannot fix: missing object, access denied, a failed condition, a bad request."""
    if isinstance(e, FileNotFoundError | FileExistsError | PermissionError | IsADirectoryError | NotADirectoryError
                  | ValueError):
        return True
    status = http_status(e)
    return isinstance(status, int) and 400 <= status < 500 and status not in (408, 429)


def storage_error(e: BaseException, url: str, what: str) -> MigratorError:
    """The error to raise for a failed request, naming the object (credentials redacted)."""
    from ...core.errors import TargetExistsError

    label = redact(url)
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
    for attempt in range(1, tune.retries + 1):
        try:
            return call()
        except MigratorError:
            raise
        except Exception as e:
            if is_permanent(e) or attempt == tune.retries:
                err = storage_error(e, url, what)
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


def stream_size(src: str | os.PathLike[str]) -> int:
    """The size of a local file or of a store object (`stream_blocks` checks it is what it reads)."""
    from . import is_url

    if not is_url(src):
        return os.stat(src).st_size
    url = str(src)
    fs, path = filesystem(url)
    return with_retries(lambda: int(fs.info(path)["size"]), url, "cannot open")


def stream_blocks(src: str | os.PathLike[str], what: str = "file", size: int | None = None) -> Iterator[bytes]:
    """A local file or a store object, read front to back in STREAM_BLOCK blocks (a store object
    through fsspec, uncached, so at most one block is held); the bytes are checked to add up to its
    size (`size`, when the caller has it from `stream_size`, else asked here), so an object changed
    or cut meanwhile is an error, not a short copy."""
    from . import is_url

    if size is None:
        size = stream_size(src)
    if is_url(src):
        url = str(src)
        fs, path = filesystem(url)
        f = with_retries(lambda: fs.open(path, "rb", block_size=STREAM_BLOCK, cache_type="none"), url, "cannot open")
    else:
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


def copy_companion(src: str | os.PathLike[str], sink: BinaryIO, size: int | None = None) -> None:
    """Copy a companion file, local or on a store, into `sink` (`fs.stream_blocks`: byte for byte,
    in blocks, checked against its size, `size` if the caller already asked for it)."""
    for block in stream_blocks(src, "companion file", size):
        sink.write(block)
