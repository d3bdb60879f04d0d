"""Module types for file-to-file adapters: declared in the recipe, or inferred where unambiguous.

Burn's adapters decide from the live module's type (`Struct:Linear` -> transpose the weight). A
file has no live module: a 2-D ``weight`` may be a Linear (transpose) or an Embedding (never
transpose), and guessing wrong silently corrupts a model. So every tensor's module type is either
declared (the recipe's ``modules:`` map), inferred by one of the conservative rules below, or
*unresolved* — and an adapter whose decision depends on an unresolved type refuses to guess.

The module path is the tensor name minus its last segment, as Burn's path is (``''`` for a root
tensor); ``modules:`` regexes are searched in it (Burn's regex dialect, see `naming`). All tensors
of one module path share one type, decided from the module's own parameters (its *siblings*).

Inference rules, first match wins (``name`` = last segment of the module path, case-insensitive;
"params" = the module's own tensors):

=====================  ===========================================================================
type                   rule
=====================  ===========================================================================
BatchNorm              ``running_mean`` and ``running_var`` among params, all params 1-D of one
                       length (plus ``num_batches_tracked``); InstanceNorm if the name says
                       ``instance`` (PyTorch InstanceNorm with ``track_running_stats``)
Conv{1,2,3}d           ``weight`` of rank 3/4/5, params within {weight, bias}; ConvTranspose{n}d
                       when the name has ``transpose``/``deconv``. Conv and ConvTranspose have the
                       same ranks, so the other is possible: no adapter treats them differently
                       (neither is transposed or renamed; both are in half_precision's set)
norm family            params {weight[, bias]} or {gamma[, beta]}, 1-D, one length, norm-like name
                       (contains ``norm``; ``ln``/``bn``/``gn`` alone, with a number or a ``_x``
                       suffix, or as a ``_ln`` suffix: ln_f, ln_1, bn1, attn_ln). The family is
                       told apart by name (batch/bn -> BatchNorm, group/gn -> GroupNorm, rms ->
                       RmsNorm, instance -> InstanceNorm), else LayerNorm: LayerNorm, GroupNorm and
                       RmsNorm behave the same in every adapter. Burn-named ``gamma``[+``beta``]
                       alone also counts (Burn uses those names only in norm layers)
PRelu                  name contains ``prelu``, params {weight} or {alpha}, 1-D
Embedding              params exactly {weight}, 2-D, embedding-like name (ends in embed, embeds,
                       embedding, embeddings, emb, or is embed_tokens/embed_positions/wte/wpe)
Linear                 ``weight`` 2-D, params within {weight, bias}, name not embedding-like, and
                       either a linear-like name (fc, dense, linear, proj, query, key, value,
                       q_proj, lm_head, classifier, ... see ``LINEAR_LIKE``) or a 1-D bias whose
                       length equals exactly one weight dimension. Under GPT-2's Conv1D names
                       (``c_attn``/``c_fc``/``c_proj``) only a bias of dim 0 (``[out, in]``, as
                       OpenAI CLIP's Linear ``c_fc``) counts
Conv1D                 GPT-2's Conv1D names (``c_attn``/``c_fc``/``c_proj``) with a bias of dim 1
                       (``[in, out]``) in a PyTorch or SafeTensors file, whose Linears are
                       ``[out, in]``. In a Burn file that layout is also a Linear's, and a square
                       weight says nothing: those are declared (``Conv1D``)
(unresolved)           anything else, with the reason
=====================  ===========================================================================

Every declared or inferred type that migrator knows (Burn's 15 and ``Conv1D``) must also fit the
module's tensors (`fit_problem`: a norm's params are 1-D of one length, a Linear's weight 2-D with
a 1-D bias of one of its dims, an Embedding's weight 2-D and alone, a Conv{n}d's weight of rank
n+2, a BatchNorm's running_mean comes with its running_var, ...); a misfit is an `AdapterError`
naming the tensor, its shape and the declaration (with its recipe LINE:COL) or inference rule. A
wrong ``modules:`` regex thus fails the plan instead of renaming a Linear's weight ``gamma``.

A bias that matches exactly one weight dimension also records the weight's layout
(`ModuleType.weight_layout`): PyTorch's Linear stores ``[out, in]`` (bias = dim 0), Burn's
``[in, out]`` (bias = dim 1). The layout adapters refuse to transpose a weight already in their
target layout. `ModuleType.norm_excluded` records that the siblings rule out every norm type
(a weight that is not 1-D, a bias with no weight, extra params), so a lone ``bias`` of an
unresolved module needs no decision.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core.errors import MigratorError
from ..formats.registry import is_format
from ..naming import NamingError, Regex, compile_regex
from ..recipe.adapter_names import qualify


class AdapterError(MigratorError):
    """An adapter cannot decide what to do with a tensor (unknown or conflicting module type).

    `declare`: (type name, module path, what the type does) when exactly one declaration fixes it,
    so a plan can give one declaration covering every such module (`declaration_hint`)."""

    declare: tuple[str, str, str] | None = None


def declaration_hint(wanted: Sequence[tuple[str, str, str]], all_paths: Iterable[str],
                     syntax: str = "recipe") -> str:
    """One line declaring every module of `wanted` ((type, module path, what it does) each). Index
    segments become `\\d+`, so one pattern covers every layer, but only where the pattern then
    matches no other module of `all_paths` than those wanted with that type (a Sequential's `1` and
    `3` may be a Linear and a LayerNorm); else the exact paths. `syntax`: "recipe" (a `modules:`
    entry) or "convert" (`--modules` options)."""
    paths_of: dict[str, set[str]] = {}
    does: dict[str, str] = {}
    for type_name, path, what in wanted:
        paths_of.setdefault(type_name, set()).add(path)
        does[type_name] = what
    everything = list(all_paths)
    by_type: dict[str, list[str]] = {}
    for type_name, paths in paths_of.items():
        patterns = by_type.setdefault(type_name, [])
        for path in sorted(paths):
            exact = exact_regex(path)[1:-1]
            general = "\\.".join("\\d+" if seg.isdigit() else exact_regex(seg)[1:-1] for seg in path.split("."))
            if general != exact:
                matcher = compile_regex("^" + general + "$")
                if any(p not in paths and matcher.search(p) for p in everything):
                    general = exact  # the general form would also declare a module of another kind
            if general not in patterns:
                patterns.append(general)
    limit = 8  # a model whose modules share no shape needs a declaration per kind; list the first
    regexes = {t: ("^" + ps[0] + "$") if len(ps) == 1 else "^(?:" + "|".join(ps[:limit]) + ")$"
               for t, ps in by_type.items()}
    more = sum(max(0, len(ps) - limit) for ps in by_type.values())
    if syntax == "convert":
        text = " ".join(f"--modules '{t}={rx}'" for t, rx in regexes.items())
    else:
        text = "modules: {" + ", ".join(f"{t}: [{yaml_quoted(rx)}]" for t, rx in regexes.items()) + "}"
    whats = "; ".join(f"{t}: {does[t]}" for t in regexes)
    count = len({p for _, p, _ in wanted})
    return (f"declare the type of these {count} module{'s' if count != 1 else ''} at once: {text} ({whats})"
            + (f"; {more} more module names not listed" if more else ""))


BURN_MODULE_TYPES: tuple[str, ...] = (
    "Struct:Linear", "Struct:BatchNorm", "Struct:LayerNorm", "Struct:GroupNorm", "Struct:Embedding",
    "Struct:Conv1d", "Struct:Conv2d", "Struct:Conv3d", "Struct:ConvTranspose1d", "Struct:ConvTranspose2d",
    "Struct:ConvTranspose3d", "Struct:DeformConv2d", "Struct:InstanceNorm", "Struct:RmsNorm", "Struct:PRelu",
)
"""The 15 module-type names Burn's adapters know (burn-nn's module types)."""

CONV1D = "Struct:Conv1D"
"""transformers' GPT-2 ``Conv1D`` (``c_attn``, ``c_fc``, ``c_proj``): a Linear that stores its weight
``[in, out]``, which is already Burn's Linear layout, so the layout adapters keep it as stored."""

