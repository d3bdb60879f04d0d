"""Training state follows the surgery (`training_state: keep`): the proof that training resumes.

A checkpoint after two optimizer steps goes through a recipe that renames, splits a fused qkv,
RoPE-permutes q and drops a tensor. Loading the output into the new model and a fresh optimizer and
taking one more step (with the gradients moved the same way) must equal, bit for bit, taking that
step on the original and applying the surgery afterwards. The surgery on the oracle side is written
here with torch, independently of migrator.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
nn = torch.nn

D, HEADS, VOCAB = 8, 2, 11  # head_dim 4


class Old(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.qkv = nn.Linear(D, 3 * D)
        self.out = nn.Linear(D, D, bias=False)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, 2)  # the recipe drops it


class New(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.q = nn.Linear(D, D)
        self.k = nn.Linear(D, D)
        self.v = nn.Linear(D, D)
        self.o = nn.Linear(D, D, bias=False)
        self.norm = nn.LayerNorm(D)


RECIPE = """
version: 1
source: {path: ckpt.pt, top_level_key: model}
training_state: keep
remap:
  - {from: '^embed\\.', to: 'tok.'}
  - {from: '^out\\.', to: 'o.'}
filter:
  exclude: [{regex: '^head\\.'}]
ops:
  - split: {from: 'qkv\\.(weight|bias)', dim: 0, parts: 3, to: ['q.$1', 'k.$1', 'v.$1']}
  - rope_permute: {from: 'q\\.(weight|bias)', heads: 2}
