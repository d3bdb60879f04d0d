"""A server that accepts connections and never answers fails a command within the stated bound
(issue 41, 8): one read timeout per request, never a second request after a timeout (fsspec's http
`info` asked again with a GET after its HEAD timed out: 60 s where the documented timeout says 30).

No clock is read: the requests made are counted (fsspec's `_file_info`, the one place a HEAD or an
info GET is sent) and the whole run is bounded by SIGALRM."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp")

from tests.support.alarm import alarm
from tests.support.store import cli


@pytest.fixture
def silent() -> Iterator[str]:
    """A listening socket that never calls accept: the kernel completes the connection, nobody answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The policy ('head' or 'get') of every info request sent."""
    import fsspec.implementations.http as http

    made: list[str] = []
    real = http._file_info

    async def counted(url: str, session: Any, size_policy: str = "head", **kwargs: Any) -> Any:
        made.append(size_policy)
        return await real(url, session, size_policy=size_policy, **kwargs)

    monkeypatch.setattr(http, "_file_info", counted)
    return made


@pytest.mark.parametrize("args", [["inspect", "-"], ["convert", "-", "out.safetensors"]])
def test_a_silent_server_costs_one_timeout(silent: str, asked: list[str], monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path, args: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MIGRATOR_REMOTE_TIMEOUT", "0.5")
    monkeypatch.setenv("MIGRATOR_REMOTE_REQUEST_TIMEOUT", "30")
    monkeypatch.setenv("MIGRATOR_REMOTE_RETRIES", "4")  # a timeout is not retried, whatever the retries
    url = silent + "/m.safetensors"
    with alarm(30, "a silent server hung migrate"):
        p = cli(*[url if a == "-" else a for a in args], check=1)
    out = p.stdout + p.stderr
    assert "timed out" in out and "attempts" not in out, out
    assert asked == ["head"], asked  # one request, one read timeout: within the stated 30 s by default
    assert not (tmp_path / "out.safetensors").exists()
