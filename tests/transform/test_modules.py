"""Module-type resolution: declared (recipe `modules:`) vs inferred, and refusing to guess."""

from __future__ import annotations

import pytest

from migrator.core.errors import MigratorError
from migrator.transform.adapters import AdapterError as ExportedAdapterError
from migrator.transform.modules import BURN_MODULE_TYPES, AdapterError, ModuleResolver, ModuleType, module_path, qualify

Shapes = list[tuple[str, tuple[int, ...]]]


def resolve(tensors: Shapes, name: str, declared: dict[str, list[str]] | None = None) -> ModuleType:
    return ModuleResolver(declared or {}, tensors).resolve(name)


def kind(tensors: Shapes, name: str, declared: dict[str, list[str]] | None = None) -> str | None:
    return resolve(tensors, name, declared).name


# ---- basics ---------------------------------------------------------------------------------------

def test_module_path_and_qualified_names() -> None:
    assert module_path("a.b.weight") == "a.b" and module_path("weight") == ""
    assert ModuleType("Linear", "declared", "x").qualified == "Struct:Linear"
    assert ModuleType("Enum:Block", "declared", "x").qualified == "Enum:Block"
    assert ModuleType(None, "unresolved", "x").qualified is None
    assert qualify("Struct:Linear") == "Struct:Linear"


def test_fifteen_burn_module_types() -> None:
    names = ["Linear", "BatchNorm", "LayerNorm", "GroupNorm", "Embedding", "Conv1d", "Conv2d", "Conv3d",
             "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "DeformConv2d", "InstanceNorm", "RmsNorm",
             "PRelu"]
    assert tuple(f"Struct:{n}" for n in names) == BURN_MODULE_TYPES


def test_adapter_error_is_shared_and_typed() -> None:
    assert ExportedAdapterError is AdapterError and issubclass(AdapterError, MigratorError)


# ---- inference rules -----------------------------------------------------------------------------------

def test_batchnorm_from_running_stats_torch_and_burn_names() -> None:
    torch_names = [("bn.weight", (5,)), ("bn.bias", (5,)), ("bn.running_mean", (5,)), ("bn.running_var", (5,)),
                   ("bn.num_batches_tracked", ())]
    for name, _ in torch_names:
        m = resolve(torch_names, name)
        assert (m.name, m.how) == ("BatchNorm", "inferred") and "running_mean" in m.reason
    burn_names = [("x.1.gamma", (4,)), ("x.1.beta", (4,)), ("x.1.running_mean", (4,)), ("x.1.running_var", (4,))]
    assert kind(burn_names, "x.1.gamma") == "BatchNorm"  # no norm-like name needed


def test_running_stats_with_a_2d_weight_is_unresolved() -> None:
    t = [("weight", (3, 4)), ("bias", (3,)), ("running_mean", (3,)), ("running_var", (3,))]
    m = resolve(t, "weight")
    assert m.name is None and m.how == "unresolved" and "running_mean" in m.reason


def test_instance_norm_with_running_stats() -> None:
    t = [("instance_norm.weight", (3,)), ("instance_norm.running_mean", (3,)), ("instance_norm.running_var", (3,))]
    m = resolve(t, "instance_norm.weight")
    assert m.name == "InstanceNorm" and "do not rename" in m.reason


@pytest.mark.parametrize(("rank", "expected"), [(3, "Conv1d"), (4, "Conv2d"), (5, "Conv3d")])
def test_conv_by_weight_rank(rank: int, expected: str) -> None:
    t = [("conv1.weight", (2,) * rank), ("conv1.bias", (2,))]
    m = resolve(t, "conv1.bias")
    assert m.name == expected and "ConvTranspose" in m.reason and "same" in m.reason
    assert m.norm_excluded


def test_conv_transpose_by_name() -> None:
    t = [("up.deconv.weight", (2, 3, 4, 4))]
    assert kind(t, "up.deconv.weight") == "ConvTranspose2d"
    assert kind([("conv_transpose.weight", (2, 3, 4))], "conv_transpose.weight") == "ConvTranspose1d"


def test_conv_with_unexpected_siblings_is_unresolved() -> None:
    t = [("c.weight", (2, 2, 3)), ("c.weight_g", (2, 1, 1))]
    assert kind(t, "c.weight") is None


