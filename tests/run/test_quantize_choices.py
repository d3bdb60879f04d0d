"""`--quantize FP8_*` / the recipe's `quantize:`: what is quantized and what is kept (and said), the
ignore list as a recipe key, and every refusal (exit 2 for a target that cannot hold it or an unknown
name, exit 1 naming the problem for a source quantized already, an unknown 2-D module, NaN weights),
with the existing target surviving. The written values are compressed-tensors' (test_quantize_fp8.py);
here the inputs are written with safetensors' own numpy writer and read back with it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.support.cli import convert_clean, migrate_in_process

torch = pytest.importorskip("torch")
from safetensors.torch import load_file  # noqa: E402  # F8_E4M3 has no numpy dtype

H = 16


def moe_folder(folder: Path, *, config: dict | None = None, extra: dict[str, np.ndarray] | None = None) -> Path:
    """A small MoE-shaped model folder (router `mlp.gate`, experts, an untied lm_head), F32, seeded."""
    rng = np.random.default_rng(0)
    names = {"model.embed_tokens.weight": (40, H), "model.norm.weight": (H,), "lm_head.weight": (40, H),
             "model.layers.0.input_layernorm.weight": (H,), "model.layers.0.self_attn.q_proj.weight": (H, H),
             "model.layers.0.self_attn.q_proj.bias": (H,), "model.layers.0.mlp.gate.weight": (4, H),
             "model.layers.0.mlp.experts.0.up_proj.weight": (24, H),
             "model.layers.0.mlp.experts.0.down_proj.weight": (H, 24)}
    tensors = {n: rng.standard_normal(s).astype(np.float32) for n, s in names.items()}
    tensors.update(extra or {})
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    cfg = {"model_type": "qwen2_moe", "num_experts": 4, "tie_word_embeddings": False, "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config if config is not None else cfg))
    return folder


def test_linears_quantized_the_usual_ones_kept_and_said(tmp_path: Path) -> None:
    src = moe_folder(tmp_path / "src")
    p = migrate_in_process("convert", str(src), f"{tmp_path / 'out'}/", "--quantize", "FP8_DYNAMIC")
    assert p.returncode == 0, p.stderr
    got = load_file(str(tmp_path / "out" / "model.safetensors"))
    quantized = {n[:-len("_scale")] for n in got if n.endswith("weight_scale")}
    assert quantized == {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.experts.0.up_proj.weight",
                         "model.layers.0.mlp.experts.0.down_proj.weight"}
    for n in quantized:
        assert got[n].dtype == torch.float8_e4m3fn and got[n + "_scale"].shape == (got[n].shape[0], 1)
        assert got[n + "_scale"].dtype == torch.float32
    source = load_file(str(src / "model.safetensors"))
    for n in set(source) - quantized:  # embeddings, norms, the router, lm_head, the bias: as they were
        assert torch.equal(got[n], source[n]) and got[n].dtype == source[n].dtype, n
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["quantization_config"]["ignore"] == ["model.layers.0.mlp.gate", "lm_head"]
    assert config["num_experts"] == 4  # the rest of the source's config as it was
    assert "3 Linear weights written F8_E4M3" in p.stdout
    assert "an MoE router): model.layers.0.mlp.gate" in p.stdout and "the output head): lm_head" in p.stdout


def test_the_recipe_ignore_key_replaces_the_default(tmp_path: Path) -> None:
    src = moe_folder(tmp_path / "src")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource: {{path: {src}}}\ntarget: {{path: {tmp_path / 'out'}/, copy: "
                      "[config.json]}\nquantize:\n  scheme: FP8_BLOCK\n  ignore: ['mlp\\.gate$', 'q_proj$']\n")
    p = migrate_in_process("run", str(recipe), "--report", str(tmp_path / "report.json"))
    assert p.returncode == 0, p.stderr
    from migrator.plan.report import ApplyReport

    report = json.loads((tmp_path / "report.json").read_text())
    assert report["quantized"] == {"scheme": "FP8_BLOCK", "tensors": [
        "lm_head.weight", "model.layers.0.mlp.experts.0.down_proj.weight",
        "model.layers.0.mlp.experts.0.up_proj.weight"], "kept": [
        {"module": "model.layers.0.mlp.gate", "why": "ignore 'mlp\\.gate$'"},
        {"module": "model.layers.0.self_attn.q_proj", "why": "ignore 'q_proj$'"}]}
    assert ApplyReport.from_json(report).to_json() == report
    assert "Quantized FP8_BLOCK (3 weights, 2 Linear modules kept)" in p.stdout
    got = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert "lm_head.weight_scale" in got and got["lm_head.weight_scale"].shape == (1, 1)  # one partial block
    assert "model.layers.0.self_attn.q_proj.weight_scale" not in got
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["quantization_config"]["ignore"] == ["model.layers.0.mlp.gate", "model.layers.0.self_attn.q_proj"]
    assert config["quantization_config"]["config_groups"]["group_0"]["weights"]["block_structure"] == [128, 128]


@pytest.mark.parametrize(("dst", "args", "words"), [
    ("out.bpk", (), "DST is a burnpack file"),
    ("out.gguf", (), "DST is a gguf file"),
    ("out/", ("--to", "pytorch"), "DST is a pytorch"),
    ("out/", ("--quantize", "FP8_DYNAMC"), "did you mean 'FP8_DYNAMIC'?"),
    ("out/", ("--quantize", "Q8_0"), "is a ggml type"),
])
def test_a_target_that_cannot_hold_it_or_an_unknown_name_is_a_usage_error(
        tmp_path: Path, dst: str, args: tuple[str, ...], words: str) -> None:
    src = moe_folder(tmp_path / "src")
    given = ("--quantize", "FP8_DYNAMIC") if "--quantize" not in args else ()
    code, stderr = convert_clean(src, tmp_path / dst if not dst.endswith("/") else f"{tmp_path / dst}", *given, *args)
    assert code == 2 and words in stderr, stderr
    assert not (tmp_path / dst.rstrip("/")).exists()


@pytest.mark.parametrize(("config", "extra", "words"), [
    ({"quantization_config": {"quant_method": "fp8"}}, None,
     "quantized already (quantization_config, quant_method fp8)"),
    (None, {"model.layers.0.mlp.experts.0.up_proj.weight_scale": np.ones((24, 1), np.float32)},
     "holds quantized tensors already"),
    (None, {"model.layers.0.mystery.weight": np.ones((3, H), np.float32)}, "--modules 'Linear="),
    ({"model_type": "mlp"}, "linears only", "no Linear weight to quantize (none, or every one ignored: lm_head"),
    (None, {"model.layers.0.self_attn.k_proj.weight": np.full((H, H), np.nan, np.float32)},
     "tensor 'model.layers.0.self_attn.k_proj.weight': NaN or inf values cannot be quantized"),
])
def test_bad_sources_are_refused_and_the_target_survives(tmp_path: Path, config: dict | None,
                                                         extra: dict | str | None, words: str) -> None:
    if extra == "linears only":  # a model whose one Linear is the (ignored) head
        src = tmp_path / "src"
        src.mkdir()
        save_file({"lm_head.weight": np.ones((4, H), np.float32), "embed_tokens.weight": np.ones((4, H), np.float32)},
                  str(src / "model.safetensors"))
        (src / "config.json").write_text(json.dumps(config))
    else:
        src = moe_folder(tmp_path / "src", config=config, extra=extra)
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"old")
    code, stderr = convert_clean(src, f"{out}/", "--quantize", "FP8_DYNAMIC", "--overwrite")
    assert code == 1 and words in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert (out / "model.safetensors").read_bytes() == b"old" and sorted(p.name for p in out.iterdir()) == [
        "model.safetensors"]
