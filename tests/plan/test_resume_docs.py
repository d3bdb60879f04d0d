"""The resumes docs/training-checkpoints.md shows, run as written, on a layout whose declared order
differs from the recipe's output order.

A Phi-3-like model (`o_proj` declared before the fused `qkv_proj`, a fused `gate_up_proj`) becomes a
Llama-like one (`q_proj`, `k_proj`, `v_proj`, then `o_proj`; `gate_proj`, `up_proj`) through a split
recipe with `training_state: keep`. Each documented code block (`<!-- tested: NAME -->` before it) is
executed with `new_model` the Llama-like module, and the optimizer it builds takes one more step.
The oracle is torch's: the same step taken on the original model and optimizer, then the surgery
written here with torch (`torch.chunk`), compared bit for bit for every parameter and both moments.
The naive resume (`AdamW(new_model.named_parameters())` then `load_state_dict`) is checked to give
`o_proj` another parameter's moments on this layout, so a resume that pairs by position fails here.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
nn = torch.nn

D, F, VOCAB, LAYERS = 8, 12, 11, 2
DOC = Path(__file__).resolve().parents[2] / "docs" / "training-checkpoints.md"


class PhiAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.o_proj = nn.Linear(D, D, bias=False)  # before qkv_proj, as Phi-3 declares it
        self.qkv_proj = nn.Linear(D, 3 * D, bias=False)


class PhiMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(D, 2 * F, bias=False)
        self.down_proj = nn.Linear(F, D, bias=False)


class LlamaAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj = nn.Linear(D, D, bias=False)
        self.v_proj = nn.Linear(D, D, bias=False)
        self.o_proj = nn.Linear(D, D, bias=False)


class LlamaMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(D, F, bias=False)
        self.up_proj = nn.Linear(D, F, bias=False)
        self.down_proj = nn.Linear(F, D, bias=False)


class Layer(nn.Module):
    def __init__(self, attention: type, mlp: type) -> None:
        super().__init__()
        self.self_attn = attention()
        self.mlp = mlp()
        self.input_layernorm = nn.LayerNorm(D)
        self.post_attention_layernorm = nn.LayerNorm(D)


class Model(nn.Module):
    def __init__(self, attention: type, mlp: type) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList([Layer(attention, mlp) for _ in range(LAYERS)])
        self.norm = nn.LayerNorm(D)


def phi() -> Any:
    return Model(PhiAttention, PhiMLP)


def llama() -> Any:
    return Model(LlamaAttention, LlamaMLP)


RECIPE = """
version: 1
source: {path: SOURCE, top_level_key: model}
training_state: keep
ops:
  - split: {from: '(.+)\\.qkv_proj\\.weight', dim: 0, parts: 3,
            to: ['$1.q_proj.weight', '$1.k_proj.weight', '$1.v_proj.weight']}
  - split: {from: '(.+)\\.gate_up_proj\\.weight', dim: 0, parts: 2, to: ['$1.gate_proj.weight', '$1.up_proj.weight']}
target: {path: out.pt}
"""


def surgery(sd: dict[str, Any]) -> dict[str, Any]:
    """Phi-3-like names and layout -> Llama-like, with torch (any per-parameter tensors)."""
    out: dict[str, Any] = {}
    for name, value in sd.items():
        if name.endswith("qkv_proj.weight"):
            for part, v in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0), strict=True):
                out[name.replace("qkv_proj", part)] = v.contiguous()
        elif name.endswith("gate_up_proj.weight"):
            for part, v in zip(("gate_proj", "up_proj"), value.chunk(2, dim=0), strict=True):
                out[name.replace("gate_up_proj", part)] = v.contiguous()
        else:
            out[name] = value
    return out


def _groups(model: Any) -> list[dict[str, Any]]:
    """Two named groups (torch >= 2.6 saves param_names): weight decay on matrices only."""
    pairs = list(model.named_parameters())
    return [{"params": [(n, p) for n, p in pairs if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [(n, p) for n, p in pairs if p.dim() < 2], "weight_decay": 0.0}]


def _grads(model: Any, seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}


def _step(model: Any, opt: Any, grads: dict[str, Any]) -> None:
    for n, p in model.named_parameters():
        p.grad = grads[n].clone()
    opt.step()


def _moments(model: Any, opt: Any, key: str) -> dict[str, Any]:
    return {n: opt.state[p][key] for n, p in model.named_parameters()}


def doc_blocks() -> dict[str, str]:
    """The python blocks the page marks `<!-- tested: NAME -->`, by name."""
    text = DOC.read_text()
    found = dict(re.findall(r"<!-- tested: ([\w-]+) -->\n```python\n(.*?)```", text, flags=re.S))
    assert set(found) == {"resume-helper", "resume-torch", "resume-dcp"}, sorted(found)
    return found


def _trained(tmp_path: Path, dcp: bool) -> tuple[Any, Any]:
    """The original after two AdamW steps, saved as {"model", "optimizer"} (or a DCP folder)."""
    torch.manual_seed(0)
    old = phi()
    opt = torch.optim.AdamW(_groups(old), lr=1e-2, foreach=False)
    for seed in (1, 2):
        _step(old, opt, _grads(old, seed))
    if dcp:
        import torch.distributed.checkpoint as dist_cp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        dist_cp.save({"model": old.state_dict(), "optim": get_optimizer_state_dict(old, opt), "epoch": 2},
                     checkpoint_id=str(tmp_path / "ckpt"))
        source = "ckpt"
    else:
        torch.save({"model": old.state_dict(), "optimizer": opt.state_dict(), "epoch": 2}, tmp_path / "ckpt.pt")
        source = "ckpt.pt"
    (tmp_path / "recipe.yaml").write_text(RECIPE.replace("SOURCE", source))
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert "migrator.param_groups(" in said  # the note gives the by-name resume
    assert ("set_state_dict" in said) == dcp
    return old, opt


def _positional(new_model: Any) -> Any:
    """The optimizer the training code builds over the new model: its groups by named_parameters()."""
    return torch.optim.AdamW(_groups(new_model), lr=1e-2, foreach=False)


def _oracle(old: Any, opt: Any, grads: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The step on the original, then the surgery: parameters and moments the resumed step must give."""
    model, optimizer = copy.deepcopy(old), None
    optimizer = torch.optim.AdamW(_groups(model), lr=1e-2, foreach=False)
    optimizer.load_state_dict(copy.deepcopy(opt.state_dict()))
    _step(model, optimizer, grads)
    params = surgery({n: p.detach() for n, p in model.named_parameters()})
    return params, {k: surgery(_moments(model, optimizer, k)) for k in ("exp_avg", "exp_avg_sq")}


