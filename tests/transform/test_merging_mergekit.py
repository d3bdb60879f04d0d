"""mergekit configs merged by migrator, against mergekit 0.1.5's own `mergekit-yaml` on the same folders.

Three seeded 4-layer tiny Llamas are saved once; every config is run through mergekit's CLI command
(its click entry point, all configs in one interpreter: importing mergekit costs seconds) and through
`run.merge.merge_folder`, with bands of a few hundred bytes so that every op streams. Each
tensor must be within 1e-6 of mergekit's, and config.json equal to the one mergekit writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("mergekit")

from migrator.core.errors import MergeInputError
from migrator.files.io import open_file
from migrator.ops.compute import arithmetic
from migrator.recipe.issues import RecipeError
from migrator.recipe.mergekit import evaluate, load_config, merge_spec
from migrator.run.merge import merge_folder
from tests.support.models import tiny_llama

CONFIGS: dict[str, str] = {
    "linear": """
merge_method: linear
models:
  - model: m0
    parameters: {weight: [1.0, 0.2]}
  - model: m1
    parameters:
      weight:
        - {filter: mlp, value: 0.7}
        - {value: 0.3}
  - model: m2
    parameters: {weight: 0.5}
dtype: float32
""",
    "task_arithmetic": """
merge_method: task_arithmetic
base_model: m0
models:
  - model: m1
    parameters: {weight: 0.6}
  - model: m2
    parameters: {weight: [0.1, 0.9]}
parameters: {lambda: 0.8}
dtype: float32
""",
    "slerp": """
merge_method: slerp
base_model: m0
slices:
  - sources:
      - {model: m0, layer_range: [0, 4]}
      - {model: m1, layer_range: [0, 4]}
parameters:
  t:
    - filter: self_attn
      value: [0, 0.5, 0.3, 0.7, 1]
    - filter: mlp
      value: [1, 0.5, 0.7, 0.3, 0]
    - value: 0.5
dtype: float32
""",
    "slerp_colinear": """
merge_method: slerp
base_model: m0
models:
  - model: m0
  - model: m0x2
parameters: {t: 0.3}
dtype: float32
""",
    "ties": """
merge_method: ties
base_model: m0
models:
  - model: m0
  - model: m1
    parameters: {weight: [0.2, 0.8], density: 0.5}
  - model: m2
    parameters: {weight: 0.5, density: [0.9, 0.3]}
dtype: float32
""",
    "ties_d1": """
merge_method: ties
base_model: m0
models:
  - model: m1
    parameters: {weight: 0.4, density: 1.0}
  - model: m2
    parameters: {weight: 0.7, density: 1.0}
dtype: float32
""",
    "dare_ties_d1": """
merge_method: dare_ties
base_model: m0
models:
  - model: m1
    parameters: {weight: 0.4, density: 1.0}
  - model: m2
    parameters: {weight: 0.7, density: 1.0}
parameters: {normalize: true}
dtype: float32
""",
    "dare_linear": """
merge_method: dare_linear
base_model: m0
models:
  - model: m1
    parameters: {weight: 1.0, density: 0.3}
dtype: float32
""",
    "passthrough": """
merge_method: passthrough
slices:
  - sources: [{model: m0, layer_range: [0, 3]}]
  - sources: [{model: m1, layer_range: [1, 4]}]
  - sources:
      - model: m2
        layer_range: [3, 4]
        parameters: {scale: [{filter: o_proj, value: 0.5}, {value: 1.0}]}
dtype: float32
""",
    "lora_linear": """
merge_method: linear
models:
  - model: m0+ad0
    parameters: {weight: 0.5}
  - model: m1
    parameters: {weight: 0.5}
dtype: float32
""",
    "bf16_out": """
merge_method: linear
models:
  - model: m0
    parameters: {weight: 0.3}
  - model: m1
    parameters: {weight: 0.7}
out_dtype: bfloat16
""",
}

RUN_ALL = """
import sys
from mergekit.scripts.run_yaml import main
for cfg, out in zip(sys.argv[1::2], sys.argv[2::2]):
    main([cfg, out, "--quiet", "--random-seed", "7", "--no-copy-tokenizer", "--no-write-model-card",
          "--lora-merge-cache", "lora-cache"], standalone_mode=False)
