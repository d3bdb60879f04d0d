"""Per-rank torch.save files of FSDP1 ShardedTensors (SHARDED_STATE_DICT) read as one checkpoint.

Oracles: files each rank writes with torch.save of FSDP1's own state dicts on 2 gloo ranks
(`tests.support.fsdp1`), the FULL_STATE_DICT FSDP gathers on the same ranks (the model) and each
ShardedTensor's own `gather` there (the model and the optimizer state). Bad
input goes through `migrate convert`: exit 1, one line naming the file (and tensor), nothing written.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from migrator.core.errors import UnsafePickleError
from migrator.files.io import open_file
from migrator.formats import safepickle as sp
from tests.support.cli import convert_clean, convert_refused
from tests.support.fsdp1 import write_fsdp1_checkpoints

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fsdp1_checkpoints(tmp_path_factory.mktemp("fsdp1"))


@pytest.fixture(scope="module")
def full(ckpt: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = torch.load(ckpt / "full.pt", weights_only=True)
    return loaded


@pytest.fixture(scope="module")
def gathered(ckpt: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = torch.load(ckpt / "gathered.pt", weights_only=True)
    return loaded


convert = convert_clean


@pytest.mark.parametrize("how", ["folder", "glob", "one file"])
def test_rank_files_join_into_the_full_state_dict(ckpt: Path, full: dict[str, Any], gathered: dict[str, Any],
                                                   tmp_path: Path, how: str) -> None:
    sharded = ckpt / "sharded"
    src = {"folder": sharded, "glob": sharded / "model_rank*.pt", "one file": sharded / "model_rank1.pt"}[how]
    out = tmp_path / "model.safetensors"
    code, stderr = convert(src, out)
    assert code == 0, stderr
    got = st_torch.load_file(out)
    assert sorted(got) == sorted(full["model"])
    for k, v in full["model"].items():
        assert torch.equal(got[k], v), k
        assert torch.equal(got[k], gathered["model"][k]), k


def test_order_shapes_and_ranks(ckpt: Path, full: dict[str, Any]) -> None:
    with open_file(ckpt / "sharded") as r:
        assert r.names() == list(full["model"])  # the state dict's order, a tensor rank 1 has no shard of too
        assert r.extra()["world_size"] == 2
        assert r.extra()["container"] == "sharded_tensor_ranks"
        assert r["5.weight"].shape == (1, 5)  # one row: rank 1 holds no shard of it
        assert r["1.num_batches_tracked"].dtype.name == "I64"  # a buffer: a plain tensor on every rank


def test_a_pt_target_loads_into_the_unwrapped_model(ckpt: Path, full: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "model.pt"
    code, stderr = convert(ckpt / "sharded", out)
    assert code == 0, stderr
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 5), torch.nn.ReLU(), torch.nn.Linear(5, 1))
    model.load_state_dict(torch.load(out, weights_only=True))
    for k, v in model.state_dict().items():
        assert torch.equal(v, full["model"][k]), k


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, name + "."))
        elif isinstance(v, torch.Tensor):
            out[name] = v
    return out


def test_sharded_optimizer_state_joins_into_the_gathered_one(ckpt: Path, full: dict[str, Any],
                                                              gathered: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "optim.safetensors"
    code, stderr = convert(ckpt / "optim", out)
    assert code == 0, stderr
    got = st_torch.load_file(out)
    want = _flat(gathered["optim"]["state"], "state.")
    assert sorted(got) == sorted(want) == sorted(_flat(full["optim"]["state"], "state."))
    for k, v in want.items():
        assert torch.equal(got[k], v), k
        if not k.endswith(".exp_avg"):  # see tests/support/fsdp1.py: FSDP's full exp_avg repeats exp_avg_sq
            assert torch.equal(got[k], _flat(full["optim"]["state"], "state.")[k]), k
    assert any(v.abs().sum() > 0 for k, v in want.items() if k.endswith("exp_avg"))  # one step was taken
    assert not torch.equal(want["state.0.weight.exp_avg"], want["state.0.weight.exp_avg_sq"])


def test_a_training_checkpoint_per_rank_with_a_top_level_key(ckpt: Path, gathered: dict[str, Any],
                                                               tmp_path: Path) -> None:
    out = tmp_path / "model.safetensors"
    code, stderr = convert(ckpt / "both", out, "--top-level-key", "model")
    assert code == 0, stderr
    got = st_torch.load_file(out)
    assert sorted(got) == sorted(gathered["model"])
    for k, v in gathered["model"].items():
        assert torch.equal(got[k], v), k
    with open_file(ckpt / "both" / "checkpoint-rank-0.pt") as r:
        assert r.scalars["epoch"].value == 3
        assert torch.equal(torch.from_numpy(r["optim.state.3.weight.exp_avg_sq"].numpy().copy()),
                           gathered["optim"]["state"]["3.weight"]["exp_avg_sq"])


refused = convert_refused


def _copy(ckpt: Path, tmp_path: Path, names: dict[str, str], kind: str = "sharded") -> Path:
    d = tmp_path / "ranks"
    d.mkdir()
    for src, dst in names.items():
        shutil.copy(ckpt / kind / src, d / dst)
    return d


def test_missing_rank(ckpt: Path, tmp_path: Path) -> None:
    d = _copy(ckpt, tmp_path, {"model_rank0.pt": "model_rank0.pt"})
    refused(d, tmp_path, "rank 1 of 2 is missing", "model_rank1.pt not found")
    refused(d / "model_rank0.pt", tmp_path, "rank 1 of 2 is missing")


def test_a_truncated_rank_file(ckpt: Path, tmp_path: Path) -> None:
    d = _copy(ckpt, tmp_path, {"model_rank0.pt": "model_rank0.pt", "model_rank1.pt": "model_rank1.pt"})
    data = (d / "model_rank1.pt").read_bytes()
    (d / "model_rank1.pt").write_bytes(data[: len(data) // 2])
    refused(d, tmp_path, "model_rank1.pt")


def test_missing_rank_0(ckpt: Path, tmp_path: Path) -> None:
    d = _copy(ckpt, tmp_path, {"model_rank1.pt": "model_rank1.pt"})
    refused(d / "model_rank1.pt", tmp_path, "rank 0 of 2 is missing", "model_rank0.pt not found")


def test_extra_rank(ckpt: Path, tmp_path: Path) -> None:
    d = _copy(ckpt, tmp_path, {"model_rank0.pt": "model_rank0.pt", "model_rank1.pt": "model_rank1.pt"})
    shutil.copy(d / "model_rank1.pt", d / "model_rank2.pt")
    refused(d, tmp_path, "extra rank file model_rank2.pt", "rank 2 of a world of 2 ranks")


def test_a_rank_twice(ckpt: Path, tmp_path: Path) -> None:
    d = _copy(ckpt, tmp_path, {"model_rank0.pt": "model_rank0.pt", "model_rank1.pt": "model_rank1.pt"})
    shutil.copy(d / "model_rank1.pt", d / "model_rank01.pt")
    refused(d, tmp_path, "rank 1 twice")


def test_swapped_ranks(ckpt: Path, tmp_path: Path) -> None:
    d = _copy(ckpt, tmp_path, {"model_rank0.pt": "model_rank1.pt", "model_rank1.pt": "model_rank0.pt"})
    refused(d, tmp_path, "model_rank0.pt holds the shards of rank 1, not of rank 0")


@pytest.mark.parametrize(("kind", "words"), [
    ("overlap", ("'0.weight'", "chunks overlap", "model_rank1.pt")),
    ("hole", ("'0.weight'", "hole: rows 7..7")),
    ("disagree", ("'0.weight'", "rank 1's ShardedTensor disagrees with rank 0's", "model_rank1.pt")),
    ("fewer", ("'3.bias'", "rank 1 and rank 0 hold different tensors", "only in model_rank0.pt")),
])
def test_inconsistent_ranks(ckpt: Path, tmp_path: Path, kind: str, words: tuple[str, ...]) -> None:
    refused(ckpt / kind, tmp_path, *words)


def test_the_overlap_fixture_is_an_overlap(ckpt: Path) -> None:
    """The bad fixtures say what the test says they do: read the metadata as data."""
    with _pytorch(ckpt / "overlap" / "model_rank0.pt") as r:
        shards = r.sharded_layouts["0.weight"].shards
        assert [(s.offsets, s.sizes, s.rank) for s in shards] == [((0, 0), (10, 8), 0), ((6, 0), (10, 8), 1)]


def _pytorch(path: Path) -> Any:
    from migrator.core.bytesource import FileSource
    from migrator.formats.pytorch.reader import PytorchReader

    return PytorchReader(FileSource(path), dtensor_shards=True)


def test_local_state_dict_is_refused_with_what_to_save(ckpt: Path, tmp_path: Path) -> None:
    line = refused(ckpt / "local", tmp_path, "pytorch_model_fsdp_rank0.bin", "_flat_param", "LOCAL_STATE_DICT",
                   "cannot be consolidated", "SHARDED_STATE_DICT", "FULL_STATE_DICT")
    assert "tensor '0._flat_param'" in line
    refused(ckpt / "local" / "pytorch_model_fsdp_rank1.bin", tmp_path, "LOCAL_STATE_DICT")


def test_a_rank_file_under_another_name_is_refused_alone(ckpt: Path, tmp_path: Path) -> None:
    shutil.copy(ckpt / "sharded" / "model_rank0.pt", tmp_path / "weights.pt")
    refused(tmp_path / "weights.pt", tmp_path, "weights.pt", "ShardedTensors", "every rank's file")


def test_a_plain_file_named_like_a_rank_file_is_an_ordinary_file(full: dict[str, Any], tmp_path: Path) -> None:
    torch.save(full["model"], tmp_path / "model_rank0.pt")  # rank 0 saved the whole model: no set to join
    with open_file(tmp_path / "model_rank0.pt") as r:
        assert r.names() == list(full["model"])
        assert r.extra()["container"] == "zip"


def test_only_shardedtensors_getattr_is_read() -> None:
    """The one getattr torch pickles (ShardedTensor.ProcessGroupState) becomes a record; any other is
    refused as code."""
    st = b"ctorch.distributed._shard.sharded_tensor.api\nShardedTensor\n"
    ok = b"\x80\x02c__builtin__\ngetattr\n" + st + b"X\x11\x00\x00\x00ProcessGroupState\x86R)\x81."
    rec = sp.load(ok)
    assert rec.name.endswith("ShardedTensor.ProcessGroupState")
    for bad in (b"\x80\x02c__builtin__\ngetattr\n" + st + b"X\x08\x00\x00\x00__init__\x86R.",
                b"\x80\x02c__builtin__\ngetattr\ncos\nenviron\nX\x03\x00\x00\x00get\x86R."):
        with pytest.raises(UnsafePickleError, match="getattr"):
            sp.load(bad)


@pytest.fixture(scope="module")
def dtensors(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.dist import write_checkpoints

    return write_checkpoints(tmp_path_factory.mktemp("dist"))


def test_dtensor_files_under_rank_names_join_too(dtensors: Path, tmp_path: Path) -> None:
    """verl's DTensor files renamed `model_rank<K>.pt`: a set by their content, the world size the mesh's."""
    d = tmp_path / "ranks"
    d.mkdir()
    for k in (0, 1):
        shutil.copy(dtensors / "verl" / f"model_world_size_2_rank_{k}.pt", d / f"model_rank{k}.pt")
    out = tmp_path / "model.safetensors"
    code, stderr = convert(d / "model_rank0.pt", out)
    assert code == 0, stderr
    got = st_torch.load_file(out)
    full = torch.load(dtensors / "full.pt", weights_only=True)["model"]
    assert sorted(got) == sorted(full)
    for k, v in full.items():
        assert torch.equal(got[k], v), k
    out.unlink()
    (d / "model_rank1.pt").unlink()
    refused(d, tmp_path, "rank 1 of 2 is missing", "model_rank1.pt not found")


def test_a_folder_reads_the_set_that_holds_shards(ckpt: Path, full: dict[str, Any], tmp_path: Path) -> None:
    """Beside other `...rank<K>...` files (plain ones, another checkpoint), the model's set is read; two
    sets of shards, neither the model's, are refused, asking for a glob."""
    d = _copy(ckpt, tmp_path, {"model_rank0.pt": "model_rank0.pt", "model_rank1.pt": "model_rank1.pt"})
    for k in (0, 1):
        torch.save({"seed": torch.tensor(k)}, d / f"rng_rank{k}.pt")  # plain tensors: not a set of shards
        shutil.copy(ckpt / "optim" / f"optim_rank{k}.pt", d / f"optim_rank{k}.pt")
    with open_file(d) as r:
        assert r.names() == list(full["model"])
    for k in (0, 1):
        (d / f"model_rank{k}.pt").rename(d / f"weights_rank{k}.pt")
    refused(d, tmp_path, "several checkpoints", "optim_rank*.pt", "weights_rank*.pt", "glob")
    with open_file(d / "weights_rank*.pt") as r:
        assert r.names() == list(full["model"])


