"""Issue 25 item 9: a PyTorch -> PyTorch run keeps a training checkpoint's structure.

The oracle is torch: the output loads with `torch.load(weights_only=True)` into the same containers
(dict, OrderedDict, list, tuple, int keys), the model loads strictly under its new names, AdamW loads
its state and takes one more step bit-equal to the original's. Other targets stay flat.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
nn = torch.nn

REMAP = ("--remap", r"^model\.0\.=model.inp.", "--remap", r"^model\.2\.=model.out.")


def _model(named: bool = False) -> Any:
    if named:  # the module the renamed checkpoint is for
        return nn.Sequential(OrderedDict([("inp", nn.Linear(4, 8)), ("act", nn.ReLU()), ("out", nn.Linear(8, 3))]))
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _batch(seed: int) -> Any:
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(seed))


def _step(model: Any, opt: Any, seed: int) -> None:
    opt.zero_grad()
    model(_batch(seed)).pow(2).sum().backward()
    opt.step()


def _training_checkpoint(path: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    for seed in range(3):
        _step(model, opt, seed)
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3, "step": 120,
            "args": {"name": "run-1", "lr": 1e-2, "warmup": None, "betas": [0.9, 0.999], "seed": 0,
                     "schedule": ("cosine", 0.1), "amp": False}}
    torch.save(ckpt, path)
    return ckpt


def _skeleton(v: Any, rename: dict[str, str] | None = None) -> Any:
    """The structure with exact container types and key types; tensors as (dtype, shape); floats by bits."""
    rename = rename or {}
    if isinstance(v, torch.Tensor):
        return ("tensor", str(v.dtype), tuple(v.shape))
    if isinstance(v, dict):
        return (type(v).__name__, [(type(k).__name__, rename.get(k, k), _skeleton(x)) for k, x in v.items()])
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [_skeleton(x) for x in v])
    if isinstance(v, float):
        return ("float", "nan" if math.isnan(v) else v.hex())
    return (type(v).__name__, v)


def _tensors(v: Any, base: str = "") -> dict[str, Any]:
    """Every tensor by its path, as migrator names them (dict keys and list indices joined by dots)."""
    out: dict[str, Any] = {}
    pairs = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, (list, tuple)) else ()
    for k, x in pairs:
        name = f"{base}.{k}" if base else str(k)
        if isinstance(x, torch.Tensor):
            out[name] = x
        else:
            out.update(_tensors(x, name))
    return out


def _bit_equal(a: Any, b: Any) -> bool:
    raw = [x.contiguous().reshape(-1).view(torch.uint8) for x in (a, b)]
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(*raw)


def test_training_checkpoint_pt_to_pt_keeps_structure_and_optimizer(tmp_path: Path) -> None:
    src, dst = tmp_path / "train.pt", tmp_path / "renamed.pt"
    original = _training_checkpoint(src)
    r = migrate_in_process("convert", str(src), str(dst), *REMAP, "--json")
    assert r.returncode == 0, r.stderr
    out = torch.load(dst, weights_only=True)

    names = {"0.weight": "inp.weight", "0.bias": "inp.bias", "2.weight": "out.weight", "2.bias": "out.bias"}
    # torch saved no names (built from parameters()): the output's group names its parameters, first, as
    # torch's own state_dict puts them
    groups = [{"param_names": list(names.values()), **g} for g in original["optimizer"]["param_groups"]]
    assert _skeleton(out) == _skeleton({**original, "model": OrderedDict(
        (names[k], v) for k, v in original["model"].items()), "optimizer": {**original["optimizer"],
                                                                           "param_groups": groups}})
    assert isinstance(out["model"], OrderedDict) and list(out["optimizer"]["state"]) == [0, 1, 2, 3]
    assert out["optimizer"]["param_groups"] == groups
    assert (out["epoch"], out["step"], out["args"]) == (3, 120, original["args"])
    theirs = _tensors(original)
    ours = _tensors(out)
    assert len(ours) == len(theirs) == 16
    for name, t in theirs.items():
        renamed = name if not name.startswith("model.") else "model." + names[name[len("model."):]]
        assert _bit_equal(ours[renamed], t), name

    # the renamed model loads strictly; AdamW resumes and its next step equals the original's bit for bit
    model, ref_model = _model(named=True), _model()
    model.load_state_dict(out["model"], strict=True)
    ref_model.load_state_dict(original["model"], strict=True)
    opt = torch.optim.AdamW(model.parameters(), lr=0.5)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=0.5)
    opt.load_state_dict(out["optimizer"])
    ref_opt.load_state_dict(original["optimizer"])
    _step(model, opt, 7)
    _step(ref_model, ref_opt, 7)
    for (_, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters(), strict=True):
        assert _bit_equal(p.detach(), q.detach())

    notes = json.loads(r.stdout)["notes"]
    kept = [n for n in notes if n.startswith("kept ")]
    assert kept and "epoch" in kept[0] and "optimizer.param_groups" in kept[0] and "args.warmup" in kept[0]
    assert not any("scalars not written" in n for n in notes)


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_tuples_nested_lists_and_plain_values_round_trip(tmp_path: Path, zip_format: bool) -> None:
    torch.manual_seed(1)
    w = torch.randn(3, 2)
    tied = torch.randn(4)
    deep: Any = {"leaf": torch.arange(6, dtype=torch.int64)}
    for i in range(60):
        deep = [i, deep] if i % 2 else (deep,)
    ckpt = {
        "model": nn.Linear(2, 3).state_dict(),
        "pairs": (w, (tied, [tied, 1.5, None]), "x", ()),
        "nested": [[1, 2], [3, [4, {"deep": torch.ones(2, dtype=torch.bfloat16)}]], []],
        "flags": {"on": True, "off": False, "neg": -5, "big": 2**40, "huge": 2**63 + 7, "low": -(2**63),
                  "nan": float("nan"), "zero": -0.0, "inf": float("-inf"), "text": "naïve ✓", "empty": {}},
        "ids": {0: torch.zeros(1), 7: {"k": 1}},
        "many": {f"k{i}": i for i in range(2500)},
        "long": list(range(2100)),
        "deep": deep,
    }
    src, dst = tmp_path / "misc.pt", tmp_path / "copy.pt"
    torch.save(ckpt, src, _use_new_zipfile_serialization=zip_format)
    r = migrate_in_process("convert", str(src), str(dst))
    assert r.returncode == 0, r.stderr
    out = torch.load(dst, weights_only=True)
    assert _skeleton(out) == _skeleton(ckpt)
    assert out["model"]._metadata == ckpt["model"]._metadata  # module versions kept when nothing is renamed
    for name, t in _tensors(ckpt).items():
        assert _bit_equal(_tensors(out)[name], t), name
    # one storage stays one storage (tied), as torch.load of the source gives it
    assert out["pairs"][1][0].untyped_storage().data_ptr() == out["pairs"][1][1][0].untyped_storage().data_ptr()


def test_pt_to_safetensors_stays_flat(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    src, dst = tmp_path / "train.pt", tmp_path / "model.safetensors"
    original = _training_checkpoint(src)
    r = migrate_in_process("convert", str(src), str(dst), *REMAP, "--json")
    assert r.returncode == 0, r.stderr
    flat = load_file(dst)
    theirs = _tensors(original)
    names = {"model.0.": "model.inp.", "model.2.": "model.out."}
    expected = {next((n.replace(a, b, 1) for a, b in names.items() if n.startswith(a)), n): t
                for n, t in theirs.items()}
    assert sorted(flat) == sorted(expected)
    assert all(_bit_equal(flat[n], t) for n, t in expected.items())
    notes = json.loads(r.stdout)["notes"]
    assert any("source scalars not written: safetensors has no typed scalars" in n for n in notes)
    assert not any(n.startswith("kept ") for n in notes)


def test_top_level_key_writes_a_flat_state_dict(tmp_path: Path) -> None:
    src, dst = tmp_path / "train.pt", tmp_path / "model.pt"
    original = _training_checkpoint(src)
    r = migrate_in_process("convert", str(src), str(dst), "--top-level-key", "model", "--remap", r"^0\.=inp.",
                           "--remap", r"^2\.=out.")
    assert r.returncode == 0, r.stderr
    sd = torch.load(dst, weights_only=True)
    assert list(sd) == ["inp.weight", "inp.bias", "out.weight", "out.bias"]
    _model(named=True).load_state_dict(sd, strict=True)
    assert _bit_equal(sd["out.bias"], original["model"]["2.bias"])


@pytest.mark.parametrize("named", [False, True], ids=["parameters", "named_parameters"])
def test_a_whole_dict_renamed_keeps_its_structure_and_the_optimizer(tmp_path: Path, named: bool) -> None:
    """`--remap '^model\\.=net.'` renames every key of one dict into one new dict: the checkpoint keeps
    its structure with `net` in `model`'s place; the model loads strictly, the optimizer's names still
    name its parameters (relative to the dict, as named_parameters() gives them), and the next AdamW
    step equals the original's bit for bit."""
    src, dst = tmp_path / "train.pt", tmp_path / "out.pt"
    torch.manual_seed(0)
    ref_model = _model()
    ref_opt = torch.optim.AdamW(ref_model.named_parameters() if named else ref_model.parameters(), lr=1e-2)
    for seed in range(2):
        _step(ref_model, ref_opt, seed)
    original = {"model": ref_model.state_dict(), "optimizer": ref_opt.state_dict(), "epoch": 2, "step": 40}
    torch.save(original, src)
    r = migrate_in_process("convert", str(src), str(dst), "--remap", r"^model\.=net.")
    assert r.returncode == 0, r.stderr
    out = torch.load(dst, weights_only=True)
    assert list(out) == ["net", "optimizer", "epoch", "step"] and (out["epoch"], out["step"]) == (2, 40)
    assert isinstance(out["net"], OrderedDict) and list(out["net"]) == list(original["model"])
    assert out["optimizer"]["param_groups"][0]["param_names"] == [n for n, _ in ref_model.named_parameters()]
    model = _model()
    model.load_state_dict(out["net"], strict=True)
    named_params = dict(model.named_parameters())
    opt = torch.optim.AdamW([{"params": [named_params[n] for n in g["param_names"]]}
                             for g in out["optimizer"]["param_groups"]], lr=1e-2)
    opt.load_state_dict(out["optimizer"])
    _step(model, opt, 7)
    _step(ref_model, ref_opt, 7)
    for (_, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters(), strict=True):
        assert _bit_equal(p.detach(), q.detach())


