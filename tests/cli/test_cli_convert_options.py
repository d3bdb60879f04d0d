"""`migrate convert` takes a recipe's one-off options (--modules, --dtype, float_cast, half_precision)
and refuses bad values with a recipe's words, naming the option, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from migrator.cli import main

torch = pytest.importorskip("torch")


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """Module names no heuristic calls a Linear (`proj`, `head`): only a declaration does."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"proj": torch.nn.Linear(3, 4), "head": torch.nn.Linear(4, 2)})
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    return path


def test_modules_declares_linears_for_pytorch_to_burn(ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.safetensors"
    assert main(["convert", str(ckpt), str(out), "--no-progress", "--adapter", "pytorch_to_burn",
                 "--modules", "Linear=^proj$", "--modules", "Linear=^head$"]) == 0
    got, sd = load_file(str(out)), torch.load(ckpt, weights_only=True)
    for name in ("proj", "head"):  # Burn's Linear stores [in, out]: x @ W + b is the torch module's forward
        np.testing.assert_array_equal(got[f"{name}.weight"], sd[f"{name}.weight"].numpy().T)


def test_dtype_and_float_cast_adapter_cast_like_torch(ckpt: Path, tmp_path: Path) -> None:
    import ml_dtypes

    sd = torch.load(ckpt, weights_only=True)
    for flag in (["--dtype", "BF16"], ["--adapter", "float_cast:BF16"]):
        out = tmp_path / f"{flag[0].strip('-')}.safetensors"
        assert main(["convert", str(ckpt), str(out), "--no-progress", "--no-contiguous-indices", *flag]) == 0
        got = load_file(str(out))
        want = sd["proj.weight"].to(torch.bfloat16).view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        assert got["proj.weight"].dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(got["proj.weight"].view(np.int16), want.view(np.int16))


def test_half_precision_adapter_converts_linears(ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "h.safetensors"
    assert main(["convert", str(ckpt), str(out), "--no-progress", "--adapter", "half_precision",
                 "--modules", "Linear=^(proj|head)$"]) == 0
    got, sd = load_file(str(out)), torch.load(ckpt, weights_only=True)
    assert got["head.bias"].dtype == np.float16
    np.testing.assert_array_equal(got["head.bias"], sd["head.bias"].half().numpy())


@pytest.mark.parametrize(("flags", "words"), [
    (["--dtype", "F61"], ["--dtype", "unknown dtype 'F61'", "did you mean 'F64'?"]),
    (["--dtype", "BF61"], ["did you mean 'BF16'?"]),
    (["--adapter", "float_cast:F61"], ["--adapter 'float_cast:F61'", "unknown dtype 'F61'", "did you mean"]),
    (["--adapter", "float_cast"], ["float_cast needs a dtype", "--dtype"]),
    (["--adapter", "pytorch_to_brun"], ["unknown adapter 'pytorch_to_brun'", "did you mean 'pytorch_to_burn'?"]),
    (["--modules", "Linear=("], ["--modules 'Linear=('", "invalid regex '('"]),
    (["--modules", "Linear"], ["--modules expects TYPE=REGEX"]),
    (["--include", "["], ["--include '['", "invalid regex '['"]),
])
def test_bad_values_get_the_recipe_message_and_exit_2(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     flags: list[str], words: list[str]) -> None:
    out = tmp_path / "x.bpk"
    assert main(["convert", str(ckpt), str(out), "--no-progress", *flags]) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err
    for raw in ("validation error", "pydantic", "literal_error", "type="):
        assert raw not in err
    assert not out.exists()
    assert main(["convert", str(ckpt), str(out), "--no-progress", "--json", *flags]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["kind"] == "UsageError" and words[0] in doc["error"]["message"]


def test_a_folder_target_gets_one_file_named_after_the_source(ckpt: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "existing"
    existing.mkdir()
    # a file source: DIR/<SRC's stem>.<ext> (issue 34 item 2d; a folder source makes a Hugging Face folder)
    assert main(["convert", str(ckpt), str(existing), "--to", "safetensors", "--no-progress", "--overwrite"]) == 0
    want = torch.load(ckpt, weights_only=True)
    assert sorted(p.name for p in existing.iterdir()) == ["m.safetensors"]
    got = load_file(str(existing / "m.safetensors"))
    np.testing.assert_array_equal(got["proj.weight"], want["proj.weight"].numpy())
    assert f"wrote {existing / 'm.safetensors'} " in capsys.readouterr().out  # the exact path
    assert main(["convert", str(ckpt), str(tmp_path / "pt") + "/", "--to", "pytorch", "--no-progress"]) == 0
    assert [p.name for p in (tmp_path / "pt").iterdir()] == ["m.pt"]
    assert torch.equal(torch.load(tmp_path / "pt" / "m.pt", weights_only=True)["proj.weight"], want["proj.weight"])
    capsys.readouterr()
    # burnpack: one file named after the source
    new = str(tmp_path / "new") + "/"  # not there yet: created
    assert main(["convert", str(ckpt), new, "--to", "burnpack", "--no-progress", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["target"] == str(tmp_path / "new" / "m.bpk")
    assert (tmp_path / "new" / "m.bpk").is_file()


def test_a_folder_target_without_to_is_a_safetensors_file_named_after_the_source(ckpt: Path, tmp_path: Path) -> None:
    assert main(["convert", str(ckpt), str(tmp_path / "out") + "/", "--no-progress"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["m.safetensors"]
    # asking for a folder's own files makes it a Hugging Face folder
    assert main(["convert", str(ckpt), str(tmp_path / "hf") + "/", "--max-shard-size", "1GB", "--no-progress"]) == 0
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["model.safetensors"]


def test_an_extensionless_target_gets_bpk_only_for_burnpack(ckpt: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", str(ckpt), str(tmp_path / "plain"), "--to", "safetensors", "--no-progress"]) == 0
    assert f"wrote {tmp_path / 'plain'} " in capsys.readouterr().out
    assert "proj.weight" in load_file(str(tmp_path / "plain"))
    assert main(["convert", str(ckpt), str(tmp_path / "burn"), "--no-progress"]) == 0
    assert f"wrote {tmp_path / 'burn.bpk'} " in capsys.readouterr().out and (tmp_path / "burn.bpk").is_file()


def test_an_adapter_hint_is_in_converts_own_syntax(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The module-type hint of `convert` names `--modules 'TYPE=REGEX'` (it named a recipe's `modules:`
    entry); the option it gives, pasted back, converts: the weight comes out as torch's transpose."""
    import re
    import shlex

    torch.manual_seed(0)
    sd = {"a.weight": torch.randn(3, 4), "fc.weight": torch.randn(2, 3), "fc.bias": torch.randn(2)}
    torch.save(sd, tmp_path / "m.pt")
    out = tmp_path / "o.safetensors"
    args = ["convert", str(tmp_path / "m.pt"), str(out), "--no-progress", "--adapter", "pytorch_to_burn"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "modules: {" not in err and "in the recipe" not in err, err
    options = re.findall(r"--modules '[^']+'", err)
    assert options[0] == "--modules 'Linear=^a$'", err
    assert main(args + shlex.split(options[0])) == 0
    np.testing.assert_array_equal(load_file(str(out))["a.weight"], sd["a.weight"].numpy().T)
    # a recipe's hint stays a recipe's
    (tmp_path / "r.yaml").write_text(f"version: 1\nsource: {{path: {tmp_path / 'm.pt'}}}\n"
                                     f"adapters: [pytorch_to_burn]\ntarget: {{path: {tmp_path / 'r.safetensors'}}}\n")
    assert main(["run", str(tmp_path / "r.yaml"), "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert "modules: {Linear: ['^a$']}" in captured.out + captured.err
