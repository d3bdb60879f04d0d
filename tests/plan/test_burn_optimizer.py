"""A PyTorch optimizer into Burn's OptimizerRecord (`training_state: keep` into a .bpk).

The oracle for the values is torch: its optimizer state after two steps, renamed and transposed here
with torch as Burn's module wants it (Burn's Linear weight is [in, out]). The oracle for the layout is
Burn's source (tracel-ai/burn, crate burn-optim; the commits are in docs/burn-compatibility.md):

- optim/module/module_optimizer.rs, `to_record`: per parameter, `prefix = id.val().to_string()`;
  each state tensor is pushed as `burn_pack::Tensor::new(name, .., Some(id.val()), ..)` with the
  name the state derive made under that prefix; `scalars.insert(join_path(&prefix, "__rank"),
  Scalar::from(state.rank()))`; `paths.insert(prefix, path)` with the module path joined by '.'.
- optim/module/record/mod.rs, `into_writer`: `Writer::new(tensors)`, then `with_scalar` for each
  scalar and `with_metadata` for each path: the paths are the burnpack's whole metadata map
  (burn-pack/src/writer.rs: `Writer::new` starts with an empty metadata map).
- burn-derive/src/record_state/mod.rs: a field is `join_path(prefix, field)`, a nested state adds
  its field's name, an absent Option field writes nothing, scalars via `Scalar::from`
  (burn-pack/src/base.rs: `usize => UInt`).
- optim/adamw.rs / adam.rs: `AdamWState { momentum: AdaptiveMomentumState { time: usize, moment_1,
  moment_2, max_moment_2: Option<Tensor> } }`; optim/sgd.rs: `SgdState { momentum:
  Option<MomentumState> }`, optim/momentum.rs: `MomentumState { velocity }`.

The record is read twice: by migrator's burnpack reader, and by a parser written here from the
burnpack layout (10-byte header, CBOR by cbor2, data at the next multiple of 256).
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
cbor2 = pytest.importorskip("cbor2")
np = pytest.importorskip("numpy")
from tests.support.burnpack import parse_burnpack  # noqa: E402

nn = torch.nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 5)
        self.norm = nn.LayerNorm(5)
        self.fc2 = nn.Linear(5, 2)


RECIPE = """
version: 1
source: {path: ckpt.pt, top_level_key: model}
training_state: keep
remap:
  - {from: '^fc1\\.', to: 'encoder.'}
  - {from: '^fc2\\.', to: 'head.'}
modules: {Linear: ['^(encoder|head)$'], LayerNorm: ['^norm$']}
adapters: [pytorch_to_burn]
target: {path: out.bpk}
"""

# torch's name -> Burn's (pytorch_to_burn renames a LayerNorm's weight/bias to gamma/beta)
BURN = {"fc1.weight": "encoder.weight", "fc1.bias": "encoder.bias", "norm.weight": "norm.gamma",
        "norm.bias": "norm.beta", "fc2.weight": "head.weight", "fc2.bias": "head.bias"}


def burn_layout(torch_name: str, t: Any) -> Any:
    """A tensor shaped like `torch_name`'s parameter, as Burn holds it: a Linear's weight is [in, out]."""
    return t.T.contiguous() if torch_name in ("fc1.weight", "fc2.weight") else t


def _trained(tmp_path: Path, make: Any, recipe: str = RECIPE) -> tuple[Any, Any]:
    torch.manual_seed(0)
    net = Net()
    opt = make(net.parameters())
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):
        for p in net.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(), "epoch": 7}, tmp_path / "ckpt.pt")
    (tmp_path / "recipe.yaml").write_text(recipe)
    return net, opt


def _state(net: Any, opt: Any, key: str) -> dict[str, Any]:
    """torch's per-parameter `key`, by Burn's name, in Burn's layout."""
    return {BURN[n]: burn_layout(n, opt.state[p][key]) for n, p in net.named_parameters()}


def _run(tmp_path: Path, *extra: str) -> Any:
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"), *extra)
    assert "Traceback" not in done.stderr
    return done


def _model_meta(path: Path) -> dict[str, str]:
    _, meta, _ = parse_burnpack(path)
    return dict(meta.get("metadata", {}))


def _model_ids(path: Path) -> dict[str, int]:
    _, meta, _ = parse_burnpack(path)
    return {name: d["param_id"] for name, d in meta["tensors"].items()}


