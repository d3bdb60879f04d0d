"""compressed-tensors pack-quantized, gpt-oss MXFP4 and MLX affine folders read and dequantized by
`migrate convert --dtype`, bit for bit against the references: compressed-tensors 0.20's
`PackedQuantizationCompressor.decompress` (the weights packed by its own compressor), transformers'
`convert_moe_packed_tensors` (and its dequantized gpt-oss model loading the output), `mlx.core.dequantize`
(weights quantized by `mlx.core.quantize`). Each runs with the compiled loops and with numpy; the FP8
schemes' compiled plug-in is checked against their numpy path. Bad input exits 1 naming the tensor."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from migrator.formats.quantized import KERNELS
from tests.support.cli import migrate_in_process
from tests.support.quantized import ct_float_folder, fp8_folder, save_folder
from tests.support.quantized_more import mlx_folder, mxfp4_folder, pack_folder

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


@pytest.fixture(params=["kernel", "numpy"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The compiled loops (as installed), then numpy alone (every scheme's kernel taken out)."""
    if request.param == "numpy":
        for name in list(KERNELS):
            monkeypatch.delitem(KERNELS, name)
    yield request.param


def load(folder: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(safetensors_torch.load_file(str(f)))
    return out


def same_bits(a: Any, b: Any) -> bool:
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    width = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return bool(torch.equal(a.contiguous().view(width), b.contiguous().view(width)))


def convert(src: Path, out: Path | str, *args: str) -> Any:
    p = migrate_in_process("convert", str(src), str(out), *args)
    assert "Traceback" not in p.stderr, p.stderr
    return p


# -- the FP8 schemes' compiled plug-in --------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_fp8_kernel_plug_in_gives_the_numpy_bits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    """q-read's numpy dequantizers and the compiled loop write the same bytes, small bands included."""
    import migrator.files.quantized as q

    monkeypatch.setattr(q, "BAND_BYTES", 1000)
    fp8, _ = fp8_folder(tmp_path / "fp8", block=(32, 32))
    ct, _, _ = ct_float_folder(tmp_path / "ct", "block", block=(16, 32))
    ch, _, _ = ct_float_folder(tmp_path / "ch", "channel", dtype=torch.float16)
    for src in (fp8, ct, ch):
        assert convert(src, tmp_path / f"{src.name}-k.safetensors", "--dtype", dtype).returncode == 0
    for name in ("fp8", "compressed-tensors float-quantized"):
        monkeypatch.delitem(KERNELS, name)
    for src in (fp8, ct, ch):
        assert convert(src, tmp_path / f"{src.name}-n.safetensors", "--dtype", dtype).returncode == 0
        k = (tmp_path / f"{src.name}-k.safetensors").read_bytes()
        assert k == (tmp_path / f"{src.name}-n.safetensors").read_bytes(), src.name


def test_fp8_kernel_plug_in_on_stacked_experts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3-D F8_E4M3 weight (experts stacked) whose 40 rows are not a multiple of the 32-row blocks: the
    bands of the compiled path straddle experts; each expert equals FP8BlockDequantizer on its matrix."""
    from compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer import FP8BlockDequantizer

    import migrator.files.quantized as q

    monkeypatch.setattr(q, "BAND_BYTES", 48 * 4 * 24)  # bands of 32 rows: 40-row experts are split
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 0x7E, (3, 40, 48), dtype=torch.uint8, generator=gen).view(torch.float8_e4m3fn)
    scale = torch.rand(3, 2, 2, generator=gen) * 1e-2 + 1e-3
    config = {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [32, 32]}}
    save_folder(tmp_path / "moe", {"experts.weight": codes, "experts.weight_scale_inv": scale,
                                   "norm.weight": torch.ones(4, dtype=torch.bfloat16)}, config, shards=1)
    got = {}
    for run in ("kernel", "numpy"):
        if run == "numpy":
            monkeypatch.delitem(KERNELS, "fp8")
        assert convert(tmp_path / "moe", tmp_path / f"{run}.safetensors", "--dtype", "BF16").returncode == 0
        got[run] = safetensors_torch.load_file(str(tmp_path / f"{run}.safetensors"))["experts.weight"]
    oracle = FP8BlockDequantizer(weight_block_size=(32, 32), dtype=torch.bfloat16)
    want = torch.stack([oracle._create_dequantized_weight(codes[e], scale[e]) for e in range(3)])
    assert same_bits(got["kernel"], want) and same_bits(got["numpy"], want)


# -- compressed-tensors pack-quantized --------------------------------------------------------------

def pack_oracle(stored: dict[str, Any], scheme: Any, dtype: Any) -> dict[str, Any]:
    """compressed-tensors' decompressor on each module's stored parts, then the cast (as its
    CompressedTensorsDequantizer does)."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor

    names = PackedQuantizationCompressor.compression_param_names(scheme)
    out = {}
    for n in stored:
        if n.endswith(".weight_packed"):
            module = n.rpartition(".")[0]
            parts = {p: stored[f"{module}.{p}"] for p in names}
            out[f"{module}.weight"] = PackedQuantizationCompressor.decompress(parts, scheme)["weight"].to(dtype)
    return out


@pytest.mark.parametrize("bits,strategy,symmetric,scale_dtype,dtype", [
    (4, "group", True, "BF16", "BF16"), (4, "group", False, "BF16", "F32"), (4, "channel", True, "F16", "F16"),
    (8, "channel", False, "F32", "BF16"), (3, "group", True, "BF16", "F16"), (2, "group", False, "F16", "BF16")])
def test_pack_quantized_equals_compressed_tensors(tmp_path: Path, path: str, bits: int, strategy: str,
                                                  symmetric: bool, scale_dtype: str, dtype: str) -> None:
    src, stored, scheme = pack_folder(tmp_path / "int", bits=bits, strategy=strategy, symmetric=symmetric,
                                      scale_dtype=DTYPES[scale_dtype])
    p = convert(src, f"{tmp_path / 'out'}/", "--dtype", dtype, "--copy", "config.json")
    assert p.returncode == 0, p.stderr
    got = load(tmp_path / "out")
    want = pack_oracle(stored, scheme, DTYPES[dtype])
    assert len(want) == 14
    for name, w in want.items():
        assert same_bits(got[name], w), name
    leftovers = [n for n in got if n.rsplit(".", 1)[-1] in ("weight_packed", "weight_scale", "weight_shape",
                                                             "weight_zero_point")]
    assert not leftovers
    assert same_bits(got["lm_head.weight"], stored["lm_head.weight"].to(DTYPES[dtype]))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in config


def test_pack_quantized_in_small_bands(tmp_path: Path, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bands of a few rows: each takes its rows of the scales and of the zero points unpacked once."""
    import migrator.files.quantized as q

    monkeypatch.setattr(q, "BAND_BYTES", 64 * 4 * 5)
    src, stored, scheme = pack_folder(tmp_path / "int", bits=4, symmetric=False, scale_dtype=torch.bfloat16)
    assert convert(src, tmp_path / "o.safetensors", "--dtype", "F32").returncode == 0
    got = safetensors_torch.load_file(str(tmp_path / "o.safetensors"))
    for name, w in pack_oracle(stored, scheme, torch.float32).items():
        assert same_bits(got[name], w), name


def test_pack_quantized_refuses_a_packed_size_disagreeing_with_weight_shape(tmp_path: Path) -> None:
    src, stored, _ = pack_folder(tmp_path / "int")
    name = "model.layers.1.mlp.up_proj.weight_shape"
    stored[name] = torch.tensor([128, 72])
    config = json.loads((src / "config.json").read_text())
    save_folder(tmp_path / "bad", stored, config)
    p = convert(tmp_path / "bad", tmp_path / "o.safetensors", "--dtype", "BF16")
    assert p.returncode == 1
    assert "model.layers.1.mlp.up_proj.weight_packed" in p.stderr and "weight_shape [128, 72]" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.safetensors").exists()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0])
def test_pack_quantized_refuses_bad_scales(tmp_path: Path, bad: float) -> None:
    src, stored, _ = pack_folder(tmp_path / "int")
    name = "model.layers.0.self_attn.k_proj.weight_scale"
    stored[name] = stored[name].clone()
    stored[name][3, 1] = bad
    save_folder(tmp_path / "bad", stored, json.loads((src / "config.json").read_text()))
    p = convert(tmp_path / "bad", tmp_path / "o.safetensors", "--dtype", "BF16")
    assert p.returncode == 1 and name in p.stderr, p.stderr
    assert not (tmp_path / "o.safetensors").exists()


# -- gpt-oss MXFP4 ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["BF16", "F32"])
def test_mxfp4_equals_transformers_and_loads_into_its_dequantized_model(tmp_path: Path, path: str,
                                                                        dtype: str) -> None:
    from transformers import GptOssForCausalLM
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    src, stored = mxfp4_folder(tmp_path / "oss")
    p = convert(src, f"{tmp_path / 'out'}/", "--dtype", dtype, "--copy", "config.json")
    assert p.returncode == 0, p.stderr
    got = load(tmp_path / "out")
    n = 0
    for name in stored:
        if name.endswith("_blocks"):
            base = name.removesuffix("_blocks")
            want = convert_moe_packed_tensors(stored[name], stored[base + "_scales"], dtype=DTYPES[dtype])
            assert same_bits(got[base], want), base
            n += 1
    assert n == 4 and not [k for k in got if k.endswith(("_blocks", "_scales"))]
    model = GptOssForCausalLM.from_pretrained(tmp_path / "out", dtype=DTYPES[dtype])
    params = dict(model.named_parameters())
    for name, t in got.items():
        assert same_bits(params[name].detach(), t), name


def test_mxfp4_refuses_e8m0_255(tmp_path: Path) -> None:
    src, stored = mxfp4_folder(tmp_path / "oss")
    name = "model.layers.1.mlp.experts.down_proj_scales"
    stored[name][2, 5, 1] = 255
    save_folder(tmp_path / "bad", stored, json.loads((src / "config.json").read_text()))
    p = convert(tmp_path / "bad", tmp_path / "o.safetensors", "--dtype", "BF16")
    assert p.returncode == 1 and name in p.stderr and "[2, 5, 1]" in p.stderr, p.stderr
    assert not (tmp_path / "o.safetensors").exists()


# -- MLX affine -------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits,dtype", [(4, "BF16"), (4, "F32"), (3, "F16"), (6, "BF16"), (2, "F32")])
def test_mlx_affine_equals_mlx_dequantize(tmp_path: Path, path: str, bits: int, dtype: str) -> None:
    mx = pytest.importorskip("mlx.core")
    import numpy as np

    src, _, (arrays, group) = mlx_folder(tmp_path / "mlx", bits=bits)
    p = convert(src, f"{tmp_path / 'out'}/", "--dtype", dtype, "--copy", "config.json")
    assert p.returncode == 0, p.stderr
    got = load(tmp_path / "out")
    assert len(arrays) >= 13  # the linears whose columns split into groups, and the embeddings
    for module, (wq, s, z, b) in arrays.items():
        ref = mx.dequantize(wq, s, z, group_size=group, bits=b)  # bfloat16, as the scales
        want = torch.from_numpy(np.array(ref.view(mx.int16))).view(torch.bfloat16).to(DTYPES[dtype])
        assert same_bits(got[module + ".weight"], want), module
    assert not [k for k in got if k.endswith((".scales", ".biases"))]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization" not in config and "quantization_config" not in config


def test_mlx_refuses_scales_of_the_wrong_shape(tmp_path: Path) -> None:
    src, stored, _ = mlx_folder(tmp_path / "mlx")
    name = "model.layers.0.mlp.up_proj.scales"
    stored[name] = stored[name][:, :-1].contiguous()
    save_folder(tmp_path / "bad", stored, json.loads((src / "config.json").read_text()))
    p = convert(tmp_path / "bad", tmp_path / "o.safetensors", "--dtype", "BF16")
    assert p.returncode == 1 and name in p.stderr, p.stderr
    assert not (tmp_path / "o.safetensors").exists()
