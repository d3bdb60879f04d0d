"""The package layout: packages stacked by pipeline stage, each importing only from the ones below.

Every import is read from the source (ast), inside functions and under TYPE_CHECKING too: a lazy
import is still a dependency, it only moves the cost. The rules (docs/layout.md says why):

- a package imports nothing from a package above it in `LAYERS`; the modules at the top of
  `migrator/` (the public API) may import anything;
- the import graph of migrator/, tools/ and benchmarks/ has no cycle; the longest chain of the
  imports a module runs when it is imported (those at module level, outside TYPE_CHECKING) is at
  most `MAX_CHAIN` modules;
- a private name (`_x`) is imported only inside its own package;
- `formats/safepickle` is a leaf: it imports only from `core`, and only the PyTorch, DCP and Megatron
  torch_dist formats import it;
- the top of `migrator/` holds at most `MAX_TOP_MODULES` modules.

The checker runs on the repository and, to show it can fail, on small trees written in tmp_path.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("core", "naming", "storage", "formats", "files", "ops", "recipe", "transform", "plan", "analysis", "run",
          "cli")
"""Bottom to top. A module at the top of migrator/ (`api`, `__init__`) is above all of them."""
MAX_CHAIN = 12
# Counting imports inside functions too, the chain issue 26 measures (20 at 36b74e3, its cycles
# condensed; 12 is its target, 31 before the reshaping docs/layout.md describes): a ratchet, lowered as
# the chain shortens, so it cannot grow unseen.
MAX_CHAIN_ALL_IMPORTS = 26
MAX_TOP_MODULES = 6
LEAVES = {"migrator.formats.safepickle": ({"core"}, ("migrator.formats.pytorch.", "migrator.formats.dcp.",
                                                     "migrator.formats.torch_dist."))}
"""package -> (the packages it may import from, the module prefixes that may import it)"""
SCANNED = ("migrator", "tools", "benchmarks", "recipes")
EXTENSIONS = {"migrator.core._kernels": "migrator/core/kernels/module.c"}
"""The compiled extensions setup.py builds, each named by the C file that defines the module."""


@dataclass(frozen=True)
class Import:
    source: str  # importing module (dotted)
    target: str  # imported module (dotted)
    name: str | None  # the name taken from it (`from target import name`), None for the module itself
    where: str  # file:line, the file relative to the tree's root
    eager: bool  # run when the importing module is imported: at module level, not under TYPE_CHECKING


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path, folders: tuple[str, ...] = SCANNED) -> dict[str, Path]:
    """Every Python module under `folders` (and the compiled extensions' sources, as modules)."""
    found = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            found[module_name(root, path)] = path
    for name, source in EXTENSIONS.items():  # `from . import _kernels`: a module built from C files
        if source.split("/")[0] in folders and (root / source).is_file():
            found[name] = root / source
    return found


def _import_nodes(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement, and whether it runs at import time (not in a function or class body,
    not under `if TYPE_CHECKING:`)."""
    def visit(node: ast.AST, eager: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, eager
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from visit(child, False)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from visit(ast.Module(body=child.body, type_ignores=[]), False)
                yield from visit(ast.Module(body=child.orelse, type_ignores=[]), eager)
            else:
                yield from visit(child, eager)

    yield from visit(tree, True)


def imports(root: Path, found: dict[str, Path]) -> Iterator[Import]:
    """Every import of a migrator module, wherever it is written in the file."""
    for source, path in found.items():
        if path.suffix != ".py":
            continue
        is_package = path.name == "__init__.py"
        file = path.relative_to(root).as_posix()
        for node, eager in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            where = f"{file}:{node.lineno}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "migrator":
                        yield Import(source, _existing(alias.name, found), None, where, eager)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    package = source.split(".") if is_package else source.split(".")[:-1]
                    package = package[: len(package) - node.level + 1]
                    target = ".".join([*package, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                if target.split(".")[0] != "migrator":
                    continue
                for alias in node.names:
                    if f"{target}.{alias.name}" in found:
                        yield Import(source, f"{target}.{alias.name}", None, where, eager)
                    else:
                        yield Import(source, _existing(target, found), alias.name, where, eager)


def _existing(dotted: str, found: dict[str, Path]) -> str:
    """The module a dotted name lives in (`migrator.x.y.Name` -> `migrator.x.y`)."""
    name = dotted
    while name and name not in found:
        name = name.rpartition(".")[0]
    return name or dotted


def package_of(module: str) -> str | None:
    """The stage a migrator module belongs to; None for the top of migrator/ and for tools/benchmarks."""
    parts = module.split(".")
    if parts[0] != "migrator" or len(parts) < 2 or parts[1] not in LAYERS:
        return None
    return parts[1]


def rank(module: str) -> int:
    package = package_of(module)
    return LAYERS.index(package) if package else len(LAYERS)


def upward(found: list[Import]) -> list[str]:
    """Imports from a package above the importer's."""
    return [f"{i.where}: {i.source} imports {i.target} ({package_of(i.target) or 'top'}), which is "
            f"above {package_of(i.source)}" for i in found
            if i.source.startswith("migrator.") and package_of(i.source) and rank(i.target) > rank(i.source)]


def private_crossings(found: list[Import]) -> list[str]:
    """`_name`s (and `_module`s) taken from another package: what a package keeps to itself."""
    problems = []
    for i in found:
        name = i.name if i.name is not None else i.target.rpartition(".")[2]
        if not (name.startswith("_") and not name.startswith("__")):
            continue
        home = package_of(i.target) or i.target.rsplit(".", 1)[0]
        here = package_of(i.source) or i.source.rsplit(".", 1)[0]
        if home != here:
            problems.append(f"{i.where}: {i.source} imports the private {name} of {i.target}")
    return problems


def leaf_problems(found: list[Import]) -> list[str]:
    problems = []
    for leaf, (allowed, importers) in LEAVES.items():
        for i in found:
            inside_source, inside_target = _inside(i.source, leaf), _inside(i.target, leaf)
            if inside_source and not inside_target and package_of(i.target) not in allowed:
                problems.append(f"{i.where}: {leaf} is a leaf, but imports {i.target}")
            if inside_target and not inside_source and i.source.startswith("migrator.") \
                    and not i.source.startswith(importers):
                problems.append(f"{i.where}: {i.source} imports {leaf}, which only "
                                f"{', '.join(importers)} may use")
    return problems


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def graph(found: list[Import], *, eager_only: bool = False) -> dict[str, set[str]]:
    """importer -> the modules it imports (only those run at import time with `eager_only`)."""
    edges: dict[str, set[str]] = {}
    for i in found:
        edges.setdefault(i.source, set())
        if i.target != i.source and (i.eager or not eager_only):
            edges[i.source].add(i.target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def cycle_problems(found: list[Import]) -> list[str]:
    """Each cycle with the lines that close it (the imports between its members)."""
    problems = []
    for component in cycles(graph(found)):
        members = set(component)
        lines = sorted({i.where + f" ({i.source} -> {i.target})" for i in found
                        if i.source in members and i.target in members and i.source != i.target})
        problems.append(f"cycle of {len(component)} modules: " + "; ".join(lines))
    return problems


def longest_chain(edges: dict[str, set[str]]) -> list[str]:
    """The longest import chain (modules, importer first) of an acyclic graph."""
    memo: dict[str, list[str]] = {}

    def chain(node: str) -> list[str]:
        if node not in memo:
            memo[node] = [node, *max((chain(child) for child in sorted(edges.get(node, ()))), key=len, default=[])]
        return memo[node]

    return max((chain(node) for node in sorted(edges)), key=len, default=[])


def check(root: Path) -> tuple[list[str], list[Import]]:
    """Every problem of the tree at `root`, and its imports."""
    found = list(imports(root, modules(root)))
    return upward(found) + private_crossings(found) + leaf_problems(found) + cycle_problems(found), found


def test_packages_import_only_downward_without_cycles_or_private_names() -> None:
    problems, _ = check(ROOT)
    assert problems == [], "\n".join(problems)


def test_every_package_has_a_layer() -> None:
    packages = sorted(p.name for p in (ROOT / "migrator").iterdir() if (p / "__init__.py").exists())
    assert packages == sorted(LAYERS)


def test_longest_import_chain() -> None:
    """What importing one module loads, at most MAX_CHAIN modules deep (imports inside functions
    are a dependency, counted for the layers and cycles, but load nothing until called)."""
    problems, found = check(ROOT)
    assert not problems  # a chain is only defined without cycles
    chain = longest_chain(graph(found, eager_only=True))
    assert len(chain) <= MAX_CHAIN, " -> ".join(chain)


def test_longest_chain_counting_imports_inside_functions_does_not_grow() -> None:
    problems, found = check(ROOT)
    assert not problems
    chain = longest_chain(graph(found))
    assert len(chain) <= MAX_CHAIN_ALL_IMPORTS, " -> ".join(chain)


def test_top_of_the_package_holds_only_the_public_api() -> None:
    top = sorted(p.name for p in (ROOT / "migrator").glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


def test_dir_of_the_package_lists_only_public_names() -> None:
    import migrator

    listed = dir(migrator)
    assert not {"Any", "TYPE_CHECKING", "annotations"} & set(listed)
    assert set(migrator.__all__) <= set(listed)


# The checker itself, on trees written here: each rule fails when broken.

def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for folder in ("migrator", *(f"migrator/{p}" for p in LAYERS)):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "__init__.py").touch()
    return root


def test_a_reverse_import_fails_with_its_line(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"migrator/core/errors.py": '"""Errors."""\n\n\ndef f():\n    from ..cli.main import run\n',
                            "migrator/cli/main.py": "def run():\n    pass\n"})
    problems, _ = check(root)
    assert problems == ["migrator/core/errors.py:5: migrator.core.errors imports migrator.cli.main (cli), which is "
                        "above core"]


def test_a_reverse_import_under_type_checking_fails(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"migrator/storage/atomic.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                            "    from migrator.files.io import save\n",
                            "migrator/files/io.py": "from ..storage.atomic import write\n"})
    problems, _ = check(root)
    assert problems[0].startswith("migrator/storage/atomic.py:3: migrator.storage.atomic imports migrator.files.io")
    assert problems[1].startswith("cycle of 2 modules: migrator/files/io.py:1 (migrator.files.io -> "
                                  "migrator.storage.atomic); migrator/storage/atomic.py:3")


def test_a_cycle_inside_a_package_fails(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"migrator/plan/a.py": "from . import b\n", "migrator/plan/b.py": "def f():\n"
                            "    from .a import g\n"})
    problems, _ = check(root)
    assert problems == ["cycle of 2 modules: migrator/plan/a.py:1 (migrator.plan.a -> migrator.plan.b); "
                        "migrator/plan/b.py:2 (migrator.plan.b -> migrator.plan.a)"]


