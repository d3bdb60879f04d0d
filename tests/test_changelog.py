"""The version is written into every output's metadata, so its three records agree: pyproject.toml,
migrator/core/version.py and the newest version of CHANGELOG.md (Keep a Changelog headings)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEADING = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (Unreleased|\d{4}-\d{2}-\d{2})$", re.M)


def _versions() -> list[tuple[str, str]]:
    return HEADING.findall((REPO / "CHANGELOG.md").read_text(encoding="utf-8"))


def test_the_version_files_and_the_changelog_agree() -> None:
    # the [project] table's `version` (tomllib is Python 3.11+; the package supports 3.10)
    project_table = (REPO / "pyproject.toml").read_text(encoding="utf-8").split("[project]", 1)[1].split("\n[", 1)[0]
    found = re.search(r'^version = "([^"]+)"$', project_table, re.M)
    assert found is not None
    project = found.group(1)
    module = re.search(r'^__version__ = "([^"]+)"$', (REPO / "migrator" / "core" / "version.py").read_text(
        encoding="utf-8"), re.M)
    assert module is not None
    assert module.group(1) == project, "pyproject.toml and migrator/core/version.py disagree"
    assert _versions(), "CHANGELOG.md has no '## [X.Y.Z] - DATE' heading"
    assert _versions()[0][0] == project, "CHANGELOG.md's newest version is not pyproject.toml's"


def test_the_changelog_lists_versions_newest_first_with_one_unreleased_at_most() -> None:
    found = _versions()
    numbers = [tuple(map(int, v.split("."))) for v, _ in found]
    assert numbers == sorted(numbers, reverse=True) and len(set(numbers)) == len(numbers)
    assert [d for _, d in found[1:] if d == "Unreleased"] == [], "only the newest version may be unreleased"
    dates = [d for _, d in found if d != "Unreleased"]
    assert dates == sorted(dates, reverse=True)


def test_the_readme_links_to_the_changelog() -> None:
    assert "](CHANGELOG.md)" in (REPO / "README.md").read_text(encoding="utf-8")
