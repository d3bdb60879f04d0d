"""mergekit's YAML, as published, read into a neutral merge spec: per output tensor, its inputs and its op.

`load_config` parses and checks the YAML (a pydantic model of mergekit 0.1.5's `MergeConfiguration`,
unknown keys refused); every problem is a `RecipeError` whose issues carry the YAML LINE:COL.
Supported: `merge_method` linear, task_arithmetic, slerp, ties, dare_ties, dare_linear, passthrough;
`models` or `slices` (with `layer_range`); `base_model`; `parameters` at every level mergekit reads
them (global, per model, per slice, per slice source), as scalars, gradients (lists interpolated
over the layers of a slice) or filtered values (`{filter: self_attn, value: ...}`); `dtype`,
`out_dtype`; `tokenizer_source: base | union | MODEL` and the `tokenizer:` section (`tokens`,
`pad_to_multiple_of`: the output vocabulary and the rows it rebuilds are
`transform/merging/vocabulary.py`'s); `model: path+lora_path`. Refused by name: `modules`,
`chat_template`, `residual_weight`, other merge methods, `int8_mask: true`, parameters a method does
not take, both `tokenizer_source` and `tokenizer`, and hub ids (only local folders and URLs migrator
reads).

`merge_spec` resolves a config against the models' tensor names (headers only) the way mergekit's
planner does: layers found by their index segment (`model.layers.N.`), t = i / (n - 1) across
the layers of each output slice (1 for a one-layer slice, 0 outside the layers), parameters looked up
from the most specific level down, filters matched as substrings of the tensor name.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from ..core import dtypes
from ..core.dtypes import DType
from ..core.errors import MergeInputError, MigratorError
from ..ops.base import F32_MAX
from .issues import RecipeError, RecipeIssue
from .yaml_nodes import _parse_yaml

METHODS = ("linear", "task_arithmetic", "slerp", "ties", "dare_ties", "dare_linear", "passthrough")
# mergekit configs are a few kB (a 100-slice passthrough is ~5 kB); PyYAML composes ~50-100 kB/s
# on a loaded core, so this bounds parsing a hostile one to a few seconds
MAX_CONFIG_BYTES = 256 << 10

Scalar = bool | int | float | str


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Conditional(_Strict):
    """`{filter: NAME_PART, value: ...}`: the value for tensors whose name contains `filter` (None or '*': all)."""

    value: Scalar | list[Scalar]
    filter: str | None = None


Setting = Conditional | list[Conditional] | Scalar | list[Scalar]


class ZeroEmbedding(_Strict):
    kind: Literal["zero"]


class ModelTokenEmbedding(_Strict):
    """A row of one model's embedding, by its token (in that model's vocabulary) or its id."""

    kind: Literal["model_token"]
    model: str
    token_id: int | None = None
    token: str | None = None


class TokenEmbedding(_Strict):
    """`tokenizer.tokens.<TOKEN>`: where the token's row comes from (a model that has it, one model's row
    of another token, zeros); `force` uses it even in the models that have the token."""

    source: ZeroEmbedding | ModelTokenEmbedding | str | None = None
    force: bool = False


class TokenizerSection(_Strict):
    """mergekit's `tokenizer:` section (its `TokenizerConfig`)."""

    source: str = "union"
    tokens: dict[str, TokenEmbedding] | None = None
    pad_to_multiple_of: int | None = None


class InputModel(_Strict):
    model: str
    parameters: dict[str, Setting] | None = None


class InputSlice(_Strict):
    model: str
    layer_range: tuple[int, int]
    parameters: dict[str, Setting] | None = None


class OutputSlice(_Strict):
    sources: list[InputSlice]
    base_model: str | None = None
    residual_weight: float | None = None
    parameters: dict[str, Setting] | None = None


