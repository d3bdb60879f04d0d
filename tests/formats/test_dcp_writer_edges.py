"""The `dcp` target's edges: what it refuses (one line, exit 1 or 2, nothing written, an existing
checkpoint untouched), what a folder target replaces, streaming within bounded memory, values torch
pickles as bytes read back by torch. Oracles: `torch.distributed.checkpoint.load`,
`dcp_to_torch_save`, the source tensors; migrator's reader reads every output back.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
st_torch = pytest.importorskip("safetensors.torch")

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> tuple[int, str, str]:
    p = migrate_in_process(*args)
    assert "Traceback" not in p.stdout + p.stderr, p.stderr
    return p.returncode, p.stdout, p.stderr


def files(folder: Path) -> dict[str, str]:
    return {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in sorted(os.listdir(folder))}


def test_an_existing_checkpoint_survives_refusals_and_overwrite_replaces_a_checkpoint_only(tmp_path: Path) -> None:
    st_torch.save_file({"w": torch.randn(3, 2)}, tmp_path / "a.safetensors")
    st_torch.save_file({"w": torch.randn(4, 2)}, tmp_path / "b.safetensors")
    out = tmp_path / "ckpt"
    assert run("convert", str(tmp_path / "a.safetensors"), str(out), "--to", "dcp")[0] == 0
    before = files(out)
    code, _, err = run("convert", str(tmp_path / "b.safetensors"), str(out), "--to", "dcp")
    assert code == 1 and "already exists" in err and len(err.strip().splitlines()) == 1
    assert files(out) == before
    code, _, err = run("convert", str(tmp_path / "b.safetensors"), str(out) + "/", "--to", "dcp", "--max-shard-size",
                       "1MB", "--overwrite")
    assert code == 1 and "a sharded target cannot be dcp" in err
    assert files(out) == before
    (out / "notes.txt").write_text("mine")  # a file of the user's: the folder is not replaced
    code, _, err = run("convert", str(tmp_path / "b.safetensors"), str(out), "--to", "dcp", "--overwrite")
    assert code == 1 and "holds files that are not part of a model folder (notes.txt)" in err
    assert files(out) == {**before, "notes.txt": hashlib.sha256(b"mine").hexdigest()}
    (out / "notes.txt").unlink()
    assert run("convert", str(tmp_path / "b.safetensors"), str(out), "--to", "dcp", "--overwrite")[0] == 0
    assert sorted(os.listdir(out)) == [".metadata", "__0_0.distcp"]
    into = {"w": torch.zeros(4, 2)}
    dcp.load(into, checkpoint_id=str(out), no_dist=True)
    assert torch.equal(into["w"], st_torch.load_file(str(tmp_path / "b.safetensors"))["w"])


def test_a_dtype_torch_has_not_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    from migrator.core import dtypes
    from migrator.core.errors import MigratorError
    from migrator.core.tensor import from_numpy
    from migrator.formats.dcp.writer import DcpWriter

    no_torch = next(d for d in vars(dtypes).values() if isinstance(d, dtypes.DType) and d.torch_name is None
                    and d.itemsize)
    t = from_numpy("q", np.zeros(4, np.uint8)).derived(dtype=no_torch, shape=(4 // no_torch.itemsize,),
                                                     loader=lambda: b"\0" * 4)
    with pytest.raises(MigratorError, match="PyTorch has no dtype") as e:
        DcpWriter([t])
    assert e.value.tensor == "q"


def test_a_tuple_holding_tensors_is_refused(tmp_path: Path) -> None:
    torch.save({"model": {"w": torch.ones(2)}, "pair": (torch.ones(1), 3)}, tmp_path / "c.pt")
    code, _, err = run("convert", str(tmp_path / "c.pt"), str(tmp_path / "out"), "--to", "dcp")
    assert code == 1 and "'pair' is a tuple holding tensors" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_values_and_nesting_are_read_back_as_dcp_save_wrote_them(tmp_path: Path) -> None:
    """A whole checkpoint with values torch stores as bytes (floats, tuples, lists of names, None, strings,
    a list of dicts, a list of tensors): dcp_to_torch_save of ours equals the source, and equals
    dcp_to_torch_save of what dcp.save writes for it."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt: dict[str, Any] = {
        "model": {"a.weight": torch.randn(3, 2), "a.bias": torch.randn(3).half()},
        "extra": {"lr": 0.5, "betas": (0.9, 0.99), "names": ["a", "b"], "none": None, "tag": "x", "flag": True,
                  "groups": [{"k": 1, "t": torch.arange(3)}, {"k": 2}], "stack": [torch.ones(2), torch.zeros(1)],
                  "big": 1 << 40, "neg": -7},
        "epoch": 3,
    }
    torch.save(ckpt, tmp_path / "c.pt")
    code, _, err = run("convert", str(tmp_path / "c.pt"), str(tmp_path / "ours"), "--to", "dcp")
    assert code == 0, err
    dcp.save(ckpt, checkpoint_id=str(tmp_path / "theirs"), no_dist=True)
    dcp_to_torch_save(tmp_path / "ours", tmp_path / "ours.pt")
    dcp_to_torch_save(tmp_path / "theirs", tmp_path / "theirs.pt")
    ours = torch.load(tmp_path / "ours.pt", weights_only=False)
    theirs = torch.load(tmp_path / "theirs.pt", weights_only=False)
    assert _plain(ours) == _plain(theirs)
    with_tensors = _plain(theirs)
    assert with_tensors["extra"]["betas"] == (0.9, 0.99) and with_tensors["epoch"] == 3
    from migrator.files.io import open_file

    with open_file(tmp_path / "ours") as r:
        assert r.scalars["extra.lr"].value == 0.5 and r.metadata["extra.tag"] == "x"
        assert np.array_equal(r["extra.groups.0.t"].numpy(), np.arange(3))


