"""`migrate convert SRC OUT/ --quantize FP8_DYNAMIC|FP8_BLOCK` against compressed-tensors itself.

The oracle: a tiny Llama (transformers, seeded, BF16 and F32) quantized by compressed-tensors 0.20's own
lifecycle (`apply_quantization_config`, `calculate_qparams` of each weight's min and max, its
`ModelCompressor` compressing into the float-quantized layout and writing config.json). Every tensor
of our folder (names, dtypes, shapes, bytes) and config.json's `quantization_config` must equal its;
then transformers (with compressed-tensors installed) loads our folder on CPU, compressed (F8_E4M3
weights; compressed-tensors decompresses them on the first forward, as CPUs have no FP8 matmul). Its
logits equal those of compressed-tensors' folder loaded the same way (activations quantized at run
time as the config declares) and, with run-time quantization turned off, those of the source model
whose Linear weights are replaced by compressed-tensors' dequantization of its own quantization.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from migrator.run.convert import convert

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")
from safetensors import safe_open  # noqa: E402

IDS = [[1, 5, 9, 200, 7, 33, 64]]


def tiny_llama(dtype: torch.dtype, tied: bool = False) -> object:
    """Hidden 64, intermediate 272 (three 128-row blocks, the last partial), 2 layers, seeded."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=272, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    return transformers.LlamaForCausalLM(cfg).to(dtype).eval()


def compressed_tensors_folder(model: object, scheme: str, out: Path) -> None:
    """compressed-tensors' own quantization of `model` (ignore lm_head, targets Linear), saved to `out`."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
    from compressed_tensors.quantization.utils import calculate_qparams

    config = QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"],
                                                                             **PRESET_SCHEMES[scheme])},
                                ignore=["lm_head"])
    apply_quantization_config(model, config, show_progress=False)
    for _, module in model.named_modules():  # type: ignore[attr-defined]
        qs = getattr(module, "quantization_scheme", None)
        if qs is None or qs.weights is None:
            continue
        w, args = module.weight.data, qs.weights
        if args.block_structure is None:  # its observers' min/max: per row, or per block
            mn, mx = torch.amin(w, dim=1, keepdim=True), torch.amax(w, dim=1, keepdim=True)
        else:
            br, bc = args.block_structure
            blocks = [[w[i:i + br, j:j + bc] for j in range(0, w.shape[1], bc)] for i in range(0, w.shape[0], br)]
            mn = torch.stack([torch.stack([b.min() for b in row]) for row in blocks])
            mx = torch.stack([torch.stack([b.max() for b in row]) for row in blocks])
        scale, zero_point = calculate_qparams(mn, mx, args)
        module.weight_scale.data.copy_(scale)
        module.weight_zero_point.data.copy_(zero_point)
        module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="float-quantized")
    compressor.compress_model(model)
    model.save_pretrained(out)  # type: ignore[attr-defined]
    compressor.update_config(out)


def tensors_of(folder: Path) -> dict[str, tuple[str, list[int], bytes]]:
    out = {}
    with safe_open(folder / "model.safetensors", "pt") as f:
        for name in f.keys():  # noqa: SIM118  # safe_open has no __iter__
            t = f.get_tensor(name)
            out[name] = (str(t.dtype), list(t.shape), t.contiguous().view(torch.uint8).numpy().tobytes())
    return out


@pytest.fixture(scope="module", params=[("FP8_DYNAMIC", torch.bfloat16), ("FP8_BLOCK", torch.bfloat16),
                                        ("FP8_DYNAMIC", torch.float32), ("FP8_BLOCK", torch.float32)],
                ids=lambda p: f"{p[0]}-{str(p[1]).rpartition('.')[2]}")
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, str]:
    """(source folder, ours, compressed-tensors', scheme)."""
    scheme, dtype = request.param
    root = tmp_path_factory.mktemp("q")
    tiny_llama(dtype).save_pretrained(root / "src")  # type: ignore[attr-defined]
    convert(root / "src", f"{root / 'ours'}/", quantize=scheme, progress=False)
    compressed_tensors_folder(transformers.LlamaForCausalLM.from_pretrained(root / "src"), scheme, root / "ct")
    return root / "src", root / "ours", root / "ct", scheme


def test_every_tensor_equals_compressed_tensors(pair: tuple[Path, Path, Path, str]) -> None:
    _, ours, ct, _ = pair
    got, want = tensors_of(ours), tensors_of(ct)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name][:2] == want[name][:2], name
        assert got[name][2] == want[name][2], name
    assert any(d == "torch.float8_e4m3fn" for d, _, _ in want.values())


def test_quantization_config_equals_compressed_tensors(pair: tuple[Path, Path, Path, str]) -> None:
    src, ours, ct, _ = pair
    got, want = (json.loads((f / "config.json").read_text()) for f in (ours, ct))
    assert got["quantization_config"] == want["quantization_config"]
    source = json.loads((src / "config.json").read_text())
    assert {k: v for k, v in got.items() if k != "quantization_config"} == source  # nothing else changed


