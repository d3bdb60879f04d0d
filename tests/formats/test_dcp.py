"""PyTorch Distributed Checkpoint folders as sources: consolidated as torch's own `dcp_to_torch_save`.

Oracles: checkpoints written by `torch.distributed.checkpoint.save` on 2 gloo ranks (`tests.support.dist`),
`torch.distributed.checkpoint.format_utils.dcp_to_torch_save` (the whole checkpoint, compared with a
`.pt` target loaded by `torch.load(weights_only=True)`), the tensors gathered whole by each rank's
`full_tensor()`, and the `safetensors` library reading the outputs back. Bad input goes through
`migrate convert`: exit 1, one line, nothing written, no code run.
"""

from __future__ import annotations

import os
import pickle
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process
from tests.support.dist import write_checkpoints

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")
st_torch = pytest.importorskip("safetensors.torch")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoints(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def oracle(ckpt: Path) -> Any:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = ckpt / "oracle.pt"
    dcp_to_torch_save(ckpt / "dcp", out)
    return torch.load(out, weights_only=True)


def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Tensors of a nested state dict by DCP's dotted names."""
    out: dict[str, Any] = {}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for k, v in items:
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, torch.Tensor):
            out[name] = v
        else:
            out.update(flat(v, name))
    return out


def same(a: Any, b: Any, path: str = "") -> None:
    """Equal as loaded state dicts: types, key order, tensors bit for bit."""
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}.{i}")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), path  # bits, NaN too
    else:
        assert a == b, path


def run(*args: str) -> tuple[int, str, str]:
    p = migrate_in_process(*args)
    assert "Traceback" not in p.stdout + p.stderr, p.stderr
    return p.returncode, p.stdout, p.stderr


def test_reader_tensors_equal_torch_consolidation_and_the_unsharded_ones(ckpt: Path, oracle: Any) -> None:
    from migrator.files.io import open_file

    full = flat(torch.load(ckpt / "full.pt", weights_only=True))
    expected = flat(oracle)
    with open_file(ckpt / "dcp") as r:
        assert r.format == "dcp"
        assert sorted(r.names()) == sorted(expected)
        for t in r.tensors:
            got = torch.from_numpy(t.numpy().copy())
            assert torch.equal(got, expected[t.name]), t.name
            if t.name in full:  # the optimizer's steps: scalars DCP keeps whole
                assert torch.equal(got, full[t.name]), t.name
        # the three layouts are there: rows (Shard(0)), columns (Shard(1)), replicated
        assert r.extra()["chunks"]["model.0.weight"] == 2
        assert r.extra()["chunks"]["model.2.weight"] == 2
        assert r.extra()["chunks"]["model.3.weight"] == 1
        assert r.scalars["optim.param_groups.0.lr"].value == oracle["optim"]["param_groups"][0]["lr"]


def test_metadata_path_opens_the_folder(ckpt: Path) -> None:
    from migrator.files.io import open_file

    with open_file(ckpt / "dcp" / ".metadata") as r:
        assert "model.2.weight" in r


def test_whole_checkpoint_to_pt_equals_dcp_to_torch_save(ckpt: Path, oracle: Any, tmp_path: Path) -> None:
    out = tmp_path / "whole.pt"
    code, _, stderr = run("convert", str(ckpt / "dcp"), str(out))
    assert code == 0, stderr
    same(torch.load(out, weights_only=True), oracle)


