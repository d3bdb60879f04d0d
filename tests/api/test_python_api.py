"""Issue 20 item 13: the Python API a Python user expects, checked against torch and safetensors.

Readers are read-only mappings; `save`/`to_bytes` take dicts of numpy arrays and torch tensors;
`from_numpy` takes torch tensors (bf16 too) without migrator importing torch; scalars may be
plain numbers; a tensor read after its reader closed is an error blaming the reader;
`run_recipe` returns the report; `help(migrator)` lists the API."""

from __future__ import annotations

import pydoc
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

import migrator
from migrator.core.errors import ReaderClosedError, TensorNotFoundError

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
from safetensors import safe_open  # noqa: E402


def torch_tensors() -> dict[str, object]:
    g = torch.Generator().manual_seed(3)
    w = torch.nn.Parameter(torch.randn(3, 4, generator=g))  # requires grad
    return {
        "w": w,
        "wt": torch.randn(4, 5, generator=g).t(),  # not contiguous
        "bf": torch.randn(2, 3, generator=g).to(torch.bfloat16),
        "f8": torch.randn(6, generator=g).to(torch.float8_e4m3fn),
        "i": torch.arange(5, dtype=torch.int64),
        "b": torch.tensor([True, False]),
    }


def test_reader_is_a_read_only_mapping(tmp_path: Path) -> None:
    sd = {"encoder.weight": torch.ones(2, 2), "encoder.bias": torch.zeros(2), "head": torch.arange(3.0)}
    st_torch.save_file(sd, tmp_path / "m.safetensors")
    with migrator.open_file(tmp_path / "m.safetensors") as r, \
            safe_open(str(tmp_path / "m.safetensors"), framework="pt") as f:
        assert isinstance(r, Mapping)
        assert sorted(r.keys()) == sorted(f.keys()) and len(r) == 3 and list(r) == list(r.keys())
        assert "head" in r and "nope" not in r and r.get("nope") is None
        as_dict = dict(r)
        assert all(torch.equal(torch.from_numpy(as_dict[k].numpy().copy()), f.get_tensor(k)) for k in f.keys())  # noqa: SIM118
        assert [k for k, _ in r.items()] == list(r.keys()) and all(t.name == k for k, t in r.items())
        with pytest.raises(KeyError, match=r"did you mean 'encoder\.bias'") as e:
            r["encoder.bais"]
        assert isinstance(e.value, TensorNotFoundError)
        with pytest.raises(TypeError):
            r["head"] = r["head"]  # type: ignore[index]
        assert r == r and r != dict(r) and hash(r) == hash(r)  # identity, not contents


def test_save_and_to_bytes_take_a_dict_of_torch_numpy_and_lazy(tmp_path: Path) -> None:
    want = torch_tensors()
    mixed = dict(want)
    mixed["np"] = np.arange(6, dtype=np.float16).reshape(2, 3)
    with migrator.open_file(migrator.to_bytes({"lazy": migrator.from_numpy("x", np.ones(4, np.float32))},
                                              "safetensors")) as r:
        mixed["lazy"] = r["lazy"]
        migrator.save(mixed, tmp_path / "m.safetensors")
        blob = migrator.to_bytes(mixed, "safetensors")
    for got in (st_torch.load_file(tmp_path / "m.safetensors"), st_torch.load(blob)):
        assert sorted(got) == sorted(mixed)  # SafeTensors orders by dtype size, then name
        for k, v in want.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k].view(torch.uint8) if k == "f8" else got[k],
                                                           v.detach().view(torch.uint8) if k == "f8" else v.detach())
        assert torch.equal(got["np"], torch.from_numpy(mixed["np"])) and torch.equal(got["lazy"], torch.ones(4))


