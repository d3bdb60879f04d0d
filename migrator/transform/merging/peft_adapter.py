"""Read a PEFT LoRA adapter folder and plan its fold into a base model, name by name, from headers only.

A folder holds `adapter_config.json` and `adapter_model.safetensors` (or `adapter_model.bin`, read by
migrator's restricted unpickler: no code runs). The config is checked first: only `peft_type: LORA`
with `bias: none` and none of the features that change the arithmetic beyond LoRA and DoRA
(`REFUSED_FEATURES`) is accepted, each refusal naming the key.

Names map as PEFT maps them when it saves an adapter: the `base_model.model.` prefix; the module
path before `lora_A`/`lora_B` (`.weight`), `lora_embedding_A`/`lora_embedding_B` and
`lora_magnitude_vector`, with an optional adapter-name segment (`lora_A.default.weight`); a module's
own weights saved beside them (`X.base_layer.weight`, kept by `save_embedding_layers`) replace the
base's `X.weight` before the fold; `modules_to_save` copies (`X.weight` or
`X.modules_to_save.<adapter>.weight`) replace the base's tensor. Rank and alpha per module come from
`rank_pattern`/`alpha_pattern` the way PEFT picks them: the first pattern key K (in the file's order)
for which the module path matches the regex `(.*\\.)?(K)$`.

`fold_plan` returns, per base tensor, whether it is unchanged, folded (with A, B, scaling and layout)
or replaced; an adapter tensor that matches no base weight is an error listing every such name.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.errors import AdapterError
from ...core.tensor import LazyTensor
from ...formats.bounded_json import read_json_object
from ...naming import NamingError, Regex, compile_regex
from ...ops.compute.lora import Fold, Form, check_fold, expected_shape

PREFIX = "base_model.model."
CONFIG_FILE = "adapter_config.json"
MAX_CONFIG_BYTES = 16 << 20  # PEFT's configs are a few kB; a rank_pattern per module of a large model, < 1 MB
F32_MAX = 3.4028234663852886e38  # the fold computes in float32: a scaling beyond it is inf in every weight
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")

REFUSED_FEATURES = ("layer_replication", "lora_bias", "use_qalora", "target_parameters", "trainable_token_indices",
                    "alora_invocation_tokens", "arrow_config", "use_bdlora", "megatron_config", "kasa_config",
                    "monteclora_config", "velora_config")
"""Config keys that, when set (truthy), make the adapter something other than a plain LoRA/DoRA fold."""

_LORA_PART = re.compile(r"^(?P<module>.+?)\.(?P<part>lora_A|lora_B|lora_embedding_A|lora_embedding_B|"
                        r"lora_magnitude_vector)(?:\.(?P<rest>.+))?$")
_SAVED_COPY = re.compile(r"^(?P<module>.+?)\.modules_to_save\.[^.]+\.(?P<param>[^.]+)$")


@dataclass(frozen=True)
class AdapterConfig:
    """The parts of `adapter_config.json` a fold uses (the whole file is kept in `raw`)."""

    r: int
    lora_alpha: float
    use_rslora: bool = False
    use_dora: bool = False
    fan_in_fan_out: bool = False
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)
    modules_to_save: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    def rank_and_alpha(self, module: str) -> tuple[int, float]:
        """PEFT's per-module r and alpha: the first matching pattern key, else the config's defaults."""
        return (self.rank_pattern.get(pattern_key(self.rank_pattern, module), self.r),
                self.alpha_pattern.get(pattern_key(self.alpha_pattern, module), self.lora_alpha))

    def scaling(self, module: str, lora_scale: float | None = None) -> float:
        """lora_alpha / r (/ sqrt(r) with rsLoRA), times `lora_scale` as PEFT's `set_scale` computes it."""
        r, alpha = self.rank_and_alpha(module)
        denominator = math.sqrt(r) if self.use_rslora else r
        return alpha / denominator if lora_scale is None else lora_scale * alpha / denominator