@pytest.mark.parametrize(("path", "expected"), [
    ("norm1", "LayerNorm"), ("ln_f", "LayerNorm"), ("h.0.ln_1", "LayerNorm"), ("LayerNorm", "LayerNorm"),
    ("input_layernorm", "LayerNorm"), ("final_layer_norm", "LayerNorm"), ("blocks.0.attn_ln", "LayerNorm"),
    ("group_norm", "GroupNorm"), ("gn1", "GroupNorm"), ("rms_norm", "RmsNorm"), ("model.norm", "LayerNorm"),
    ("bn", "BatchNorm"), ("batchnorm", "BatchNorm"), ("instance_norm", "InstanceNorm"),
])
def test_norm_family_by_name(path: str, expected: str) -> None:
    t = [(f"{path}.weight", (8,)), (f"{path}.bias", (8,))]
    m = resolve(t, f"{path}.bias")
    assert (m.name, m.how) == (expected, "inferred")
    assert not m.norm_excluded


def test_norm_family_reason_says_they_behave_alike() -> None:
    m = resolve([("norm1.weight", (6,)), ("norm1.bias", (6,))], "norm1.weight")
    assert m.name == "LayerNorm" and "LayerNorm/GroupNorm/RmsNorm behave the same" in m.reason


def test_rms_norm_weight_only() -> None:
    assert kind([("layers.0.ffn_norm.weight", (16,))], "layers.0.ffn_norm.weight") == "LayerNorm"


def test_burn_gamma_beta_without_a_norm_name() -> None:
    m = resolve([("blk.scale.gamma", (4,)), ("blk.scale.beta", (4,))], "blk.scale.beta")
    assert m.name == "LayerNorm" and "gamma" in m.reason


def test_one_d_weight_under_other_names_is_unresolved() -> None:
    m = resolve([("scale.weight", (4,)), ("scale.bias", (4,))], "scale.weight")
    assert m.name is None and not m.norm_excluded


def test_norm_with_mismatched_lengths_is_not_a_norm() -> None:
    m = resolve([("norm.weight", (4,)), ("norm.bias", (5,))], "norm.weight")
    assert m.name is None and m.norm_excluded


def test_prelu() -> None:
    assert kind([("act.prelu.weight", (1,))], "act.prelu.weight") == "PRelu"
    assert kind([("prelu.alpha", (3,))], "prelu.alpha") == "PRelu"


@pytest.mark.parametrize("path", ["embed", "embeddings.word_embeddings", "embeddings.position_embeddings",
                                  "token_type_embeddings", "wte", "transformer.wpe", "model.embed_tokens",
                                  "tok_embeddings", "pos_emb", "embedding"])
def test_embedding_by_name(path: str) -> None:
    m = resolve([(f"{path}.weight", (10, 3))], f"{path}.weight")
    assert (m.name, m.how) == ("Embedding", "inferred")


def test_embedding_like_name_with_bias_is_refused() -> None:
    m = resolve([("embed.weight", (10, 3)), ("embed.bias", (10,))], "embed.weight")
    assert m.name is None and "bias" in m.reason


def test_embed_proj_is_not_embedding_like() -> None:
    assert kind([("embed_proj.weight", (10, 3))], "embed_proj.weight") is None


@pytest.mark.parametrize("path", ["fc", "fc2", "dense", "attention.self.query", "key", "value", "q_proj",
                                  "lm_head", "classifier", "linear1", "mlp.down_proj", "attn.out_proj",
                                  "SelfAttention.q", "DenseReluDense.wi", "head", "attn.qkv"])
def test_linear_by_name_without_bias(path: str) -> None:
    m = resolve([(f"{path}.weight", (8, 8))], f"{path}.weight")
    assert (m.name, m.how) == ("Linear", "inferred") and m.weight_layout is None


def test_linear_by_bias_matching_dim_0() -> None:
    t = [("layer1.weight", (2, 3)), ("layer1.bias", (2,))]
    m = resolve(t, "layer1.bias")
    assert m.name == "Linear" and m.weight_layout == "out_in" and "dim 0" in m.reason
    assert m.norm_excluded


def test_linear_by_bias_matching_dim_1_records_burn_layout() -> None:
    m = resolve([("layer.weight", (3, 2)), ("layer.bias", (2,))], "layer.weight")
    assert m.name == "Linear" and m.weight_layout == "in_out"


def test_square_weight_with_bias_under_plain_name_is_unresolved() -> None:
    m = resolve([("blk.weight", (4, 4)), ("blk.bias", (4,))], "blk.weight")
    assert m.name is None and "square" in m.reason


def test_bias_matching_neither_dim_is_unresolved() -> None:
    m = resolve([("dense.weight", (4, 3)), ("dense.bias", (5,))], "dense.weight")
    assert m.name is None and "neither" in m.reason


def test_2d_weight_without_clues_is_unresolved() -> None:
    m = resolve([("shared.weight", (100, 16))], "shared.weight")
    assert m.name is None and "Embedding" in m.reason and "Linear" in m.reason
    assert m.norm_excluded