def test_adamw_after_two_steps_is_burns_record(tmp_path: Path) -> None:
    from migrator import open_file
    from migrator.core.scalars import Scalar

    net, opt = _trained(tmp_path, lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=False))
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    ids = _model_ids(tmp_path / "out.bpk")
    assert set(ids) == set(BURN.values())
    assert len(set(ids.values())) == len(ids) and all(isinstance(i, int) and 0 <= i < 2**64 for i in ids.values())
    with open_file(tmp_path / "out.bpk") as model:  # the weights went through the same recipe
        for n, p in net.named_parameters():
            assert np.array_equal(model[BURN[n]].numpy(), burn_layout(n, p.detach()).numpy())
        assert model.scalars["epoch"] == Scalar("Int", 7)

    moments = {"moment_1": _state(net, opt, "exp_avg"), "moment_2": _state(net, opt, "exp_avg_sq")}
    keys, meta, arrays = parse_burnpack(tmp_path / "out-optim.bpk")
    assert keys == ["tensors", "metadata", "scalars"]
    expected_names = {f"{ids[name]}.momentum.{field}" for field in moments for name in ids}
    assert set(meta["tensors"]) == expected_names
    for field, by_name in moments.items():
        for name, want in by_name.items():
            record_name = f"{ids[name]}.momentum.{field}"
            descriptor = meta["tensors"][record_name]
            assert descriptor["param_id"] == ids[name] == int(record_name.split(".")[0])
            assert descriptor["shape"] == list(want.shape) and descriptor["dtype"] == "F32"
            assert np.array_equal(arrays[record_name], want.numpy()), record_name
    # the metadata: the paths map, and the pair's stamp and the model's name, keys that Burn's
    # load_record skips (it keeps a key only when `name.parse::<u64>()` succeeds)
    stamp = _model_meta(tmp_path / "out.bpk")["migrator.pair"]
    assert meta["metadata"] == {**{str(ids[name]): name for name in ids},
                                "migrator.pair": stamp, "migrator.pair.model": "out.bpk"}
    assert [k for k in meta["metadata"] if not k.isdigit()] == ["migrator.pair", "migrator.pair.model"]
    assert _model_meta(tmp_path / "out.bpk")["migrator.pair.record"] == "out-optim.bpk" and len(stamp) == 16
    import json

    for name, other in (("out.bpk", "out-optim.bpk"), ("out-optim.bpk", "out.bpk")):  # inspect names the pair
        shown = migrate_in_process("inspect", str(tmp_path / name), "--json")
        assert json.loads(shown.stdout)["pair"] == {
            "stamp": stamp, "other": other, "status": "paired",
            "message": f"pair {stamp}: its {'optimizer record' if name == 'out.bpk' else 'model'} {other} carries "
                       "the same stamp"}
    # the scalars are __rank and momentum.time per parameter
    steps = {n: int(opt.state[p]["step"]) for n, p in net.named_parameters()}
    assert meta["scalars"] == {
        **{f"{ids[BURN[n]]}.__rank": {"UInt": p.dim()} for n, p in net.named_parameters()},
        **{f"{ids[BURN[n]]}.momentum.time": {"UInt": steps[n]} for n, p in net.named_parameters()}}
    assert set(steps.values()) == {2}

    with open_file(tmp_path / "out-optim.bpk") as record:  # migrator's reader agrees
        for name in ids:
            t = record[f"{ids[name]}.momentum.moment_1"]
            assert t.param_id == ids[name]
            assert np.array_equal(t.numpy(), moments["moment_1"][name].numpy())
        assert record.metadata == meta["metadata"]

    said = done.stdout + done.stderr
    assert "lr 0.01" in said and "eps 1e-08" in said and "weight_decay 0.1" in said
    assert "AdamWConfig" in said and "epsilon 1e-5" in said


def test_the_same_checkpoint_gives_the_same_files_another_step_other_ids(tmp_path: Path) -> None:
    """Reproducible output: ids are derived from the checkpoint, so a second run into a new place is
    byte-identical; a run replacing that pair writes the next generation (ids none of the replaced files
    hold: a kill between the two renames never leaves a record beside a model whose ids it shares), and
    the one after it the first again. A later step of the same run (the same tensor table) gets other ids,
    so its record cannot apply to this model."""
    net, opt = _trained(tmp_path, lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False))
    assert _run(tmp_path).returncode == 0
    names = ("out.bpk", "out-optim.bpk")
    first = [(tmp_path / f).read_bytes() for f in names]
    for f in names:
        (tmp_path / f).rename(tmp_path / f"first-{f}")
    assert _run(tmp_path).returncode == 0
    assert [(tmp_path / f).read_bytes() for f in names] == first
    ids = _model_ids(tmp_path / "out.bpk")
    assert _run(tmp_path, "--overwrite").returncode == 0  # the next generation
    second = _model_ids(tmp_path / "out.bpk")
    assert set(second) == set(ids) and not set(second.values()) & set(ids.values())
    _, record, _ = parse_burnpack(tmp_path / "out-optim.bpk")
    assert {d["param_id"] for d in record["tensors"].values()} <= set(second.values())
    stamp = _model_meta(tmp_path / "out.bpk")["migrator.pair"]
    assert stamp == record["metadata"]["migrator.pair"] != _model_meta(tmp_path / "first-out.bpk")["migrator.pair"]
    assert _run(tmp_path, "--overwrite").returncode == 0  # and back: generation 0 is apart from generation 1
    assert [(tmp_path / f).read_bytes() for f in names] == first
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    ckpt["optimizer"] = opt.state_dict()
    torch.save(ckpt, tmp_path / "ckpt.pt")
    assert _run(tmp_path, "--overwrite").returncode == 0
    assert not set(_model_ids(tmp_path / "out.bpk").values()) & set(ids.values())


