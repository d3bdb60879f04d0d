"""ApplyReport: fields, Burn's Display text, its error Display, JSON."""

from __future__ import annotations

import json

import pytest

from migrator.plan.report import ApplyReport, ReportError, error_display

TOP = "┌─ Tensor Loading Summary ─────────────────────────"
BOTTOM = "└───────────────────────────────────────────────────"


def test_border_lengths() -> None:
    assert TOP == "┌─ Tensor Loading Summary " + "─" * 25
    assert BOTTOM == "└" + "─" * 51


def test_display_empty_report() -> None:
    expected = "\n".join(
        [
            TOP,
            "│",
            "│ ✓ Successfully applied: 0 tensors",
            "│ ⊘ Skipped (filtered):  0 tensors",
            "│ ✗ Missing in source:    0 tensors",
            "│ ? Unused in source:     0 tensors",
            "│ ! Errors:               0 errors",
            "│",
            BOTTOM,
        ]
    )
    report = ApplyReport()
    assert report.display() == expected
    assert str(report) == expected
    assert not report.display().endswith("\n")
    assert report.is_success()


def test_display_missing_without_enum_and_unused() -> None:
    report = ApplyReport(
        applied=["fc2.weight", "fc2.bias"],
        skipped=["norm.beta"],
        missing=[
            ("norm.gamma", "Struct:Net.Struct:LayerNorm"),
            ("fc.weight", "Struct:Net.Struct:Linear"),
            ("embed.table", "Struct:Net.Struct:Embedding"),
        ],
        unused=["norm.weight", "fc1.weight", "classifier.weight"],
    )
    expected = "\n".join(
        [
            TOP,
            "│",
            "│ ✓ Successfully applied: 2 tensors",
            "│ ⊘ Skipped (filtered):  1 tensor",
            "│ ✗ Missing in source:    3 tensors",
            "│ ? Unused in source:     3 tensors",
            "│ ! Errors:               0 errors",
            "│",
            "├─ Missing Tensors (requested by model but not found in source)",
            "│",
            "│  First 10 missing tensors:",
            "│    • embed.table",
            "│    • fc.weight",
            "│        Did you mean: 'fc1.weight'?",
            "│    • norm.gamma",
            "│        Did you mean: 'norm.weight'?",
            "│",
            "├─ Unused Tensors (in source but not used by model)",
            "│",
            "│  First 10 unused tensors:",
            "│    • classifier.weight",
            "│    • fc1.weight",
            "│    • norm.weight",
            "│",
            BOTTOM,
        ]
    )
    assert report.display() == expected
    assert report.is_success()


def _big_report() -> ApplyReport:
    missing = [
        (f"feature.BaseConv.layer{i:02d}.weight", "Struct:Net.Enum:Feature.Struct:BaseConv.Struct:Linear")
        for i in range(3)
    ]
    missing += [(f"head.{i:02d}.bias", "Struct:Net.Vec.Struct:Linear") for i in range(9)]
    unused = ["feature.layer00.weight"] + [f"extra.t{i:02d}" for i in range(11)]
    errors = [ReportError.shape_mismatch(f"blk.{i:02d}.weight", [2, 3], [3, 3]) for i in range(10)]
    errors.append(ReportError("blk.10.weight", "load_error", 'Data("corrupt")'))
    errors.append(ReportError.dtype_mismatch("blk.11.weight", "F32", "F16"))
    return ApplyReport(applied=["x"], missing=missing, unused=unused, errors=errors)


def test_display_golden_with_enum_advisory_and_overflowing_lists() -> None:
    shape_lines = [
        f"│  ⚠️  Shape mismatch for 'blk.{i:02d}.weight': expected [2, 3], found [3, 3]"
        for i in range(10)
    ]
    expected = "\n".join(
        [
            TOP,
            "│",
            "│ ✓ Successfully applied: 1 tensor",
            "│ ⊘ Skipped (filtered):  0 tensors",
            "│ ✗ Missing in source:    12 tensors",
            "│ ? Unused in source:     12 tensors",
            "│ ! Errors:               12 errors",
            "│",
            "├─ Missing Tensors (requested by model but not found in source)",
            "│",
            "│  ⚠️  3 paths contain enum variants (detected from container stack)",
            "│     Burn puts enum variant names into paths (e.g. 'field.BaseConv.weight'),",
            "│     PyTorch does not (e.g. 'field.weight'), so these names cannot line up.",
            "│",
            "│     Solution 1: leave variant names out with skip_enum_variants(true):",
            "│",
            '│       PytorchStore::from_file("model.pth")',
            "│           .skip_enum_variants(true)",
            "│",
            "│     Solution 2: insert the variant name with a key remap:",
            "│",
            '│       SafetensorsStore::from_file("model.safetensors")',
            r'│           .with_key_remapping(r"field\.(\w+)", "field.BaseConv.$1")',
            "│",
            "│  First 10 missing tensors:",
            "│    • feature.BaseConv.layer00.weight",
            "│        Did you mean: 'feature.layer00.weight'?",
            "│    • feature.BaseConv.layer01.weight",
            "│        Did you mean: 'feature.layer00.weight'?",
            "│    • feature.BaseConv.layer02.weight",
            "│        Did you mean: 'feature.layer00.weight'?",
            "│    • head.00.bias",
            "│    • head.01.bias",
            "│    • head.02.bias",
            "│    • head.03.bias",
            "│    • head.04.bias",
            "│    • head.05.bias",
            "│    • head.06.bias",
            "│    ... and 2 more",
            "│",
            "├─ Unused Tensors (in source but not used by model)",
            "│",
            "│  First 10 unused tensors:",
            *[f"│    • extra.t{i:02d}" for i in range(10)],
            "│    ... and 2 more",
            "│",
            "├─ Errors",
            "│",
            *shape_lines,
            "│    ... and 2 more",
            "│",
            BOTTOM,
        ]
    )
    report = _big_report()
    assert report.display() == expected
    assert "enum variant" in report.display()
    assert not report.is_success()


