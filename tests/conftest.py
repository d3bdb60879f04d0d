"""Shared test helpers: where the reference files live, and skipping cleanly without them.

Hypothesis runs derandomized (the same examples every run), with no example database (nothing is
written into the checkout, and a run does not depend on what an earlier run found) and no per-example
deadline (a wall-clock limit fails on a busy machine; the fuzz tests bound time with SIGALRM instead).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parents[1]
SHARED_FIXTURES = Path(os.environ.get("MIGRATOR_SHARED_FIXTURES", REPO.parent / "shared" / "fixtures"))

settings.register_profile("migrator", derandomize=True, database=None, deadline=None)
settings.load_profile("migrator")


@pytest.fixture(autouse=True)
def _no_inherited_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Text output fits `COLUMNS` when it is set: tests (and the commands they start) run without an
    inherited one (pytest-xdist workers can have it), so a table's layout never depends on where the
    suite runs. Tests about widths set it themselves."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture
def shared_fixtures() -> Path:
    """`../shared/fixtures` (files written by PyTorch, safetensors and Burn); skip when absent."""
    if not SHARED_FIXTURES.is_dir():
        pytest.skip(f"reference fixtures not found at {SHARED_FIXTURES}")
    return SHARED_FIXTURES


def fixture_file(*parts: str) -> Path:
    """A path below `../shared/fixtures`, skipping the test when it is absent."""
    path = SHARED_FIXTURES.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"reference fixture not found: {path}")
    return path
