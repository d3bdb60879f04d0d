"""The optional compiled kernels (migrator/core/kernels/) for modules that must not import numpy.

casts.py loads the same module for its conversions; diff and stats take it from here, so a
comparison or the stats of a float model can run without numpy's import (a tenth of a second
of start-up or more). The same rule as casts.py: absent when not built, off with
MIGRATOR_NO_KERNELS=1.
"""

from __future__ import annotations

import os
from typing import Any

NEEDED = ("float_stats", "same_bytes")
"""What diff and stats call: an older build of the kernels without them counts as absent."""


def load() -> Any:
    """`migrator.core._kernels`, or None when it was not built (or is a stale build without NEEDED) or
    MIGRATOR_NO_KERNELS is set."""
    if os.environ.get("MIGRATOR_NO_KERNELS"):
        return None
    try:
        from . import _kernels  # type: ignore[attr-defined]  # the C extension: no stub
    except ImportError:
        return None
    return _kernels if all(hasattr(_kernels, name) for name in NEEDED) else None


kernels = load()
"""The compiled loops or None; tests switch it off to run the numpy paths."""
