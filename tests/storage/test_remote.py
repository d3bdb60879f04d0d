"""Object storage: S3 through moto's server on 127.0.0.1, http(s) through a local Range server.

Oracles: the arrays the tests made (numpy), the `safetensors` library's loader, torch.load, boto3's
own listing of objects and multipart uploads. Misbehaving servers are deterministic (by request
count); retries run without back-off (MIGRATOR_REMOTE_BACKOFF=0).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")
boto3 = pytest.importorskip("boto3")
st_numpy = pytest.importorskip("safetensors.numpy")

import tests.support.remote_servers as remote_servers  # noqa: E402
from migrator.core.errors import MigratorError  # noqa: E402
from tests.support.remote_servers import Behaviour, HttpServer  # noqa: E402
from tests.support.store import Boom, assert_same, cli, failing_tensor, model  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PART = 5 << 20  # S3's smallest part


moto_endpoint = pytest.fixture(scope="module")(remote_servers.moto_endpoint)


_buckets = iter(range(1_000_000))


@pytest.fixture
def s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh bucket (`s3.bucket`) on the moto server; dummy credentials in the environment."""
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": moto_endpoint,
                 "MIGRATOR_REMOTE_BACKOFF": "0", "MIGRATOR_REMOTE_BLOCK_SIZE": str(1 << 20),
                 "MIGRATOR_REMOTE_PART_SIZE": str(PART)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    client = boto3.client("s3", endpoint_url=moto_endpoint)
    client.bucket = f"models-{next(_buckets)}"
    client.create_bucket(Bucket=client.bucket)
    return client




def put(s3: Any, key: str, data: bytes) -> str:
    s3.put_object(Bucket=s3.bucket, Key=key, Body=data)
    return f"s3://{s3.bucket}/{key}"


def get(s3: Any, key: str) -> bytes:
    return s3.get_object(Bucket=s3.bucket, Key=key)["Body"].read()  # type: ignore[no-any-return]


def keys(s3: Any) -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=s3.bucket).get("Contents", []))


def uploads(s3: Any) -> list[Any]:
    return s3.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])  # type: ignore[no-any-return]



# ------------------------------------------------------------------------------- S3 source


def test_inspect_remote_safetensors_matches_library(s3: Any, tmp_path: Path) -> None:
    want = model()
    url = put(s3, "m.safetensors", st_numpy.save(want))
    p = cli("inspect", url, "--json")
    got = {t["name"]: t for t in json.loads(p.stdout)["tensors"]}
    assert {k: (v["dtype"], v["shape"]) for k, v in got.items()} == {
        "encoder.weight": ("F32", [1536, 1024]), "encoder.bias": ("F32", [1024]), "steps": ("I64", [7])}


def test_convert_s3_to_local_equals_local_convert(s3: Any, tmp_path: Path) -> None:
    want = model()
    data = st_numpy.save(want)
    url = put(s3, "m.safetensors", data)
    cli("convert", url, str(tmp_path / "r.safetensors"))
    assert_same(st_numpy.load_file(str(tmp_path / "r.safetensors")), want)
    (tmp_path / "m.safetensors").write_bytes(data)
    cli("convert", url, str(tmp_path / "r.bpk"))
    cli("convert", str(tmp_path / "m.safetensors"), str(tmp_path / "l.bpk"))
    assert (tmp_path / "r.bpk").read_bytes() == (tmp_path / "l.bpk").read_bytes()