"""


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The models, the configs and mergekit's outputs (`mk-NAME`), made once for the module."""
    root = tmp_path_factory.mktemp("mergekit")
    import torch

    for i in range(3):
        tiny_llama(layers=4, seed=i).save_pretrained(root / f"m{i}")
    doubled = tiny_llama(layers=4, seed=0)  # m0 times 2: colinear with m0 in every tensor (SLERP's linear branch)
    with torch.no_grad():
        for p in doubled.parameters():
            p.mul_(2)
    doubled.save_pretrained(root / "m0x2")
    import peft

    adapted = peft.get_peft_model(tiny_llama(layers=4, seed=0),
                                  peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    adapted.save_pretrained(root / "ad0")
    args: list[str] = []
    for name, text in CONFIGS.items():
        (root / f"{name}.yml").write_text(text)
        args += [str(root / f"{name}.yml"), str(root / f"mk-{name}")]
    mergekit_bin = Path(sys.executable).parent / "mergekit-yaml"
    assert mergekit_bin.exists()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", RUN_ALL, *args], check=True, cwd=root, capture_output=True, env=env)
    return root


@pytest.fixture(autouse=True)
def _small_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("migrator.ops.compute.bands.BAND_BYTES", 512)


def _tensors(folder: Path) -> dict[str, np.ndarray]:
    with open_file(folder) as r:
        return {k: t.numpy().astype(np.float32) for k, t in r.items()}


def _ours(root: Path, name: str, **kwargs: Any) -> Path:
    out = root / f"ours-{name}-{len(kwargs)}"
    merge_folder(root / f"{name}.yml", out, overwrite=True, **kwargs)
    return out


@pytest.mark.parametrize("name", ["linear", "task_arithmetic", "slerp", "slerp_colinear", "ties", "ties_d1",
                                  "dare_ties_d1", "passthrough", "lora_linear"])
def test_matches_mergekit(merged: Path, name: str) -> None:
    ours = _tensors(_ours(merged, name, seed=1))
    theirs = _tensors(merged / f"mk-{name}")
    assert sorted(ours) == sorted(theirs)
    for k in theirs:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=0, atol=1e-6, err_msg=k)
    base = _tensors(merged / "m0")
    assert any(not np.array_equal(ours[k], base.get(k)) for k in ours)  # the merge did something


def test_dare_ties_at_density_one_is_ties(merged: Path) -> None:
    a = _tensors(_ours(merged, "dare_ties_d1", seed=3))
    b = _tensors(_ours(merged, "ties_d1"))
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_config_json_as_mergekit_writes_it(merged: Path) -> None:
    for name in ("passthrough", "ties", "bf16_out"):
        ours = json.loads((_ours(merged, name, seed=1) / "config.json").read_text())
        theirs = json.loads((merged / f"mk-{name}" / "config.json").read_text())
        assert ours == theirs, name
    assert json.loads((merged / "ours-passthrough-1" / "config.json").read_text())["num_hidden_layers"] == 7
    assert (merged / "ours-passthrough-1" / "mergekit_config.yml").read_text() == CONFIGS["passthrough"]


def test_bf16_output_rounds_once(merged: Path) -> None:
    out = _ours(merged, "bf16_out")
    with open_file(out) as r:
        assert {t.dtype.name for t in r.values()} == {"BF16"}
    ours, theirs = _tensors(out), _tensors(merged / "mk-bf16_out")
    m0, m1 = _tensors(merged / "m0"), _tensors(merged / "m1")
    import torch

    for k in theirs:
        once = torch.from_numpy((m0[k] * np.float32(0.3) + m1[k] * np.float32(0.7)) / np.float32(1.0))
        assert np.array_equal(ours[k], once.to(torch.bfloat16).float().numpy()), k
        ulp = np.spacing(np.abs(theirs[k])) * 2 ** 16
        assert np.all(np.abs(ours[k] - theirs[k]) <= ulp), k


