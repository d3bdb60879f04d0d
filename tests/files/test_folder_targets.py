"""A folder target keeps the format the user named and gets Hugging Face's file names (issue 25
items 3 and 4): `convert SRC DIR/` and `run r.yaml --target DIR/` write `model.safetensors` (or
shards + index, `pytorch_model.bin` for PyTorch, `adapter_model.*` for a PEFT adapter), which
`from_pretrained` loads; a burnpack recipe writes `DIR/<its file name>.bpk`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process as migrate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.models import tiny_bert_folder

    return tiny_bert_folder(tmp_path_factory.mktemp("hf") / "bert")


def _same_model(folder: Path, reference: Path) -> None:
    got, info = transformers.BertModel.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    want = transformers.BertModel.from_pretrained(reference)
    for (k, a), (_, b) in zip(got.state_dict().items(), want.state_dict().items(), strict=True):
        assert torch.equal(a, b), k


def test_folder_to_folder_gets_hugging_face_names(hf_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "newdir"
    r = migrate("convert", str(hf_model) + "/", str(out) + "/", "--copy", "config.json")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    _same_model(out, hf_model)


def test_existing_folder_without_slash_is_a_folder_target(hf_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "exists"
    out.mkdir()
    r = migrate("convert", str(hf_model) + "/", str(out), "--copy", "config.json", "--overwrite")
    assert r.returncode == 0, r.stderr
    assert (out / "model.safetensors").is_file()


def test_pytorch_folder_and_weights_name(hf_model: Path, tmp_path: Path) -> None:
    r = migrate("convert", str(hf_model) + "/", str(tmp_path / "pt") + "/", "--to", "pytorch",
                "--copy", "config.json")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "pt" / "pytorch_model.bin").is_file()
    _same_model(tmp_path / "pt", hf_model)
    r = migrate("convert", str(hf_model) + "/", str(tmp_path / "named") + "/", "--weights-name", "bert.safetensors",
                "--max-shard-size", "10KB")
    assert r.returncode == 0, r.stderr
    index = json.loads((tmp_path / "named" / "bert.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {p.name for p in (tmp_path / "named").glob("bert-*.safetensors")}
    r = migrate("convert", str(hf_model) + "/", str(tmp_path / "one.safetensors"), "--weights-name", "x.safetensors")
    assert r.returncode == 2 and "folder target" in r.stderr


def test_burnpack_folder_target_is_one_file(hf_model: Path, tmp_path: Path) -> None:
    r = migrate("convert", str(hf_model) + "/", str(tmp_path / "burn") + "/", "--to", "burnpack")
    assert r.returncode == 0, r.stderr
    assert [p.name for p in (tmp_path / "burn").iterdir()] == ["bert.bpk"]


@pytest.mark.parametrize(("target_line", "want"), [
    ("{path: x.safetensors}", ["model.safetensors"]),
    ("{path: x.safetensors, format: safetensors}", ["model.safetensors"]),
    ("{path: x.pt}", ["pytorch_model.bin"]),
    ("{path: x.bpk}", ["x.bpk"]),
    ("{path: hf/, shard: {max_size: 10KB}}", None),
])
def test_run_target_folder_keeps_the_recipes_format(hf_model: Path, tmp_path: Path, target_line: str,
                                                    want: list[str] | None) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource: {{path: {hf_model}/}}\ntarget: {target_line}\n")
    out = tmp_path / "out"
    r = migrate("run", str(recipe), "--target", str(out) + "/", "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    names = sorted(p.name for p in out.iterdir())
    if want is None:  # the recipe's own shard size is kept
        assert "model.safetensors.index.json" in names and len(names) > 2
    else:
        assert names == want
    assert f"wrote {out}" in r.stdout


def test_peft_adapter_folder_keeps_adapter_names(tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    model = peft.get_peft_model(transformers.LlamaForCausalLM(config),
                                peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(tmp_path / "adapter")
    r = migrate("convert", str(tmp_path / "adapter") + "/", str(tmp_path / "out") + "/",
                "--copy", "adapter_config.json")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["adapter_config.json",
                                                                     "adapter_model.safetensors"]
    loaded = peft.PeftModel.from_pretrained(transformers.LlamaForCausalLM(config), tmp_path / "out")
    want = model.state_dict()
    for k, v in loaded.state_dict().items():
        if "lora_" in k:
            assert torch.equal(v, want[k]), k
