"""Jobs that would write what another job reads or writes are refused before any job runs.

Paths are compared by containment (a folder target holds every path under it; a folder source holds
its shards), not by equality, and by inode (a hard link, a bind mount), for local paths and URLs.
A job's recipe is one of the files it reads. Oracles: the files the test made, untouched, and the
exit code (2, a usage error: nothing ran).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.support.cli import migrate_in_process


def weights(seed: int) -> dict[str, np.ndarray]:
    return {"enc.weight": np.full((4, 4), seed, np.float32)}


def recipe(folder: Path, name: str, source: str, target: str, extra: str = "") -> Path:
    path = folder / name
    path.write_text(f"version: 1\nsource: {{path: '{source}'}}\ntarget: {{path: '{target}'{extra}}}\n")
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(tmp_path: Path, *args: str) -> str:
    before = snapshot(tmp_path)
    p = migrate_in_process("run", *args, "--no-progress", "--jobs", "2")
    assert p.returncode == 2, p.stdout + p.stderr
    assert snapshot(tmp_path) == before
    return p.stderr


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    save_file(weights(1), str(tmp_path / "d" / "model.safetensors"))
    save_file(weights(2), str(tmp_path / "w.safetensors"))
    return tmp_path


def test_a_folder_target_holding_another_jobs_source(work: Path) -> None:
    """The corpus case: `d/` with overwrite replaced the other job's source `d/model.safetensors`."""
    a = recipe(work, "a.yaml", "w.safetensors", "d/", ", shard: {max_size: 100}, overwrite: true")
    b = recipe(work, "b.yaml", "d/model.safetensors", "out/b.safetensors")
    err = refused(work, str(a), str(b))
    assert "writes" in err and "b.yaml reads" in err.replace(str(work) + "/", "")


def test_a_folder_target_holding_another_jobs_target(work: Path) -> None:
    a = recipe(work, "a.yaml", "w.safetensors", "out/", ", shard: {max_size: 100}")
    b = recipe(work, "b.yaml", "d/model.safetensors", "out/sub/b.safetensors")
    err = refused(work, str(a), str(b))
    assert "write" in err and "out" in err


def test_a_target_inside_another_jobs_folder_source(work: Path) -> None:
    a = recipe(work, "a.yaml", "d", "out/a.safetensors")
    b = recipe(work, "b.yaml", "w.safetensors", "d/model.safetensors", ", overwrite: true")
    refused(work, str(a), str(b))


def test_a_template_inside_another_jobs_folder_target(work: Path) -> None:
    save_file(weights(3), str(work / "d" / "tpl.safetensors"))
    a = recipe(work, "a.yaml", "w.safetensors", "d/", ", shard: {max_size: 100}, overwrite: true")
    b = recipe(work, "b.yaml", "w.safetensors", "out/b.safetensors", ", template: d/tpl.safetensors")
    refused(work, str(a), str(b))


def test_a_hard_link_to_another_jobs_source_inside_a_folder_target(work: Path) -> None:
    (work / "out").mkdir()
    os.link(work / "w.safetensors", work / "out" / "model.safetensors")
    a = recipe(work, "a.yaml", "d/model.safetensors", "out/", ", shard: {max_size: 100}, overwrite: true")
    b = recipe(work, "b.yaml", "w.safetensors", "b.safetensors")
    err = refused(work, str(a), str(b))
    assert "b.yaml" in err


def test_a_target_that_is_a_hard_link_to_another_jobs_source(work: Path) -> None:
    os.link(work / "w.safetensors", work / "linked.safetensors")
    a = recipe(work, "a.yaml", "d/model.safetensors", "linked.safetensors", ", overwrite: true")
    b = recipe(work, "b.yaml", "w.safetensors", "b.safetensors")
    refused(work, str(a), str(b))


def test_a_folder_target_holding_another_jobs_recipe(work: Path) -> None:
    (work / "recipes").mkdir()
    a = recipe(work, "a.yaml", "w.safetensors", "recipes/", ", shard: {max_size: 100}, overwrite: true")
    b = recipe(work / "recipes", "b.yaml", "../w.safetensors", "../b.safetensors")
    refused(work, str(a), str(b))


@pytest.mark.parametrize("report", ["a.yaml", "b.yaml", "d/model.safetensors", "out/report.json"])
def test_the_report_of_many_jobs_is_no_input_nor_inside_a_target(work: Path, report: str) -> None:
    a = recipe(work, "a.yaml", "d/model.safetensors", "out/", ", shard: {max_size: 100}")
    b = recipe(work, "b.yaml", "w.safetensors", "b.safetensors")
    err = refused(work, str(a), str(b), "--report", report, "--overwrite")
    assert "--report" in err


@pytest.mark.parametrize(("target", "source"), [
    ("s3://bucket/d/", "s3://bucket/d/model.safetensors"),
    ("s3://bucket/d/", "s3://bucket/d"),
    ("gs://bucket/models/", "gs://bucket/models/llama/model.safetensors.index.json"),
])
def test_url_folder_targets_by_containment(work: Path, target: str, source: str) -> None:
    a = recipe(work, "a.yaml", "w.safetensors", target, ", shard: {max_size: 100}, overwrite: true")
    b = recipe(work, "b.yaml", source, "b.safetensors")
    refused(work, str(a), str(b))


def test_unrelated_jobs_still_run(work: Path) -> None:
    a = recipe(work, "a.yaml", "w.safetensors", "out/a/", ", shard: {max_size: 100}")
    b = recipe(work, "b.yaml", "d/model.safetensors", "out/ab.safetensors")  # a name that starts like a's folder
    p = migrate_in_process("run", str(a), str(b), "--no-progress", "--jobs", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (work / "out" / "ab.safetensors").is_file() and (work / "out" / "a").is_dir()
