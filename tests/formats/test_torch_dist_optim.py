"""Megatron-core's optimizer state in a `torch_dist` checkpoint: read per parameter, kept through a recipe
into DCP, dropped when asked; bucket-space buffers listed as stored and refused for `keep`.

The oracle is megatron-core 0.16.1 (`tests/support/torch_dist_optim.py`): it trains a tiny GPT three
Adam steps on 2 gloo ranks with `get_megatron_optimizer` (the non-distributed optimizer, tensor-parallel;
the distributed optimizer's `fully_reshardable` and `dp_reshardable` layouts, data-parallel), saves
model and optimizer with `dist_checkpointing.save`, and reads them back with `load_plain_tensors`.
Each moment migrator lists must equal megatron's at its layer, bit for bit; the DCP output is read by
torch's `dcp_to_torch_save`, and its param groups compared with the groups megatron's optimizer built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process
from tests.support.torch_dist import VOCAB
from tests.support.torch_dist_optim import STEPS, cached_checkpoint

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # megatron-core training and saving on 2 ranks: ~20-40 s per layout, once

from migrator.files.io import open_file  # noqa: E402

RECIPE = """version: 1
source: {{path: {source}}}
training_state: {mode}
remap:
  - {{from: '^decoder\\.layers\\.(\\d+)\\.', to: 'layers.$1.'}}
filter: {{exclude: [{{regex: '^output_layer\\.weight$'}}]}}
target: {{path: {target}, format: dcp}}
"""


def _written(factory: pytest.TempPathFactory, layout: str) -> tuple[Path, dict[str, Any]]:
    pytest.importorskip("megatron.core")
    return cached_checkpoint(factory, layout)


def bits(a: Any, b: Any, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), what


def megatrons(plain: dict[str, Any], name: str, key: str) -> Any:
    """Megatron's own `optimizer.state.<key>.<stacked param>` at the layer `name` (a per-layer name) is."""
    parts = name.split(".")
    if name.startswith("decoder.layers."):
        return plain[f"optimizer.state.{key}.decoder.layers.{'.'.join(parts[3:])}"][int(parts[2])]
    found = plain[f"optimizer.state.{key}.{name}"]
    return found[:VOCAB] if name in ("embedding.word_embeddings.weight", "output_layer.weight") else found


@pytest.mark.parametrize("layout", ["non-distributed", "fully_reshardable"])
def test_every_moment_equals_megatrons_own_reading(tmp_path_factory: pytest.TempPathFactory, layout: str) -> None:
    folder, oracle = _written(tmp_path_factory, layout)
    plain = oracle["plain"]
    seen = set()
    with open_file(folder) as r:
        state = [n for n in r.names() if n.startswith("optimizer.")]
        model = [n for n in r.names() if not n.startswith("optimizer.")]
        for name in state:
            param, key = name.removeprefix("optimizer.state.").rsplit(".", 1)
            assert param in model, name
            got = torch.from_numpy(r[name].numpy().copy())
            bits(got, megatrons(plain, param, key), name)
            stacked = param if not param.startswith("decoder.layers.") else "decoder.layers." + ".".join(
                param.split(".")[3:])
            seen.add(f"optimizer.state.{key}.{stacked}")
        assert seen == {k for k in plain if k.startswith("optimizer.")}  # nothing megatron reads is missing
        keys = ("param", "exp_avg", "exp_avg_sq") if layout == "fully_reshardable" else ("exp_avg", "exp_avg_sq")
        assert {n.rsplit(".", 1)[1] for n in state} == set(keys)
        assert [n for n in state if ".layers.0.self_attention.linear_proj." in n] == [
            f"optimizer.state.decoder.layers.0.self_attention.linear_proj.weight.{k}" for k in keys]  # as stored
        assert any(f"({layout} layout;" in note for note in r.notes), r.notes


def _run(tmp: Path, folder: Path, mode: str) -> tuple[Any, Path]:
    target = tmp / f"out-{mode}"
    (tmp / f"{mode}.yaml").write_text(RECIPE.format(source=folder, target=target, mode=mode))
    done = migrate_in_process("run", str(tmp / f"{mode}.yaml"))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    return done, target


def _as_torch(target: Path, tmp: Path) -> dict[str, Any]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(target), str(tmp / "whole.pt"))
    return torch.load(tmp / "whole.pt", weights_only=True)