def _resumed(block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: Any = None) -> tuple[Any, Any]:
    import migrator

    monkeypatch.chdir(tmp_path)
    new_model = llama()
    scope: dict[str, Any] = {"new_model": new_model, "torch": torch, "migrator": migrator}
    if out is not None:
        scope["out"] = out
    exec(compile(block, str(DOC), "exec"), scope)
    opt = scope["opt"]
    for g in opt.param_groups:  # the docs build it without arguments: the saved ones came along
        assert g["lr"] == 1e-2 and g["foreach"] is False
    return new_model, opt


def _same(new_model: Any, opt: Any, want: tuple[dict[str, Any], dict[str, dict[str, Any]]]) -> None:
    params, moments = want
    for name, p in new_model.named_parameters():
        assert torch.equal(p.detach(), params[name]), name
    for key, expected in moments.items():
        for name, got in _moments(new_model, opt, key).items():
            assert torch.equal(got, expected[name]), (key, name)


def test_the_layouts_declare_the_recipes_order_differently() -> None:
    """What makes this layout a test: by position, o_proj and q_proj trade places."""
    recipe_order = list(surgery(dict(phi().named_parameters())))
    declared = [n for n, _ in llama().named_parameters()]
    assert sorted(recipe_order) == sorted(declared) and recipe_order != declared
    assert recipe_order.index("layers.0.self_attn.o_proj.weight") < recipe_order.index(
        "layers.0.self_attn.q_proj.weight")
    assert declared.index("layers.0.self_attn.o_proj.weight") > declared.index("layers.0.self_attn.q_proj.weight")


@pytest.mark.parametrize("name", ["resume-helper", "resume-torch"])
def test_the_documented_resume_equals_the_step_then_the_surgery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                name: str) -> None:
    old, opt = _trained(tmp_path, dcp=False)
    grads = _grads(old, 3)
    want = _oracle(old, opt, grads)
    blocks = doc_blocks()
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    # the torch-alone block continues the helper's (`out` and the model already loaded)
    new_model, new_opt = _resumed(blocks[name], tmp_path, monkeypatch, None if name == "resume-helper" else out)
    if name == "resume-torch":
        new_model.load_state_dict(out["model"])
    _step(new_model, new_opt, surgery(grads))
    _same(new_model, new_opt, want)
    # every kept group names its parameters; each group lists them as saved (o_proj before q_proj)
    groups = out["optimizer"]["param_groups"]
    assert [len(g["param_names"]) for g in groups] == [len(g["params"]) for g in groups]
    assert groups[0]["param_names"].index("layers.0.self_attn.o_proj.weight") < groups[0]["param_names"].index(
        "layers.0.self_attn.q_proj.weight")


