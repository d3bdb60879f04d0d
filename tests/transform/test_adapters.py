"""Adapters: Burn's semantics, refusing to guess, laziness, chaining."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

from migrator.core import dtypes
from migrator.core.tensor import LazyTensor, from_numpy
from migrator.recipe.model import FloatCastSpec, HalfPrecisionSpec
from migrator.transform.adapters import (
    DEFAULT_HALF_PRECISION_MODULES,
    NORM_MODULES,
    Adapted,
    Adapter,
    AdapterError,
    BurnToPyTorchAdapter,
    ChainAdapter,
    FloatCastAdapter,
    HalfPrecisionAdapter,
    IdentityAdapter,
    PyTorchToBurnAdapter,
    build_adapter,
    half_precision_module_set,
)
from migrator.transform.modules import ModuleResolver, ModuleType
from tests.support.fixtures import fixture_file


def declared(name: str) -> ModuleType:
    return ModuleType(name, "declared", f"test: {name}")


LINEAR, BATCHNORM, EMBEDDING = declared("Linear"), declared("BatchNorm"), declared("Embedding")
UNRESOLVED = ModuleType(None, "unresolved", "no rule applies")


def f32(name: str, shape: tuple[int, ...]) -> LazyTensor:
    return from_numpy(name, np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape))


def values(t: LazyTensor) -> list:
    return t.numpy().reshape(-1).tolist()


def counting(name: str, array: np.ndarray, calls: list[str]) -> LazyTensor:
    """A tensor whose loader records each call, to prove adapters stay lazy."""
    base = from_numpy(name, array)

    def loader() -> memoryview:
        calls.append(name)
        return base.data()

    return LazyTensor(name, base.dtype, base.shape, base.nbytes, loader)


# ---- PyTorchToBurn / BurnToPyTorch ------------------------------------------------------------------------------

def test_pytorch_to_burn_linear() -> None:
    a = PyTorchToBurnAdapter()
    w = a.adapt(f32("fc.weight", (10, 5)), LINEAR)
    assert w.tensor.shape == (5, 10) and w.tensor.name == "fc.weight"
    assert w.ops == ("transpose [10, 5] -> [5, 10]",)
    assert np.array_equal(w.tensor.numpy(), np.arange(50, dtype=np.float32).reshape(10, 5).T)
    b = a.adapt(f32("fc.bias", (10,)), LINEAR)
    assert b.tensor.shape == (10,) and b.ops == () and b.tensor.name == "fc.bias"


def test_pytorch_to_burn_batchnorm_renames() -> None:
    a = PyTorchToBurnAdapter()
    assert a.adapt(f32("norm.weight", (4,)), BATCHNORM).tensor.name == "norm.gamma"
    out = a.adapt(f32("norm.bias", (4,)), BATCHNORM)
    assert out.tensor.name == "norm.beta" and out.ops == ("rename bias -> beta",)
    assert a.adapt(f32("norm.running_mean", (4,)), BATCHNORM).tensor.name == "norm.running_mean"
    assert a.adapt(f32("weight", (4,)), BATCHNORM).tensor.name == "gamma"  # a root module


def test_burn_to_pytorch_linear_and_batchnorm() -> None:
    a = BurnToPyTorchAdapter()
    w = a.adapt(f32("fc.weight", (5, 10)), LINEAR)
    assert w.tensor.shape == (10, 5)
    assert a.adapt(f32("norm.gamma", (4,)), BATCHNORM).tensor.name == "norm.weight"
    assert a.adapt(f32("norm.beta", (4,)), BATCHNORM).tensor.name == "norm.bias"
    assert a.adapt(f32("norm.weight", (4,)), BATCHNORM).tensor.name == "norm.weight"


def test_transpose_values_any_dtype() -> None:
    a = PyTorchToBurnAdapter()
    for dt in (np.float32, np.int32):
        t = from_numpy("fc.weight", np.arange(1, 7, dtype=dt).reshape(2, 3))
        assert values(a.adapt(t, LINEAR).tensor) == [1, 4, 2, 5, 3, 6]
    t = from_numpy("fc.weight", np.array([[1.0, 2.0], [3.0, 4.0]]))
    assert values(a.adapt(t, LINEAR).tensor) == [1, 3, 2, 4]
    bf = from_numpy("fc.weight", np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16))
    out = BurnToPyTorchAdapter().adapt(bf, LINEAR).tensor
    assert out.dtype is dtypes.BF16 and values(out) == [0, 3, 1, 4, 2, 5]


@pytest.mark.parametrize("kind", ["LayerNorm", "GroupNorm", "RmsNorm", "BatchNorm"])
def test_norm_types_renamed_both_ways(kind: str) -> None:
    m = declared(kind)
    assert PyTorchToBurnAdapter().adapt(f32("n.weight", (3,)), m).tensor.name == "n.gamma"
    assert BurnToPyTorchAdapter().adapt(f32("n.beta", (3,)), m).tensor.name == "n.bias"


def test_instance_norm_is_not_renamed_like_burn() -> None:
    m = declared("InstanceNorm")
    assert "Struct:InstanceNorm" not in NORM_MODULES
    assert PyTorchToBurnAdapter().adapt(f32("n.weight", (3,)), m).tensor.name == "n.weight"
    assert BurnToPyTorchAdapter().adapt(f32("n.gamma", (3,)), m).tensor.name == "n.gamma"


def test_other_types_unchanged() -> None:
    a = PyTorchToBurnAdapter()
    for m in (EMBEDDING, declared("Conv2d"), declared("PRelu"), declared("MyNet"), declared("Enum:Linear")):
        for t in (f32("x.weight", (10, 3)), f32("x.weight", (3,)), f32("x.bias", (3,))):
            out = a.adapt(t, m)
            assert out.tensor is t and out.ops == ()


def test_linear_with_non_2d_weight_untouched() -> None:
    t = f32("fc.weight", (2, 3, 4))
    assert PyTorchToBurnAdapter().adapt(t, LINEAR).tensor is t


def test_user_struct_named_linear_counts() -> None:
    # Burn compares the type name only: any struct called Linear is transposed
    assert PyTorchToBurnAdapter().adapt(f32("x.weight", (2, 3)), declared("Struct:Linear")).tensor.shape == (3, 2)


# ---- refusing to guess ------------------------------------------------------------------------------------

def test_unresolved_2d_weight_is_an_error_with_a_hint() -> None:
    for a in (PyTorchToBurnAdapter(), BurnToPyTorchAdapter()):
        with pytest.raises(AdapterError) as e:
            a.adapt(f32("enc.shared.weight", (10, 3)), UNRESOLVED)
        msg = str(e.value)
        assert e.value.tensor == "enc.shared.weight" and "modules:" in msg and "^enc\\.shared$" in msg
        assert "Linear" in msg and "Embedding" in msg and "no rule applies" in msg


def test_hint_matches_exactly_its_module() -> None:
    # issue 20: a `\d+` for every index matched other modules too (a top-level Sequential: all of them)
    with pytest.raises(AdapterError) as e:
        PyTorchToBurnAdapter().adapt(f32("enc.layers.11.out.weight", (4, 4)), UNRESOLVED)
    assert "modules: {Linear: ['^enc\\.layers\\.11\\.out$']}" in str(e.value)


def test_unresolved_1d_weight_and_bias_are_errors_unless_norm_excluded() -> None:
    a = PyTorchToBurnAdapter()
    for name in ("scale.weight", "scale.bias"):
        with pytest.raises(AdapterError, match="norm layer"):
            a.adapt(f32(name, (4,)), UNRESOLVED)
    not_norm = ModuleType(None, "unresolved", "x", norm_excluded=True)
    t = f32("cls.predictions.bias", (30,))
    assert a.adapt(t, not_norm).tensor is t
    with pytest.raises(AdapterError, match="norm layer"):
        BurnToPyTorchAdapter().adapt(f32("x.gamma", (4,)), UNRESOLVED)
    t = f32("x.weight", (4,))
    assert BurnToPyTorchAdapter().adapt(t, UNRESOLVED).tensor is t  # no rename of weight either way


def test_unresolved_without_a_decision_passes() -> None:
    a = PyTorchToBurnAdapter()
    for t in (f32("bn.running_mean", (4,)), f32("conv.weight", (2, 2, 3, 3)), f32("tensor", (3, 3)),
              f32("x.gamma", (3,))):
        assert a.adapt(t, UNRESOLVED).tensor is t


def test_linear_weight_already_in_target_layout_is_refused() -> None:
    burn_layout = ModuleType("Linear", "declared", "x", weight_layout="in_out")
    with pytest.raises(AdapterError, match=r"\[in, out\]"):
        PyTorchToBurnAdapter().adapt(f32("c_attn.weight", (8, 24)), burn_layout)
    assert BurnToPyTorchAdapter().adapt(f32("c_attn.weight", (8, 24)), burn_layout).tensor.shape == (24, 8)
    torch_layout = ModuleType("Linear", "inferred", "x", weight_layout="out_in")
    with pytest.raises(AdapterError, match=r"\[out, in\]"):
        BurnToPyTorchAdapter().adapt(f32("fc.weight", (24, 8)), torch_layout)


# ---- alternative names ----------------------------------------------------------------------------------------

def test_alternative_names() -> None:
    p2b, b2p = PyTorchToBurnAdapter(), BurnToPyTorchAdapter()
    for kind in ("BatchNorm", "LayerNorm", "GroupNorm", "RmsNorm"):
        m = declared(kind)
        assert (p2b.alternative_name("gamma", m), p2b.alternative_name("beta", m)) == ("weight", "bias")
        assert (b2p.alternative_name("weight", m), b2p.alternative_name("bias", m)) == ("gamma", "beta")
        assert p2b.alternative_name("running_mean", m) is None
    for m in (LINEAR, declared("InstanceNorm"), UNRESOLVED):
        assert p2b.alternative_name("gamma", m) is None and b2p.alternative_name("weight", m) is None
    for a in (IdentityAdapter(), HalfPrecisionAdapter(), FloatCastAdapter(dtypes.F16)):
        assert a.alternative_name("gamma", BATCHNORM) is None


# ---- HalfPrecision ------------------------------------------------------------------------------------------

def test_default_set_has_14_entries() -> None:
    assert len(DEFAULT_HALF_PRECISION_MODULES) == 14
    assert "Struct:BatchNorm" not in DEFAULT_HALF_PRECISION_MODULES
    assert half_precision_module_set([], []) == DEFAULT_HALF_PRECISION_MODULES


def test_half_precision_f32_to_f16_and_back_for_linear() -> None:
    a = HalfPrecisionAdapter()
    x = np.array([[1.0, -2.5], [1e-8, 65520.0]], dtype=np.float32)
    with np.errstate(over="ignore"):
        x16 = x.astype(np.float16)
    out = a.adapt(from_numpy("fc.weight", x), LINEAR)
    assert out.tensor.dtype is dtypes.F16 and out.ops == ("cast F32 -> F16",)
    assert np.array_equal(out.tensor.numpy(), x16)
    back = a.adapt(out.tensor, LINEAR)
    assert back.tensor.dtype is dtypes.F32 and back.ops == ("cast F16 -> F32",)
    assert np.array_equal(back.tensor.numpy(), x16.astype(np.float32))


@pytest.mark.parametrize("kind", ["Linear", "Embedding", "Conv2d", "LayerNorm", "GroupNorm", "RmsNorm",
                                  "InstanceNorm", "PRelu", "ConvTranspose1d", "DeformConv2d"])
def test_half_precision_converts_the_default_set(kind: str) -> None:
    assert HalfPrecisionAdapter().adapt(f32("m.weight", (3,)), declared(kind)).tensor.dtype is dtypes.F16


def test_half_precision_skips_batchnorm_and_other_types() -> None:
    a = HalfPrecisionAdapter()
    for m in (BATCHNORM, declared("MyNet"), declared("Enum:Linear")):
        t = f32("x.weight", (3,))
        assert a.adapt(t, m).tensor is t


def test_half_precision_other_dtypes_unchanged() -> None:
    a = HalfPrecisionAdapter()
    for arr, dt in ((np.zeros(3), None), (np.zeros(3, dtype=np.int64), None), (np.zeros(3, dtype=bool), None),
                    (np.zeros(3, dtype=ml_dtypes.bfloat16), None), (np.zeros(3, dtype=np.float32), dtypes.FLEX32)):
        t = from_numpy("fc.weight", arr, dtype=dt)
        assert a.adapt(t, LINEAR).tensor is t
        assert a.adapt(t, UNRESOLVED).tensor is t  # no decision needed
    q = LazyTensor("fc.weight", dtypes.qfloat(b"\xa0"), (4,), 8, lambda: b"\0" * 8)
    assert a.adapt(q, LINEAR).tensor is q


def test_half_precision_unresolved_f32_is_an_error() -> None:
    with pytest.raises(AdapterError) as e:
        HalfPrecisionAdapter().adapt(f32("buffer", (3, 3)), UNRESOLVED)
    assert "modules:" in str(e.value) and "'^$'" in str(e.value) and e.value.tensor == "buffer"


def test_with_and_without() -> None:
    assert "Struct:BatchNorm" in half_precision_module_set(["BatchNorm"], [])
    assert HalfPrecisionAdapter(half_precision_module_set(["BatchNorm"], [])).adapt(
        f32("bn.running_var", (3,)), BATCHNORM).tensor.dtype is dtypes.F16
    for name in ("LayerNorm", "Struct:LayerNorm"):
        s = half_precision_module_set([], [name])
        assert "Struct:LayerNorm" not in s and len(s) == 13
        t = f32("ln.weight", (3,))
        assert HalfPrecisionAdapter(s).adapt(t, declared("LayerNorm")).tensor is t
    for name in ("CustomLayer", "Struct:CustomLayer"):
        s = half_precision_module_set([name], [])
        assert "Struct:CustomLayer" in s and len(s) == 15
        assert HalfPrecisionAdapter(s).adapt(f32("c.w", (3,)), declared("CustomLayer")).tensor.dtype is dtypes.F16
    s = half_precision_module_set(["Enum:Block"], [])
    assert HalfPrecisionAdapter(s).adapt(f32("c.w", (3,)), declared("Enum:Block")).tensor.dtype is dtypes.F16
    assert "Struct:BatchNorm" not in half_precision_module_set(["BatchNorm"], ["BatchNorm"])  # with_ first


def test_without_unknown_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not in the module set"):
        half_precision_module_set([], ["BatchNorm"])
    with pytest.raises(ValueError, match=r"Struct:Nope.*not in the module set"):
        half_precision_module_set([], ["Nope"])


def test_half_precision_after_pytorch_to_burn() -> None:
    chain = build_adapter(["pytorch_to_burn", "half_precision"])
    out = chain.adapt(f32("fc.weight", (10, 5)), LINEAR)
    assert out.tensor.shape == (5, 10) and out.tensor.dtype is dtypes.F16
    assert out.ops == ("transpose [10, 5] -> [5, 10]", "cast F32 -> F16")
    want = np.arange(50, dtype=np.float32).reshape(10, 5).T.astype(np.float16)
    assert np.array_equal(out.tensor.numpy(), want)


# ---- FloatCast ------------------------------------------------------------------------------------------

def test_float_cast_bf16_to_f16_exact() -> None:
    vals = [1, -2, 0.5, 4, -0.25, 8]
    t = from_numpy("x.w", np.array(vals, dtype=ml_dtypes.bfloat16))
    a = FloatCastAdapter(dtypes.F16)
    for m in (LINEAR, BATCHNORM, declared("Anything"), UNRESOLVED):
        out = a.adapt(t, m)
        assert out.tensor.dtype is dtypes.F16 and values(out.tensor) == vals and out.ops == ("cast BF16 -> F16",)


def test_float_cast_passthrough() -> None:
    a = FloatCastAdapter(dtypes.F16)
    for t in (from_numpy("a", np.zeros(3, dtype=np.float16)), from_numpy("b", np.arange(3, dtype=np.int64)),
              from_numpy("c", np.array([True]))):
        out = a.adapt(t, UNRESOLVED)
        assert out.tensor is t and out.ops == ()


def test_float_cast_targets() -> None:
    with pytest.raises(AdapterError, match="must be a float dtype"):
        FloatCastAdapter(dtypes.I32)
    with pytest.raises(AdapterError, match="Burn's float dtypes"):
        FloatCastAdapter(dtypes.F8_E4M3)
    out = FloatCastAdapter(dtypes.FLEX32).adapt(f32("w", (2,)), UNRESOLVED)
    assert out.tensor.dtype is dtypes.FLEX32 and bytes(out.tensor.data()) == np.arange(2, dtype=np.float32).tobytes()
    out = FloatCastAdapter(dtypes.F64).adapt(f32("w", (2,)), UNRESOLVED)
    assert values(out.tensor) == [0.0, 1.0] and out.tensor.dtype is dtypes.F64


def test_float_cast_after_pytorch_to_burn() -> None:
    spec = FloatCastSpec.model_validate({"float_cast": {"to": "BF16"}})
    chain = build_adapter(["pytorch_to_burn", spec])
    out = chain.adapt(f32("fc.weight", (10, 5)), LINEAR)
    assert out.tensor.shape == (5, 10) and out.tensor.dtype is dtypes.BF16
    want = np.arange(50, dtype=np.float32).reshape(10, 5).T.astype(ml_dtypes.bfloat16)
    assert np.array_equal(out.tensor.numpy().view(np.uint16), want.view(np.uint16))


# ---- chaining ------------------------------------------------------------------------------------------

@dataclass
class Recording:
    """A test adapter: renames `src` -> `dst`, offers an alternative name, counts calls."""

    name: str
    src: str
    dst: str
    alt_from: str | None = None
    alt_to: str | None = None
    calls: int = 0
    alt_calls: int = 0

    def adapt(self, tensor: LazyTensor, module: ModuleType) -> Adapted:
        self.calls += 1
        path, _, param = tensor.name.rpartition(".")
        if param != self.src:
            return Adapted(tensor)
        return Adapted(tensor.renamed(f"{path}.{self.dst}"), (f"{self.name}: {self.src} -> {self.dst}",))

    def alternative_name(self, param: str, module: ModuleType) -> str | None:
        self.alt_calls += 1
        return self.alt_to if param == self.alt_from else None


def test_chain_pipes_adapt_in_order() -> None:
    a, b = Recording("a", "weight", "a"), Recording("b", "a", "b")
    assert isinstance(a, Adapter)
    out = ChainAdapter([a, b]).adapt(f32("fc.weight", (2,)), LINEAR)
    assert out.tensor.name == "fc.b" and out.ops == ("a: weight -> a", "b: a -> b")
    assert (a.calls, b.calls) == (1, 1)
    # the other order: b sees 'weight' and does nothing, a renames to 'a'
    a2, b2 = Recording("a", "weight", "a"), Recording("b", "a", "b")
    assert ChainAdapter([b2, a2]).adapt(f32("fc.weight", (2,)), LINEAR).tensor.name == "fc.a"


def test_chain_alternative_names() -> None:
    # gamma -> weight -> scale
    a, b = Recording("a", "", "", "gamma", "weight"), Recording("b", "", "", "weight", "scale")
    assert ChainAdapter([a, b]).alternative_name("gamma", LINEAR) == "scale"
    assert (a.alt_calls, b.alt_calls) == (1, 1)
    # the second has none for the first's answer: fall back to the first's
    a, b = Recording("a", "", "", "gamma", "weight"), Recording("b", "", "", "other", "x")
    assert ChainAdapter([a, b]).alternative_name("gamma", LINEAR) == "weight"
    assert (a.alt_calls, b.alt_calls) == (1, 1)
    # the first has none: the second is asked with the original name
    a, b = Recording("a", "", "", "zzz", "y"), Recording("b", "", "", "gamma", "g2")
    assert ChainAdapter([a, b]).alternative_name("gamma", LINEAR) == "g2"
    assert (a.alt_calls, b.alt_calls) == (1, 1)
    # neither
    assert ChainAdapter([Recording("a", "", ""), Recording("b", "", "")]).alternative_name("gamma", LINEAR) is None


def test_chains_nest_like_left_folds() -> None:
    a = Recording("a", "", "", "gamma", "weight")
    b = Recording("b", "", "", "nope", "x")
    c = Recording("c", "", "", "weight", "scale")
    flat = ChainAdapter([a, b, c]).alternative_name("gamma", LINEAR)
    nested = ChainAdapter([ChainAdapter([a, b]), c]).alternative_name("gamma", LINEAR)
    assert flat == nested == "scale"


def test_chain_of_real_adapters_alternative() -> None:
    chain = build_adapter(["pytorch_to_burn", "half_precision"])
    assert chain.alternative_name("gamma", declared("LayerNorm")) == "weight"


# ---- build_adapter ------------------------------------------------------------------------------------

def test_build_adapter_specs() -> None:
    assert isinstance(build_adapter([]), IdentityAdapter)
    assert isinstance(build_adapter(["identity"]), IdentityAdapter)
    assert isinstance(build_adapter(["pytorch_to_burn"]), PyTorchToBurnAdapter)
    assert isinstance(build_adapter(["burn_to_pytorch"]), BurnToPyTorchAdapter)
    hp = build_adapter(["half_precision"])
    assert isinstance(hp, HalfPrecisionAdapter) and hp.modules == DEFAULT_HALF_PRECISION_MODULES
    spec = HalfPrecisionSpec.model_validate({"half_precision": {"with": ["BatchNorm"], "without": ["LayerNorm"]}})
    hp = build_adapter([spec])
    assert isinstance(hp, HalfPrecisionAdapter)
    assert "Struct:BatchNorm" in hp.modules and "Struct:LayerNorm" not in hp.modules
    chain = build_adapter(["pytorch_to_burn", FloatCastSpec.model_validate({"float_cast": {"to": "f16"}})])
    assert isinstance(chain, ChainAdapter) and chain.name == "pytorch_to_burn -> float_cast"
    with pytest.raises(ValueError, match="not in the module set"):  # refused when the recipe is validated
        HalfPrecisionSpec.model_validate({"half_precision": {"without": ["BatchNorm"]}})
    unchecked = HalfPrecisionSpec.model_construct(
        half_precision=HalfPrecisionSpec.model_fields["half_precision"].annotation.model_construct(  # type: ignore[union-attr]
            with_=[], without=["BatchNorm"]))
    with pytest.raises(AdapterError, match="not in the module set"):  # and by the adapter itself
        build_adapter([unchecked])
    with pytest.raises(AdapterError, match="unknown adapter"):
        build_adapter(["pytorch_to_tf"])


def test_identity() -> None:
    t = f32("x", (3,))
    out = IdentityAdapter().adapt(t, UNRESOLVED)
    assert out.tensor is t and out.ops == ()


# ---- laziness ------------------------------------------------------------------------------------------

def test_adapted_tensors_stay_lazy() -> None:
    calls: list[str] = []
    chain = build_adapter(["pytorch_to_burn", "half_precision"])
    w = chain.adapt(counting("fc.weight", np.arange(6, dtype=np.float32).reshape(2, 3), calls), LINEAR)
    n = chain.adapt(counting("ln.weight", np.ones(3, dtype=np.float32), calls), declared("LayerNorm"))
    assert calls == [] and w.tensor.nbytes == 12 and n.tensor.name == "ln.gamma"
    assert values(w.tensor) == [0, 3, 1, 4, 2, 5] and calls == ["fc.weight"]
    n.tensor.data()
    assert calls == ["fc.weight", "ln.weight"]


# ---- resolver + adapters on whole state dicts ---------------------------------------------------------------

def _adapt_all(adapter: Adapter, tensors: list[LazyTensor], decl: dict[str, list[str]] | None = None
               ) -> dict[str, LazyTensor]:
    r = ModuleResolver(decl or {}, [(t.name, t.shape) for t in tensors])
    out = [adapter.adapt(t, r.resolve(t.name)).tensor for t in tensors]
    return {t.name: t for t in out}


def _read(path: str) -> list[LazyTensor]:
    from migrator.files.io import open_file

    reader = open_file(fixture_file("pytorch", path))
    return list(reader.values())


def test_fixture_parity_with_burn_names_and_shapes() -> None:
    """The names, shapes and values Burn ends up with for the layer fixtures."""
    p2b = PyTorchToBurnAdapter()
    lin = _adapt_all(p2b, _read("linear.pt"))
    assert {n: t.shape for n, t in lin.items()} == {"fc1.weight": (2, 3), "fc1.bias": (3,), "fc2.weight": (3, 4)}
    src = {t.name: t for t in _read("linear.pt")}
    assert np.array_equal(lin["fc1.weight"].numpy(), src["fc1.weight"].numpy().T)
    bn = _adapt_all(p2b, _read("batch_norm2d.pt"))
    assert set(bn) == {"norm1.gamma", "norm1.beta", "norm1.running_mean", "norm1.running_var",
                       "norm1.num_batches_tracked"}
    for f in ("layer_norm.pt", "group_norm.pt"):
        assert set(_adapt_all(p2b, _read(f))) == {"norm1.gamma", "norm1.beta"}
    for f in ("conv1d.pt", "conv2d.pt", "conv_transpose1d.pt", "conv_transpose2d.pt", "embedding.pt"):
        before = {t.name: (t.shape, bytes(t.data())) for t in _read(f)}
        after = {n: (t.shape, bytes(t.data())) for n, t in _adapt_all(p2b, _read(f)).items()}
        assert before == after, f
    ints = _adapt_all(p2b, _read("integer.pt"))
    assert ints["buffer"].dtype is dtypes.I64 and values(ints["buffer"]) == [1, 2, 3]


def test_fixture_half_precision_needs_declared_root_types() -> None:
    tensors = _read("buffer.pt")
    with pytest.raises(AdapterError, match="unresolved"):
        _adapt_all(HalfPrecisionAdapter(), tensors)
    out = _adapt_all(HalfPrecisionAdapter(), tensors, {"Net": ["^$"]})
    assert out["buffer"].dtype is dtypes.F32  # a user struct: outside the set, as in Burn


def test_bert_like_round_trip_bit_identical() -> None:
    """pytorch_to_burn then burn_to_pytorch (types re-inferred from Burn names) gives the state_dict back."""
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.query, self.key, self.value, self.dense = (nn.Linear(16, 16) for _ in range(4))
            self.LayerNorm = nn.LayerNorm(16)
            self.intermediate = nn.Linear(16, 64)
            self.output = nn.Linear(64, 16)
            self.out_norm = nn.LayerNorm(16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.query(x), self.key(x), self.value(x)
            att = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v
            x = self.LayerNorm(x + self.dense(att))
            return self.out_norm(x + self.output(torch.relu(self.intermediate(x))))

    class Bert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.word_embeddings = nn.Embedding(50, 16)
            self.position_embeddings = nn.Embedding(8, 16)
            self.emb_norm = nn.LayerNorm(16)
            self.layers = nn.ModuleList([Block(), Block()])
            self.classifier = nn.Linear(16, 3)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.emb_norm(self.word_embeddings(ids) + self.position_embeddings(torch.arange(ids.shape[1])))
            for layer in self.layers:
                x = layer(x)
            return self.classifier(x)

    model = Bert().eval()
    sd = model.state_dict()
    tensors = [from_numpy(k, v.numpy()) for k, v in sd.items()]
    burn = _adapt_all(PyTorchToBurnAdapter(), tensors)
    assert burn["layers.0.query.weight"].shape == (16, 16) and "layers.1.out_norm.gamma" in burn
    assert burn["classifier.weight"].shape == (16, 3) and burn["word_embeddings.weight"].shape == (50, 16)
    # materialize the Burn side, as a file would hold it, then go back
    stored = [from_numpy(n, t.numpy().copy()) for n, t in burn.items()]
    back = _adapt_all(BurnToPyTorchAdapter(), stored)
    assert set(back) == set(sd)
    for k, v in sd.items():
        assert bytes(back[k].data()) == v.numpy().tobytes(), k
    ids = torch.tensor([[1, 5, 7, 9]])
    restored = Bert().eval()
    restored.load_state_dict({k: torch.from_numpy(back[k].numpy().copy()) for k in sd})
    with torch.no_grad():
        assert torch.equal(model(ids), restored(ids))

    # half precision, compared to torch's own .half()
    half = _adapt_all(build_adapter(["pytorch_to_burn", "half_precision"]), tensors)
    back16 = _adapt_all(BurnToPyTorchAdapter(), [from_numpy(n, t.numpy().copy()) for n, t in half.items()])
    want = model.half().state_dict()
    for k, v in want.items():
        assert back16[k].dtype is dtypes.F16
        assert bytes(back16[k].data()) == v.numpy().tobytes(), k


def test_one_adapter_registry_feeds_schema_cli_and_hints() -> None:
    """`adapter_names` is the one list: the recipe schema's names, the adapter classes, the
    command line's choices and the loader's hint all come from it."""
    import typing

    from migrator.cli import _parser
    from migrator.recipe import adapter_names
    from migrator.recipe import model as recipe
    from migrator.recipe.loader import recipe_json_schema
    from migrator.transform.adapters import NAMED_ADAPTERS

    assert typing.get_args(recipe.AdapterName) == adapter_names.NAMED
    assert tuple(NAMED_ADAPTERS) == adapter_names.NAMED
    assert set(adapter_names.ALL) == set(adapter_names.NAMED) | set(adapter_names.WITH_OPTIONS)
    schema = recipe_json_schema()
    enums = [e for e in _walk_enums(schema) if "pytorch_to_burn" in e]
    assert enums == [list(adapter_names.NAMED)]
    _, commands = _parser()
    adapter_help = next(a.help for a in commands["convert"]._actions if "--adapter" in a.option_strings)
    assert adapter_help is not None and all(form in adapter_help for form in adapter_names.CLI_FORMS)


def _walk_enums(node: object) -> list[list[str]]:
    if isinstance(node, dict):
        found = [node["enum"]] if "enum" in node else []
        return found + [e for v in node.values() for e in _walk_enums(v)]
    if isinstance(node, list):
        return [e for v in node for e in _walk_enums(v)]
    return []