@pytest.mark.parametrize(("remap", "said"), [
    (r"^model\.0\.=net.0.", "'model.0.weight' -> 'net.0.weight' moves the tensor out of its dict 'model'"),  # split
    (r"^model\.=", "'model.0.weight' -> '0.weight' moves the tensor out of its dict 'model'"),  # another depth
])
def test_a_rename_that_splits_a_dict_or_changes_its_depth_is_refused(tmp_path: Path, remap: str, said: str) -> None:
    src, dst = tmp_path / "train.pt", tmp_path / "out.pt"
    _training_checkpoint(src)
    r = migrate_in_process("convert", str(src), str(dst), "--remap", remap)
    assert r.returncode == 1
    assert said in r.stderr, r.stderr
    assert "--top-level-key" in r.stderr and "Traceback" not in r.stderr
    assert not dst.exists()


def test_parameter_names_follow_a_rename(tmp_path: Path) -> None:
    """An optimizer built from named_parameters stores param_names: the rename updates them (its state
    follows the parameters: tests/plan/test_training_state.py)."""
    torch.manual_seed(2)
    model = _model()
    opt = torch.optim.AdamW(model.named_parameters(), lr=1e-3)
    _step(model, opt, 0)
    src, dst = tmp_path / "named.pt", tmp_path / "out.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, src)
    assert opt.state_dict()["param_groups"][0]["param_names"][0] == "0.weight"  # torch stores the names
    r = migrate_in_process("convert", str(src), str(dst), *REMAP, "--json")
    assert r.returncode == 0, r.stderr
    notes = json.loads(r.stdout)["notes"]
    assert not [n for n in notes if n.startswith("kept as stored, ")], notes
    assert any("state matched to parameters by param_names in param_groups" in n for n in notes), notes
    out = torch.load(dst, weights_only=True)
    assert out["optimizer"]["param_groups"][0]["param_names"] == ["inp.weight", "inp.bias", "out.weight", "out.bias"]