KNOWN_MODULE_TYPES: tuple[str, ...] = (*BURN_MODULE_TYPES, CONV1D)
"""The types whose tensors migrator checks (`fit_problem`); any other declared name is the user's own."""


def module_path(tensor_name: str) -> str:
    """The tensor name minus its last segment ('' for a root tensor)."""
    return tensor_name.rpartition(".")[0]


_RUST_META = frozenset("\\.+*?()|[]{}^$#&-~")
"""The characters Rust's `regex::escape` escapes (and migrator's dialect accepts escaped)."""


def exact_regex(path: str) -> str:
    """A ``modules:`` regex matching exactly `path` and nothing else: anchored, every meta escaped."""
    return "^" + "".join("\\" + c if c in _RUST_META else c for c in path) + "$"


_ENTRY = re.compile(r"modules: \{([\w:]+): \['((?:[^']|'')*)'\]\}")


def in_convert_syntax(text: str) -> str:
    """An adapter's hint (`declare its type in the recipe: modules: {Linear: ['^a$']}`) in `migrate
    convert`'s own option syntax (`declare its type: --modules 'Linear=^a$'`)."""
    text = text.replace("declare its type in the recipe", "declare its type")
    return _ENTRY.sub(lambda m: "--modules '" + m.group(1) + "=" + m.group(2).replace("''", "'") + "'", text)


