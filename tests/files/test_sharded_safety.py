"""A sharded (folder) output gets the single-file write's guarantees: it never replaces a folder that
holds a file being read (by path or by inode), never swallows another output of the run, and its
files get permissions as `cp` would give them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import migrate_in_process

safetensors_numpy = pytest.importorskip("safetensors.numpy")


migrate = migrate_in_process


def tensors() -> dict[str, np.ndarray]:
    return {f"layer.{i}.weight": np.full((64, 64), i, np.float32) for i in range(4)}


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    safetensors_numpy.save_file(tensors(), str(path))
    return path


def recipe(tmp_path: Path, source: str, target: str, extra: str = "") -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(f"version: 1\nsource: {{path: '{source}'}}\ntarget: {{path: '{target}', shard: {{max_size: "
                    f"20000}}, overwrite: true{extra}}}\n")
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_source_folder_is_not_its_own_target(tmp_path: Path, src: Path) -> None:
    assert migrate("convert", str(src), f"{tmp_path}/hf/", "--max-shard-size", "20000").returncode == 0
    before = snapshot(tmp_path / "hf")
    r = recipe(tmp_path, str(tmp_path / "hf"), str(tmp_path / "hf") + "/")
    p = migrate("run", str(r), "--no-progress")  # the loader sees it
    assert p.returncode == 2 and "the target is the same file as source.path" in p.stderr
    r = recipe(tmp_path, str(tmp_path / "hf" / "model.safetensors.index.json"), str(tmp_path / "hf") + "/")
    p = migrate("run", str(r), "--no-progress")  # the write sees it
    assert p.returncode == 1 and "refusing to replace a folder holding a file being read" in p.stderr
    assert snapshot(tmp_path / "hf") == before
    assert migrate("plan", str(r)).returncode == 1  # plan says so too


def test_a_hard_link_to_the_source_inside_the_target_is_refused(tmp_path: Path, src: Path) -> None:
    (tmp_path / "out").mkdir()
    os.link(src, tmp_path / "out" / "model-00001-of-00004.safetensors")
    before = src.read_bytes()
    p = migrate("run", str(recipe(tmp_path, str(src), str(tmp_path / "out") + "/")), "--no-progress")
    assert p.returncode == 1 and "refusing to replace a folder holding a file being read" in p.stderr
    assert str(tmp_path / "out" / "model-00001-of-00004.safetensors") in p.stderr
    assert src.read_bytes() == before and os.path.exists(tmp_path / "out" / "model-00001-of-00004.safetensors")


def test_the_report_may_not_be_inside_the_output_folder(tmp_path: Path, src: Path) -> None:
    r = recipe(tmp_path, str(src), str(tmp_path / "out") + "/")
    p = migrate("run", str(r), "--no-progress", "--report", str(tmp_path / "out" / "report.json"))
    assert p.returncode == 1 and "inside the output folder" in p.stderr
    assert not (tmp_path / "out").exists()


def test_permissions_follow_the_sources_like_cp(tmp_path: Path, src: Path) -> None:
    umask = os.umask(0o022)
    try:
        os.chmod(src, 0o640)
        (tmp_path / "config.json").write_text("{}")
        os.chmod(tmp_path / "config.json", 0o600)
        r = recipe(tmp_path, str(src), str(tmp_path / "out") + "/", ", copy: [config.json]")
        assert migrate("run", str(r), "--no-progress").returncode == 0
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "out").iterdir()}
        assert modes.pop("config.json") == 0o600
        assert set(modes.values()) == {0o640} and len(modes) == 5  # 4 shards and the index
        # replaced files keep the permissions they had
        os.chmod(tmp_path / "out" / "model.safetensors.index.json", 0o644)
        assert migrate("run", str(r), "--no-progress").returncode == 0
        assert stat.S_IMODE((tmp_path / "out" / "model.safetensors.index.json").stat().st_mode) == 0o644
        assert stat.S_IMODE((tmp_path / "out" / "model-00001-of-00004.safetensors").stat().st_mode) == 0o640
    finally:
        os.umask(umask)


def test_convert_folder_to_itself_is_refused(tmp_path: Path, src: Path) -> None:
    assert migrate("convert", str(src), f"{tmp_path}/hf/", "--max-shard-size", "20000").returncode == 0
    before = snapshot(tmp_path / "hf")
    p = migrate("convert", str(tmp_path / "hf"), f"{tmp_path}/hf/", "--max-shard-size", "30000", "--overwrite")
    assert p.returncode != 0 and "being read" in p.stderr
    assert snapshot(tmp_path / "hf") == before