def test_from_numpy_takes_a_bf16_torch_tensor_for_a_pytorch_file(tmp_path: Path) -> None:
    t = torch.randn(4, 3, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    lazy = migrator.from_numpy("t", t)
    assert lazy.dtype.name == "BF16" and lazy.shape == (4, 3)
    migrator.save([lazy], tmp_path / "t.pt")
    back = torch.load(tmp_path / "t.pt", weights_only=True)["t"]
    assert back.dtype == torch.bfloat16 and torch.equal(back, t)


def test_other_array_likes_are_taken_by_protocol() -> None:
    class HasArray:
        def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
            return np.arange(4, dtype=np.int32)

    class HasNumpy:
        def numpy(self) -> np.ndarray:
            return np.ones((2, 2), np.float64)

    blob = migrator.to_bytes({"a": HasArray(), "n": HasNumpy(), "d": torch.arange(3.0)[1:]}, "safetensors")
    got = st_torch.load(blob)
    assert torch.equal(got["a"], torch.arange(4, dtype=torch.int32))
    assert torch.equal(got["n"], torch.ones(2, 2, dtype=torch.float64))
    assert torch.equal(got["d"], torch.tensor([1.0, 2.0]))
    with pytest.raises(migrator.core.errors.MigratorError,
                       match=r"tensor 'x': cannot make a tensor of a builtins\.object"):
        migrator.from_numpy("x", object())


def test_numpy_input_never_imports_torch(tmp_path: Path) -> None:
    code = ("import sys, numpy as np, migrator\n"
            f"migrator.save({{'w': np.ones(3, np.float32)}}, {str(tmp_path / 'a.bpk')!r}, scalars={{'epoch': 2}})\n"
            "migrator.from_numpy('x', [1.0, 2.0]); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_plain_numbers_are_scalars() -> None:
    t = {"w": np.zeros(2, np.float32)}
    plain = migrator.to_bytes(t, "burnpack", scalars={"epoch": 3, "lr": 0.5, "done": True, "big": 2**63,
                                                      "np": np.int32(7)})
    typed = migrator.to_bytes(t, "burnpack", scalars={
        "epoch": migrator.Scalar("Int", 3), "lr": migrator.Scalar("Float", 0.5), "done": migrator.Scalar("Bool", True),
        "big": migrator.Scalar("UInt", 2**63), "np": migrator.Scalar("Int", 7)})
    assert plain == typed
    with pytest.raises(migrator.core.errors.MigratorError, match="scalar 'x'"):
        migrator.to_bytes(t, "burnpack", scalars={"x": "3"})


def test_reading_after_the_reader_closed_blames_the_reader(tmp_path: Path) -> None:
    torch.save({"w": torch.arange(64.0)}, tmp_path / "a.pt")
    st_torch.save_file({"w": torch.full((64,), 7.0)}, tmp_path / "b.safetensors")
    for name in ("a.pt", "b.safetensors"):
        with migrator.open_file(tmp_path / name) as r:
            w = r["w"]
        with pytest.raises(ReaderClosedError, match="its reader was closed") as e:
            w.numpy()
        assert e.value.tensor == "w" and str(tmp_path / name) in str(e.value)
    # the closed reader's descriptor number is free again: another open file may get it, and a
    # kernel copy from it would write that file's bytes under this tensor's name
    with migrator.open_file(tmp_path / "a.pt") as r:
        w = r["w"]
    with migrator.open_file(tmp_path / "b.safetensors"), pytest.raises(ReaderClosedError):
        migrator.save([w], tmp_path / "out.safetensors")
    assert not (tmp_path / "out.safetensors").exists()


def test_run_recipe_returns_the_report(tmp_path: Path) -> None:
    sd = {"model.0.weight": torch.randn(3, 2), "model.2.weight": torch.randn(4, 3)}
    torch.save(sd, tmp_path / "m.pt")
    (tmp_path / "r.yaml").write_text("version: 1\nsource: {path: m.pt, contiguous_indices: true}\n"
                                     "remap: [{from: '^model\\.', to: ''}]\n"
                                     "target: {path: out.safetensors}\n")
    report = migrator.run_recipe(tmp_path / "r.yaml")
    assert isinstance(report, migrator.ApplyReport) and report.status == "ok" and report.written
    assert report.renames() == [("model.0.weight", "0.weight"), ("model.2.weight", "1.weight")]
    got = st_torch.load_file(tmp_path / "out.safetensors")
    assert torch.equal(got["1.weight"], sd["model.2.weight"])
    with pytest.raises(migrator.core.errors.MigratorError, match="exists"):
        migrator.run_recipe(tmp_path / "r.yaml")
    assert migrator.run_recipe(tmp_path / "r.yaml", overwrite=True).status == "ok"
    from migrator.api import RecipeRunError
    from migrator.recipe.model import Recipe

    bad = Recipe.model_validate({"version": 1, "source": {"path": "m.pt"},
                                 "target": {"path": "t.bpk", "template": "out.safetensors"}})
    with pytest.raises(RecipeRunError) as e:
        migrator.run_recipe(bad, base_dir=tmp_path)
    assert e.value.report.status == "failed" and e.value.report.errors and not (tmp_path / "t.bpk").exists()


def test_help_lists_the_public_api() -> None:
    text = pydoc.render_doc(migrator, renderer=pydoc.plaintext)
    functions = text[text.index("\nFUNCTIONS"):text.index("\nDATA")]
    for name in ("open_file", "save", "to_bytes", "from_numpy", "run_recipe"):
        assert f"\n    {name}(" in functions, name
    assert all(f"class {c}" in text for c in ("ApplyReport", "LazyTensor", "Scalar"))