def test_dare_against_own_sampler_and_mergekit(merged: Path) -> None:
    """density 0.3: the kept elements are exactly those the documented sampler keeps, rescaled by mergekit's
    L1 factor; mergekit (its own torch RNG) keeps about the same share with about the same factor."""
    ours, theirs = _tensors(_ours(merged, "dare_linear", seed=11)), _tensors(merged / "mk-dare_linear")
    m0, m1 = _tensors(merged / "m0"), _tensors(merged / "m1")
    name = "model.layers.2.mlp.down_proj.weight"
    delta = m1[name] - m0[name]
    keep = arithmetic.dare_generator(11, name, 1).random(delta.size).reshape(delta.shape) < 0.3
    factor = np.abs(delta).sum(dtype=np.float64) / np.abs(delta[keep]).sum(dtype=np.float64)
    expected = m0[name] + np.where(keep, delta * np.float32(factor), np.float32(0))
    np.testing.assert_allclose(ours[name], expected, rtol=0, atol=1e-6)
    assert np.array_equal(ours[name] != m0[name], keep)
    total_ours, kept_ours, kept_theirs, n = 0.0, 0, 0, 0
    for k in m0:
        d = m1[k] - m0[k]
        if not d.any():
            continue
        ours_kept = ours[k] != m0[k]
        theirs_kept = ~np.isclose(theirs[k], m0[k], rtol=0, atol=0)
        kept_ours += int(ours_kept.sum())
        kept_theirs += int(theirs_kept.sum())
        n += d.size
        total_ours += float(np.abs(ours[k] - m0[k]).sum())
    sigma = np.sqrt(0.3 * 0.7 / n)
    assert abs(kept_ours / n - 0.3) < 5 * sigma and abs(kept_theirs / n - 0.3) < 5 * sigma
    # both rescale the kept deltas by about 1 / density (the L1 factor's expectation)
    big = max(m0, key=lambda k: m0[k].size)
    d = m1[big] - m0[big]
    for out in (ours[big], theirs[big]):
        kept = out != m0[big]
        ratio = float(np.median((out[kept] - m0[big][kept]) / d[kept]))
        assert abs(ratio - 1 / 0.3) < 0.3, ratio
    assert total_ours > 0


def test_dare_is_reproducible_and_seeded(merged: Path) -> None:
    a = _tensors(_ours(merged, "dare_linear", seed=5))
    b = _tensors(_ours(merged, "dare_linear", seed=5))
    c = _tensors(_ours(merged, "dare_linear", seed=6))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert any(not np.array_equal(a[k], c[k]) for k in a)
    with pytest.raises(RecipeError, match="dare_linear drops at random: give a seed"):
        merge_folder(merged / "dare_linear.yml", merged / "never")