def test_model_to_safetensors_with_top_level_key(ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "model.safetensors"
    code, _, stderr = run("convert", str(ckpt / "dcp"), str(out), "--top-level-key", "model")
    assert code == 0, stderr
    got = st_torch.load_file(out)
    full = torch.load(ckpt / "full.pt", weights_only=True)["model"]
    assert sorted(got) == sorted(full)
    for k, v in full.items():
        assert torch.equal(got[k], v), k


def test_recipe_source_path_with_top_level_key_and_a_cast(ckpt: Path, tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    out = tmp_path / "model-bf16.safetensors"
    recipe.write_text(f"version: 1\nsource:\n  path: {ckpt / 'dcp'}\n  top_level_key: model\n"
                      f"dtype: {{cast: BF16}}\ntarget:\n  path: {out}\n")
    code, _, stderr = run("run", str(recipe))
    assert code == 0, stderr
    got = st_torch.load_file(out)
    full = torch.load(ckpt / "full.pt", weights_only=True)["model"]
    for k, v in full.items():
        assert torch.equal(got[k], v.to(torch.bfloat16)), k


def test_inspect_lists_global_shapes(ckpt: Path) -> None:
    code, stdout, stderr = run("inspect", str(ckpt / "dcp"))
    assert code == 0, stderr
    assert "model.2.weight" in stdout and "6, 16" in stdout.replace("[", "").replace("]", "")


# ---------------------------------------------------------------------------------------------------
# bad input


def copy_dcp(ckpt: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "bad"
    shutil.copytree(ckpt / "dcp", dst)
    return dst


def rewrite_metadata(folder: Path, change: Any) -> None:
    with open(folder / ".metadata", "rb") as f:
        meta = pickle.load(f)  # the test's own file: torch's classes are the writer here
    change(meta)
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(meta, f)


def refused(folder: Path | str, tmp_path: Path, *words: str) -> str:
    out = tmp_path / "out.safetensors"
    code, stdout, stderr = run("convert", str(folder), str(out))
    assert code == 1, (stdout, stderr)
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert not out.exists()
    return lines[0]


def test_truncated_distcp(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_dcp(ckpt, tmp_path)
    victim = bad / "__1_0.distcp"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    refused(bad, tmp_path, "__1_0.distcp")


def test_overlapping_chunks(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_dcp(ckpt, tmp_path)

    def overlap(meta: Any) -> None:
        chunks = meta.state_dict_metadata["model.2.weight"].chunks
        chunks[1].offsets = torch.Size([0, 4])  # columns 4..7 are in both chunks (and 12..15 in none)
        for key in list(meta.storage_data):
            if key.fqn == "model.2.weight" and key.offset == torch.Size([0, 8]):
                meta.storage_data[replace(key, offset=torch.Size([0, 4]))] = meta.storage_data.pop(key)

    rewrite_metadata(bad, overlap)
    refused(bad, tmp_path, "model.2.weight", "overlap")


def test_holes(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_dcp(ckpt, tmp_path)
    rewrite_metadata(bad, lambda meta: meta.state_dict_metadata["model.0.weight"].chunks.pop())
    refused(bad, tmp_path, "model.0.weight", "hole")


def test_missing_storage_file(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_dcp(ckpt, tmp_path)
    (bad / "__0_0.distcp").unlink()
    refused(bad, tmp_path, "__0_0.distcp", "missing")


class Evil:
    """Runs a command if unpickled by Python's pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


def test_metadata_that_runs_code_runs_none(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_dcp(ckpt, tmp_path)
    marker = tmp_path / "ran"

    def plant(meta: Any) -> None:
        meta.storage_meta.modules = [Evil(marker)]

    rewrite_metadata(bad, plant)
    refused(bad, tmp_path, ".metadata", "system")
    assert not marker.exists()


def test_metadata_with_another_class(ckpt: Path, tmp_path: Path) -> None:
    from fractions import Fraction

    bad = copy_dcp(ckpt, tmp_path)

    def plant(meta: Any) -> None:
        meta.version = Fraction(1, 3)

    rewrite_metadata(bad, plant)
    refused(bad, tmp_path, ".metadata", "fractions.Fraction", "not a DCP metadata class")


def test_storage_file_outside_the_folder(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_dcp(ckpt, tmp_path)

    def climb(meta: Any) -> None:
        for info in meta.storage_data.values():
            info.relative_path = "../elsewhere.distcp"

    rewrite_metadata(bad, climb)
    refused(bad, tmp_path, "inside the checkpoint's folder")


@pytest.mark.parametrize("named", [False, True], ids=["parameters", "named_parameters"])
def test_two_param_groups_in_another_order_equal_dcp_to_torch_save(tmp_path: Path, named: bool) -> None:
    """Two param groups whose parameters are listed unlike the model (biases and the norm first, then
    the matrices last-layer first): the state's keys and each group's `params` come out in the order
    torch's `dcp_to_torch_save` writes them (the saved order), not in the model's; with param_names
    saved too, the ids stay names. One process: DCP saves without a process group."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 2))
    pairs = [(n, p) if named else p for n, p in model.named_parameters()]
    dims = [p.dim() for p in model.parameters()]
    opt = torch.optim.AdamW([{"params": [x for x, d in zip(pairs, dims, strict=True) if d < 2], "weight_decay": 0.0},
                             {"params": [x for x, d in zip(pairs, dims, strict=True) if d >= 2][::-1],
                              "weight_decay": 0.1}], lr=1e-2)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd, "epoch": 1}, checkpoint_id=str(tmp_path / "ckpt"))
    dcp_to_torch_save(tmp_path / "ckpt", tmp_path / "oracle.pt")
    oracle = torch.load(tmp_path / "oracle.pt", weights_only=True)
    assert [g["params"] for g in oracle["optim"]["param_groups"]] == [["0.bias", "1.weight", "1.bias", "2.bias"],
                                                                      ["2.weight", "0.weight"]]
    code, _, err = run("convert", str(tmp_path / "ckpt"), str(tmp_path / "whole.pt"))
    assert code == 0, err
    same(torch.load(tmp_path / "whole.pt", weights_only=True), oracle)
