"""Issue 20 item 17: `convert --emit-recipe -o FILE` writes a recipe that reproduces the convert.

The recipe goes through the atomic write path, its paths are relative to its own folder (it is
run from another folder here), and its `$schema` line names a schema file that exists."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from migrator import open_file
from tests.support.cli import migrate_subprocess

torch = pytest.importorskip("torch")
nn = torch.nn


migrate = migrate_subprocess


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6), nn.ReLU(), nn.LayerNorm(6), nn.Linear(6, 3))
    (tmp_path / "ckpt").mkdir()
    torch.save({"model": model.state_dict(), "epoch": 3}, tmp_path / "ckpt" / "orig.pt")
    (tmp_path / "elsewhere").mkdir()
    return tmp_path


OPTIONS = ["--top-level-key", "model", "--adapter", "pytorch_to_burn", "--modules", r"LayerNorm=^layers\.2$",
           "--dtype", "F16", "--remap", "^=layers."]


def convert_and_rerun(workspace: Path, target: str, options: list[str], recipe: str) -> tuple[bytes, bytes]:
    """The bytes `convert --emit-recipe -o RECIPE` wrote, and those `migrate run RECIPE` writes again
    (run from another folder: the recipe's paths must be relative to its own)."""
    done = migrate("convert", "ckpt/orig.pt", target, *options, "--emit-recipe", "-o", recipe, cwd=workspace)
    assert done.returncode == 0, done.stderr
    assert f"wrote {recipe}" in done.stdout
    first = (workspace / target).read_bytes()
    (workspace / target).unlink()
    ran = migrate("run", str(workspace / recipe), cwd=workspace / "elsewhere")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return first, (workspace / target).read_bytes()


def test_emitted_recipe_reproduces_the_convert(workspace: Path) -> None:
    first, again = convert_and_rerun(workspace, "out/a.pt", ["--adapter", "float_cast:BF16", "--top-level-key",
                                                             "model"], "recipes/back.yaml")
    assert again == first
    want = torch.load(workspace / "ckpt" / "orig.pt", weights_only=True)["model"]
    got = torch.load(workspace / "out" / "a.pt", weights_only=True)
    # a PyTorch target keeps the names the module loads (renumbering is for Burn only)
    assert list(got) == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias", "5.weight", "5.bias"]
    assert torch.equal(got["5.weight"], want["5.weight"].to(torch.bfloat16))


def test_emitted_burnpack_recipe_paths_and_schema(workspace: Path) -> None:
    first, again = convert_and_rerun(workspace, "out/a.bpk", OPTIONS, "recipes/r.yaml")
    assert again == first  # metadata included: the convert records the recipe's hash as the run does
    text = (workspace / "recipes" / "r.yaml").read_text()
    import yaml

    data = yaml.safe_load(text)
    assert data["source"]["path"] == "../ckpt/orig.pt" and data["target"]["path"] == "../out/a.bpk"
    first_line = text.splitlines()[0]
    assert first_line.startswith("# yaml-language-server: $schema=file://")
    schema = Path(unquote(urlparse(first_line.split("$schema=", 1)[1]).path))
    shown = migrate("schema", cwd=workspace)
    assert schema.is_file() and json.loads(schema.read_text()) == json.loads(shown.stdout)
    import hashlib

    with open_file(workspace / "out" / "a.bpk") as a:
        assert list(a) == ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias",
                           "layers.2.gamma", "layers.2.beta", "layers.3.weight", "layers.3.bias"]
        assert a.metadata["migrator.recipe_sha256"] == hashlib.sha256(text.encode()).hexdigest()
        want = torch.load(workspace / "ckpt" / "orig.pt", weights_only=True)["model"]
        assert torch.equal(torch.from_numpy(a["layers.3.weight"].numpy().copy()), want["5.weight"].t().half())


def test_emit_recipe_alone_converts_nothing_and_o_is_refused_over_a_file(workspace: Path) -> None:
    alone = migrate("convert", "ckpt/orig.pt", "b.bpk", "--emit-recipe", cwd=workspace)
    assert alone.returncode == 0 and "source:" in alone.stdout and not (workspace / "b.bpk").exists()
    (workspace / "r.yaml").write_text("keep me\n")
    out = migrate("convert", "ckpt/orig.pt", "b.bpk", "--emit-recipe", "-o", "r.yaml", cwd=workspace)
    assert out.returncode == 1 and "already exists" in out.stderr
    assert (workspace / "r.yaml").read_text() == "keep me\n" and not (workspace / "b.bpk").exists()
    onto = migrate("convert", "ckpt/orig.pt", "b.bpk", "--emit-recipe", "-o", "ckpt/orig.pt", "--overwrite",
                   cwd=workspace)
    assert onto.returncode == 1 and (workspace / "ckpt" / "orig.pt").stat().st_size > 100
    assert not (workspace / "b.bpk").exists()
    assert migrate("convert", "ckpt/orig.pt", "b.bpk", "-o", "x.yaml", cwd=workspace).returncode == 2