def test_sampler_does_not_depend_on_bands(monkeypatch: pytest.MonkeyPatch, merged: Path) -> None:
    a = _tensors(_ours(merged, "dare_linear", seed=9))
    monkeypatch.setattr("migrator.ops.compute.bands.BAND_BYTES", 1 << 22)
    out = merged / "ours-dare-big-bands"
    merge_folder(merged / "dare_linear.yml", out, seed=9)
    b = _tensors(out)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_gradient_and_filter_evaluation() -> None:
    assert evaluate([0.0, 1.0], "x", 0.25) == 0.25
    assert evaluate([1, 0.5, 0.7, 0.3, 0], "x", 0.5) == 0.7
    assert evaluate([True, False], "x", 0.9) is True  # non-numeric lists are indexed, not interpolated
    setting = [{"filter": "self_attn", "value": 2.0}, {"value": 1.0}]
    from migrator.recipe.mergekit import Conditional

    conds = [Conditional(**s) for s in setting]  # type: ignore[arg-type]
    assert evaluate(conds, "model.layers.0.self_attn.q_proj.weight", 0) == 2.0
    assert evaluate(conds, "model.layers.0.mlp.up_proj.weight", 0) == 1.0


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "message"), [
    ("merge_method: della\nmodels: [{model: .}]\n", r"cfg\.yml:1:15: merge_method: merge_method 'della' is not"),
    ("merge_method: linear\nmodels:\n  - model: meta-llama/Llama-3-8B\n",
     r"cfg\.yml:3:12: models\[0\]\.model: 'meta-llama/Llama-3-8B' is a Hugging Face hub id"),
    ("merge_method: ties\nbase_model: .\nmodels: [{model: .}]\nparameters: {int8_mask: true}\n",
     r"cfg\.yml:4:25: parameters\.int8_mask: int8_mask is not supported"),
    ("merge_method: linear\nmodels: [{model: ., parameters: {wieght: 1}}]\n",
     r"cfg\.yml:2:34: models\[0\]\.parameters\.wieght: parameter 'wieght' is not one linear takes"),
    ("merge_method: linear\nmodels: [{model: .}]\nresidual: 1\n",
     r"cfg\.yml:3:1: residual: 'residual' is not a mergekit config key"),
    ("merge_method: linear\nmodels: [{model: .}]\ntokenizer_source: union\ntokenizer: {source: base}\n",
     r"cfg\.yml:4:12: tokenizer: give tokenizer_source or a tokenizer section, not both"),
    ("merge_method: linear\nmodels: [{model: .}]\ntokenizer: {tokens: {x: {source: other}}}\n",
     r"cfg\.yml:3:34: tokenizer\.tokens\.x\.source: token 'x': 'other' is not one of the merged models"),
    ("merge_method: linear\nmodels: [{model: .}]\ntokenizer: {tokens: {x: {source: {kind: model_token, model: .}}}}\n",
     r"tokenizer\.tokens\.x\.source: token 'x': give exactly one of token or token_id"),
    ("merge_method: linear\nmodels: [{model: .}]\ntokenizer: {pad_to_multiple_of: 0}\n",
     r"tokenizer\.pad_to_multiple_of: pad_to_multiple_of must be at least 1"),
    ("merge_method: linear\nmodels: [{model: .}]\ntokenizer_source: ./nowhere\n",
     r"cfg\.yml:3:19: tokenizer_source: model folder './nowhere' does not exist"),
    ("merge_method: linear\nmodels: [{model: .}]\nmodules: {}\n", "'modules' .per-module merges. is not supported"),
    ("merge_method: linear\nmodels: [{model: .}]\ndtype: int8\n", "dtype 'int8' is not a float dtype"),
    ("merge_method: linear\nmodels: [{model: ./missing}]\n", "model folder './missing' does not exist"),
    ("merge_method: linear\nmodels: [\n", r"cfg\.yml:3:1: invalid YAML"),
    ("merge_method: linear\nmodels: [{model: ., parameters: {weight: {foo: 1}}}]\n",
     r"cfg\.yml:2:42: models\[0\]\.parameters\.weight: a parameter is a scalar, a list of numbers"),
])
def test_refusals_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        load_config(_config(tmp_path, text))


def test_missing_layer_and_tensor_are_named(merged: Path, tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path, f"merge_method: passthrough\nslices:\n"
                                        f"  - sources: [{{model: {merged / 'm0'}, layer_range: [2, 6]}}]\n"))
    with open_file(merged / "m0") as r:
        names = {str(merged / "m0"): list(r.keys())}
    with pytest.raises(MergeInputError, match=r"has no layer 4 \(it has 4\)"):
        merge_spec(cfg, names)
    cfg = load_config(_config(tmp_path, f"merge_method: linear\nmodels:\n  - {{model: {merged / 'm0'}}}\n"
                                        f"  - {{model: {merged / 'm1'}}}\nparameters: {{weight: 1}}\n"))
    with open_file(merged / "m0") as r:
        names = {str(merged / "m0"): list(r.keys()), str(merged / "m1"): [k for k in r if "norm" not in k]}
    with pytest.raises(MergeInputError, match=r"has no tensor .model\.layers\.0\.input_layernorm\.weight."):
        merge_spec(cfg, names)


def test_shape_mismatch_is_named_before_reading() -> None:
    from migrator.core.tensor import from_numpy

    a = from_numpy("w", np.zeros((2, 3), np.float32))
    b = from_numpy("w", np.zeros((3, 2), np.float32))
    with pytest.raises(MergeInputError, match=r"inputs disagree in shape: 'w' \(memory\) \[2, 3\], 'w' .*\[3, 2\]"):
        arithmetic.linear("w", [a, b], [1, 1])


