"""Issue 20 item 1: `modules:` hints match exactly their module, and module types must fit their tensors.

The harm was a hint of migrator's own (`modules: {LayerNorm: ['^\\d+$']}` for a top-level Sequential)
that, pasted, declared every layer a LayerNorm: each Linear weight was renamed `gamma` and left
untransposed, exit 0. The oracle here is torch: the converted weights must compute what the torch
modules compute.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from migrator import open_file
from migrator.core.tensor import from_numpy
from migrator.naming import compile_regex
from migrator.transform.adapters import AdapterError, BurnToPyTorchAdapter, HalfPrecisionAdapter, PyTorchToBurnAdapter
from migrator.transform.modules import KNOWN_MODULE_TYPES, ModuleResolver, exact_regex, fit_problem, module_path
from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
nn = torch.nn

HINT = re.compile(r"modules: \{(\w+): \['((?:[^']|'')*)'\]\}")
ERROR_FOR = re.compile(r"Adapter error for '([^']+)'")


migrate = migrate_in_process  # a subprocess would start a fresh interpreter per call


def sequential() -> nn.Sequential:
    torch.manual_seed(0)
    # index 1 (ReLU) holds no tensors, so renumbering makes the LayerNorm module '2' and the last Linear '3'
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 4))


SUMMARY = re.compile(r"--modules '(\w+)=((?:[^']|'\\'')*)'")


def hints(text: str) -> list[tuple[str, str, str]]:
    """(tensor, type, regex) of every `modules:` entry (or `--modules` option) suggested, per error line; an
    error whose one answer is in the closing declaration (`convert`'s `--modules` syntax) gets that entry's regex."""
    out = []
    deferred: list[str] = []
    # the plan's problems come on one line, joined by '; ': one per adapter error, then the declaration
    lines = [part for line in text.splitlines()
             for part in re.split(r"; (?=Adapter error for '|declare the type of these)", line)]
    summary = [line for line in lines if "at once: --modules" in line]
    for line in lines:
        tensor = ERROR_FOR.search(line)
        if tensor is not None and "one declaration for all such modules follows" in line:
            deferred.append(tensor.group(1))
            continue
        if line in summary:
            continue
        for type_name, rx in HINT.findall(line):  # a recipe's `modules:` entry
            assert tensor is not None, line
            out.append((tensor.group(1), type_name, rx.replace("''", "'")))
        for type_name, rx in SUMMARY.findall(line):  # convert's own `--modules 'TYPE=REGEX'`
            assert tensor is not None, line
            out.append((tensor.group(1), type_name, rx.replace("'\\''", "'")))
    assert len(summary) == (1 if deferred else 0), summary
    for name in deferred:
        entries = [(t, rx) for t, rx in SUMMARY.findall(summary[0]) if compile_regex(rx).search(module_path(name))]
        assert len(entries) == 1, (name, summary)
        out.append((name, *entries[0]))
    return out


def assert_exact(found: list[tuple[str, str, str]], names: list[str]) -> None:
    """Each suggested regex matches its tensor's module path and no other module path of the file."""
    paths = {module_path(n) for n in names}
    for tensor, _, rx in found:
        compiled = compile_regex(rx)
        assert [p for p in sorted(paths) if compiled.search(p)] == [module_path(tensor)], (tensor, rx)


def burn_linear_matches_torch(w_burn: np.ndarray, b: np.ndarray, linear: nn.Linear) -> None:
    x = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = linear(x)
    got = x @ torch.tensor(w_burn) + torch.tensor(b)
    assert torch.allclose(got, want, atol=1e-6)


def write_recipe(path: Path, src: Path, dst: Path, modules: dict[str, list[str]]) -> Path:
    lines = ["version: 1", f"source: {{path: '{src}', contiguous_indices: true}}", f"target: {{path: '{dst}'}}",
             "adapters: [pytorch_to_burn]", "modules:"]
    quoted = {t: ", ".join("'" + r.replace("'", "''") + "'" for r in rxs) for t, rxs in modules.items()}
    lines += [f"  {t}: [{q}]" for t, q in quoted.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_sequential_hints_are_exact_and_pasting_them_gives_torchs_weights(tmp_path: Path) -> None:
    model = sequential()
    src = tmp_path / "big.pt"
    torch.save(model.state_dict(), src)
    proc = migrate("convert", str(src), str(tmp_path / "big.bpk"), "--adapter", "pytorch_to_burn",
                   "--contiguous-indices")
    assert proc.returncode == 1 and not (tmp_path / "big.bpk").exists()
    found = hints(proc.stderr)
    renamed = ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias", "3.weight", "3.bias"]
    assert {(t, k) for t, k, _ in found} == {("1.weight", "Linear"), ("2.weight", "LayerNorm"),
                                            ("2.bias", "LayerNorm")}
    assert_exact(found, renamed)

    declared: dict[str, list[str]] = {}
    for _, type_name, rx in found:
        if rx not in declared.setdefault(type_name, []):
            declared[type_name].append(rx)
    out = tmp_path / "out.bpk"
    proc = migrate("run", str(write_recipe(tmp_path / "r.yaml", src, out, declared)))
    assert proc.returncode == 0, proc.stderr
    with open_file(out) as r:
        got = {t.name: t.numpy() for t in r.tensors}
    assert sorted(got) == ["0.bias", "0.weight", "1.bias", "1.weight", "2.beta", "2.gamma", "3.bias", "3.weight"]
    for new, old in (("0", 0), ("1", 2), ("3", 4)):
        burn_linear_matches_torch(got[f"{new}.weight"], got[f"{new}.bias"], model[old])
    assert np.array_equal(got["2.gamma"], model[3].weight.detach().numpy())
    assert np.array_equal(got["2.beta"], model[3].bias.detach().numpy())


def test_the_old_catch_all_hint_is_refused_naming_tensor_shape_and_recipe_line(tmp_path: Path) -> None:
    src = tmp_path / "big.pt"
    torch.save(sequential().state_dict(), src)
    out = tmp_path / "out.bpk"
    recipe = write_recipe(tmp_path / "r.yaml", src, out, {"LayerNorm": [r"^\d+$"]})
    proc = migrate("run", str(recipe))
    assert proc.returncode == 1 and not out.exists()
    assert ("tensor '1.weight' [16, 16] does not fit module type LayerNorm: a LayerNorm's weight is 1-D; the "
            f"type comes from modules: LayerNorm: '^\\d+$' ({recipe}:6:15)") in proc.stdout + proc.stderr
    assert "gamma" not in proc.stdout.replace("LayerNorm", "")


def test_hints_are_exact_among_lookalike_and_meta_character_paths() -> None:
    names = [f"{p}.{k}" for p in ("blk.1", "blk.11", "blk.1.sub", "x.blk.1", "a+b(c).w[0]", "a+b(c).w[0]x", "q$",
                                 "it's", "") for k in ("weight", "bias")]
    shapes = {n: ((6, 6) if n.endswith("weight") else (6,)) for n in names}
    shapes["blk.1.sub.weight"] = (6,)  # a 1-D weight/bias: the norm question
    shapes = {n.lstrip("."): s for n, s in shapes.items()}
    resolver = ModuleResolver({}, list(shapes.items()))
    messages: list[tuple[str, str]] = []
    for name, shape in shapes.items():
        t = from_numpy(name, np.zeros(shape, np.float32))
        for adapter in (PyTorchToBurnAdapter(), BurnToPyTorchAdapter(), HalfPrecisionAdapter()):
            try:
                adapter.adapt(t, resolver.resolve(name))
            except AdapterError as e:
                messages.append((name, e.detail))
    found = [(name, t, rx.replace("''", "'")) for name, text in messages for t, rx in HINT.findall(text)]
    assert len({t for t, _, _ in found}) == len(shapes)  # every tensor got a hint
    assert_exact(found, list(shapes))


def test_exact_regex_escapes_every_meta_character() -> None:
    path = r"a.b+c*d?e(f)g|h[i]j{k}l^m$n#o&p-q~r\s t"
    rx = exact_regex(path)
    assert compile_regex(rx).search(path) and not compile_regex(rx).search(path + "x")
    assert not compile_regex(rx).search("x" + path)


# ---- every type migrator knows must fit its tensors ------------------------------------------------------------

def _conv1d():  # transformers' GPT-2 Conv1D: weight [in, out], bias [out]
    from transformers.pytorch_utils import Conv1D

    return Conv1D(6, 4)


REAL: dict[str, object] = {
    "Linear": lambda: nn.Linear(4, 6), "Conv1D": _conv1d, "Embedding": lambda: nn.Embedding(10, 4),
    "BatchNorm": lambda: nn.BatchNorm2d(4), "LayerNorm": lambda: nn.LayerNorm(4),
    "GroupNorm": lambda: nn.GroupNorm(2, 4), "RmsNorm": lambda: nn.RMSNorm(4),
    "InstanceNorm": lambda: nn.InstanceNorm2d(4, affine=True, track_running_stats=True),
    "PRelu": lambda: nn.PReLU(4), "Conv1d": lambda: nn.Conv1d(2, 4, 3), "Conv2d": lambda: nn.Conv2d(2, 4, 3),
    "Conv3d": lambda: nn.Conv3d(2, 4, 3), "ConvTranspose1d": lambda: nn.ConvTranspose1d(2, 4, 3),
    "ConvTranspose2d": lambda: nn.ConvTranspose2d(2, 4, 3), "ConvTranspose3d": lambda: nn.ConvTranspose3d(2, 4, 3),
    "DeformConv2d": lambda: nn.Conv2d(2, 4, 3),  # torchvision's DeformConv2d stores the same weight and bias
}


def _params(module: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def test_every_known_type_has_a_real_module_here() -> None:
    assert sorted(f"Struct:{t}" for t in REAL) == sorted(KNOWN_MODULE_TYPES)


@pytest.mark.parametrize("type_name", sorted(REAL))
def test_a_real_module_fits_its_type(type_name: str) -> None:
    assert fit_problem(type_name, _params(REAL[type_name]())) is None  # type: ignore[operator]


@pytest.mark.parametrize("type_name", sorted(set(REAL) - {"Linear"}))
def test_a_linear_fits_no_other_type(type_name: str) -> None:
    # Linear(4, 6): weight [6, 4], bias [6] (dim 0): not a Conv1D, whose bias is dim 1
    assert fit_problem(type_name, _params(nn.Linear(4, 6))) is not None


@pytest.mark.parametrize("real", ["LayerNorm", "BatchNorm", "Embedding", "Conv2d"])
def test_norms_convs_and_embeddings_fit_no_linear(real: str) -> None:
    params = _params(REAL[real]())  # type: ignore[operator]
    assert fit_problem("Linear", params) is None if real == "Embedding" else fit_problem("Linear", params)
    if real != "Embedding":
        assert fit_problem("Conv1D", params) is not None


@pytest.mark.parametrize(("type_name", "params", "param", "rule"), [
    ("LayerNorm", {"weight": (16, 16), "bias": (16,)}, "weight", "a LayerNorm's weight is 1-D"),
    ("LayerNorm", {"weight": (4,), "bias": (5,)}, "bias", "one length"),
    ("RmsNorm", {"weight": (4,), "running_mean": (4,)}, "running_mean", "has only weight and bias"),
    ("Linear", {"weight": (4, 3, 3)}, "weight", "2-D"),
    ("Linear", {"weight": (4, 3), "bias": (5,)}, "bias", "out dim"),
    ("Linear", {"weight": (4, 3), "bias": (4, 1)}, "bias", "1-D"),
    ("Linear", {"bias": (4,)}, "bias", "has a weight"),
    ("Conv1D", {"weight": (4, 3), "bias": (4,)}, "bias", "dim 1"),
    ("Embedding", {"weight": (10, 4), "bias": (10,)}, "bias", "only a weight"),
    ("Embedding", {"weight": (10,)}, "weight", "2-D"),
    ("Conv2d", {"weight": (4, 2, 3)}, "weight", "4-D"),
    ("Conv1d", {"weight": (4, 2, 3), "bias": (4, 4)}, "bias", "1-D"),
    ("BatchNorm", {"weight": (4,), "bias": (4,), "running_mean": (4,)}, "running_mean", "together"),
    ("BatchNorm", {"weight": (4,), "running_mean": (4,), "running_var": (5,)}, "running_var", "one length"),
    ("BatchNorm", {"running_mean": (4,), "running_var": (4,), "num_batches_tracked": (4,)}, "num_batches_tracked",
     "scalar"),
    ("PRelu", {"weight": (4, 4)}, "weight", "1-D"),
    ("Struct:LayerNorm", {"weight": (4, 4)}, "weight", "1-D"),
])
def test_misfits_name_the_param_and_rule(type_name: str, params: dict, param: str, rule: str) -> None:
    problem = fit_problem(type_name, params)
    assert problem is not None and problem[0] == param and rule in problem[1], problem


def test_user_types_and_empty_modules_are_not_checked() -> None:
    assert fit_problem("MyBlock", {"weight": (2, 3, 4)}) is None
    assert fit_problem("Enum:LayerNorm", {"weight": (2, 3)}) is None
    assert fit_problem("BatchNorm", {}) is None


def test_a_misfit_declaration_fails_every_tensor_of_its_module() -> None:
    tensors = [("0.weight", (16, 8)), ("0.bias", (16,)), ("2.weight", (16,)), ("2.bias", (16,))]
    r = ModuleResolver({"LayerNorm": [r"^\d+$"]}, tensors, {("LayerNorm", 0): "r.yaml:7:16"})
    assert r.resolve("2.weight").name == "LayerNorm"
    for name in ("0.weight", "0.bias"):
        with pytest.raises(AdapterError) as e:
            r.resolve(name)
        assert e.value.tensor == name
        assert ("tensor '0.weight' [16, 8] does not fit module type LayerNorm: a LayerNorm's weight is 1-D; "
                "the type comes from modules: LayerNorm: '^\\d+$' (r.yaml:7:16)") in str(e.value)


def test_norm_renames_of_a_non_vector_are_refused_by_the_adapter_too() -> None:
    from migrator.transform.modules import ModuleType

    m = ModuleType("LayerNorm", "declared", "modules: LayerNorm: 'x'")
    with pytest.raises(AdapterError, match=r"1-D, this one is \[4, 4\]"):
        PyTorchToBurnAdapter().adapt(from_numpy("x.weight", np.zeros((4, 4), np.float32)), m)


def test_an_inferred_type_that_does_not_fit_names_the_inference_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    import migrator.transform.modules as modules

    wrong = modules.ModuleType("LayerNorm", "inferred", "a rule that went wrong")
    monkeypatch.setattr(modules, "infer", lambda path, params, source_format=None: wrong)
    with pytest.raises(AdapterError) as e:
        ModuleResolver({}, [("fc.weight", (4, 3))]).resolve("fc.weight")
    assert "tensor 'fc.weight' [4, 3] does not fit module type LayerNorm" in str(e.value)
    assert "the type comes from inference: a rule that went wrong" in str(e.value)


def test_half_precision_hint_suggests_a_type_that_keeps_it_and_fits() -> None:
    t = from_numpy("scale", np.zeros(3, np.float32))
    resolver = ModuleResolver({}, [("scale", (3,))])
    with pytest.raises(AdapterError) as e:
        HalfPrecisionAdapter().adapt(t, resolver.resolve("scale"))
    (type_name, rx), = HINT.findall(str(e.value))
    declared = ModuleResolver({type_name: [rx]}, [("scale", (3,))]).resolve("scale")  # pasted: no misfit
    assert HalfPrecisionAdapter().adapt(t, declared).tensor is t
