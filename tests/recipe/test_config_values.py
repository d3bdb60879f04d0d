"""Recipes take what the checkpoint declares from its config (`${config.KEY}`), and a literal that
contradicts a present config is refused before anything is written (issue 25 item 2).

The oracle for the permute is Hugging Face's Llama conversion script's, written in torch; the
converted weights must load strictly into `LlamaForCausalLM` built from the config."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process as migrate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("safetensors.torch")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "recipes"))
import ops_demo  # noqa: E402

LAYOUTS = [(4, 2), (8, 4), (8, 8)]


def hf_permute(w: torch.Tensor, n_heads: int, dim1: int, dim2: int) -> torch.Tensor:
    """Hugging Face's Llama conversion script's permute (Meta -> HF)."""
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


def _workspace(tmp_path: Path, heads: int, kv_heads: int) -> tuple[Path, dict[str, int]]:
    c = {**ops_demo.LLAMA, "dim": 16 * heads, "n_heads": heads, "n_kv_heads": kv_heads}
    shutil.copytree(REPO / "recipes", tmp_path / "recipes", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    ops_demo.write_llama(tmp_path / "demo-out", c)
    return tmp_path, c


@pytest.mark.parametrize(("heads", "kv_heads"), LAYOUTS)
def test_llama_recipes_read_head_counts_from_the_config(tmp_path: Path, heads: int, kv_heads: int) -> None:
    ws, c = _workspace(tmp_path, heads, kv_heads)
    out = ws / "demo-out"
    for name in ("llama-meta-to-hf", "llama-hf-to-meta"):
        r = migrate("run", str(ws / "recipes" / f"{name}.yaml"), "--no-progress")
        assert r.returncode == 0, r.stdout + r.stderr
    meta = torch.load(out / "llama-meta-tiny" / "consolidated.00.pth", weights_only=True)
    hf = st.load_file(out / "llama-hf-tiny" / "model.safetensors")
    d, kv = c["dim"], c["dim"] // heads * kv_heads
    for i in range(c["n_layers"]):
        assert torch.equal(hf[f"model.layers.{i}.self_attn.q_proj.weight"],
                           hf_permute(meta[f"layers.{i}.attention.wq.weight"], heads, d, d))
        assert torch.equal(hf[f"model.layers.{i}.self_attn.k_proj.weight"],
                           hf_permute(meta[f"layers.{i}.attention.wk.weight"], kv_heads, kv, d))
    config = transformers.LlamaConfig.from_pretrained(out / "llama-hf-tiny")
    assert (config.num_attention_heads, config.num_key_value_heads) == (heads, kv_heads)
    model = transformers.LlamaForCausalLM(config)
    result = model.load_state_dict(hf, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    again = torch.load(out / "llama-meta-tiny-again.pt", weights_only=True)
    assert sorted(again) == sorted(meta) and all(torch.equal(again[k], meta[k]) for k in meta)


@pytest.mark.parametrize(("recipe", "old", "literal"), [
    ("llama-meta-to-hf", "'${config.n_heads}'", "4"),
    ("llama-meta-to-hf", "'${config.n_kv_heads | config.n_heads}'", "2"),
    ("llama-hf-to-meta", "'${config.num_attention_heads}'", "4"),
])
def test_a_literal_that_contradicts_the_config_is_refused(tmp_path: Path, recipe: str, old: str,
                                                          literal: str) -> None:
    ws, _ = _workspace(tmp_path, 8, 4)
    if recipe == "llama-hf-to-meta":  # its source is the other recipe's output
        assert migrate("run", str(ws / "recipes" / "llama-meta-to-hf.yaml")).returncode == 0
    path = ws / "recipes" / f"{recipe}.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, literal))
    target = ws / "demo-out" / ("llama-hf-tiny/model.safetensors" if recipe == "llama-meta-to-hf"
                                else "llama-meta-tiny-again.pt")
    before = target.read_bytes() if target.exists() else None
    r = migrate("run", str(path), "--no-progress")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"heads: {literal} cuts" in r.stderr and "holds" in r.stderr
    assert ("n_heads" if recipe == "llama-meta-to-hf" else "num_attention_heads") in r.stderr
    assert f"{recipe}.yaml:" in r.stderr  # LINE:COL of the literal
    assert (target.read_bytes() if target.exists() else None) == before


def test_literal_that_agrees_with_the_config_runs(tmp_path: Path) -> None:
    ws, _ = _workspace(tmp_path, 8, 4)
    path = ws / "recipes" / "llama-meta-to-hf.yaml"
    path.write_text(path.read_text().replace("'${config.n_heads}'", "8")
                    .replace("'${config.n_kv_heads | config.n_heads}'", "4"))
    r = migrate("run", str(path), "--no-progress")
    assert r.returncode == 0, r.stderr


def test_rope_permute_head_dim_must_fit_the_rows(tmp_path: Path) -> None:
    ws, _ = _workspace(tmp_path, 4, 2)
    (ws / "demo-out" / "llama-meta-tiny" / "params.json").unlink()  # no config: the recipe's own checks
    path = ws / "recipes" / "llama-meta-to-hf.yaml"
    path.write_text(path.read_text().replace("'${config.n_heads}'", "4, head_dim: 8")
                    .replace("'${config.n_kv_heads | config.n_heads}'", "2"))
    r = migrate("run", str(path))
    assert r.returncode == 2 and "4 heads x head_dim 8 = 32 do not fit" in r.stderr, r.stderr
    path.write_text(path.read_text().replace("head_dim: 8", "head_dim: 7"))
    r = migrate("validate", str(path))
    assert r.returncode == 2 and "head_dim 7 must be even" in r.stdout + r.stderr


def _recipe(tmp_path: Path, heads: str, config: dict[str, object] | None, extra: str = "") -> Path:
    import numpy as np

    from migrator import from_numpy, save

    (tmp_path / "m").mkdir(exist_ok=True)
    save([from_numpy("q.weight", np.zeros((64, 8), np.float32))], tmp_path / "m" / "model.safetensors",
         overwrite=True)
    if config is not None:
        (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    path = tmp_path / "r.yaml"
    path.write_text(f"version: 1\n{extra}source: {{path: m/model.safetensors}}\nops:\n"
                    f"  - rope_permute:\n      from: 'q\\.weight'\n      heads: {heads}\n"
                    "target: {path: out.safetensors}\n")
    return path


@pytest.mark.parametrize(("heads", "config", "want"), [
    ("${config.num_attention_heads}", {"hidden_size": 64, "num_attention_heads": 8}, 0),
    ("${config.num_key_value_heads | config.num_attention_heads}", {"hidden_size": 64, "num_attention_heads": 8}, 0),
    ("${config.num_key_value_heads | 8}", {}, 0),
    ("${config.text_config.heads}", {"text_config": {"heads": 8}}, 0),
    ("${config.hidden_size // config.head_dim}", {"hidden_size": 64, "head_dim": 8}, 0),
])
def test_config_expressions(tmp_path: Path, heads: str, config: dict[str, object], want: int) -> None:
    recipe = _recipe(tmp_path, heads, config)
    r = migrate("plan", str(recipe), "--json")
    assert r.returncode == want, r.stdout + r.stderr
    assert "rope_permute heads 8" in r.stdout
    assert migrate("run", str(recipe)).returncode == 0


@pytest.mark.parametrize(("heads", "config", "message"), [
    ("${config.num_attention_heads}", None, "there is no config: none of config.json, params.json"),
    ("${config.num_attention_heads}", {"hidden_size": 64}, "has no config.num_attention_heads"),
    ("${config.model_type}", {"model_type": "llama"}, "heads"),
    ("${config.a + config.b}", {"a": 1, "b": 2}, "cannot read '+ config.b'"),
    ("${config.a // config.b}", {"a": 1, "b": 0}, "division by zero"),
    ("${}", {}, "each choice is a term"),
])
def test_bad_references_name_the_recipe_line(tmp_path: Path, heads: str, config: dict[str, object] | None,
                                             message: str) -> None:
    r = migrate("validate", str(_recipe(tmp_path, heads, config)))
    assert r.returncode == 2, r.stdout + r.stderr
    text = r.stdout + r.stderr
    assert "r.yaml:6:14" in text and message in text, text


def test_a_missing_source_is_named_not_its_missing_config(tmp_path: Path) -> None:
    """`--source` naming nothing: the error says the source does not exist, not that no config is beside it."""
    recipe = _recipe(tmp_path, "${config.num_attention_heads}", None)
    r = migrate("run", str(recipe), "--source", str(tmp_path / "typo"), "--target", str(tmp_path / "o.safetensors"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"there is no config: the source {tmp_path / 'typo'} does not exist" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "o.safetensors").exists()


def test_config_named_by_the_recipe_and_a_broken_one(tmp_path: Path) -> None:
    (tmp_path / "elsewhere.json").write_text(json.dumps({"n": 8}))
    r = migrate("run", str(_recipe(tmp_path, "${config.n}", None, "config: elsewhere.json\n")))
    assert r.returncode == 0, r.stderr
    (tmp_path / "elsewhere.json").write_text("[1, 2")
    r = migrate("validate", str(_recipe(tmp_path, "${config.n}", None, "config: elsewhere.json\n")))
    assert r.returncode == 2 and "is not JSON" in r.stdout + r.stderr


def test_schema_accepts_references_for_integer_op_values() -> None:
    from migrator.recipe.loader import recipe_json_schema

    text = json.dumps(recipe_json_schema())
    assert "${config.KEY}" in text and '"config"' in text