def test_duplicate_models_are_refused(merged: Path) -> None:
    cfg = load_config(_config(merged, "merge_method: linear\nmodels:\n  - {model: m0}\n  - {model: m0}\n"
                                      "parameters: {weight: 1}\n"))
    with open_file(merged / "m0") as r:
        names = {"m0": list(r.keys())}
    with pytest.raises(RecipeError, match=r"cfg\.yml:3:3: models: a model is given twice: m0, m0"):
        merge_spec(cfg, names)


def test_companions_come_from_the_base(merged: Path, tmp_path: Path) -> None:
    import shutil

    for name in ("m0", "m1"):
        shutil.copytree(merged / name, tmp_path / name)
        (tmp_path / name / "tokenizer.json").write_text(f'{{"from": "{name}"}}')
    (tmp_path / "cfg.yml").write_text("merge_method: ties\nbase_model: m0\n"
                                      "models: [{model: m1, parameters: {weight: 1, density: 0.5}}]\n")
    out = tmp_path / "out"
    merge_folder(tmp_path / "cfg.yml", out)
    assert json.loads((out / "tokenizer.json").read_text()) == {"from": "m0"}
    assert (out / "generation_config.json").read_bytes() == (tmp_path / "m0" / "generation_config.json").read_bytes()


def test_cli_merge_matches_mergekit_and_loads(merged: Path, tmp_path: Path) -> None:
    """`migrate merge` end to end: mergekit's tensors and config.json, a folder from_pretrained loads."""
    import transformers

    from tests.support.cli import migrate_in_process

    out = tmp_path / "slerp"
    done = migrate_in_process("merge", str(merged / "slerp.yml"), str(out), "--json", "--max-shard-size", "60KB")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["target"] == str(out)
    assert (out / "model.safetensors.index.json").is_file()  # sharded as asked
    ours, theirs = _tensors(out), _tensors(merged / "mk-slerp")
    assert sorted(ours) == sorted(theirs)
    for k in theirs:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=0, atol=1e-6, err_msg=k)
    assert json.loads((out / "config.json").read_text()) == json.loads((merged / "mk-slerp" / "config.json")
                                                                        .read_text())
    assert (out / "mergekit_config.yml").read_text() == CONFIGS["slerp"]
    transformers.AutoModelForCausalLM.from_pretrained(out)  # loads: every weight present, shapes right


def test_cli_merge_emit_recipe_round_trip(merged: Path, tmp_path: Path) -> None:
    """The recipe `--emit-recipe -o` writes reproduces the merge byte for byte when run."""
    import shutil

    from tests.support.cli import migrate_in_process

    out, recipe = tmp_path / "pt", tmp_path / "recipes" / "pt.yaml"
    done = migrate_in_process("merge", str(merged / "passthrough.yml"), str(out), "--dtype", "BF16",
                              "--emit-recipe", "-o", str(recipe))
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 7
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    shutil.copytree(out, tmp_path / "first")
    again = migrate_in_process("run", str(recipe), "--overwrite")
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (tmp_path / "first").iterdir())
    for p in out.iterdir():
        assert p.read_bytes() == (tmp_path / "first" / p.name).read_bytes(), p.name


