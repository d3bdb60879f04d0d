"""Merges of quantized models: `migrate merge` (a mergekit YAML) and a `sources:` recipe whose entries
are a fine-grained FP8 folder, a compressed-tensors float-quantized one and a plain BF16 one. Each
quantized model is dequantized by the cast (`--dtype`, `dtype: {cast: ...}`) before the arithmetic; the
oracle is mergekit 0.1.5's own `mergekit-yaml` on the same models dequantized by compressed-tensors
(`FP8BlockDequantizer`, `FloatQuantizationCompressor.decompress`) and saved by safetensors. Without a
cast the merge is refused in one line (never arithmetic on codes), nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import migrate_in_process
from tests.support.quantized import ct_float_folder, fp8_folder, save_folder, tiny_llama

torch = pytest.importorskip("torch")
pytest.importorskip("mergekit")
safetensors_torch = pytest.importorskip("safetensors.torch")
fp8block = pytest.importorskip("compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer")
naive = pytest.importorskip("compressed_tensors.compressors.naive_quantized.base")
ct_quant = pytest.importorskip("compressed_tensors.quantization")

CONFIGS = {
    "linear": "merge_method: linear\nmodels:\n  - {model: MODELS/fp8, parameters: {weight: 0.5}}\n"
              "  - {model: MODELS/ct, parameters: {weight: 0.3}}\n"
              "  - {model: MODELS/plain, parameters: {weight: 0.2}}\n"
              "dtype: float32\n",
    "task_arithmetic": "merge_method: task_arithmetic\nbase_model: MODELS/plain\nmodels:\n"
                       "  - {model: MODELS/fp8, parameters: {weight: 0.7}}\n"
                       "  - {model: MODELS/ct, parameters: {weight: 0.4}}\n"
                       "dtype: float32\n",
}


def _plain_config(config: dict, dtype: str) -> dict:
    out = {k: v for k, v in config.items() if k != "quantization_config"}
    return {**out, "architectures": ["LlamaForCausalLM"], "torch_dtype": dtype}


def dequantized_fp8(stored: dict) -> dict:
    d = fp8block.FP8BlockDequantizer(weight_block_size=(32, 32), dtype=torch.float32)
    out = {n: t for n, t in stored.items() if not n.endswith("_scale_inv")}
    out.update({n: d._create_dequantized_weight(t, stored[n + "_scale_inv"]) for n, t in stored.items()
                if n + "_scale_inv" in stored})
    return out


def dequantized_ct(stored: dict, qc: dict) -> dict:
    group = qc["config_groups"]["group_0"]
    scheme = ct_quant.QuantizationScheme(targets=group["targets"],
                                         weights=ct_quant.QuantizationArgs(**group["weights"]))
    out = {n: t for n, t in stored.items() if not n.endswith("_scale")}
    for name, t in stored.items():
        if name + "_scale" in stored:
            d = naive.FloatQuantizationCompressor.decompress({"weight": t, "weight_scale": stored[name + "_scale"]},
                                                             scheme)
            out[name] = d["weight"].to(torch.float32)
    return out


RUN_ALL = """
import sys
from mergekit.scripts.run_yaml import main
for cfg, out in zip(sys.argv[1::2], sys.argv[2::2]):
    main([cfg, out, "--quiet", "--no-copy-tokenizer", "--no-write-model-card"], standalone_mode=False)
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quantized models (`q/`), the same dequantized by compressed-tensors (`deq/`), the configs for
    each, and mergekit's merges of the dequantized ones (`mk-NAME`)."""
    root = tmp_path_factory.mktemp("qmerge")

    def arch(config: dict) -> None:
        config["architectures"] = ["LlamaForCausalLM"]

    fp8, fp8_stored = fp8_folder(root / "q" / "fp8", seed=0)
    ct, ct_stored, qc = ct_float_folder(root / "q" / "ct", "channel", seed=1)
    plain_config, plain = tiny_llama(2)
    save_folder(root / "q" / "plain", plain, _plain_config(plain_config, "bfloat16"))
    for folder in (fp8, ct):  # mergekit reads the architecture from config.json
        config = json.loads((folder / "config.json").read_text())
        arch(config)
        (folder / "config.json").write_text(json.dumps(config))
    save_folder(root / "deq" / "fp8", dequantized_fp8(fp8_stored),
                _plain_config(json.loads((fp8 / "config.json").read_text()), "float32"))
    save_folder(root / "deq" / "ct", dequantized_ct(ct_stored, qc),
                _plain_config(json.loads((ct / "config.json").read_text()), "float32"))
    save_folder(root / "deq" / "plain", plain, _plain_config(plain_config, "bfloat16"))
    args = []
    for name, text in CONFIGS.items():
        (root / f"{name}-q.yml").write_text(text.replace("MODELS", str(root / "q")))
        (root / f"{name}-deq.yml").write_text(text.replace("MODELS", str(root / "deq")))
        args += [str(root / f"{name}-deq.yml"), str(root / f"mk-{name}")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", RUN_ALL, *args], check=True, cwd=root, capture_output=True, env=env)
    return root


def tensors(folder: Path) -> dict[str, np.ndarray]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update({k: v.float().numpy() for k, v in safetensors_torch.load_file(str(f)).items()})
    return out


def ok(*args: str):
    p = migrate_in_process(*args)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 0, p.stdout + p.stderr
    return p


@pytest.mark.parametrize("name", list(CONFIGS))
def test_merge_of_quantized_models_equals_mergekit_on_their_dequantization(models: Path, name: str) -> None:
    out = models / f"ours-{name}"
    ok("merge", str(models / f"{name}-q.yml"), f"{out}/", "--dtype", "F32", "--overwrite")
    ours, theirs = tensors(out), tensors(models / f"mk-{name}")
    assert sorted(ours) == sorted(theirs) and not [n for n in ours if "_scale" in n]
    for k, v in theirs.items():
        np.testing.assert_allclose(ours[k], v, rtol=0, atol=1e-6, err_msg=k)
    # a wrong dequantization (the codes' values, the scales ignored) would be far off: the check can fail
    w = "model.layers.0.mlp.down_proj.weight"
    assert np.abs(ours[w]).max() < 1.0
    written = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in written


def test_merge_of_quantized_models_without_a_cast_is_refused(models: Path, tmp_path: Path) -> None:
    p = migrate_in_process("merge", str(models / "linear-q.yml"), f"{tmp_path / 'out'}/")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    line = p.stderr.strip()
    assert "\n" not in line and "is quantized" in line and "--dtype" in line and "fp8" in line
    assert not (tmp_path / "out").exists()


def test_recipe_merging_quantized_sources_equals_mergekit(models: Path, tmp_path: Path) -> None:
    """The merge as a plain recipe (`--emit-recipe`): `sources:` entries dequantized by its cast, then a
    `linear` op; the same values as mergekit's on the dequantized models."""
    recipe = tmp_path / "r.yaml"
    ok("merge", str(models / "linear-q.yml"), f"{tmp_path / 'unused'}/", "--dtype", "F32", "--emit-recipe",
       "-o", str(recipe))
    text = recipe.read_text()
    assert "sources:" in text and "linear:" in text and "cast: F32" in text
    out = tmp_path / "run"
    text = text.replace("unused", "run")
    recipe.write_text(text)
    ok("run", str(recipe))
    ours, theirs = tensors(out), tensors(models / "mk-linear")
    assert sorted(ours) == sorted(theirs)
    for k, v in theirs.items():
        np.testing.assert_allclose(ours[k], v, rtol=0, atol=1e-6, err_msg=k)
    # without the cast the recipe's op is refused on the FP8 codes, in one line
    import yaml

    before = sorted(out.iterdir())
    data = yaml.safe_load(text)
    del data["dtype"]
    recipe.write_text(yaml.safe_dump(data))
    p = migrate_in_process("run", str(recipe), "--overwrite")
    assert p.returncode == 1 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "sources[0] is quantized" in p.stderr and "ops: linear" in p.stderr and "--dtype" in p.stderr, p.stderr
    assert not out.exists() or sorted(out.iterdir()) == before
