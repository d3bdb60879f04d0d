"""A ZeRO checkpoint's optimizer state follows a recipe into a whole `.pt` (`training_state: keep`).

The checkpoints are written in the test by DeepSpeed itself (`tests/support/zero_run.py`: 2 ranks on gloo, CPU,
AdamW, two parameter groups, sizes that split unevenly; ZeRO-1 fp32, ZeRO-2 bf16, ZeRO-3 fp32). The
oracle is DeepSpeed's own universal-checkpoint conversion (`deepspeed.checkpoint.ds_to_universal`), which
writes every parameter's fp32, exp_avg and exp_avg_sq (and ZeRO-1/2's step) to files of their own, and
`zero_to_fp32` for the model; the recipe's surgery on the oracle side is written here with torch.
`torch.optim.AdamW.load_state_dict` loads the output, and a step from it equals a step from the oracle's
state.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process

os.environ.setdefault("DS_ACCELERATOR", "cpu")
torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
zero_to_fp32 = pytest.importorskip("deepspeed.utils.zero_to_fp32")
ds_to_universal = pytest.importorskip("deepspeed.checkpoint.ds_to_universal")

import tests.support.zero_run as zero_run  # noqa: E402

CONFIGS = ("1:fp32", "2:bf16", "3:fp32")
NAMES = [f"z{c[0]}_{c[2:]}" for c in CONFIGS]
MOMENTS = ("exp_avg", "exp_avg_sq")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("zero")
    done = zero_run.write_checkpoints(out, CONFIGS)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def universal(ckpts: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DeepSpeed's universal checkpoint of each config's last step (one process, no workers; the
    checkpoints carry no universal_checkpoint_info, which --inject_missing_state supplies)."""
    out = tmp_path_factory.mktemp("universal")
    for name in NAMES:
        args = argparse.Namespace(input_folder=str(ckpts / name / "global_step2"),
                                  output_folder=str(out / name / "global_step2"), num_extract_workers=1,
                                  num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=True)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            ds_to_universal.main(args)
    return out


def uni(universal: Path, config: str, name: str, key: str, shape: Any) -> Any:
    """One per-parameter file of the universal checkpoint (ZeRO-1/2 save {'param': t}, ZeRO-3 a flat t)."""
    value = torch.load(universal / config / "global_step2" / "zero" / name / f"{key}.pt", weights_only=False)
    value = value["param"] if isinstance(value, dict) else value
    return value if key == "step" else value.reshape(shape)


def bits(t: Any) -> Any:
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16}.get(t.dtype)
    return t.contiguous().view(view) if view is not None else t


def same(got: Any, want: Any) -> bool:
    return got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape) and torch.equal(bits(got), bits(want))


def hyper(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k not in ("params", "param_names")}
            for g in groups]


def common_groups(universal: Path, config: str) -> list[dict[str, Any]]:
    """The param groups ds_to_universal keeps (zero/optimizer_state.pt): the hyperparameters."""
    sd = torch.load(universal / config / "global_step2" / "zero" / "optimizer_state.pt", weights_only=False)
    return list(sd["param_groups"])


def whole(src: Path, out: Path, *extra: str) -> dict[str, Any]:
    p = migrate_in_process("convert", str(src), str(out), "--training-state", "keep", *extra)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "param_names in param_groups" in p.stdout + p.stderr
    return dict(torch.load(out, weights_only=True))


@pytest.mark.parametrize("config", NAMES)
def test_the_whole_checkpoint_equals_ds_to_universal(ckpts: Path, universal: Path, tmp_path: Path,
                                                     config: str) -> None:
    out = whole(ckpts / config, tmp_path / "whole.pt")
    assert sorted(out) == ["model", "optimizer"]
    model = dict(zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(ckpts / config)))
    assert list(out["model"]) == list(model)
    assert all(same(out["model"][n], t) for n, t in model.items())
    opt = out["optimizer"]
    assert hyper(opt["param_groups"]) == hyper(common_groups(universal, config))
    names = [n for g in opt["param_groups"] for n in g["param_names"]]
    assert [i for g in opt["param_groups"] for i in g["params"]] == list(range(len(names)))
    assert sorted(names) == ["a.bias", "a.weight", "b.weight", "g.weight", "n.bias", "n.weight"]
    assert set(opt["param_groups"][0]["param_names"]) == {"a.weight", "b.weight", "g.weight", "n.weight"}
    for i, name in enumerate(names):
        state = opt["state"][i]
        assert list(state) == ["step", "exp_avg", "exp_avg_sq"]
        for key in MOMENTS:
            want = uni(universal, config, name, key, model[name].shape)
            assert same(state[key], want), (name, key)
            assert state[key].dtype == torch.float32
        step_file = universal / config / "global_step2" / "zero" / name / "step.pt"
        if step_file.exists():  # ds_to_universal keeps a step per parameter for ZeRO-1/2 only
            assert state["step"] == uni(universal, config, name, "step", None)
        assert state["step"] == 2