target: {path: out.pt}
"""


def _rope(w: Any) -> Any:
    """Hugging Face's Llama conversion permute, on a [out, in] weight or an [out] bias."""
    rows = w.shape[0]
    rest = tuple(w.shape[1:])
    return w.reshape(HEADS, rows // HEADS // 2, 2, *rest).transpose(1, 2).reshape(w.shape).contiguous()


def surgery(sd: dict[str, Any]) -> dict[str, Any]:
    """The recipe, written with torch: Old's names and layout -> New's (any per-parameter tensors)."""
    out: dict[str, Any] = {"tok.weight": sd["embed.weight"]}
    for kind in ("weight", "bias"):
        q, k, v = sd[f"qkv.{kind}"].chunk(3, dim=0)
        out[f"q.{kind}"], out[f"k.{kind}"], out[f"v.{kind}"] = _rope(q), k.contiguous(), v.contiguous()
    out["o.weight"] = sd["out.weight"]
    out["norm.weight"], out["norm.bias"] = sd["norm.weight"], sd["norm.bias"]
    return out


def _groups(model: Any, named: bool, order: list[str] | None = None) -> list[dict[str, Any]]:
    """With names (torch >= 2.6 saves them): two param groups, weight decay on matrices only. Without:
    one group, weight decay on everything (several unnamed groups are refused: see below)."""
    pairs = list(model.named_parameters())
    if order is not None:  # torch matches a loaded state to parameters by position: the output's order
        by_name = dict(pairs)
        pairs = [(n, by_name[n]) for n in order]
    if not named:
        return [{"params": [p for _, p in pairs], "weight_decay": 0.1}]
    pick = (lambda n, p: (n, p)) if named else (lambda n, p: p)
    return [{"params": [pick(n, p) for n, p in pairs if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [pick(n, p) for n, p in pairs if p.dim() < 2], "weight_decay": 0.0}]


def _optimizer(kind: str, model: Any, named: bool, order: list[str] | None = None) -> Any:
    if kind == "adamw":
        return torch.optim.AdamW(_groups(model, named, order), lr=1e-2, foreach=False)
    return torch.optim.SGD(_groups(model, named, order), lr=1e-2, momentum=0.9, foreach=False)


def _grads(model: Any, seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}


def _step(model: Any, opt: Any, grads: dict[str, Any]) -> None:
    for n, p in model.named_parameters():
        p.grad = grads[n].clone()
    opt.step()


def _per_param(model: Any, opt: Any, key: str) -> dict[str, Any]:
    return {n: opt.state[p][key] for n, p in model.named_parameters()}


def _trained(tmp_path: Path, kind: str, named: bool) -> tuple[Any, Any, dict[str, Any]]:
    torch.manual_seed(0)
    old = Old()
    opt = _optimizer(kind, old, named)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for seed in (1, 2):
        _step(old, opt, _grads(old, seed))
        sched.step()
    ckpt = {"model": old.state_dict(), "optimizer": opt.state_dict(), "lr_scheduler": sched.state_dict(),
            "epoch": 2, "rng": torch.get_rng_state()}
    torch.save(ckpt, tmp_path / "ckpt.pt")
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    return old, opt, ckpt


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("named", [False, True], ids=["order", "param_names"])
def test_a_resumed_step_equals_the_step_then_the_surgery(tmp_path: Path, kind: str, named: bool) -> None:
    old, _, ckpt = _trained(tmp_path, kind, named)
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    rule = "param_names" if named else "parameter order"
    assert rule in done.stdout + done.stderr

    # the oracle: one more step on the original, then the surgery
    grads = _grads(old, 3)
    ref_model, ref_opt = copy.deepcopy(old), None
    ref_opt = _optimizer(kind, ref_model, named)
    ref_opt.load_state_dict(copy.deepcopy(ckpt["optimizer"]))
    _step(ref_model, ref_opt, grads)

    # ours: the output loaded into the new model and a fresh optimizer, the step with moved gradients
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert sorted(out) == sorted(ckpt)
    new = New()
    new.load_state_dict(out["model"])
    new_opt = _optimizer(kind, new, named, order=None if named else list(out["model"]))
    new_opt.load_state_dict(out["optimizer"])
    _step(new, new_opt, surgery(grads))

    want = surgery(dict(ref_model.named_parameters()))
    for name, p in new.named_parameters():
        assert torch.equal(p.detach(), want[name].detach()), name
    state_keys = ["exp_avg", "exp_avg_sq"] if kind == "adamw" else ["momentum_buffer"]
    for key in state_keys:
        want_state = surgery(_per_param(ref_model, ref_opt, key))
        got_state = _per_param(new, new_opt, key)
        for name in want_state:
            assert torch.equal(got_state[name], want_state[name]), (key, name)
            assert got_state[name].dtype == torch.float32
    if kind == "adamw":
        assert all(float(s["step"]) == 3.0 for s in new_opt.state.values())
    # hyperparameters, the scheduler and everything else as they were
    for g_new, g_old in zip(out["optimizer"]["param_groups"], ckpt["optimizer"]["param_groups"], strict=True):
        assert {k: v for k, v in g_new.items() if k not in ("params", "param_names")} == {
            k: v for k, v in g_old.items() if k not in ("params", "param_names")}
    assert out["lr_scheduler"] == ckpt["lr_scheduler"]
    assert out["epoch"] == 2
    assert torch.equal(out["rng"], ckpt["rng"])
    if named:
        assert len(out["optimizer"]["param_groups"]) == 2
        names = [n for n, _ in new.named_parameters()]
        matrices = [n for n, p in new.named_parameters() if p.dim() >= 2]
        assert [g["param_names"] for g in out["optimizer"]["param_groups"]] == [
            matrices, [n for n in names if n not in matrices]]


# ---------------------------------------------------------------------------------------------------
# which state belongs to which tensor, and what cannot follow: refused, one line, nothing written


def _write(tmp_path: Path, recipe: str, ckpt: dict[str, Any]) -> None:
    torch.save(ckpt, tmp_path / "ckpt.pt")
    (tmp_path / "recipe.yaml").write_text(recipe)


def _refused(tmp_path: Path, *extra: str) -> str:
    (tmp_path / "out.pt").write_bytes(b"keep me")
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"), "--overwrite", *extra)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "out.pt").read_bytes() == b"keep me"
    errors = [line for line in done.stderr.splitlines() if line.startswith(("error:", "migrate: error:"))]
    assert len(errors) == 1, done.stderr
    return errors[0]


def _two_steps(model: Any, opt: Any) -> None:
    for seed in (1, 2):
        _step(model, opt, _grads(model, seed))


def test_several_unnamed_param_groups_are_refused_with_a_hint(tmp_path: Path) -> None:
    torch.manual_seed(0)
    old = Old()
    pairs = list(old.named_parameters())
    opt = torch.optim.AdamW([{"params": [p for n, p in pairs if p.dim() >= 2]},
                             {"params": [p for n, p in pairs if p.dim() < 2], "weight_decay": 0.0}])
    _two_steps(old, opt)
    _write(tmp_path, RECIPE, {"model": old.state_dict(), "optimizer": opt.state_dict()})
    error = _refused(tmp_path)
    assert "2 param groups and no parameter names" in error and "named_parameters" in error


def test_counts_that_disagree_are_refused(tmp_path: Path) -> None:
    """One unnamed group over part of the model: the order rule needs the counts to agree exactly."""
    torch.manual_seed(0)
    old = Old()
    opt = torch.optim.SGD([p for n, p in old.named_parameters() if not n.startswith("norm")], lr=0.1, momentum=0.9)
    _two_steps(old, opt)
    _write(tmp_path, RECIPE, {"model": old.state_dict(), "optimizer": opt.state_dict()})
    assert "6 parameters and no names, the model has 8 tensors" in _refused(tmp_path)


@pytest.mark.parametrize("change", ["shorter", "longer"])
def test_param_names_that_do_not_pair_with_params_are_refused(tmp_path: Path, change: str) -> None:
    """Names that do not pair one to one with the ids say nothing certain: refused, never the model's order."""
    torch.manual_seed(0)
    old = Old()
    opt = _optimizer("adamw", old, named=True)
    _two_steps(old, opt)
    saved = opt.state_dict()
    names = saved["param_groups"][1]["param_names"]
    saved["param_groups"][1]["param_names"] = names[:-1] if change == "shorter" else [*names, "head.extra"]
    _write(tmp_path, RECIPE, {"model": old.state_dict(), "optimizer": saved})
    error = _refused(tmp_path)
    told = len(names) - 1 if change == "shorter" else len(names) + 1
    assert f"optimizer.param_groups[1] lists {len(names)} params but {told} param_names" in error


def test_param_names_that_contradict_the_moments_are_refused(tmp_path: Path) -> None:
    """Two names swapped in a group: each id's exp_avg is shaped like the other parameter. Following the
    names would give each the other's moments; refused, naming the group."""
    torch.manual_seed(0)
    old = Old()
    opt = _optimizer("adamw", old, named=True)
    _two_steps(old, opt)
    saved = opt.state_dict()
    names = saved["param_groups"][0]["param_names"]  # the matrices: embed [11, 8], qkv [24, 8], out, head
    names[0], names[1] = names[1], names[0]
    _write(tmp_path, RECIPE, {"model": old.state_dict(), "optimizer": saved})
    error = _refused(tmp_path)
    assert "optimizer.param_groups[0] gives id 0 to 'qkv.weight' (shape [24, 8]) by param_names in param_groups, " \
           "but its 'exp_avg' has shape [11, 8]" in error


@pytest.mark.parametrize(("kind", "key"), [("sgd", "momentum_buffer"), ("rprop", "prev"), ("adagrad", "sum")])
def test_any_per_element_state_of_another_shape_is_refused(tmp_path: Path, kind: str, key: str) -> None:
    """Whatever the optimizer, a state torch keeps per element must have its parameter's shape."""
    torch.manual_seed(0)
    old = Old()
    params = [(n, p) for n, p in old.named_parameters()]
    make = {"sgd": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9),
            "rprop": lambda: torch.optim.Rprop(params, lr=0.1), "adagrad": lambda: torch.optim.Adagrad(params, lr=0.1)}
    opt = make[kind]()
    _two_steps(old, opt)
    saved = opt.state_dict()
    first = saved["param_groups"][0]["params"][0]
    saved["state"][first][key] = saved["state"][first][key][:-1]  # one row short
    _write(tmp_path, RECIPE, {"model": old.state_dict(), "optimizer": saved})
    error = _refused(tmp_path)
    assert "optimizer.param_groups[0] gives id 0 to 'embed.weight' (shape [11, 8])" in error
    assert f"its '{key}' has shape [10, 8]" in error


def test_a_concat_of_parameters_in_different_groups_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    old = Old()
    opt = _optimizer("adamw", old, named=True)
    _two_steps(old, opt)
    recipe = RECIPE.split("ops:")[0] + """ops:
  - concat: {from: ['qkv\\.weight', 'qkv.bias'], dim: 1, to: 'qkv.joined'}
  - reshape: {from: 'qkv\\.bias', shape: [-1, 1]}
target: {path: out.pt}
"""
    recipe = recipe.replace("""  - concat: {from: ['qkv\\.weight', 'qkv.bias'], dim: 1, to: 'qkv.joined'}
  - reshape: {from: 'qkv\\.bias', shape: [-1, 1]}
""", """  - reshape: {from: 'qkv\\.bias', shape: [-1, 1]}
  - concat: {from: ['qkv\\.weight', 'qkv.bias'], dim: 1, to: 'qkv.joined'}
""")
    _write(tmp_path, recipe, {"model": old.state_dict(), "optimizer": opt.state_dict()})
    error = _refused(tmp_path)
    assert "'qkv.joined' joins parameters of different param_groups" in error


def test_a_concat_of_steps_that_differ_is_refused(tmp_path: Path) -> None:
    """A concat's inputs must agree on their scalar state: one parameter has one step."""
    torch.manual_seed(0)
    old = Old()
    opt = torch.optim.AdamW([(n, p) for n, p in old.named_parameters()], lr=1e-2)
    _two_steps(old, opt)
    opt.state[old.out.weight]["step"] += 1  # as if `out` had had one more step
    recipe = """
version: 1
source: {path: ckpt.pt, top_level_key: model}
training_state: keep
ops:
  - concat: {from: ['qkv\\.weight', 'out.weight'], dim: 0, to: 'qkvo.weight'}
target: {path: out.pt}
"""
    _write(tmp_path, recipe, {"model": old.state_dict(), "optimizer": opt.state_dict()})
    error = _refused(tmp_path)
    assert "'qkvo.weight' joins parameters whose optimizer state 'step' differs" in error


def test_a_concat_in_one_group_follows(tmp_path: Path) -> None:
    """q, k, v back into one fused tensor: the moments are concatenated the same way, steps agree."""
    torch.manual_seed(0)
    new = New()
    opt = torch.optim.AdamW([(n, p) for n, p in new.named_parameters()], lr=1e-2, foreach=False)
    _two_steps(new, opt)
    recipe = """
version: 1
source: {path: ckpt.pt, top_level_key: model}
training_state: keep
ops:
  - concat: {from: ['q\\.(weight|bias)', 'k.$1', 'v.$1'], dim: 0, to: 'qkv.$1'}
  - permute: {from: 'o\\.weight', dims: [1, 0]}
target: {path: out.pt}
"""
    _write(tmp_path, recipe, {"model": new.state_dict(), "optimizer": opt.state_dict()})
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    names = out["optimizer"]["param_groups"][0]["param_names"]
    assert names == list(out["model"])
    by_name = {n: out["optimizer"]["state"][i] for n, i in zip(names, out["optimizer"]["param_groups"][0]["params"],
                                                               strict=True)}
    for key in ("exp_avg", "exp_avg_sq"):
        old = {n: opt.state[p][key] for n, p in new.named_parameters()}
        assert torch.equal(by_name["qkv.weight"][key], torch.cat([old["q.weight"], old["k.weight"], old["v.weight"]]))
        assert torch.equal(by_name["qkv.bias"][key], torch.cat([old["q.bias"], old["k.bias"], old["v.bias"]]))
        assert torch.equal(by_name["o.weight"][key], old["o.weight"].t())
    assert float(by_name["qkv.weight"]["step"]) == 2.0


def test_a_computed_op_drops_the_optimizer_with_a_note(tmp_path: Path) -> None:
    torch.manual_seed(0)
    old = Old()
    opt = _optimizer("adamw", old, named=True)
    _two_steps(old, opt)
    recipe = """
version: 1
source: {path: ckpt.pt, top_level_key: model}
training_state: keep
ops:
  - linear: {from: ['norm\\.weight', 'norm.bias'], to: 'norm.weight', weights: [0.5, 0.5]}
target: {path: out.pt}
"""
    _write(tmp_path, recipe, {"model": old.state_dict(), "optimizer": opt.state_dict(), "epoch": 2})
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "optimizer state dropped (optimizer): computed ops (linear)" in done.stderr + done.stdout
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert sorted(out) == ["epoch", "model"]


def test_keep_into_a_flat_format_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    old = Old()
    opt = _optimizer("adamw", old, named=True)
    _two_steps(old, opt)
    _write(tmp_path, RECIPE.replace("out.pt", "out.safetensors"), {"model": old.state_dict(),
                                                                   "optimizer": opt.state_dict()})
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"))
    assert done.returncode == 1
    said = "training_state: keep writes the whole checkpoint as PyTorch (.pt); this target is safetensors"
    assert said in done.stderr
    assert not (tmp_path / "out.safetensors").exists()


def test_the_defaults_and_the_command_line(tmp_path: Path) -> None:
    """top_level_key alone selects the model (drop, as before); --training-state keep keeps the rest;
    a whole .pt -> .pt run keeps it by default, and its state follows the rename."""
    torch.manual_seed(0)
    old = Old()
    opt = _optimizer("sgd", old, named=True)
    _two_steps(old, opt)
    _write(tmp_path, RECIPE.replace("training_state: keep\n", ""), {"model": old.state_dict(),
                                                                     "optimizer": opt.state_dict(), "epoch": 2})
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"))
    assert done.returncode == 0, done.stderr
    assert sorted(torch.load(tmp_path / "out.pt", weights_only=True)) == sorted(New().state_dict())
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"), "--training-state", "keep", "--overwrite",
                              "--json")
    assert done.returncode == 0, done.stderr
    assert sorted(torch.load(tmp_path / "out.pt", weights_only=True)) == ["epoch", "model", "optimizer"]
    import json

    fates = json.loads(done.stdout)["report"]["optimizer"]
    assert {(f["param"], f["state"], f["fate"]) for f in fates} >= {
        ("q.weight", "momentum_buffer", "followed"), ("head.weight", "momentum_buffer", "dropped")}
    # each followed moment names the state it comes from: qkv.weight's id, as torch numbered it
    ids = {n: i for g in opt.state_dict()["param_groups"] for n, i in zip(g["param_names"], g["params"], strict=True)}
    came = {(f["param"], f["state"]): f["from"] for f in fates}
    assert came[("k.weight", "momentum_buffer")] == f"optimizer.state.{ids['qkv.weight']}.momentum_buffer"
    assert came[("tok.weight", "momentum_buffer")] == f"optimizer.state.{ids['embed.weight']}.momentum_buffer"

    # the HTML report lists the same fates
    done = migrate_in_process("plan", str(tmp_path / "recipe.yaml"), "--training-state", "keep", "--overwrite",
                              "--html", str(tmp_path / "plan.html"))
    assert done.returncode == 0, done.stderr
    from tests.analysis.test_html_report import _payload

    lists = {x["key"]: x for x in _payload((tmp_path / "plan.html").read_bytes())["lists"]}
    texts = [item[0] for item in lists["optimizer"]["items"]]
    assert len(texts) == len(fates)
    assert (f"k.weight.momentum_buffer: followed optimizer.state.{ids['qkv.weight']}.momentum_buffer -> "
            f"optimizer.state.2.momentum_buffer") in texts

    done = migrate_in_process("convert", str(tmp_path / "ckpt.pt"), str(tmp_path / "whole.pt"),
                              "--remap", "^model\\.embed\\.=model.tok.")
    assert done.returncode == 0, done.stderr
    out = torch.load(tmp_path / "whole.pt", weights_only=True)
    assert out["optimizer"]["param_groups"][0]["param_names"][0] == "tok.weight"
    done = migrate_in_process("convert", str(tmp_path / "ckpt.pt"), str(tmp_path / "flat.pt"),
                              "--training-state", "drop", "--overwrite")
    assert done.returncode == 0, done.stderr
    assert sorted(torch.load(tmp_path / "flat.pt", weights_only=True)) == ["epoch", "model"]