def yaml_quoted(text: str) -> str:
    """`text` as a YAML single-quoted scalar (backslashes stay literal; a quote is doubled)."""
    return "'" + text.replace("'", "''") + "'"


WeightLayout = Literal["out_in", "in_out"]


@dataclass(frozen=True)
class ModuleType:
    """The type of the module a tensor belongs to, and how migrator knows it."""

    name: str | None  # unqualified Burn type name ('Linear', user names); None = unresolved
    how: Literal["declared", "inferred", "unresolved"]
    reason: str
    weight_layout: WeightLayout | None = None  # a 2-D weight's layout as its bias shows it
    norm_excluded: bool = False  # the siblings rule out every norm type
    # unresolved only: the known types a 2-D weight's module could be declared as, best first, each
    # fitting the module's tensors (`fit_problem`); () = none fits; None = not worked out
    candidates: tuple[str, ...] | None = None
    # computed once: adapters ask for it for every tensor of a 100k-tensor plan
    _qualified: str | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if self.name is not None:
            object.__setattr__(self, "_qualified", qualify(self.name))

    @property
    def qualified(self) -> str | None:
        """``Struct:<name>`` (or the name as given when it has ':'), as Burn's container stack has it."""
        return self._qualified

    def __str__(self) -> str:
        return f"{self.name or '?'} ({self.how}: {self.reason})"


def unresolved(reason: str, *, norm_excluded: bool = False, weight_layout: WeightLayout | None = None,
               candidates: tuple[str, ...] | None = None) -> ModuleType:
    return ModuleType(None, "unresolved", reason, weight_layout, norm_excluded, candidates)


# ---- name patterns (last segment of the module path) ------------------------------------------------

NORM_LIKE = re.compile(r"norm|^(?:ln|bn|gn)(?:_?\d+|_[a-z0-9_]+)?\Z|_(?:ln|bn|gn)\d*\Z", re.IGNORECASE)
EMBEDDING_LIKE = re.compile(
    r"^(?:\w*(?:embed|embeds|embedding|embeddings|emb)|\w*embed_(?:tokens|positions)|wte|wpe)\d*\Z", re.IGNORECASE)