def _params(sd: dict[str, Any], groups: list[dict[str, Any]]) -> tuple[dict[str, Any], Any]:
    """An AdamW over parameters named and grouped as `groups` says, with weights from `sd`."""
    params = {n: torch.nn.Parameter(sd[n].clone()) for g in groups for n in g["param_names"]}
    opt = torch.optim.AdamW([{"params": [params[n] for n in g["param_names"]], "weight_decay": g["weight_decay"]}
                             for g in groups], lr=1e-2, foreach=False)
    return params, opt


def _step(params: dict[str, Any], opt: Any, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for n in sorted(params):
        params[n].grad = torch.randn(params[n].shape, generator=gen)
    opt.step()


TRAINED = ("a.weight", "b.weight", "n.weight", "g.weight", "a.bias", "n.bias")


def _group_names(group: dict[str, Any]) -> list[str]:
    """Tiny's two groups (tests/support/zero_run.py): the trained weights with weight decay, the biases without."""
    decay = group["weight_decay"] > 0
    return [n for n in TRAINED if n.endswith("weight") == decay]


RECIPE = """
version: 1
source: {{path: {src}, top_level_key: model}}
training_state: keep
remap:
  - {{from: '^a\\.', to: 'inp.'}}
filter:
  exclude: [{{regex: '^n\\.'}}]
ops:
  - split: {{from: 'inp\\.(weight|bias)', dim: 0, sizes: [2, 3], to: ['inp_lo.$1', 'inp_hi.$1']}}
  - permute: {{from: 'b\\.weight', dims: [1, 0]}}
target: {{path: {out}}}
"""


def surgery(sd: dict[str, Any]) -> dict[str, Any]:
    """The recipe, written with torch: any per-parameter tensors (weights or moments)."""
    out: dict[str, Any] = {}
    for name, t in sd.items():
        if name.startswith("n."):
            continue
        if name.startswith("a."):
            lo, hi = t.split([2, 3], dim=0)
            out[f"inp_lo.{name[2:]}"], out[f"inp_hi.{name[2:]}"] = lo.contiguous(), hi.contiguous()
        elif name == "b.weight":
            out[name] = t.permute(1, 0).contiguous()
        else:
            out[name] = t
    return out


@pytest.mark.parametrize("config", ["z2_bf16", "z3_fp32"])
def test_the_moments_follow_the_recipe_and_training_resumes(ckpts: Path, universal: Path, tmp_path: Path,
                                                            config: str) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(src=ckpts / config, out=tmp_path / "out.pt"))
    p = migrate_in_process("run", str(recipe))
    assert p.returncode == 0, p.stdout + p.stderr
    out = torch.load(tmp_path / "out.pt", weights_only=True)

    model = dict(zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(ckpts / config)))
    want_model = surgery(model)
    assert list(out["model"]) == list(want_model)
    assert all(same(out["model"][n], t) for n, t in want_model.items())
    moments = {k: surgery({n: uni(universal, config, n, k, model[n].shape) for n in TRAINED}) for k in MOMENTS}

    # loaded by torch's AdamW, each parameter gets its moved moments
    groups = out["optimizer"]["param_groups"]
    assert [g["param_names"] for g in groups] == [["inp_lo.weight", "inp_hi.weight", "b.weight", "g.weight"],
                                                  ["inp_lo.bias", "inp_hi.bias"]]
    params, opt = _params(out["model"], groups)
    opt.load_state_dict(out["optimizer"])
    for n, p_ in params.items():
        for key in MOMENTS:
            assert same(opt.state[p_][key], moments[key][n]), (n, key)
        assert float(opt.state[p_]["step"]) == 2.0

    # the oracle: the same step from the state built in torch from ds_to_universal's files
    ref_params, ref_opt = _params(want_model, groups)
    order = [n for g in groups for n in g["param_names"]]
    ref_groups, at = [], 0
    for g in common_groups(universal, config):  # DeepSpeed's hyperparameters, the recipe's names
        names = [n for n in order if n in surgery({m: model[m] for m in _group_names(g)})]
        ref_groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": list(range(at, at + len(names)))})
        at += len(names)
    ref_opt.load_state_dict({"state": {i: {"step": torch.tensor(2.0), **{k: moments[k][n].clone() for k in MOMENTS}}
                                       for i, n in enumerate(order)}, "param_groups": ref_groups})
    _step(params, opt, 7)
    _step(ref_params, ref_opt, 7)
    for n in params:
        assert same(params[n].detach(), ref_params[n].detach()), n
        assert same(opt.state[params[n]]["exp_avg_sq"], ref_opt.state[ref_params[n]]["exp_avg_sq"]), n


