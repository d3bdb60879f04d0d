"""Fine-grained FP8 (`quant_method: fp8`, DeepSeek-V3 / Qwen3-FP8 layout) read and dequantized by
`migrate convert --dtype`: every value equals compressed-tensors' own FP8 block dequantizer
(`FP8BlockDequantizer`, edge blocks cropped) and transformers' `Fp8Dequantize` (whole blocks) bit for
bit; stored without a cast; the scales consumed; the written config.json without quantization_config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process
from tests.support.quantized import fp8_folder, is_linear

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
fp8block = pytest.importorskip("compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer")
finegrained = pytest.importorskip("transformers.integrations.finegrained_fp8")

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def load(folder: Path) -> dict:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(safetensors_torch.load_file(str(f)))
    return out


def same_bits(a, b) -> bool:
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(width), b.contiguous().view(width))


def ct_oracle(stored: dict, block, dtype) -> dict:
    """Every quantized weight as compressed-tensors' FP8BlockDequantizer makes it."""
    d = fp8block.FP8BlockDequantizer(weight_block_size=tuple(block), dtype=dtype)
    return {n: d._create_dequantized_weight(t, stored[n + "_scale_inv"]) for n, t in stored.items()
            if n + "_scale_inv" in stored}


def convert(src: Path, out: Path | str, *args: str):
    p = migrate_in_process("convert", str(src), str(out), *args)
    assert "Traceback" not in p.stderr, p.stderr
    return p


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_dequantized_equals_compressed_tensors_block_dequantizer(tmp_path: Path, dtype: str) -> None:
    src, stored = fp8_folder(tmp_path / "fp8", block=(32, 32))  # 100 and 48 rows/columns: edge blocks cropped
    p = convert(src, f"{tmp_path / 'out'}/", "--dtype", dtype, "--copy", "config.json")
    assert p.returncode == 0, p.stderr
    got = load(tmp_path / "out")
    want = ct_oracle(stored, (32, 32), DTYPES[dtype])
    assert want and set(want) <= set(got)
    for name, w in want.items():
        assert same_bits(got[name], w), name
    assert not [n for n in got if n.endswith("_scale_inv")]
    for name, t in stored.items():  # the unquantized tensors: cast as any tensor
        if not name.endswith("_scale_inv") and name not in want:
            assert same_bits(got[name], t.to(DTYPES[dtype])), name
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["torch_dtype"] == str(DTYPES[dtype]).removeprefix("torch.")
    assert "14 weights dequantized" in p.stdout + p.stderr


def test_whole_blocks_equal_transformers_fp8_dequantize(tmp_path: Path) -> None:
    """transformers' own load-time dequantizer (`Fp8Dequantize`, what `dequantize=True` runs) takes
    whole blocks only: 4x4 divides every dimension of the tiny model."""
    src, stored = fp8_folder(tmp_path / "fp8", block=(4, 4), shards=1)
    p = convert(src, tmp_path / "out.safetensors", "--dtype", "BF16")
    assert p.returncode == 0, p.stderr
    got = load(tmp_path)
    op = finegrained.Fp8Dequantize(hf_quantizer=None)
    n = 0
    for name, t in stored.items():
        if name + "_scale_inv" in stored:
            want = op._dequantize_one(t, stored[name + "_scale_inv"], output_dtype=torch.bfloat16)
            assert same_bits(got[name], want), name
            n += 1
    assert n == 14


