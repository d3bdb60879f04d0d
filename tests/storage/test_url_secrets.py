"""URL credentials never leave the process: every place a URL is shown (terminal text, `--json`, the
"wrote" line, `plan`, `diff`, `--each` headings) or stored (`--report` JSON and HTML, `inspect --html`)
shows it redacted: user info as `***@`, the query (presigned signatures, SAS tokens) as `?***`.

The sources are served by a local HTTP server on 127.0.0.1 (tests/remote_servers.py), which ignores
credentials and query; the oracle is the absence of each secret from every byte the command produced.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("aiohttp")
st_numpy = pytest.importorskip("safetensors.numpy")

from migrator.storage.remote import redact  # noqa: E402
from tests.support.remote_servers import HttpServer  # noqa: E402
from tests.support.store import cli  # noqa: E402

SECRET = "hun@ter2"  # the '@' inside the password defeated the old redaction

# (URL suffix after host:port, the secrets it carries): user info, a password with '@', and signed queries of
# S3 (presigned), GCS (signed URL) and Azure (SAS) style whose values hold ':' before the signature
QUERIES = {
    "s3": ("?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F20250101%2Fus-east-1&"
           "X-Amz-Date=20250101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Signature=abc:s3sig",
           ["AKIDEXAMPLE", "s3sig"]),
    "gcs": ("?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=svc%40proj.iam:x&X-Goog-Signature=g5sig",
            ["svc%40proj", "g5sig"]),
    "azure": ("?sv=2022-11-02&se=2030-01-01T00:00:00Z&sr=b&sp=r&sig=azS1G%3D", ["azS1G"]),
}


@pytest.mark.parametrize(("text", "hidden", "kept"), [
    ("http://alice:hun@ter2@host:9/m.safetensors", ["hun", "ter2", "alice"], ["host:9/m.safetensors", "***@"]),
    ("s3://bucket/k?x=1:2&X-Amz-Signature=deadbeef", ["deadbeef"], ["s3://bucket/k?***"]),
    ("https://acct.blob.core.windows.net/c/b?sv=2022&se=2030-01-01T00:00:00Z&sig=Zm9v", ["Zm9v"], ["/c/b?***"]),
    ("https://storage.googleapis.com/b/o?X-Goog-Signature=cafe", ["cafe"], ["/b/o?***"]),
    ("error at 'http://u:p@w@h/x' and 'https://h2/y?sig=a:b' then", ["p@w", "sig=", "a:b"], ["h/x'", "h2/y?***'"]),
    ('{"a":"http://h/x","b":"me@example.org"}', [], ['"http://h/x"', '"me@example.org"']),  # no leap across strings
    ("http://u:p@h/x\nnext: mail a@b", ["u:p"], ["next: mail a@b"]),
])
def test_redact_user_info_and_query(text: str, hidden: list[str], kept: list[str]) -> None:
    shown = redact(text)
    for h in hidden:
        assert h not in shown, shown
    for k in kept:
        assert k in shown, shown


def test_redact_leaves_text_without_urls_alone() -> None:
    for text in ("a@b", "layer.0.weight?", "x: y@z", "C:/models/m.safetensors?"):
        assert redact(text) == text


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[HttpServer, dict[str, np.ndarray]]]:
    monkeypatch.setenv("MIGRATOR_REMOTE_BACKOFF", "0")
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(29)
    weights = {"encoder.weight": rng.standard_normal((8, 4), dtype=np.float32),
               "encoder.bias": rng.standard_normal(4, dtype=np.float32)}
    with HttpServer() as server:
        server.store.objects["/m.safetensors"] = st_numpy.save(weights)
        yield server, weights


def secret_url(server: HttpServer, kind: str) -> tuple[str, list[str]]:
    """The served model's URL carrying credentials of `kind`, and the strings that must never appear."""
    if kind == "userinfo":
        return server.url.replace("http://", f"http://alice:{SECRET}@") + "/m.safetensors", ["hun", "ter2"]
    query, secrets = QUERIES[kind]
    return server.url + "/m.safetensors" + query, secrets


KINDS = ["userinfo", *QUERIES]


def assert_hidden(secrets: list[str], *texts: str) -> None:
    for text in texts:
        for s in secrets:
            assert s not in text, (s, text[:2000])


