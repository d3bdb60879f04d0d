"""Everything downstream of a reader works on a DCP folder or verl rank files unchanged (issue 35
item 4): sharded Hugging Face folder targets with a config copied from a folder the user names,
burnpack targets, `diff` against the consolidated model, `inspect --json`, `--jobs`.

Oracles: `full.pt`, the tensors torch.distributed gathered whole (`full_tensor()`), read by torch;
the shards read by the `safetensors` library; a burnpack compared with the one written from
`full.pt`'s model by the PyTorch path (itself checked against Burn's fixtures elsewhere).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process
from tests.support.dist import write_checkpoints

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")
st_torch = pytest.importorskip("safetensors.torch")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoints(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def model(ckpt: Path) -> dict[str, Any]:
    full: dict[str, Any] = torch.load(ckpt / "full.pt", weights_only=True)["model"]
    return full


def run(*args: str) -> tuple[int, str, str]:
    p = migrate_in_process(*args)
    assert "Traceback" not in p.stdout + p.stderr, p.stderr
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("source", ["dcp", "verl"])
def test_sharded_folder_target_with_a_config_from_elsewhere(ckpt: Path, model: dict[str, Any], tmp_path: Path,
                                                           source: str) -> None:
    config = tmp_path / "hf-config"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"model_type": "toy", "hidden_size": 6}))
    out = tmp_path / "out"
    key = ["--top-level-key", "model"] if source == "dcp" else []
    code, _, err = run("convert", str(ckpt / source), str(out) + "/", *key, "--max-shard-size", "200B",
                       "--copy-from", str(config), "--copy", "config.json")
    assert code == 0, err
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 6
    got: dict[str, Any] = {}
    for shard in sorted(set(index["weight_map"].values())):
        got.update(st_torch.load_file(out / shard))
    assert len(set(index["weight_map"].values())) > 1
    assert sorted(got) == sorted(model)
    for k, v in model.items():
        assert torch.equal(got[k], v), k


def test_burnpack_target_equals_the_consolidated_models(ckpt: Path, model: dict[str, Any], tmp_path: Path) -> None:
    torch.save(model, tmp_path / "full_model.pt")
    code, _, err = run("convert", str(tmp_path / "full_model.pt"), str(tmp_path / "want.bpk"), "--no-metadata")
    assert code == 0, err
    code, _, err = run("convert", str(ckpt / "dcp"), str(tmp_path / "got.bpk"), "--top-level-key", "model",
                       "--no-metadata")
    assert code == 0, err
    assert (tmp_path / "got.bpk").read_bytes() == (tmp_path / "want.bpk").read_bytes()


@pytest.mark.parametrize("source", ["dcp", "verl"])
def test_diff_against_the_consolidated_model(ckpt: Path, model: dict[str, Any], tmp_path: Path, source: str) -> None:
    torch.save(model, tmp_path / "full_model.pt")
    code, out, err = run("diff", str(ckpt / source), str(tmp_path / "full_model.pt"), "--json",
                         *(["--top-level-key", "model"] if source == "dcp" else []))
    assert code == 0, out + err
    doc = json.loads(out)
    assert doc["matched"] is True


def test_inspect_json_names_global_shapes(ckpt: Path, model: dict[str, Any]) -> None:
    code, out, err = run("inspect", str(ckpt / "dcp"), "--json")
    assert code == 0, err
    doc = json.loads(out)
    shapes = {t["name"]: t["shape"] for t in doc["tensors"]}
    for k, v in model.items():
        assert shapes[f"model.{k}"] == list(v.shape), k


def test_a_recipe_with_jobs_over_a_dcp_source(ckpt: Path, model: dict[str, Any], tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource: {{path: '{ckpt / 'dcp'}', top_level_key: model}}\n"
                      "remap:\n  - {from: '^0\\.', to: 'inp.'}\n"
                      f"target: {{path: '{tmp_path / 'o'}/', shard: {{max_size: 200B}}}}\n")
    code, out, err = run("run", str(recipe), "--jobs", "2", "--no-progress")
    assert code == 0, out + err
    got: dict[str, Any] = {}
    for shard in (tmp_path / "o").glob("*.safetensors"):
        got.update(st_torch.load_file(shard))
    want = {("inp." + k[2:]) if k.startswith("0.") else k: v for k, v in model.items()}
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert torch.equal(got[k], v), k


# ------------------------------------------------------------------------------- on an object store


@pytest.fixture(scope="module")
def moto_endpoint() -> Any:
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    import tests.support.remote_servers as remote_servers

    yield from remote_servers.moto_endpoint()


@pytest.mark.parametrize("suffix", ["/", "", "/.metadata"])
def test_a_dcp_checkpoint_on_s3(ckpt: Path, model: dict[str, Any], tmp_path: Path, moto_endpoint: str,
                                monkeypatch: pytest.MonkeyPatch, suffix: str) -> None:
    boto3 = pytest.importorskip("boto3")
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": moto_endpoint, "MIGRATOR_REMOTE_BACKOFF": "0"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    client = boto3.client("s3", endpoint_url=moto_endpoint)
    bucket = f"dcp-{len(suffix)}"
    client.create_bucket(Bucket=bucket)
    for f in (ckpt / "dcp").iterdir():
        client.put_object(Bucket=bucket, Key=f"run/step-1/{f.name}", Body=f.read_bytes())
    url = f"s3://{bucket}/run/step-1{suffix}"
    out = tmp_path / "model.safetensors"
    code, _, err = run("convert", url, str(out), "--top-level-key", "model")
    assert code == 0, err
    got = st_torch.load_file(out)
    assert sorted(got) == sorted(model)
    for k, v in model.items():
        assert torch.equal(got[k], v), k
    client.delete_object(Bucket=bucket, Key="run/step-1/__1_0.distcp")  # a rank's file gone: named
    code, _, err = run("convert", url, str(tmp_path / "again.safetensors"), "--top-level-key", "model")
    assert code == 1 and "__1_0.distcp" in err and "missing" in err, err
    assert not (tmp_path / "again.safetensors").exists()


# ----------------------------------------------------------------------------- GGUF and LoRA targets


@pytest.mark.parametrize("quantize", [None, "Q8_0"])
def test_a_gguf_target_reads_in_gguf_py(ckpt: Path, model: dict[str, Any], tmp_path: Path,
                                        quantize: str | None) -> None:
    """gguf-py reads the file; with Q8_0 its blocks equal gguf-py's own quantization of the gathered
    tensors (the rows of a Q8_0 tensor must be multiples of 32: the rest stay F32, as llama.cpp keeps them)."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    out = tmp_path / "model.gguf"
    extra = ["--quantize", quantize] if quantize else []
    code, _, err = run("convert", str(ckpt / "dcp"), str(out), "--top-level-key", "model",
                       "--metadata", "general.architecture=toy", *extra)
    assert code == 0, err
    reader = gguf.GGUFReader(out)
    got = {t.name: t for t in reader.tensors}
    assert sorted(got) == sorted(model)
    for k, v in model.items():
        t = got[k]
        want = v.numpy()
        kind = gguf.GGMLQuantizationType(int(t.tensor_type))
        if kind == gguf.GGMLQuantizationType.F32:
            assert np.array_equal(np.asarray(t.data).reshape(want.shape), want), k
        elif kind == gguf.GGMLQuantizationType.F16:  # rows too short for Q8_0 blocks: llama.cpp's F16 fallback
            assert quantize == "Q8_0" and want.shape[-1] % 32, k
            assert np.asarray(t.data).tobytes() == want.astype(np.float16).tobytes(), k
        else:
            assert quantize == "Q8_0" and kind == gguf.GGMLQuantizationType.Q8_0, (k, kind)
            assert np.asarray(t.data).tobytes() == gguf.quants.quantize(want, kind).tobytes(), k