def test_a_private_name_across_packages_fails(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"migrator/core/atomic.py": "def _reserve():\n    pass\n",
                            "migrator/run/go.py": "from ..core.atomic import _reserve\n",
                            "migrator/core/other.py": "from .atomic import _reserve\n",
                            "tools/t.py": "from migrator.core.atomic import _reserve\n"})
    problems, _ = check(root)
    assert problems == ["migrator/run/go.py:1: migrator.run.go imports the private _reserve of migrator.core.atomic",
                        "tools/t.py:1: tools.t imports the private _reserve of migrator.core.atomic"]


def test_the_leaf_stays_a_leaf(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"migrator/formats/safepickle/__init__.py": "from ..base import Reader\n",
                            "migrator/formats/base.py": "class Reader:\n    pass\n",
                            "migrator/formats/burnpack.py": "from .safepickle import load\n",
                            "migrator/formats/pytorch/reader.py": "from .. import safepickle\n"})
    problems, _ = check(root)
    assert sorted(problems) == ["migrator/formats/safepickle/__init__.py:1: migrator.formats.safepickle is a leaf, but "
                        "imports migrator.formats.base",
                        "migrator/formats/burnpack.py:1: migrator.formats.burnpack imports "
                        "migrator.formats.safepickle, which only migrator.formats.pytorch., "
                        "migrator.formats.dcp., migrator.formats.torch_dist. may use"][::-1]


def test_the_longest_chain_is_measured(tmp_path: Path) -> None:
    """At import time: module-level imports only; a function's or TYPE_CHECKING's import adds no depth."""
    root = _tree(tmp_path, {"migrator/core/a.py": "", "migrator/core/b.py": "from . import a\n",
                            "migrator/naming/c.py": "from ..core import b\n",
                            "migrator/naming/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                    "    from . import c\n",
                            "tools/d.py": "import migrator.naming.c\n\n\ndef f():\n    import migrator.naming.e\n"})
    problems, found = check(root)
    assert problems == []
    assert longest_chain(graph(found, eager_only=True)) == ["tools.d", "migrator.naming.c", "migrator.core.b",
                                                           "migrator.core.a"]
    assert longest_chain(graph(found)) == ["tools.d", "migrator.naming.e", "migrator.naming.c", "migrator.core.b",
                                           "migrator.core.a"]
