"""A new op is one module: a toy `negate` op (the one docs/layout.md shows) written into tmp_path (its
options, its shape rule, the bytes it streams), registered by being imported, then run by
`migrate run` on a recipe using it.
The output is compared with torch's negation of the source tensor; the toy's refused case is placed
at its recipe line like a built-in op's; `migrate schema` lists it.

The toy runs in a new process so the registry of this one keeps the built-in ops only. The recipe
model is built before the toy is imported there: registering it later must still reach the recipe."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

REPO = Path(__file__).resolve().parents[2]

TOY = (REPO / "docs" / "layout.md").read_text(encoding="utf-8").split("## Adding an op")[1] \
    .split("```python\n")[1].split("```")[0]
"""The toy op: the module docs/layout.md shows."""

DRIVER = '''\
import sys

from migrator.cli import main
from migrator.recipe.loader import load_recipe

load_recipe(sys.argv[1])  # the recipe model is built before the toy op exists
import toy_negate  # noqa: E402,F401  one import registers it

sys.exit(main(sys.argv[2:]))
'''


def _migrate(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "plain.yaml"), *args],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": f"{REPO}:{tmp_path}", "PATH": "/usr/bin:/bin"})


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    (tmp_path / "toy_negate.py").write_text(TOY, encoding="utf-8")
    (tmp_path / "driver.py").write_text(DRIVER, encoding="utf-8")
    (tmp_path / "plain.yaml").write_text("version: 1\nsource: {path: in.safetensors}\n"
                                         "target: {path: plain.safetensors}\n", encoding="utf-8")
    g = torch.Generator().manual_seed(3)
    st.save_file({"w": torch.randn(300, 70, generator=g), "b": torch.randn(70, generator=g),
                  "idx": torch.arange(6, dtype=torch.int32)}, tmp_path / "in.safetensors")
    return tmp_path


def test_a_toy_op_in_one_module_runs_in_a_recipe(toy: Path) -> None:
    (toy / "r.yaml").write_text(textwrap.dedent("""\
        version: 1
        source: {path: in.safetensors}
        target: {path: out.safetensors}
        ops:
          - negate: {from: 'w', to: 'w_neg'}
    """), encoding="utf-8")
    p = _migrate(toy, "run", "r.yaml")
    assert p.returncode == 0, p.stderr
    src, out = st.load_file(toy / "in.safetensors"), st.load_file(toy / "out.safetensors")
    assert sorted(out) == ["b", "idx", "w_neg"]
    assert torch.equal(out["w_neg"], torch.neg(src["w"]))
    assert torch.equal(out["b"], src["b"]) and torch.equal(out["idx"], src["idx"])


def test_a_toy_op_refuses_at_its_recipe_line(toy: Path) -> None:
    (toy / "r.yaml").write_text("version: 1\nsource: {path: in.safetensors}\ntarget: {path: out.safetensors}\n"
                                "ops:\n  - negate: {from: 'idx'}\n", encoding="utf-8")
    p = _migrate(toy, "run", "r.yaml")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].endswith(
        "r.yaml:5:14: ops[0].negate.from: 'idx' is I32: negate takes F32"), p.stderr
    assert "Traceback" not in p.stderr
    assert not (toy / "out.safetensors").exists()


def test_the_schema_lists_a_toy_op(toy: Path) -> None:
    p = _migrate(toy, "schema")
    assert p.returncode == 0, p.stderr
    assert '"NegateOpSpec"' in p.stdout and '"Negate each matching F32 tensor."' in p.stdout
