"""Object storage throughput: S3 (moto's server on 127.0.0.1) <-> local, migrator against s3fs.

    python benchmarks/remote.py [--model gpt2-medium] [--rounds 3]

Jobs, each its own process, rotated per round (benchmarks/harness.py), peak RSS from GNU time:

- `migrate convert s3://.../model.safetensors model.bpk --no-fsync` against s3fs `get` of the same
  object to a local file (neither flushes to disk);
- `migrate convert model.safetensors s3://.../model.bpk` against s3fs `put` of the same file.

Throughput ratio = peer time / migrator time (>= 0.8 is the target). The moto server runs as its own
process; it holds every object in memory, so the machine needs ~4x the model in free RAM. The
download runs with MIGRATOR_REMOTE_CONCURRENCY=1 (one open-ended GET read block by block): moto
answers every ranged GET by copying the whole object under a lock, so parallel ranged blocks measure
moto, not migrator (a real store serves ranges in parallel; s3fs `get` is one GET too).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from harness import Job, machine, mib, rounds  # noqa: E402
from models import MODELS, OUT, lazy_random  # noqa: E402

BUCKET = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):  # until it accepts connections
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2-medium", choices=sorted(MODELS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--store", choices=["s3", "http"], default="s3",
                    help="http: the tests' Range server (threads, in this process) against fsspec's http get")
    ap.add_argument("--direction", choices=["both", "up", "down"], default="both",
                    help="s3 only: the downloads, the uploads, or both")
    args = ap.parse_args()
    model = MODELS[args.model]
    folder = OUT / "remote"
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / f"{model.name}.safetensors"
    if not src.exists():
        import migrator

        print(f"generating {src} ({model.nbytes / 1e9:.2f} GB)", flush=True)
        migrator.save(lazy_random(model.shapes), src, fsync=False)
    if args.store == "http":
        return http_bench(model, src, folder, args.rounds)
    env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    py = sys.executable
    with moto_server() as endpoint:
        os.environ.update(env, AWS_ENDPOINT_URL=endpoint, PYTHONPATH=str(REPO))
        import boto3

        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        if args.direction != "up":
            s3.upload_file(str(src), BUCKET, src.name)
        remote = f"s3://{BUCKET}/{src.name}"
        got, put_out = folder / "got.bpk", folder / "got.bin"
        jobs = [
            # one sequential GET (concurrency 1): moto copies the whole object for every ranged GET
            Job("migrate s3 -> .bpk", ["env", "MIGRATOR_REMOTE_CONCURRENCY=1", py, "-m", "migrator.cli", "convert",
                                       remote, str(got), "--no-fsync"], got),
            Job("s3fs get", [py, "-c", f"import s3fs; s3fs.S3FileSystem().get({remote!r}, {str(put_out)!r})"],
                put_out),
            Job("migrate .safetensors -> s3 .bpk", [py, "-m", "migrator.cli", "convert", str(src),
                                                    f"s3://{BUCKET}/up.bpk", "--overwrite"], None, src),
            Job("s3fs put", [py, "-c", f"import s3fs; s3fs.S3FileSystem().put({str(src)!r}, "
                                       f"'s3://{BUCKET}/up.bin')"], None, src),
        ]
        keep = {"both": jobs, "down": jobs[:2], "up": jobs[2:]}[args.direction]
        res = rounds(keep, args.rounds, folder / "rss.txt")
    down = res.ratio("s3fs get", "migrate s3 -> .bpk") if args.direction != "up" else float("nan")
    up = res.ratio("s3fs put", "migrate .safetensors -> s3 .bpk") if args.direction != "down" else float("nan")
    print(f"\n{args.model}: {model.nbytes / 1e9:.2f} GB, {model.count} tensors, largest {mib(model.largest)}; "
          f"{args.rounds} rounds; {machine()}")
    print("| job | median s | MB/s | peak RSS |\n|---|--:|--:|--:|")
    for label in res.runs:
        print(f"| {label} | {res.wall(label):.2f} | {model.nbytes / 1e6 / res.wall(label):.0f} | "
              f"{mib(res.rss(label))} |")
    print(f"\nthroughput vs s3fs: download {down:.2f}x (target >= 0.8), upload {up:.2f}x (target >= 0.8)")
    got.unlink(missing_ok=True)
    put_out.unlink(missing_ok=True)


def http_bench(model: Any, src: Path, folder: Path, n: int) -> None:
    """Parallel ranged GETs (the default read path) against one streaming GET, over a Range server
    that serves each range in O(range): fsspec's http `get` is the peer."""
    from tests.support.remote_servers import HttpServer

    py = sys.executable
    got, peer_out = folder / "got.bpk", folder / "got.bin"
    with HttpServer() as server:
        server.store.objects["/m.safetensors"] = src.read_bytes()
        url = server.url + "/m.safetensors"
        os.environ["PYTHONPATH"] = str(REPO)
        jobs = [Job("migrate http -> .bpk (4 ranged GETs in flight)",
                    [py, "-m", "migrator.cli", "convert", url, str(got), "--no-fsync"], got),
                Job("fsspec http get", [py, "-c", f"import fsspec; fsspec.filesystem('http').get({url!r}, "
                                                  f"{str(peer_out)!r})"], peer_out)]
        res = rounds(jobs, n, folder / "rss.txt")
    print(f"\n{model.name}: {model.nbytes / 1e9:.2f} GB over http; {n} rounds; {machine()}")
    print("| job | median s | MB/s | peak RSS |\n|---|--:|--:|--:|")
    for label in res.runs:
        print(f"| {label} | {res.wall(label):.2f} | {model.nbytes / 1e6 / res.wall(label):.0f} | "
              f"{mib(res.rss(label))} |")
    print(f"\nthroughput vs fsspec http get: {res.ratio('fsspec http get', jobs[0].label):.2f}x")


if __name__ == "__main__":
    main()