def test_cli_merge_exit_codes(merged: Path, tmp_path: Path) -> None:
    from tests.support.cli import migrate_in_process

    bad = _config(tmp_path, "merge_method: linear\nmodels:\n  - model: meta-llama/Llama-3-8B\n")
    done = migrate_in_process("merge", str(bad), str(tmp_path / "o1"))
    assert done.returncode == 2 and "cfg.yml:3:12:" in done.stderr and "hub id" in done.stderr
    done = migrate_in_process("merge", str(bad), str(tmp_path / "o1"), "--json")
    assert done.returncode == 2 and json.loads(done.stdout)["error"]["issues"][0]["line"] == 3
    small = tmp_path / "small"
    tiny_llama(layers=4, seed=0, hidden=16).save_pretrained(small)
    mixed = _config(tmp_path, f"merge_method: linear\nmodels:\n  - {{model: {merged / 'm0'}, parameters: "
                              f"{{weight: 1}}}}\n  - {{model: {small}, parameters: {{weight: 1}}}}\n")
    done = migrate_in_process("merge", str(mixed), str(tmp_path / "o2"))
    assert done.returncode == 1 and "disagree in shape" in done.stderr
    assert not (tmp_path / "o2").exists()
    done = migrate_in_process("merge", str(merged / "dare_linear.yml"), str(tmp_path / "o3"))
    assert done.returncode == 2 and "give a seed" in done.stderr


def test_recipe_ops_match_mergekit(merged: Path, tmp_path: Path) -> None:
    """Hand-written `ops:` over `sources:` with prefixes give mergekit's merges (ties, slerp)."""
    from tests.support.cli import migrate_in_process

    def run(models: tuple[str, ...], op: str) -> dict[str, np.ndarray]:
        recipe = tmp_path / "r.yaml"
        sources = "".join(f"  - {{path: {merged / m}, prefix: '{m}.'}}\n" for m in models)
        recipe.write_text("version: 1\nsources:\n" + sources + "ops:\n  - " + op + "\ntarget: {path: out/}\n")
        done = migrate_in_process("run", str(recipe), "--overwrite")
        assert done.returncode == 0, done.stderr
        return _tensors(tmp_path / "out")

    cases = [(("m0", "m1", "m2"), "ties: {from: ['m0\\.(.*)', 'm1.$1', 'm2.$1'], to: '$1', weights: [0.4, 0.7], "
                                  "density: 1.0}", "ties_d1"),
             (("m0", "m0x2"), "slerp: {from: ['m0\\.(.*)', 'm0x2.$1'], to: '$1', t: 0.3}", "slerp_colinear")]
    for models, op, name in cases:
        ours, theirs = run(models, op), _tensors(merged / f"mk-{name}")
        assert sorted(ours) == sorted(theirs), name
        for k in theirs:
            np.testing.assert_allclose(ours[k], theirs[k], rtol=0, atol=1e-6, err_msg=k)


def test_recipe_op_errors_name_line_and_tensors(merged: Path, tmp_path: Path) -> None:
    from tests.support.cli import migrate_in_process

    small = tmp_path / "small"
    tiny_llama(layers=4, seed=0, hidden=16).save_pretrained(small)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsources:\n  - {{path: {merged / 'm0'}, prefix: a.}}\n"
                      f"  - {{path: {small}, prefix: b.}}\nops:\n"
                      "  - linear: {from: ['a\\.(.*)', 'b.$1'], to: '$1', weights: [1, 1]}\n"
                      "target: {path: out/}\n")
    done = migrate_in_process("run", str(recipe))
    assert done.returncode == 2
    assert "r.yaml:6:" in done.stderr and "disagree in shape" in done.stderr and "'b.lm_head.weight'" in done.stderr
    recipe.write_text("version: 1\nsource: {path: x}\nops:\n"
                      "  - ties: {from: ['a\\.(.*)', 'b.$1', 'c.$1'], weights: [1]}\n"
                      "target: {path: out/}\n")
    done = migrate_in_process("run", str(recipe))
    assert done.returncode == 2 and "r.yaml:4:" in done.stderr and "weights has 1 entries for 2 models" in done.stderr


