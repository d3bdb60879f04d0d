"""compressed-tensors `float-quantized` folders (FP8 W8A8, the layout vLLM loads) quantized by
compressed-tensors 0.20 itself, read and dequantized by `migrate convert --dtype`: every weight equals
its `FloatQuantizationCompressor.decompress` (then cast as torch casts) bit for bit, for the tensor,
channel and block strategies, with BF16 and F32 scales; the `ignore` list (with `re:` entries) is
matched as compressed-tensors matches it; static activations' `input_scale` is consumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process
from tests.support.quantized import ct_float_folder

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
naive = pytest.importorskip("compressed_tensors.compressors.naive_quantized.base")
ct_quant = pytest.importorskip("compressed_tensors.quantization")
ct_match = pytest.importorskip("compressed_tensors.utils.match")

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def same_bits(a, b) -> bool:
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    width = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(a.contiguous().view(width), b.contiguous().view(width))


def oracle(stored: dict, qc: dict, dtype) -> dict:
    """Each quantized module's weight as compressed-tensors decompresses it, cast to `dtype`."""
    group = qc["config_groups"]["group_0"]
    scheme = ct_quant.QuantizationScheme(targets=group["targets"],
                                         weights=ct_quant.QuantizationArgs(**group["weights"]))
    out = {}
    for name, t in stored.items():
        if name.endswith(".weight") and name + "_scale" in stored:
            d = naive.FloatQuantizationCompressor.decompress({"weight": t, "weight_scale": stored[name + "_scale"]},
                                                             scheme)
            out[name] = d["weight"].to(dtype)
    return out


def run_convert(src: Path, out: Path | str, *args: str):
    p = migrate_in_process("convert", str(src), str(out), *args)
    assert "Traceback" not in p.stderr, p.stderr
    return p


@pytest.mark.parametrize(("strategy", "block"), [("tensor", None), ("channel", None), ("block", (32, 32))])
@pytest.mark.parametrize("dtype", ["BF16", "F32"])
def test_dequantized_equals_compressed_tensors_decompress(tmp_path: Path, strategy: str, block, dtype: str) -> None:
    src, stored, qc = ct_float_folder(tmp_path / "ct", strategy, block=block)
    assert stored["model.layers.0.mlp.down_proj.weight_scale"].dtype == torch.bfloat16  # the rounding matters
    p = run_convert(src, f"{tmp_path / 'out'}/", "--dtype", dtype, "--copy", "config.json")
    assert p.returncode == 0, p.stderr
    got = {}
    for f in (tmp_path / "out").glob("*.safetensors"):
        got.update(safetensors_torch.load_file(str(f)))
    want = oracle(stored, qc, DTYPES[dtype])
    assert len(want) == 14
    for name, w in want.items():
        assert same_bits(got[name], w), name
    assert not [n for n in got if n.endswith(("_scale", "input_scale"))]
    assert same_bits(got["lm_head.weight"], stored["lm_head.weight"].to(DTYPES[dtype]))  # ignored: as stored
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["torch_dtype"] == str(DTYPES[dtype]).removeprefix("torch.")


def test_f32_scales(tmp_path: Path) -> None:
    src, stored, qc = ct_float_folder(tmp_path / "ct", "channel", dtype=torch.float32)
    assert stored["model.layers.0.mlp.down_proj.weight_scale"].dtype == torch.float32
    assert run_convert(src, tmp_path / "o.safetensors", "--dtype", "BF16").returncode == 0
    got = safetensors_torch.load_file(str(tmp_path / "o.safetensors"))
    for name, w in oracle(stored, qc, torch.bfloat16).items():
        assert same_bits(got[name], w), name


def test_static_input_scales_are_consumed(tmp_path: Path) -> None:
    src, stored, qc = ct_float_folder(tmp_path / "ct", "channel", static=True)
    assert "model.layers.0.mlp.down_proj.input_scale" in stored
    p = run_convert(src, tmp_path / "o.safetensors", "--dtype", "BF16")
    assert p.returncode == 0, p.stderr
    got = safetensors_torch.load_file(str(tmp_path / "o.safetensors"))
    assert not [n for n in got if "scale" in n]
    assert "28 stored tensors consumed" in p.stdout + p.stderr  # 14 weight scales + 14 input scales
    for name, w in oracle(stored, qc, torch.bfloat16).items():
        assert same_bits(got[name], w), name


def test_regex_ignore_entries_as_compressed_tensors_matches_them(tmp_path: Path) -> None:
    ignore = ("lm_head", r"re:.*layers\.1\.mlp\..*", "re:.*o_proj$")
    src, stored, qc = ct_float_folder(tmp_path / "ct", "block", block=(32, 32), ignore=ignore)
    kept = [n[:-len(".weight")] for n, t in stored.items() if n.endswith(".weight") and t.dtype == torch.bfloat16]
    for module in ("model.layers.1.mlp.up_proj", "model.layers.0.self_attn.o_proj", "lm_head"):
        assert module in kept and any(ct_match.match_name(module, i) for i in ignore)
    assert run_convert(src, tmp_path / "o.safetensors", "--dtype", "BF16").returncode == 0
    got = safetensors_torch.load_file(str(tmp_path / "o.safetensors"))
    want = oracle(stored, qc, torch.bfloat16)
    assert len(want) == 14 - 3 - 2  # layer 1's MLP and both o_proj left unquantized
    for name, w in want.items():
        assert same_bits(got[name], w), name
    for module in kept:
        assert same_bits(got[module + ".weight"], stored[module + ".weight"]), module


def test_named_targets(tmp_path: Path) -> None:
    """Targets given as regexes (not a class name): exactly the named modules are quantized."""
    src, stored, qc = ct_float_folder(tmp_path / "ct", "channel", targets=(r"re:.*mlp\.(up|gate)_proj$",))
    assert run_convert(src, tmp_path / "o.safetensors", "--dtype", "F32").returncode == 0
    got = safetensors_torch.load_file(str(tmp_path / "o.safetensors"))
    want = oracle(stored, qc, torch.float32)
    assert len(want) == 4
    for name, w in want.items():
        assert same_bits(got[name], w), name
