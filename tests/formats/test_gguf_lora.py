"""`migrate convert ADAPTER_DIR adapter.gguf`: a PEFT LoRA adapter as llama.cpp's GGUF LoRA adapter.

Oracles: llama.cpp's own `convert_lora_to_gguf.py` (from the llama-cpp-python 0.3.36 sdist that
`make test-llamacpp` builds; `make test` extracts the scripts, nothing compiled) run on the same
adapter and base, whose tensors (names, order, types, shapes, bytes) and key/values ours must equal;
and PEFT itself: each module's delta in llama.cpp's layout (`alpha / r * lora_b @ lora_a`, as gguf-py
reads our file) equals the change PEFT's `merge_and_unload` makes to the base weight, in the layout
the model converter writes the weight (q and k rows permuted for llama). llama.cpp applying the
adapter is `test_gguf_llamacpp.py`'s. Bad input: one-line errors, nothing written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

SCRIPTS = Path(sys.prefix) / "llamacpp-scripts-0.3.36"
SCRIPT = SCRIPTS / "convert_lora_to_gguf.py"
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# key/values the script derives from the adapter folder's name and PEFT's model card (gguf-py's Metadata
# heuristics), which migrator does not write
CARD_KEYS = ("general.name", "general.tags", "general.base_model.")


def tiny(arch: str) -> Any:
    torch.manual_seed(0)
    common = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    if arch == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common)).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()


def make_adapter(root: Path, arch: str = "llama", targets: list[str] | None = None, *, base_path: bool = True,
                 **config: Any) -> tuple[Path, Path, Any, Any]:
    """A saved tiny base, a saved adapter (lora_B non-zero) naming it as base_model_name_or_path, the
    base model and PEFT's merged model."""
    model = tiny(arch)
    base, adapter = root / "base", root / "adapter"
    model.save_pretrained(base)
    reference = tiny(arch)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets or ALL_LINEAR,
                                                         **config))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    wrapped.save_pretrained(adapter)
    if base_path:
        path = adapter / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "base_model_name_or_path": str(base)}))
    return base, adapter, reference, wrapped.merge_and_unload().eval()


