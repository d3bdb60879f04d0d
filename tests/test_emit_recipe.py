"""Issue 20 item 17: `convert --emit-recipe -o FILE` writes a recipe that reproduces the convert.

The recipe goes through the atomic write path, its paths are relative to its own folder (it is
run from another folder here), and its `$schema` line names a schema file that exists."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from migrator import open_file

torch = pytest.importorskip("torch")
nn = torch.nn


def migrate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "migrator.cli", *args], cwd=cwd, capture_output=True, text=True)


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


def test_emitted_recipe_reproduces_the_convert(workspace: Path) -> None:
    opts = ["--adapter", "float_cast:BF16", "--top-level-key", "model"]
    done = migrate("convert", "ckpt/orig.pt", "out/a.pt", *opts, cwd=workspace)
    assert done.returncode == 0, done.stderr
    emitted = migrate("convert", "ckpt/orig.pt", "out/b.pt", *opts, "--emit-recipe", "-o", "recipes/back.yaml",
                      cwd=workspace)
    assert emitted.returncode == 0, emitted.stderr
    assert not (workspace / "out" / "b.pt").exists()  # emitting converts nothing
    ran = migrate("run", str(workspace / "recipes" / "back.yaml"), cwd=workspace / "elsewhere")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert (workspace / "out" / "b.pt").read_bytes() == (workspace / "out" / "a.pt").read_bytes()
    want = torch.load(workspace / "ckpt" / "orig.pt", weights_only=True)["model"]
    got = torch.load(workspace / "out" / "b.pt", weights_only=True)
    assert sorted(got) == ["0.bias", "0.weight", "1.bias", "1.weight", "2.bias", "2.weight", "3.bias", "3.weight"]
    assert torch.equal(got["3.weight"], want["5.weight"].to(torch.bfloat16))


def test_emitted_burnpack_recipe_paths_and_schema(workspace: Path) -> None:
    done = migrate("convert", "ckpt/orig.pt", "out/a.bpk", *OPTIONS, cwd=workspace)
    assert done.returncode == 0, done.stderr
    emitted = migrate("convert", "ckpt/orig.pt", "out/b.bpk", *OPTIONS, "--emit-recipe", "-o", "recipes/r.yaml",
                      cwd=workspace)
    assert emitted.returncode == 0, emitted.stderr
    text = (workspace / "recipes" / "r.yaml").read_text()
    import yaml

    data = yaml.safe_load(text)
    assert data["source"]["path"] == "../ckpt/orig.pt" and data["target"]["path"] == "../out/b.bpk"
    first = text.splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema=file://")
    schema = Path(unquote(urlparse(first.split("$schema=", 1)[1]).path))
    shown = migrate("schema", cwd=workspace)
    assert schema.is_file() and json.loads(schema.read_text()) == json.loads(shown.stdout)
    ran = migrate("run", "../recipes/r.yaml", cwd=workspace / "elsewhere")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    with open_file(workspace / "out" / "a.bpk") as a, open_file(workspace / "out" / "b.bpk") as b:
        assert list(a) == list(b) == ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias",
                                      "layers.2.gamma", "layers.2.beta", "layers.3.weight", "layers.3.bias"]
        assert all(bytes(a[k].data()) == bytes(b[k].data()) and a[k].dtype == b[k].dtype for k in a)
        provenance = {"migrator.recipe_sha256", "migrator.version"}  # a run records its recipe; convert has none
        assert {k: v for k, v in b.metadata.items() if k not in provenance} == a.metadata
        assert a.scalars == b.scalars


def test_emit_recipe_output_is_refused_over_a_file(workspace: Path) -> None:
    (workspace / "r.yaml").write_text("keep me\n")
    out = migrate("convert", "ckpt/orig.pt", "b.bpk", "--emit-recipe", "-o", "r.yaml", cwd=workspace)
    assert out.returncode == 1 and "already exists" in out.stderr
    assert (workspace / "r.yaml").read_text() == "keep me\n"
    onto = migrate("convert", "ckpt/orig.pt", "b.bpk", "--emit-recipe", "-o", "ckpt/orig.pt", "--overwrite",
                   cwd=workspace)
    assert onto.returncode != 0 and (workspace / "ckpt" / "orig.pt").stat().st_size > 100
    assert migrate("convert", "ckpt/orig.pt", "b.bpk", "-o", "x.yaml", cwd=workspace).returncode == 2