def test_recipe_run_keeps_structure(tmp_path: Path) -> None:
    src = tmp_path / "train.pt"
    original = _training_checkpoint(src)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nsource:\n  path: train.pt\nremap:\n  - from: '^model\\.0\\.'\n    to: 'model.inp.'\n"
                      "  - from: '^model\\.2\\.'\n    to: 'model.out.'\ntarget:\n  path: out.pt\n")
    r = migrate_in_process("run", str(recipe), "--report", str(tmp_path / "report.json"))
    assert r.returncode == 0, r.stderr
    assert "note: kept 27 non-tensor values of the checkpoint" in r.stdout
    kept = json.loads((tmp_path / "report.json").read_text())["checkpoint_structure"]
    assert kept[0].startswith("kept 27 non-tensor values") and "args.schedule" in kept[0]
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert list(out) == list(original) and list(out["model"]) == ["inp.weight", "inp.bias", "out.weight", "out.bias"]
    assert out["optimizer"]["param_groups"] == [{"param_names": list(out["model"]), **g}
                                                for g in original["optimizer"]["param_groups"]]


@pytest.mark.parametrize(("remap", "message"), [
    (r"^extra\.w$=extra.version", "two values of the checkpoint would be named 'extra.version' after the renames"),
    (r"^ema\.0$=ema.first", "'ema.0' -> 'ema.first': 'ema.0' is element 0 of the list 'ema'"),
])
def test_renames_the_structure_cannot_hold_are_refused(tmp_path: Path, remap: str, message: str) -> None:
    src, dst = tmp_path / "c.pt", tmp_path / "out.pt"
    torch.save({"extra": {"w": torch.ones(2), "version": 1}, "ema": [torch.zeros(1), torch.ones(1)]}, src)
    r = migrate_in_process("convert", str(src), str(dst), "--remap", remap)
    assert r.returncode == 1 and message in r.stderr, r.stderr
    assert not dst.exists()