def oracle(adapter: Path, base: Path, out: Path, outtype: str = "f32") -> Path:
    """llama.cpp's convert_lora_to_gguf.py, its own gguf-py first on the path (as it puts it)."""
    if not SCRIPT.is_file():
        pytest.skip(f"llama.cpp's scripts are extracted by `make test` into {SCRIPTS}")
    done = subprocess.run([sys.executable, str(SCRIPT), str(adapter), "--base", str(base), "--outfile", str(out),
                           "--outtype", outtype], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def fields(path: Path) -> dict[str, tuple[list[int], Any]]:
    r = gguf.GGUFReader(str(path))
    return {k: ([int(t) for t in f.types], f.contents()) for k, f in r.fields.items()
            if not k.startswith("GGUF.") and not k.startswith(CARD_KEYS)}


def tensors(path: Path) -> list[tuple[str, str, list[int], bytes]]:
    return [(t.name, t.tensor_type.name, [int(d) for d in t.shape], t.data.tobytes())
            for t in gguf.GGUFReader(str(path)).tensors]


@pytest.mark.parametrize(("arch", "outtype", "targets"), [
    ("llama", "f32", None),
    ("llama", "f16", ["q_proj", "k_proj", "embed_tokens", "lm_head"]),
    ("llama", "bf16", ["v_proj", "down_proj"]),
    ("llama", "q8_0", None),
    ("qwen2", "f32", None),
])
def test_equals_convert_lora_to_gguf(tmp_path: Path, arch: str, outtype: str, targets: list[str] | None) -> None:
    base, adapter, _, _ = make_adapter(tmp_path, arch, targets)
    theirs = oracle(adapter, base, tmp_path / "theirs.gguf", outtype)
    ours = tmp_path / "ours.gguf"
    dtype = {"f32": [], "q8_0": ["--quantize", "Q8_0"]}.get(outtype, ["--dtype", outtype.upper()])
    done = migrate_in_process("convert", str(adapter), str(ours), *dtype)
    assert done.returncode == 0, done.stderr
    assert "tokenizer" not in done.stdout  # no tokenizer note: an adapter runs with its base's
    assert tensors(ours) == tensors(theirs)
    assert fields(ours) == fields(theirs)
    assert fields(ours)["general.type"][1] == "adapter"


def permuted(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's q/k permute (Hugging Face's halves -> Meta's interleaved pairs), on rows."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_deltas_equal_peft_merge(tmp_path: Path) -> None:
    """What llama.cpp adds to each weight, alpha / r * lora_b @ lora_a (lora_a's rows gathered by token
    for the embedding), from our file as gguf-py reads it, is PEFT's merged weight minus the base's."""
    base, adapter, reference, merged = make_adapter(tmp_path, targets=[*ALL_LINEAR, "embed_tokens", "lm_head"])
    out = tmp_path / "a.gguf"
    assert migrate_in_process("convert", str(adapter), str(out), "--base", str(base)).returncode == 0
    r = gguf.GGUFReader(str(out))
    alpha = float(r.fields["adapter.lora.alpha"].contents())
    assert r.fields["adapter.lora.alpha"].types == [gguf.GGUFValueType.FLOAT32]
    got = {t.name: np.asarray(t.data) for t in r.tensors}  # gguf-py: numpy order, dims reversed from GGUF's
    names = {"embed_tokens": "token_embd", "lm_head": "output", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    before, after = reference.state_dict(), merged.state_dict()
    checked = 0
    for hf, ours in names.items():
        for layer in ([None] if hf in ("embed_tokens", "lm_head") else range(2)):
            key = (f"model.{hf}.weight" if hf == "embed_tokens" else f"{hf}.weight" if hf == "lm_head"
                   else f"model.layers.{layer}.{hf}.weight")
            name = ours if layer is None else f"blk.{layer}.{ours}"
            a, b = got[f"{name}.weight.lora_a"].astype(np.float64), got[f"{name}.weight.lora_b"].astype(np.float64)
            rank = b.shape[1]
            delta = (after[key] - before[key]).double().numpy()
            # the embedding: llama.cpp gathers lora_a's rows by token, then lora_b: [vocab, r] @ [r, hidden]
            ours_delta = alpha / rank * (a @ b.T if hf == "embed_tokens" else b @ a)
            if hf.endswith("q_proj"):
                delta = permuted(delta, 4)
            elif hf.endswith("k_proj"):
                delta = permuted(delta, 2)
            np.testing.assert_allclose(ours_delta, delta, rtol=0, atol=1e-6, err_msg=key)
            checked += 1
    assert checked == 16


def one_line_error(done: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    message = done.stderr.strip()
    assert "\n" not in message and "Traceback" not in message, message
    for w in words:
        assert w in message, message
    return message


def test_base_of_other_shapes_is_refused(tmp_path: Path) -> None:
    _, adapter, _, _ = make_adapter(tmp_path / "one")
    other = tmp_path / "other"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False)).save_pretrained(other)
    out = tmp_path / "a.gguf"
    out.write_bytes(b"kept")
    done = migrate_in_process("convert", str(adapter), str(out), "--base", str(other), "--overwrite")
    one_line_error(done, 1, "an adapter of another model", "'model.layers.0.mlp.down_proj.weight'")
    assert out.read_bytes() == b"kept"


def test_base_not_local_is_a_usage_error(tmp_path: Path) -> None:
    _, adapter, _, _ = make_adapter(tmp_path, base_path=False)
    path = adapter / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "base_model_name_or_path": "meta-llama/Llama-3.2-1B"}))
    out = tmp_path / "a.gguf"
    done = migrate_in_process("convert", str(adapter), str(out))
    one_line_error(done, 2, "'meta-llama/Llama-3.2-1B' is not a local folder", "--base DIR")
    assert not out.exists()
    done = migrate_in_process("convert", str(adapter), str(out), "--base", str(tmp_path / "nowhere"))
    one_line_error(done, 2, "--base", "not a folder")
    assert not out.exists()


