"""Hostile many-file checkpoints (issue 41, classes 4 and 5): files found by listing a checkpoint's
folder that lead out of it through links, names that claim more files than are there, rank files of
stride-0 views that claim gigabytes only once joined.

The rule for links (SECURITY.md, `storage.paths.require_inside`): every file a source of several files
reads (listed, matched by a glob, named by an index, a `.metadata` or a `latest` file) resolves inside
the folder the source names; the one exception is a Hugging Face cache snapshot's own links into its
repository's `blobs/`, which still read (the last tests, against the tensors the set was cut from).

Every refusal goes through the command line and is held to the shared promises
(`hostile.refused`): exit 1 or 2, one line naming the file or set, no traceback, nothing
written, every input and an existing target unchanged, bounded time; the claimed-size cases also run
under tracemalloc, bounding what was allocated."""

from __future__ import annotations

import json
import os
import shutil
import tracemalloc
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from migrator import from_numpy, save
from tests.support.hostile import refused
from tests.support.rank_sets import ZERO_MODEL, ZERO_STEP, fsdp1_set, zero_optim_name, zero_step

torch = pytest.importorskip("torch")

W = np.arange(32, dtype=np.float32).reshape(8, 4)


def hf_name(rank: int, shard: int = 1, shards: int = 1) -> str:
    return f"shard-{rank:05d}-model-{shard:05d}-of-{shards:05d}.safetensors"