def test_enum_advisory_counts_all_enum_paths() -> None:
    missing = [(f"f.V{i:02d}x.w", "Struct:Net.Enum:F.Struct:Linear") for i in range(12)]
    text = ApplyReport(missing=missing).display()
    assert "│  ⚠️  12 paths contain enum variants (detected from container stack)" in text.split("\n")
    assert "│    ... and 2 more" in text.split("\n")


def test_missing_sorted_by_path_and_fields_normalised() -> None:
    report = ApplyReport(applied=["b", "a"], skipped=["z", "y"], missing=[("b", "X"), ("a", "Y")], unused=["q", "p"])
    assert report.applied == ["b", "a"]  # traversal order kept
    assert report.skipped == ["y", "z"]
    assert report.missing == [("a", "Y"), ("b", "X")]
    assert report.unused == ["p", "q"]


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (
            ReportError.shape_mismatch("fc.weight", [2, 3], [3, 3]),
            "Shape mismatch for 'fc.weight': expected [2, 3], found [3, 3]",
        ),
        (
            ReportError.shape_mismatch("s", [], [1]),
            "Shape mismatch for 's': expected [], found [1]",
        ),
        (ReportError.dtype_mismatch("b", "F32", "F16"), "DType mismatch for 'b': expected F32, found F16"),
        (ReportError.adapter_error("c", "bad transpose"), "Adapter error for 'c': bad transpose"),
        (
            ReportError("d", "load_error", 'Failed to load tensor data: Io("eof")'),
            "Load error for 'd': Failed to load tensor data: Io(\"eof\")",
        ),
        (ReportError("e", "load_error", "plain"), "Load error for 'e': plain"),
    ],
)
def test_error_display(error: ReportError, text: str) -> None:
    assert error_display(error) == text
    assert error.display() == text
    assert str(error) == text


def test_report_error_validation() -> None:
    with pytest.raises(ValueError, match="kind"):
        ReportError("p", "nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shape"):
        ReportError("p", "shape_mismatch", expected=[1.5], found=[1])  # type: ignore[list-item]


def test_to_json_shape_and_round_trip() -> None:
    report = ApplyReport(
        applied=["fc2.weight"],
        skipped=["s"],
        missing=[("fc.weight", "Struct:Net.Struct:Linear"), ("embed.table", "Struct:Net.Struct:Embedding")],
        unused=["fc1.weight", "classifier.weight"],
        errors=[ReportError.shape_mismatch("x", [2], [3]), ReportError("y", "load_error", "boom")],
    )
    data = report.to_json()
    assert list(data) == ["applied", "skipped", "missing", "unused", "errors"]
    assert data["missing"] == [
        {"path": "embed.table", "container_path": "Struct:Net.Struct:Embedding", "did_you_mean": None},
        {"path": "fc.weight", "container_path": "Struct:Net.Struct:Linear", "did_you_mean": "fc1.weight"},
    ]
    assert data["unused"] == ["classifier.weight", "fc1.weight"]
    assert data["errors"][0] == {
        "path": "x",
        "kind": "shape_mismatch",
        "message": "expected [2], found [3]",
        "expected": [2],
        "found": [3],
    }
    assert data["errors"][1] == {"path": "y", "kind": "load_error", "message": "boom", "expected": None, "found": None}
    text = json.dumps(data)
    again = ApplyReport.from_json(json.loads(text))
    assert again == report
    assert again.display() == report.display()


def test_suggestion_picks_highest_score() -> None:
    # conv.weight scores 0.8424 against fc1.weight and 0.8418 against norm.weight.
    report = ApplyReport(missing=[("conv.weight", "")], unused=["norm.weight", "fc1.weight"])
    assert report.suggestion("conv.weight") == "fc1.weight"
    assert "│        Did you mean: 'fc1.weight'?" in report.display().split("\n")


def test_to_json_suggests_for_every_missing_path() -> None:
    data = _big_report().to_json()
    assert len(data["missing"]) == 12
    assert data["missing"][0]["did_you_mean"] == "feature.layer00.weight"


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"applied": []},
        {"applied": [], "skipped": [], "missing": [], "unused": [], "errors": [], "extra": 1},
        {"applied": [], "skipped": [], "missing": [1], "unused": [], "errors": []},
        {"applied": [], "skipped": [], "missing": [], "unused": [], "errors": [{"kind": "load_error"}]},
        {"applied": [], "skipped": [], "missing": [], "unused": [], "errors": [{"path": "a", "kind": "x"}]},
    ],
)
def test_from_json_rejects_malformed(data: object) -> None:
    with pytest.raises(ValueError):
        ApplyReport.from_json(data)  # type: ignore[arg-type]
