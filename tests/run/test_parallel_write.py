"""One output written by several workers (`--workers`, migrator.run.parallel_write): the same bytes as
one writer, as the safetensors library writes them, with torch's values, and nothing published when
a task fails."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save, save_file

import migrator
from migrator.formats.safetensors import SafetensorsWriter
from migrator.run.parallel_write import LocalRunner, save_file_parallel, split_ranges
from tests.support.cli import migrate_subprocess

REPO = Path(__file__).resolve().parents[2]


migrate = migrate_subprocess


def _arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """Mixed sizes and dtypes: large tensors (kernel copies, streamed casts), small ones (the write
    buffer), an empty one and a bool, so runs start and end inside gaps and at odd offsets."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {f"blocks.{i}.fc.weight": rng.standard_normal((96 + i, 80 + 3 * i)).astype(np.float32)
                                  for i in range(7)}
    out.update({f"blocks.{i}.fc.bias": rng.standard_normal(96 + i).astype(np.float32) for i in range(7)})
    out["embed.weight"] = rng.standard_normal((900, 300)).astype(np.float32)  # ~1 MiB: above the small-read limit
    out["steps"] = np.arange(5, dtype=np.int64)
    out["mask"] = rng.integers(0, 2, 33).astype(bool)
    out["half"] = rng.standard_normal(77).astype(np.float16)
    out["empty"] = np.zeros((0, 4), np.float32)
    return out


def test_split_ranges_cover_the_data_once_in_contiguous_runs() -> None:
    with migrator.open_file(migrator.to_bytes([migrator.from_numpy(k, v) for k, v in _arrays().items()],
                                              "burnpack")) as r:
        writer = migrator.files.io.writer_class("burnpack")(r.tensors)
        prefix, tensors, offsets = writer.layout()
        for parts in (1, 2, 3, 5, len(tensors), 100):
            tasks = split_ranges(tensors, offsets, len(prefix), parts)
            assert len(tasks) == min(parts, len(tensors))
            assert tasks[0].lo == 0 and tasks[0].start == len(prefix) and tasks[-1].hi == len(tensors)
            assert tasks[-1].end == offsets[-1] + tensors[-1].nbytes
            for a, b in itertools.pairwise(tasks):
                assert a.hi == b.lo and a.end == b.start and a.lo < a.hi


@pytest.mark.parametrize("workers", [2, 3, 16])
def test_safetensors_file_by_workers_equals_the_librarys_bytes(tmp_path: Path, workers: int) -> None:
    arrays = _arrays()
    src = tmp_path / "src.safetensors"
    save_file(arrays, str(src))
    out = tmp_path / "out.safetensors"
    with migrator.open_file(src) as r:
        save_file_parallel(SafetensorsWriter(r.tensors), out, LocalRunner(workers))
    assert out.read_bytes() == save(arrays)  # the safetensors library's own bytes for these tensors


def _torch_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64 + 8 * i, 72 + 8 * i) for i in range(6)])
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # inputs of each Linear are the previous outputs only by name here: shapes are what matters
    torch.save(sd, path)
    return sd


def _recipe(folder: Path, target: str, extra: str = "") -> Path:
    path = folder / f"r-{abs(hash(target)) % 10_000}.yaml"
    path.write_text(f"version: 1\nsource: {{path: ckpt.pt}}\nadapters: [pytorch_to_burn]\ndtype: {{cast: F16}}\n"
                    f"target: {{path: {target}{extra}}}\n")
    return path


