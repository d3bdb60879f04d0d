"""Test files share helpers only through the `tests.support` package (run under
`--import-mode=importlib`, where a test file is not importable by its basename): a test file that
imports another test file, `conftest` or a helper by a bare name fails here, naming the line."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SUPPORT_MODULES = {p.stem for p in (TESTS / "support").glob("*.py")}


def _bad_imports(path: Path, root: Path = TESTS.parent) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top.startswith("test_") or top == "conftest" or top in SUPPORT_MODULES or top.endswith("_support"):
                bad.append(f"{path.relative_to(root)}:{node.lineno}: imports {name}")
    return bad


def test_no_test_file_imports_another_by_its_basename() -> None:
    bad = [line for path in sorted(TESTS.rglob("*.py")) for line in _bad_imports(path)]
    assert not bad, "import shared helpers from tests.support instead:\n" + "\n".join(bad)


def test_the_check_catches_a_bare_import(tmp_path: Path) -> None:
    bad = tmp_path / "test_x.py"
    bad.write_text("from test_gguf_llama import TEXT\nimport cli\nfrom tests.support.cli import migrate_in_process\n")
    assert _bad_imports(bad, tmp_path) == ["test_x.py:1: imports test_gguf_llama", "test_x.py:2: imports cli"]