def test_moments_keep_their_dtype_under_a_cast(tmp_path: Path) -> None:
    torch.manual_seed(0)
    old = Old()
    opt = _optimizer("adamw", old, named=True)
    _two_steps(old, opt)
    _write(tmp_path, RECIPE.replace("target:", "dtype: {cast: BF16}\ntarget:"),
           {"model": old.state_dict(), "optimizer": opt.state_dict()})
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert {t.dtype for t in out["model"].values()} == {torch.bfloat16}
    assert {s["exp_avg"].dtype for s in out["optimizer"]["state"].values()} == {torch.float32}
    assert {s["step"].dtype for s in out["optimizer"]["state"].values()} == {torch.float32}


# ---------------------------------------------------------------------------------------------------
# a DCP checkpoint (get_optimizer_state_dict: state keyed by parameter names)


def test_a_dcp_checkpoint_resumes_after_the_surgery(tmp_path: Path) -> None:
    """The proof again, from a torch.distributed.checkpoint folder (one process: DCP needs no process
    group to save), loaded back with torch's own set_optimizer_state_dict."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    torch.manual_seed(0)
    old = Old()
    opt = _optimizer("adamw", old, named=False)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for seed in (1, 2):
        _step(old, opt, _grads(old, seed))
        sched.step()
    saved_optim = get_optimizer_state_dict(old, opt)
    dcp.save({"model": old.state_dict(), "optim": saved_optim, "epoch": 2}, checkpoint_id=str(tmp_path / "ckpt"))
    recipe = RECIPE.replace("path: ckpt.pt, top_level_key: model", "path: ckpt, top_level_key: model")
    (tmp_path / "recipe.yaml").write_text(recipe)
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "name keys" in done.stdout + done.stderr

    grads = _grads(old, 3)
    _step(old, opt, grads)  # the oracle: the step on the original, then the surgery

    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert out["epoch"] == 2 and sorted(out) == ["epoch", "model", "optim"]
    new = New()
    new.load_state_dict(out["model"])
    new_opt = torch.optim.AdamW(new.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    set_optimizer_state_dict(new, new_opt, out["optim"])  # matched by names, not by position
    _step(new, new_opt, surgery(grads))
    want = surgery(dict(old.named_parameters()))
    for name, p in new.named_parameters():
        assert torch.equal(p.detach(), want[name].detach()), name
    want_sq = surgery(_per_param(old, opt, "exp_avg_sq"))
    for name, sq in _per_param(new, new_opt, "exp_avg_sq").items():
        assert torch.equal(sq, want_sq[name]), name


@pytest.mark.parametrize(("option", "said"), [
    (("--exclude", r"exp_avg_sq$"), "the filter leaves out the optimizer's own tensor 'optimizer.state.0.exp_avg_sq'"),
    (("--remap", r"^optimizer\.=opt."), "a remap renames the optimizer's own tensor 'optimizer.state.0.step'"),
])
def test_patterns_that_touch_the_optimizer_of_a_whole_checkpoint_are_refused(tmp_path: Path, option: tuple[str, str],
                                                                             said: str) -> None:
    """Half an optimizer (some moments filtered out) would resume wrongly: refused, with the way to drop it."""
    torch.manual_seed(0)
    old = Old()
    opt = _optimizer("adamw", old, named=True)
    _two_steps(old, opt)
    torch.save({"model": old.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "ckpt.pt")
    (tmp_path / "out.pt").write_bytes(b"keep me")
    done = migrate_in_process("convert", str(tmp_path / "ckpt.pt"), str(tmp_path / "out.pt"), *option, "--overwrite")
    assert done.returncode == 1, done.stderr
    assert said in done.stderr and "training_state: drop" in done.stderr and "Traceback" not in done.stderr
    assert (tmp_path / "out.pt").read_bytes() == b"keep me"


# ---------------------------------------------------------------------------------------------------
# Burn: the training state of a burnpack is its param_ids


def test_a_burnpack_keeps_its_param_ids_through_renames(tmp_path: Path) -> None:
    import numpy as np

    from migrator import from_numpy, open_file, save
    from migrator.core.scalars import Scalar

    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    save([from_numpy("enc.w", w, param_id=41), from_numpy("enc.qkv", np.ones((6, 3), np.float32), param_id=42)],
         tmp_path / "s.bpk", scalars={"epoch": Scalar("Int", 3)})
    (tmp_path / "r.yaml").write_text("""