def test_keep_follows_the_recipe_into_dcp(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """Renamed layers, the output layer filtered out: each kept parameter's moments and step under DCP's
    flattened names (`optimizer.state.<new name>.exp_avg`), bit for bit megatron's; the output layer's state
    dropped; the param groups megatron's optimizer built, by the new names, with common.pt's hyperparameters."""
    folder, oracle = _written(tmp_path_factory, "non-distributed")
    plain = oracle["plain"]
    done, target = _run(tmp_path, folder, "keep")
    whole = _as_torch(target, tmp_path)

    def new(name: str) -> str:
        return name.replace("decoder.layers.", "layers.", 1) if name.startswith("decoder.layers.") else name

    with open_file(folder) as r:
        params = [n for n in r.names() if not n.startswith("optimizer.") and n != "output_layer.weight"]
        for name in params:
            bits(whole[new(name)], torch.from_numpy(r[name].numpy().copy()), name)
    state = whole["optimizer"]["state"]
    assert sorted(state) == sorted(new(n) for n in params)
    for name in params:
        for key in ("exp_avg", "exp_avg_sq"):
            bits(state[new(name)][key], megatrons(plain, name, key), f"{name}.{key}")
        bits(state[new(name)]["step"], torch.tensor(float(STEPS)), f"{name}.step")
    common = torch.load(folder / "common.pt", weights_only=False)["optimizer"]
    groups = whole["optimizer"]["param_groups"]
    assert len(groups) == len(common["param_groups"]) == len(oracle["members"])
    for group, saved, members in zip(groups, common["param_groups"], oracle["members"], strict=True):
        assert {k: v for k, v in group.items() if k != "params"} == saved
        assert sorted(group["params"]) == sorted(new(n) for n in members if n != "output_layer.weight")
    assert "output_layer.weight" not in state and not any(k.startswith("output_layer") for k in whole)
    assert "megatron-core's default rule" in done.stdout


def test_drop_leaves_the_state_out_and_says_so(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    folder, _ = _written(tmp_path_factory, "non-distributed")
    done, target = _run(tmp_path, folder, "drop")
    whole = _as_torch(target, tmp_path)
    assert "optimizer" not in whole and "layers.0.mlp.linear_fc1.weight" in whole
    assert "optimizer state dropped (optimizer): training_state: drop" in done.stdout


def test_bucket_space_is_listed_as_stored_and_keep_is_refused(tmp_path_factory: pytest.TempPathFactory,
                                                              tmp_path: Path) -> None:
    folder, oracle = _written(tmp_path_factory, "dp_reshardable")
    plain = oracle["plain"]
    flat = sorted(k for k in plain if k.startswith("optimizer."))
    assert flat and all(k.startswith("optimizer.distributed.") for k in flat)
    with open_file(folder) as r:
        assert sorted(n for n in r.names() if n.startswith("optimizer.")) == flat
        for name in flat:
            bits(torch.from_numpy(r[name].numpy().copy()), plain[name], name)
        assert any("'dp_reshardable' layout" in note and "as stored" in note for note in r.notes), r.notes
    done = migrate_in_process("convert", str(folder), str(tmp_path / "out"), "--to", "dcp", "--training-state", "keep")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and "'dp_reshardable' layout" in line and "training_state: drop" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("mcore", [False, True])
def test_moments_not_shaped_as_their_parameter_are_listed_as_stored(tmp_path: Path, mcore: bool) -> None:
    """megatron-core <= 0.15's fully_sharded_model_space stored flattened ranges reshaped (another global
    shape, `nd_reformulated_orig_global_shape` in `mcore_data`): not matched, not cut, keep refused."""
    import argparse
    import pickle

    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from tests.support.torch_dist import megatron_files

    weight = torch.randn(2, 4, 8)
    moment = torch.randn(2, 32) if not mcore else torch.randn(2, 4, 8)  # same shape: only mcore_data tells
    key = "optimizer.state.exp_avg.decoder.layers.mlp.linear_fc2.weight"
    folder = tmp_path / "ckpt"
    dcp.save({"decoder.layers.mlp.linear_fc2.weight": weight, key: moment}, checkpoint_id=str(folder), no_dist=True)
    megatron_files(folder, argparse.Namespace(num_layers=2))
    if mcore:  # what megatron-core <= 0.15 pickles: DCP's Metadata plus mcore_data (as the reader's test does)
        meta = pickle.loads((folder / ".metadata").read_bytes())
        meta.mcore_data = {key: {"nd_reformulated_orig_global_shape": (2, 4, 8)}}
        (folder / ".metadata").write_bytes(pickle.dumps(meta))
    with open_file(folder) as r:
        assert [n for n in r.names() if n.startswith("optimizer.")] == [key]  # as stored, uncut
        bits(torch.from_numpy(r[key].numpy().copy()), moment, key)
        assert any("as stored" in note for note in r.notes), r.notes
    done = migrate_in_process("convert", str(folder), str(tmp_path / "out"), "--to", "dcp", "--training-state", "keep")
    line = done.stderr.strip()
    assert done.returncode != 0 and "\n" not in line and "fully_sharded_model_space" in line, done.stderr
    assert (" reformulation " in line) == mcore
    assert not (tmp_path / "out").exists()


def test_the_docs_blocks_run(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/training-checkpoints.md's "Megatron optimizer state": the recipe saved under the name its
    comment gives, every command run as written on megatron-core's checkpoint."""
    import re
    import shlex
    import shutil

    folder, oracle = _written(tmp_path_factory, "non-distributed")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "training-checkpoints.md").read_text()
    section = doc.split("\n### Megatron optimizer state\n", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, re.S)
    assert [kind for kind, _ in blocks] == ["sh", "yaml"]
    shutil.copytree(folder, tmp_path / "ckpt" / "iter_0000100")
    recipe = blocks[1][1]
    (tmp_path / recipe.splitlines()[0].removeprefix("# ")).write_text(recipe)
    monkeypatch.chdir(tmp_path)
    for line in blocks[0][1].strip().splitlines():
        args = shlex.split(line, comments=True)
        assert args[0] == "migrate"
        done = migrate_in_process(*args[1:])
        assert done.returncode == 0, (line, done.stderr)
    stacked = oracle["plain"]["optimizer.state.exp_avg.decoder.layers.mlp.linear_fc1.weight"]
    for out, name in (("resume", "decoder.layers.1.mlp.linear_fc1.weight"),
                      ("renamed", "layers.1.mlp.linear_fc1.weight")):
        (tmp_path / f"{out}-pt").mkdir()
        whole = _as_torch(tmp_path / out, tmp_path / f"{out}-pt")
        bits(whole["optimizer"]["state"][name]["exp_avg"], stacked[1], out)
    (tmp_path / "weights-pt").mkdir()
    assert "optimizer" not in _as_torch(tmp_path / "weights", tmp_path / "weights-pt")


def test_into_hugging_face_the_optimizer_is_left_out(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """A model folder has no place for moments: `convert` refuses them naming the filter that leaves them
    out; the shipped recipe leaves them out and writes the weights megatron saved."""
    folder, oracle = _written(tmp_path_factory, "non-distributed")
    done = migrate_in_process("convert", str(folder), str(tmp_path / "refused") + "/")
    assert done.returncode != 0 and "--exclude '^optimizer\\.' writes the model alone" in done.stderr, done.stderr
    done = migrate_in_process("convert", str(folder), str(tmp_path / "flat") + "/", "--exclude", "^optimizer\\.")
    assert done.returncode == 0, done.stderr
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "megatron-llama-to-hf.yaml"
    done = migrate_in_process("run", str(recipe), "--source", str(folder), "--target", str(tmp_path / "hf") + "/")
    assert done.returncode == 0, done.stderr
    from safetensors.torch import load_file

    hf = load_file(tmp_path / "hf" / "model.safetensors")
    assert not any("optimizer" in k or "exp_avg" in k for k in hf)
    bits(hf["lm_head.weight"], oracle["plain"]["output_layer.weight"][:VOCAB], "lm_head.weight")
    bits(hf["model.layers.1.mlp.down_proj.weight"], oracle["plain"]["decoder.layers.mlp.linear_fc2.weight"][1],
         "down_proj")


def test_keep_into_torch_dist_resumes_in_megatron(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """megatron's checkpoint read per layer, stacked back by a recipe and written with its optimizer
    (`--to torch_dist`, `training_state: keep`): megatron-core loads it into its model and optimizer on 2
    ranks and its next step equals the original run's next step, bit for bit (parameters, moments, step)."""
    import shutil

    from tests.support.torch_dist_optim import resume

    folder, _ = _written(tmp_path_factory, "non-distributed")
    source = tmp_path / "source"
    shutil.copytree(folder, source)
    common = torch.load(source / "common.pt", weights_only=False)
    common["args"].vocab_size = None  # the vocabulary's padding rows stay: megatron's model has them
    torch.save(common, source / "common.pt")
    (tmp_path / "back.yaml").write_text(
        "version: 1\n"
        f"source: {{path: {source}}}\n"
        "training_state: keep\n"
        "ops:\n"
        "  - stack: {from: 'decoder\\.layers\\.(\\d+)\\.(.+)', over: 1, to: 'decoder.layers.$2'}\n"
        f"target: {{path: {tmp_path / 'back'}, format: torch_dist}}\n")
    done = migrate_in_process("run", str(tmp_path / "back.yaml"))
    assert done.returncode == 0, done.stderr
    for rank, (resumed, original) in enumerate(resume(tmp_path / "back", tmp_path / "resumed")):
        assert sorted(resumed["params"]) == sorted(original["params"])
        for name, p in original["params"].items():
            bits(resumed["params"][name], p, f"rank {rank} {name}")
        got, want = resumed["state"], original["state"]
        assert sorted(got["state"]) == sorted(want["state"]) and len(want["state"]) > 10
        for i, one in want["state"].items():
            assert sorted(got["state"][i]) == sorted(one) == ["exp_avg", "exp_avg_sq", "step"]
            for key, v in one.items():
                bits(got["state"][i][key], v, f"rank {rank} state {i}.{key}")
        assert [{k: v for k, v in g.items() if k != "params"} for g in got["param_groups"]] == [
            {k: v for k, v in g.items() if k != "params"} for g in want["param_groups"]]


@pytest.mark.parametrize("case", ["no group keys", "steps differ"])
def test_a_state_megatron_cannot_load_is_refused(tmp_path: Path, case: str) -> None:
    """Into a torch_dist target, a torch optimizer's groups (no wd_mult, ...: megatron-core's load could not
    match them) or per-parameter steps that differ (megatron keeps one) are refused in one line."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    names = ["decoder.layers.mlp.linear_fc2.weight", "decoder.final_layernorm.weight"]
    shapes = {names[0]: (2, 4, 8), names[1]: (8,)}
    group: dict[str, Any] = {"lr": 0.1, "params": names}
    if case == "steps differ":
        group.update(wd_mult=1.0, lr_mult=1.0, is_expert_parallel=False, is_decoupled_lr=False)
    state = {n: {"step": torch.tensor(float(i + 1) if case == "steps differ" else 1.0),
                 "exp_avg": torch.randn(shapes[n]), "exp_avg_sq": torch.rand(shapes[n])} for i, n in enumerate(names)}
    sd = {**{n: torch.randn(shapes[n]) for n in names}, "optimizer": {"state": state, "param_groups": [group]}}
    dcp.save(sd, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    done = migrate_in_process("convert", str(tmp_path / "ckpt"), str(tmp_path / "out"), "--to", "torch_dist",
                              "--training-state", "keep")
    line = done.stderr.strip()
    assert done.returncode != 0 and "\n" not in line and "Traceback" not in line, done.stderr
    want = "has no wd_mult, lr_mult, is_expert_parallel, is_decoupled_lr" if case == "no group keys" else (
        "megatron-core keeps one step for every parameter")
    assert want in line, line
    assert not (tmp_path / "out").exists()


def test_common_pt_holds_the_args_and_the_optimizer_together(tmp_path: Path) -> None:
    """A torch_dist target with both a config (Megatron-LM's args) and megatron's optimizer kept: one
    common.pt holds both, as Megatron-LM's checkpoints do. Oracle: torch.load."""
    import argparse

    import numpy as np

    from migrator.core.tensor import from_numpy
    from migrator.formats.dcp.megatron_optim import common_bytes
    from migrator.formats.pytorch.namespace import DtypeValue, NamespaceValue

    step = from_numpy("step", np.array(3.0, dtype=np.float32))
    groups = [{"lr": 1e-3, "betas": (0.9, 0.95), "wd_mult": 1.0, "lr_mult": 1.0, "is_expert_parallel": False,
               "is_decoupled_lr": False}]
    values = {"args": NamespaceValue({"num_layers": 2, "params_dtype": DtypeValue("bfloat16")}),
              "checkpoint_version": 3.0, "iteration": 0}
    path = tmp_path / "common.pt"
    path.write_bytes(common_bytes(values, (step, groups)))
    loaded = torch.load(path, weights_only=False)
    assert list(loaded) == ["args", "checkpoint_version", "iteration", "optimizer"]
    assert isinstance(loaded["args"], argparse.Namespace)
    assert vars(loaded["args"]) == {"num_layers": 2, "params_dtype": torch.bfloat16}
    assert loaded["checkpoint_version"] == 3.0 and loaded["iteration"] == 0
    assert torch.equal(loaded["optimizer"]["state"]["common_step"], torch.tensor(3.0))
    assert loaded["optimizer"]["param_groups"] == groups