def test_transformers_loads_it_compressed_and_its_logits_are_the_dequantized_models(
        pair: tuple[Path, Path, Path, str]) -> None:
    src, ours, ct, _ = pair
    model = transformers.AutoModelForCausalLM.from_pretrained(ours)
    assert model.model.layers[0].mlp.down_proj.weight.dtype == torch.float8_e4m3fn  # loaded compressed
    with torch.no_grad():
        if pair[3] == "FP8_DYNAMIC":  # FP8_BLOCK's activation groups of 128 need a hidden size of 128s (here 64)
            quantized = model(torch.tensor(IDS)).logits  # CPU: compressed-tensors decompresses on the first forward
            theirs = transformers.AutoModelForCausalLM.from_pretrained(ct)
            assert torch.equal(quantized, theirs(torch.tensor(IDS)).logits)  # activations quantized per token
        for module in model.modules():  # the weights alone: no run-time quantization of the activations
            module.quantization_enabled = False
        logits = model(torch.tensor(IDS)).logits
        assert model.model.layers[0].mlp.down_proj.weight.dtype == logits.dtype  # decompressed
    # the source model with each Linear weight replaced by compressed-tensors' dequantization of its own
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    reference = transformers.AutoModelForCausalLM.from_pretrained(src)
    args = PRESET_SCHEMES[pair[3]]["weights"]
    with safe_open(ct / "model.safetensors", "pt") as f:
        for name, module in reference.named_modules():
            if f"{name}.weight_scale" in f.keys():  # noqa: SIM118  # safe_open has no __contains__
                q, scale = f.get_tensor(f"{name}.weight"), f.get_tensor(f"{name}.weight_scale")
                if args.block_structure is not None:
                    from compressed_tensors.quantization.utils import maybe_pad_tensor_for_block_quant

                    padded = maybe_pad_tensor_for_block_quant(q.to(scale.dtype), tuple(args.block_structure))
                    value = dequantize(padded, scale, args=args)[:q.shape[0], :q.shape[1]]
                else:
                    value = dequantize(q, scale, args=args)
                module.weight.data.copy_(value)
    with torch.no_grad():
        want = reference(torch.tensor(IDS)).logits
    assert logits.dtype == want.dtype
    assert torch.equal(logits, want)


def test_tied_embeddings_list_lm_head_in_ignore(tmp_path: Path) -> None:
    """A tied head has no tensor of its own: it stays unquantized, and ignore names it, as compressed-tensors
    writes for the same model."""
    tiny_llama(torch.bfloat16, tied=True).save_pretrained(tmp_path / "src")  # type: ignore[attr-defined]
    result = convert(tmp_path / "src", f"{tmp_path / 'ours'}/", quantize="FP8_DYNAMIC", progress=False)
    compressed_tensors_folder(transformers.LlamaForCausalLM.from_pretrained(tmp_path / "src"), "FP8_DYNAMIC",
                              tmp_path / "ct")
    got, want = (json.loads((tmp_path / f / "config.json").read_text())["quantization_config"] for f in ("ours", "ct"))
    assert got == want and got["ignore"] == ["lm_head"]
    assert any("tie_word_embeddings" in n for n in result.notes)


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "migrator.cli", *args], capture_output=True, text=True, cwd=cwd,
                          check=False)


def test_a_quantized_source_dequantized_as_read_is_quantized_again(tmp_path: Path) -> None:
    """compressed-tensors' own FP8_DYNAMIC folder, read with --dtype BF16 (dequantized as compressed-tensors
    decompresses it) and written FP8_BLOCK: compressed-tensors' FP8_BLOCK quantization of its decompressed
    model, byte for byte; without the cast it is refused."""
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    model = tiny_llama(torch.bfloat16)
    model.save_pretrained(tmp_path / "src")  # type: ignore[attr-defined]
    compressed_tensors_folder(model, "FP8_DYNAMIC", tmp_path / "fp8")
    result = convert(tmp_path / "fp8", f"{tmp_path / 'ours'}/", quantize="FP8_BLOCK", dtype="BF16", progress=False)
    assert any("dequantized to BF16" in n for n in result.notes)
    decompressed = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "src")
    args = PRESET_SCHEMES["FP8_DYNAMIC"]["weights"]
    with safe_open(tmp_path / "fp8" / "model.safetensors", "pt") as f:
        for name, module in decompressed.named_modules():
            if f"{name}.weight_scale" in f.keys():  # noqa: SIM118  # safe_open has no __contains__
                module.weight.data.copy_(dequantize(f.get_tensor(f"{name}.weight"),
                                                    f.get_tensor(f"{name}.weight_scale"), args=args))
    compressed_tensors_folder(decompressed, "FP8_BLOCK", tmp_path / "ct")
    got, want = tensors_of(tmp_path / "ours"), tensors_of(tmp_path / "ct")
    assert got == want
    assert (json.loads((tmp_path / "ours" / "config.json").read_text())["quantization_config"]
            == json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"])
    from migrator.core.errors import MigratorError

    with pytest.raises(MigratorError, match="quantized already"):
        convert(tmp_path / "fp8", f"{tmp_path / 'again'}/", quantize="FP8_BLOCK", progress=False)