class MergekitConfig(_Strict):
    """mergekit 0.1.5's `MergeConfiguration` (the keys migrator refuses are still parsed, to name them)."""

    merge_method: str
    models: list[InputModel] | None = None
    slices: list[OutputSlice] | None = None
    modules: dict[str, Any] | None = None
    base_model: str | None = None
    dtype: str | None = None
    out_dtype: str | None = None
    tokenizer_source: str | None = None
    tokenizer: TokenizerSection | None = None
    chat_template: str | None = None
    parameters: dict[str, Setting] | None = None


# -- loading, with positions --------------------------------------------------------------------------------


@dataclass
class LoadedConfig:
    """A checked config, the YAML it came from (for positions in later errors) and its folder."""

    config: MergekitConfig
    file: str
    text: str
    base_dir: Path

    def where(self, *path: Any, key: bool = False) -> tuple[int, int]:
        """1-based (line, column) of the value at `path` (keys and list indices), (0, 0) if not written."""
        return _position(yaml.compose(self.text, Loader=yaml.SafeLoader), path, key)

    def issue(self, path: tuple[Any, ...], message: str, hint: str | None = None, *,
              key: bool = False) -> RecipeIssue:
        line, col = self.where(*path, key=key)
        return RecipeIssue(self.file, line, col, _loc(path), message, hint)


