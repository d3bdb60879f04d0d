"""docs/quantizing.md run as written: every fenced block of the page, on a tiny Llama folder `llama/`
(transformers, seeded, F32, untied head) in a scratch folder. The `yaml` block is the page's
`quantize.yaml`; each `migrate` line of the `sh` block runs and succeeds; the `json` block is the
`quantization_config` the first command writes; the `python` block runs. The page holds no other
block, so none escapes. What each command wrote is checked against the page's words with
safetensors' and transformers' own readers."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")
from safetensors import safe_open  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "quantizing.md"


def blocks() -> list[tuple[str, str]]:
    return re.findall(r"^```(\w+)\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def stored(folder: Path) -> dict[str, tuple[torch.dtype, list[int]]]:
    with safe_open(folder / "model.safetensors", "pt") as f:
        return {n: (f.get_slice(n).get_dtype(), f.get_slice(n).get_shape()) for n in f.keys()}  # noqa: SIM118


def test_every_block_of_the_page_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = blocks()
    assert sorted(lang for lang, _ in found) == ["json", "python", "sh", "yaml"]
    code = dict(found)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "llama")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quantize.yaml").write_text(code["yaml"])
    commands = [ln.split("  #")[0].strip() for ln in code["sh"].splitlines() if ln.startswith("migrate ")]
    assert len(commands) == 5
    for line in commands:
        p = migrate_in_process(*shlex.split(line)[1:])
        assert p.returncode == 0, (line, p.stderr)
    written = json.loads((tmp_path / "llama-fp8" / "config.json").read_text())
    assert written["quantization_config"] == json.loads(code["json"])
    block = json.loads((tmp_path / "llama-fp8-block" / "config.json").read_text())["quantization_config"]
    group = block["config_groups"]["group_0"]
    assert group["weights"]["strategy"] == "block" and group["weights"]["block_structure"] == [128, 128]
    assert group["input_activations"]["strategy"] == "group" and group["input_activations"]["group_size"] == 128
    dense = stored(tmp_path / "llama-fp8")
    assert dense["model.layers.0.self_attn.q_proj.weight"] == ("F8_E4M3", [32, 32])
    assert dense["model.layers.0.self_attn.q_proj.weight_scale"] == ("F32", [32, 1])
    assert dense["lm_head.weight"] == ("F32", [64, 32]) and "lm_head.weight_scale" not in dense
    assert stored(tmp_path / "llama-fp8-block")["model.layers.0.mlp.up_proj.weight_scale"] == ("F32", [1, 1])
    assert stored(tmp_path / "llama-fp8-bf16")["model.layers.0.mlp.up_proj.weight_scale"] == ("BF16", [48, 1])
    said = json.loads((tmp_path / "llama-fp8-bf16" / "config.json").read_text())  # loads as the BF16 it now is
    assert transformers.AutoConfig.from_pretrained(tmp_path / "llama-fp8-bf16").dtype == torch.bfloat16, said
    recipe = stored(tmp_path / "llama-fp8-recipe")
    assert "model.layers.0.mlp.down_proj.weight_scale" not in recipe
    assert "model.layers.1.mlp.down_proj.weight_scale" in recipe
    ignore = json.loads((tmp_path / "llama-fp8-recipe" / "config.json").read_text())["quantization_config"]["ignore"]
    assert ignore == ["model.layers.0.mlp.down_proj", "lm_head"]
    exec(compile(code["python"], str(DOC), "exec"), {})  # the page's own code
