"""DCP written with the Hugging Face storage layout (`HuggingFaceStorageWriter(save_distributed=True)`):
each rank's chunks in SafeTensors files placed by `DCP_SHARDING_INFO`, read as one checkpoint.

Oracles: torch's own consolidation of those files (`consolidate_safetensors_files`), read by the
`safetensors` library, and the tensors torch.distributed gathered whole (`full.pt`)."""

from __future__ import annotations

import json
import shutil
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


def run(*args: str) -> tuple[int, str, str]:
    p = migrate_in_process(*args)
    assert "Traceback" not in p.stdout + p.stderr, p.stderr
    return p.returncode, p.stdout, p.stderr


def test_the_rank_files_join_as_torch_consolidates_them(ckpt: Path, tmp_path: Path) -> None:
    from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files

    full = torch.load(ckpt / "full.pt", weights_only=True)["model"]
    (tmp_path / "torch").mkdir()
    consolidate_safetensors_files(str(ckpt / "hf"), str(tmp_path / "torch"), dict.fromkeys(full, 1))
    want: dict[str, Any] = {}
    for f in (tmp_path / "torch").glob("*.safetensors"):
        want.update(st_torch.load_file(f))
    assert sorted(want) == sorted(full)
    code, _, err = run("convert", str(ckpt / "hf"), str(tmp_path / "ours.safetensors"))
    assert code == 0, err
    got = st_torch.load_file(tmp_path / "ours.safetensors")
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert torch.equal(got[k], v) and torch.equal(got[k], full[k]), k


def test_inspect_shows_global_shapes(ckpt: Path) -> None:
    full = torch.load(ckpt / "full.pt", weights_only=True)["model"]
    code, out, err = run("inspect", str(ckpt / "hf"), "--json")
    assert code == 0, err
    assert {t["name"]: t["shape"] for t in json.loads(out)["tensors"]} == {k: list(v.shape) for k, v in full.items()}


def test_a_missing_rank_file_is_named(ckpt: Path, tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    shutil.copytree(ckpt / "hf", folder)
    (folder / "shard-00001-model-00001-of-00001.safetensors").unlink()
    code, _, err = run("convert", str(folder), str(tmp_path / "o.safetensors"))
    assert code == 1 and "rank 1" in err and err.count("\n") == 1, err
    assert not (tmp_path / "o.safetensors").exists()


def test_overlapping_offsets_are_refused(ckpt: Path, tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    shutil.copytree(ckpt / "hf", folder)
    second = folder / "shard-00002-model-00001-of-00001.safetensors"
    tensors = st_torch.load_file(second)
    from safetensors import safe_open

    with safe_open(second, "pt") as f:
        meta = dict(f.metadata())
    info = json.loads(meta["DCP_SHARDING_INFO"])
    info["0.weight"]["saved_offsets"] = [4, 0]  # rank 1's rows start inside rank 0's
    meta["DCP_SHARDING_INFO"] = json.dumps(info)
    st_torch.save_file(tensors, second, metadata=meta)
    code, _, err = run("convert", str(folder), str(tmp_path / "o.safetensors"))
    assert code == 1 and "0.weight" in err and err.count("\n") == 1, err
    assert not (tmp_path / "o.safetensors").exists()
