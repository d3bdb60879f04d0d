"""The Rust example of docs/burn-compatibility.md ("Loading the output in Rust") against what
`recipes/llama-to-burn.yaml` writes.

Rust cannot be compiled here (no crate registry), so what the example promises is checked from both
ends: its structs, expanded into field paths as Burn's `#[derive(Module)]` names parameters (a field is
a path segment, a `Vec` adds the index; burn-nn's `Linear` holds `weight` as `[d_input, d_output]` and
`bias` only when configured, `Embedding` `weight`, `RmsNorm` `gamma`), with the shapes its `init` gives,
are exactly the recipe output's tensors: what `load_from` with burn-store's defaults (`allow_partial`
false) needs. The values are transformers' `LlamaForCausalLM` of the demo folder: Linear weights
transposed, q and k permuted back to interleaved pairs as transformers' own
`convert_llama_weights_to_hf.py` permutes the other way."""

from __future__ import annotations

import re
import runpy
import shutil
import sys
from pathlib import Path

import pytest

from migrator import open_file
from migrator.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "burn-compatibility.md"
LEAVES = {"Linear": ("weight",), "Embedding": ("weight",), "RmsNorm": ("gamma",)}


def _rust_blocks() -> list[str]:
    text = DOC.read_text()
    section = text[text.index("## Loading the output in Rust"):text.index("## Names")]
    return re.findall(r"```rust\n(.*?)```", section, re.DOTALL)


def _paths(code: str, layers: int) -> list[str]:
    structs = {name: re.findall(r"^\s+(\w+): ([\w<>]+),$", body, re.MULTILINE)
               for name, body in re.findall(r"pub struct (\w+) \{\n(.*?)\n\}", code, re.DOTALL)}
    assert set(structs) == {"Llama", "Block", "Attention", "Mlp"}, structs

    def expand(type_name: str, prefix: str) -> list[str]:
        if type_name in LEAVES:
            return [f"{prefix}.{p}" for p in LEAVES[type_name]]
        vec = re.fullmatch(r"Vec<(\w+)>", type_name)
        if vec:
            return [p for i in range(layers) for p in expand(vec.group(1), f"{prefix}.{i}")]
        return [p for field, t in structs[type_name] for p in expand(t, f"{prefix}.{field}" if prefix else field)]

    return expand("Llama", "")


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("demo")
    shutil.copytree(REPO / "recipes", work / "recipes")
    argv = sys.argv
    try:
        sys.argv = ["generate_demo_data.py", str(work / "demo-out")]
        sys.path.insert(0, str(work / "recipes"))
        runpy.run_path(str(work / "recipes" / "generate_demo_data.py"), run_name="__main__")
    finally:
        sys.argv = argv
        sys.path.remove(str(work / "recipes"))
    assert main(["run", str(work / "recipes" / "llama-to-burn.yaml"), "--no-progress"]) == 0
    return work / "demo-out"


def test_the_structs_field_paths_are_the_tensors_written(written: Path) -> None:
    model, *_ = _rust_blocks()
    config = transformers.AutoConfig.from_pretrained(written / "llama-base")
    sizes = re.search(r"let \(hidden, ff, vocab, kv\) = \((\d+), (\d+), (\d+), (\d+)\);", model)
    assert sizes is not None and "(0..4)" in model and ".with_bias(false)" in model
    hidden, ff, vocab, kv = map(int, sizes.groups())
    head_dim = config.hidden_size // config.num_attention_heads
    assert (hidden, ff, vocab, kv) == (config.hidden_size, config.intermediate_size, config.vocab_size,
                                       config.num_key_value_heads * head_dim)
    epsilon = re.search(r"with_epsilon\(([^)]+)\)", model)
    assert config.num_hidden_layers == 4 and epsilon is not None and float(epsilon.group(1)) == config.rms_norm_eps
    with open_file(written / "llama-burn.bpk") as r:
        shapes = {t.name: list(t.shape) for t in r.tensors}
    assert sorted(_paths(model, config.num_hidden_layers)) == sorted(shapes)
    # the shapes the Rust init gives each parameter (Linear: [d_input, d_output])
    want = {"embedding.weight": [vocab, hidden], "norm.gamma": [hidden], "output.weight": [hidden, vocab]}
    for i in range(config.num_hidden_layers):
        b = f"layers.{i}."
        want.update({b + "attention_norm.gamma": [hidden], b + "mlp_norm.gamma": [hidden],
                     b + "attention.query.weight": [hidden, hidden], b + "attention.key.weight": [hidden, kv],
                     b + "attention.value.weight": [hidden, kv], b + "attention.output.weight": [hidden, hidden],
                     b + "mlp.gate.weight": [hidden, ff], b + "mlp.up.weight": [hidden, ff],
                     b + "mlp.down.weight": [ff, hidden]})
    assert shapes == want


def test_the_values_are_transformers_in_burns_layout(written: Path) -> None:
    hf = transformers.LlamaForCausalLM.from_pretrained(written / "llama-base")
    config = hf.config
    sd = {k: v.detach() for k, v in hf.state_dict().items()}

    def to_interleaved(w: torch.Tensor, heads: int) -> torch.Tensor:
        """The inverse of convert_llama_weights_to_hf.py's permute (Meta's pairs -> Hugging Face's halves)."""
        rows, cols = w.shape
        return w.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)

    with open_file(written / "llama-burn.bpk") as r:
        got = {t.name: torch.from_numpy(t.numpy().copy()) for t in r.tensors}
    assert torch.equal(got["embedding.weight"], sd["model.embed_tokens.weight"])
    assert torch.equal(got["output.weight"], sd["lm_head.weight"].T)
    assert torch.equal(got["norm.gamma"], sd["model.norm.weight"])
    for i in range(config.num_hidden_layers):
        hf_l, b = f"model.layers.{i}.", f"layers.{i}."
        assert torch.equal(got[b + "attention.query.weight"],
                           to_interleaved(sd[hf_l + "self_attn.q_proj.weight"], config.num_attention_heads).T)
        assert torch.equal(got[b + "attention.key.weight"],
                           to_interleaved(sd[hf_l + "self_attn.k_proj.weight"], config.num_key_value_heads).T)
        for burn_name, hf_name in (("attention.value", "self_attn.v_proj"), ("attention.output", "self_attn.o_proj"),
                                   ("mlp.gate", "mlp.gate_proj"), ("mlp.up", "mlp.up_proj"),
                                   ("mlp.down", "mlp.down_proj")):
            assert torch.equal(got[f"{b}{burn_name}.weight"], sd[f"{hf_l}{hf_name}.weight"].T), burn_name
        assert torch.equal(got[b + "attention_norm.gamma"], sd[hf_l + "input_layernorm.weight"])
        assert torch.equal(got[b + "mlp_norm.gamma"], sd[hf_l + "post_attention_layernorm.weight"])


def test_the_resume_example_names_the_files_a_keep_run_writes() -> None:
    _, resume = _rust_blocks()
    assert '.load("out-optim.bpk")' in resume and 'LrSchedulerRecord::load("out-scheduler.bpk")' in resume
