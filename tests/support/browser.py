"""Headless Chromium from Debian's package, driven by playwright (its own browser downloads are not
used): shared by the HTML report tests and benchmarks/html_report.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = Path(os.environ.get("MIGRATOR_CHROMIUM", "/usr/bin/chromium"))
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def missing() -> str | None:
    """Why no browser can run here (None when one can)."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is not installed (apt-get install -y chromium; .ci/run does it)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (it is in the dev extra)"
    return None


@contextmanager
def chromium(user_data_dir: Path, viewport: dict[str, int] | None = None, **options: Any) -> Iterator[Any]:
    """A browser context with a fresh profile in `user_data_dir` (created empty by the caller)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(user_data_dir), executable_path=str(CHROMIUM), headless=True, args=ARGS,
            viewport=viewport or {"width": 1200, "height": 900}, **options)
        try:
            yield context
        finally:
            context.close()
