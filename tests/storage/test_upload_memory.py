"""Peak memory of an S3 multipart upload: parts in flight x part size, each part held once.

The upload runs in a child process against moto's server (in this process); its peak RSS is what
`resource.getrusage(RUSAGE_CHILDREN)` reports after it ended, read in a small launcher process whose
only child it is (a child forked straight from pytest inherits pytest's high-water mark across
exec), so the bound is on memory, never on time. A small upload through the same code is the baseline
(interpreter, botocore, aiohttp), so the bound covers what grows with the parts. The bytes are
checked against boto3's own download of the object.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tests.support.remote_servers as remote_servers

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")
boto3 = pytest.importorskip("boto3")

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
PART = 8 * MiB
IN_FLIGHT = 4

# writes of an odd size (straddling part boundaries), each stamped with its number, like a writer's
CHILD = r"""
import hashlib, struct, sys
from migrator.storage.remote.fs import Tuning
from migrator.storage.remote.upload import remote_output

url, total = sys.argv[1], int(sys.argv[2])
block = bytearray(bytes(range(256)) * ((3 << 20) // 256 + 1))[: (3 << 20) + 7]
digest = hashlib.sha256()
with remote_output(url, overwrite=True, expected_size=total,
                   tune=Tuning(part_size=8 << 20, upload_concurrency=4, backoff=0)) as sink:
    done, i = 0, 0
    while done < total:
        block[:8] = struct.pack("<Q", i)
        piece = memoryview(block)[: min(len(block), total - done)]
        sink.write(piece)
        digest.update(piece)
        done += len(piece)
        i += 1
print(digest.hexdigest())
"""


LAUNCHER = r"""
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:]).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(code)
"""


endpoint = pytest.fixture(scope="module")(remote_servers.moto_endpoint)


def upload_in_child(endpoint: str, url: str, total: int) -> tuple[str, int]:
    """(sha256 the child wrote, the child's peak RSS in bytes)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}
    env.pop("AWS_PROFILE", None)
    proc = subprocess.run([sys.executable, "-c", LAUNCHER, sys.executable, "-c", CHILD, url, str(total)],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    sha, maxrss = proc.stdout.split()
    return sha, int(maxrss) * 1024  # Linux reports KiB


def object_sha256(client: Any, bucket: str, key: str) -> tuple[str, int]:
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    digest, n = hashlib.sha256(), 0
    for chunk in iter(lambda: body.read(MiB), b""):
        digest.update(chunk)
        n += len(chunk)
    return digest.hexdigest(), n


def test_upload_peak_is_parts_in_flight_once(endpoint: str) -> None:
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    client.create_bucket(Bucket="memory")
    small, big = 2 * PART + 1, 200_000_000
    small_sha, base_rss = upload_in_child(endpoint, "s3://memory/small.bin", small)
    big_sha, peak_rss = upload_in_child(endpoint, "s3://memory/big.bin", big)

    assert object_sha256(client, "memory", "small.bin") == (small_sha, small)
    assert object_sha256(client, "memory", "big.bin") == (big_sha, big)
    parts = client.list_multipart_uploads(Bucket="memory").get("Uploads", [])
    assert parts == []
    # the baseline already held 3 part buffers (2 parts and a last byte); the big upload may add the
    # rest of its pool (in flight + the one being filled) and a little for the HTTP stack's chunks;
    # a second copy of each part in flight (4 x 8 MiB) would exceed this
    grown = peak_rss - base_rss
    assert grown <= (IN_FLIGHT + 1 - 3) * PART + 16 * MiB, f"upload grew by {grown / MiB:.0f} MiB over the baseline"
