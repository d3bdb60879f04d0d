"""The ratchet of issue 42: outside `migrator/formats/`, no code compares a format's name with a literal
or keeps a hand list of them; it asks the format's spec (`formats.registry`: `is_format(f, for_burn=True)`,
`spec(f).keeps_structure`, `names(writable=True)`...). Read from the source with `ast`, so a comparison,
an `in (...)` test, a `match` case and a set or tuple of two names are all caught, wherever they are."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

from migrator.formats.registry import names

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "migrator"
NAMES = frozenset(names(folders=True))
assert {"burnpack", "safetensors", "pytorch", "gguf", "dcp", "deepspeed"} <= NAMES  # the test sees them all


def _is_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES


def _names_in(node: ast.AST) -> list[str]:
    """The format names a tuple, list or set literal (or `frozenset({...})`) lists."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set", "tuple"):
        return [n for a in node.args for n in _names_in(a)]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [e.value for e in node.elts if _is_name(e)]  # type: ignore[attr-defined]
    return []


def literal_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) of each comparison with a format-name literal and each hand list of format names."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, sides[:-1], sides[1:], strict=True):
                if isinstance(op, ast.Eq | ast.NotEq | ast.Is | ast.IsNot) and (_is_name(left) or _is_name(right)):
                    found.append((node.lineno, "compared with a format name"))
                elif isinstance(op, ast.In | ast.NotIn) and (_names_in(right) or _is_name(left)):
                    found.append((node.lineno, "tested against format names"))
        elif isinstance(node, ast.MatchValue) and _is_name(node.value):
            found.append((node.lineno, "a match case on a format name"))
        elif isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Call) and len(set(_names_in(node))) >= 2:
            found.append((node.lineno, "a hand-kept list of format names"))
        elif isinstance(node, ast.Dict) and sum(map(_is_name, (k for k in node.keys if k is not None))) >= 2:
            found.append((node.lineno, "a table keyed by format names"))
    return sorted(set(found))


def test_no_format_name_literal_is_compared_outside_formats() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO)
        if rel.parts[:2] == ("migrator", "formats"):
            continue
        offenders += [f"{rel}:{line}: {what}" for line, what in literal_uses(path.read_text(encoding="utf-8"))]
    assert offenders == [], "ask the format's spec (formats.registry) instead:\n" + "\n".join(offenders)


def test_the_shared_hooks_count_is_zero_too() -> None:
    pattern = (r"""(==|!=)\s*["'](burnpack|safetensors|pytorch|gguf|dcp|deepspeed)["']|"""
               r"""["'](burnpack|safetensors|pytorch|gguf|dcp|deepspeed)["']\s*(==|!=)""")
    out = subprocess.run(["grep", "-rnE", pattern, "migrator", "--include=*.py"], cwd=REPO, capture_output=True,
                         text=True, check=False).stdout
    hits = [line for line in out.splitlines() if not line.startswith("migrator/formats/")]
    assert hits == []


def test_the_check_sees_each_kind_of_use() -> None:
    """The checker itself: each spelling it must catch is caught, and a plain use of a name is not."""
    caught = {
        'x == "gguf"': 1, '"pytorch" != fmt': 1, 'fmt in ("auto", "burnpack")': 1, 'f not in ["dcp"]': 1,
        'fmt in frozenset({"safetensors", "pytorch"})': 2,  # the test and the list itself
        'KINDS = ("safetensors", "pytorch")': 1, 'T = {"gguf": 1, "pytorch": 2}': 1,
        'match fmt:\n    case "burnpack":\n        pass': 1,
    }
    for source, n in caught.items():
        assert len(literal_uses(source)) == n, (source, literal_uses(source))
    for fine in ('open_file(p, "gguf")', 'x = "pytorch"', 'fmt == "auto"', 'd = {"gguf": 1}', 'fmt in ("auto",)'):
        assert literal_uses(fine) == [], fine