def test_the_default_outputs_are_unchanged(ckpts: Path, tmp_path: Path) -> None:
    """Without training_state: keep, a .pt (or .bin) of a ZeRO checkpoint is the flat fp32 state dict
    zero_to_fp32 writes; keep into a format without an optimizer is refused."""
    want = dict(zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(ckpts / "z1_fp32")))
    for extra in ((), ("--training-state", "drop")):
        p = migrate_in_process("convert", str(ckpts / "z1_fp32"), str(tmp_path / "flat.pt"), "--overwrite", *extra)
        assert p.returncode == 0, p.stderr
        got = torch.load(tmp_path / "flat.pt", weights_only=True)
        assert list(got) == list(want) and all(same(got[n], t) for n, t in want.items())
    p = migrate_in_process("convert", str(ckpts / "z1_fp32"), str(tmp_path / "x.safetensors"),
                           "--training-state", "keep")
    assert p.returncode == 1 and "this target is safetensors" in p.stderr
    assert not (tmp_path / "x.safetensors").exists()


def test_each_moment_reads_only_its_own_bytes(ckpts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read = zero_run.count_partition_reads(monkeypatch)
    out = whole(ckpts / "z3_fp32", tmp_path / "whole.pt")
    moments = [t for s in out["optimizer"]["state"].values() for k, t in s.items() if k in MOMENTS]
    masters = [t for n, t in out["model"].items() if n != "scale"]  # the buffer is read from the model states
    assert sorted(read) == sorted(t.numel() * 4 for t in moments + masters)


def test_inspect_says_what_optimizer_state_there_is(ckpts: Path) -> None:
    p = migrate_in_process("inspect", str(ckpts / "z1_fp32"), "--json")
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)["details"]["optimizer"]
    assert info["state"] == ["step", "exp_avg", "exp_avg_sq"] and info["step"] == [2]
    assert [g["weight_decay"] for g in info["param_groups"]] == [0.1, 0.0]
    p = migrate_in_process("inspect", str(ckpts / "z1_fp32"))
    assert "optimizer state (not listed): step, exp_avg, exp_avg_sq per parameter" in p.stdout


def test_a_moment_that_disagrees_with_its_partition_is_refused(ckpts: Path, tmp_path: Path) -> None:
    """Rank 1's exp_avg of group 0 one element short: exit 1, one line naming the file, nothing written;
    the fp32 weights alone (which do not read the moments) still convert."""
    ckpt = Path(shutil.copytree(ckpts / "z1_fp32", tmp_path / "ckpt"))
    victim = ckpt / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    sd = torch.load(victim, weights_only=False)
    state = sd["optimizer_state_dict"]["base_optimizer_state"]["state"][0]
    state["exp_avg"] = state["exp_avg"][:-1].clone()
    torch.save(sd, victim)
    out = tmp_path / "whole.pt"
    p = migrate_in_process("convert", str(ckpt), str(out), "--training-state", "keep")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert victim.name in p.stderr and "exp_avg" in p.stderr and "does not match the partition" in p.stderr
    assert not out.exists()
    assert migrate_in_process("convert", str(ckpt), str(tmp_path / "w.safetensors")).returncode == 0


