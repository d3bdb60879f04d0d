"""`--executor ray` with S3 sources and targets (moto on 127.0.0.1, a local Ray started once here).

Several jobs: each Ray task runs a whole job and uploads its own output (atomic per object). One job
with workers and an S3 target is uploaded by the driver (its parts in flight), with a note saying
so. Oracles: the arrays the tests made, read back by the `safetensors` library from boto3's download.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")
ray = pytest.importorskip("ray")
boto3 = pytest.importorskip("boto3")
st_numpy = pytest.importorskip("safetensors.numpy")

from migrator.cli import main  # noqa: E402
from migrator.run.recipe import URL_TARGET_SERIAL  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3_and_ray() -> Iterator[Any]:
    """moto's S3 server, its endpoint and dummy credentials in the environment the Ray workers inherit."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": endpoint, "MIGRATOR_REMOTE_BACKOFF": "0",
           "PYTHONPATH": str(REPO) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
    old = {k: os.environ.get(k) for k in [*env, "AWS_PROFILE"]}
    os.environ.update(env)
    os.environ.pop("AWS_PROFILE", None)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket="rayjobs")
    try:
        yield client
    finally:
        ray.shutdown()
        server.stop()
        # this process's store clients point at the stopped server: later tests must make their own
        import s3fs

        from migrator.storage.remote import fs

        fs._FS_CACHE.clear()
        s3fs.S3FileSystem.clear_instance_cache()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"layers.{i}.weight": rng.standard_normal((64, 48 + i)).astype(np.float32) for i in range(4)}


def check(client: Any, key: str, seed: int) -> None:
    got = st_numpy.load(client.get_object(Bucket="rayjobs", Key=key)["Body"].read())
    want = weights(seed)
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v)


def run(folder: Path, *args: str) -> tuple[int, str]:
    cwd, out = os.getcwd(), io.StringIO()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(out):
            code = main(["run", *args, "--no-progress"])
    finally:
        os.chdir(cwd)
    return code, out.getvalue()


def test_jobs_on_ray_upload_their_own_s3_targets(s3_and_ray: Any, tmp_path: Path) -> None:
    client = s3_and_ray
    for seed in (1, 2):
        client.put_object(Bucket="rayjobs", Key=f"in/{seed}.safetensors", Body=st_numpy.save(weights(seed)))
        (tmp_path / f"{seed}.yaml").write_text(
            f"version: 1\nsource: {{path: 's3://rayjobs/in/{seed}.safetensors'}}\n"
            f"target: {{path: 's3://rayjobs/out/{seed}.safetensors'}}\n")
    code, out = run(tmp_path, "1.yaml", "2.yaml", "--executor", "ray")
    assert code == 0, out
    check(client, "out/1.safetensors", 1)
    check(client, "out/2.safetensors", 2)
    assert client.list_multipart_uploads(Bucket="rayjobs").get("Uploads", []) == []


def test_one_job_with_ray_workers_to_an_s3_folder_is_uploaded_by_the_driver(s3_and_ray: Any,
                                                                           tmp_path: Path) -> None:
    client = s3_and_ray
    client.put_object(Bucket="rayjobs", Key="in/3.safetensors", Body=st_numpy.save(weights(3)))
    (tmp_path / "r.yaml").write_text(
        "version: 1\nsource: {path: 's3://rayjobs/in/3.safetensors'}\n"
        "target: {path: 's3://rayjobs/shards/', shard: {max_size: 30KB}, format: safetensors}\n")
    code, out = run(tmp_path, "r.yaml", "--executor", "ray", "--workers", "2", "--json")
    assert code == 0, out
    assert URL_TARGET_SERIAL in json.loads(out)["notes"]
    listed = sorted(o["Key"] for o in client.list_objects_v2(Bucket="rayjobs", Prefix="shards/")["Contents"])
    index = [k for k in listed if k.endswith(".index.json")]
    assert len(index) == 1 and len(listed) > 2
    names = json.loads(client.get_object(Bucket="rayjobs", Key=index[0])["Body"].read())["weight_map"]
    got: dict[str, np.ndarray] = {}
    for shard in sorted(set(names.values())):
        got.update(st_numpy.load(client.get_object(Bucket="rayjobs", Key=f"shards/{shard}")["Body"].read()))
    want = weights(3)
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v)


def test_a_recipe_executor_runs_on_ray_unless_the_command_line_says_otherwise(
        s3_and_ray: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.numpy import load_file, save_file

    import migrator.run.ray_executor as rx

    joined: list[str | None] = []
    real = rx.ray_module

    def recording(address: str | None = None) -> Any:
        joined.append(address)
        return real(address)

    monkeypatch.setattr(rx, "ray_module", recording)
    save_file(weights(5), str(tmp_path / "w.safetensors"))
    (tmp_path / "r.yaml").write_text("version: 1\nsource: {path: w.safetensors}\ntarget: {path: out.safetensors}\n"
                                     "executor: {ray: {address: auto}}\n")
    code, out = run(tmp_path, "r.yaml", "--workers", "2")
    assert code == 0, out
    assert joined == ["auto"]  # the recipe's address reached Ray (this process's Ray is the one joined)
    got = load_file(str(tmp_path / "out.safetensors"))
    for k, v in weights(5).items():
        np.testing.assert_array_equal(got[k], v)

    code, out = run(tmp_path, "r.yaml", "--workers", "2", "--executor", "local", "--overwrite")
    assert code == 0, out
    assert joined == ["auto"]  # the flag wins: no Ray
    code, out = run(tmp_path, "r.yaml", "--workers", "2", "--ray-address", "127.0.0.1:6379", "--overwrite")
    assert code == 0, out
    assert joined == ["auto", "127.0.0.1:6379"]
