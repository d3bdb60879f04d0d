"""Per-rank torch.save files of DTensors (verl's model_world_size_N_rank_K.pt) read as one checkpoint.

Oracles: files each rank writes with torch.save of its DTensor state dict on 2 gloo ranks
(`tests.support.dist`), and the tensors each DTensor's own `full_tensor()` gathers. Bad input goes through
`migrate convert`: exit 1, one line, nothing written.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.cli import convert_clean, convert_refused
from tests.support.dist import write_checkpoints

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoints(tmp_path_factory.mktemp("dist"))


convert = convert_clean


@pytest.mark.parametrize("how", ["folder", "glob", "one file"])
def test_rank_files_join_into_the_whole_tensors(ckpt: Path, tmp_path: Path, how: str) -> None:
    verl = ckpt / "verl"
    src = {"folder": str(verl), "glob": str(verl / "model_world_size_2_rank_*.pt"),
           "one file": str(verl / "model_world_size_2_rank_1.pt")}[how]
    out = tmp_path / "model.safetensors"
    code, stderr = convert(src, out)
    assert code == 0, stderr
    got = st_torch.load_file(out)
    full = torch.load(ckpt / "full.pt", weights_only=True)["model"]
    assert sorted(got) == sorted(full)
    for k, v in full.items():
        assert torch.equal(got[k], v), k


def test_placements_are_read(ckpt: Path) -> None:
    from migrator.files.io import open_file

    with open_file(ckpt / "verl") as r:
        assert r.extra()["world_size"] == 2
        assert r["2.weight"].shape == (6, 16)  # Shard(1): columns joined


refused = convert_refused


def copy_verl(ckpt: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "verl"
    shutil.copytree(ckpt / "verl", dst)
    return dst


def test_missing_rank(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_verl(ckpt, tmp_path)
    (bad / "model_world_size_2_rank_1.pt").unlink()
    refused(str(bad), tmp_path, "rank 1 of 2 is missing", "model_world_size_2_rank_1.pt")


def test_extra_rank(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_verl(ckpt, tmp_path)
    shutil.copy(bad / "model_world_size_2_rank_1.pt", bad / "model_world_size_2_rank_2.pt")
    refused(str(bad), tmp_path, "extra rank file model_world_size_2_rank_2.pt")


def test_ranks_swapped_disagree_with_their_placements(ckpt: Path, tmp_path: Path) -> None:
    """Rank 0's file under rank 1's name: its DTensors say they are rank 0's shards."""
    bad = copy_verl(ckpt, tmp_path)
    shutil.copy(bad / "model_world_size_2_rank_0.pt", bad / "model_world_size_2_rank_1.pt")
    refused(str(bad), tmp_path, "model_world_size_2_rank_1.pt holds the shards of rank 0")


def test_a_rank_file_under_another_name_is_refused_alone(ckpt: Path, tmp_path: Path) -> None:
    lone = tmp_path / "shard.pt"
    shutil.copy(ckpt / "verl" / "model_world_size_2_rank_0.pt", lone)
    refused(str(lone), tmp_path, "DTensors", "every rank's file")