def test_cast_and_transpose_by_workers_equal_one_writer_and_torch(tmp_path: Path) -> None:
    sd = _torch_checkpoint(tmp_path / "ckpt.pt")
    for target in ("model.bpk", "model.safetensors"):
        recipe = _recipe(tmp_path, target)
        serial = migrate("run", str(recipe), "--target", f"serial-{target}", "--no-progress", cwd=tmp_path)
        assert serial.returncode == 0, serial.stderr
        par = migrate("run", str(recipe), "--target", f"par-{target}", "--workers", "3", "--no-progress",
                      cwd=tmp_path)
        assert par.returncode == 0, par.stderr
        assert (tmp_path / f"par-{target}").read_bytes() == (tmp_path / f"serial-{target}").read_bytes()
        assert (tmp_path / f"par-{target}").stat().st_mode == (tmp_path / f"serial-{target}").stat().st_mode
        # torch's values: Linear weights transposed to [in, out], everything cast to F16
        want = {k: (v.t() if k.endswith("weight") else v).half().contiguous().numpy() for k, v in sd.items()}
        if target.endswith(".safetensors"):
            got = load_file(str(tmp_path / f"par-{target}"))  # the safetensors library reads it
        else:
            with migrator.open_file(tmp_path / f"par-{target}") as r:
                got = {t.name: t.numpy().copy() for t in r.tensors}
        assert sorted(got) == sorted(want)
        for k, v in want.items():
            np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_shards_by_workers_equal_one_writer_and_load_in_safetensors(tmp_path: Path) -> None:
    arrays = _arrays(1)
    save_file(arrays, str(tmp_path / "ckpt.safetensors"))
    recipe = tmp_path / "shards.yaml"
    recipe.write_text("version: 1\nsource: {path: ckpt.safetensors}\n"
                      "target: {path: out/, shard: {max_size: 100KB}}\n")
    assert migrate("run", str(recipe), "--target", "serial/", "--no-progress", cwd=tmp_path).returncode == 0
    par = migrate("run", str(recipe), "--target", "par/", "--workers", "2", "--no-progress", cwd=tmp_path)
    assert par.returncode == 0, par.stderr
    names = sorted(os.listdir(tmp_path / "serial"))
    assert len(names) > 3 and sorted(os.listdir(tmp_path / "par")) == names
    for name in names:
        assert (tmp_path / "par" / name).read_bytes() == (tmp_path / "serial" / name).read_bytes(), name
        assert (tmp_path / "par" / name).stat().st_mode == (tmp_path / "serial" / name).stat().st_mode, name
    index = json.loads((tmp_path / "par" / "model.safetensors.index.json").read_text())
    got: dict[str, np.ndarray] = {}
    for shard in sorted(set(index["weight_map"].values())):
        got.update(load_file(str(tmp_path / "par" / shard)))
    assert sorted(got) == sorted(arrays)
    for k, v in arrays.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


@pytest.mark.parametrize("target", ["model.bpk", "shards/"])
def test_a_failed_task_publishes_nothing_and_keeps_the_old_target(tmp_path: Path, target: str) -> None:
    sd = _torch_checkpoint(tmp_path / "ckpt.pt")
    extra = ", shard: {max_size: 20KB}, format: safetensors" if target.endswith("/") else ""
    recipe = _recipe(tmp_path, target, extra)
    fault = json.dumps({"kind": "raise", "task": 1})
    new = migrate("run", str(recipe), "--workers", "2", "--no-progress", cwd=tmp_path,
                  env={"MIGRATOR_TEST_FAULT": fault})
    assert new.returncode == 1
    assert "injected failure in write task 1" in new.stderr and "nothing written" in new.stderr
    assert not (tmp_path / target).exists()
    assert not [n for n in os.listdir(tmp_path) if ".migrator-" in n]  # no scratch file or folder left
    if target.endswith("/"):
        return  # (the folder publish's own tests cover an old folder surviving a failure)
    # an existing target survives a failed overwrite
    assert migrate("run", str(recipe), "--no-progress", cwd=tmp_path).returncode == 0
    before = (tmp_path / target).read_bytes()
    again = migrate("run", str(recipe), "--workers", "2", "--overwrite", "--no-progress", cwd=tmp_path,
                    env={"MIGRATOR_TEST_FAULT": fault})
    assert again.returncode == 1
    assert (tmp_path / target).read_bytes() == before
    assert not [n for n in os.listdir(tmp_path) if ".migrator-" in n]
    assert sd  # the checkpoint was written by torch