def test_shardedtensor_files_under_verl_names(ckpt: Path, full: dict[str, Any], tmp_path: Path) -> None:
    """verl's names (the world size in them) holding ShardedTensors: joined by their metadata."""
    d = _copy(ckpt, tmp_path, {f"model_rank{k}.pt": f"model_world_size_2_rank_{k}.pt" for k in (0, 1)})
    with open_file(d) as r:
        assert r.extra()["container"] == "sharded_tensor_ranks"
        assert r.names() == list(full["model"])
        for k, v in full["model"].items():
            assert torch.equal(torch.from_numpy(r[k].numpy().copy()), v), k


def _edited(src: Path, dst: Path, old: bytes, new: bytes) -> None:
    """`src` with its pickle's bytes `old` replaced by `new` (same length), the archive rewritten."""
    import zipfile

    assert len(old) == len(new)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("data.pkl"):
                assert old in data
                data = data.replace(old, new)
            zout.writestr(info, data)


@pytest.mark.parametrize(("old", "new", "words"), [
    (b"shard_offsets", b"shard_offsetz", ("'0.weight'", "without 2 offsets, 2 sizes and a rank placement")),
    (b"shards_metadata", b"shards_metadatz", ("'0.weight'", "without the metadata of its shards")),
    (b"ProcessGroupState", b"ProcessGroupStatf", ("refusing to call 'builtins.getattr'",)),
    (b"_rank", b"_ranx", ("'0.weight'", "rank placement")),
    (b"_remote_device", b"_remote_devicf", ("refusing to call 'torch.distributed.remote_device._remote_devicf'",)),
])
def test_malformed_shardedtensor_pickles(ckpt: Path, tmp_path: Path, old: bytes, new: bytes,
                                         words: tuple[str, ...]) -> None:
    d = tmp_path / "ranks"
    d.mkdir()
    shutil.copy(ckpt / "sharded" / "model_rank1.pt", d / "model_rank1.pt")
    _edited(ckpt / "sharded" / "model_rank0.pt", d / "model_rank0.pt", old, new)
    refused(d, tmp_path, "model_rank0.pt", *words)