def test_the_naive_resume_misassigns_on_this_layout(tmp_path: Path) -> None:
    """`AdamW(new_model.named_parameters())` + `load_state_dict` pairs ids by position: o_proj gets a
    neighbour's moments, silently. The docs do not show it; this proves the layout catches it."""
    old, opt = _trained(tmp_path, dcp=False)
    _, moments = _oracle(old, opt, _grads(old, 3))
    before = surgery(_moments(old, opt, "exp_avg"))
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    new_model = llama()
    new_model.load_state_dict(out["model"])
    pairs = list(new_model.named_parameters())
    naive = torch.optim.AdamW([{"params": [(n, p) for n, p in pairs if p.dim() >= 2]},
                               {"params": [(n, p) for n, p in pairs if p.dim() < 2]}], lr=1e-2)
    naive.load_state_dict(out["optimizer"])  # no error: the shapes agree
    got = _moments(new_model, naive, "exp_avg")
    attn = "layers.0.self_attn."
    assert not torch.equal(got[attn + "o_proj.weight"], before[attn + "o_proj.weight"])
    assert torch.equal(got[attn + "q_proj.weight"], before[attn + "o_proj.weight"])  # q takes o's, o takes v's
    assert torch.equal(got[attn + "o_proj.weight"], before[attn + "v_proj.weight"])
    assert moments  # the oracle ran


def test_the_documented_dcp_resume_equals_the_step_then_the_surgery(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch.distributed.checkpoint")
    old, opt = _trained(tmp_path, dcp=True)
    grads = _grads(old, 3)
    want = _oracle(old, opt, grads)
    new_model, new_opt = _resumed(doc_blocks()["resume-dcp"], tmp_path, monkeypatch)
    _step(new_model, new_opt, surgery(grads))
    _same(new_model, new_opt, want)
    wd = {n: g["weight_decay"] for g in new_opt.param_groups for n in g["param_names"]}
    assert wd["layers.0.self_attn.o_proj.weight"] == 0.1 and wd["norm.weight"] == 0.0


def test_param_groups_refuses_what_it_cannot_name() -> None:
    """No names, a name the model lacks, a name twice: a ValueError naming the group, never a guess."""
    import migrator

    model = nn.Sequential(nn.Linear(2, 2))
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match=r"param_groups\[0\] has no param_names"):
        migrator.param_groups(opt.state_dict(), model)
    saved = torch.optim.AdamW(model.named_parameters()).state_dict()
    saved["param_groups"][0]["param_names"][1] = "bias"
    with pytest.raises(ValueError, match=r"param_groups\[0\] names parameter 'bias', which the model has not "
                                         r"\(the model has 0\.bias\)"):
        migrator.param_groups(saved, model)
    saved["param_groups"][0]["param_names"][1] = "0.weight"
    with pytest.raises(ValueError, match=r"names parameter '0\.weight', which param_groups\[0\] names too"):
        migrator.param_groups(saved, model)
    with pytest.raises(ValueError, match="no param_groups list"):
        migrator.param_groups({"model": {}}, model)


def test_given_the_new_models_order_even_a_positional_resume_is_right(tmp_path: Path) -> None:
    """`target.param_order`: a state dict of the new model. The groups list their parameters, and ids are
    numbered, in its order: the optimizer the training code builds over the new model's
    named_parameters() loads by position and equals the step-then-surgery oracle."""
    torch.save(llama().state_dict(), tmp_path / "new.pt")
    torch.manual_seed(0)
    old = phi()
    opt = torch.optim.AdamW(_groups(old), lr=1e-2, foreach=False)
    for seed in (1, 2):
        _step(old, opt, _grads(old, seed))
    torch.save({"model": old.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "ckpt.pt")
    recipe = RECIPE.replace("SOURCE", "ckpt.pt").replace("target: {path: out.pt}",
                                                         "target: {path: out.pt, param_order: new.pt}")
    (tmp_path / "recipe.yaml").write_text(recipe)
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    grads = _grads(old, 3)
    want = _oracle(old, opt, grads)
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    new_model = llama()
    new_model.load_state_dict(out["model"])
    new_opt = _positional(new_model)
    new_opt.load_state_dict(out["optimizer"])
    _step(new_model, new_opt, surgery(grads))
    _same(new_model, new_opt, want)
    declared = [n for n, p in new_model.named_parameters() if p.dim() >= 2]
    assert out["optimizer"]["param_groups"][0]["param_names"] == declared
    assert out["optimizer"]["param_groups"][0]["params"] == list(range(len(declared)))
    assert list(out["optimizer"]["state"])[:len(declared)] == list(range(len(declared)))

    # an order that cannot be trusted is refused: SafeTensors sorts names; a file lacking a parameter
    pytest.importorskip("safetensors.torch").save_file(llama().state_dict(), tmp_path / "new.safetensors")
    sd = llama().state_dict()
    del sd["layers.1.mlp.up_proj.weight"]
    torch.save(sd, tmp_path / "part.pt")
    written = (tmp_path / "out.pt").read_bytes()
    for given, said in (("new.safetensors", "does not keep a model's order"),
                        ("part.pt", "target.param_order names no 'layers.1.mlp.up_proj.weight'")):
        (tmp_path / "recipe.yaml").write_text(recipe.replace("param_order: new.pt", f"param_order: {given}"))
        done = migrate_in_process("run", str(tmp_path / "recipe.yaml"), "--overwrite")
        assert done.returncode == 1 and said in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and (tmp_path / "out.pt").read_bytes() == written