def hf_set(folder: Path) -> Path:
    """Two ranks of DCP's Hugging Face layout: rows 0..3 of W in rank 1's file, 4..7 in rank 2's."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in (1, 2):
        info = json.dumps({"w": {"saved_offsets": [4 * (rank - 1), 0]}})
        save([from_numpy("w", W[4 * (rank - 1):4 * rank])], folder / hf_name(rank),
             metadata={"format": "pt", "DCP_SHARDING_INFO": info, "DCP_VERSION": "1.0"})
    return folder


@pytest.fixture(scope="module")
def fsdp1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fsdp1_set(tmp_path_factory.mktemp("fsdp1") / "ckpt")


@pytest.fixture(scope="module")
def dcp_good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch.distributed.checkpoint as dcp

    folder = tmp_path_factory.mktemp("dcp") / "ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.arange(12.0).reshape(3, 4)}, checkpoint_id=str(folder))
    return folder


def move_out(folder: Path, name: str, outside: Path) -> None:
    """`folder/name` moved to `outside/name` and replaced by a link to it (same bytes, read through a link)."""
    outside.mkdir(parents=True, exist_ok=True)
    shutil.move(folder / name, outside / name)
    (folder / name).symlink_to(outside / name)


Make = Callable[[Path, Path, Path], str]  # (watched root, fsdp1 set, dcp set) -> the source given


def fsdp1_link(root: Path, fsdp1: Path, dcp: Path) -> str:
    shutil.copytree(fsdp1, root / "ckpt")
    move_out(root / "ckpt", "model_rank1.pt", root / "outside")
    return str(root / "ckpt")


def fsdp1_glob_link(root: Path, fsdp1: Path, dcp: Path) -> str:
    return fsdp1_link(root, fsdp1, dcp) + "/model_rank*.pt"


def fsdp1_one_file_link(root: Path, fsdp1: Path, dcp: Path) -> str:
    return fsdp1_link(root, fsdp1, dcp) + "/model_rank0.pt"


def verl_link(root: Path, fsdp1: Path, dcp: Path) -> str:
    (root / "ckpt").mkdir()
    for k in (0, 1):
        shutil.copy(fsdp1 / f"model_rank{k}.pt", root / "ckpt" / f"model_world_size_2_rank_{k}.pt")
    move_out(root / "ckpt", "model_world_size_2_rank_1.pt", root / "outside")
    return str(root / "ckpt")


def hf_layout_link(root: Path, fsdp1: Path, dcp: Path) -> str:
    hf_set(root / "ckpt")
    move_out(root / "ckpt", hf_name(2), root / "outside")
    return str(root / "ckpt")


def hf_layout_sharded_folder_link(root: Path, fsdp1: Path, dcp: Path) -> str:
    hf_set(root / "outside" / "sharded")
    (root / "ckpt").mkdir()
    (root / "ckpt" / "sharded").symlink_to(root / "outside" / "sharded")
    return str(root / "ckpt")


def distcp_link(root: Path, fsdp1: Path, dcp: Path) -> str:
    shutil.copytree(dcp, root / "ckpt")
    item = next(n for n in os.listdir(root / "ckpt") if n.endswith(".distcp"))
    move_out(root / "ckpt", item, root / "outside")
    return str(root / "ckpt")


def dcp_metadata_link(root: Path, fsdp1: Path, dcp: Path) -> str:
    shutil.copytree(dcp, root / "ckpt")
    move_out(root / "ckpt", ".metadata", root / "outside")
    return str(root / "ckpt")


def zero_latest_step_link(root: Path, fsdp1: Path, dcp: Path) -> str:
    zero_step(root / "outside")
    (root / "ckpt").mkdir()
    (root / "ckpt" / "latest").write_text(ZERO_STEP)
    (root / "ckpt" / ZERO_STEP).symlink_to(root / "outside" / ZERO_STEP)
    return str(root / "ckpt")


def zero_state_file_link(root: Path, fsdp1: Path, dcp: Path) -> str:
    zero_step(root / "ckpt")
    step = root / "ckpt" / ZERO_STEP
    move_out(step, zero_optim_name(1), root / "outside")
    return str(root / "ckpt")


def zero_model_file_link(root: Path, fsdp1: Path, dcp: Path) -> str:
    zero_step(root / "ckpt")
    move_out(root / "ckpt" / ZERO_STEP, ZERO_MODEL, root / "outside")
    return str(root / "ckpt")


def safetensors_folder_link(root: Path, fsdp1: Path, dcp: Path) -> str:
    (root / "ckpt").mkdir()
    save([from_numpy("w", W)], root / "ckpt" / "model.safetensors")
    move_out(root / "ckpt", "model.safetensors", root / "outside")
    return str(root / "ckpt")


def safetensors_glob_link(root: Path, fsdp1: Path, dcp: Path) -> str:
    (root / "ckpt").mkdir()
    save([from_numpy("a", W)], root / "ckpt" / "a.safetensors")
    save([from_numpy("b", W)], root / "ckpt" / "b.safetensors")
    move_out(root / "ckpt", "b.safetensors", root / "outside")
    return str(root / "ckpt" / "*.safetensors")


LINKS: dict[str, Make] = {f.__name__: f for f in (
    fsdp1_link, fsdp1_glob_link, fsdp1_one_file_link, verl_link, hf_layout_link, hf_layout_sharded_folder_link,
    distcp_link, dcp_metadata_link, zero_latest_step_link, zero_state_file_link, zero_model_file_link,
    safetensors_folder_link, safetensors_glob_link)}


@pytest.mark.parametrize("case", sorted(LINKS))
def test_a_file_listed_in_a_checkpoint_may_not_lead_out_of_it(case: str, tmp_path: Path, fsdp1: Path,
                                                             dcp_good: Path) -> None:
    root = tmp_path / "w"
    root.mkdir()
    src = LINKS[case](root, fsdp1, dcp_good)
    target = root / "out.safetensors"
    target.write_bytes(b"the user's own file")
    refused(["convert", src, str(target), "--overwrite"], root, words="leads out of")


# -- sizes claimed by names and views


def _peak_bytes(run: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("count", [10_000_000, 999_999_999])
def test_a_name_claiming_millions_of_shards_allocates_nothing(count: int, tmp_path: Path) -> None:
    root = tmp_path / "w"
    folder = hf_set(root / "ckpt")
    (folder / hf_name(1)).rename(folder / f"shard-00001-model-00001-of-{count}.safetensors")
    (folder / hf_name(2)).rename(folder / f"shard-00002-model-00001-of-{count}.safetensors")
    peak = _peak_bytes(lambda: refused(["convert", str(folder), str(root / "out.safetensors")], root,
                                       words="max_shards"))
    assert peak < 32 << 20, peak


def test_missing_files_are_named_by_arithmetic(tmp_path: Path) -> None:
    """Rank 1 has files 1 and 3 of 3: file 2 is named, whatever the count."""
    root = tmp_path / "w"
    folder = hf_set(root / "ckpt")
    shutil.copy(folder / hf_name(1), folder / hf_name(1, 1, 3))
    (folder / hf_name(1)).rename(folder / hf_name(1, 3, 3))
    (folder / hf_name(2)).unlink()
    refused(["convert", str(folder), str(root / "out.safetensors")], root, words=hf_name(1, 2, 3))


def test_a_file_number_beyond_its_count_is_named(tmp_path: Path) -> None:
    root = tmp_path / "w"
    folder = hf_set(root / "ckpt")
    (folder / hf_name(2)).rename(folder / hf_name(2, 7, 1))
    refused(["convert", str(folder), str(root / "out.safetensors")], root, words=hf_name(2, 7, 1))


def test_stride0_rank_views_joined_stay_in_the_expansion_budget(tmp_path: Path) -> None:
    """Three ranks, each a stride-0 view of 512 MiB (under the 1 GiB `max_expanded_bytes` one file may
    claim): joined, 1.5 GiB claimed by 12 bytes of storage is refused, before a byte is read."""
    root = tmp_path / "w"
    folder = fsdp1_set(root / "ckpt", ranks=3, cols=1 << 13, expanded_rows=1 << 14)
    peak = _peak_bytes(lambda: refused(["convert", str(folder), str(root / "out.safetensors")], root,
                                       words="max_expanded_bytes"))
    assert peak < 64 << 20, peak


# -- the Hugging Face cache's own links still read


def _cache(root: Path) -> tuple[Path, Path]:
    repo = root / "hub" / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    return repo / "blobs", snapshot


def _into_blobs(folder: Path, blobs: Path, depth: int) -> None:
    """Every file of `folder` moved into `blobs` under a hash-like name, linked back relatively."""
    for n in sorted(os.listdir(folder)):
        blob = blobs / f"{abs(hash(n)):016x}"
        shutil.move(folder / n, blob)
        (folder / n).symlink_to(Path(*[".."] * depth) / "blobs" / blob.name)


def test_hf_layout_in_a_cache_snapshot_reads(tmp_path: Path) -> None:
    blobs, snapshot = _cache(tmp_path)
    hf_set(snapshot / "sharded")
    _into_blobs(snapshot / "sharded", blobs, 3)
    out = tmp_path / "out.safetensors"
    from tests.support.cli import migrate_in_process

    done = migrate_in_process("convert", str(snapshot), str(out))
    assert done.returncode == 0, done.stderr
    assert np.array_equal(load_file(out)["w"], W)


def test_fsdp1_set_in_a_cache_snapshot_reads(tmp_path: Path, fsdp1: Path) -> None:
    blobs, snapshot = _cache(tmp_path)
    for n in os.listdir(fsdp1):
        shutil.copy(fsdp1 / n, snapshot / n)
    _into_blobs(snapshot, blobs, 2)
    out = tmp_path / "out.safetensors"
    from tests.support.cli import migrate_in_process

    done = migrate_in_process("convert", str(snapshot), str(out))
    assert done.returncode == 0, done.stderr
    whole = torch.load(fsdp1.parent / "whole.pt")
    assert np.array_equal(load_file(out)["w"], whole.numpy())


def test_a_link_to_another_repositorys_blobs_is_refused(tmp_path: Path) -> None:
    _, snapshot = _cache(tmp_path)
    other = tmp_path / "hub" / "models--else--other" / "blobs"
    other.mkdir(parents=True)
    hf_set(snapshot)
    _into_blobs(snapshot, other, 2)
    for n in os.listdir(snapshot):  # the relative links now name this repository's blobs: point them away
        target = other / os.readlink(snapshot / n).split("/")[-1]
        (snapshot / n).unlink()
        (snapshot / n).symlink_to(target)
    refused(["convert", str(snapshot), str(tmp_path / "out.safetensors")], tmp_path / "hub", words="leads out of")


@pytest.mark.parametrize("digits", [4_000, 5_000])
def test_offsets_of_thousands_of_digits_are_one_short_line(digits: int, tmp_path: Path) -> None:
    root = tmp_path / "w"
    folder = hf_set(root / "ckpt")
    info = '{"w": {"saved_offsets": [' + "9" * digits + ", 0]}}"
    save([from_numpy("w", W[4:])], folder / hf_name(2), overwrite=True,
         metadata={"format": "pt", "DCP_SHARDING_INFO": info, "DCP_VERSION": "1.0"})
    done = refused(["convert", str(folder), str(root / "out.safetensors")], root, words=hf_name(2))
    assert len(done.stderr) < 400 and "set_int_max_str_digits" not in done.stderr, done.stderr


def test_a_local_shard_is_named_as_the_user_knows_it(tmp_path: Path) -> None:
    """A rank's local shard a stride-0 view of 2 GiB (past `max_expanded_bytes` in that one file): the
    error names the ShardedTensor and its local shard, not the reader's internal name (a NUL in it)."""
    root = tmp_path / "w"
    folder = fsdp1_set(root / "ckpt", ranks=2, cols=1 << 14, expanded_rows=1 << 15)
    done = refused(["convert", str(folder), str(root / "out.safetensors")], root, words="tensor 'w' (local shard 0)")
    assert "\x00" not in done.stderr


@pytest.mark.parametrize("protocol", [2, 4])
def test_fsdp1_sets_of_either_pickle_protocol_read(protocol: int, tmp_path: Path) -> None:
    """Protocol 4 names the nested ProcessGroupState class by its qualified name where 2 pickles a
    getattr: both give the saved world size (a tensor held by rank 0 alone says nothing of it)."""
    from tests.support.cli import migrate_in_process

    folder = fsdp1_set(tmp_path / "ckpt", protocol=protocol)
    out = tmp_path / "out.safetensors"
    done = migrate_in_process("convert", str(folder), str(out))
    assert done.returncode == 0, done.stderr
    got = load_file(out)
    assert np.array_equal(got["w"], torch.load(tmp_path / "whole.pt").numpy())
    assert np.array_equal(got["b"], torch.load(tmp_path / "whole_b.pt").numpy())
