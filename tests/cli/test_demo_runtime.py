"""`make demo` needs the runtime dependencies only (issue 25 item 12): the demo data generator and
every shipped recipe import nothing beyond the standard library, migrator and the packages a plain
`pip install .` brings (numpy, ml_dtypes, pydantic, PyYAML, rich)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNTIME = {"numpy", "ml_dtypes", "pydantic", "pydantic_core", "yaml", "_yaml", "rich", "typing_extensions", "re2",
           "annotated_types", "typing_inspection", "markdown_it", "mdurl", "pygments", "migrator", "ops_demo",
           "merge_demo", "generate_demo_data", "_virtualenv", "_distutils_hack", "sitecustomize", "usercustomize"}


def _makefile_recipes() -> list[str]:
    text = (REPO / "Makefile").read_text()
    block = re.search(r"^RECIPES := (.*?)\n\n", text, re.DOTALL | re.MULTILINE)
    assert block is not None
    return block.group(1).replace("\\\n", " ").split()


def test_demo_imports_only_runtime_dependencies(tmp_path: Path) -> None:
    import shutil

    shutil.copytree(REPO / "recipes", tmp_path / "recipes")
    recipes = _makefile_recipes()
    assert len(recipes) >= 15
    code = f"""
import runpy, sys
sys.argv = ["generate_demo_data.py", {str(tmp_path / "demo-out")!r}]
sys.path.insert(0, {str(tmp_path / "recipes")!r})
runpy.run_path({str(tmp_path / "recipes" / "generate_demo_data.py")!r}, run_name="__main__")
from migrator.cli import main
for name in {recipes!r}:
    assert main(["run", {str(tmp_path / "recipes")!r} + "/" + name + ".yaml", "--no-progress"]) == 0, name
print(sorted({{m.split(".")[0] for m in sys.modules}} - set(sys.stdlib_module_names)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    # compiled extensions' own runtime modules (numpy's Cython parts) and the interpreter's are not packages
    imported = {m for m in eval(out.stdout.strip().splitlines()[-1])
                if not m.startswith(("_cython_", "cython_runtime", "_sysconfigdata_", "__main__"))}
    assert imported - RUNTIME == set(), f"the demo imports dev-only packages: {sorted(imported - RUNTIME)}"


def test_demo_target_installs_the_runtime_only() -> None:
    text = (REPO / "Makefile").read_text()
    assert re.search(r"^demo: install-runtime$", text, re.MULTILINE)
    runtime = text[text.index("$(RUNTIME_STAMP): "):text.index("$(STAMP): ")]
    assert "-e ." in runtime and "[dev]" not in runtime and "torch" not in runtime


def test_every_demo_recipe_may_replace_its_output() -> None:
    """`make demo` validates every recipe after running them all, and validation refuses a target that
    exists unless the recipe says `overwrite: true` (hf-llama-to-megatron once did not: demo failed)."""
    import yaml

    from tests.support.recipes import ORDER

    recipes = Path(__file__).resolve().parents[2] / "recipes"
    missing = [name for name in ORDER
               if not yaml.safe_load((recipes / f"{name}.yaml").read_text())["target"].get("overwrite")]
    assert missing == []