def test_filtered_tensors_leave_their_slots_and_are_listed(tmp_path: Path) -> None:
    src, dst = tmp_path / "train.pt", tmp_path / "model-only.pt"
    original = _training_checkpoint(src)
    r = migrate_in_process("convert", str(src), str(dst), "--exclude", r"^optimizer\.state\.", "--json")
    assert r.returncode == 0, r.stderr
    out = torch.load(dst, weights_only=True)
    assert "optimizer" not in out and list(out) == [k for k in original if k != "optimizer"]
    _model().load_state_dict(out["model"], strict=True)
    notes = json.loads(r.stdout)["notes"]
    assert any(n.startswith("optimizer state dropped (optimizer): the recipe's filter leaves out every tensor")
               for n in notes), notes


def test_values_the_structure_cannot_hold_are_listed(tmp_path: Path) -> None:
    src, dst = tmp_path / "c.pt", tmp_path / "out.pt"
    torch.save({"w": torch.ones(2), "device": torch.device("cpu"), "dtype": torch.float16, "epoch": 2}, src)
    r = migrate_in_process("convert", str(src), str(dst), "--json")
    assert r.returncode == 0, r.stderr
    out = torch.load(dst, weights_only=True)
    assert list(out) == ["w", "epoch"] and out["epoch"] == 2 and _bit_equal(out["w"], torch.ones(2))
    notes = json.loads(r.stdout)["notes"]
    assert any(n.startswith("2 values of the checkpoint not written") and "device, dtype" in n for n in notes), notes


