"""Azure Blob storage (`az://`) through adlfs, against Azurite's blob service on 127.0.0.1.

Oracles: the arrays the tests made (numpy), the `safetensors` library's loader, and the
azure-storage-blob client's own listing and downloads of blobs. One Azurite serves the module, a
fresh container each test; its development account reaches adlfs only through the environment
(AZURE_STORAGE_CONNECTION_STRING), as a user's credentials would.
"""

from __future__ import annotations

import gc
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("adlfs")
blob = pytest.importorskip("azure.storage.blob")
st_numpy = pytest.importorskip("safetensors.numpy")

import tests.support.remote_servers as remote_servers  # noqa: E402
from tests.support.store import Boom, assert_same, cli, failing_tensor, model  # noqa: E402

azurite = pytest.fixture(scope="module")(remote_servers.azurite_connection_string)

_containers = iter(range(1_000_000))


class Container:
    """A fresh container on Azurite, seen through the azure-storage-blob client (the oracle)."""

    def __init__(self, connection_string: str) -> None:
        service = blob.BlobServiceClient.from_connection_string(connection_string)
        self.name = f"models-{next(_containers)}"
        self.client = service.create_container(self.name)

    def url(self, key: str) -> str:
        return f"az://{self.name}/{key}"

    def put(self, key: str, data: bytes) -> str:
        self.client.upload_blob(key, data)
        return self.url(key)

    def get(self, key: str) -> bytes:
        return self.client.download_blob(key).readall()  # type: ignore[no-any-return]

    def blobs(self) -> list[str]:
        return sorted(b.name for b in self.client.list_blobs())