def test_bands_give_the_same_bits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many small bands (a band of 32 rows, a scale row each) give the bits of one band."""
    import migrator.files.quantized as q

    src, stored = fp8_folder(tmp_path / "fp8", block=(32, 32))
    monkeypatch.setattr(q, "BAND_BYTES", 64)
    assert convert(src, tmp_path / "a.safetensors", "--dtype", "BF16").returncode == 0
    got = safetensors_torch.load_file(str(tmp_path / "a.safetensors"))
    for name, w in ct_oracle(stored, (32, 32), torch.bfloat16).items():
        assert same_bits(got[name], w), name


@pytest.mark.parametrize("stored_as", ["F32", "E8M0"])
def test_ue8m0_scales(tmp_path: Path, stored_as: str) -> None:
    """`scale_fmt: ue8m0`: power-of-two scales, stored as F32 (DeepSeek-V3.1) or as F8_E8M0 codes."""
    def e8m0(tensors: dict) -> None:
        if stored_as == "E8M0":
            for n in [n for n in tensors if n.endswith("_scale_inv")]:
                tensors[n] = tensors[n].to(torch.float8_e8m0fnu)

    src, stored = fp8_folder(tmp_path / "fp8", block=(32, 32), ue8m0=True, edit=e8m0)
    assert convert(src, tmp_path / "o.safetensors", "--dtype", "BF16").returncode == 0
    got = safetensors_torch.load_file(str(tmp_path / "o.safetensors"))
    f32 = {n: (t.to(torch.float32) if n.endswith("_scale_inv") else t) for n, t in stored.items()}
    for name, w in ct_oracle(f32, (32, 32), torch.bfloat16).items():
        assert same_bits(got[name], w), name


def test_one_scale_per_tensor(tmp_path: Path) -> None:
    """No weight_block_size: one scale for the whole tensor (transformers' per-tensor FP8Linear)."""
    src, stored = fp8_folder(tmp_path / "fp8", block=None)
    assert convert(src, tmp_path / "o.safetensors", "--dtype", "F32").returncode == 0
    got = safetensors_torch.load_file(str(tmp_path / "o.safetensors"))
    for name, t in stored.items():
        if name + "_scale_inv" in stored:
            want = (t.to(torch.float32) * stored[name + "_scale_inv"].to(torch.float32)).to(torch.float32)
            assert same_bits(got[name], want), name


def test_modules_to_not_convert_stay_as_stored(tmp_path: Path) -> None:
    src, stored = fp8_folder(tmp_path / "fp8", skip=("o_proj",))
    assert stored["model.layers.0.self_attn.o_proj.weight"].dtype == torch.bfloat16
    assert convert(src, tmp_path / "o.safetensors", "--dtype", "BF16").returncode == 0
    got = safetensors_torch.load_file(str(tmp_path / "o.safetensors"))
    assert same_bits(got["model.layers.0.self_attn.o_proj.weight"], stored["model.layers.0.self_attn.o_proj.weight"])
    for name, w in ct_oracle(stored, (32, 32), torch.bfloat16).items():
        assert same_bits(got[name], w), name


def test_without_a_cast_the_stored_tensors_pass_through_with_a_note(tmp_path: Path) -> None:
    src, stored = fp8_folder(tmp_path / "fp8")
    p = convert(src, tmp_path / "o.safetensors")
    assert p.returncode == 0, p.stderr
    assert "read as stored" in p.stdout + p.stderr
    got = safetensors_torch.load_file(str(tmp_path / "o.safetensors"))
    assert set(got) == set(stored)
    for name, t in stored.items():
        assert same_bits(got[name], t), name


def test_a_recipe_dtype_policy_dequantizes(tmp_path: Path) -> None:
    src, stored = fp8_folder(tmp_path / "fp8")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource: {{path: {src}}}\ntarget: {{path: {tmp_path / 'o.safetensors'}}}\n"
                      "dtype: {cast: BF16}\n")
    p = migrate_in_process("run", str(recipe))
    assert p.returncode == 0, p.stderr
    got = safetensors_torch.load_file(str(tmp_path / "o.safetensors"))
    for name, w in ct_oracle(stored, (32, 32), torch.bfloat16).items():
        assert same_bits(got[name], w), name


def test_the_python_api_dequantizes(tmp_path: Path) -> None:
    import migrator

    src, stored = fp8_folder(tmp_path / "fp8")
    want = ct_oracle(stored, (32, 32), torch.float32)
    with migrator.open_file(src, dequantize="F32") as r:
        for name, w in want.items():
            assert torch.equal(torch.from_numpy(r[name].numpy().copy()), w), name
        assert not [n for n in r if n.endswith("_scale_inv")]
    with migrator.open_file(src) as r:
        assert r["model.layers.0.mlp.up_proj.weight"].dtype.name == "F8_E4M3"


def test_linears_are_the_quantized_ones() -> None:
    assert is_linear("model.layers.0.mlp.up_proj.weight") and not is_linear("model.norm.weight")


