"""The checked-in `ops:` recipes on the demo checkpoints, with transformers and torch as the oracles:
GPT-2's fused c_attn split into q/k/v and back, Mixtral's experts stacked as transformers v5 holds them and
back, a Meta Llama checkpoint into Hugging Face's layout (the conversion script's RoPE permute) and back."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("safetensors.torch")

from migrator.cli import main  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "recipes"))
import ops_demo  # noqa: E402


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ops-recipes")
    shutil.copytree(REPO / "recipes", root / "recipes", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    subprocess.run([sys.executable, str(REPO / "recipes" / "generate_demo_data.py"), str(root / "demo-out")],
                   check=True, capture_output=True)
    return root


def run(ws: Path, name: str) -> None:
    assert main(["run", str(ws / "recipes" / f"{name}.yaml"), "--no-progress"]) == 0, name


def load(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix in (".pt", ".pth"):
        return torch.load(path, weights_only=True)
    return st.load_file(path)


def same_bytes(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].contiguous().view(torch.uint8), b[k].contiguous().view(torch.uint8)), k


def hf_permute(w: torch.Tensor, n_heads: int, dim1: int, dim2: int) -> torch.Tensor:
    """Hugging Face's Llama conversion script's permute (Meta -> HF), written here in torch."""
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


def test_gpt2_split_qkv_and_merge_back(ws: Path) -> None:
    out = ws / "demo-out"
    run(ws, "gpt2-split-qkv")
    run(ws, "gpt2-merge-qkv")
    c = ops_demo.GPT2
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=c["n_embd"], n_layer=c["n_layer"], n_head=c["n_head"], vocab_size=c["vocab_size"],
        n_positions=c["n_positions"]))
    original = load(out / "gpt2-tiny.safetensors")
    missing, unexpected = model.load_state_dict(original, strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}  # tied to wte
    split = load(out / "gpt2-tiny-split-qkv.safetensors")
    e = c["n_embd"]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, e, generator=g)
    for i in range(c["n_layer"]):
        attn = model.transformer.h[i].attn
        fused = attn.c_attn(x)  # transformers' Conv1D: x @ W[in, 3*out] + b
        for j, n in enumerate("qkv"):
            w, b = split[f"transformer.h.{i}.attn.{n}_proj.weight"], split[f"transformer.h.{i}.attn.{n}_proj.bias"]
            assert w.shape == (e, e) and b.shape == (e,)
            want_w = torch.split(original[f"transformer.h.{i}.attn.c_attn.weight"], e, dim=1)[j].t()
            assert torch.equal(w, want_w)
            torch.testing.assert_close(torch.nn.functional.linear(x, w, b), fused[:, j * e:(j + 1) * e])
        assert f"transformer.h.{i}.attn.c_attn.weight" not in split
    same_bytes(load(out / "gpt2-tiny-merged.safetensors"), original)


def test_mixtral_experts_stack_as_transformers_loads_them_and_back(ws: Path) -> None:
    out = ws / "demo-out"
    run(ws, "mixtral-stack-experts")
    run(ws, "mixtral-unstack-experts")
    stacked = load(out / "mixtral-tiny-stacked.safetensors")
    # transformers v5 merges per-expert checkpoints on load: its result is the oracle
    folder = out / "mixtral-hf"
    folder.mkdir(exist_ok=True)
    shutil.copy(out / "mixtral-tiny-experts.safetensors", folder / "model.safetensors")
    shutil.copy(out / "mixtral-tiny-config.json", folder / "config.json")
    model = transformers.MixtralForCausalLM.from_pretrained(folder)
    reference = {k: v.detach() for k, v in model.state_dict().items()}
    same_bytes(stacked, reference)
    fresh = transformers.MixtralForCausalLM(transformers.MixtralConfig(**ops_demo.MIXTRAL))
    result = fresh.load_state_dict(stacked, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    same_bytes(load(out / "mixtral-tiny-experts-again.safetensors"), load(out / "mixtral-tiny-experts.safetensors"))


def test_llama_meta_to_hf_and_back(ws: Path) -> None:
    out = ws / "demo-out"
    run(ws, "llama-meta-to-hf")
    run(ws, "llama-hf-to-meta")
    c = ops_demo.LLAMA
    meta = load(out / "llama-meta-tiny" / "consolidated.00.pth")
    hf = load(out / "llama-hf-tiny" / "model.safetensors")
    d, heads, kv_heads = c["dim"], c["n_heads"], c["n_kv_heads"]
    kv = d // heads * kv_heads
    for i in range(c["n_layers"]):
        assert torch.equal(hf[f"model.layers.{i}.self_attn.q_proj.weight"],
                           hf_permute(meta[f"layers.{i}.attention.wq.weight"], heads, d, d))
        assert torch.equal(hf[f"model.layers.{i}.self_attn.k_proj.weight"],
                           hf_permute(meta[f"layers.{i}.attention.wk.weight"], kv_heads, kv, d))
        assert torch.equal(hf[f"model.layers.{i}.self_attn.v_proj.weight"], meta[f"layers.{i}.attention.wv.weight"])
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=c["ffn_dim"], num_hidden_layers=c["n_layers"],
                                      num_attention_heads=heads, num_key_value_heads=kv_heads,
                                      vocab_size=c["vocab_size"], tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    result = model.load_state_dict(hf, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    same_bytes(load(out / "llama-meta-tiny-again.pt"), meta)


def test_plan_json_lists_op_nodes(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(ws / "recipes" / "gpt2-split-qkv.yaml"), "--json"]) in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    nodes = doc["report"]["ops"]
    assert nodes[0]["op"] == "split" and nodes[0]["inputs"] == ["transformer.h.0.attn.c_attn.bias"]
    assert nodes[0]["outputs"] == [f"transformer.h.0.attn.{n}_proj.bias" for n in "qkv"]
    assert nodes[0]["at"].endswith("gpt2-split-qkv.yaml:11:5")
    assert sum(n["op"] == "permute" for n in nodes) == 3 * ops_demo.GPT2["n_layer"]
