"""Quantized folders on object stores (S3 through moto's server on 127.0.0.1, fsspec's memory://): the
store folder's config.json is read as a local one's, so `--dtype` dequantizes them, streamed a band at a
time from ranged reads, bit for bit as compressed-tensors dequantizes the same folders; without a cast
they pass as stored with the note; a store folder without config.json is read as any other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process
from tests.support.quantized import ct_float_dequantized, ct_float_folder, fp8_dequantized, fp8_folder

torch = pytest.importorskip("torch")
fsspec = pytest.importorskip("fsspec")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytest.importorskip("compressed_tensors")


def oracle_fp8(stored: dict) -> dict:
    return fp8_dequantized(stored, torch.bfloat16)


def oracle_ct(stored: dict, qc: dict) -> dict:
    return ct_float_dequantized(stored, qc, torch.bfloat16)


def ok(*args: str):
    p = migrate_in_process(*args)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 0, p.stdout + p.stderr
    return p


def check(out: Path, want: dict) -> None:
    got: dict[str, Any] = {}
    for f in out.glob("*.safetensors"):
        got.update(safetensors_torch.load_file(str(f)))
    assert not [n for n in got if n.endswith(("_scale", "_scale_inv"))]
    for name, w in want.items():
        assert got[name].dtype == torch.bfloat16 and torch.equal(got[name].view(torch.int16), w.view(torch.int16)), name


def to_memory(folder: Path, prefix: str, skip: tuple[str, ...] = ()) -> str:
    fs = fsspec.filesystem("memory")
    for p in folder.iterdir():
        if p.name not in skip:
            fs.pipe(f"/{prefix}/{p.name}", p.read_bytes())
    return f"memory://{prefix}/"


@pytest.fixture(autouse=True)
def _small_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bands of a few rows and pieces smaller than a band: every weight is several ranged reads."""
    monkeypatch.setattr("migrator.files.quantized.BAND_BYTES", 2048)
    monkeypatch.setenv("MIGRATOR_REMOTE_BLOCK_SIZE", "1000")


def test_memory_store_folders_dequantize_by_the_cast(tmp_path: Path) -> None:
    _, fp8 = fp8_folder(tmp_path / "fp8")
    _, ct, qc = ct_float_folder(tmp_path / "ct", "channel", shards=1)
    fp8_url, ct_url = to_memory(tmp_path / "fp8", "q-fp8"), to_memory(tmp_path / "ct", "q-ct")
    p = ok("convert", fp8_url, f"{tmp_path / 'out-fp8'}/", "--dtype", "BF16", "--copy", "config.json")
    assert "14 weights dequantized to BF16" in p.stdout
    check(tmp_path / "out-fp8", oracle_fp8(fp8))
    written = json.loads((tmp_path / "out-fp8" / "config.json").read_text())
    assert "quantization_config" not in written and written["torch_dtype"] == "bfloat16"
    ok("convert", ct_url + "model.safetensors", str(tmp_path / "ct.safetensors"), "--dtype", "BF16")
    got = safetensors_torch.load_file(str(tmp_path / "ct.safetensors"))
    for name, w in oracle_ct(ct, qc).items():
        assert torch.equal(got[name].view(torch.int16), w.view(torch.int16)), name
    # without a cast: as stored, with the note; the codes are the stored bytes
    p = ok("convert", fp8_url, str(tmp_path / "stored.safetensors"))
    assert "read as stored" in p.stdout
    stored = safetensors_torch.load_file(str(tmp_path / "stored.safetensors"))
    assert sorted(stored) == sorted(fp8)
    w = "model.layers.1.mlp.up_proj.weight"
    assert torch.equal(stored[w].view(torch.uint8), fp8[w].view(torch.uint8))


def test_a_store_folder_without_config_json_is_read_as_any_other(tmp_path: Path) -> None:
    fp8_folder(tmp_path / "fp8")
    url = to_memory(tmp_path / "fp8", "q-noconfig", skip=("config.json",))
    p = ok("inspect", url)
    assert "quantization" not in p.stdout
    p = migrate_in_process("convert", url, str(tmp_path / "x.safetensors"), "--dtype", "BF16")
    assert p.returncode == 1 and "F8_E4M3" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "x.safetensors").exists()


@pytest.fixture(scope="module")
def moto_endpoint() -> Any:
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from tests.support import remote_servers

    yield from remote_servers.moto_endpoint()


def test_s3_folder_dequantizes_by_the_cast(tmp_path: Path, moto_endpoint: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": moto_endpoint,
                 "MIGRATOR_REMOTE_BACKOFF": "0"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    boto3 = pytest.importorskip("boto3")
    client = boto3.client("s3", endpoint_url=moto_endpoint)
    client.create_bucket(Bucket="quantized")
    src, fp8 = fp8_folder(tmp_path / "fp8")
    for p in src.iterdir():
        client.put_object(Bucket="quantized", Key=f"fp8/{p.name}", Body=p.read_bytes())
    url = "s3://quantized/fp8/"
    p = ok("inspect", url)
    assert "quantization: fine-grained FP8" in p.stdout
    ok("convert", url, f"{tmp_path / 'out'}/", "--dtype", "BF16")
    check(tmp_path / "out", oracle_fp8(fp8))
    ok("convert", url + "model.safetensors.index.json", "s3://quantized/bf16/", "--dtype", "BF16")
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="quantized", Prefix="bf16/")["Contents"])
    got: dict[str, Any] = {}
    for key in keys:
        if key.endswith(".safetensors"):
            body = client.get_object(Bucket="quantized", Key=key)["Body"].read()
            got.update(safetensors_torch.load(body))
    for name, w in oracle_fp8(fp8).items():
        assert torch.equal(got[name].view(torch.int16), w.view(torch.int16)), name
