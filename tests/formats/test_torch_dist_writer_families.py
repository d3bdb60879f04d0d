"""recipes/hf-{qwen2,qwen3,mixtral,qwen3-moe}-to-megatron.yaml against megatron-core 0.16.1 itself.

Each family's tiny transformers model (fixed seed; norms and biases moved away from their init so a swap
shows) goes through its recipe as a user runs it; the oracles are megatron-core's `dist_checkpointing.load`
of the folder into the sharded state dict its own GPTModel builds for the model's config.json
(`tests/support/megatron_load.py`: local layer spec, experts as a SequentialMLP, gloo on CPU), a strict
`load_state_dict`, every tensor it loaded against the Hugging Face tensors rearranged by torch here (bit
for bit), and megatron's forward: its logits against transformers' on the source model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process
from tests.support.hf_families import EXPERTS, FAMILIES, FFN, HEADS, HIDDEN, KV_HEADS, LAYERS, VOCAB, tiny_model
from tests.support.megatron_load import TOKENS, load_into_megatron

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")
st_torch = pytest.importorskip("safetensors.torch")

pytestmark = pytest.mark.slow  # megatron-core imported in a new process: ~25 s per family under load

REPO = Path(__file__).resolve().parents[2]
def _qkv(hf: dict[str, Any], a: str, kind: str) -> Any:
    """q, k and v's `kind` (weight, bias) per key/value group: each group's query heads, its key, its value."""
    parts = [hf[f"{a}{p}_proj.{kind}"].view(KV_HEADS, -1, *hf[f"{a}{p}_proj.{kind}"].shape[1:]) for p in "qkv"]
    return torch.cat(parts, dim=1).flatten(0, 1)


def megatron_layout(family: str, hf: dict[str, Any]) -> dict[str, Any]:
    """The Hugging Face tensors as megatron's GPTModel (local spec, SequentialMLP experts) names and lays
    them out in its state dict, by torch."""
    out = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": hf["model.norm.weight"], "output_layer.weight": hf["lm_head.weight"]}
    for i in range(LAYERS):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        out[m + "self_attention.linear_qkv.weight"] = _qkv(hf, h + "self_attn.", "weight")
        out[m + "self_attention.linear_proj.weight"] = hf[h + "self_attn.o_proj.weight"]
        out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
        if family == "qwen2":
            out[m + "self_attention.linear_qkv.bias"] = _qkv(hf, h + "self_attn.", "bias")
        if family in ("qwen3", "qwen3-moe"):
            out[m + "self_attention.q_layernorm.weight"] = hf[h + "self_attn.q_norm.weight"]
            out[m + "self_attention.k_layernorm.weight"] = hf[h + "self_attn.k_norm.weight"]
        if family == "mixtral":
            out[m + "mlp.router.weight"] = hf[h + "block_sparse_moe.gate.weight"]
            for e in range(EXPERTS):
                x, y = f"{h}block_sparse_moe.experts.{e}.", f"{m}mlp.experts.local_experts.{e}."
                out[y + "linear_fc1.weight"] = torch.cat([hf[x + "w1.weight"], hf[x + "w3.weight"]])
                out[y + "linear_fc2.weight"] = hf[x + "w2.weight"]
        elif family == "qwen3-moe":
            out[m + "mlp.router.weight"] = hf[h + "mlp.gate.weight"]
            for e in range(EXPERTS):
                x, y = f"{h}mlp.experts.{e}.", f"{m}mlp.experts.local_experts.{e}."
                out[y + "linear_fc1.weight"] = torch.cat([hf[x + "gate_proj.weight"], hf[x + "up_proj.weight"]])
                out[y + "linear_fc2.weight"] = hf[x + "down_proj.weight"]
        else:
            out[m + "mlp.linear_fc1.weight"] = torch.cat([hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]])
            out[m + "mlp.linear_fc2.weight"] = hf[h + "mlp.down_proj.weight"]
    return out


def convert(family: str, tmp: Path, **extra: Any) -> dict[str, Any]:
    """The family's tiny model through its recipe, and megatron's reading of the result on one rank."""
    model = tiny_model(family, tmp / "hf", **extra)
    out = tmp / "megatron"
    run = migrate_in_process("run", str(REPO / "recipes" / f"hf-{family}-to-megatron.yaml"), "--source",
                             str(tmp / "hf"), "--target", f"{out}/", "--no-progress")
    assert run.returncode == 0, run.stderr
    with torch.no_grad():
        logits = model(torch.tensor(TOKENS)).logits
    return {"out": out, "stderr": run.stderr + run.stdout, "hf_logits": logits,
            "hf": st_torch.load_file(str(tmp / "hf" / "model.safetensors")),
            "megatron": load_into_megatron(out, tmp / "hf" / "config.json", tmp / "megatron-read.pt")}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp(f"hf-{request.param}-to-megatron")
    return {"family": request.param, "tmp": tmp, **convert(request.param, tmp)}


def test_megatron_loads_each_family_and_gives_its_logits(converted: dict[str, Any]) -> None:
    logits = converted["megatron"]["logits"]
    assert logits.shape == converted["hf_logits"].shape == (1, len(TOKENS[0]), VOCAB)
    torch.testing.assert_close(logits, converted["hf_logits"], rtol=1e-5, atol=1e-5)


def test_every_tensor_megatron_loaded_is_the_hf_one_rearranged(converted: dict[str, Any]) -> None:
    loaded, expected = converted["megatron"]["state"], megatron_layout(converted["family"], converted["hf"])
    assert sorted(loaded) == sorted(expected)
    for name, tensor in expected.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name


@pytest.mark.parametrize("family", ["qwen2", "mixtral"])
def test_two_tensor_parallel_ranks_load_their_parts_and_give_the_logits(
        family: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each rank reads its KV group's rows of linear_qkv (weight and bias), and of each expert its halves of
    gate and up (megatron's expert tensor parallelism follows the tensor-parallel size) out of the whole chunks."""
    tmp = tmp_path_factory.mktemp(f"hf-{family}-tp2")
    model = tiny_model(family, tmp / "hf")
    out = tmp / "megatron"
    run = migrate_in_process("run", str(REPO / "recipes" / f"hf-{family}-to-megatron.yaml"), "--source",
                             str(tmp / "hf"), "--target", f"{out}/", "--no-progress")
    assert run.returncode == 0, run.stderr
    read = load_into_megatron(out, tmp / "hf" / "config.json", tmp / "tp2.pt", ranks=2)
    with torch.no_grad():
        torch.testing.assert_close(read["logits"], model(torch.tensor(TOKENS)).logits, rtol=1e-5, atol=1e-5)
    whole = megatron_layout(family, st_torch.load_file(str(tmp / "hf" / "model.safetensors")))
    rows = (HEADS + 2 * KV_HEADS) * HIDDEN // HEADS // 2  # one of the two KV groups
    for name in [f"decoder.layers.1.self_attention.linear_qkv.{kind}" for kind in ("weight", "bias")]:
        if name in whole:  # Mixtral's q, k and v have no bias
            assert torch.equal(read["state"][name], whole[name][:rows]), name
    if family == "mixtral":
        fc1 = "decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight"
        gate, up = whole[fc1].chunk(2)
        assert torch.equal(read["state"][fc1], torch.cat([gate[:FFN // 2], up[:FFN // 2]]))
        assert torch.equal(read["state"]["decoder.layers.0.mlp.router.weight"],
                           whole["decoder.layers.0.mlp.router.weight"])


def test_qwen3_moe_without_norm_topk_prob_is_megatrons_pre_softmax_router(tmp_path: Path) -> None:
    """norm_topk_prob: false (the chosen experts' softmax weights kept as they are, not renormalised) is
    megatron's --moe-router-pre-softmax: the same tensors, and megatron built so gives transformers' logits."""
    done = convert("qwen3-moe", tmp_path, norm_topk_prob=False)
    torch.testing.assert_close(done["megatron"]["logits"], done["hf_logits"], rtol=1e-5, atol=1e-5)
    renormalised = tiny_model("qwen3-moe", tmp_path / "renormalised")  # the same weights (seed), norm_topk_prob
    with torch.no_grad():
        assert not torch.allclose(renormalised(torch.tensor(TOKENS)).logits, done["hf_logits"], atol=1e-3)


@pytest.mark.parametrize(("family", "extra", "message"), [
    ("qwen3-moe", {"mlp_only_layers": [1]},  # layer 1's MLP is dense: its experts are layer 0's alone
     "'decoder.layers.mlp.experts.experts.linear_fc2.weight': its layer axis has 1 layers; "
     "decoder.layers.self_attention.linear_qkv.layer_norm_weight has 2"),
    ("qwen3", {"attention_bias": True},  # megatron has no q/k/v biases beside q/k norms, nor o_proj's alone
     "'model.layers.0.self_attn.k_proj.bias': one layer's tensor, not in megatron's layout"),
])
def test_what_megatron_has_no_place_for_is_refused_and_the_target_kept(
        family: str, extra: dict[str, Any], message: str, tmp_path: Path) -> None:
    """A dense layer among expert layers, or biases megatron's GPTModel lacks: the recipe leaves them as they
    are, and the target refuses the model in one line naming a tensor."""
    tiny_model(family, tmp_path / "hf", **extra)
    out = tmp_path / "megatron"
    out.mkdir()
    (out / "keep").write_text("old")
    run = migrate_in_process("run", str(REPO / "recipes" / f"hf-{family}-to-megatron.yaml"), "--source",
                             str(tmp_path / "hf"), "--target", f"{out}/", "--no-progress")
    assert run.returncode == 1, run.stderr
    error = run.stderr.strip().splitlines()[0]
    assert error.startswith(f"error: tensor {message}"), run.stderr
    assert "migrate: nothing written" in run.stderr and run.stderr.count("error") == 1, run.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep"] and (out / "keep").read_text() == "old"


def test_the_torch_dist_reader_reads_it_back_per_layer_and_expert(converted: dict[str, Any]) -> None:
    """migrator's own torch_dist reader on the folder: each layer's (and expert's) tensor is the Hugging Face one
    rearranged by torch, under the names megatron's model holds it by."""
    back = converted["tmp"] / "back.safetensors"
    run = migrate_in_process("convert", str(converted["out"]), str(back))
    assert run.returncode == 0, run.stderr
    got = st_torch.load_file(str(back))
    expected = {k.replace("input_layernorm.", "self_attention.linear_qkv.layer_norm_")
                .replace("pre_mlp_layernorm.", "mlp.linear_fc1.layer_norm_"): v
                for k, v in megatron_layout(converted["family"], converted["hf"]).items()}
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