def test_op_outputs_go_where_their_source_was(tmp_path: Path) -> None:
    """A split's parts take their source's place; a concat's output its first input's (torch.split/cat the oracle)."""
    original = _training_checkpoint(tmp_path / "train.pt")
    recipe = tmp_path / "ops.yaml"
    recipe.write_text("version: 1\nsource:\n  path: train.pt\nops:\n"
                      "  - split: {from: 'model\\.0\\.weight', dim: 0, parts: 2, to: ['model.0.a', 'model.0.b']}\n"
                      "  - concat: {from: ['model\\.0\\.bias', 'model.2.bias'], dim: 0, to: 'model.biases'}\n"
                      "target:\n  path: out.pt\n")
    r = migrate_in_process("run", str(recipe), "--json")
    assert r.returncode == 0, r.stderr
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    sd = original["model"]
    assert list(out["model"]) == ["0.a", "0.b", "biases", "2.weight"]
    a, b = torch.split(sd["0.weight"], 4, dim=0)
    assert _bit_equal(out["model"]["0.a"], a.contiguous()) and _bit_equal(out["model"]["0.b"], b.contiguous())
    assert _bit_equal(out["model"]["biases"], torch.cat([sd["0.bias"], sd["2.bias"]]))
    assert out["optimizer"]["param_groups"] == [{"param_names": ["0.a", "0.b", "biases", "2.weight"], **g}
                                                for g in original["optimizer"]["param_groups"]]
    assert any(n.startswith("1 tensor left out") and "model.2.bias" in n for n in json.loads(r.stdout)["notes"])


def test_the_structure_is_read_only_for_a_pytorch_target(tmp_path: Path) -> None:
    """Reading for any other target (or inspecting) keeps nothing more than before."""
    import migrator

    _training_checkpoint(tmp_path / "train.pt")
    with migrator.open_file(tmp_path / "train.pt") as plain:
        assert plain.structure is None  # type: ignore[attr-defined]
    with migrator.open_file(tmp_path / "train.pt", keep_structure=True) as kept:
        assert kept.structure is not None  # type: ignore[attr-defined]
        assert kept.names() == plain.names()
    with migrator.open_file(tmp_path / "train.pt", keep_structure=True, top_level_key="model") as selected:
        assert selected.structure is None  # type: ignore[attr-defined]


def test_shared_plain_containers_stay_shared_and_a_memo_bomb_stays_small(tmp_path: Path) -> None:
    """torch.load gives one object where the source pickled one (memo): so does the output, written once."""
    bomb: Any = [0.5]
    for _ in range(14):  # 2**14 leaves by path, 15 lists in the file
        bomb = [bomb, bomb]
    schedule = {"milestones": [10, 20], "gamma": 0.1}
    src, dst = tmp_path / "c.pt", tmp_path / "out.pt"
    torch.save({"w": torch.ones(3), "sched_a": schedule, "sched_b": schedule, "bomb": bomb}, src)
    r = migrate_in_process("convert", str(src), str(dst))
    assert r.returncode == 0, r.stderr
    theirs, ours = torch.load(src, weights_only=True), torch.load(dst, weights_only=True)
    assert theirs["sched_a"] is theirs["sched_b"] and ours["sched_a"] is ours["sched_b"]
    assert ours["sched_a"] == schedule and ours["bomb"][0] is ours["bomb"][1]
    assert dst.stat().st_size < src.stat().st_size + 4096
    node = ours["bomb"]
    for _ in range(14):
        node = node[1]
    assert node == [0.5]


def test_param_names_written_for_a_model_at_the_top_level(tmp_path: Path) -> None:
    """A model saved at the checkpoint's top level beside its optimizer (no names saved): the names written
    are the whole keys (`layers.0.weight`), not cut at a prefix they happen to share."""
    torch.manual_seed(3)
    layers = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 2))
    model = nn.Module()
    model.layers = layers
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.layers(torch.ones(1, 2)).sum().backward()
    opt.step()
    src, dst = tmp_path / "flat.pt", tmp_path / "out.pt"
    torch.save({**model.state_dict(), "optimizer": opt.state_dict()}, src)
    r = migrate_in_process("convert", str(src), str(dst))
    assert r.returncode == 0, r.stderr
    out = torch.load(dst, weights_only=True)
    assert out["optimizer"]["param_groups"][0]["param_names"] == [n for n, _ in model.named_parameters()]