@pytest.mark.parametrize("kind", KINDS)
def test_inspect_text_json_and_html(served: tuple[HttpServer, dict[str, np.ndarray]], kind: str,
                                    tmp_path: Path) -> None:
    server, _ = served
    url, secrets = secret_url(server, kind)
    text = cli("inspect", url)
    assert "encoder.weight" in text.stdout
    doc = cli("inspect", url, "--json")
    assert json.loads(doc.stdout)["tensors"]
    page = cli("inspect", url, "--html", str(tmp_path / "i.html"))
    assert_hidden(secrets, text.stdout + text.stderr, doc.stdout + doc.stderr, page.stdout + page.stderr,
                  (tmp_path / "i.html").read_text())
    assert "127.0.0.1" in text.stdout and "127.0.0.1" in doc.stdout  # the URL is shown, redacted


@pytest.mark.parametrize("kind", KINDS)
def test_convert_wrote_line_and_json(served: tuple[HttpServer, dict[str, np.ndarray]], kind: str,
                                     tmp_path: Path) -> None:
    server, weights = served
    url, secrets = secret_url(server, kind)
    p = cli("convert", url, str(tmp_path / "a.safetensors"))
    assert "wrote" in p.stdout
    q = cli("convert", url, str(tmp_path / "b.safetensors"), "--json")
    assert json.loads(q.stdout)["tensors"] == 2
    assert_hidden(secrets, p.stdout + p.stderr, q.stdout + q.stderr)
    got = st_numpy.load_file(str(tmp_path / "a.safetensors"))
    assert all(np.array_equal(got[k], weights[k]) for k in weights)


@pytest.mark.parametrize("kind", KINDS)
def test_plan_run_report_and_each(served: tuple[HttpServer, dict[str, np.ndarray]], kind: str,
                                  tmp_path: Path) -> None:
    server, _ = served
    url, secrets = secret_url(server, kind)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource:\n  path: '{url}'\ntarget:\n  path: out.safetensors\n")
    outputs = [cli("plan", str(recipe)), cli("plan", str(recipe), "--json"),
               cli("plan", str(recipe), "--html", str(tmp_path / "p.html")),
               cli("validate", str(recipe), "--json"),
               cli("run", str(recipe), "--report", str(tmp_path / "r.json"), "--json"),
               cli("run", str(recipe), "--overwrite", "--report", str(tmp_path / "r.html"), "--hash-sources"),
               cli("run", str(recipe), "--each", url, "--target", str(tmp_path / "each/{i}.safetensors"),
                   "--report", str(tmp_path / "each.json")),
               cli("run", str(recipe), "--each", url, "--target", str(tmp_path / "each/{i}.safetensors"),
                   "--overwrite", "--json")]
    assert "[1/1]" in outputs[6].stdout  # the --each heading names the source
    assert_hidden(secrets, *(p.stdout + p.stderr for p in outputs),
                  *(f.read_text() for f in (tmp_path / "p.html", tmp_path / "r.json", tmp_path / "r.html",
                                            tmp_path / "each.json")))
    assert json.loads((tmp_path / "r.json").read_text())["status"]
    with open(tmp_path / "out.safetensors", "rb") as f:  # the output's metadata (--hash-sources) names the source
        header = f.read(int.from_bytes(f.read(8), "little"))
    assert b"migrator.source_sha256" in header
    assert_hidden(secrets, header.decode())


@pytest.mark.parametrize("kind", KINDS)
def test_diff_text_json_and_html(served: tuple[HttpServer, dict[str, np.ndarray]], kind: str,
                                 tmp_path: Path) -> None:
    server, weights = served
    url, secrets = secret_url(server, kind)
    changed = dict(weights, **{"encoder.bias": weights["encoder.bias"] + 1})
    st_numpy.save_file(changed, str(tmp_path / "b.safetensors"))
    outputs = [cli("diff", url, str(tmp_path / "b.safetensors"), "--all", check=1),
               cli("diff", url, str(tmp_path / "b.safetensors"), "--json", check=1),
               cli("diff", url, str(tmp_path / "b.safetensors"), "--html", str(tmp_path / "d.html"), check=1)]
    assert json.loads(outputs[1].stdout)["tensors"]
    assert_hidden(secrets, *(p.stdout + p.stderr for p in outputs), (tmp_path / "d.html").read_text())


@pytest.mark.parametrize("kind", KINDS)
def test_errors_about_a_missing_object(served: tuple[HttpServer, dict[str, np.ndarray]], kind: str) -> None:
    server, _ = served
    url, secrets = secret_url(server, kind)
    url = url.replace("/m.safetensors", "/none.safetensors")
    outputs = [cli("inspect", url, check=1), cli("inspect", url, "--json", check=1),
               cli("convert", url, "o.safetensors", "--json", check=1), cli("diff", url, url, "--json", check=1)]
    assert_hidden(secrets, *(p.stdout + p.stderr for p in outputs))
