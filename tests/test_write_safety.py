"""Every file migrator writes is safe: no write lands on a file the run reads or writes, none
replaces an existing file without --overwrite or a special file at all, permissions follow the
sources as `cp` does, and nothing is written that the format's reference loader cannot read.

Oracles: the safetensors library (reads sources and outputs), torch.load, the file bytes on disk.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from migrator.cli import main

REPO = Path(__file__).resolve().parents[1]
W = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.array([0.5, -1.5], dtype=np.float32)


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """src.safetensors, a template tpl.safetensors (same names, other values) and two recipes:
    plain.yaml (-> out.safetensors) and tpl.yaml (the same with the template)."""
    monkeypatch.chdir(tmp_path)
    save_file({"w": W, "b": B}, str(tmp_path / "src.safetensors"))
    save_file({"w": np.zeros((2, 3), np.float32), "b": np.zeros(2, np.float32)}, str(tmp_path / "tpl.safetensors"))
    target = "target:\n  path: out.safetensors\n"
    (tmp_path / "plain.yaml").write_text("version: 1\nsource:\n  path: src.safetensors\n" + target)
    (tmp_path / "tpl.yaml").write_text("version: 1\nsource:\n  path: src.safetensors\n" + target
                                       + "  template: tpl.safetensors\n")
    return tmp_path


def _bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink()}


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["run", *args, "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def _assert_output_is_source(path: Path) -> None:
    got = load_file(str(path))
    np.testing.assert_array_equal(got["w"], W)
    np.testing.assert_array_equal(got["b"], B)


# ------------------------------------------------------------------------------------------------
# issue 19 item 1: --report onto a file the run reads or writes


@pytest.mark.parametrize(("recipe", "report", "make"), [
    ("plain.yaml", "src.safetensors", None),               # the reported data-loss case
    ("tpl.yaml", "tpl.safetensors", None),                 # the template
    ("plain.yaml", "out.safetensors", None),               # the target (not there yet)
    ("plain.yaml", "./sub/../out.safetensors", "sub"),     # the target, spelled differently
    ("plain.yaml", "link.json", "symlink:src.safetensors"),
    ("plain.yaml", "hard.json", "hardlink:src.safetensors"),
    ("tpl.yaml", "link.json", "symlink:tpl.safetensors"),
    ("tpl.yaml", "hard.json", "hardlink:tpl.safetensors"),
    ("plain.yaml", "dangling.json", "symlink:out.safetensors"),  # a link to where the target will be
])
@pytest.mark.parametrize("overwrite", [False, True])
def test_report_onto_a_file_of_the_run_is_refused_before_anything_is_written(
        ws: Path, capsys: pytest.CaptureFixture[str], recipe: str, report: str, make: str | None,
        overwrite: bool) -> None:
    if make == "sub":
        (ws / "sub").mkdir()
    elif make:
        kind, to = make.split(":")
        if kind == "symlink":
            (ws / report).symlink_to(to)
        else:
            os.link(ws / to, ws / report)
    before = _bytes(ws)
    code, out, err = _run(capsys, recipe, "--report", report, *(["--overwrite"] if overwrite else []))
    assert code == 1, (out, err)
    assert "refusing to write" in err and "Traceback" not in err, err
    assert _bytes(ws) == before  # source, template, recipe: byte for byte; no output, no report
    assert not (ws / "out.safetensors").exists()
    assert "Successfully applied" not in out  # no summary of a run that did not happen


def test_report_onto_an_existing_target_is_refused_even_with_overwrite(
        ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "plain.yaml")[0] == 0
    before = _bytes(ws)
    for target_spelling in ("out.safetensors", str(ws / "out.safetensors")):
        code, _, err = _run(capsys, "plain.yaml", "--overwrite", "--report", target_spelling)
        assert code == 1 and "two outputs of one run" in err, err
        assert _bytes(ws) == before


def test_existing_report_needs_overwrite(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (ws / "r.json").write_text("keep me")
    code, _, err = _run(capsys, "plain.yaml", "--report", "r.json")
    assert code == 1 and "r.json" in err and "already exists" in err, err
    assert (ws / "r.json").read_text() == "keep me"
    assert not (ws / "out.safetensors").exists()  # refused before the output is written

    code, _, err = _run(capsys, "plain.yaml", "--report", "r.json", "--overwrite")
    assert code == 0, err
    _assert_output_is_source(ws / "out.safetensors")
    doc = json.loads((ws / "r.json").read_text())
    assert doc["status"] == "ok" and doc["written"] is True and doc["errors"] == []
    assert Path(doc["target"]) == ws / "out.safetensors"
    assert sorted(doc["applied"]) == ["b", "w"]
    assert not [p for p in os.listdir(ws) if p.endswith(".tmp")]


def test_report_goes_to_a_new_folder_after_the_output(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "plain.yaml", "--report", "reports/today/r.json")
    assert code == 0, err
    doc = json.loads((ws / "reports" / "today" / "r.json").read_text())
    assert doc["status"] == "ok" and Path(doc["target"]).read_bytes() == (ws / "out.safetensors").read_bytes()
    _assert_output_is_source(ws / "out.safetensors")