@pytest.fixture
def az(azurite: str, monkeypatch: pytest.MonkeyPatch) -> Container:
    """A fresh container; Azurite's connection string in the environment, and nothing else of Azure's."""
    import os

    for k in list(os.environ):
        if k.startswith("AZURE_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite)
    monkeypatch.setenv("MIGRATOR_REMOTE_BACKOFF", "0")
    monkeypatch.setenv("MIGRATOR_REMOTE_BLOCK_SIZE", str(1 << 20))
    return Container(azurite)





# ------------------------------------------------------------------------------- az:// source


def test_inspect_matches_the_safetensors_library(az: Container) -> None:
    want = model()
    data = st_numpy.save(want)
    url = az.put("m.safetensors", data)
    doc = json.loads(cli("inspect", url, "--json").stdout)
    got = {t["name"]: (t["dtype"], t["shape"]) for t in doc["tensors"]}
    lib = st_numpy.load(data)
    names = {"float32": "F32", "int64": "I64"}
    assert got == {k: (names[str(v.dtype)], list(v.shape)) for k, v in lib.items()}


def test_convert_az_to_local(az: Container, tmp_path: Path) -> None:
    want = model()
    url = az.put("in/m.safetensors", st_numpy.save(want))
    cli("convert", url, str(tmp_path / "o.safetensors"))
    assert_same(st_numpy.load_file(str(tmp_path / "o.safetensors")), want)
    cli("convert", url, str(tmp_path / "o.bpk"))
    cli("convert", str(tmp_path / "o.bpk"), str(tmp_path / "back.safetensors"))
    assert_same(st_numpy.load_file(str(tmp_path / "back.safetensors")), want)


def test_convert_local_to_az_publishes_only_on_success(az: Container, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The target blob is absent while the bytes go to the scratch blob, present (and the scratch
    gone) once the write succeeded; the blob equals the source tensor for tensor."""
    from migrator.storage.remote import upload

    want = model()
    src = tmp_path / "m.safetensors"
    src.write_bytes(st_numpy.save(want))
    before_publish: list[list[str]] = []
    real = upload.ScratchObjectUpload.publish

    def publish(self: upload.ScratchObjectUpload) -> None:
        before_publish.append(az.blobs())
        real(self)

    monkeypatch.setattr(upload.ScratchObjectUpload, "publish", publish)
    cli("convert", str(src), az.url("out/m.safetensors"))
    assert len(before_publish) == 1 and "out/m.safetensors" not in before_publish[0]
    assert az.blobs() == ["out/m.safetensors"]
    assert_same(st_numpy.load(az.get("out/m.safetensors")), want)


def test_second_write_needs_overwrite(az: Container, tmp_path: Path) -> None:
    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    first.write_bytes(st_numpy.save(model(big=8)))
    second.write_bytes(st_numpy.save(model(seed=1, big=8)))
    url = az.url("m.safetensors")
    cli("convert", str(first), url)
    p = cli("convert", str(second), url, check=1)
    assert "exists" in p.stderr and url in p.stderr
    assert az.get("m.safetensors") == first.read_bytes()
    cli("convert", str(second), url, "--overwrite")
    assert az.get("m.safetensors") == second.read_bytes()
    assert az.blobs() == ["m.safetensors"]


def test_missing_object_and_missing_container(az: Container, tmp_path: Path) -> None:
    for url in (az.url("nope.safetensors"), "az://no-such-container/m.safetensors"):
        p = cli("convert", url, str(tmp_path / "o.bpk"), check=1)
        assert "no such object" in p.stderr and url in p.stderr, p.stderr
        assert "Traceback" not in p.stderr
        assert not (tmp_path / "o.bpk").exists()
        p = cli("inspect", url, check=1)
        assert "no such object" in p.stderr and url in p.stderr, p.stderr


def test_write_into_a_missing_container_is_a_clear_error(az: Container, tmp_path: Path) -> None:
    src = tmp_path / "m.safetensors"
    src.write_bytes(st_numpy.save(model(big=8)))
    url = "az://no-such-container-w/m.safetensors"
    p = cli("convert", str(src), url, check=1)
    assert url in p.stderr and "container does not exist" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and "<?xml" not in p.stderr, p.stderr


def test_wrong_account_key_is_access_denied_at_once(az: Container, azurite: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A 403 is permanent: one request, no retries, "access denied" with the URL (and not the key)."""
    url = az.put("m.safetensors", st_numpy.save(model(big=8)))
    wrong = "A" * 86 + "=="
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.replace(remote_servers.AZURITE_KEY, wrong))
    for args in (("inspect", url), ("convert", url, str(tmp_path / "o.bpk"))):
        p = cli(*args, check=1)
        assert "access denied" in p.stderr and url in p.stderr, p.stderr
        assert "attempts" not in p.stderr and "<?xml" not in p.stderr, p.stderr
        assert wrong not in p.stderr and remote_servers.AZURITE_KEY not in p.stderr


# ------------------------------------------------------------------------------- interrupted writes



@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_interrupted_upload_leaves_no_blob_and_no_scratch(az: Container, exc: type[BaseException]) -> None:
    import migrator

    t = failing_tensor(after=11 << 20, exc=exc)
    with pytest.raises(exc) as info:
        migrator.save([t], az.url("x.safetensors"))
    # nothing may appear later either: the aborted scratch file, once garbage collected, must not be
    # flushed (a buffered fsspec file commits what it holds when it is closed)
    del info, t
    gc.collect()
    assert az.blobs() == []


def test_interrupted_sharded_upload_leaves_nothing(az: Container) -> None:
    import migrator

    ok = migrator.from_numpy("a", np.ones(2 << 20, dtype=np.uint8))
    with pytest.raises(Boom):
        migrator.save([ok, failing_tensor(after=6 << 20)], az.url("part/"), max_shard_size="3MB")
    assert az.blobs() == []  # no index, and the shard that completed is removed again


# ------------------------------------------------------------------------------- model folders


def test_sharded_folder_on_az(az: Container, tmp_path: Path) -> None:
    want = model()
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(st_numpy.save(want))
    config = b'{"model_type": "bert", "hidden_size": 1024}\n'
    (src / "config.json").write_bytes(config)
    folder = az.url("hf/")
    cli("convert", str(src) + "/", folder, "--max-shard-size", "3MB", "--copy", "config.json")
    names = az.blobs()
    assert "hf/model.safetensors.index.json" in names
    index = json.loads(az.get("hf/model.safetensors.index.json"))
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    assert sorted(n for n in names if n.endswith(".safetensors")) == [f"hf/{s}" for s in shards]
    got: dict[str, np.ndarray] = {}
    for shard in shards:
        got |= st_numpy.load(az.get(f"hf/{shard}"))
    assert_same(got, want)
    assert az.get("hf/config.json") == config
    assert not [n for n in names if n.endswith(".tmp")]
    # read back: the folder, its index and a glob
    for i, source in enumerate((folder, folder + "model.safetensors.index.json", folder + "model-*.safetensors")):
        out = tmp_path / f"back{i}.safetensors"
        cli("convert", source, str(out))
        assert_same(st_numpy.load_file(str(out)), want)
    doc = json.loads(cli("inspect", folder, "--json").stdout)  # each tensor names its shard blob
    assert {t["name"]: t["file"] for t in doc["tensors"]} == {
        k: az.url(f"hf/{v}") for k, v in index["weight_map"].items()}
    # companions from a folder on az://, into az:// and into a local folder
    az.put("hf/tokenizer.json", b'{"version": "1.0"}')
    cli("convert", folder, az.url("hf2/"), "--max-shard-size", "4MB", "--copy", "config.json",
        "--copy", "tokenizer*")
    assert az.get("hf2/config.json") == config and az.get("hf2/tokenizer.json") == b'{"version": "1.0"}'
    cli("convert", folder, str(tmp_path / "local") + "/", "--copy", "config.json")
    assert (tmp_path / "local" / "config.json").read_bytes() == config
    # a second write without --overwrite is refused; with it, the folder is replaced
    p = cli("convert", str(src) + "/", folder, "--max-shard-size", "3MB", check=1)
    assert "exists" in p.stderr
    cli("convert", str(src) + "/", folder, "--max-shard-size", "4MB", "--overwrite")
    index = json.loads(az.get("hf/model.safetensors.index.json"))
    shards4 = sorted(set(index["weight_map"].values()))
    assert sorted(n for n in az.blobs() if n.startswith("hf/") and n.endswith(".safetensors")) == [
        f"hf/{s}" for s in shards4]
    got = {}
    for shard in shards4:
        got |= st_numpy.load(az.get(f"hf/{shard}"))
    assert_same(got, want)
    assert not [n for n in az.blobs() if n.endswith(".tmp")]


def test_hash_sources_of_az_objects(az: Container, tmp_path: Path) -> None:
    data = st_numpy.save(model())
    url = az.put("one/m.safetensors", data)
    (tmp_path / "r.yaml").write_text(f"version: 1\nsource: {{path: '{url}'}}\ntarget: {{path: o.safetensors}}\n")
    cli("run", str(tmp_path / "r.yaml"), "--hash-sources", "--no-progress")
    meta = st_numpy.safe_open(str(tmp_path / "o.safetensors"), "np").metadata()
    assert meta["migrator.source_sha256"] == hashlib.sha256(az.get("one/m.safetensors")).hexdigest()
    # a folder on az://: every shard and the index
    cli("convert", url, az.url("hf/"), "--max-shard-size", "3MB")
    (tmp_path / "r.yaml").write_text(f"version: 1\nsource: {{path: '{az.url('hf/')}'}}\n"
                                     "target: {path: many.safetensors}\n")
    cli("run", str(tmp_path / "r.yaml"), "--hash-sources", "--no-progress")
    meta = st_numpy.safe_open(str(tmp_path / "many.safetensors"), "np").metadata()
    files = [k for k in az.blobs() if k.startswith("hf/")]
    assert len(files) > 2
    assert json.loads(meta["migrator.source_files_sha256"]) == {
        k[3:]: hashlib.sha256(az.get(k)).hexdigest() for k in files}


def test_connection_string_is_never_printed(az: Container, azurite: str) -> None:
    p = cli("inspect", az.url("nope.safetensors"), check=1)
    assert remote_servers.AZURITE_KEY not in p.stdout + p.stderr
