"""A quantized folder that contradicts its `quantization_config`, or one migrator cannot read, is refused
in one line naming the tensor (or the config key), exit 1, nothing written: an existing target survives
even with --overwrite. Also: `inspect` shows the scheme and the sizes stored and dequantized."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process
from tests.support.quantized import ct_float_folder, fp8_folder

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors.torch")

UP = "model.layers.1.mlp.up_proj"


def refused(src: Path, tmp_path: Path, *words: str, cast: bool = True) -> str:
    """convert SRC onto an existing target with --overwrite: exit 1, one line holding `words`, the
    target's old bytes intact, no scratch file left."""
    target = tmp_path / "out.safetensors"
    target.write_bytes(b"old")
    p = migrate_in_process("convert", str(src), str(target), "--overwrite", *(["--dtype", "BF16"] if cast else []))
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 1, p.stdout + p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert target.read_bytes() == b"old"
    assert not [q for q in tmp_path.iterdir() if q.name.startswith(".")]
    return lines[0]


def scale_set(value: float):
    def edit(t: dict) -> None:
        t[UP + ".weight_scale_inv"][1, 0] = value
    return edit


@pytest.mark.parametrize(("value", "word"), [(float("nan"), "nan"), (float("inf"), "inf"), (0.0, "scale 0")])
def test_nan_inf_and_zero_scales(tmp_path: Path, value: float, word: str) -> None:
    src, _ = fp8_folder(tmp_path / "fp8", edit=scale_set(value))
    refused(src, tmp_path, UP + ".weight_scale_inv", word)


def test_e8m0_code_255(tmp_path: Path) -> None:
    def edit(t: dict) -> None:
        s = t[UP + ".weight_scale_inv"].to(torch.float8_e8m0fnu)
        s.view(torch.uint8)[0, 1] = 255
        t[UP + ".weight_scale_inv"] = s
    src, _ = fp8_folder(tmp_path / "fp8", ue8m0=True, edit=edit)
    refused(src, tmp_path, UP + ".weight_scale_inv", "E8M0 code 255")


def test_ue8m0_scale_not_a_power_of_two(tmp_path: Path) -> None:
    src, _ = fp8_folder(tmp_path / "fp8", ue8m0=True, edit=scale_set(0.3))
    refused(src, tmp_path, UP + ".weight_scale_inv", "not a power of two", "ue8m0")


@pytest.mark.parametrize("cast", [True, False])
def test_scale_shape_disagreeing_with_the_blocks(tmp_path: Path, cast: bool) -> None:
    def edit(t: dict) -> None:
        t[UP + ".weight_scale_inv"] = t[UP + ".weight_scale_inv"][:2].clone()
    src, _ = fp8_folder(tmp_path / "fp8", edit=edit)
    refused(src, tmp_path, UP + ".weight_scale_inv", "[2, 2]", "expected [4, 2]", cast=cast)


def test_absent_scale(tmp_path: Path) -> None:
    def edit(t: dict) -> None:
        del t[UP + ".weight_scale_inv"]
    src, _ = fp8_folder(tmp_path / "fp8", edit=edit)
    refused(src, tmp_path, UP + ".weight", "weight_scale_inv", "not in the checkpoint")


def test_scale_without_its_weight(tmp_path: Path) -> None:
    def edit(t: dict) -> None:
        t["model.layers.1.mlp.extra.weight_scale_inv"] = torch.ones(1, 1)
    src, _ = fp8_folder(tmp_path / "fp8", edit=edit)
    refused(src, tmp_path, "model.layers.1.mlp.extra.weight_scale_inv", "model.layers.1.mlp.extra.weight")


def test_a_skipped_module_with_a_scale(tmp_path: Path) -> None:
    src, _ = fp8_folder(tmp_path / "fp8")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["modules_to_not_convert"] = ["up_proj"]
    (src / "config.json").write_text(json.dumps(config))
    refused(src, tmp_path, "model.layers.0.mlp.up_proj.weight_scale_inv", "modules_to_not_convert")


