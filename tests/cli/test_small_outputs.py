"""Small output promises (issue 25 item 11): `inspect --limit` also limits the shard rows and counts
them in words ("1 shard"); reports and pages are as private as the files they describe, whichever
command writes them; `--each` headings carry each job's own number in input order."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import numpy as np
import pytest

from migrator import from_numpy, save
from tests.support.cli import migrate_in_process as migrate


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    src = tmp_path / "m.safetensors"
    save([from_numpy(f"w{i}", np.full((8,), i, np.float32)) for i in range(4)], src)
    r = migrate("convert", str(src), str(tmp_path / "hf") + "/", "--max-shard-size", "40B")
    assert r.returncode == 0, r.stderr
    return tmp_path / "hf"


def test_inspect_limit_covers_shard_rows(sharded: Path) -> None:
    r = migrate("inspect", str(sharded), "--limit", "1")
    assert r.returncode == 0, r.stderr
    assert "4 shards (index" in r.stdout
    assert len(re.findall(r"model-0000\d-of-00004\.safetensors\s+1 ", r.stdout)) == 1
    assert "... and 3 more shards (use --rows N or --json)" in r.stdout
    r = migrate("inspect", str(sharded))
    assert len(re.findall(r"model-0000\d-of-00004\.safetensors\s+1 ", r.stdout)) == 4


def test_one_shard_is_counted_in_the_singular(tmp_path: Path) -> None:
    save([from_numpy("w", np.zeros(4, np.float32))], tmp_path / "model-00001-of-00001.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"metadata": {}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}')
    r = migrate("inspect", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "1 shard (index" in r.stdout and "1 shards" not in r.stdout


def test_pages_and_reports_are_as_private_as_their_sources(tmp_path: Path) -> None:
    src = tmp_path / "m.safetensors"
    save([from_numpy("w", np.zeros(4, np.float32))], src)
    os.chmod(src, 0o600)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nsource: {path: m.safetensors}\ntarget: {path: o.safetensors}\n")
    assert migrate("run", str(recipe), "--report", str(tmp_path / "run.html")).returncode == 0
    assert migrate("run", str(recipe), "--overwrite", "--report", str(tmp_path / "run.json")).returncode == 0
    assert migrate("plan", str(recipe), "--overwrite", "--html", str(tmp_path / "plan.html")).returncode == 0
    assert migrate("diff", str(src), str(tmp_path / "o.safetensors"), "--html", str(tmp_path / "d.html")).returncode \
        == 0
    modes = {p: stat.S_IMODE(os.stat(tmp_path / p).st_mode) for p in ("run.html", "run.json", "plan.html", "d.html")}
    assert set(modes.values()) == {0o600 & ~_umask()}, {k: oct(v) for k, v in modes.items()}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_each_headings_number_jobs_in_input_order(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        save([from_numpy("w", np.zeros(4, np.float32))], tmp_path / f"{name}.safetensors")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nsource: {path: a.safetensors}\ntarget: {path: o.safetensors}\n")
    r = migrate("run", str(recipe), "--each", str(tmp_path / "*.safetensors"), "--target",
                str(tmp_path / "out" / "{stem}.bpk"), "--jobs", "2", "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    headings = re.findall(r"^\[(\d)/3\] .*?(\w)\.safetensors", r.stdout, re.MULTILINE)
    assert sorted(headings) == [("1", "a"), ("2", "b"), ("3", "c")], r.stdout


def test_piped_tables_fit_a_readable_width_and_json_keeps_names(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    long = ".".join(f"block_{i}_with_a_long_module_name" for i in range(12)) + ".weight"
    save([from_numpy(long, np.zeros((2, 3), np.float32))], tmp_path / "m.safetensors")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nsource: {path: m.safetensors}\ntarget: {path: o.bpk}\n")
    monkeypatch.delenv("COLUMNS", raising=False)
    r = migrate("plan", str(recipe))
    assert r.returncode == 0, r.stderr
    assert max(len(line) for line in r.stdout.splitlines()) <= 160
    # wrapped at dots in the source column, every character kept
    assert "".join(line.split()[0] for line in r.stdout.splitlines() if line.startswith("block_")) == long
    doc = json.loads(migrate("plan", str(recipe), "--json").stdout)
    assert long in json.dumps(doc)
    monkeypatch.setenv("COLUMNS", "500")
    assert max(len(line) for line in migrate("plan", str(recipe)).stdout.splitlines()) > 160