def test_sgd_momentum_is_burns_velocity(tmp_path: Path) -> None:
    net, opt = _trained(tmp_path, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=False))
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    ids = _model_ids(tmp_path / "out.bpk")
    _, meta, arrays = parse_burnpack(tmp_path / "out-optim.bpk")
    want = _state(net, opt, "momentum_buffer")
    assert set(arrays) == {f"{ids[name]}.momentum.velocity" for name in ids}
    for name, value in want.items():
        assert np.array_equal(arrays[f"{ids[name]}.momentum.velocity"], value.numpy())
    # SGD's state has no time: only the rank
    assert meta["scalars"] == {f"{ids[BURN[n]]}.__rank": {"UInt": p.dim()} for n, p in net.named_parameters()}
    assert "SgdConfig" in done.stdout + done.stderr and "dampening 0.1" in done.stdout + done.stderr


def test_amsgrad_is_burns_max_moment_2(tmp_path: Path) -> None:
    net, opt = _trained(tmp_path, lambda ps: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True, foreach=False))
    assert _run(tmp_path).returncode == 0
    ids = _model_ids(tmp_path / "out.bpk")
    _, _, arrays = parse_burnpack(tmp_path / "out-optim.bpk")
    for name, value in _state(net, opt, "max_exp_avg_sq").items():
        assert np.array_equal(arrays[f"{ids[name]}.momentum.max_moment_2"], value.numpy())


def test_target_optimizer_chooses_the_path(tmp_path: Path) -> None:
    _trained(tmp_path, lambda ps: torch.optim.AdamW(ps, foreach=False),
             RECIPE.replace("target: {path: out.bpk}", "target: {path: out.bpk, optimizer: ckpt/optim-7.bpk}"))
    assert _run(tmp_path).returncode == 0
    assert (tmp_path / "ckpt" / "optim-7.bpk").exists() and not (tmp_path / "out-optim.bpk").exists()


def _refused(tmp_path: Path, said: str, *extra: str) -> None:
    done = _run(tmp_path, *extra)
    assert done.returncode == 1, done.stdout + done.stderr
    assert said in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "recipe.yaml"]  # nothing written, no scratch


def test_an_optimizer_without_a_confirmed_layout_is_refused(tmp_path: Path) -> None:
    _trained(tmp_path, lambda ps: torch.optim.Adagrad(ps, foreach=False))
    _refused(tmp_path, "Burn's record layout is confirmed from Burn's source for Adam/AdamW")


def test_maximize_is_refused(tmp_path: Path) -> None:
    _trained(tmp_path, lambda ps: torch.optim.AdamW(ps, maximize=True, foreach=False))
    _refused(tmp_path, "maximize=True")


def test_a_failed_write_publishes_neither_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record is written first, the model second; the model's write failing leaves neither."""
    from migrator.formats.burnpack import BurnpackWriter

    _trained(tmp_path, lambda ps: torch.optim.AdamW(ps, foreach=False))
    calls = []
    real = BurnpackWriter.write_to

    def failing(self: Any, sink: Any) -> None:
        calls.append(len(self.tensors))
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, sink)

    monkeypatch.setattr(BurnpackWriter, "write_to", failing)
    _refused(tmp_path, "no space left on device")
    assert calls == [12, 6]  # the record's 12 moments were written, then the model's 6 tensors failed


def test_an_existing_record_is_refused_before_the_model_is_written(tmp_path: Path) -> None:
    _trained(tmp_path, lambda ps: torch.optim.AdamW(ps, foreach=False))
    (tmp_path / "out-optim.bpk").write_bytes(b"keep me")
    done = _run(tmp_path)
    assert done.returncode == 1 and "out-optim.bpk" in done.stderr
    assert not (tmp_path / "out.bpk").exists() and (tmp_path / "out-optim.bpk").read_bytes() == b"keep me"
    assert _run(tmp_path, "--overwrite").returncode == 0
    assert (tmp_path / "out-optim.bpk").read_bytes()[:4] == b"NRUB"