@functools.lru_cache(maxsize=1024)
def _key_regex(key: str) -> Regex:
    """PEFT's test of a rank_pattern / alpha_pattern key, `re.match(rf"(.*\\.)?({K})$", module)`, on RE2:
    the key comes from a file, and a backtracking engine would let it choose how long a match takes."""
    return compile_regex(rf"^(.*\.)?({key})$")


def pattern_key(patterns: Mapping[str, Any], module: str) -> str:
    """The first key K of `patterns` matching `module` as PEFT matches it, else `module` itself."""
    for key in patterns:
        if _key_regex(key).search(module):
            return key
    return module


def parse_config(raw: Any, where: str) -> AdapterConfig:
    """Check an adapter config: refuse what is not a plain LoRA/DoRA by name."""
    if not isinstance(raw, dict):
        raise AdapterError("adapter config must be a JSON object", file=where)
    peft_type = raw.get("peft_type")
    if peft_type != "LORA":
        raise AdapterError(f"peft_type {peft_type!r} is not supported (only LORA adapters are folded)", file=where)
    bias = raw.get("bias", "none")
    if bias != "none":
        raise AdapterError(f"bias {bias!r} is not supported (trained biases are not folded; only bias: none)",
                           file=where)
    for key in REFUSED_FEATURES:
        if raw.get(key):
            raise AdapterError(f"{key}={raw[key]!r} is not supported by the fold", file=where)
    r, alpha = raw.get("r"), raw.get("lora_alpha")
    if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
        raise AdapterError(f"r must be a positive integer, got {r!r}", file=where)
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not math.isfinite(alpha) \
            or abs(alpha) > F32_MAX:
        raise AdapterError(f"lora_alpha must be a finite number within float32, got {alpha!r}", file=where)
    patterns: dict[str, dict[str, Any]] = {}
    for key in ("rank_pattern", "alpha_pattern"):
        value = raw.get(key) or {}
        if not isinstance(value, dict) or not all(isinstance(v, int | float) and not isinstance(v, bool)
                                                  and math.isfinite(v) and abs(v) <= F32_MAX for v in value.values()):
            raise AdapterError(f"{key} must map module patterns to finite numbers within float32", file=where)
        if key == "rank_pattern" and not all(isinstance(v, int) and v > 0 for v in value.values()):
            raise AdapterError("rank_pattern must map module patterns to positive integer ranks", file=where)
        for pattern in value:
            try:
                _key_regex(pattern)
            except NamingError as e:
                raise AdapterError(f"{key} key {pattern!r} is not a regular expression migrator runs ({e.message})",
                                   file=where) from None
        patterns[key] = dict(value)
    saved = raw.get("modules_to_save") or []
    if not isinstance(saved, list) or not all(isinstance(m, str) for m in saved):
        raise AdapterError(f"modules_to_save must be a list of module names, got {str(saved)[:80]!a}", file=where)
    return AdapterConfig(r=r, lora_alpha=alpha, use_rslora=bool(raw.get("use_rslora")),
                         use_dora=bool(raw.get("use_dora")), fan_in_fan_out=bool(raw.get("fan_in_fan_out")),
                         rank_pattern=patterns["rank_pattern"], alpha_pattern=patterns["alpha_pattern"],
                         modules_to_save=tuple(saved), raw=raw)


