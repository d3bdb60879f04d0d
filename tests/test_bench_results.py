"""benchmarks/suite.py writes its tables into benchmarks/RESULTS.md and leaves every other section alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import suite  # noqa: E402


def test_the_suite_block_is_replaced_and_the_rest_kept() -> None:
    doc = suite.RESULTS.read_text()
    assert doc.count(suite.BEGIN) == doc.count(suite.END) == 1
    new = suite.with_suite_block(doc, "| new | table |\n")
    head, _, rest = doc.partition(suite.BEGIN)
    tail = rest.partition(suite.END)[2]
    assert new == f"{head}{suite.BEGIN}\n| new | table |\n{suite.END}{tail}"
    assert suite.with_suite_block(new, "| new | table |") == new  # idempotent


def test_a_document_without_the_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="markers"):
        suite.with_suite_block("# Benchmark results\n\n## Suite results\n", "x")