def test_convert_optimizer_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _trained(tmp_path, lambda ps: torch.optim.AdamW(ps, foreach=False))
    monkeypatch.chdir(tmp_path)
    common = ("convert", "ckpt.pt", "m.bpk", "--top-level-key", "model")
    usage = migrate_in_process(*common, "--optimizer-out", "o.bpk")
    assert usage.returncode == 2 and "add --training-state keep" in usage.stderr
    done = migrate_in_process(*common, "--training-state", "keep", "--optimizer-out", "o.bpk")
    assert done.returncode == 0, done.stderr
    ids = set(_model_ids(tmp_path / "m.bpk").values())
    _, meta, _ = parse_burnpack(tmp_path / "o.bpk")
    assert {d["param_id"] for d in meta["tensors"].values()} == ids


def test_sgd_without_momentum_writes_an_empty_record_and_ids_on_buffers(tmp_path: Path) -> None:
    """torch's plain SGD keeps no state, nor does Burn's (sgd.rs: `SgdState { momentum: None }` holds no
    tensor); a BatchNorm's buffers are Burn Params too, so they get param_ids like the weights."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    opt = torch.optim.SGD(net.named_parameters(), lr=0.1)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "ckpt.pt")
    (tmp_path / "recipe.yaml").write_text("version: 1\nsource: {path: ckpt.pt, top_level_key: model}\n"
                                          "training_state: keep\ntarget: {path: out.bpk}\n")
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "the record is empty" in done.stdout + done.stderr
    keys, meta, _ = parse_burnpack(tmp_path / "out-optim.bpk")
    assert keys == ["tensors", "metadata"] and meta["tensors"] == {}  # the metadata: the pair's keys alone
    assert sorted(meta["metadata"]) == ["migrator.pair", "migrator.pair.model"]
    ids = _model_ids(tmp_path / "out.bpk")
    assert set(ids) == set(net.state_dict()) and len(set(ids.values())) == len(ids)


def test_state_that_cannot_be_matched_is_refused_without_a_traceback(tmp_path: Path) -> None:
    """Unnamed parameters and a model with buffers: which state is whose is not certain (training_state's
    own rule); the Burn record is not attempted."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "ckpt.pt")
    (tmp_path / "recipe.yaml").write_text("version: 1\nsource: {path: ckpt.pt, top_level_key: model}\n"
                                          "training_state: keep\ntarget: {path: out.bpk}\n")
    _refused(tmp_path, "which state belongs to which tensor is not certain")


def test_the_model_file_keeps_numbers_but_not_torchs_parameter_ids(tmp_path: Path) -> None:
    """torch's `params` ids and `param_names` name torch's parameters, before the recipe: stale beside a
    Burn model, so they are left out; epoch and the hyperparameters stay as typed scalars."""
    from migrator import open_file
    from migrator.core.scalars import Scalar

    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.AdamW(net.named_parameters(), lr=0.5, foreach=False)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}, tmp_path / "ckpt.pt")
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    assert _run(tmp_path).returncode == 0
    with open_file(tmp_path / "out.bpk") as model:
        assert model.scalars["epoch"] == Scalar("Int", 3)
        assert model.scalars["optimizer.param_groups.0.lr"] == Scalar("Float", 0.5)
        assert not [k for k in [*model.scalars, *model.metadata] if ".params." in k or ".param_names." in k]


def test_a_checkpoint_without_an_optimizer_writes_the_model_with_ids(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = Net()
    torch.save({"model": net.state_dict(), "epoch": 1}, tmp_path / "ckpt.pt")
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "holds no optimizer state dict" in done.stdout + done.stderr
    assert not (tmp_path / "out-optim.bpk").exists()
    assert all(isinstance(i, int) for i in _model_ids(tmp_path / "out.bpk").values())


def test_the_group_note_counts_the_parameters_written_after_a_split(tmp_path: Path) -> None:
    """fc1's weight split in two along its outputs: the record's group holds one parameter more than
    torch's optimizer did, and the note says so (it counted torch's)."""
    split = "ops:\n  - split: {from: 'encoder\\.weight', dim: 0, sizes: [3, 2], to: [a.weight, b.weight]}\n"
    net, opt = _trained(tmp_path, lambda ps: torch.optim.AdamW(ps, foreach=False),
                        RECIPE.replace("adapters:", split + "adapters:").replace("(encoder|head)", "(a|b|head)"))
    done = _run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    torch_count = len(opt.state_dict()["param_groups"][0]["params"])
    assert torch_count == len(list(net.parameters())) == 6
    assert f"param group 0 ({torch_count + 1} parameters)" in done.stdout, done.stdout
    _, meta, _ = parse_burnpack(tmp_path / "out-optim.bpk")
    assert sorted(v for k, v in meta["metadata"].items() if k.isdigit()) == sorted(
        ["a.weight", "b.weight", "encoder.bias", "norm.gamma", "norm.beta", "head.weight", "head.bias"])
