"""Index renumbering is a property of the target: only an output for Burn (a burnpack target, or the
pytorch_to_burn adapter) gets contiguous indices by default. SafeTensors and PyTorch targets keep the
names a PyTorch module loads, checked here with torch's strict `load_state_dict` and transformers'
`from_pretrained`; when names are renumbered, the command says which."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process as migrate

torch = pytest.importorskip("torch")


def _sequential() -> torch.nn.Sequential:
    torch.manual_seed(0)
    # activations between the layers leave gaps in the stored indices: 0, 2, 4
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6), torch.nn.GELU(),
                               torch.nn.Linear(6, 2))


def _strict_load(state: dict[str, torch.Tensor]) -> torch.nn.Sequential:
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6), torch.nn.GELU(),
                                torch.nn.Linear(6, 2))
    fresh.load_state_dict(state, strict=True)  # raises on any missing or unexpected key
    return fresh


def _assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_pytorch_file_keeps_its_names_for_pytorch_loaders(tmp_path: Path, suffix: str) -> None:
    model = _sequential()
    src = tmp_path / "seq.pt"
    torch.save(model.state_dict(), src)
    out = tmp_path / f"out{suffix}"
    r = migrate("convert", str(src), str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["renumbered"] == []
    if suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(out)
    else:
        state = torch.load(out, weights_only=True)
    _assert_same(_strict_load(state), model)


def test_pytorch_file_to_burnpack_is_renumbered_and_says_so(tmp_path: Path) -> None:
    model = _sequential()
    src = tmp_path / "seq.pt"
    torch.save(model.state_dict(), src)
    out = tmp_path / "seq.bpk"
    r = migrate("convert", str(src), str(out))
    assert r.returncode == 0, r.stderr
    assert "renumbered 4 names to contiguous indices" in r.stdout
    assert "2.weight -> 1.weight" in r.stdout and "4.bias -> 2.bias" in r.stdout
    r = migrate("convert", str(src), str(tmp_path / "again.bpk"), "--json")
    pairs = {(e["from"], e["to"]) for e in json.loads(r.stdout)["renumbered"]}
    assert pairs == {("2.weight", "1.weight"), ("2.bias", "1.bias"), ("4.weight", "2.weight"), ("4.bias", "2.bias")}
    r = migrate("inspect", str(out), "--json")
    assert sorted(t["name"] for t in json.loads(r.stdout)["tensors"]) == [
        "0.bias", "0.weight", "1.bias", "1.weight", "2.bias", "2.weight"]


def test_no_contiguous_indices_keeps_burnpack_names(tmp_path: Path) -> None:
    src = tmp_path / "seq.pt"
    torch.save(_sequential().state_dict(), src)
    r = migrate("convert", str(src), str(tmp_path / "seq.bpk"), "--no-contiguous-indices", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["renumbered"] == []


def test_contiguous_indices_asked_for_a_safetensors_target(tmp_path: Path) -> None:
    src = tmp_path / "seq.pt"
    torch.save(_sequential().state_dict(), src)
    r = migrate("convert", str(src), str(tmp_path / "seq.safetensors"), "--contiguous-indices", "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["renumbered"]) == 4


def test_emit_recipe_writes_the_renumbering_it_does(tmp_path: Path) -> None:
    import yaml

    src = tmp_path / "seq.pt"
    torch.save(_sequential().state_dict(), src)
    r = migrate("convert", str(src), str(tmp_path / "seq.bpk"), "--emit-recipe")
    assert yaml.safe_load(r.stdout)["source"]["contiguous_indices"] is True
    r = migrate("convert", str(src), str(tmp_path / "seq.safetensors"), "--emit-recipe")
    assert "contiguous_indices" not in yaml.safe_load(r.stdout)["source"]


def test_recipe_run_report_lists_renames(tmp_path: Path) -> None:
    src = tmp_path / "seq.pt"
    torch.save(_sequential().state_dict(), src)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nsource: {path: seq.pt}\ntarget: {path: seq.bpk}\n")
    r = migrate("run", str(recipe), "--report", str(tmp_path / "report.json"))
    assert r.returncode == 0, r.stderr
    assert "Renumbered indices (4 tensors" in r.stdout and "4.weight -> 2.weight" in r.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert {"from": "4.bias", "to": "2.bias"} in report["renumbered"]
    r = migrate("plan", str(recipe))
    assert "Renumbered indices" in r.stdout
    # the same recipe to SafeTensors: nothing renumbered, nothing listed
    recipe.write_text("version: 1\nsource: {path: seq.pt}\ntarget: {path: seq.safetensors}\n")
    r = migrate("run", str(recipe))
    assert r.returncode == 0, r.stderr
    assert "Renumbered" not in r.stdout
    from safetensors.torch import load_file

    _strict_load(load_file(tmp_path / "seq.safetensors"))


def test_pytorch_to_burn_adapter_renumbers_a_safetensors_target(tmp_path: Path) -> None:
    src = tmp_path / "seq.pt"
    torch.save(_sequential().state_dict(), src)
    r = migrate("convert", str(src), str(tmp_path / "seq.safetensors"), "--adapter", "pytorch_to_burn", "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["renumbered"]) == 4


def test_qwen2vl_bin_shards_to_safetensors_load_with_from_pretrained(tmp_path: Path) -> None:
    """The reported case: Qwen2-VL's vision merger is a Sequential(Linear, GELU, Linear) stored as
    `mlp.0`/`mlp.2`. Written as .bin shards and converted to a SafeTensors folder, it must load with
    from_pretrained with no missing or unexpected keys and every parameter equal."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    config = transformers.Qwen2VLConfig(
        text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 2, 4]}),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=2,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    model = transformers.Qwen2VLForConditionalGeneration(config)
    saved = tmp_path / "saved"
    model.save_pretrained(saved)  # the names as a checkpoint stores them
    state = load_file(saved / "model.safetensors")
    assert any(k.endswith("merger.mlp.2.weight") for k in state)
    src = tmp_path / "bin"
    src.mkdir()
    (src / "config.json").write_text((saved / "config.json").read_text())
    names = sorted(state)
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, part in enumerate(halves, 1):
        shard = f"pytorch_model-0000{i}-of-00002.bin"
        torch.save({k: state[k] for k in part}, src / shard)
        weight_map.update(dict.fromkeys(part, shard))
    (src / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    out = tmp_path / "st"
    r = migrate("convert", str(src) + "/", str(out) + "/", "--max-shard-size", "200KB", "--copy", "config.json")
    assert r.returncode == 0, r.stderr
    assert "renumbered" not in r.stdout
    loaded, info = transformers.Qwen2VLForConditionalGeneration.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    expected = model.state_dict()
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, expected[k]), k