@pytest.mark.parametrize("path", ["h.0.attn.c_attn", "h.0.mlp.c_fc", "h.0.mlp.c_proj", "h.0.attn.c_proj"])
def test_gpt2_conv1d_names_are_refused(path: str) -> None:
    t = [(f"{path}.weight", (768, 2304)), (f"{path}.bias", (2304,))]
    m = resolve(t, f"{path}.weight")
    assert m.name is None and "Conv1D" in m.reason and "[in, out]" in m.reason


def test_gpt2_conv1d_candidates_are_conv1d_first_and_square_only_conv1d() -> None:
    m = resolve([("attn.c_attn.weight", (8, 24)), ("attn.c_attn.bias", (24,))], "attn.c_attn.weight")
    assert m.candidates == ("Conv1D", "Linear") and m.weight_layout == "in_out"
    m = resolve([("attn.c_proj.weight", (8, 8)), ("attn.c_proj.bias", (8,))], "attn.c_proj.weight")
    assert m.name is None and m.candidates == ("Conv1D",) and "square" in m.reason


def test_gpt2_names_with_a_dim_0_bias_are_pytorch_linears() -> None:
    # OpenAI CLIP's MLP: nn.Linear named c_fc/c_proj, [out, in]; a Conv1D's bias would match dim 1
    m = resolve([("mlp.c_fc.weight", (32, 8)), ("mlp.c_fc.bias", (32,))], "mlp.c_fc.weight")
    assert (m.name, m.how, m.weight_layout) == ("Linear", "inferred", "out_in")


def test_root_and_raw_tensors_are_unresolved() -> None:
    t = [("tensor", (3,)), ("buffer", (3, 3))]
    assert resolve(t, "tensor").how == "unresolved"
    assert resolve([("param", (3, 3))], "param").name is None


def test_lone_bias_excludes_a_norm() -> None:
    m = resolve([("cls.predictions.bias", (30,)), ("cls.predictions.decoder.weight", (30, 8))],
                "cls.predictions.bias")
    assert m.name is None and m.norm_excluded
    assert kind([("cls.predictions.decoder.weight", (30, 8))], "cls.predictions.decoder.weight") == "Linear"


def test_a_bert_state_dict_resolves_fully() -> None:
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.query, self.key, self.value = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
            self.dense = nn.Linear(8, 8)
            self.LayerNorm = nn.LayerNorm(8)
            self.intermediate = nn.Module()
            self.intermediate.dense = nn.Linear(8, 32)
            self.output = nn.Module()
            self.output.dense = nn.Linear(32, 8)
            self.output.LayerNorm = nn.LayerNorm(8)

    class Bert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embeddings = nn.Module()
            self.embeddings.word_embeddings = nn.Embedding(50, 8)
            self.embeddings.position_embeddings = nn.Embedding(16, 8)
            self.embeddings.token_type_embeddings = nn.Embedding(2, 8)
            self.embeddings.LayerNorm = nn.LayerNorm(8)
            self.layer = nn.ModuleList([Layer(), Layer()])
            self.pooler = nn.Linear(8, 8)

    sd = Bert().state_dict()
    r = ModuleResolver({"Linear": [r"\.pooler$|^pooler$"]}, [(k, tuple(v.shape)) for k, v in sd.items()])
    want = {nn.Linear: "Linear", nn.Embedding: "Embedding", nn.LayerNorm: "LayerNorm"}
    modules = dict(Bert().named_modules())
    for name in sd:
        expected = want[type(modules[module_path(name)])]
        assert r.resolve(name).name == expected, name
    assert r.resolve("pooler.weight").how == "declared"


# ---- declared --------------------------------------------------------------------------------------------

def test_declared_wins_over_inferred() -> None:
    t = [("embed.weight", (10, 3))]
    m = resolve(t, "embed.weight", {"Linear": [r"^embed$"]})
    assert (m.name, m.how) == ("Linear", "declared") and "^embed$" in m.reason


def test_declared_regex_is_searched_in_the_module_path_only() -> None:
    t = [("enc.attn.query.weight", (4, 4)), ("enc.attn.query.bias", (4,))]
    decl = {"MyProj": [r"\.query$"]}
    assert kind(t, "enc.attn.query.weight", decl) == "MyProj"
    assert kind(t, "enc.attn.query.bias", decl) == "MyProj"
    assert kind(t, "enc.attn.query.weight", {"MyProj": [r"weight"]}) == "Linear"  # not the parameter name


def test_declared_root_module() -> None:
    t = [("weight", (3, 4)), ("bias", (3,))]
    assert kind(t, "weight", {"Linear": ["^$"]}) == "Linear"
    assert kind([("x.weight", (3, 4))], "x.weight", {"Linear": ["^$"]}) is None


def test_declared_keeps_sibling_evidence() -> None:
    m = resolve([("c_attn.weight", (8, 24)), ("c_attn.bias", (24,))], "c_attn.weight", {"Linear": ["c_attn"]})
    assert m.how == "declared" and m.weight_layout == "in_out" and m.norm_excluded


