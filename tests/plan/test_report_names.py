"""Report JSON names the target, the status and each tensor's source -> target name, and loads back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from migrator import from_numpy, save
from migrator.cli import main
from migrator.plan.report import ApplyReport


@pytest.fixture
def gapped(tmp_path: Path) -> Path:
    """A Sequential with gaps: parameters at 0, 2 and 4; Burn's renumbering closes them to 0, 1, 2."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 3), torch.nn.Dropout(),
                              torch.nn.LayerNorm(3))
    path = tmp_path / "net.pt"
    torch.save({f"features.{k}": v for k, v in net.state_dict().items()}, path)
    return path


def _recipe(tmp_path: Path, source: Path, target: Path, extra: str = "") -> Path:
    recipe = tmp_path / "r.yaml"
    # renumbered as for Burn, so the report has renames to show (a SafeTensors target keeps names by default)
    recipe.write_text(f"version: 1\nsource: {{path: {source}, contiguous_indices: true}}\n"
                      f"target: {{path: {target}}}\n{extra}")
    return recipe


def test_report_file_has_target_status_and_source_names(gapped: Path, tmp_path: Path) -> None:
    out, report = tmp_path / "net.safetensors", tmp_path / "report.json"
    assert main(["run", str(_recipe(tmp_path, gapped, out)), "--report", str(report), "--no-progress"]) == 0
    doc = json.loads(report.read_text())
    assert doc["status"] == "ok" and doc["written"] is True and Path(doc["target"]).resolve() == out.resolve()
    source_names = list(torch.load(gapped, weights_only=True))  # the oracle: what torch wrote
    with safe_open(str(out), framework="pt") as f:
        written = set(f.keys())
    pairs = {(t["source"], t["target"]) for t in doc["tensors"]}
    assert {s for s, _ in pairs} == set(source_names)
    assert {t for _, t in pairs} == written == set(doc["applied"])
    assert ("features.4.weight", "features.2.weight") in pairs and ("features.2.bias", "features.1.bias") in pairs
    assert ("features.0.weight", "features.0.weight") in pairs


def test_report_file_round_trips_through_apply_report(gapped: Path, tmp_path: Path) -> None:
    out, report = tmp_path / "net.safetensors", tmp_path / "report.json"
    assert main(["run", str(_recipe(tmp_path, gapped, out)), "--report", str(report), "--no-progress"]) == 0
    doc = json.loads(report.read_text())
    loaded = ApplyReport.from_json(doc)
    assert loaded.status == "ok" and loaded.written is True and loaded.target == doc["target"]
    assert ("features.4.weight", "features.2.weight") in loaded.renames()
    assert loaded.to_json() == doc


def test_failed_run_report_with_run_error_loads(gapped: Path, tmp_path: Path) -> None:
    out, report = tmp_path / "net.safetensors", tmp_path / "report.json"
    out.write_bytes(b"keep")  # exists, no overwrite: the run refuses, the report says why
    code = main(["run", str(_recipe(tmp_path, gapped, out)), "--report", str(tmp_path / "x.json"), "--no-progress"])
    assert code != 0
    tpl = tmp_path / "tpl.safetensors"
    save([from_numpy("other.weight", np.zeros((2, 2), np.float32))], tpl)
    recipe = _recipe(tmp_path, gapped, tmp_path / "new.safetensors", "allow_partial: false\n")
    recipe.write_text(recipe.read_text().replace("target: {path:", f"target: {{template: {tpl}, path:"))
    assert main(["run", str(recipe), "--report", str(report), "--no-progress"]) != 0
    doc = json.loads(report.read_text())
    assert doc["status"] == "failed" and doc["written"] is False
    assert any(e["kind"] == "run_error" for e in doc["errors"])
    loaded = ApplyReport.from_json(doc)
    assert loaded.status == "failed" and any(e.kind == "run_error" for e in loaded.errors)
    assert loaded.to_json() == doc
    assert "Run error" in loaded.display()


def test_run_json_report_has_target_status_and_renames(gapped: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "net.safetensors"
    assert main(["run", str(_recipe(tmp_path, gapped, out)), "--json", "--no-progress"]) == 0
    doc = json.loads(capsys.readouterr().out)["report"]
    assert doc["status"] == "ok" and Path(doc["target"]).resolve() == out.resolve()
    assert {"source": "features.4.bias", "target": "features.2.bias"} in doc["tensors"]
    ApplyReport.from_json(doc)


def test_adapter_error_names_the_source_tensor(gapped: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A type that does not fit (a LayerNorm rule on the Linear at features.2): the error names the
    renumbered target and the tensor as the source file spells it."""
    out = tmp_path / "net.bpk"
    extra = "adapters: [pytorch_to_burn]\nmodules: {LayerNorm: ['^features\\.1$']}\n"
    assert main(["run", str(_recipe(tmp_path, gapped, out, extra)), "--json", "--no-progress"]) != 0
    doc = json.loads(capsys.readouterr().out)["report"]
    bad = {e["path"]: e for e in doc["errors"] if e["kind"] == "adapter_error" and e["path"].startswith("features.1.")}
    assert {p: e["source"] for p, e in bad.items()} == {"features.1.weight": "features.2.weight",
                                                        "features.1.bias": "features.2.bias"}
    assert all(f"(source tensor '{e['source']}')" in e["message"] for e in bad.values())


@pytest.mark.parametrize("data", [
    {"applied": ["a"], "skipped": [], "missing": [], "unused": [], "errors": [],
     "tensors": [{"source": "x", "target": "b"}]},
    {"applied": [], "skipped": [], "missing": [], "unused": [], "errors": [], "status": "maybe"},
    {"applied": [], "skipped": [], "missing": [], "unused": [], "errors": [], "written": "yes"},
])
def test_from_json_rejects_inconsistent_run_keys(data: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ApplyReport.from_json(data)
