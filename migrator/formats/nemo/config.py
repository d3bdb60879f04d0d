"""A NeMo 2 checkpoint's model configuration, read from `context/` as data, in Megatron-LM's names.

`context/model.yaml` is NeMo's YAML dump of the model (`io_dump(..., yaml_attrs=["model"])`): a
`_target_` class and its arguments with the class's defaults filled in, the configuration under
`config:` (megatron-core's `TransformerConfig` fields and NeMo's `GPTConfig` ones). It is read with a
bounded safe loader (`formats.bounded_yaml`): plain data only, nothing named in it imported.

`context/io.json` is fiddle's serialization of the same objects, but it records only the arguments
given to each class, not the class's defaults, so it cannot stand alone (a `Llama3Config8B()` records
none of its 32 layers). It is read as data (bounded JSON; nothing of fiddle runs) to check model.yaml:
a value both give and that differs is refused, naming both files.

The shipped recipes and the Hugging Face config.json read Megatron-LM's argument names (`common.pt`'s
args): NeMo's names that differ are mapped by the tables below, as data.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...core.errors import FormatError
from ...core.limits import Limits
from ..bounded_json import load_bounded_json, read_capped
from ..bounded_yaml import load_bounded_yaml
from .layout import CONTEXT, IO_JSON, MODEL_YAML

MAX_CONTEXT_BYTES = 16 * 2**20
"""model.yaml and io.json are tens of KiB for an LLM; a bigger one is not NeMo's."""

RENAMED: Mapping[str, str] = {
    "layernorm_epsilon": "norm_epsilon",
    "seq_length": "max_position_embeddings",
    "num_moe_experts": "num_experts",
    # NeMo's vocab_size (when set) is the embedding's row count, padding included (GPTConfig uses it as
    # is); the tokenizer's own size is not in the configuration
    "vocab_size": "padded_vocab_size",
}
"""NeMo's configuration name -> Megatron-LM's argument name, where they differ."""

OTHER_MEANING = ("vocab_size",)
"""NeMo's names (renamed above) that Megatron-LM's arguments use for something else (there, the
tokenizer's size): left out under NeMo's name, so a recipe never reads one meaning as the other."""

NEGATED: Mapping[str, str] = {
    "share_embeddings_and_output_weights": "untie_embeddings_and_output_weights",
}
"""NeMo's boolean -> Megatron-LM's argument that means its opposite."""

SILU = ("torch.nn.functional.silu", "torch.nn.modules.activation.SiLU", "torch.nn.SiLU")
"""`activation_func` values that make a gated MLP Megatron-LM's `swiglu`."""

ROPE_SCALING_FIELDS = ("scale_factor", "rope_scaling")
"""Fields of NeMo's Llama 3.1 configurations (`Llama31Config.scale_factor`, GPTConfig's `rope_scaling`):
present and set, the model scales RoPE frequencies (Megatron-LM's `use_rope_scaling`)."""

COUNTS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
          "num_moe_experts", "vocab_size", "moe_ffn_hidden_size", "moe_router_topk", "seq_length")
"""Fields that must be whole non-negative numbers when given (null where the field allows it)."""

MAX_DEPTH = 16


def read_context(folder: Path, limits: Limits) -> tuple[dict[str, Any], list[str]] | None:
    """The model's configuration from `folder/context/` in Megatron-LM's argument names, and notes;
    None when there is no model.yaml (io.json alone cannot give the class's defaults)."""
    context = folder / CONTEXT
    yaml_path = context / MODEL_YAML
    if not yaml_path.is_file():
        return None
    label = str(yaml_path)
    model = load_bounded_yaml(read_capped(yaml_path, MAX_CONTEXT_BYTES, "NeMo's model.yaml"), label)
    if not isinstance(model, dict):
        raise FormatError("not NeMo's model dump: the document is not a mapping", file=label)
    config = model.get("config")
    if not isinstance(config, dict):
        raise FormatError("not NeMo's model dump: it has no config: mapping (the model's configuration)", file=label)
    # an object the YAML dump could only name by its class (a torch dtype: `{_target_: torch.dtype}`)
    lost = {k for k, v in config.items() if isinstance(v, dict) and set(v) == {"_target_", "_call_"}
            and v["_call_"] is not False}
    config = {k: _value(v) for k, v in config.items() if type(k) is str}
    _check_counts(config, label)
    notes = []
    io_path = context / IO_JSON
    if io_path.is_file():
        given = _io_config(io_path, limits)
        if given is not None:
            _agree(config, given, label, str(io_path))
            notes.append(f"context/{MODEL_YAML} agrees with context/{IO_JSON} on the {len(given)} settings io.json "
                         "records")
            for k in sorted(lost & set(given)):  # io.json names it (fiddle serializes a dtype as torch.bfloat16)
                config[k] = given[k]
    args = megatron_args(config)
    target = model.get("_target_")
    if isinstance(config.get("_target_"), str):
        args["nemo_config_class"] = config["_target_"]
    if isinstance(target, str):
        args["nemo_model_class"] = target
    return args, notes


