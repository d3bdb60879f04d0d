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
import importlib
import sys

from migrator.cli import main
from migrator.recipe.loader import load_recipe

load_recipe(sys.argv[1])  # the recipe model is built before the toy op exists
importlib.import_module(sys.argv[2])  # one import registers it

sys.exit(main(sys.argv[3:]))
'''


def _migrate(tmp_path: Path, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`migrate ARGS` in a new process that imports the toy op's `module` (from tmp_path) first."""
    return subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "plain.yaml"), module, *args],
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
    p = _migrate(toy, "toy_negate", "run", "r.yaml")
    assert p.returncode == 0, p.stderr
    src, out = st.load_file(toy / "in.safetensors"), st.load_file(toy / "out.safetensors")
    assert sorted(out) == ["b", "idx", "w_neg"]
    assert torch.equal(out["w_neg"], torch.neg(src["w"]))
    assert torch.equal(out["b"], src["b"]) and torch.equal(out["idx"], src["idx"])


def test_a_toy_op_refuses_at_its_recipe_line(toy: Path) -> None:
    (toy / "r.yaml").write_text("version: 1\nsource: {path: in.safetensors}\ntarget: {path: out.safetensors}\n"
                                "ops:\n  - negate: {from: 'idx'}\n", encoding="utf-8")
    p = _migrate(toy, "toy_negate", "run", "r.yaml")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].endswith(
        "r.yaml:5:14: ops[0].negate.from: 'idx' is I32: negate takes F32"), p.stderr
    assert "Traceback" not in p.stderr
    assert not (toy / "out.safetensors").exists()


def test_the_schema_lists_a_toy_op(toy: Path) -> None:
    p = _migrate(toy, "toy_negate", "schema")
    assert p.returncode == 0, p.stderr
    assert '"NegateOpSpec"' in p.stdout and '"Negate each matching F32 tensor."' in p.stdout


LAYOUT_TOYS = '''\
"""Two toy renames: the same bytes under another name; one declares that it keeps the layout."""

from migrator.ops.base import Op, UnaryOptions
from migrator.ops.reshape import reshape


class _Renaming(Op):  # no name: a base, not registered
    options = UnaryOptions
    summary = "The same tensor under another name."
    example = "{alias: {from: 'w', to: 'v'}}"

    def build(self, step, inputs):
        s = inputs[0]
        return [(reshape(s.tensor, step.output_name(s.name), s.tensor.shape), f"{self.name} {s.name}")]


class Alias(_Renaming, name="alias"):
    keeps_layout = True


class Moved(_Renaming, name="moved"):
    pass
'''


@pytest.mark.parametrize("op", ["alias", "moved"])
def test_a_toy_op_says_whether_factored_optimizer_state_follows_it(tmp_path: Path, op: str) -> None:
    """Adafactor's factored row_var/col_var are not shaped like their parameter: they follow an op only
    when it declares `keeps_layout` (torch's own optimizer state is the oracle of what is kept)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 6)
    opt = torch.optim.Adafactor([{"params": list(model.named_parameters())}], lr=1e-2,  # names saved with it
                                foreach=False)
    model(torch.randn(4, 8)).square().sum().backward()
    opt.step()
    assert opt.state[model.weight]["row_var"].shape == (6, 1)  # factored
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "ckpt.pt")
    (tmp_path / "toy_renames.py").write_text(LAYOUT_TOYS, encoding="utf-8")
    (tmp_path / "driver.py").write_text(DRIVER, encoding="utf-8")
    (tmp_path / "plain.yaml").write_text("version: 1\nsource: {path: ckpt.pt}\ntarget: {path: plain.pt}\n")
    (tmp_path / "r.yaml").write_text("version: 1\nsource: {path: ckpt.pt, top_level_key: model}\n"
                                     f"training_state: keep\nops:\n  - {op}: {{from: 'weight', to: 'kernel'}}\n"
                                     "target: {path: out.pt}\n", encoding="utf-8")
    p = _migrate(tmp_path, "toy_renames", "run", "r.yaml")
    if op == "moved":
        assert p.returncode == 1 and "Traceback" not in p.stderr
        assert "'kernel' goes through moved weight" in p.stderr and "row_var" in p.stderr, p.stderr
        assert not (tmp_path / "out.pt").exists()
        return
    assert p.returncode == 0, p.stderr
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert list(out["model"]) == ["kernel", "bias"]
    assert torch.equal(out["model"]["kernel"], model.weight.detach())
    state = out["optimizer"]["state"][0]
    for key in ("row_var", "col_var"):
        assert torch.equal(state[key], opt.state[model.weight][key]), key