LINEAR_LIKE = re.compile(
    r"^(?:fc|dense|linear|lin|proj|proj_in|proj_out|in_proj|out_proj|q_proj|k_proj|v_proj|o_proj|qkv_proj"
    r"|gate_proj|up_proj|down_proj|query|key|value|qkv|query_key_value|q|k|v|o|wq|wk|wv|wo|wi|wi_0|wi_1"
    r"|w1|w2|w3|fc_in|fc_out|to_q|to_k|to_v|lm_head|classifier|head|score|decoder|dense_h_to_4h"
    r"|dense_4h_to_h)(?:_?\d+)?\Z",
    re.IGNORECASE)
GPT2_CONV1D = re.compile(r"^c_(?:attn|fc|proj)\Z", re.IGNORECASE)
TRANSPOSE_LIKE = re.compile(r"transpose|deconv", re.IGNORECASE)

_TORCH_NORM = frozenset({"weight", "bias"})
_BURN_NORM = frozenset({"gamma", "beta"})
_STATS = frozenset({"running_mean", "running_var", "num_batches_tracked"})


_SAME = "; LayerNorm/GroupNorm/RmsNorm behave the same in every adapter"


def _norm_family(name: str) -> tuple[str, str]:
    """(type, why) for a norm-like module name."""
    low = name.lower()
    if "instance" in low:
        return "InstanceNorm", ("name says instance norm; note Burn's adapters do not rename InstanceNorm "
                                "weight/bias <-> gamma/beta")
    if "batch" in low or re.match(r"bn(?:_|\d|\Z)", low) or re.search(r"_bn\d*\Z", low):
        return "BatchNorm", "name says batch norm (no running statistics beside it)"
    if "group" in low or re.match(r"gn(?:_|\d|\Z)", low) or re.search(r"_gn\d*\Z", low):
        return "GroupNorm", "name says group norm" + _SAME
    if "rms" in low:
        return "RmsNorm", "name says RMS norm" + _SAME
    if "layer" in low or re.match(r"ln(?:_|\d|\Z)", low) or re.search(r"_ln\d*\Z", low):
        return "LayerNorm", "name says layer norm" + _SAME
    return "LayerNorm", "norm family" + _SAME