def megatron_args(config: Mapping[str, Any]) -> dict[str, Any]:
    """NeMo's configuration under Megatron-LM's names: every field as given, plus the names of
    RENAMED / NEGATED, and the arguments Megatron-LM has that NeMo expresses otherwise (`swiglu`,
    `group_query_attention`, `use_rope_scaling`, `params_dtype` as a dtype name)."""
    args = {k: v for k, v in config.items() if not isinstance(v, dict)}
    for nemo, megatron in RENAMED.items():
        if config.get(nemo) is not None:
            args[megatron] = config[nemo]
    for nemo in OTHER_MEANING:
        args.pop(nemo, None)
    for nemo, megatron in NEGATED.items():
        if isinstance(config.get(nemo), bool):
            args[megatron] = not config[nemo]
    act = config.get("activation_func")
    args["swiglu"] = bool(config.get("gated_linear_unit")) and act in SILU
    args["group_query_attention"] = config.get("num_query_groups") is not None
    args["use_rope_scaling"] = any(config.get(k) not in (None, False) for k in ROPE_SCALING_FIELDS)
    dtype = config.get("params_dtype")
    args["params_dtype"] = dtype.removeprefix("torch.") if isinstance(dtype, str) else None
    return args


def _value(v: Any, depth: int = 0) -> Any:
    """A configuration value as data: a reference to a function or constant that NeMo dumps as
    `{_target_: NAME, _call_: false}` is its NAME; an instance of a class (`_call_: true`, such as a
    torch dtype, whose value the dump loses) is None; nested configurations stay dicts."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(v, dict):
        if set(v) == {"_target_", "_call_"}:
            return v["_target_"] if v["_call_"] is False and isinstance(v["_target_"], str) else None
        return {k: _value(x, depth + 1) for k, x in v.items() if type(k) is str}
    if isinstance(v, list):
        return [_value(x, depth + 1) for x in v]
    return v if v is None or isinstance(v, (bool, int, float, str)) else None


def _check_counts(config: Mapping[str, Any], label: str) -> None:
    for key in COUNTS:
        v = config.get(key)
        if v is not None and (type(v) is not int or v < 0):
            raise FormatError(f"config.{key} is {v!r}, not a count", file=label)


def _agree(config: Mapping[str, Any], given: Mapping[str, Any], yaml_label: str, io_label: str) -> None:
    for key, v in given.items():
        if key not in config or isinstance(v, dict) or isinstance(config[key], dict):
            continue
        if v is not None and config[key] is not None and v != config[key]:
            raise FormatError(f"config.{key} is {config[key]!r}, but {io_label} says {v!r}: the two disagree",
                              file=yaml_label)


# fiddle's JSON: {"root": REF, "objects": {name: OBJECT}, ...}; an OBJECT is {"type": PYREF, "items":
# [[path element, VALUE], ...]}; a VALUE is a plain JSON value, {"type": "leaf", "value": ...},
# {"type": "ref", "key": name} or {"type": "pyref", "module": ..., "name": ...}.

def _io_config(path: Path, limits: Limits) -> dict[str, Any] | None:
    """The model configuration's arguments io.json records (`root.model.config`), as data; None when
    the file does not hold that path (another layout of fiddle's)."""
    label = str(path)
    data = load_bounded_json(read_capped(path, MAX_CONTEXT_BYTES, "NeMo's io.json"), limits, label, "io.json")
    if not isinstance(data, dict) or not isinstance(data.get("objects"), dict):
        raise FormatError("not fiddle's serialization (no objects)", file=label)
    objects: dict[str, Any] = data["objects"]
    node = data.get("root")
    for attr in ("model", "config"):
        items = _items(_deref(node, objects))
        if items is None or attr not in items:
            return None
        node = items[attr]
    items = _items(_deref(node, objects))
    if items is None:
        return None
    return {k: _io_value(v, objects, 0) for k, v in items.items()}


def _deref(node: Any, objects: Mapping[str, Any]) -> Any:
    if isinstance(node, dict) and node.get("type") == "ref":
        return objects.get(node.get("key"))  # type: ignore[arg-type]
    return node


def _items(obj: Any) -> dict[str, Any] | None:
    """An object's attributes (`Attr(name='x')` path elements) by name."""
    if not isinstance(obj, dict) or not isinstance(obj.get("items"), list):
        return None
    out = {}
    for item in obj["items"]:
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str):
            element = item[0]
            if element.startswith("Attr(name='") and element.endswith("')"):
                out[element[len("Attr(name='"):-2]] = item[1]
    return out


def _io_value(v: Any, objects: Mapping[str, Any], depth: int) -> Any:
    """A value as model.yaml's reading gives it: a function or constant is its dotted name, a list or
    tuple a list; another object (a nested configuration) a dict, left out of the comparison."""
    if depth > MAX_DEPTH:
        return None
    if not isinstance(v, dict):
        return v if v is None or isinstance(v, (bool, int, float, str)) else None
    kind = v.get("type")
    if kind == "leaf":
        return _io_value(v.get("value"), objects, depth + 1)
    if kind == "pyref":
        module, name = v.get("module"), v.get("name")
        return f"{module}.{name}" if isinstance(module, str) and isinstance(name, str) else None
    obj = _deref(v, objects) if kind == "ref" else v
    if not isinstance(obj, dict) or not isinstance(obj.get("items"), list):
        return None
    t = obj.get("type")
    if isinstance(t, dict) and t.get("module") == "builtins" and t.get("name") in ("list", "tuple"):
        return [_io_value(item[1], objects, depth + 1) for item in obj["items"]
                if isinstance(item, list) and len(item) == 2]
    return {}