def test_a_float_weight_with_a_scale(tmp_path: Path) -> None:
    def edit(t: dict) -> None:
        t[UP + ".weight"] = t[UP + ".weight"].to(torch.bfloat16)
    src, _ = fp8_folder(tmp_path / "fp8", edit=edit)
    refused(src, tmp_path, UP + ".weight", "is BF16", "F8_E4M3")


@pytest.mark.parametrize(("key", "value", "word"), [
    ("quant_method", "awq", "quant_method 'awq'"),
    ("weight_block_size", [128], "weight_block_size"),
    ("fmt", "e5m2", "fmt 'e5m2'"),
    ("scale_fmt", "int", "scale_fmt 'int'"),
])
def test_unknown_or_bad_declarations(tmp_path: Path, key: str, value, word: str) -> None:
    src, _ = fp8_folder(tmp_path / "fp8")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"][key] = value
    (src / "config.json").write_text(json.dumps(config))
    refused(src, tmp_path, str(src / "config.json"), word)


def test_unknown_compressed_tensors_format(tmp_path: Path) -> None:
    src, _, _ = ct_float_folder(tmp_path / "ct", "channel")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["format"] = "marlin-24"
    config["quantization_config"]["config_groups"]["group_0"]["format"] = "marlin-24"
    (src / "config.json").write_text(json.dumps(config))
    refused(src, tmp_path, "format 'marlin-24'", "float-quantized")


def test_compressed_tensors_scale_shape_and_ignored_module(tmp_path: Path) -> None:
    src, stored, _ = ct_float_folder(tmp_path / "ct", "channel", shards=1)
    from safetensors.torch import save_file

    bad = dict(stored)
    bad[UP + ".weight_scale"] = bad[UP + ".weight_scale"][:5].clone()
    save_file(bad, str(src / "model.safetensors"))
    refused(src, tmp_path, UP + ".weight_scale", "[5, 1]", "expected [100, 1]")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["ignore"] = ["lm_head", "re:.*up_proj"]
    (src / "config.json").write_text(json.dumps(config))
    save_file(dict(stored), str(src / "model.safetensors"))
    refused(src, tmp_path, "model.layers.0.mlp.up_proj.weight_scale", "ignore list")


def test_compressed_tensors_static_activations_without_input_scale(tmp_path: Path) -> None:
    src, _, _ = ct_float_folder(tmp_path / "ct", "channel")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["input_activations"]["dynamic"] = False
    (src / "config.json").write_text(json.dumps(config))
    refused(src, tmp_path, "input_scale", "static input_activations")


def test_inspect_shows_the_scheme_and_sizes(tmp_path: Path) -> None:
    src, stored = fp8_folder(tmp_path / "fp8", block=(32, 32))
    p = migrate_in_process("inspect", str(src))
    assert p.returncode == 0, p.stderr
    assert "quantization: fine-grained FP8 (quant_method fp8, e4m3, 32x32 blocks, float scales)" in p.stdout
    p = migrate_in_process("inspect", str(src), "--json")
    q = json.loads(p.stdout)["details"]["quantization"]
    weights = [n for n in stored if n + "_scale_inv" in stored]
    assert q["weights"] == len(weights) == 14 and q["consumed"] == 14
    assert q["stored_bytes"] == sum(stored[n].nbytes + stored[n + "_scale_inv"].nbytes for n in weights)
    elements = sum(stored[n].numel() for n in weights)
    assert q["dequantized_bytes"] == {"BF16": 2 * elements, "F16": 2 * elements, "F32": 4 * elements}


def test_fp8_without_a_declaration_is_not_guessed(tmp_path: Path) -> None:
    """F8_E4M3 weights and their scales in a folder whose config.json declares no quantization_config are
    not dequantized by guessing from the names: the cast is refused, saying what would read them."""
    src, _ = fp8_folder(tmp_path / "fp8")
    config = json.loads((src / "config.json").read_text())
    del config["quantization_config"]
    (src / "config.json").write_text(json.dumps(config))
    line = refused(src, tmp_path, "cannot cast F8_E4M3 to BF16", "declares quantization_config")
    assert "Traceback" not in line