def test_pass_through_never_fetches_a_tensor_whole(s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import migrator
    from migrator.storage.remote.source import RemoteSource

    want = model()
    url = put(s3, "m.safetensors", st_numpy.save(want))

    def whole(self: RemoteSource, offset: int, length: int) -> memoryview:
        raise AssertionError(f"fetched [{offset}, {offset + length}) whole")

    with migrator.open_file(url) as r:
        monkeypatch.setattr(RemoteSource, "view", whole)
        migrator.save(r.tensors, tmp_path / "out.safetensors")
    assert_same(st_numpy.load_file(str(tmp_path / "out.safetensors")), want)


def test_pytorch_zip_from_s3(s3: Any, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    sd = {"fc.weight": torch.randn(300, 200), "fc.bias": torch.randn(300), "n": torch.tensor(3)}
    buf = io.BytesIO()
    torch.save(sd, buf)
    url = put(s3, "ckpt.pt", buf.getvalue())
    cli("convert", url, str(tmp_path / "c.safetensors"))
    got = st_numpy.load_file(str(tmp_path / "c.safetensors"))
    assert_same(got, {k: v.numpy() for k, v in sd.items()})


def test_run_recipe_s3_to_s3_with_storage_options_and_cast(s3: Any, tmp_path: Path, moto_endpoint: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    want = model()
    url = put(s3, "in/m.safetensors", st_numpy.save(want))
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # the recipe's storage_options name the endpoint
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"""version: 1
source: {{path: '{url}', storage_options: {{endpoint_url: '{moto_endpoint}'}}}}
dtype: {{cast: F16}}
target:
  path: s3://{s3.bucket}/out/m16.safetensors
  storage_options: {{endpoint_url: '{moto_endpoint}'}}
""")
    p = cli("run", str(recipe), "--report", str(tmp_path / "rep.json"))
    assert "m16.safetensors" in p.stdout + p.stderr
    got = st_numpy.load(get(s3, "out/m16.safetensors"))
    assert_same(got, {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in want.items()})
    assert json.loads((tmp_path / "rep.json").read_text())["status"] == "ok"
    # validate and plan see the target object now exists (overwrite is off); run refuses it
    for command in ("validate", "plan"):
        p = cli(command, str(recipe), check=None)
        assert "exists" in p.stdout + p.stderr, (command, p.stdout, p.stderr)
    p = cli("run", str(recipe), check=1)
    assert "exists" in p.stderr


def test_recipe_refuses_secret_storage_options(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nsource:\n  path: s3://b/m.safetensors\n"
                      "  storage_options: {endpoint_url: 'http://x', aws_secret_access_key: abc}\n"
                      "target: {path: out.bpk}\n")
    p = cli("validate", str(recipe), check=2)
    assert "r.yaml:4:" in p.stdout + p.stderr and "environment" in p.stdout + p.stderr
    assert "abc" not in p.stdout + p.stderr


def test_missing_object_and_bucket(s3: Any, tmp_path: Path) -> None:
    p = cli("convert", f"s3://{s3.bucket}/nope.safetensors", str(tmp_path / "o.bpk"), check=1)
    assert "no such object" in p.stderr and f"s3://{s3.bucket}/nope.safetensors" in p.stderr
    assert not (tmp_path / "o.bpk").exists()


def test_truncated_object_names_the_url(s3: Any, tmp_path: Path) -> None:
    data = st_numpy.save(model())
    url = put(s3, "cut.safetensors", data[: len(data) - 1000])
    p = cli("convert", url, str(tmp_path / "o.bpk"), check=1)
    assert url in p.stderr
    assert not (tmp_path / "o.bpk").exists()


# ------------------------------------------------------------------------------- S3 target


def test_convert_local_to_s3_multipart(s3: Any, tmp_path: Path) -> None:
    want = model(big=4096)  # 16 MiB: four parts
    src = tmp_path / "m.safetensors"
    src.write_bytes(st_numpy.save(want))
    url = f"s3://{s3.bucket}/out/m.safetensors"
    cli("convert", str(src), url)
    obj = s3.head_object(Bucket=s3.bucket, Key="out/m.safetensors")
    assert obj["ETag"].strip('"').endswith("-4")  # a multipart object of four parts
    assert_same(st_numpy.load(get(s3, "out/m.safetensors")), want)
    assert uploads(s3) == []
    # no overwrite: refused, the object unchanged; --overwrite replaces it
    other = tmp_path / "o.safetensors"
    other.write_bytes(st_numpy.save(model(seed=1)))
    p = cli("convert", str(other), url, check=1)
    assert "exists" in p.stderr
    assert_same(st_numpy.load(get(s3, "out/m.safetensors")), want)
    cli("convert", str(other), url, "--overwrite")
    assert_same(st_numpy.load(get(s3, "out/m.safetensors")), model(seed=1))
    assert uploads(s3) == []



@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_interrupted_upload_leaves_no_object_and_no_parts(s3: Any, exc: type[BaseException],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import migrator

    t = failing_tensor(after=11 << 20, exc=exc)
    with pytest.raises(exc):
        migrator.save([t], f"s3://{s3.bucket}/x.safetensors")
    assert keys(s3) == []
    assert uploads(s3) == []


def test_conditional_publish_refuses_a_racing_writer(s3: Any) -> None:
    """If-None-Match: * on CompleteMultipartUpload: an object created while the upload ran survives."""
    from migrator.core.errors import TargetExistsError
    from migrator.storage.remote.upload import remote_output

    url = f"s3://{s3.bucket}/race.bin"
    with pytest.raises(TargetExistsError), remote_output(url, expected_size=6 << 20) as sink:
        sink.write(bytes(6 << 20))  # one part sent
        s3.put_object(Bucket=s3.bucket, Key="race.bin", Body=b"theirs")
    assert get(s3, "race.bin") == b"theirs"
    assert uploads(s3) == []


def test_sharded_target_on_s3_index_last_and_read_back(s3: Any, tmp_path: Path) -> None:
    want = model()
    src = tmp_path / "m.safetensors"
    src.write_bytes(st_numpy.save(want))
    folder = f"s3://{s3.bucket}/hf/"
    cli("convert", str(src), folder, "--max-shard-size", "3MB")
    names = keys(s3)
    assert "hf/model.safetensors.index.json" in names
    index = json.loads(get(s3, "hf/model.safetensors.index.json"))
    got: dict[str, np.ndarray] = {}
    for shard in sorted(set(index["weight_map"].values())):
        got |= st_numpy.load(get(s3, f"hf/{shard}"))
    assert_same(got, want)
    assert set(index["weight_map"].values()) == {n[3:] for n in names if n.endswith(".safetensors")}
    # read back: the folder, the index and a glob
    for source in (folder, folder + "model.safetensors.index.json", folder + "model-*.safetensors"):
        out = tmp_path / f"back{len(source)}.safetensors"
        cli("convert", source, str(out))
        assert_same(st_numpy.load_file(str(out)), want)
    doc = json.loads(cli("inspect", folder, "--json").stdout)  # each tensor names its shard object
    assert {t["name"]: t["file"] for t in doc["tensors"]} == {
        k: f"s3://{s3.bucket}/hf/{v}" for k, v in index["weight_map"].items()}
    # a second write without --overwrite is refused
    p = cli("convert", str(src), folder, "--max-shard-size", "3MB", check=1)
    assert "exists" in p.stderr


def test_interrupted_sharded_upload_leaves_no_index(s3: Any) -> None:
    import migrator

    ok = migrator.from_numpy("a", np.ones(2 << 20, dtype=np.uint8))
    with pytest.raises(Boom):
        migrator.save([ok, failing_tensor(after=6 << 20)], f"s3://{s3.bucket}/part/", max_shard_size="3MB")
    assert keys(s3) == []  # no index, and the shard that completed is removed again
    assert uploads(s3) == []


# ------------------------------------------------------------------------------- http(s)


@pytest.fixture
def http(monkeypatch: pytest.MonkeyPatch) -> Iterator[HttpServer]:
    monkeypatch.setenv("MIGRATOR_REMOTE_BACKOFF", "0")
    monkeypatch.setenv("MIGRATOR_REMOTE_RETRIES", "3")
    monkeypatch.setenv("MIGRATOR_REMOTE_BLOCK_SIZE", str(1 << 20))
    with HttpServer() as server:
        yield server


def test_http_header_requests(http: HttpServer, tmp_path: Path) -> None:
    import migrator

    small = st_numpy.save(model())
    many = st_numpy.save({f"layer.{i}.weight": np.full(4, i, np.float32) for i in range(3000)})  # ~200 KiB header
    http.store.objects |= {"/small.safetensors": small, "/many.safetensors": many}
    (tmp_path / "s.safetensors").write_bytes(small)
    from migrator.run.convert import convert

    convert(tmp_path / "s.safetensors", tmp_path / "s.bpk")
    http.store.objects["/s.bpk"] = (tmp_path / "s.bpk").read_bytes()
    for name, most in (("/small.safetensors", 1), ("/many.safetensors", 2), ("/s.bpk", 2)):
        with migrator.open_file(http.url + name) as r:
            assert len(r.tensors) in (3, 3000)
        assert http.store.gets[name] <= most, (name, http.store.gets[name])


def test_http_source_convert_and_read_only(http: HttpServer, tmp_path: Path) -> None:
    want = model()
    http.store.objects["/m.safetensors"] = st_numpy.save(want)
    cli("convert", http.url + "/m.safetensors", str(tmp_path / "o.safetensors"))
    assert_same(st_numpy.load_file(str(tmp_path / "o.safetensors")), want)
    p = cli("convert", str(tmp_path / "o.safetensors"), http.url + "/up.safetensors", check=1)
    assert "read-only" in p.stderr


def test_http_dropped_connections_are_retried(http: HttpServer, tmp_path: Path) -> None:
    want = model()
    http.store.objects["/m.safetensors"] = st_numpy.save(want)
    http.store.behaviour["/m.safetensors"] = Behaviour(drop_after=1000, drop_first=2)
    cli("convert", http.url + "/m.safetensors", str(tmp_path / "o.safetensors"))
    assert_same(st_numpy.load_file(str(tmp_path / "o.safetensors")), want)
    assert http.store.gets["/m.safetensors"] >= 3


def test_http_connection_that_keeps_dropping_is_a_clear_error(http: HttpServer, tmp_path: Path) -> None:
    http.store.objects["/m.safetensors"] = st_numpy.save(model())
    http.store.behaviour["/m.safetensors"] = Behaviour(drop_after=1000, drop_first=10 ** 6)
    p = cli("convert", http.url + "/m.safetensors", str(tmp_path / "o.safetensors"), check=1)
    assert "/m.safetensors" in p.stderr and "after 3 attempts" in p.stderr
    assert not (tmp_path / "o.safetensors").exists()


def test_http_403_and_404(http: HttpServer, tmp_path: Path) -> None:
    http.store.objects["/secret.safetensors"] = st_numpy.save(model())
    http.store.behaviour["/secret.safetensors"] = Behaviour(status=403)
    p = cli("inspect", http.url + "/secret.safetensors", check=1)
    assert "access denied" in p.stderr
    p = cli("inspect", http.url + "/none.safetensors", check=1)
    assert "no such object" in p.stderr


def test_http_truncated_object_is_a_length_error(http: HttpServer, tmp_path: Path) -> None:
    data = st_numpy.save(model())
    http.store.objects["/cut.safetensors"] = data[: len(data) - 4096]
    http.store.behaviour["/cut.safetensors"] = Behaviour(claimed_size=len(data))
    p = cli("convert", http.url + "/cut.safetensors", str(tmp_path / "o.safetensors"), check=1)
    assert "object ended early" in p.stderr and "/cut.safetensors" in p.stderr


def test_credentials_in_urls_are_never_printed(http: HttpServer) -> None:
    url = http.url.replace("http://", "http://alice:hunter2@") + "/none.safetensors"
    p = cli("inspect", url, check=1)
    assert "hunter2" not in p.stdout + p.stderr and "***@" in p.stderr
    p = cli("inspect", url, "--json", check=1)
    assert "hunter2" not in p.stdout + p.stderr
    p = cli("inspect", http.url + "/none.safetensors?X-Amz-Signature=s3cr3t", check=1)
    assert "s3cr3t" not in p.stdout + p.stderr and "?***" in p.stderr


# ------------------------------------------------------------------------------- packaging


def test_missing_protocol_package_names_the_extra(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['gcsfs'] = None; from migrator.cli import main; "
            "sys.exit(main(['inspect', 'gs://bucket/m.safetensors']))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert p.returncode == 1 and "pip install 'migrator[gcs]'" in p.stderr, p.stderr
    code = code.replace("'gcsfs'", "'fsspec'").replace("gs://", "s3://")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert p.returncode == 1 and "pip install 'migrator[s3]'" in p.stderr, p.stderr


def test_local_paths_never_import_fsspec(tmp_path: Path) -> None:
    (tmp_path / "m.safetensors").write_bytes(st_numpy.save(model(big=4)))
    code = ("import sys; from migrator.cli import main; rc = main(['convert', sys.argv[1], sys.argv[2]]); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('fsspec', 's3fs', 'aiohttp', 'botocore') "
            "or m.startswith('migrator.storage.remote.')); print(bad); sys.exit(rc or bool(bad))")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.safetensors"), str(tmp_path / "m.bpk")],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_memory_protocol_round_trip() -> None:
    pytest.importorskip("fsspec")
    import migrator

    want = model(big=8)
    arrays = [migrator.from_numpy(k, v) for k, v in want.items()]
    url = migrator.save(arrays, "memory://migrator-test/m.safetensors", overwrite=True)
    import fsspec

    assert_same(st_numpy.load(fsspec.filesystem("memory").cat_file("/migrator-test/m.safetensors")), want)
    with pytest.raises(MigratorError, match="exists"):
        migrator.save(arrays, url)
    assert fsspec.filesystem("memory").glob("/migrator-test/*.tmp") == []


def test_sequential_stream_mode_reads_the_file_in_one_get(s3: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """MIGRATOR_REMOTE_CONCURRENCY=1: one open-ended GET after the header's, per thread reading."""
    import migrator
    from migrator.run.convert import convert

    monkeypatch.setenv("MIGRATOR_REMOTE_CONCURRENCY", "1")
    want = model()
    url = put(s3, "m.safetensors", st_numpy.save(want))
    with migrator.open_file(url) as r:
        migrator.save(r.tensors, tmp_path / "o.safetensors")
        assert r.source.requests == 2  # the header block, then the data front to back
    assert_same(st_numpy.load_file(str(tmp_path / "o.safetensors")), want)
    convert(url, tmp_path / "o16.safetensors", dtype="F16")  # casts computed ahead read their own stream
    assert_same(st_numpy.load_file(str(tmp_path / "o16.safetensors")),
                {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in want.items()})


def test_diff_remote_against_local(s3: Any, tmp_path: Path) -> None:
    """`migrate diff` reads a remote side like a local one: identical after a round trip, and a changed
    value found at the index numpy finds."""
    want = model()
    url = put(s3, "m.safetensors", st_numpy.save(want))
    cli("convert", url, str(tmp_path / "m.bpk"))
    doc = json.loads(cli("diff", url, str(tmp_path / "m.bpk"), "--json").stdout)
    assert doc["summary"]["identical"] == 3
    changed = {**want, "encoder.weight": want["encoder.weight"].copy()}
    changed["encoder.weight"][1000, 3] += 1
    url2 = put(s3, "m2.safetensors", st_numpy.save(changed))
    doc = json.loads(cli("diff", str(tmp_path / "m.bpk"), url2, "--json", check=1).stdout)
    got = {t["name"] if "name" in t else t["a_name"]: t for t in doc["tensors"]}
    w = got["encoder.weight"]
    assert w["status"] == "different" and w["differing"] == 1
    assert w["first_index"] == [int(i) for i in np.argwhere(changed["encoder.weight"] != want["encoder.weight"])[0]]


def test_reading_after_close_is_an_error(s3: Any) -> None:
    import migrator
    from migrator.core.errors import ReaderClosedError

    url = put(s3, "m.safetensors", st_numpy.save(model(big=8)))
    with migrator.open_file(url) as r:
        t = r["encoder.weight"]
    with pytest.raises(ReaderClosedError):
        t.numpy()


def test_part_size_grows_to_stay_within_10000_parts() -> None:
    from migrator.storage.remote.fs import Tuning
    from migrator.storage.remote.upload import S3Upload

    class _Fs:
        def split_path(self, path: str) -> tuple[str, str, None]:
            return ("b", "k", None)

    import migrator.storage.remote.upload as up

    real = up.filesystem
    up.filesystem = lambda url, storage=None: (_Fs(), "b/k")  # type: ignore[assignment]
    try:
        tune = Tuning(part_size=16 << 20)
        assert S3Upload("s3://b/k", False, tune, 1 << 30).part_size == 16 << 20
        big = 300 << 30  # 300 GiB: 16 MiB parts would be 19,200 of them
        size = S3Upload("s3://b/k", False, tune, big).part_size
        assert -(-big // size) <= 10_000 and size % (1 << 20) == 0
    finally:
        up.filesystem = real  # type: ignore[assignment]


def test_sources_entries_may_be_urls(s3: Any, tmp_path: Path, moto_endpoint: str,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`sources:` with an S3 entry (its own storage_options) and a local one, joined into one file."""
    a = {"x.weight": np.arange(6, dtype=np.float32).reshape(2, 3)}
    b = {"y.weight": np.ones((4,), dtype=np.int64)}
    url = put(s3, "a.safetensors", st_numpy.save(a))
    (tmp_path / "b.safetensors").write_bytes(st_numpy.save(b))
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"""version: 1
sources:
  - {{path: '{url}', name: a, storage_options: {{endpoint_url: '{moto_endpoint}'}}}}
  - {{path: b.safetensors, name: b}}
target: {{path: out.safetensors}}
""")
    cli("run", str(recipe))
    assert_same(st_numpy.load_file(str(tmp_path / "out.safetensors")), a | b)


def test_workers_with_an_s3_target_upload_it(s3: Any, tmp_path: Path) -> None:
    """`--workers` writes local files in parallel ranges; an S3 target is one streamed upload instead."""
    want = model()
    (tmp_path / "m.safetensors").write_bytes(st_numpy.save(want))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource: {{path: m.safetensors}}\ntarget: {{path: 's3://{s3.bucket}/w.safetensors'}}\n")
    cli("run", str(recipe), "--workers", "2")
    assert_same(st_numpy.load(get(s3, "w.safetensors")), want)
    assert uploads(s3) == []


def test_companion_files_are_copied_from_a_store_folder(s3: Any, tmp_path: Path) -> None:
    """`--copy` / target.copy with the source folder on S3, into a local folder and into a folder on
    S3: each companion equal to the bytes put there; a large one is streamed in blocks and parts."""
    want = model()
    src = tmp_path / "m.safetensors"
    src.write_bytes(st_numpy.save(want))
    cli("convert", str(src), f"s3://{s3.bucket}/hf/", "--max-shard-size", "3MB")
    rng = np.random.default_rng(7)
    companions = {"config.json": b'{"model_type": "bert"}\n', "tokenizer.json": b'{"version": "1.0"}',
                  "tokenizer.model": rng.bytes(12 << 20),  # over one copy block and over one upload part
                  "sub/special_tokens_map.json": b"{}"}
    for name, data in companions.items():
        put(s3, f"hf/{name}", data)
    copies = ("--copy", "config.json", "--copy", "tokenizer*", "--copy", "sub/*.json")
    cli("convert", f"s3://{s3.bucket}/hf/", str(tmp_path / "out") + "/", "--max-shard-size", "4MB", *copies)
    for name, data in companions.items():
        assert (tmp_path / "out" / name).read_bytes() == data, name
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    got: dict[str, np.ndarray] = {}
    for shard in set(index["weight_map"].values()):
        got |= st_numpy.load_file(str(tmp_path / "out" / shard))
    assert_same(got, want)

    cli("convert", f"s3://{s3.bucket}/hf/", f"s3://{s3.bucket}/hf2/", "--max-shard-size", "4MB", *copies)
    for name, data in companions.items():
        assert get(s3, f"hf2/{name}") == data, name
    assert "hf2/model.safetensors.index.json" in keys(s3) and not uploads(s3)

    (tmp_path / "r.yaml").write_text(f"version: 1\nsource: {{path: 's3://{s3.bucket}/hf/'}}\n"
                                     "target: {path: out3/, copy: [config.json, vocab.txt]}\n")
    p = cli("run", str(tmp_path / "r.yaml"), "--no-progress", check=1)
    assert f"no file in s3://{s3.bucket}/hf matches 'vocab.txt'" in p.stderr
    assert not (tmp_path / "out3").exists()
    (tmp_path / "r.yaml").write_text(f"version: 1\nsource: {{path: 's3://{s3.bucket}/hf/'}}\n"
                                     "target: {path: out3/, copy: [config.json, {path: vocab.txt, optional: true}]}\n")
    cli("run", str(tmp_path / "r.yaml"), "--no-progress")
    assert (tmp_path / "out3" / "config.json").read_bytes() == companions["config.json"]
    assert not (tmp_path / "out3" / "vocab.txt").exists()


def test_companion_files_over_http_by_exact_name(http: HttpServer, tmp_path: Path) -> None:
    """Plain HTTP cannot list a folder: a companion named exactly is fetched, a wildcard finds nothing."""
    want = model(big=8)
    http.store.objects |= {
        "/hf/model.safetensors": st_numpy.save(want),
        "/hf/model.safetensors.index.json": json.dumps(
            {"metadata": {}, "weight_map": dict.fromkeys(want, "model.safetensors")}).encode(),
        "/hf/config.json": b'{"model_type": "bert"}', "/hf/tokenizer.json": b"{}"}
    index = http.url + "/hf/model.safetensors.index.json"
    cli("convert", index, str(tmp_path / "out") + "/", "--copy", "config.json")
    assert (tmp_path / "out" / "config.json").read_bytes() == b'{"model_type": "bert"}'
    assert_same(st_numpy.load_file(str(tmp_path / "out" / "model.safetensors")), want)
    p = cli("convert", index, str(tmp_path / "out2") + "/", "--copy", "tokenizer*", check=1)
    assert f"no file in {http.url}/hf matches 'tokenizer*'" in p.stderr


def test_hash_sources_reads_store_objects(s3: Any, tmp_path: Path) -> None:
    """--hash-sources over S3: the sha256 of each object read (one file; every shard and the index of
    a folder), equal to hashlib's over the bytes the store returns."""
    import hashlib

    want = model()
    url = put(s3, "one/m.safetensors", st_numpy.save(want))
    cli("convert", url, f"s3://{s3.bucket}/hf/", "--max-shard-size", "3MB")
    for source, out in ((url, "one.safetensors"), (f"s3://{s3.bucket}/hf/", "many.safetensors")):
        (tmp_path / "r.yaml").write_text(f"version: 1\nsource: {{path: '{source}'}}\ntarget: {{path: {out}}}\n")
        cli("run", str(tmp_path / "r.yaml"), "--hash-sources", "--no-progress")
        meta = st_numpy.safe_open(str(tmp_path / out), "np").metadata()
        if out == "one.safetensors":
            assert meta["migrator.source_sha256"] == hashlib.sha256(get(s3, "one/m.safetensors")).hexdigest()
        else:
            files = [k for k in keys(s3) if k.startswith("hf/")]
            assert len(files) > 2
            assert json.loads(meta["migrator.source_files_sha256"]) == {
                k[3:]: hashlib.sha256(get(s3, k)).hexdigest() for k in files}


def test_uploads_report_progress(s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A progress bar follows an upload too: once per object written, over its planned size, and the
    bar's position (the upload's `tell()`, it has no descriptor) ends at that size."""
    import migrator.run.execute
    from migrator.run.convert import convert

    src = tmp_path / "m.safetensors"
    src.write_bytes(st_numpy.save(model()))
    seen: list[tuple[int, int]] = []

    @contextlib.contextmanager
    def record(sink: Any, total: int) -> Iterator[None]:
        yield
        seen.append((total, sink.tell()))

    real_bar = migrator.run.execute.progress_bar
    monkeypatch.setattr(migrator.run.execute, "progress_bar", record)
    convert(src, f"s3://{s3.bucket}/one.safetensors", progress=True)
    assert seen == [(len(get(s3, "one.safetensors")),) * 2]
    seen.clear()
    convert(src, f"s3://{s3.bucket}/hf/", max_shard_size="3MB", progress=True)
    shards = [k for k in keys(s3) if k.startswith("hf/") and k.endswith(".safetensors")]
    assert len(shards) > 1 and sorted(seen) == sorted((len(get(s3, k)),) * 2 for k in shards)
    monkeypatch.setattr(migrator.run.execute, "progress_bar", real_bar)
    convert(src, f"s3://{s3.bucket}/two.safetensors", progress=True)  # the real bar, polling tell()
    assert get(s3, "two.safetensors") == get(s3, "one.safetensors")
