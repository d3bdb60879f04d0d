"""Servers that misbehave on purpose: one that never answers, one that stops after the headers, one
that drips a byte at a time, one that ignores `Range` and sends the whole (huge) object, one that
sends more than the range asked. Every read of migrator must end with a clear error naming the URL
(redacted) within the timeouts the test sets, or give the right bytes, and never read more than a
bounded amount beyond what it asked.

The servers run on 127.0.0.1 in threads of this process and stop on an event the test sets; the test
synchronises on events (a request arrived, the response ended), never on sleeps. `alarm` only turns
a hang into a failure. Oracles: the `safetensors` library's bytes, and the server's own count of the
bytes it managed to send.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import threading
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("aiohttp")
st_numpy = pytest.importorskip("safetensors.numpy")

import migrator  # noqa: E402
from migrator.core.errors import MigratorError  # noqa: E402
from tests.support.alarm import alarm  # noqa: E402
from tests.support.store import cli  # noqa: E402

BIG = 256 << 20  # the object a Range-ignoring server sends whole: never held by the client


def big_safetensors_header() -> bytes:
    """A SafeTensors header for one U8 tensor of BIG - header bytes (the data is zeros, made as sent)."""
    def header(n: int) -> bytes:
        meta = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
        meta += b" " * (-len(meta) % 8)
        return struct.pack("<Q", len(meta)) + meta

    size = len(header(BIG))
    return header(BIG - size)


@dataclass
class Misbehaviour:
    mode: str  # "stall" (headers, then nothing), "drip" (a byte at a time), "whole" (ignores Range), "longer"
    head: bytes = b""  # the object's first bytes (the rest are zeros)
    size: int = BIG
    stop: threading.Event = field(default_factory=threading.Event)
    got_request: threading.Event = field(default_factory=threading.Event)
    sent: int = 0  # body bytes the server managed to hand to the socket
    lock: threading.Lock = field(default_factory=threading.Lock)


_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


def handler_for(b: Misbehaviour) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(b.size))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()

        def _body(self, start: int, n: int) -> Iterator[bytes]:
            pos = start
            while pos < start + n:
                k = min(64 << 10, start + n - pos)
                head = b.head[pos:pos + k] if pos < len(b.head) else b""
                yield head + bytes(k - len(head))
                pos += k

        def do_GET(self) -> None:
            b.got_request.set()
            m = _RANGE.match(self.headers.get("Range", ""))
            start, end = (int(m.group(1)), int(m.group(2)) + 1) if m and m.group(2) else (0, b.size)
            try:
                if b.mode == "whole":  # a 200 with every byte, whatever was asked
                    self.send_response(200)
                    self.send_header("Content-Length", str(b.size))
                    self.end_headers()
                    self._send(self._body(0, b.size))
                elif b.mode == "longer":  # a 206 that runs on past the range to the object's end
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{b.size - 1}/{b.size}")
                    self.send_header("Content-Length", str(b.size - start))
                    self.end_headers()
                    self._send(self._body(start, b.size - start))
                else:
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{b.size}")
                    self.send_header("Content-Length", str(end - start))
                    self.end_headers()
                    self.wfile.flush()
                    if b.mode == "stall":
                        b.stop.wait()
                    else:  # drip: one byte, then another whenever the test has not stopped us
                        for chunk in self._body(start, end - start):
                            for i in range(len(chunk)):
                                self._send([chunk[i:i + 1]])
                                if b.stop.wait(0.2):
                                    return
            except OSError:  # the client hung up: what a bounded reader does
                pass
            self.close_connection = True

        def _send(self, chunks: Any) -> None:
            for chunk in chunks:
                if b.stop.is_set():
                    return
                self.wfile.write(chunk)
                self.wfile.flush()
                with b.lock:
                    b.sent += len(chunk)

    return Handler


@pytest.fixture
def misbehaving(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A factory: `misbehaving(Misbehaviour(...))` starts a server for it and returns its base URL."""
    monkeypatch.setenv("MIGRATOR_REMOTE_BACKOFF", "0")
    monkeypatch.setenv("MIGRATOR_REMOTE_RETRIES", "1")
    servers: list[tuple[ThreadingHTTPServer, Misbehaviour]] = []

    def start(b: Misbehaviour) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(b))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append((server, b))
        host, port = server.server_address[:2]
        return f"http://{host}:{port}"

    yield start
    for server, b in servers:
        b.stop.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def silent() -> Iterator[str]:
    """A server that accepts connections (the kernel completes them: a listening socket that never
    calls accept) and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()


def small_timeouts(monkeypatch: pytest.MonkeyPatch, read: str = "0.5", request: str = "2") -> None:
    monkeypatch.setenv("MIGRATOR_REMOTE_TIMEOUT", read)
    monkeypatch.setenv("MIGRATOR_REMOTE_REQUEST_TIMEOUT", request)


# ------------------------------------------------------------------------------- timeouts


@pytest.mark.parametrize("args", [["inspect"], ["inspect", "--json"], ["convert", "-", "out.safetensors"]])
def test_a_server_that_never_answers_times_out_naming_the_url(silent: str, monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path, args: list[str]) -> None:
    monkeypatch.setenv("MIGRATOR_REMOTE_RETRIES", "1")
    monkeypatch.chdir(tmp_path)
    small_timeouts(monkeypatch)
    url = silent.replace("http://", "http://bob:pa@ss@") + "/m.safetensors?sig=s3cr3t"
    argv = [url if a == "-" else a for a in args] + ([url] if args[0] == "inspect" else [])
    with alarm(60, "a silent server hung migrate"):
        p = cli(*argv, check=1)
    out = p.stdout + p.stderr
    assert "timed out" in out and "127.0.0.1" in out and "m.safetensors" in out, out
    assert "s3cr3t" not in out and "pa@ss" not in out
    assert "Traceback" not in out and not (tmp_path / "out.safetensors").exists()


@pytest.mark.parametrize("url", ["s3://bucket/m.safetensors", "s3://bucket/folder/"])
def test_an_s3_endpoint_that_never_answers_times_out(silent: str, monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    pytest.importorskip("s3fs")
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": silent}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("MIGRATOR_REMOTE_RETRIES", "1")
    small_timeouts(monkeypatch, read="0.5", request="2")
    with alarm(90, "a silent S3 endpoint hung migrate"):
        p = cli("inspect", url, check=1)
    assert "timed out" in p.stderr and url.rstrip("/") in p.stderr, p.stderr


@pytest.mark.parametrize("target", ["s3://bucket/o.safetensors", "s3://bucket/dir/"])
def test_an_s3_target_on_a_silent_endpoint_times_out(silent: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     target: str) -> None:
    """The target check (a HEAD or a listing) was the request without a deadline: botocore's and s3fs's
    own retries made a silent endpoint cost 25 timeouts per call."""
    pytest.importorskip("s3fs")
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": silent}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    small_timeouts(monkeypatch, read="0.5", request="2")  # the default 4 retries: a timeout is not retried
    monkeypatch.chdir(tmp_path)
    st_numpy.save_file({"w": np.zeros(2, np.float32)}, "m.safetensors")
    extra = ["--max-shard-size", "1KB"] if target.endswith("/") else []
    with alarm(90, "a silent S3 endpoint hung a write"):
        p = cli("convert", "m.safetensors", target, *extra, check=1)
    assert "timed out" in p.stderr and target.rstrip("/") in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert sorted(q.name for q in tmp_path.iterdir()) == ["m.safetensors"]


def test_a_companion_on_a_silent_server_is_a_timeout_not_a_missing_file(silent: str, monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    small_timeouts(monkeypatch)
    monkeypatch.setenv("MIGRATOR_REMOTE_RETRIES", "1")
    monkeypatch.chdir(tmp_path)
    st_numpy.save_file({"w": np.zeros(2, np.float32)}, "m.safetensors")
    with alarm(60, "a silent server hung --copy-from"):
        p = cli("convert", "m.safetensors", "out/", "--copy-from", silent + "/f/", "--copy", "config.json", check=1)
    assert "timed out" in p.stderr and "no file" not in p.stderr and "127.0.0.1" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_a_timeout_is_not_retried_whatever_the_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    from migrator.storage.remote.fs import TIMEOUT_ATTEMPTS, Tuning, with_retries

    calls: list[int] = []

    def silent() -> None:
        calls.append(1)
        raise TimeoutError("no answer")

    def dropped() -> None:
        calls.append(1)
        raise ConnectionResetError("reset")

    tune = Tuning(retries=4, backoff=0)
    for call, attempts in ((silent, TIMEOUT_ATTEMPTS), (dropped, 4)):
        calls.clear()
        with pytest.raises(MigratorError):
            with_retries(call, "http://127.0.0.1:1/m.safetensors", "cannot open", tune)
        assert len(calls) == attempts


def test_the_connect_timeout_is_a_storage_option(monkeypatch: pytest.MonkeyPatch) -> None:
    from migrator.storage.remote.fs import tuning
    from migrator.storage.remote.options import StorageOptions

    monkeypatch.delenv("MIGRATOR_REMOTE_CONNECT_TIMEOUT", raising=False)
    assert tuning().connect_timeout == 10
    options = StorageOptions().adding("http://h/", {"connect_timeout": 3, "timeout": 7})
    t = tuning("http://h/m.safetensors", options)
    assert (t.connect_timeout, t.timeout) == (3, 7)
    monkeypatch.setenv("MIGRATOR_REMOTE_CONNECT_TIMEOUT", "0")
    with pytest.raises(MigratorError, match="MIGRATOR_REMOTE_CONNECT_TIMEOUT"):
        tuning()


@pytest.mark.parametrize("mode", ["stall", "drip"])
def test_headers_then_silence_or_a_drip_times_out(misbehaving: Any, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path, mode: str) -> None:
    small_timeouts(monkeypatch, read="0.5", request="1.5")
    b = Misbehaviour(mode, head=big_safetensors_header())
    url = misbehaving(b) + "/m.safetensors"
    with alarm(60, f"a {mode} server hung migrate"):
        p = cli("inspect", url, check=1)
    assert "timed out" in p.stderr and "/m.safetensors" in p.stderr, p.stderr
    assert b.got_request.is_set()
    with alarm(60, f"a {mode} server hung open_file"), pytest.raises(MigratorError, match="timed out"):
        migrator.open_file(url)


def test_the_timeout_is_a_storage_option_of_a_recipe(misbehaving: Any, monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.delenv("MIGRATOR_REMOTE_TIMEOUT", raising=False)
    b = Misbehaviour("stall", head=big_safetensors_header())
    url = misbehaving(b) + "/m.safetensors"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource:\n  path: '{url}'\n  storage_options: {{timeout: 0.5, request_timeout: 2}}\n"
                      f"target:\n  path: {tmp_path / 'o.safetensors'}\n")
    with alarm(60, "the recipe's timeout was not applied"):
        p = cli("run", str(recipe), check=1)
    assert "send (0.5 s)" in p.stderr and "/m.safetensors" in p.stderr, p.stderr


@pytest.mark.parametrize("value", ["-1", "abc", "0"])
def test_a_bad_timeout_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    from migrator.storage.remote.fs import tuning

    monkeypatch.setenv("MIGRATOR_REMOTE_TIMEOUT", value)
    with pytest.raises(MigratorError, match="MIGRATOR_REMOTE_TIMEOUT"):
        tuning()


def test_default_timeouts_are_documented() -> None:
    from migrator.storage.remote.fs import Tuning

    doc = (Path(__file__).resolve().parents[2] / "docs" / "object-storage.md").read_text()
    t = Tuning()
    assert f"MIGRATOR_REMOTE_TIMEOUT` (default {t.timeout:g} s" in doc
    assert f"MIGRATOR_REMOTE_REQUEST_TIMEOUT` (default {t.request_timeout:g} s" in doc
    assert f"MIGRATOR_REMOTE_CONNECT_TIMEOUT` (default {t.connect_timeout:g} s" in doc


# ------------------------------------------------------------------------------- bounded responses


def test_a_whole_body_for_a_range_is_cut_at_what_was_asked(misbehaving: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    b = Misbehaviour("whole", head=big_safetensors_header())
    url = misbehaving(b) + "/m.safetensors"
    tracemalloc.start()
    try:
        with alarm(120, "reading a whole body"), migrator.open_file(url) as r:
            assert {t.name: t.shape for t in r.tensors} == {"w": (BIG - len(b.head),)}
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak
    assert b.sent < 32 << 20, b.sent  # the client hung up long before the 256 MiB


@pytest.mark.parametrize("mode", ["whole", "longer"])
def test_tensor_bytes_from_a_server_that_ignores_range(misbehaving: Any, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path, mode: str) -> None:
    monkeypatch.setenv("MIGRATOR_REMOTE_BLOCK_SIZE", str(1 << 20))
    rng = np.random.default_rng(10)
    want = {"a": rng.standard_normal(300_000).astype(np.float32), "b": rng.standard_normal(1000).astype(np.float32)}
    data = st_numpy.save(want)
    b = Misbehaviour(mode, head=data, size=len(data))
    url = misbehaving(b) + "/m.safetensors"
    with alarm(120, "reading tensors"):
        p = cli("convert", url, str(tmp_path / "o.safetensors"), check=None)
    if mode == "longer":  # every range starts where asked: the bytes are right, the rest is never read
        assert p.returncode == 0, p.stderr
        got = st_numpy.load_file(str(tmp_path / "o.safetensors"))
        assert all(np.array_equal(got[k], want[k]) for k in want)
    else:  # a 200 for a range that starts later holds the wrong bytes: refused, naming the URL
        assert p.returncode == 1, p.stdout + p.stderr
        assert "ignored the Range" in p.stderr and "/m.safetensors" in p.stderr
        assert not (tmp_path / "o.safetensors").exists()
    assert b.sent < len(data) * 8  # each response cut short (a few socket buffers at most)


@pytest.mark.parametrize("mode", ["whole", "longer"])
def test_an_s3_endpoint_that_ignores_range(misbehaving: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           mode: str) -> None:
    """The same server as an S3-compatible endpoint (path-style requests: it serves any key)."""
    pytest.importorskip("s3fs")
    b = Misbehaviour(mode, head=big_safetensors_header())
    endpoint = misbehaving(b)
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with alarm(120, "reading from a Range-ignoring S3 endpoint"):
        p = cli("inspect", "s3://bucket/m.safetensors", "--json")
        assert json.loads(p.stdout)["tensors"][0]["shape"] == [BIG - len(b.head)]
        if mode == "whole":  # a tensor's bytes from a later offset: refused
            q = cli("convert", "s3://bucket/m.safetensors", str(tmp_path / "o.safetensors"), check=1)
            assert "ignored the Range" in q.stderr and "bucket/m.safetensors" in q.stderr, q.stderr
    assert b.sent < 64 << 20, b.sent  # never the 256 MiB