def test_two_declared_types_on_one_path_is_an_error() -> None:
    decl = {"Linear": [r"dense$"], "Embedding": [r"^enc\."]}
    r = ModuleResolver(decl, [("enc.dense.weight", (4, 4))])
    with pytest.raises(AdapterError) as e:
        r.resolve("enc.dense.weight")
    msg = str(e.value)
    assert "'enc.dense'" in msg and "Linear: 'dense$'" in msg and "Embedding: '^enc\\.'" in msg
    assert e.value.tensor == "enc.dense.weight"


def test_same_type_twice_is_fine() -> None:
    decl = {"Linear": [r"dense$", r"^enc\."], "Struct:Linear": [r"enc"]}
    assert kind([("enc.dense.weight", (4, 4))], "enc.dense.weight", decl) == "Linear"


def test_bad_declared_regex() -> None:
    with pytest.raises(AdapterError, match="invalid regex"):
        ModuleResolver({"Linear": ["(unclosed"]}, [])


def test_rust_dialect_dollar() -> None:
    # Burn's `$` matches only at the very end, as the recipe's other regexes do
    m = resolve([("a.fc\n.weight", (2, 2))], "a.fc\n.weight", {"Embedding": [r"fc$"]})
    assert m.how != "declared"


def test_resolution_is_per_module_and_cached() -> None:
    t = [("fc.weight", (3, 2)), ("fc.bias", (3,))]
    r = ModuleResolver({}, t)
    assert r.resolve("fc.weight") is r.resolve("fc.bias")
    assert r.params("fc") == {"weight": (3, 2), "bias": (3,)}
    assert r.resolve("unknown.weight").how == "unresolved"  # not among the tensors: no siblings


# ---- the per-signature cache against resolving every module from scratch ------------------------------

def _reference_type(declared: dict[str, list[str]], tensors: Shapes,
                    name: str) -> ModuleType | tuple[str, str, str]:
    """One module resolved alone, with nothing shared: the first matching declaration, else `infer`;
    the misfit (type, param, rule) when the type does not fit the module's tensors."""
    from migrator.naming import compile_regex
    from migrator.transform.modules import _bias_layout, _norm_possible, fit_problem, infer

    path = module_path(name)
    params = {n.rpartition(".")[2]: s for n, s in tensors if module_path(n) == path}
    found = None
    for type_name, patterns in declared.items():
        for p in patterns:
            if found is None and compile_regex(p).search(path):
                found = ModuleType(type_name, "declared", f"modules: {type_name}: '{p}'", _bias_layout(params),
                                   not _norm_possible(params))
    found = found or infer(path, params)
    problem = found.name and fit_problem(found.name, params)
    return (found.name, *problem) if problem else found  # type: ignore[return-value]


_PARAM_SETS: list[list[tuple[str, tuple[int, ...]]]] = [
    [("weight", (4, 3)), ("bias", (4,))], [("bias", (4,)), ("weight", (4, 3))], [("weight", (4, 3)), ("bias", (3,))],
    [("weight", (5,)), ("bias", (5,))], [("weight", (4, 4))], [("gamma", (4,)), ("beta", (4,))],
    [("weight", (8, 3, 3, 3)), ("bias", (8,))],
    [("weight", (6,)), ("bias", (6,)), ("running_mean", (6,)), ("running_var", (6,)), ("num_batches_tracked", ())],
]


@pytest.mark.parametrize("declared", [{}, {"Linear": [r"\.(fc|c_fc)$"], "LayerNorm": [r"ln_\d$"]}])
def test_shared_signatures_resolve_like_each_module_alone(declared: dict[str, list[str]]) -> None:
    names = ["fc", "c_fc", "ln_1", "ln_f", "wte", "norm", "bn1", "conv", "head", "blk"]
    tensors: Shapes = []
    for layer in range(3):
        for i, name in enumerate(names):
            for param, shape in _PARAM_SETS[(i + layer) % len(_PARAM_SETS)]:
                tensors.append((f"h.{layer}.{name}.{param}", shape))
    tensors += [("fc.weight", (4, 3)), ("fc.bias", (4,)), ("weight", (2, 2))]
    resolver = ModuleResolver(declared, tensors)
    for name, _ in tensors:
        want = _reference_type(declared, tensors, name)
        if isinstance(want, tuple):
            with pytest.raises(AdapterError) as e:
                resolver.resolve(name)
            type_name, param, rule = want
            assert f"module type {type_name}: {rule}" in str(e.value) and f".{param}' " in str(e.value), name
            continue
        got = resolver.resolve(name)
        assert (got, got.qualified) == (want, want.qualified), name
