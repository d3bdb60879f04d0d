"""A shipped recipe run on the user's own model (`--source MODEL`) takes its `${config...}` values
from MODEL's config, not from the config beside the recipe's example source (issue 34, item 1).

The recipes are run from the repository's own `recipes/` folder, as a user runs them: whether or
not `make demo` has written the 4-head example model beside them must not matter. Each output is
checked against Hugging Face's conversion permute written here, and the models are written by
transformers (HF side) or with torch (Meta side), never by migrator.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process as migrate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("safetensors.torch")

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
# (heads, kv_heads): the demo's model has 4/2, so 4/2 passes only when the user's config is read too
LAYOUTS = [(8, 4), (4, 2), (8, 8), (4, 1)]


def hf_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Hugging Face's Llama conversion permute (Meta's interleaved rotary rows -> HF's halves)."""
    dim1, dim2 = w.shape
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


def _hf_model(folder: Path, heads: int, kv_heads: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(heads * 10 + kv_heads)
    config = transformers.LlamaConfig(hidden_size=16 * heads, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=64)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    return st.load_file(folder / "model.safetensors")


@pytest.mark.parametrize(("heads", "kv_heads"), LAYOUTS)
def test_hf_to_meta_reads_the_users_config(tmp_path: Path, heads: int, kv_heads: int) -> None:
    hf = _hf_model(tmp_path / "my-llama", heads, kv_heads)
    out = tmp_path / "meta.pt"
    r = migrate("run", str(RECIPES / "llama-hf-to-meta.yaml"), "--source", str(tmp_path / "my-llama"),
                "--target", str(out), "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    meta = torch.load(out, weights_only=True)
    for i in range(2):
        assert torch.equal(hf_permute(meta[f"layers.{i}.attention.wq.weight"], heads),
                           hf[f"model.layers.{i}.self_attn.q_proj.weight"])
        assert torch.equal(hf_permute(meta[f"layers.{i}.attention.wk.weight"], kv_heads),
                           hf[f"model.layers.{i}.self_attn.k_proj.weight"])


def test_hf_to_meta_on_a_mixtral_layout(tmp_path: Path) -> None:
    """A Mixtral folder (8 query heads, 4 key/value heads, experts): the attention is Llama's, so the
    shipped recipe permutes it with the Mixtral config's head counts; the experts keep their names."""
    torch.manual_seed(7)
    config = transformers.MixtralConfig(vocab_size=64, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=8, num_key_value_heads=4, num_local_experts=2,
                                        num_experts_per_tok=1)
    transformers.MixtralForCausalLM(config).save_pretrained(tmp_path / "my-mixtral", safe_serialization=True)
    hf = st.load_file(tmp_path / "my-mixtral" / "model.safetensors")
    out = tmp_path / "meta.pt"
    r = migrate("run", str(RECIPES / "llama-hf-to-meta.yaml"), "--source", str(tmp_path / "my-mixtral"),
                "--target", str(out), "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    meta = torch.load(out, weights_only=True)
    for i in range(2):
        assert torch.equal(hf_permute(meta[f"layers.{i}.attention.wq.weight"], 8),
                           hf[f"model.layers.{i}.self_attn.q_proj.weight"])
        assert torch.equal(hf_permute(meta[f"layers.{i}.attention.wk.weight"], 4),
                           hf[f"model.layers.{i}.self_attn.k_proj.weight"])
    experts = sorted(k for k in hf if ".mlp.experts." in k or "block_sparse_moe" in k)
    assert experts and all(torch.equal(meta[k], hf[k]) for k in experts)


@pytest.mark.parametrize(("heads", "kv_heads"), LAYOUTS)
def test_meta_to_hf_reads_the_users_params(tmp_path: Path, heads: int, kv_heads: int) -> None:
    torch.manual_seed(7)
    dim, kv = 16 * heads, 16 * kv_heads
    layers = {}
    for i in range(2):
        layers[f"layers.{i}.attention.wq.weight"] = torch.randn(dim, dim)
        layers[f"layers.{i}.attention.wk.weight"] = torch.randn(kv, dim)
        layers[f"layers.{i}.attention.wv.weight"] = torch.randn(kv, dim)
        layers[f"layers.{i}.attention.wo.weight"] = torch.randn(dim, dim)
    src = tmp_path / "my-meta"
    src.mkdir()
    torch.save(layers, src / "consolidated.00.pth")
    (src / "params.json").write_text(json.dumps({"dim": dim, "n_layers": 2, "n_heads": heads,
                                                 "n_kv_heads": kv_heads, "vocab_size": 64}))
    out = tmp_path / "hf" / "model.safetensors"
    r = migrate("run", str(RECIPES / "llama-meta-to-hf.yaml"), "--source", str(src / "consolidated.00.pth"),
                "--target", str(out), "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    hf = st.load_file(out)
    for i in range(2):
        assert torch.equal(hf[f"model.layers.{i}.self_attn.q_proj.weight"],
                           hf_permute(layers[f"layers.{i}.attention.wq.weight"], heads))
        assert torch.equal(hf[f"model.layers.{i}.self_attn.k_proj.weight"],
                           hf_permute(layers[f"layers.{i}.attention.wk.weight"], kv_heads))


def test_a_source_without_a_config_is_refused_not_read_from_the_example(tmp_path: Path) -> None:
    hf = tmp_path / "bare"
    _hf_model(hf, 8, 4)
    (hf / "config.json").unlink()
    r = migrate("run", str(RECIPES / "llama-hf-to-meta.yaml"), "--source", str(hf / "model.safetensors"),
                "--target", str(tmp_path / "x.pt"), "--no-progress")
    assert r.returncode == 2, r.stdout + r.stderr
    # the folder looked in is the user's, and the recipe's line is named
    assert f"is in {hf}" in r.stderr and "llama-hf-to-meta.yaml:" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "x.pt").exists()


def test_each_job_reads_its_own_models_config(tmp_path: Path) -> None:
    """`--each`: every match is a job of its own, with the config beside that match."""
    layouts = {"wide": (8, 4), "narrow": (4, 1)}
    models = {name: _hf_model(tmp_path / "models" / name, *hk) for name, hk in layouts.items()}
    r = migrate("run", str(RECIPES / "llama-hf-to-meta.yaml"), "--each",
                str(tmp_path / "models" / "*" / "model.safetensors"),
                "--target", str(tmp_path / "out" / "{parent}.pt"), "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    for name, (heads, kv_heads) in layouts.items():
        meta = torch.load(tmp_path / "out" / f"{name}.pt", weights_only=True)
        hf = models[name]
        assert torch.equal(hf_permute(meta["layers.1.attention.wq.weight"], heads),
                           hf["model.layers.1.self_attn.q_proj.weight"])
        assert torch.equal(hf_permute(meta["layers.1.attention.wk.weight"], kv_heads),
                           hf["model.layers.1.self_attn.k_proj.weight"])


def test_config_option_names_the_config(tmp_path: Path) -> None:
    """`--config FILE` is read in place of the config beside the source (here there is none)."""
    hf = _hf_model(tmp_path / "weights", 8, 4)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "weights" / "config.json").rename(tmp_path / "elsewhere" / "config.json")
    out = tmp_path / "meta.pt"
    for command in ("plan", "run"):
        r = migrate(command, str(RECIPES / "llama-hf-to-meta.yaml"), "--source", str(tmp_path / "weights"),
                    "--config", str(tmp_path / "elsewhere" / "config.json"), "--target", str(out),
                    "--no-progress" if command == "run" else "--json")
        assert r.returncode == 0, r.stdout + r.stderr
    meta = torch.load(out, weights_only=True)
    for ours, theirs, heads in (("wq", "q_proj", 8), ("wk", "k_proj", 4)):
        assert torch.equal(hf_permute(meta[f"layers.0.attention.{ours}.weight"], heads),
                           hf[f"model.layers.0.self_attn.{theirs}.weight"])


def test_the_python_api_reads_the_config_beside_its_source(tmp_path: Path) -> None:
    """`migrator.run_recipe(RECIPE, source=..., target=...)`, the API's overrides, as `--source` does."""
    import migrator

    hf = _hf_model(tmp_path / "api-llama", 8, 4)
    out = tmp_path / "meta.pt"
    migrator.run_recipe(RECIPES / "llama-hf-to-meta.yaml", source=tmp_path / "api-llama", target=out)
    meta = torch.load(out, weights_only=True)
    for ours, theirs, heads in (("wq", "q_proj", 8), ("wk", "k_proj", 4)):
        assert torch.equal(hf_permute(meta[f"layers.0.attention.{ours}.weight"], heads),
                           hf[f"model.layers.0.self_attn.{theirs}.weight"])


def test_diff_recipe_reads_the_config_beside_a(tmp_path: Path) -> None:
    """`migrate diff A B --recipe R`: A takes the recipe's source's place, so its config is A's."""
    _hf_model(tmp_path / "my-llama", 8, 4)
    out = tmp_path / "meta.pt"
    r = migrate("run", str(RECIPES / "llama-hf-to-meta.yaml"), "--source", str(tmp_path / "my-llama"),
                "--target", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    r = migrate("diff", str(tmp_path / "my-llama"), str(out), "--recipe", str(RECIPES / "llama-hf-to-meta.yaml"),
                "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["matched"] is True


def test_source_name_path_replaces_the_first_of_sources_and_its_config(tmp_path: Path) -> None:
    """`--source NAME=PATH` on a `sources:` recipe: the first entry's replacement brings its config."""
    example = tmp_path / "example"
    _hf_model(example, 4, 2)  # the recipe's own example: 4/2 heads
    hf = _hf_model(tmp_path / "mine", 8, 4)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "version: 1\nsources:\n  - {name: llama, path: example/model.safetensors}\n"
        "ops:\n  - rope_permute: {from: 'model\\.layers\\.\\d+\\.self_attn\\.q_proj\\.weight', "
        "heads: '${config.num_attention_heads}', inverse: true}\n"
        "  - rope_permute: {from: 'model\\.layers\\.\\d+\\.self_attn\\.k_proj\\.weight', "
        "heads: '${config.num_key_value_heads}', inverse: true}\n"
        "target: {path: out.safetensors}\n")
    r = migrate("run", str(recipe), "--source", f"llama={tmp_path / 'mine'}", "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    out = st.load_file(tmp_path / "out.safetensors")
    for ours, heads in (("q_proj", 8), ("k_proj", 4)):
        name = f"model.layers.1.self_attn.{ours}.weight"
        assert torch.equal(hf_permute(out[name], heads), hf[name])