def test_a_lora_folded_into_a_dcp_source_equals_peft(ckpt: Path, model: dict[str, Any], tmp_path: Path) -> None:
    """`convert DCP OUT --lora ADAPTER`: PEFT's merge_and_unload on the gathered model is the oracle
    (within rounding: torch's 8-column matmul sums without FMA)."""
    peft = pytest.importorskip("peft")
    from torch import nn

    rows = model["0.weight"].shape[0]
    net = nn.Sequential(nn.Linear(8, rows), nn.ReLU(), nn.Linear(rows, 6), nn.LayerNorm(6))
    net.load_state_dict(model)
    wrapped = peft.get_peft_model(net, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["0", "2"]))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    adapter = tmp_path / "adapter"
    wrapped.save_pretrained(adapter)
    want = wrapped.merge_and_unload().state_dict()
    out = tmp_path / "merged.safetensors"
    code, _, err = run("convert", str(ckpt / "dcp"), str(out), "--top-level-key", "model", "--lora", str(adapter))
    assert code == 0, err
    got = st_torch.load_file(out)
    assert sorted(got) == sorted(want)
    for k, v in want.items():  # the fold's own bit-equality with PEFT is tests/transform's: here, its input
        torch.testing.assert_close(got[k], v, rtol=0, atol=1e-6, msg=k)
    assert not torch.equal(got["0.weight"], model["0.weight"])  # the fold did something
