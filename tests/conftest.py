"""Shared test helpers: where the reference files live, and skipping cleanly without them.

Each test of a file that needs an oracle or a server is marked `oracle`, from the file's imports
(see `needs_oracle`), so `make test-fast` (`-m "not oracle and not slow"`) runs the rest.

Hypothesis runs derandomized (the same examples every run), with no example database (nothing is
written into the checkout, and a run does not depend on what an earlier run found) and no per-example
deadline (a wall-clock limit fails on a busy machine; the fuzz tests bound time with SIGALRM instead).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support.fixtures import SHARED_FIXTURES

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


ORACLES = frozenset({"torch", "transformers", "peft", "mergekit", "gguf", "deepspeed", "ray", "accelerate",
                     "llama_cpp", "moto", "boto3", "fsspec", "s3fs", "gcsfs", "adlfs", "remote_servers"})
"""What `make test-fast` leaves out: the heavy oracles, object stores and their servers
(tests/support/remote_servers.py)."""
SUPPORT = Path(__file__).resolve().parent / "support"
IMPORTERS = frozenset({"importorskip", "import_module", "find_spec", "__import__"})


def _called(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


_SEEN: dict[Path, bool] = {}


def needs_oracle(path: Path) -> bool:
    """Whether a test module (or a helper of `tests/` it imports, or a script of `tests/` it names,
    such as `tests/support/zero_run.py` run in a subprocess) imports an oracle, anywhere in it: read from its
    source, so no test is listed by hand."""
    if path in _SEEN:  # known, or being read (helpers that import each other)
        return _SEEN[path]
    _SEEN[path] = False
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        tree = None
    _SEEN[path] = tree is None or _imports_an_oracle(tree)
    return _SEEN[path]


def _imports_an_oracle(tree: ast.Module) -> bool:
    local: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            tops = [a.name.rsplit(".", 1)[1] if a.name.startswith("tests.support.") else a.name.split(".")[0]
                    for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops = [node.module.split(".")[0]]
            if node.module.startswith("tests.support."):  # a shared helper: read it too
                tops = [node.module.rsplit(".", 1)[1]]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value
            if name.endswith(".py") and "/" not in name and "\\" not in name:
                local.add(name[:-3])  # a helper script run by name
            continue
        elif isinstance(node, ast.Call) and node.args and _called(node) in IMPORTERS:
            first = node.args[0]  # pytest.importorskip("torch"), importlib.import_module("ray")
            named = isinstance(first, ast.Constant) and isinstance(first.value, str)
            tops = [first.value.split(".")[0]] if named else []  # type: ignore[attr-defined]
        else:
            continue
        if any(t in ORACLES for t in tops):
            return True
        local.update(tops)
    helpers = (SUPPORT / f"{m}.py" for m in sorted(local))
    return any(needs_oracle(h) for h in helpers if h.is_file())


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true",
                     help="only the tests that need no oracle or server and are not slow (`make test-fast`): "
                          "the other files are not even imported")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if (config.getoption("--fast") and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_") and needs_oracle(collection_path)):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    fast = config.getoption("--fast")
    kept = []
    for item in items:
        if needs_oracle(Path(str(item.path))):
            item.add_marker(pytest.mark.oracle)
        if not (fast and item.get_closest_marker("slow")):
            kept.append(item)
    if len(kept) != len(items):
        kept_ids = set(map(id, kept))
        config.hook.pytest_deselected(items=[i for i in items if id(i) not in kept_ids])
        items[:] = kept
