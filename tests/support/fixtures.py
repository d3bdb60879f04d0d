"""Where the reference files live: `../shared/fixtures` (files written by PyTorch, safetensors and Burn),
or `MIGRATOR_SHARED_FIXTURES`; a test whose file is absent is skipped, not failed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED_FIXTURES = Path(os.environ.get("MIGRATOR_SHARED_FIXTURES", REPO.parent / "shared" / "fixtures"))


def fixture_file(*parts: str) -> Path:
    """A path below `../shared/fixtures`, skipping the test when it is absent."""
    path = SHARED_FIXTURES.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"reference fixture not found: {path}")
    return path
