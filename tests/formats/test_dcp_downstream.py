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
from cli_support import migrate_in_process
from dist_support import write_checkpoints

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
    import remote_servers

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
