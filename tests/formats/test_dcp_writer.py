"""DCP checkpoints written by migrator, read by torch: the `dcp` target.

Oracles: `torch.distributed.checkpoint.load` with no process group and on 2 gloo ranks into plain
tensors (equal bit for bit to the source), into an FSDP2-sharded transformers Llama (a torchtitan
seed checkpoint, gathered whole again); `dcp_to_torch_save`; the `.metadata` torch itself writes for
the same state dict (`dcp.save`, compared as unpickled dataclasses); a training checkpoint stepped by
torch's Adam, put through a recipe (a rename and a split) into DCP and resumed on 2 ranks with
`set_state_dict`, then stepped once more: equal bit for bit to the original stepped and cut the
same way in torch. migrator's own reader reads every output back.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process
from tests.support.dcp_write import new_model, old_model, run_ranks

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
transformers = pytest.importorskip("transformers")
st_torch = pytest.importorskip("safetensors.torch")

NAMES = ("resume-dcp", "resume-pt", "resume-ints")
"""The recipe's outputs from a DCP source, a .pt keyed by names, a .pt of optimizer.state_dict() (numbers)."""

pytestmark = pytest.mark.slow  # two spawned ranks importing transformers: ~20 s under load

RECIPE = """version: 1
source: {{path: {source}, top_level_key: model}}
training_state: keep
remap:
  - {{from: '^fc1\\.', to: 'inp.'}}
ops:
  - split: {{from: 'qkv\\.(weight|bias)', dim: 0, parts: 3, to: ['q.$1', 'k.$1', 'v.$1']}}
target: {{path: {target}, format: dcp}}
"""


def run(*args: str) -> tuple[int, str, str]:
    p = migrate_in_process(*args)
    assert "Traceback" not in p.stdout + p.stderr, p.stderr
    return p.returncode, p.stdout, p.stderr


def bits(a: Any, b: Any, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), what


def surgery(sd: dict[str, Any]) -> dict[str, Any]:
    """The recipe's rename and split, done in torch to a dict by the old model's names."""
    out: dict[str, Any] = {}
    for name, t in sd.items():
        if name.startswith("qkv."):
            for part, piece in zip("qkv", torch.chunk(t, 3, 0), strict=True):
                out[f"{part}.{name[4:]}"] = piece.clone()
        else:
            out[name.replace("fc1.", "inp.")] = t
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny Llama folder converted to DCP, a training checkpoint put through the recipe (from a DCP
    and from a .pt), then every 2-rank check run once (`tests.support.dcp_write`)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = tmp_path_factory.mktemp("dcpw")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=96)
    transformers.LlamaForCausalLM(config).save_pretrained(root / "hf")
    code, _, err = run("convert", str(root / "hf"), str(root / "llama-dcp") + "/", "--to", "dcp")
    assert code == 0, err
    # a model trained one Adam step, saved as get_state_dict lays it out (in DCP and as a .pt), and as
    # torch's own optimizer.state_dict() (ids numbered, with param_names)
    torch.manual_seed(3)
    model = old_model()
    opt = torch.optim.Adam(model.named_parameters(), lr=1e-2)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(root / "train-dcp"), no_dist=True)
    torch.save({"model": msd, "optim": osd}, root / "train.pt")
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, root / "train-ints.pt")
    for source, target in (("train-dcp", "resume-dcp"), ("train.pt", "resume-pt"), ("train-ints.pt", "resume-ints")):
        (root / f"{target}.yaml").write_text(RECIPE.format(source=source, target=target))
        code, _, err = run("run", str(root / f"{target}.yaml"))
        assert code == 0, err
    # step 2's gradients, by the new model's names; the oracle: the old model steps with them, then is cut
    grads = {n: torch.randn_like(p) for n, p in new_model().named_parameters()}
    torch.save(grads, root / "grads.pt")
    old_grads = {n: torch.cat([grads[f"{x}.{n[4:]}"] for x in "qkv"]) if n.startswith("qkv.")
                 else grads[n.replace("fc1.", "inp.")] for n, _ in model.named_parameters()}
    for n, p in model.named_parameters():
        p.grad = old_grads[n]
    opt.step()
    run_ranks(root)
    return {"root": root, "oracle": model, "opt": opt}


def test_convert_then_dcp_load_without_a_process_group(made: dict[str, Any]) -> None:
    root = made["root"]
    assert sorted(os.listdir(root / "llama-dcp")) == [".metadata", "__0_0.distcp"]
    source = st_torch.load_file(str(root / "hf" / "model.safetensors"))
    into = {k: torch.zeros_like(v) for k, v in source.items()}
    dcp.load(into, checkpoint_id=str(root / "llama-dcp"), no_dist=True)
    for k, v in source.items():
        bits(into[k], v, k)


