"""Every relative link and `#anchor` of the documentation resolves (tools/check_doc_links.py), and
the checker finds what it must: a missing page, a missing heading, a repeated heading's `-1`."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_doc_links", REPO / "tools" / "check_doc_links.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_link_between_the_pages_resolves() -> None:
    assert _tool().broken_links() == []


def test_the_checker_finds_broken_links(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Usage\n\n## Usage\n\n<a id=\"here\"></a>text\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md#usage) [again](docs/a.md#usage-1) [html](docs/a.md#here) [web](https://x.y/#z)\n"
        "[gone](docs/b.md) [typo](docs/a.md#usag) [third](docs/a.md#usage-2)\n"
        "```\n[in code](nowhere.md)\n```\n`[inline](nowhere.md)`\n")
    assert _tool().broken_links(tmp_path) == ["README.md: docs/b.md: no such file",
                                              "README.md: docs/a.md#usag: no such heading",
                                              "README.md: docs/a.md#usage-2: no such heading"]