def test_base_option_needs_an_adapter(tmp_path: Path) -> None:
    base, _, _, _ = make_adapter(tmp_path)
    done = migrate_in_process("convert", str(base), str(tmp_path / "m.gguf"), "--base", str(base))
    one_line_error(done, 2, "--base names the base model of a PEFT LoRA adapter")


def test_modules_gguf_cannot_name_are_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    _, adapter, _, _ = make_adapter(tmp_path, targets=["q_proj"])
    weights = load_file(adapter / "adapter_model.safetensors")
    renamed = {k.replace("layers.1.self_attn.q_proj", "layers.1.self_attn.rotary"): v for k, v in weights.items()}
    save_file(renamed, adapter / "adapter_model.safetensors")
    done = migrate_in_process("convert", str(adapter), str(tmp_path / "a.gguf"))
    one_line_error(done, 1, "no tensor for module 'model.layers.1.self_attn.rotary'")
    assert not (tmp_path / "a.gguf").exists()


@pytest.mark.parametrize(("config", "words"), [
    ({"use_dora": True}, "use_dora is set"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save is set"),
    ({"alpha_pattern": {"q_proj": 16}}, "alpha_pattern is set"),
])
def test_what_llama_cpp_cannot_hold_is_refused(tmp_path: Path, config: dict[str, Any], words: str) -> None:
    _, adapter, _, _ = make_adapter(tmp_path, targets=["q_proj"], **config)
    done = migrate_in_process("convert", str(adapter), str(tmp_path / "a.gguf"))
    one_line_error(done, 1, words, "adapter_config.json")
    assert not (tmp_path / "a.gguf").exists()


def test_rslora_alpha_is_what_llama_cpp_scales_by(tmp_path: Path) -> None:
    """rsLoRA scales by alpha / sqrt(r); llama.cpp by alpha / r: the alpha written is alpha x sqrt(r)."""
    _, adapter, reference, merged = make_adapter(tmp_path, targets=["v_proj"], use_rslora=True)
    out = tmp_path / "a.gguf"
    assert migrate_in_process("convert", str(adapter), str(out)).returncode == 0
    r = gguf.GGUFReader(str(out))
    alpha = float(r.fields["adapter.lora.alpha"].contents())
    got = {t.name: np.asarray(t.data).astype(np.float64) for t in r.tensors}
    a, b = got["blk.0.attn_v.weight.lora_a"], got["blk.0.attn_v.weight.lora_b"]
    key = "model.layers.0.self_attn.v_proj.weight"
    delta = (merged.state_dict()[key] - reference.state_dict()[key]).double().numpy()
    np.testing.assert_allclose(alpha / b.shape[1] * b @ a, delta, rtol=0, atol=1e-6)


def test_docs_block_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/gguf.md's LoRA adapter commands, run as written on a base/ and an adapter/ naming it."""
    import re
    import shlex

    doc = (Path(__file__).resolve().parents[2] / "docs" / "gguf.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- tested: lora-adapter -->\n```sh\n(.*?)```", doc, re.S)
    assert block is not None
    _, adapter, _, _ = make_adapter(tmp_path, targets=["q_proj", "v_proj"])
    path = adapter / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "base_model_name_or_path": "base"}))
    monkeypatch.chdir(tmp_path)
    lines = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    for line in lines:
        words = shlex.split(line)
        assert words[0] == "migrate"
        done = migrate_in_process(*words[1:])
        assert done.returncode == 0, (line, done.stderr)
    assert "adapter.lora.alpha" in done.stdout and "blk.0.attn_q.weight.lora_b" in done.stdout
    half = {t.name: t.tensor_type.name for t in gguf.GGUFReader("adapter-f16.gguf").tensors}
    assert set(half.values()) == {"F16"} and len(half) == 8
