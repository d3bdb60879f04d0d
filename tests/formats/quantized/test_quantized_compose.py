"""A quantized FP8 folder composes with the rest of migrator in one stream: into a burnpack for Burn,
into GGUF (F16, and Q8_0 equal to gguf-py quantizing the reference-dequantized weights, permuted as
llama.cpp's converter permutes them), with a PEFT LoRA adapter folded in (equal to PEFT's merge onto the
dequantized model; refused without a dtype, never folding into F8 codes), and through `diff`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import migrate_in_process
from tests.support.quantized import fp8_folder, tiny_llama

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
fp8block = pytest.importorskip("compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer")


def oracle(stored: dict, block, dtype) -> dict:
    d = fp8block.FP8BlockDequantizer(weight_block_size=tuple(block), dtype=dtype)
    return {n: d._create_dequantized_weight(t, stored[n + "_scale_inv"]) for n, t in stored.items()
            if n + "_scale_inv" in stored}


def ok(*args: str):
    p = migrate_in_process(*args)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 0, p.stdout + p.stderr
    return p


def test_fp8_to_burnpack_f32(tmp_path: Path) -> None:
    import migrator

    src, stored = fp8_folder(tmp_path / "fp8")
    ok("convert", str(src), str(tmp_path / "model.bpk"), "--dtype", "F32")
    want = oracle(stored, (32, 32), torch.float32)
    with migrator.open_file(tmp_path / "model.bpk") as r:
        assert sorted(r) == sorted(n for n in stored if not n.endswith("_scale_inv"))
        for name, w in want.items():
            got = r[name].numpy()
            assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), w.numpy().view(np.uint32)), name


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's q/k row permutation (convert_hf_to_gguf.py LlamaModel.permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def gguf_expected(stored: dict, config: dict, dtype) -> dict[str, np.ndarray]:
    """The GGUF name and values of every dequantized linear, as llama.cpp's converter lays them out."""
    out = {}
    for name, w in oracle(stored, (32, 32), dtype).items():
        _, _, layer, rest = name.split(".", 3)
        module = rest.removesuffix(".weight")
        values = w.numpy() if dtype != torch.bfloat16 else w.float().numpy()
        if module == "self_attn.q_proj":
            values = permute(values, config["num_attention_heads"])
        elif module == "self_attn.k_proj":
            values = permute(values, config["num_key_value_heads"])
        out[f"blk.{layer}.{GGUF_NAMES[module]}.weight"] = values
    return out


@pytest.mark.parametrize("qtype", ["F16", "Q8_0"])
def test_fp8_to_gguf_equals_gguf_py(tmp_path: Path, qtype: str) -> None:
    gguf = pytest.importorskip("gguf")
    src, stored = fp8_folder(tmp_path / "fp8", hidden=64, intermediate=128)
    config = json.loads((src / "config.json").read_text())
    args = ["--dtype", "F16"] if qtype == "F16" else ["--dtype", "F32", "--quantize", "Q8_0"]
    ok("convert", str(src), str(tmp_path / "m.gguf"), *args)
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    tensors = {t.name: t for t in reader.tensors}
    want = gguf_expected(stored, config, torch.float16 if qtype == "F16" else torch.float32)
    assert len(want) == 14
    for name, values in want.items():
        t = tensors[name]
        assert t.tensor_type.name == qtype, name
        if qtype == "F16":
            got = np.asarray(t.data).view(np.uint16).reshape(values.shape)
            assert np.array_equal(got, values.view(np.uint16)), name
        else:
            theirs = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
            assert np.array_equal(np.asarray(t.data).reshape(-1), theirs.reshape(-1)), name