def _word_tokenizer(folder: Path, words: int) -> None:
    """A WordLevel fast tokenizer of `words` tokens saved into `folder`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[PAD]": 1, **{f"w{i}": i for i in range(2, words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(folder)


def test_tokenizer_source_folder_matches_mergekit(merged: Path, tmp_path: Path) -> None:
    """`tokenizer_source: PATH` with the models' vocabulary: mergekit's tensors, and that folder's tokenizer."""
    import shutil

    from transformers import AutoTokenizer

    for name in ("m0", "m1"):
        shutil.copytree(merged / name, tmp_path / name)
        _word_tokenizer(tmp_path / name, 96)
    _word_tokenizer(tmp_path / "tok", 96)
    (tmp_path / "tok" / "marker.txt").write_text("not a tokenizer file")
    (tmp_path / "tok" / "special_tokens_map.json").write_text('{"pad_token": "[PAD]", "unk_token": "[UNK]"}')
    config = tmp_path / "cfg.yml"
    config.write_text("merge_method: linear\nmodels:\n  - {model: m0, parameters: {weight: 0.3}}\n"
                      "  - {model: m1, parameters: {weight: 0.7}}\ntokenizer_source: tok\ndtype: float32\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([str(Path(sys.executable).parent / "mergekit-yaml"), str(config), str(tmp_path / "mk"), "--quiet",
                    "--no-write-model-card"], check=True, cwd=tmp_path, capture_output=True, env=env)
    out = tmp_path / "out"
    merge_folder(config, out)
    ours, theirs = _tensors(out), _tensors(tmp_path / "mk")
    assert sorted(ours) == sorted(theirs)
    for k in theirs:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=0, atol=1e-6, err_msg=k)
    assert (out / "tokenizer.json").read_bytes() == (tmp_path / "tok" / "tokenizer.json").read_bytes()
    assert (out / "special_tokens_map.json").read_bytes() == (tmp_path / "tok" / "special_tokens_map.json").read_bytes()
    assert not (out / "marker.txt").exists()
    assert AutoTokenizer.from_pretrained(out).get_vocab() == AutoTokenizer.from_pretrained(tmp_path / "mk").get_vocab()


@pytest.mark.parametrize(("text", "message"), [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"model": {"vocab": {"a": 0}}, "x": NaN}', "is not JSON"),
    ("[1, 2]", "is not a JSON object"),
])
def test_a_hostile_tokenizer_source_is_a_clean_error(merged: Path, tmp_path: Path, text: str, message: str) -> None:
    """The tokenizer_source's tokenizer.json is untrusted input: an error naming it, exit 1, no traceback."""
    import shutil

    from tests.support.cli import migrate_in_process

    for name in ("m0", "m1"):
        shutil.copytree(merged / name, tmp_path / name)
        _word_tokenizer(tmp_path / name, 96)  # the base's vocabulary is read first, as mergekit does
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text(text)
    config = tmp_path / "cfg.yml"
    config.write_text("merge_method: linear\nmodels:\n  - {model: m0, parameters: {weight: 0.3}}\n"
                      "  - {model: m1, parameters: {weight: 0.7}}\ntokenizer_source: tok\n")
    done = migrate_in_process("merge", str(config), str(tmp_path / "out"))
    assert done.returncode == 1 and message in done.stderr and "tokenizer.json" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["linear", "task_arithmetic", "slerp", "ties", "dare_linear", "lora_linear",
                                  "bf16_out"])
def test_emit_recipe_is_a_plain_recipe_that_reruns(merged: Path, tmp_path: Path, name: str) -> None:
    """`--emit-recipe` of a models: merge (or slices that keep the layers) writes sources + computed ops, no
    mergekit source; `migrate run` of it writes the same bytes (the recipe replaces mergekit_config.yml)."""
    import yaml

    from tests.support.cli import migrate_in_process

    out, recipe = tmp_path / "out", tmp_path / "recipes" / "r.yaml"
    done = migrate_in_process("merge", str(merged / f"{name}.yml"), str(out), "--seed", "7", "--emit-recipe",
                              "-o", str(recipe))
    assert done.returncode == 0, done.stderr
    data = yaml.safe_load(recipe.read_text())
    assert "source" not in data and data["sources"] and data["ops"]
    assert all(isinstance(s["path"], str) and not s["path"].startswith("/") for s in data["sources"])
    first = tmp_path / "first"
    out.rename(first)
    again = migrate_in_process("run", str(recipe))
    assert again.returncode == 0, again.stderr
    written = sorted(p.name for p in first.iterdir() if p.name != "mergekit_config.yml")
    assert sorted(p.name for p in out.iterdir()) == written
    for p in out.iterdir():
        assert p.read_bytes() == (first / p.name).read_bytes(), p.name