version: 1
source: {path: s.bpk}
training_state: keep
remap: [{from: '^enc\\.', to: 'encoder.'}]
ops:
  - split: {from: 'encoder\\.qkv', dim: 0, parts: 3, to: ['encoder.q', 'encoder.k', 'encoder.v']}
target: {path: o.bpk}
""")
    done = migrate_in_process("run", str(tmp_path / "r.yaml"))
    assert done.returncode == 0, done.stderr
    assert "every tensor keeps its param_id through renames" in done.stdout + done.stderr
    with open_file(tmp_path / "o.bpk") as o:
        assert o["encoder.w"].param_id == 41 and o.scalars == {"epoch": Scalar("Int", 3)}
        assert [o[n].param_id for n in ("encoder.q", "encoder.k", "encoder.v")] == [None, None, None]


def test_a_torch_optimizer_into_burnpack_follows_the_surgery_into_burns_record(tmp_path: Path) -> None:
    """The surgery above (renames, a split qkv, RoPE-permuted q, a dropped head) into a .bpk: each moment
    in Burn's OptimizerRecord beside the model equals the torch-written surgery of torch's moment, under
    the param_id its parameter has in the model file. Burn's record layout itself (names, scalars,
    metadata, bytes) is checked in tests/plan/test_burn_optimizer.py."""
    import numpy as np

    from migrator import open_file
    from migrator.core.scalars import Scalar

    torch.manual_seed(0)
    old = Old()
    opt = _optimizer("adamw", old, named=True)
    _two_steps(old, opt)
    _write(tmp_path, RECIPE.replace("out.pt", "out.bpk"), {"model": old.state_dict(), "optimizer": opt.state_dict()})
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"))
    assert done.returncode == 0, done.stderr
    assert "and Burn's optimizer record" in done.stdout
    with open_file(tmp_path / "out.bpk") as model, open_file(tmp_path / "out-optim.bpk") as record:
        ids = {t.name: t.param_id for t in model.tensors}
        assert set(ids) == set(surgery(old.state_dict()))
        for key, field in (("exp_avg", "moment_1"), ("exp_avg_sq", "moment_2")):
            for name, want in surgery(_per_param(old, opt, key)).items():
                got = record[f"{ids[name]}.momentum.{field}"]
                assert got.param_id == ids[name]
                assert np.array_equal(got.numpy(), want.numpy()), (name, key)
        for name, pid in ids.items():
            assert record.metadata[str(pid)] == name
            assert record.scalars[f"{pid}.momentum.time"] == Scalar("UInt", 2)


# ---------------------------------------------------------------------------------------------------
# a Lightning checkpoint: the model under state_dict, the optimizer in a list


def test_a_lightning_checkpoint_follows_in_optimizer_states(tmp_path: Path) -> None:
    """Lightning saves `{"state_dict", "optimizer_states": [...], "lr_schedulers": [...], "epoch",
    "global_step", ...}`; its optimizer is built from `parameters()` (no names): the order rule."""
    torch.manual_seed(0)
    old = Old()
    opt = _optimizer("adamw", old, named=False)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    _two_steps(old, opt)
    ckpt = {"epoch": 1, "global_step": 2, "pytorch-lightning_version": "2.5.0", "state_dict": old.state_dict(),
            "loops": {"fit_loop": {"epoch_progress": {"current": {"completed": 1}}}},
            "optimizer_states": [opt.state_dict()], "lr_schedulers": [sched.state_dict()]}
    _write(tmp_path, RECIPE.replace("top_level_key: model", "top_level_key: state_dict"), ckpt)
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "optimizer 'optimizer_states.0': state matched to parameters by parameter order" in done.stdout + done.stderr

    grads = _grads(old, 3)
    _step(old, opt, grads)
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert list(out) == list(ckpt)
    assert out["loops"] == ckpt["loops"] and out["lr_schedulers"] == ckpt["lr_schedulers"]
    new = New()
    new.load_state_dict(out["state_dict"])
    new_opt = _optimizer("adamw", new, named=False, order=list(out["state_dict"]))
    new_opt.load_state_dict(out["optimizer_states"][0])
    _step(new, new_opt, surgery(grads))
    want = surgery(dict(old.named_parameters()))
    for name, p in new.named_parameters():
        assert torch.equal(p.detach(), want[name].detach()), name
    want_sq = surgery(_per_param(old, opt, "exp_avg_sq"))
    for name, got in _per_param(new, new_opt, "exp_avg_sq").items():
        assert torch.equal(got, want_sq[name]), name


# ---------------------------------------------------------------------------------------------------
# factored state (Adafactor): follows renamed parameters, refused through a layout op


class Renamed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.qkv = nn.Linear(D, 3 * D)
        self.o = nn.Linear(D, D, bias=False)
        self.norm = nn.LayerNorm(D)


def test_adafactor_follows_a_rename_and_resumes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    old = Old()
    opt = torch.optim.Adafactor(_groups(old, True), lr=1e-2, foreach=False)
    _two_steps(old, opt)
    assert opt.state[old.qkv.weight]["row_var"].shape == (3 * D, 1)  # factored: not the parameter's shape
    renames = RECIPE.split("ops:")[0] + "target: {path: out.pt}\n"
    _write(tmp_path, renames, {"model": old.state_dict(), "optimizer": opt.state_dict()})
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr

    def moved(sd: dict[str, Any]) -> dict[str, Any]:
        names = {"embed.": "tok.", "out.": "o."}
        return {next((names[p] + n[len(p):] for p in names if n.startswith(p)), n): v for n, v in sd.items()
                if not n.startswith("head.")}

    grads = _grads(old, 3)
    _step(old, opt, grads)
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    new = Renamed()
    new.load_state_dict(out["model"])
    new_opt = torch.optim.Adafactor(_groups(new, True), lr=1e-2, foreach=False)
    new_opt.load_state_dict(out["optimizer"])
    _step(new, new_opt, moved(grads))
    want = moved(dict(old.named_parameters()))
    for name, p in new.named_parameters():
        assert torch.equal(p.detach(), want[name].detach()), name
        for key in ("row_var", "col_var"):
            if key in new_opt.state[p]:
                assert torch.equal(new_opt.state[p][key], opt.state[want[name]][key]), (name, key)

    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"), "--overwrite")  # sanity: it ran twice
    assert done.returncode == 0
    (tmp_path / "recipe.yaml").write_text(RECIPE)  # now a split of the fused qkv: refused, named
    said = _refused(tmp_path)
    assert "row_var" in said and "split" in said and "follows only a renamed or cast parameter" in said