def test_the_report_lists_the_scales_as_consumed(tmp_path: Path) -> None:
    from migrator.plan.report import ApplyReport

    src, stored = fp8_folder(tmp_path / "fp8")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource: {{path: {src}}}\ntarget: {{path: {tmp_path / 'o.safetensors'}}}\n"
                      "dtype: {cast: BF16}\n")
    p = migrate_in_process("run", str(recipe), "--report", str(tmp_path / "report.json"))
    assert p.returncode == 0, p.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    scales = sorted(n for n in stored if n.endswith("_scale_inv"))
    assert sorted(e["tensor"] for e in report["consumed"]) == scales
    assert all(e["into"] == e["tensor"].removesuffix("_scale_inv") for e in report["consumed"])
    assert report["unused"] == [] and not [n for n in report["applied"] if n.endswith("_scale_inv")]
    assert ApplyReport.from_json(report).to_json()["consumed"] == report["consumed"]
    assert "Consumed by dequantization (14 tensors" in migrate_in_process("plan", str(recipe)).stdout


def test_memory_stays_a_few_bands_not_the_weight(tmp_path: Path) -> None:
    """Dequantizing a 4096 x 8192 FP8 weight (64 MiB as BF16) to a file allocates a few bands at a
    time (allocations traced by tracemalloc, which numpy reports to), far below the weight or its file."""
    import tracemalloc

    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    import migrator

    rng = np.random.default_rng(0)
    codes = rng.integers(0, 0x7F, size=(4096, 8192), dtype=np.uint8)  # no NaN codes
    folder = tmp_path / "big"
    folder.mkdir()
    save_file({"m.weight": codes.view(ml_dtypes.float8_e4m3fn),
               "m.weight_scale_inv": rng.random((32, 64), dtype=np.float32) + 0.5}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}))
    with migrator.open_file(folder, dequantize="BF16") as r:
        tracemalloc.start()
        try:
            migrator.save(r, tmp_path / "out.safetensors", fsync=False)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert (tmp_path / "out.safetensors").stat().st_size > 64 << 20
    assert peak < 32 << 20, peak / 2**20


@pytest.mark.parametrize("block", [(4, 8), (16, 16)])
def test_fused_expert_weights_with_leading_dimensions(tmp_path: Path, block: tuple[int, int]) -> None:
    """A 3-D expert stack [E, N, K] with scales [E, ceil(N/bh), ceil(K/bw)], named as transformers names
    a fused expert stack's (`experts.gate_up_proj` and `experts.gate_up_proj_scale_inv`):
    each expert equals compressed-tensors' block dequantizer on its own matrix (edges cropped for 16x16),
    and transformers' Fp8Dequantize on the whole stack where the blocks divide it (4x8)."""
    from tests.support.quantized import block_quantize, save_folder

    g = torch.Generator().manual_seed(5)
    w = torch.randn(3, 20, 40, generator=g, dtype=torch.float32).to(torch.bfloat16)
    pairs = [block_quantize(w[e], block) for e in range(3)]
    codes = torch.stack([c for c, _ in pairs])
    scales = torch.stack([s for _, s in pairs])
    src = save_folder(tmp_path / "moe", {"model.layers.0.mlp.experts.gate_up_proj": codes,
                                         "model.layers.0.mlp.experts.gate_up_proj_scale_inv": scales},
                      {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                               "weight_block_size": list(block)}}, shards=1)
    assert convert(src, tmp_path / "o.safetensors", "--dtype", "BF16").returncode == 0
    got = safetensors_torch.load_file(str(tmp_path / "o.safetensors"))["model.layers.0.mlp.experts.gate_up_proj"]
    d = fp8block.FP8BlockDequantizer(weight_block_size=block, dtype=torch.bfloat16)
    for e in range(3):
        assert same_bits(got[e], d._create_dequantized_weight(codes[e], scales[e]))
    if 20 % block[0] == 0 and 40 % block[1] == 0:
        want = finegrained.Fp8Dequantize(hf_quantizer=None)._dequantize_one(codes, scales, output_dtype=torch.bfloat16)
        assert same_bits(got, want)


@pytest.mark.parametrize("shape", [(16, 32), (256,), (3, 5), (7, 2), (2, 1)])
def test_e4m3_codes_read_as_torch_reads_them(shape: tuple[int, ...]) -> None:
    """Every F8_E4M3 code (the pair table for an even row, one code at a time otherwise) equals torch's
    float8_e4m3fn -> float32, NaN codes included."""
    import numpy as np

    from migrator.formats.quantized.blocks import e4m3_values

    codes = (np.arange(int(np.prod(shape)), dtype=np.int64) * 37 % 256).astype(np.uint8).reshape(shape)
    want = torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn).to(torch.float32).numpy()
    got = e4m3_values(codes)
    assert got.shape == shape and got.dtype == np.float32
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)])