def _plain(v: Any) -> Any:
    """Tensors as (dtype, shape, bytes): comparable with ==, types of containers kept."""
    if isinstance(v, torch.Tensor):
        return (str(v.dtype), tuple(v.shape), v.contiguous().view(-1).view(torch.uint8).tolist())
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_plain(x) for x in v)
    return v


MEMORY_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[3])
    from migrator.run.convert import convert
    import migrator.formats.dcp.writer, migrator.formats.safetensors  # imported before the baseline

    def peak_kib():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])

    before = peak_kib()
    convert(sys.argv[1], sys.argv[2], target_format_name="dcp", progress=False, **dict(
        a.split("=", 1) for a in sys.argv[4:]))
    print(peak_kib() - before)
""")


@pytest.mark.slow
@pytest.mark.parametrize("options", [[], ["dtype=BF16"]], ids=["copied", "cast"])
def test_streamed_within_bounded_memory(tmp_path: Path, options: list[str]) -> None:
    """10 tensors of 16 MiB: the write's peak RSS grows by much less than the model (a kernel copy of each
    stored span; a cast computed and written piece by piece)."""
    rng = np.random.default_rng(0)
    tensors = {f"layer{i}.weight": torch.from_numpy(rng.standard_normal((1024, 4096), dtype=np.float32))
               for i in range(10)}
    st_torch.save_file(tensors, tmp_path / "big.safetensors")
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(tmp_path / "big.safetensors"),
                          str(tmp_path / "ckpt"), str(REPO), *options],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    growth_mib = int(out.stdout.split()[-1]) / 1024
    print(f"peak RSS growth {growth_mib:.1f} MiB")
    assert growth_mib < 16 + 48, f"peak RSS grew {growth_mib:.0f} MiB writing 160 MiB of tensors"
    cast = torch.bfloat16 if options else torch.float32
    into = {k: torch.empty(v.shape, dtype=cast) for k, v in tensors.items()}
    dcp.load(into, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    for k, v in tensors.items():
        assert torch.equal(into[k], v.to(cast)), k


def test_written_to_an_object_store_metadata_last_and_overwritten(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`memory://` (fsspec's in-process store): the objects torch's loader reads, equal to the source;
    an overwrite deletes the old `.metadata` before uploading the new files (a reader never pairs them)."""
    fsspec = pytest.importorskip("fsspec")
    from migrator.files.io import open_file
    from migrator.run.convert import convert

    a, b = {"w": torch.randn(3, 2)}, {"w": torch.randn(5, 2), "x": torch.arange(3)}
    st_torch.save_file(a, tmp_path / "a.safetensors")
    st_torch.save_file(b, tmp_path / "b.safetensors")
    fs = fsspec.filesystem("memory")
    convert(tmp_path / "a.safetensors", "memory://dcpw/ckpt", target_format_name="dcp", progress=False)
    old_data = fs.cat("/dcpw/ckpt/__0_0.distcp")
    deleted: list[str] = []
    real_rm = type(fs).rm_file

    def spy(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        deleted.append(path)
        if path.endswith(".metadata"):  # before any new byte is uploaded
            assert fs.cat("/dcpw/ckpt/__0_0.distcp") == old_data
        return real_rm(self, path, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(type(fs), "rm_file", spy)
        convert(tmp_path / "b.safetensors", "memory://dcpw/ckpt", target_format_name="dcp", progress=False,
                overwrite=True)
    assert [os.path.basename(p) for p in deleted if ".tmp" not in p] == [".metadata"]  # (and temporary uploads)
    assert fs.cat("/dcpw/ckpt/__0_0.distcp") != old_data
    local = tmp_path / "copy"
    local.mkdir()
    for name in fs.ls("/dcpw/ckpt", detail=False):
        (local / os.path.basename(name)).write_bytes(fs.cat(name))
    into = {k: torch.zeros_like(v) for k, v in b.items()}
    dcp.load(into, checkpoint_id=str(local), no_dist=True)
    assert all(torch.equal(into[k], v) for k, v in b.items())
    with open_file("memory://dcpw/ckpt") as r:
        assert sorted(r.keys()) == ["w", "x"] and np.array_equal(r["x"].numpy(), np.arange(3))
    fs.rm("/dcpw", recursive=True)


@pytest.mark.parametrize("overwrite", [False, True])
def test_killed_at_each_tensor_the_target_is_the_old_checkpoint_or_none(tmp_path: Path, overwrite: bool) -> None:
    """SIGKILL after the k-th tensor (`MIGRATOR_KILL_AT=tensor:k`, the last one included: before `.metadata`
    and the publish): the old checkpoint byte for byte, or no folder; the next run writes the new one and
    leaves no scratch folder."""
    from migrator.storage.atomic_folder import SCRATCH_DIR_RE

    tensors = {f"layers.{i}.weight": torch.randn(64, 32) for i in range(4)}
    st_torch.save_file(tensors, tmp_path / "new.safetensors")
    st_torch.save_file({"w": torch.randn(2, 2)}, tmp_path / "old.safetensors")
    out = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "migrator.cli", "convert", str(tmp_path / "new.safetensors"), str(out), "--to", "dcp",
           "--no-progress", *(["--overwrite"] if overwrite else [])]
    if overwrite:
        assert run("convert", str(tmp_path / "old.safetensors"), str(out), "--to", "dcp")[0] == 0
    old = files(out) if overwrite else None
    for k in range(1, len(tensors) + 1):
        done = subprocess.run(cmd, env={**env, "MIGRATOR_KILL_AT": f"tensor:{k}"}, capture_output=True, timeout=120,
                              check=False)
        assert done.returncode == -9, done.stderr
        assert (files(out) if out.exists() else None) == old, k
    done = subprocess.run(cmd, env=env, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert not [n for n in os.listdir(tmp_path) if SCRATCH_DIR_RE.match(n)]
    into = {k: torch.zeros_like(v) for k, v in tensors.items()}
    dcp.load(into, checkpoint_id=str(out), no_dist=True)
    assert all(torch.equal(into[k], v) for k, v in tensors.items())
