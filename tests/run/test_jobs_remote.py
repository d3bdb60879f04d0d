"""Many jobs on object storage: `run a.yaml b.yaml --jobs 2` and `--each 's3://...'` against moto.

Each `migrate run` is its own process (as a user runs it), so the worker processes it forks start
from a process that has already listed or read the store. Oracles: the arrays the tests made and the
`safetensors` library's loader of what boto3 downloads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")
boto3 = pytest.importorskip("boto3")
st_numpy = pytest.importorskip("safetensors.numpy")

import tests.support.remote_servers as remote_servers  # noqa: E402
from migrator.run.jobs import target_for  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
         "MIGRATOR_REMOTE_BACKOFF": "0"}


endpoint = pytest.fixture(scope="module")(remote_servers.moto_endpoint)


_buckets = iter(range(1_000_000))


@pytest.fixture
def bucket(endpoint: str) -> tuple[Any, str]:
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
    name = f"jobs-{next(_buckets)}"
    client.create_bucket(Bucket=name)
    return client, name


def weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"enc.weight": rng.standard_normal((30, 40)).astype(np.float32), "enc.bias": np.full(30, seed, np.float32)}


def put(client: Any, bucket: str, key: str, seed: int) -> None:
    client.put_object(Bucket=bucket, Key=key, Body=st_numpy.save(weights(seed)))


def check(client: Any, bucket: str, key: str, seed: int) -> None:
    got = st_numpy.load(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    want = weights(seed)
    assert sorted(got) == ["encoder.bias", "encoder.weight"]
    np.testing.assert_array_equal(got["encoder.weight"], want["enc.weight"])
    np.testing.assert_array_equal(got["encoder.bias"], want["enc.bias"])


def recipe(folder: Path, name: str, source: str, target: str) -> Path:
    path = folder / name
    path.write_text(f"version: 1\nsource: {{path: '{source}'}}\nremap: [{{from: '^enc\\.', to: 'encoder.'}}]\n"
                    f"target: {{path: '{target}'}}\n")
    return path


def migrate(endpoint: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **CREDS, "AWS_ENDPOINT_URL": endpoint, "PYTHONPATH": str(REPO)}
    env.pop("AWS_PROFILE", None)
    return subprocess.run([sys.executable, "-m", "migrator.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def keys(client: Any, bucket: str, prefix: str = "") -> list[str]:
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []))


def test_two_recipes_with_s3_sources_and_targets_in_two_processes(endpoint: str, bucket: tuple[Any, str],
                                                                 tmp_path: Path) -> None:
    client, b = bucket
    put(client, b, "in/a.safetensors", 1)
    put(client, b, "in/b.safetensors", 2)
    recipe(tmp_path, "a.yaml", f"s3://{b}/in/a.safetensors", f"s3://{b}/out/a.safetensors")
    recipe(tmp_path, "b.yaml", f"s3://{b}/in/b.safetensors", "local-b.safetensors")
    proc = migrate(endpoint, tmp_path, "run", "a.yaml", "b.yaml", "--jobs", "2", "--report", "all.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 jobs: 2 ok, 0 failed" in proc.stdout
    check(client, b, "out/a.safetensors", 1)
    got = st_numpy.load_file(str(tmp_path / "local-b.safetensors"))
    np.testing.assert_array_equal(got["encoder.weight"], weights(2)["enc.weight"])
    assert client.list_multipart_uploads(Bucket=b).get("Uploads", []) == []


def test_two_jobs_writing_one_s3_target_are_refused_before_anything_runs(endpoint: str, bucket: tuple[Any, str],
                                                                        tmp_path: Path) -> None:
    client, b = bucket
    put(client, b, "in/a.safetensors", 1)
    recipe(tmp_path, "a.yaml", f"s3://{b}/in/a.safetensors", f"s3://{b}/out/same.safetensors")
    recipe(tmp_path, "b.yaml", f"s3://{b}/in/a.safetensors", f"S3://{b}/out/same.safetensors")
    proc = migrate(endpoint, tmp_path, "run", "a.yaml", "b.yaml", "--jobs", "2")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"two jobs write s3://{b}/out/same.safetensors" in proc.stderr
    assert keys(client, b, "out/") == []


def test_each_over_an_s3_glob_fills_placeholders_from_the_url_path(endpoint: str, bucket: tuple[Any, str],
                                                                  tmp_path: Path) -> None:
    client, b = bucket
    for seed, run in ((3, "alpha"), (4, "beta")):
        put(client, b, f"runs/{run}/last.safetensors", seed)
    put(client, b, "runs/alpha/first.safetensors", 9)  # not matched
    recipe(tmp_path, "r.yaml", "unused.safetensors", "unused-out.safetensors")
    proc = migrate(endpoint, tmp_path, "run", "r.yaml", "--each", f"s3://{b}/runs/*/last.safetensors",
                   "--target", f"s3://{b}/out/{{parent}}-{{i}}-{{stem}}.safetensors", "--jobs", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert keys(client, b, "out/") == ["out/alpha-0-last.safetensors", "out/beta-1-last.safetensors"]
    check(client, b, "out/alpha-0-last.safetensors", 3)
    check(client, b, "out/beta-1-last.safetensors", 4)
    assert f"s3://{b}/runs/alpha/last.safetensors" in proc.stdout  # each job's heading names its source URL


def test_each_s3_glob_matching_nothing_is_a_usage_error(endpoint: str, bucket: tuple[Any, str],
                                                        tmp_path: Path) -> None:
    _, b = bucket
    recipe(tmp_path, "r.yaml", "unused.safetensors", "unused-out.safetensors")
    proc = migrate(endpoint, tmp_path, "run", "r.yaml", "--each", f"s3://{b}/runs/*/last.safetensors",
                   "--target", f"s3://{b}/out/{{parent}}.safetensors")
    assert proc.returncode == 2
    assert f"--each 's3://{b}/runs/*/last.safetensors' matches no file" in proc.stderr


def test_placeholders_of_a_url_come_from_its_path() -> None:
    src = "s3://bucket/runs/a/last.safetensors"
    assert target_for("s3://bucket/out/{parent}-{stem}-{name}-{i:02d}.bpk", src, 3) == \
        "s3://bucket/out/a-last-last.safetensors-03.bpk"
    assert target_for("out/{parent}.bpk", "s3://bucket/last.pt", 0) == "out/bucket.bpk"