@dataclass
class PeftAdapter:
    """An opened adapter folder: its checked config and its tensors (a reader: close it when done)."""

    folder: str
    config: AdapterConfig
    tensors: Mapping[str, LazyTensor]
    weights_file: str

    def close(self) -> None:
        close = getattr(self.tensors, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> PeftAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_adapter(folder: str | os.PathLike[str]) -> PeftAdapter:
    """Read `adapter_config.json` and open the adapter's weights (no tensor data is read)."""
    from ...files.io import open_file

    root = Path(folder)
    config_path = root / CONFIG_FILE
    if not root.exists():
        raise AdapterError("no such adapter folder", file=str(root))
    if not config_path.is_file():
        raise AdapterError(f"not a PEFT adapter folder: no {CONFIG_FILE}", file=str(root))
    # untrusted: size and nesting bounded (json.loads recurses once per bracket, and a RecursionError
    # escapes every handler of a typed error)
    raw = read_json_object(config_path, MAX_CONFIG_BYTES, "adapter config")
    config = parse_config(raw, str(config_path))
    for name in WEIGHT_FILES:
        path = root / name
        if path.is_file():
            return PeftAdapter(str(root), config, open_file(path), str(path))
    raise AdapterError(f"no adapter weights: expected one of {', '.join(WEIGHT_FILES)}", file=str(root))


@dataclass(frozen=True)
class Unchanged:
    """The base tensor, as it is."""


@dataclass(frozen=True)
class Folded:
    """The base tensor (or the adapter's saved copy of it, `weight`) with a LoRA delta folded in."""

    fold: Fold
    module: str
    rank: int
    alpha: float
    weight: LazyTensor | None = None


@dataclass(frozen=True)
class Replaced:
    """A `modules_to_save` tensor from the adapter, in place of the base's."""

    tensor: LazyTensor


Entry = Unchanged | Folded | Replaced


@dataclass
class FoldPlan:
    """Per base tensor name (in the base's order), what the output holds; `notes` say what was inferred."""

    entries: dict[str, Entry]
    notes: list[str] = field(default_factory=list)

    def folded(self) -> list[str]:
        return [n for n, e in self.entries.items() if isinstance(e, Folded)]

    def replaced(self) -> list[str]:
        return [n for n, e in self.entries.items() if isinstance(e, Replaced)]


@dataclass
class _Module:
    parts: dict[str, LazyTensor] = field(default_factory=dict)
    base_copy: LazyTensor | None = None


def _strip(name: str) -> str:
    return name[len(PREFIX):] if name.startswith(PREFIX) else name


def _base_name(base: Mapping[str, LazyTensor], name: str) -> str | None:
    """The base tensor an adapter path names: itself, else without its first segment (a base saved without
    its model wrapper's prefix, e.g. GPT-2's `transformer.`)."""
    if name in base:
        return name
    _, _, rest = name.partition(".")
    return rest if rest and rest in base else None


def fold_plan(base: Mapping[str, LazyTensor], adapter: PeftAdapter, *, lora_scale: float | None = None) -> FoldPlan:
    """What each base tensor becomes with `adapter` folded in. Everything is checked from headers: every
    adapter tensor must land on a base weight, shapes must fit, ranks must agree with the config."""
    config, where = adapter.config, adapter.weights_file
    modules: dict[str, _Module] = {}
    replaced: dict[str, LazyTensor] = {}
    unmatched: list[str] = []
    for key, tensor in adapter.tensors.items():
        name = _strip(key)
        m = _LORA_PART.match(name)
        if m is not None:
            rest = (m["rest"] or "").split(".") if m["rest"] else []
            if rest and rest[-1] == "weight":
                rest = rest[:-1]
            if len(rest) > 1 or (rest and rest[0] == "bias"):
                raise AdapterError(f"unsupported LoRA tensor '{key}' (only A, B and DoRA magnitude weights fold)",
                                   file=where, tensor=key)
            given = modules.setdefault(m["module"], _Module()).parts
            if m["part"] in given:  # `X.lora_A.weight` and `X.lora_A.other.weight`: which one PEFT used is unknown
                raise AdapterError(f"module '{m['module']}' has two {m['part']} tensors: '{given[m['part']].name}', "
                                   f"'{key}'", file=where, tensor=key)
            given[m["part"]] = tensor
            continue
        if name.endswith(".base_layer.weight"):
            modules.setdefault(name[:-len(".base_layer.weight")], _Module()).base_copy = tensor
            continue
        saved = _SAVED_COPY.match(name)
        target = f"{saved['module']}.{saved['param']}" if saved else name
        found = _base_name(base, target)
        if found is None:
            unmatched.append(key)
        else:
            replaced[found] = tensor
    entries: dict[str, Entry] = {}
    notes: list[str] = []
    folds: dict[str, Folded] = {}
    for module, parts in modules.items():
        found = _base_name(base, f"{module}.weight")
        if found is None:
            unmatched.extend(t.name for t in (*parts.parts.values(), *([parts.base_copy] if parts.base_copy else [])))
            continue
        folds[found] = _plan_module(module, parts, base[found], config, where, lora_scale, notes)
    if unmatched:
        raise AdapterError(f"{len(unmatched)} adapter tensor(s) match no base weight: {', '.join(unmatched)}",
                           file=where)
    both = sorted(set(folds) & set(replaced))
    if both:
        raise AdapterError(f"the adapter both adapts and replaces (modules_to_save) {', '.join(both)}", file=where)
    for name in base:
        if name in folds:
            entries[name] = folds[name]
        elif name in replaced:
            new = replaced[name]
            if new.shape != base[name].shape:
                raise AdapterError(f"modules_to_save tensor '{new.name}' {list(new.shape)} does not fit the base's "
                                   f"{list(base[name].shape)}", file=where, tensor=name)
            if new.dtype != base[name].dtype:
                notes.append(f"{name}: the adapter's {new.dtype.display} copy is written as the base's "
                             f"{base[name].dtype.display}")
            entries[name] = Replaced(new)
        else:
            entries[name] = Unchanged()
    return FoldPlan(entries, notes)


def _plan_module(module: str, parts: _Module, weight: LazyTensor, config: AdapterConfig, where: str,
                 lora_scale: float | None, notes: list[str]) -> Folded:
    p = parts.parts
    embedding = "lora_embedding_A" in p or "lora_embedding_B" in p
    a = p.get("lora_embedding_A" if embedding else "lora_A")
    b = p.get("lora_embedding_B" if embedding else "lora_B")
    if a is None or b is None or (embedding and ("lora_A" in p or "lora_B" in p)):
        raise AdapterError(f"module '{module}' needs exactly one A and one B, has: {', '.join(sorted(p))}",
                           file=where, tensor=module)
    magnitude = p.get("lora_magnitude_vector")
    if config.use_dora != (magnitude is not None):
        raise AdapterError(f"module '{module}': use_dora is {config.use_dora} but lora_magnitude_vector is "
                           f"{'present' if magnitude is not None else 'missing'}", file=where, tensor=module)
    if parts.base_copy is not None:
        if parts.base_copy.shape != weight.shape:
            raise AdapterError(f"saved base layer '{parts.base_copy.name}' {list(parts.base_copy.shape)} does not fit "
                               f"the base's {list(weight.shape)}", file=where, tensor=weight.name)
        weight = parts.base_copy
    rank, alpha = config.rank_and_alpha(module)
    if a.shape[:1] != (rank,):
        raise AdapterError(f"module '{module}': the config gives r={rank} but '{a.name}' has shape {list(a.shape)}",
                           file=where, tensor=a.name)
    form: Form
    if embedding:
        form = "transposed"
    elif len(weight.shape) == 4:
        form = "conv"
    elif len(weight.shape) != 2:
        raise AdapterError(f"module '{module}': LoRA on a {len(weight.shape)}-d weight is not supported (Linear, "
                           f"Conv1D, Embedding and Conv2d are)", file=where, tensor=weight.name)
    else:
        form = "transposed" if config.fan_in_fan_out else "linear"
        other: Form = "linear" if form == "transposed" else "transposed"
        fits = Fold(a, b, 1.0, form)
        if weight.shape != expected_shape(fits) and weight.shape == expected_shape(Fold(a, b, 1.0, other)):
            # PEFT itself flips fan_in_fan_out per module type (False for nn.Linear, True for Conv1D)
            notes.append(f"{module}: fan_in_fan_out={form == 'linear'} from the weight's shape "
                         f"(the config says {config.fan_in_fan_out})")
            form = other
    folded = Fold(a, b, config.scaling(module, lora_scale), form, magnitude)
    check_fold(weight, folded)
    return Folded(folded, module, rank, alpha, parts.base_copy)