def test_a_step_kept_as_a_tensor_is_copied_to_each_parameter(ckpts: Path, tmp_path: Path) -> None:
    """torch's own AdamW keeps `step` as a 0-d tensor (DeepSpeed's Adam as an int): each parameter gets
    its own copy, read from rank 0's file."""
    ckpt = Path(shutil.copytree(ckpts / "z3_fp32", tmp_path / "ckpt"))
    for rank in (0, 1):
        path = ckpt / "global_step2" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        sd = torch.load(path, weights_only=False)
        for state in sd["optimizer_state_dict"]["optimizer_state_dict"]["state"].values():
            state["step"] = torch.tensor(2.0)
        torch.save(sd, path)
    out = whole(ckpt, tmp_path / "whole.pt")
    steps = [s["step"] for s in out["optimizer"]["state"].values()]
    assert len(steps) == 6 and all(same(t, torch.tensor(2.0)) for t in steps)
    params, opt = _params(out["model"], out["optimizer"]["param_groups"])
    opt.load_state_dict(out["optimizer"])
    _step(params, opt, 1)
    assert all(float(opt.state[p]["step"]) == 3.0 for p in params.values())  # one storage each: counted once


def test_a_checkpoint_saved_before_the_first_step_has_no_state(ckpts: Path, tmp_path: Path) -> None:
    """An optimizer not stepped yet saves no per-parameter state (torch's, and so DeepSpeed's base
    optimizer's): the groups are written, the state is empty, and AdamW loads it."""
    ckpt = Path(shutil.copytree(ckpts / "z1_fp32", tmp_path / "ckpt"))
    for rank in (0, 1):
        path = ckpt / "global_step2" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        sd = torch.load(path, weights_only=False)
        sd["optimizer_state_dict"]["base_optimizer_state"]["state"] = {}
        torch.save(sd, path)
    out = whole(ckpt, tmp_path / "whole.pt")
    assert out["optimizer"]["state"] == {}
    assert sum(len(g["param_names"]) for g in out["optimizer"]["param_groups"]) == 6
    _, opt = _params(out["model"], out["optimizer"]["param_groups"])
    opt.load_state_dict(out["optimizer"])
    assert not opt.state


def test_keep_says_deepspeeds_gradient_clipping_is_not_in_the_checkpoint(ckpts: Path, tmp_path: Path) -> None:
    """The engine clipped every step to its config's gradient_clipping (DeepSpeed's default when the config
    sets none, as these do: `GRADIENT_CLIPPING_DEFAULT`); a resume in torch must clip too. The value said is
    the one DeepSpeed's own config object reads from the `ds_config` the checkpoint keeps."""
    from deepspeed.runtime.config import get_gradient_clipping

    folder = tmp_path / "ckpt"
    shutil.copytree(ckpts / "z1_fp32", folder)
    states = folder / "global_step2" / "mp_rank_00_model_states.pt"
    saved = torch.load(states, weights_only=False)
    for config, said in ((saved["ds_config"], "DeepSpeed's default: its ds_config sets no gradient_clipping"),
                         ({**saved["ds_config"], "gradient_clipping": 0.5}, "its ds_config's gradient_clipping"),
                         ({**saved["ds_config"], "gradient_clipping": 0.0}, None)):
        torch.save({**saved, "ds_config": config}, states)
        value = get_gradient_clipping(config)
        p = migrate_in_process("convert", str(folder), str(tmp_path / "whole.pt"), "--training-state", "keep",
                               "--overwrite")
        assert p.returncode == 0, p.stderr
        if said is None:
            assert value == 0 and "did not clip gradients" in p.stdout
        else:
            assert f"DeepSpeed clipped the gradients to norm {value:g} ({said})" in p.stdout, p.stdout
            assert f"torch.nn.utils.clip_grad_norm_(model.parameters(), {value:g})" in p.stdout
    p = migrate_in_process("convert", str(folder), str(tmp_path / "flat.pt"))  # the weights alone: nothing to say
    assert p.returncode == 0 and "clip" not in p.stdout