def _loc(path: Sequence[Any]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _position(root: yaml.Node | None, path: Sequence[Any], key: bool = False) -> tuple[int, int]:
    """Walk the composed YAML along `path`; the deepest node reached gives the position (with `key`, the
    last step's key rather than its value: where an unknown key is written)."""
    node = root
    for i, p in enumerate(path):
        child = None
        if isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(p)), None)
            if pair is not None:
                child = pair[0] if key and i == len(path) - 1 else pair[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(p, int) and 0 <= p < len(node.value):
            child = node.value[p]
        if child is None:
            break
        node = child
    if node is None:
        return (0, 0)
    return node.start_mark.line + 1, node.start_mark.column + 1


def load_config(path: str | os.PathLike[str], base_dir: str | os.PathLike[str] | None = None) -> LoadedConfig:
    """Read and check a mergekit YAML; relative model paths resolve against `base_dir` (default: its folder)."""
    p = Path(path)
    from ..core.bytesource import read_regular

    try:
        raw = read_regular(p, MAX_CONFIG_BYTES)  # parse_config refuses a longer one: never read it all
    except OSError as e:  # the command's argument names no readable file: a usage error, as for a recipe
        raise RecipeError([RecipeIssue(str(p), 0, 0, "", f"cannot read the merge config: {e.strerror or e}")]) \
            from None
    return parse_config(raw, str(p), Path(base_dir) if base_dir is not None else p.parent)


def parse_config(raw: bytes, file: str, base_dir: Path) -> LoadedConfig:
    def fail(line: int, col: int, message: str, hint: str | None = None) -> RecipeError:
        return RecipeError([RecipeIssue(file, line, col, "", message, hint)])

    if len(raw) > MAX_CONFIG_BYTES:
        raise fail(0, 0, f"larger than {MAX_CONFIG_BYTES >> 10} KiB: not a mergekit config")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise fail(0, 0, f"not UTF-8 text (byte {e.start})") from None
    # the recipe's bounded loader: aliases expanded within a node budget, nesting, integers (text and
    # bits) and every constructor failure turned into an issue at its node; yaml.safe_load raised
    # ValueError on a 5000-digit integer and RecursionError on deep nesting
    try:
        _, data, _, issues = _parse_yaml(text, file)
    except RecipeError as e:
        first = e.issues[0].message if e.issues else ""
        if first.startswith(("the recipe is empty", "the top level must be a mapping")):
            raise fail(1, 1, "a mergekit config is a YAML mapping with merge_method and models or slices") from None
        raise
    if issues:  # duplicate keys: PyYAML would keep the last one silently
        raise RecipeError(issues)
    loaded = LoadedConfig(MergekitConfig.model_construct(), file, text, base_dir)
    try:
        loaded.config = MergekitConfig.model_validate(data)
    except ValidationError as e:
        raise RecipeError(_validation_issues(loaded, e)) from None
    issues = _refusals(loaded)
    if issues:
        raise RecipeError(issues)
    return loaded


def _validation_issues(loaded: LoadedConfig, e: ValidationError) -> list[RecipeIssue]:
    out: dict[tuple[Any, ...], RecipeIssue] = {}
    for err in e.errors():
        path = tuple(p for p in err["loc"] if not (isinstance(p, str) and (p[:1].isupper() or "[" in p)))
        path = tuple(p for p in path if p not in ("list[...]", "bool", "int", "float", "str"))
        if "parameters" in path[:-1]:  # one message per parameter, not one per member of the Setting union
            path = path[:path.index("parameters") + 2]
            out.setdefault(path, loaded.issue(path, "a parameter is a scalar, a list of numbers (a gradient over "
                                              "the layers) or a list of {filter: NAME_PART, value: ...}"))
            continue
        unknown = err["type"] == "extra_forbidden"
        message = f"'{path[-1]}' is not a mergekit config key migrator knows" if unknown else err["msg"]
        out.setdefault(path, loaded.issue(path, message, key=unknown))
    return list(out.values())


# -- what migrator refuses ----------------------------------------------------------------------------------

SHARED = {
    "linear": {"normalize"},
    "task_arithmetic": {"int8_mask", "normalize", "rescale", "lambda"},
    "slerp": {"t"},
    "passthrough": set(),
}
PER_INPUT = {"linear": {"weight"}, "task_arithmetic": {"weight", "density"}, "slerp": set(), "passthrough": {"scale"}}
for _m in ("ties", "dare_ties", "dare_linear"):
    SHARED[_m], PER_INPUT[_m] = SHARED["task_arithmetic"], PER_INPUT["task_arithmetic"]


def _refusals(loaded: LoadedConfig) -> list[RecipeIssue]:
    c = loaded.config
    issues: list[RecipeIssue] = []
    if c.merge_method not in METHODS:
        issues.append(loaded.issue(("merge_method",), f"merge_method '{c.merge_method}' is not supported",
                                   f"migrator merges with {', '.join(METHODS)}"))
        return issues
    for key, why in (("modules", "per-module merges"), ("chat_template", "chat templates")):
        if getattr(c, key) is not None:
            issues.append(loaded.issue((key,), f"'{key}' ({why}) is not supported"))
    issues += _tokenizer_issues(loaded)
    if (c.models is None) == (c.slices is None):
        issues.append(loaded.issue((), "exactly one of 'models' or 'slices' must be given"))
    for key in ("models", "slices"):
        if getattr(c, key) == []:  # nothing to merge (and no reference model for the output's layout)
            issues.append(loaded.issue((key,), f"'{key}' is empty: a merge needs at least one model"))
    for i, s in enumerate(c.slices or []):
        if not s.sources:
            issues.append(loaded.issue(("slices", i, "sources"), "a slice needs at least one source"))
    for key in ("dtype", "out_dtype"):
        value = getattr(c, key)
        if value is not None:
            try:
                dtype = dtypes.parse(value)
            except MigratorError:
                dtype = None
            if dtype is None or dtype.name not in ("F64", "F32", "F16", "BF16"):
                issues.append(loaded.issue((key,), f"{key} '{value}' is not a float dtype migrator computes to",
                                           "float32, float16, bfloat16 or float64"))
    method = c.merge_method
    for path, params in _parameter_blocks(c):
        for name, value in params.items():
            allowed = SHARED[method] | PER_INPUT[method]
            if name not in allowed:
                issues.append(loaded.issue((*path, name), f"parameter '{name}' is not one {method} takes",
                                           f"{method} takes {', '.join(sorted(allowed)) or 'no parameters'}",
                                           key=True))
            elif name == "int8_mask" and _mentions_true(value):
                issues.append(loaded.issue((*path, name), "int8_mask is not supported (migrator keeps masks exact; "
                                           "the result is the same)", "remove it"))
    for i, s in enumerate(c.slices or []):
        if s.residual_weight is not None:
            issues.append(loaded.issue(("slices", i, "residual_weight"), "residual_weight is not supported"))
        for j, src in enumerate(s.sources):
            lo, hi = src.layer_range
            if not 0 <= lo < hi:
                issues.append(loaded.issue(("slices", i, "sources", j, "layer_range"),
                                           f"layer_range [{lo}, {hi}] is empty or negative"))
    for path, model in _model_references(c):
        for part in model.split("+"):
            problem = _reference_problem(part, loaded.base_dir)
            if problem:
                issues.append(loaded.issue(path, problem[0], problem[1]))
    return issues


def _tokenizer_issues(loaded: LoadedConfig) -> list[RecipeIssue]:
    """`tokenizer_source` and the `tokenizer:` section: a local folder where they name a model, token
    sources among the merged models, as mergekit 0.1.5 would run them."""
    from ..storage.remote import is_url

    c = loaded.config
    issues: list[RecipeIssue] = []
    if c.tokenizer_source is not None and c.tokenizer is not None:
        return [loaded.issue(("tokenizer",), "give tokenizer_source or a tokenizer section, not both "
                             "(mergekit refuses both)")]
    where, source = (("tokenizer", "source"), c.tokenizer.source) if c.tokenizer else (("tokenizer_source",),
                                                                                      c.tokenizer_source)
    if source not in (None, "base", "union"):
        problem = _reference_problem(source, loaded.base_dir)
        if problem is None and is_url(source):
            problem = ("a tokenizer source is read from a local folder, not a URL", "download the tokenizer files")
        if problem is not None:
            issues.append(loaded.issue(where, problem[0], problem[1]))
    if c.tokenizer is None:
        return issues
    if c.tokenizer.pad_to_multiple_of is not None and c.tokenizer.pad_to_multiple_of < 1:
        issues.append(loaded.issue(("tokenizer", "pad_to_multiple_of"), "pad_to_multiple_of must be at least 1"))
    merged = {ref for _, ref in _model_references(c)}
    for token, entry in (c.tokenizer.tokens or {}).items():
        src = entry.source
        model = src.model if isinstance(src, ModelTokenEmbedding) else src if isinstance(src, str) else None
        path = ("tokenizer", "tokens", token, "source")
        if model is not None and model not in merged:
            issues.append(loaded.issue(path, f"token {token!r}: '{model}' is not one of the merged models",
                                       f"the models: {', '.join(sorted(merged))}"))
        if isinstance(src, ModelTokenEmbedding) and (src.token is None) == (src.token_id is None):
            issues.append(loaded.issue(path, f"token {token!r}: give exactly one of token or token_id"))
        if src is None and entry.force:
            issues.append(loaded.issue(path, f"token {token!r}: force needs a source"))
    return issues


def _mentions_true(value: Any) -> bool:
    if isinstance(value, Conditional):
        return _mentions_true(value.value)
    if isinstance(value, list):
        return any(_mentions_true(v) for v in value)
    return value is True


def _parameter_blocks(c: MergekitConfig) -> list[tuple[tuple[Any, ...], dict[str, Setting]]]:
    out: list[tuple[tuple[Any, ...], dict[str, Setting]]] = []
    if c.parameters:
        out.append((("parameters",), c.parameters))
    for i, m in enumerate(c.models or []):
        if m.parameters:
            out.append((("models", i, "parameters"), m.parameters))
    for i, s in enumerate(c.slices or []):
        if s.parameters:
            out.append((("slices", i, "parameters"), s.parameters))
        for j, src in enumerate(s.sources):
            if src.parameters:
                out.append((("slices", i, "sources", j, "parameters"), src.parameters))
    return out


def _model_references(c: MergekitConfig) -> list[tuple[tuple[Any, ...], str]]:
    out: list[tuple[tuple[Any, ...], str]] = []
    if c.base_model:
        out.append((("base_model",), c.base_model))
    for i, m in enumerate(c.models or []):
        out.append((("models", i, "model"), m.model))
    for i, s in enumerate(c.slices or []):
        if s.base_model:
            out.append((("slices", i, "base_model"), s.base_model))
        for j, src in enumerate(s.sources):
            out.append((("slices", i, "sources", j, "model"), src.model))
    return out


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")


def _reference_problem(ref: str, base_dir: Path) -> tuple[str, str] | None:
    """Why a model reference cannot be read, or None: local folders and URLs are read, hub ids are not."""
    from ..storage.remote import is_url

    if is_url(ref):
        return None
    path = Path(ref) if Path(ref).is_absolute() else base_dir / ref
    if path.exists():
        return None
    if HUB_ID.match(ref):
        return (f"'{ref}' is a Hugging Face hub id: migrator reads local folders and URLs, not the hub",
                f"download it first (huggingface-cli download {ref.split('@')[0]} --local-dir DIR) and give DIR")
    return f"model folder '{ref}' does not exist (looked in {path})", "model paths are relative to the config's folder"


def resolve_path(ref: str, base_dir: Path) -> str:
    from ..storage.remote import is_url

    if is_url(ref) or Path(ref).is_absolute():
        return ref
    return str(base_dir / ref)


# -- parameters ---------------------------------------------------------------------------------------------


def evaluate(setting: Setting | None, tensor: str, t: float) -> Any:
    """mergekit's `evaluate_setting`: a scalar as is; a list of numbers interpolated at t (a list of other
    values indexed); conditionals: the first whose filter is absent, '*', or a substring of `tensor`."""
    if setting is None:
        return None
    if isinstance(setting, Conditional):
        setting = [setting]
    if isinstance(setting, bool | int | float | str):
        return setting
    if not setting:
        return None
    if all(isinstance(e, bool | int | float | str) for e in setting):
        values: list[Any] = list(setting)
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            return values[int(t * (len(values) - 1))]
        scaled = t * (len(values) - 1)
        i0 = int(scaled)
        i1 = min(len(values) - 1, i0 + 1)
        frac = scaled - i0
        return (1 - frac) * values[i0] + frac * values[i1]
    for cond in setting:
        assert isinstance(cond, Conditional)
        if cond.filter is None or cond.filter == "*" or (tensor and cond.filter in tensor):
            return evaluate(cond.value, tensor, t)
    return None


def _lookup(name: str, levels: Sequence[Mapping[str, Setting] | None], tensor: str, t: float) -> Any:
    for level in levels:
        if level is not None and name in level:
            value = evaluate(level[name], tensor, t)
            if value is not None:
                return value
    return None


# -- the merge spec -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorMerge:
    """One output tensor: the op, its inputs as (model id, tensor name) (base first where the op has one),
    and its parameters resolved for this tensor."""

    name: str
    op: Literal["linear", "task_arithmetic", "slerp", "passthrough"]
    inputs: tuple[tuple[str, str], ...]
    params: dict[str, Any]


@dataclass
class MergeSpec:
    """A merge, resolved: the models (id -> folder or URL; `loras`: id -> adapter folded into it first),
    the output tensors in order, the output dtype and what changes in the base's config.json."""

    method: str
    models: dict[str, str]
    tensors: list[TensorMerge]
    loras: dict[str, str] = field(default_factory=dict)
    dtype: DType | None = None
    out_dtype: DType | None = None
    config_update: dict[str, Any] | None = None
    companions_from: str | None = None
    seed: int | None = None
    tokenizer: TokenizerSpec | None = None
    """The output's vocabulary, when the config names a tokenizer source (else the reference's files)."""


@dataclass(frozen=True)
class TokenizerSpec:
    """A merge's tokenizer settings, resolved: `source` is "base", "union" or a folder; `tokens` the
    `tokenizer.tokens` entries (their models by config reference); `base_model` the config's (the row a
    token present in several models takes)."""

    source: str
    tokens: dict[str, TokenEmbedding]
    pad_to_multiple_of: int | None
    base_model: str | None
    base: str
    """The model whose tokenizer is the base of the vocabulary (base_model, else the first model)."""


_LAYER = re.compile(r"^(?P<prefix>.+?)\.(?P<index>\d+)\.(?P<rest>.+)$")
_PRE = re.compile(r"embed|wte|wpe|word_embeddings|tok_embeddings")


@dataclass
class _Layout:
    """A model's tensor names split into the layer stack (`prefix.N.rest`) and the rest."""

    prefix: str | None
    layers: dict[int, list[str]]  # index -> the `rest` parts, in the model's order
    other: list[str]

    @property
    def count(self) -> int:
        return max(self.layers) + 1 if self.layers else 0


def layout(names: Sequence[str]) -> _Layout:
    """The layer stack is the `prefix.N.` with the most distinct N (model.layers, transformer.h, ...)."""
    found: dict[str, set[int]] = {}
    for n in names:
        m = _LAYER.match(n)
        if m:
            found.setdefault(m["prefix"], set()).add(int(m["index"]))
    prefix = max(found, key=lambda p: (len(found[p]), -len(p))) if found else None
    layers: dict[int, list[str]] = {}
    other: list[str] = []
    for n in names:
        m = _LAYER.match(n)
        if prefix is not None and m and m["prefix"] == prefix:
            layers.setdefault(int(m["index"]), []).append(m["rest"])
        else:
            other.append(n)
    return _Layout(prefix, layers, other)


def merge_spec(loaded: LoadedConfig, names: Mapping[str, Sequence[str]], *, seed: int | None = None,
               config_layers_key: str = "num_hidden_layers") -> MergeSpec:
    """Resolve a loaded config against each model's tensor names (keyed by the config's model strings).

    `seed` drives DARE's random drop (`arithmetic.dare_generator`); a DARE method without one is refused."""
    c = loaded.config
    method = c.merge_method
    if method in ("dare_ties", "dare_linear") and seed is None:
        raise RecipeError([loaded.issue(("merge_method",), f"{method} drops at random: give a seed",
                                        "migrate merge --seed N (the same seed gives the same output)")])
    base = c.base_model
    if c.models is not None:
        refs = [m.model for m in c.models]
        counts = {ref: layout(names[ref]).count for ref in refs + ([base] if base else [])}
        if len(set(counts.values())) > 1:
            raise MergeInputError(f"the models have different numbers of layers: "
                                  f"{', '.join(f'{r}: {n}' for r, n in counts.items())}", file=loaded.file)
        n = next(iter(counts.values()))
        sources = [InputSlice(model=m.model, layer_range=(0, n), parameters=m.parameters) for m in c.models]
        if base and base not in refs and method != "passthrough":
            sources.append(InputSlice(model=base, layer_range=(0, n)))
        slices = [OutputSlice(sources=sources)]
        from_slices = False
    else:
        slices = list(c.slices or [])
        from_slices = True
    _check_contract(loaded, method, slices, base)
    reference = base or slices[0].sources[0].model
    ref_layout = layout(names[reference])
    tensors: list[TensorMerge] = []
    pre = [n for n in ref_layout.other if _PRE.search(n)]
    post = [n for n in ref_layout.other if not _PRE.search(n)]
    for name in pre:
        tensors.append(_tensor(loaded, name, [(s.model, name) for s in slices[0].sources], slices[0], 0.0, base,
                               names))
    out_index = 0
    for slice_index, s in enumerate(slices):
        length = s.sources[0].layer_range[1] - s.sources[0].layer_range[0]
        if any(src.layer_range[1] - src.layer_range[0] != length for src in s.sources):
            raise RecipeError([loaded.issue(("slices",), "all sources of a slice must span the same number of layers")])
        for idx in range(length):
            t = idx / (length - 1) if length > 1 else 1.0
            first = s.sources[0]
            src_layout = layout(names[first.model])
            rests = src_layout.layers.get(first.layer_range[0] + idx)
            if rests is None:
                where = f"slices[{slice_index}].sources[0].layer_range: " if from_slices else ""
                raise MergeInputError(f"{where}model '{first.model}' has no layer {first.layer_range[0] + idx} "
                                      f"(it has {src_layout.count})", file=loaded.file)
            for rest in rests:
                out_name = f"{ref_layout.prefix or src_layout.prefix}.{out_index}.{rest}"
                inputs = [(src.model, f"{layout_prefix(names, src.model)}.{src.layer_range[0] + idx}.{rest}")
                          for src in s.sources]
                tensors.append(_tensor(loaded, out_name, inputs, s, t, base, names))
            out_index += 1
    for name in post:
        tensors.append(_tensor(loaded, name, [(s.model, name) for s in slices[-1].sources], slices[-1], 0.0, base,
                               names))
    models, loras = model_paths(loaded)
    update: dict[str, Any] = {}
    if from_slices:
        update[config_layers_key] = out_index
    dtype = dtypes.parse(c.dtype) if c.dtype else None
    out_dtype = dtypes.parse(c.out_dtype) if c.out_dtype else None
    if out_dtype or dtype:
        update["dtype"] = (out_dtype or dtype).torch_name  # type: ignore[union-attr]
    if seed is not None:
        for item in tensors:
            if item.params.get("sparsify") == "random":
                item.params["seed"] = seed
    source = c.tokenizer.source if c.tokenizer is not None else c.tokenizer_source
    tokenizer = None
    if source is not None:
        tokenizer = TokenizerSpec(
            source if source in ("base", "union") else resolve_path(source.partition("+")[0], loaded.base_dir),
            dict(c.tokenizer.tokens or {}) if c.tokenizer else {},
            c.tokenizer.pad_to_multiple_of if c.tokenizer else None, base, reference)
    return MergeSpec(method, models, tensors, loras, dtype, out_dtype, update, reference, seed, tokenizer)


def model_paths(loaded: LoadedConfig) -> tuple[dict[str, str], dict[str, str]]:
    """Each model reference's folder (or URL), and for a `path+lora` one its adapter folder."""
    models: dict[str, str] = {}
    loras: dict[str, str] = {}
    for _, ref in _model_references(loaded.config):
        path, _, lora = ref.partition("+")
        models[ref] = resolve_path(path, loaded.base_dir)
        if lora:
            loras[ref] = resolve_path(lora, loaded.base_dir)
    return models, loras


def layout_prefix(names: Mapping[str, Sequence[str]], model: str) -> str | None:
    return layout(names[model]).prefix


def _check_contract(loaded: LoadedConfig, method: str, slices: Sequence[OutputSlice], base: str | None) -> None:
    for i, s in enumerate(slices):
        slice_base = s.base_model or base
        refs = [src.model for src in s.sources]
        if len(set(refs)) != len(refs):
            raise RecipeError([loaded.issue(("slices", i) if loaded.config.slices else ("models",),
                                            f"a model is given twice: {', '.join(refs)}",
                                            "each input of a merge must be a different model")])
        if method == "passthrough" and len(refs) != 1:
            raise RecipeError([loaded.issue(("slices", i) if loaded.config.slices else ("models",),
                                            f"passthrough takes exactly one model per slice, got {len(refs)}")])
        if method in ("task_arithmetic", "ties", "dare_ties", "dare_linear", "slerp") and not slice_base:
            raise RecipeError([loaded.issue(("merge_method",), f"{method} needs a base_model")])
        if method == "slerp" and (len(refs) != 2 or slice_base not in refs):
            raise RecipeError([loaded.issue(("merge_method",), "slerp merges exactly two models, one of them the "
                                            f"base_model; got {', '.join(refs)}")])


def _levels(loaded: LoadedConfig, s: OutputSlice, model: str | None) -> list[Mapping[str, Setting] | None]:
    levels: list[Mapping[str, Setting] | None] = []
    if model is not None:
        levels.extend(src.parameters for src in s.sources if src.model == model)
    levels.append(s.parameters)
    levels.append(loaded.config.parameters)
    return levels


def _tensor(loaded: LoadedConfig, out_name: str, inputs: list[tuple[str, str]], s: OutputSlice, t: float,
            base: str | None, names: Mapping[str, Sequence[str]]) -> TensorMerge:
    method = loaded.config.merge_method
    base = s.base_model or base
    for model, name in inputs:
        if name not in set(names[model]):
            raise MergeInputError(f"model '{model}' has no tensor '{name}' (needed for '{out_name}')", tensor=name)

    def shared(key: str, default: Any) -> Any:
        value = _lookup(key, _levels(loaded, s, None), out_name, t)
        return default if value is None else value

    def per_input(key: str, model: str, name: str, default: Any = None) -> Any:
        value = _lookup(key, _levels(loaded, s, model), name, t)
        if value is None and default is None:
            raise RecipeError([loaded.issue(("parameters",), f"missing required parameter '{key}' for "
                                            f"{model} tensor '{name}'")])
        return default if value is None else value

    def number(key: str, value: Any, where: str) -> float:
        """A parameter as a float: finite and within float32 (merges compute in F32), else every merged
        value would be inf or NaN and the run would write them with success."""
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise RecipeError([loaded.issue(("parameters",), f"parameter '{key}' for {where} must be a number, "
                                            f"got {value!r}")]) from None
        if not math.isfinite(x) or abs(x) > F32_MAX:
            raise RecipeError([loaded.issue(("parameters",), f"parameter '{key}' for {where} is {x!r}: it must be "
                                            f"finite and at most {F32_MAX:.4g} in magnitude (merges compute in "
                                            "float32: it would make every merged value inf or NaN)")])
        if key == "density" and not 0 <= x <= 1:
            raise RecipeError([loaded.issue(("parameters",), f"parameter 'density' for {where} is {x!r}: a "
                                            "density is the fraction of a delta kept, from 0 to 1")])
        return x

    if method == "passthrough":
        model, name = inputs[0]
        scale = _lookup("scale", _levels(loaded, s, model), name, t)
        return TensorMerge(out_name, "passthrough", tuple(inputs),
                           {"scale": None if scale is None else number("scale", scale, f"'{name}'")})
    if method == "linear":
        weights = [number("weight", per_input("weight", m, n), f"{m} tensor '{n}'") for m, n in inputs]
        normalize = bool(shared("normalize", True))
        total = math.fsum(weights)
        if normalize and (total == 0 or abs(total) > F32_MAX):
            raise RecipeError([loaded.issue(("parameters",), f"the weights of '{out_name}' sum to {total:g}: "
                                            "linear divides by their sum (normalize: true), which would make every "
                                            "merged value inf or NaN; give weights with a non-zero sum, or set "
                                            "normalize: false")])
        return TensorMerge(out_name, "linear", tuple(inputs), {"weights": weights, "normalize": normalize})
    assert base is not None
    base_input = next(i for i in inputs if i[0] == base)
    others = [i for i in inputs if i[0] != base]
    if method == "slerp":
        t_value = shared("t", None)
        if t_value is None:
            raise RecipeError([loaded.issue(("parameters",), f"slerp needs the parameter 't' (for '{out_name}')")])
        return TensorMerge(out_name, "slerp", (base_input, *others), {"t": number("t", t_value, f"'{out_name}'")})
    sparsify = {"ties": "magnitude", "dare_ties": "random", "dare_linear": "random"}.get(method)
    consensus = "sum" if method in ("ties", "dare_ties") else None
    params = {
        "weights": [number("weight", per_input("weight", m, n), f"{m} tensor '{n}'") for m, n in others],
        "densities": [number("density", per_input("density", m, n, 1.0), f"{m} tensor '{n}'") for m, n in others],
        "sparsify": sparsify,
        "consensus": consensus,
        "normalize": bool(shared("normalize", method == "ties")),
        "rescale": bool(shared("rescale", method in ("dare_ties", "dare_linear"))),
        "lambda": number("lambda", shared("lambda", 1.0), f"'{out_name}'"),
    }
    return TensorMerge(out_name, "task_arithmetic", (base_input, *others), params)