def _dims(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _norm_possible(params: Mapping[str, tuple[int, ...]]) -> bool:
    """Could these params belong to a norm layer (PyTorch or Burn naming)?"""
    keys = set(params)
    w, g = params.get("weight"), params.get("gamma")
    if not ((w is not None and keys <= _TORCH_NORM | _STATS) or (g is not None and keys <= _BURN_NORM | _STATS)):
        return False
    vectors = [params[k] for k in keys - {"num_batches_tracked"}]
    return all(len(v) == 1 for v in vectors) and len(set(vectors)) == 1


def _bias_layout(params: Mapping[str, tuple[int, ...]]) -> WeightLayout | None:
    """Which dimension of a 2-D weight its 1-D bias matches, when that tells the layout."""
    w, b = params.get("weight"), params.get("bias")
    if w is None or b is None or len(w) != 2 or len(b) != 1 or w[0] == w[1]:
        return None
    if b[0] == w[0]:
        return "out_in"
    if b[0] == w[1]:
        return "in_out"
    return None


# ---- what each known type's tensors look like ---------------------------------------------------------

_NORM_NAMES = frozenset({"weight", "bias", "gamma", "beta"})
_PLAIN_NORMS = frozenset({"LayerNorm", "GroupNorm", "RmsNorm"})


def fit_problem(type_name: str, params: Mapping[str, tuple[int, ...]]) -> tuple[str, str] | None:
    """Why a module with these params (last segment -> shape) cannot be of type `type_name`, as
    (param, rule), or None when it can (or the type is not one migrator knows: the user's own).

    The rules are what PyTorch and Burn store: a layout adapter acting on a type that does not fit
    would rename or transpose the wrong tensors, so a misfit is an error, never a guess.
    """
    qualified = qualify(type_name)
    if qualified not in _KNOWN or not params:  # no tensors (a template-only path): nothing to check
        return None
    t = qualified.removeprefix("Struct:")
    a = "an" if t[0] in "AEIOU" else "a"
    keys = set(params)
    w = params.get("weight")

    def extra(allowed: frozenset[str], what: str) -> tuple[str, str] | None:
        other = sorted(keys - allowed)
        return (other[0], f"{a} {t} has only {what}") if other else None

    def one_d(names: Sequence[str]) -> tuple[str, str] | None:
        for k in names:
            if k in params and len(params[k]) != 1:
                return k, f"{a} {t}'s {k} is 1-D"
        lengths = {params[k] for k in names if k in params}
        if len(lengths) > 1:
            first = next(k for k in names if k in params)
            other = next(k for k in names if k in params and params[k] != params[first])
            return other, f"{a} {t}'s {first} and {other} have one length"
        return None

    if t in ("Linear", "Conv1D"):
        layout = "[in, out] and a bias of dim 1" if t == "Conv1D" else \
            "[out, in] in PyTorch, [in, out] in Burn, with a bias of the out dim"
        problem = extra(_TORCH_NORM, "weight and bias")
        if problem:
            return problem
        if w is None:
            return sorted(keys)[0], f"{a} {t} has a weight"
        if len(w) != 2:
            return "weight", f"{a} {t}'s weight is 2-D ({layout})"
        b = params.get("bias")
        if b is not None:
            if len(b) != 1:
                return "bias", f"{a} {t}'s bias is 1-D"
            if (t == "Conv1D" and b[0] != w[1]) or b[0] not in w:
                return "bias", f"{a} {t}'s bias has the length of its out dim (weight {layout})"
        return None
    if t == "Embedding":
        problem = extra(frozenset({"weight"}), "a weight")
        if problem:
            return problem
        return None if w is not None and len(w) == 2 else ("weight", "an Embedding's weight is 2-D")
    if t.startswith(("Conv", "DeformConv")):
        rank = int(t[-2]) + 2
        problem = extra(_TORCH_NORM, "weight and bias")
        if problem:
            return problem
        if w is None:
            return sorted(keys)[0], f"{a} {t} has a weight"
        if len(w) != rank:
            return "weight", f"{a} {t}'s weight is {rank}-D"
        b = params.get("bias")
        return ("bias", f"{a} {t}'s bias is 1-D") if b is not None and len(b) != 1 else None
    if t == "PRelu":
        return extra(frozenset({"weight", "alpha"}), "weight (PyTorch) or alpha (Burn)") or one_d(["weight", "alpha"])
    vectors = ["weight", "bias", "gamma", "beta"]
    if t in _PLAIN_NORMS:
        return extra(_NORM_NAMES, "weight and bias (gamma and beta in Burn)") or one_d(vectors)
    # BatchNorm, InstanceNorm: affine params plus running statistics
    problem = extra(_NORM_NAMES | _STATS, "weight, bias (gamma, beta), running_mean, running_var and "
                                          "num_batches_tracked")
    if problem:
        return problem
    stats = keys & {"running_mean", "running_var"}
    if len(stats) == 1:  # PyTorch keeps both (track_running_stats) or neither; Burn's BatchNorm both
        (have,) = stats
        return have, f"{a} {t} has running_mean and running_var together (this module has only {have})"
    count = params.get("num_batches_tracked")
    if count is not None and count not in ((), (1,)):
        return "num_batches_tracked", f"{a} {t}'s num_batches_tracked is a scalar"
    return one_d([*vectors, "running_mean", "running_var"])


_KNOWN = frozenset(KNOWN_MODULE_TYPES)


def _fitting(types: Sequence[str], params: Mapping[str, tuple[int, ...]]) -> tuple[str, ...]:
    return tuple(t for t in types if fit_problem(t, params) is None)


_LAYOUT_TEXT = {"out_in": "bias matches dim 0: [out, in], PyTorch's layout",
                "in_out": "bias matches dim 1: [in, out], Burn's layout"}

# A source format whose Linear weights are [out, in] (`FormatSpec.torch_layout`: PyTorch's, SafeTensors'):
# there, a GPT-2-named 2-D weight whose bias matches dim 1 can only be transformers' Conv1D. A burnpack
# (Burn's Linear is [in, out]) cannot tell the two apart.


def infer(path: str, params: Mapping[str, tuple[int, ...]], source_format: str | None = None) -> ModuleType:
    """Infer a module's type from its path and its own parameters (name -> shape), and the format of
    the file the tensors come from (GPT-2's Conv1D needs it); see module doc."""
    name = path.rpartition(".")[2]
    keys = set(params)
    listing = ", ".join(f"{k} {_dims(s)}" for k, s in sorted(params.items())) or "no tensors"
    norm_excluded = not _norm_possible(params)
    layout = _bias_layout(params)

    def found(type_name: str, why: str, *, with_layout: bool = False) -> ModuleType:
        return ModuleType(type_name, "inferred", why, layout if with_layout else None, norm_excluded)

    def refuse(why: str, candidates: Sequence[str] | None = None) -> ModuleType:
        fitting = None if candidates is None else _fitting(candidates, params)
        return unresolved(f"{why} (params: {listing})", norm_excluded=norm_excluded, weight_layout=layout,
                          candidates=fitting)

    w = params.get("weight")
    # BatchNorm: running statistics
    if "running_mean" in keys and "running_var" in keys:
        ones = [params[k] for k in keys - {"num_batches_tracked"}]
        if keys <= _TORCH_NORM | _BURN_NORM | _STATS and all(len(s) == 1 for s in ones) and len(set(ones)) == 1:
            if "instance" in name.lower():
                return found("InstanceNorm", "running_mean/running_var with an instance-norm name; Burn's adapters "
                                             "do not rename InstanceNorm weight/bias <-> gamma/beta")
            return found("BatchNorm", "running_mean/running_var siblings")
        return refuse("running_mean/running_var beside params a BatchNorm does not have")
    # Conv: rank 3-5 weight
    if w is not None and len(w) in (3, 4, 5):
        n = len(w) - 2
        if not keys <= _TORCH_NORM or ("bias" in keys and len(params["bias"]) != 1):
            return refuse(f"rank-{len(w)} weight beside params a Conv{n}d does not have")
        if TRANSPOSE_LIKE.search(name):
            return found(f"ConvTranspose{n}d", f"rank-{len(w)} weight with a transposed-conv name")
        return found(f"Conv{n}d", f"rank-{len(w)} weight (a ConvTranspose{n}d has the same rank; pytorch_to_burn "
                                  "and half_precision treat both the same)")
    # norm family
    if not norm_excluded and not keys & _STATS:
        burn_named = "gamma" in keys
        if NORM_LIKE.search(name):
            type_name, why = _norm_family(name)
            return found(type_name, f"1-D {'gamma' if burn_named else 'weight'} under norm-like name '{name}': {why}")
        if burn_named:
            return found("LayerNorm", "1-D gamma[/beta]: Burn uses these names only in norm layers; "
                                      "LayerNorm/GroupNorm/RmsNorm behave the same in every adapter")
        if "prelu" in name.lower() and keys == {"weight"}:
            return found("PRelu", "single 1-D weight under a PReLU name")
    if "prelu" in name.lower() and keys == {"alpha"} and len(params["alpha"]) == 1:
        return found("PRelu", "single 1-D alpha under a PReLU name")
    # 2-D weight: Embedding or Linear
    if w is not None and len(w) == 2:
        two_d = ("Linear", "Embedding")
        if not keys <= _TORCH_NORM:
            return refuse("2-D weight beside params a Linear or Embedding does not have", ())
        b = params.get("bias")
        if b is not None and len(b) != 1:
            return refuse("2-D weight with a bias that is not 1-D", ())
        if GPT2_CONV1D.match(name):
            if layout == "out_in":  # no Conv1D: OpenAI CLIP's Linear c_fc/c_proj, in PyTorch's layout
                return found("Linear", f"2-D weight {_dims(w)} under '{name}' (GPT-2's Conv1D naming, but "
                                       f"a Conv1D's bias matches dim 1); {_LAYOUT_TEXT[layout]}", with_layout=True)
            if layout == "in_out" and is_format(source_format, torch_layout=True):
                return found("Conv1D", f"2-D weight {_dims(w)} under '{name}' (GPT-2's Conv1D naming) with a bias "
                                       f"of dim 1: [in, out], which in a {source_format} file is a Conv1D (a "
                                       "Linear there is [out, in]); kept as stored", with_layout=True)
            if layout == "in_out":
                return refuse(f"'{name}' is GPT-2's Conv1D naming and its bias matches dim 1: [in, out], a "
                              "Conv1D (kept as stored) if this is a PyTorch file, a Conv1D or a Linear if it is "
                              "a Burn file", ("Conv1D", "Linear"))
            return refuse(f"'{name}' is GPT-2's Conv1D naming, whose weight is [in, out] (kept as stored), "
                          f"but a square weight {_dims(w)} cannot show its layout", ("Conv1D",))
        if EMBEDDING_LIKE.match(name):
            if b is None:
                return found("Embedding", f"2-D weight {_dims(w)} alone under embedding-like name '{name}'")
            return refuse(f"embedding-like name '{name}' but with a bias, which an Embedding does not have",
                          two_d)
        if b is not None and b[0] not in w:
            return refuse(f"bias {_dims(b)} matches neither dimension of weight {_dims(w)}", ())
        if LINEAR_LIKE.match(name):
            extra = f"; {_LAYOUT_TEXT[layout]}" if layout else ""
            return found("Linear", f"2-D weight {_dims(w)} under linear-like name '{name}'{extra}", with_layout=True)
        if layout is not None:
            return found("Linear", f"2-D weight {_dims(w)} with bias {_dims(b or ())}; {_LAYOUT_TEXT[layout]}",
                         with_layout=True)
        if b is None:
            return refuse(f"2-D weight {_dims(w)} without a bias under '{name or '<root>'}', a name that is "
                          "neither linear- nor embedding-like: Linear (transpose) or Embedding (keep)?", two_d)
        return refuse(f"square weight {_dims(w)}: its bias cannot tell [out, in] from [in, out], and "
                      f"'{name or '<root>'}' is not a linear-like name", two_d)
    return refuse("no inference rule applies")


@dataclass(frozen=True)
class _Misfit:
    """A resolved type that does not fit its module's tensors (shared per signature, like types)."""

    type_name: str
    param: str
    shape: tuple[int, ...]
    rule: str
    source: str  # the declaration (with its recipe LINE:COL) or the inference rule

    def error(self, path: str) -> AdapterError:
        tensor = f"{path}.{self.param}" if path else self.param
        return AdapterError(f"tensor '{tensor}' {_dims(self.shape)} does not fit module type {self.type_name}: "
                            f"{self.rule}; the type comes from {self.source}", tensor=tensor)


class ModuleResolver:
    """Resolves each tensor's module type: declared (recipe `modules:`) wins over inferred.

    `origins` maps (type name, index in its list) of `declared` to where the recipe says it
    (``recipe.yaml:LINE:COL``), so that errors name the recipe line.
    """

    def __init__(self, declared: Mapping[str, Sequence[str]], tensors: Sequence[tuple[str, tuple[int, ...]]],
                 origins: Mapping[tuple[str, int], str] | None = None, source_format: str | None = None) -> None:
        self.source_format = source_format  # what inference may assume of layouts (`infer`)
        self._declared: list[tuple[str, Regex, str]] = []  # (type, regex, how the recipe says it)
        for type_name, patterns in declared.items():
            if isinstance(patterns, str):
                patterns = [patterns]
            for i, p in enumerate(patterns):
                where = (origins or {}).get((type_name, i))
                rule = f"modules: {type_name}: '{p}'" + (f" ({where})" if where else "")
                try:
                    self._declared.append((type_name, compile_regex(p), rule))
                except NamingError as e:
                    raise AdapterError(f"{rule}: invalid regex: {e}") from None
        # path -> its params as a flat (name, shape, name, shape, ...) tuple, in source order: a 100k-tensor
        # model has ~50k module paths, and a dict per path cost ~10 MiB more than these tuples
        building: dict[str, list[Any]] = {}
        names: dict[str, str] = {}  # one string per distinct param name ("weight", "bias"), not one per tensor
        for name, shape in tensors:
            path, _, param = name.rpartition(".")
            own = building.get(path)
            if own is None:
                own = building[path] = []
            own += (names.setdefault(param, param), shape if type(shape) is tuple else tuple(shape))
        for path, own in building.items():  # each list is freed as its tuple replaces it
            building[path] = tuple(own)  # type: ignore[assignment]
        self._params: dict[str, tuple[Any, ...]] = building  # type: ignore[assignment]
        self._cache: dict[str, ModuleType] = {}
        # Many modules look alike (every layer's `attn.c_attn`: same params, same shapes), and a
        # type depends only on the declaration or the last path segment plus the params, so the
        # work (and the ModuleType object) is shared per (declaration or name, params) signature.
        self._by_signature: dict[tuple[object, ...], ModuleType | _Misfit] = {}

    @property
    def module_paths(self) -> Iterable[str]:
        """Every module path of the tensors (a module per distinct path)."""
        return self._params.keys()

    def params(self, path: str) -> dict[str, tuple[int, ...]]:
        """The module's own tensors (last segment -> shape)."""
        return _as_dict(self._params.get(path, ()))

    def resolve(self, tensor_name: str) -> ModuleType:
        """The module type of `tensor_name`'s module; `AdapterError` if two declarations conflict."""
        path = module_path(tensor_name)
        cached = self._cache.get(path)
        if cached is not None:  # siblings (weight, bias) share their module's type
            return cached
        try:
            return self.resolve_path(path)
        except AdapterError as e:
            raise AdapterError(e.detail, tensor=tensor_name) from None

    def resolve_path(self, path: str) -> ModuleType:
        """The module type of a module path ('' for root tensors)."""
        cached = self._cache.get(path)
        if cached is None:
            cached = self._cache[path] = self._resolve(path)
        return cached

    def _resolve(self, path: str) -> ModuleType:
        flat = self._params.get(path, ())
        matches = [(t, r) for t, rx, r in self._declared if rx.search(path)] if self._declared else None
        signature: tuple[object, ...]
        if matches:
            first_type, first_rule = matches[0]
            for t, rule in matches[1:]:
                if qualify(t) != qualify(first_type):
                    raise AdapterError(f"module path '{path}' is matched by two module types: {first_rule} and "
                                       f"{rule.removeprefix('modules: ')}; make the regexes exclusive")
            signature = (True, first_type, first_rule, flat)
            found = self._by_signature.get(signature)
            if found is None:
                params = _as_dict(flat)
                found = self._by_signature[signature] = _checked(ModuleType(
                    first_type, "declared", first_rule, _bias_layout(params), not _norm_possible(params)),
                    params, first_rule)
        else:
            signature = (False, path.rpartition(".")[2], flat)  # infer reads only the last segment
            found = self._by_signature.get(signature)
            if found is None:
                params = _as_dict(flat)
                module = infer(path, params, self.source_format)
                found = self._by_signature[signature] = _checked(module, params, f"inference: {module.reason}")
        if isinstance(found, _Misfit):
            raise found.error(path)
        return found


def _checked(module: ModuleType, params: Mapping[str, tuple[int, ...]], source: str) -> ModuleType | _Misfit:
    """`module`, or why it does not fit `params` (see `fit_problem`)."""
    if module.name is None:
        return module
    problem = fit_problem(module.name, params)
    if problem is None:
        return module
    param, rule = problem
    return _Misfit(module.name, param, params[param], rule, source)


def _as_dict(flat: tuple[Any, ...]) -> dict[str, tuple[int, ...]]:
    """A module's params (last segment -> shape) from the resolver's flat tuple."""
    return dict(zip(flat[::2], flat[1::2], strict=True))