def test_dcp_to_torch_save_and_migrators_reader_equal_the_source(made: dict[str, Any], tmp_path: Path) -> None:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from migrator.files.io import open_file

    root = made["root"]
    source = st_torch.load_file(str(root / "hf" / "model.safetensors"))
    dcp_to_torch_save(root / "llama-dcp", tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    assert sorted(whole) == sorted(source)
    for k, v in source.items():
        bits(whole[k], v, k)
    with open_file(root / "llama-dcp") as r:
        assert r.format == "dcp" and sorted(r.keys()) == sorted(source)
        for k, v in source.items():
            bits(torch.frombuffer(bytearray(r[k].data()), dtype=v.dtype).reshape(v.shape), v, k)


def test_two_gloo_ranks_load_plain_tensors_and_an_fsdp2_llama(made: dict[str, Any]) -> None:
    # `_plain` asserted on each rank; the FSDP2 model, gathered whole again, holds the source's tensors
    root = made["root"]
    source = st_torch.load_file(str(root / "hf" / "model.safetensors"))
    full = torch.load(root / "fsdp-full.pt", weights_only=True)
    assert sorted(full) == sorted(source)
    for k, v in source.items():
        bits(full[k], v, k)


def test_metadata_is_what_torch_writes_for_the_same_state_dict(tmp_path: Path) -> None:
    """Unpickled by torch, the `.metadata` equals the one `dcp.save` writes (dtypes, sizes, chunks,
    planner paths, storage keys), over dtypes, a 0-d, an empty and a large-offset-free tensor."""
    sd = {"w": torch.randn(5, 3), "h": torch.randn(4, 2).half(), "b": torch.randn(6).bfloat16(),
          "i": torch.arange(5, dtype=torch.int64), "u": torch.arange(9, dtype=torch.uint8).reshape(3, 3),
          "m": torch.tensor([True, False]), "s": torch.tensor(2.5), "e": torch.zeros(0, 4),
          "d": torch.randn(2, 2, dtype=torch.float64), "c": torch.randn(3, dtype=torch.complex64)}
    st_torch.save_file({k: v for k, v in sd.items() if k != "c"}, tmp_path / "a.safetensors")
    torch.save(sd, tmp_path / "a.pt")
    code, _, err = run("convert", str(tmp_path / "a.pt"), str(tmp_path / "ours"), "--to", "dcp")
    assert code == 0, err
    dcp.save(sd, checkpoint_id=str(tmp_path / "theirs"), no_dist=True)
    ours = pickle.loads((tmp_path / "ours" / ".metadata").read_bytes())
    theirs = pickle.loads((tmp_path / "theirs" / ".metadata").read_bytes())
    assert type(ours) is type(theirs)
    assert list(ours.state_dict_metadata) == list(sd)
    assert ours.state_dict_metadata == {k: theirs.state_dict_metadata[k] for k in sd}
    assert ours.planner_data == {k: theirs.planner_data[k] for k in sd}
    assert set(ours.storage_data) == set(theirs.storage_data)
    assert {v.relative_path for v in ours.storage_data.values()} == {"__0_0.distcp"}
    assert ours.version == theirs.version
    into = {k: torch.ones_like(v) for k, v in sd.items()}
    dcp.load(into, checkpoint_id=str(tmp_path / "ours"), no_dist=True)
    for k, v in sd.items():
        bits(into[k], v, k)


def test_training_checkpoint_through_a_recipe_resumes_on_two_ranks(made: dict[str, Any]) -> None:
    """From each source, Adam's second step on the new model (resumed by set_state_dict from migrator's DCP)
    equals the old model's second step cut the same way afterwards, bit for bit: parameters, both moments,
    step."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root, model, opt = made["root"], made["oracle"], made["opt"]
    msd, osd = get_state_dict(model, opt)
    want_model = surgery(dict(msd))
    moments = {key: surgery({n: st[key] for n, st in osd["state"].items()}) for key in ("exp_avg", "exp_avg_sq")}
    steps = {new: osd["state"][old]["step"] for old, new in (("fc1.weight", "inp.weight"), ("fc1.bias", "inp.bias"),
                                                           *((f"qkv.{s}", f"{x}.{s}") for s in ("weight", "bias")
                                                             for x in "qkv"), ("head.weight", "head.weight"),
                                                           ("head.bias", "head.bias"))}
    want_state = {n: {"step": steps[n], **{key: moments[key][n] for key in moments}} for n in want_model}
    for name in NAMES:
        got = torch.load(root / f"{name}.stepped.pt", weights_only=True)
        assert sorted(got["model"]) == sorted(want_model), name
        for k, v in want_model.items():
            bits(got["model"][k], v, f"{name} {k}")
        assert sorted(got["optim"]["state"]) == sorted(want_state), name
        for k, v in want_state.items():
            for key in ("exp_avg", "exp_avg_sq", "step"):
                bits(got["optim"]["state"][k][key], v[key], f"{name} {k}.{key}")
        (group,) = got["optim"]["param_groups"]
        assert group["lr"] == 1e-2 and group["betas"] == (0.9, 0.999)


def test_the_optimizer_is_under_dcps_flattened_names(made: dict[str, Any]) -> None:
    """The keys (and nested paths) torch's own dcp.save gives get_state_dict's output of the new model."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = made["root"]
    model = new_model()
    opt = torch.optim.Adam(model.named_parameters(), lr=1e-2)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(root / "new-by-torch"), no_dist=True)
    theirs = pickle.loads((root / "new-by-torch" / ".metadata").read_bytes())
    for name in NAMES:
        ours = pickle.loads((root / name / ".metadata").read_bytes())
        assert set(ours.state_dict_metadata) == set(theirs.state_dict_metadata), name
        assert {k: ours.planner_data[k] for k in theirs.planner_data} == theirs.planner_data, name
        for k, v in theirs.state_dict_metadata.items():
            assert type(ours.state_dict_metadata[k]) is type(v), k