def _adapter(tmp_path: Path):
    """A PEFT LoRA adapter (random non-zero A and B) for the tiny Llama's q_proj and down_proj."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    config, _ = tiny_llama(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{k: v for k, v in config.items()
                                                                       if k != "torch_dtype"}))
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    wrapped.save_pretrained(tmp_path / "adapter")
    return tmp_path / "adapter", config


def test_lora_folded_onto_an_fp8_base_equals_peft_on_the_dequantized_model(tmp_path: Path) -> None:
    from tests.support.torch_order import exact_or_close

    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    src, stored = fp8_folder(tmp_path / "fp8")
    adapter, config = _adapter(tmp_path)
    out = tmp_path / "out"
    p = ok("convert", str(src), f"{out}/", "--lora", str(adapter), "--dtype", "F32")
    assert "14 weights dequantized to F32" in p.stdout and "folded into 4 weights" in p.stdout
    # the oracle: the dequantized weights in a float model, PEFT's merge_and_unload onto it
    dequantized = {n: t.to(torch.float32) for n, t in stored.items() if not n.endswith("_scale_inv")}
    dequantized.update(oracle(stored, (32, 32), torch.float32))
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{k: v for k, v in config.items()
                                                                       if k != "torch_dtype"})).float()
    model.load_state_dict(dequantized)
    merged = peft.PeftModel.from_pretrained(model, adapter).merge_and_unload()
    ours = safetensors_torch.load_file(str(out / "model.safetensors"))
    theirs = merged.state_dict()
    assert sorted(ours) == sorted(theirs)
    for k, v in theirs.items():
        exact_or_close(ours[k].numpy(), v.numpy(), k)
    written = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in written and written["torch_dtype"] == "float32"


def test_lora_onto_an_fp8_base_without_a_dtype_is_refused(tmp_path: Path) -> None:
    src, _ = fp8_folder(tmp_path / "fp8")
    adapter, _ = _adapter(tmp_path)
    p = migrate_in_process("convert", str(src), f"{tmp_path / 'out'}/", "--lora", str(adapter))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "declares this base quantized" in p.stderr and "--dtype" in p.stderr
    assert not (tmp_path / "out").exists()


def test_diff_fp8_against_its_dequantization_and_the_original(tmp_path: Path) -> None:
    src, stored = fp8_folder(tmp_path / "fp8")
    # the reference dequantization, written by safetensors itself: equal bit for bit through --dtype
    reference = {n: t for n, t in stored.items() if not n.endswith("_scale_inv")}
    reference.update(oracle(stored, (32, 32), torch.bfloat16))
    safetensors_torch.save_file({n: t.contiguous() for n, t in reference.items()}, str(tmp_path / "ref.safetensors"))
    ok("diff", str(src), str(tmp_path / "ref.safetensors"), "--dtype", "BF16")
    # the weights before quantization: they differ, within FP8's precision (3 mantissa bits)
    _, original = tiny_llama(0)
    safetensors_torch.save_file(original, str(tmp_path / "orig.safetensors"))
    p = migrate_in_process("diff", str(src), str(tmp_path / "orig.safetensors"), "--dtype", "BF16")
    assert p.returncode == 1, p.stdout
    ok("diff", str(src), str(tmp_path / "orig.safetensors"), "--dtype", "BF16", "--atol", "1e-5", "--rtol", "0.07")


def test_transformers_loads_the_dequantized_folder_as_a_plain_model(tmp_path: Path) -> None:
    """The written config.json (no quantization_config, torch_dtype bfloat16) loads in transformers as a
    plain BF16 Llama holding exactly the reference dequantization."""
    transformers = pytest.importorskip("transformers")
    src, stored = fp8_folder(tmp_path / "fp8")
    out = tmp_path / "out"
    ok("convert", str(src), f"{out}/", "--dtype", "BF16", "--copy", "config.json")
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    assert model.dtype == torch.bfloat16 and getattr(model.config, "quantization_config", None) is None
    state = model.state_dict()
    for name, w in oracle(stored, (32, 32), torch.bfloat16).items():
        assert torch.equal(state[name].view(torch.int16), w.contiguous().view(torch.int16)), name


def test_a_sources_entry_is_dequantized_by_the_recipes_cast(tmp_path: Path) -> None:
    src, stored = fp8_folder(tmp_path / "fp8")
    safetensors_torch.save_file({"x": torch.ones(3)}, str(tmp_path / "extra.safetensors"))
    recipe = tmp_path / "u.yaml"
    recipe.write_text(f"version: 1\nsources:\n  - {{path: {src}}}\n  - {{path: {tmp_path / 'extra.safetensors'}, "
                      f"prefix: 'extra.'}}\ntarget: {{path: {tmp_path / 'u.safetensors'}}}\ndtype: {{cast: F32}}\n")
    ok("run", str(recipe), "--report", str(tmp_path / "r.json"))
    got = safetensors_torch.load_file(str(tmp_path / "u.safetensors"))
    for name, w in oracle(stored, (32, 32), torch.float32).items():
        assert torch.equal(got[name].view(torch.int32), w.contiguous().view(torch.int32)), name
    assert "extra.x" in got and not [n for n in got if n.endswith("_scale_inv")]
    assert len(json.loads((tmp_path / "r.json").read_text())["consumed"]) == 14
