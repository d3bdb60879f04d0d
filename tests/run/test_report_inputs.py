"""`--report` (and `plan --html`) never replaces an input of the run, even with `--overwrite`.

The inputs: the recipe itself, the sources, the template, the model config a recipe reads values
from, the companion files copied. A previous report may be replaced. Compared by resolved path and
by inode (a symlink or a hard link to an input). Oracles: the input files' bytes, unchanged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.support.cli import migrate_in_process

migrate = migrate_in_process


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hf").mkdir()
    save_file({"enc.weight": np.ones((4, 4), np.float32)}, str(tmp_path / "hf" / "model.safetensors"))
    (tmp_path / "hf" / "config.json").write_text('{"num_attention_heads": 2}')
    save_file({"encoder.weight": np.zeros((4, 4), np.float32)}, str(tmp_path / "tpl.safetensors"))
    return tmp_path


def write_recipe(work: Path, name: str = "r.yaml", target: str = "out.safetensors", extra: str = "") -> Path:
    path = work / name
    path.write_text(f"version: 1\nsource: {{path: hf}}\nremap: [{{from: '^enc\\.', to: 'encoder.'}}]\n"
                    f"target: {{path: '{target}'{extra}}}\n")
    return path


def inputs(work: Path) -> dict[str, bytes]:
    return {str(p.relative_to(work)): p.read_bytes() for p in sorted(work.rglob("*")) if p.is_file()}


def refused(work: Path, *args: str) -> None:
    before = inputs(work)
    p = migrate(*args)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "error" in p.stderr and "Traceback" not in p.stderr
    assert inputs(work) == before


@pytest.mark.parametrize("how", ["same path", "relative", "symlink", "hard link"])
def test_the_report_never_replaces_the_recipe(work: Path, how: str) -> None:
    r = write_recipe(work)
    report = {"same path": str(r), "relative": "./r.yaml", "symlink": "link.yaml", "hard link": "hard.yaml"}[how]
    if how == "symlink":
        os.symlink("r.yaml", work / "link.yaml")
    if how == "hard link":
        os.link(r, work / "hard.yaml")
    refused(work, "run", str(r), "--report", report, "--overwrite", "--no-progress")
    assert not (work / "out.safetensors").exists()  # refused before anything was written


def test_a_json_recipe_is_not_replaced_by_its_json_report(work: Path) -> None:
    r = work / "recipe.json"
    r.write_text(json.dumps({"version": 1, "source": {"path": "hf"}, "target": {"path": "out.safetensors"}}))
    refused(work, "run", str(r), "--report", str(r), "--overwrite", "--no-progress")


@pytest.mark.parametrize("named", [True, False])
def test_the_report_never_replaces_the_config_the_recipe_reads(work: Path, named: bool) -> None:
    """Named by `config:`, or found beside the source (where `${config.KEY}` values come from)."""
    (work / "r.yaml").write_text("version: 1\nsource: {path: hf}\n" + ("config: hf/config.json\n" if named else "")
                                 + "target: {path: out.safetensors}\n")
    refused(work, "run", "r.yaml", "--report", "hf/config.json", "--overwrite", "--no-progress")


def test_the_report_never_replaces_a_companion_source(work: Path) -> None:
    r = write_recipe(work, target="out/", extra=", copy: [config.json]")
    refused(work, "run", str(r), "--report", "hf/config.json", "--overwrite", "--no-progress")


@pytest.mark.parametrize("report", ["hf/model.safetensors", "tpl.safetensors"])
def test_the_report_never_replaces_a_source_or_the_template(work: Path, report: str) -> None:
    r = write_recipe(work, extra=", template: tpl.safetensors")
    refused(work, "run", str(r), "--report", report, "--overwrite", "--no-progress")


def test_the_plan_page_never_replaces_the_recipe(work: Path) -> None:
    r = write_recipe(work, extra=", overwrite: true")
    refused(work, "plan", str(r), "--html", str(r))


def test_an_output_folder_never_swallows_the_recipe(work: Path) -> None:
    (work / "out").mkdir()
    save_file({"old": np.ones(2, np.float32)}, str(work / "out" / "model.safetensors"))  # an old model beside it
    r = write_recipe(work / "out", target="./", extra=", shard: {max_size: 100}, overwrite: true")
    r.write_text(r.read_text().replace("path: hf", "path: ../hf"))
    refused(work, "run", str(r), "--no-progress")


def test_a_previous_report_may_be_replaced(work: Path) -> None:
    r = write_recipe(work)
    assert migrate("run", str(r), "--report", "report.json", "--no-progress").returncode == 0
    p = migrate("run", str(r), "--report", "report.json", "--overwrite", "--no-progress")
    assert p.returncode == 0, p.stderr
    assert json.loads((work / "report.json").read_text())["written"] is True
