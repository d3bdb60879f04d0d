"""The one-off recipe of `migrate convert` (and of `diff`'s convert-style options): built from
command-line options, validated as any recipe, and written out as YAML (`emit_recipe`) so a
one-off can become a checked-in recipe. Running it is `run/convert.py`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import MigratorError
from . import adapter_names
from .convert_options import ConvertOptions, flag_for, row, table

if TYPE_CHECKING:
    from .model import Recipe


COMPANIONS = ("config.json", "generation_config.json", "tokenizer*", "special_tokens_map.json",
              "vocab.*", "merges.txt", "added_tokens.json", "chat_template.jinja", "preprocessor_config.json")
"""A model folder's usual companions (config, generation config, tokenizer files, chat template): what
a `--lora` folder target carries over from the base, and what `--copy-from DIR` alone copies from DIR,
each when present."""
LORA_COMPANIONS = COMPANIONS


class ConvertUsageError(MigratorError):
    """A convert option is malformed (e.g. --remap without '=')."""


def build_recipe(src: str | os.PathLike[str], dst: str | os.PathLike[str], options: ConvertOptions | None = None,
                 /, **changes: Any) -> Recipe:
    """The recipe equivalent to a `migrate convert` command line (validated like any recipe):
    `options` (a `ConvertOptions`; its fields may also be given, or changed, as keywords).

    `adapters` are names or `float_cast:DTYPE`; `modules` are `TYPE=REGEX`. A value the recipe
    model refuses raises ConvertUsageError with the recipe's message and hint, naming the option.
    `lora`: a PEFT adapter folder folded into `src` (`source.lora`); a folder target then carries the
    base's config, generation and tokenizer files (each optional) unless `copy` says which.
    """
    o = dataclasses.replace(options or ConvertOptions(), **changes)
    remap = []
    for item in o.remaps:
        pattern, sep, repl = item.partition("=")
        if not sep or not pattern:
            raise ConvertUsageError(f"{row('remaps').flag} expects 'REGEX=REPLACEMENT', got {item!r}")
        remap.append({"from": pattern, "to": repl})
    data: dict[str, Any] = {"version": 1, "source": {"path": os.fspath(src)}, "remap": remap,
                            "target": {"path": os.fspath(dst)}}
    for r in table():  # the options whose value goes into the recipe as it is
        value = getattr(o, r.name)
        if r.place and r.recipe is not None and value is not None and value != "":
            _put(data, r.recipe, dict(value) if isinstance(value, Mapping) else
                 os.fspath(value) if isinstance(value, os.PathLike) else value)
    if o.max_shard_size is not None or os.fspath(dst).endswith(("/", os.sep)):  # DIR/: a Hugging Face folder
        from ..files.sharded_writer import DEFAULT_MAX_SIZE

        data["target"]["shard"] = {"max_size": DEFAULT_MAX_SIZE if o.max_shard_size is None else o.max_shard_size}
        if o.weights_name is not None:
            data["target"]["shard"]["name"] = o.weights_name
    elif o.weights_name is not None:
        raise ConvertUsageError(f"{row('weights_name').flag} names the weights in a folder target: end DST with '/'")
    if o.lora_scale is not None and o.lora is None:
        raise ConvertUsageError(f"{row('lora_scale').flag} scales a LoRA adapter: add {row('lora').flag} "
                                "ADAPTER_FOLDER")
    if o.lora is not None:
        lora = os.fspath(o.lora)
        data["source"]["lora"] = lora if o.lora_scale is None else {"path": lora, "scale": o.lora_scale}
        # as PEFT's merged save_pretrained: a loadable folder (from a model folder: a loose file's may hold anything)
        if not o.copy and "shard" in data["target"] and os.path.isdir(src):
            data["target"]["copy"] = [{"path": c, "optional": True} for c in LORA_COMPANIONS]
    if (o.add_tokens is not None and not o.copy and o.copy_from is None and "shard" in data["target"]
            and os.path.isdir(src)):
        # the tokenizer, config and the rest of the folder go with the grown model, as for a --lora
        data["target"]["copy"] = [{"path": c, "optional": True} for c in COMPANIONS]
    if o.copy:
        data["target"]["copy"] = list(o.copy)
    elif o.copy_from is not None:  # --copy-from DIR alone: DIR's usual companions, each when present
        data["target"]["copy"] = [{"path": c, "optional": True} for c in COMPANIONS]
    scheme = quantize_scheme(o.quantize)
    if scheme is not None:  # compressed-tensors' layout, in a model folder with its config.json
        data["quantize"] = {"scheme": scheme}
        if not o.copy and o.copy_from is None and "shard" in data["target"] and os.path.isdir(src):
            data["target"]["copy"] = [{"path": c, "optional": True} for c in COMPANIONS]
    elif o.quantize:  # a GGUF target: every tensor the rule may take, or a llama.cpp mix (Q4_K_M ...)
        from ..formats.gguf.mixes import is_mix

        data["target"]["quantize"] = o.quantize.upper() if is_mix(o.quantize) else {".*": o.quantize}
    if o.includes or o.excludes:
        data["filter"] = {"include": [{"regex": r} for r in o.includes] or None,
                          "exclude": [{"regex": r} for r in o.excludes]}
    if o.adapters:
        data["adapters"] = [_adapter_spec(a) for a in o.adapters]
    if o.dtype:
        data["dtype"] = {"cast": o.dtype}
    declared: dict[str, list[str]] = {}
    module_options: list[tuple[str, int, str]] = []  # (type, index in its list, option as given)
    for item in o.modules:
        type_name, sep, pattern = item.partition("=")
        if not sep or not type_name.strip() or not pattern:
            raise ConvertUsageError(f"{row('modules').flag} expects TYPE=REGEX (e.g. Linear='^fc\\d+$'), "
                                    f"got {item!r}")
        module_options.append((type_name, len(declared.setdefault(type_name, [])), item))
        declared[type_name].append(pattern)
    if declared:
        data["modules"] = declared
    if lora_adapter(src, dst, o.target_format_name):
        _lora_to_gguf(data, src, o)
    else:
        if o.base is not None:
            raise ConvertUsageError(f"{row('base').flag} names the base model of a PEFT LoRA adapter folder SRC "
                                    "converted to a .gguf DST")
        _hf_to_gguf(data, src, dst, o.target_format_name)
    _gguf_to_hf(data, src, dst, o.target_format_name)
    from pydantic import ValidationError

    from .model import Recipe

    try:
        return Recipe.model_validate(data)
    except ValidationError:
        raise _usage_error(data, module_options) from None


def quantize_scheme(name: str | None) -> str | None:
    """The compressed-tensors scheme `--quantize NAME` names (any case), else None (a GGUF type, or nothing)."""
    if not name:
        return None
    from .convert_options import quantize_schemes

    return name.upper() if name.upper() in quantize_schemes() else None


def llama_config(src: str | os.PathLike[str], dst: str | os.PathLike[str], target_format_name: str
                 ) -> dict[str, Any] | None:
    """The config.json of a Hugging Face Llama-family folder being converted to GGUF (named by its
    `architectures`, or by its `model_type` when it names none), else None. FormatError, in one line
    naming the file and the key, for a config that cannot be read or that the conversion cannot use."""
    from ..core.errors import FormatError
    from ..files.model_config import ConfigError, load_config
    from ..formats.registry import target_is

    folder = Path(src)
    if (not target_is(dst, target_format_name, llama_cpp=True)
            or not (folder / "config.json").is_file()):
        return None
    try:
        config = load_config(folder / "config.json")  # bounded; deep nesting is refused, not a traceback
    except ConfigError as e:
        raise FormatError(str(e)) from None
    from ..formats.gguf.llama import architecture, config_problem

    if architecture(config) is None:
        return None
    problem = config_problem(config)
    if problem is not None:
        raise FormatError(f"{folder / 'config.json'}: {problem}")
    return config


def _hf_to_gguf(data: dict[str, Any], src: str | os.PathLike[str], dst: str | os.PathLike[str],
                target_format_name: str) -> None:
    """A Hugging Face Llama-family folder converted to GGUF: the recipe its config.json calls for
    (llama.cpp's names, q/k permute, architecture key/values, tokenizer.model), merged into `data`."""
    config = llama_config(src, dst, target_format_name)
    if config is None:
        return
    from ..formats.gguf.llama import hf_to_gguf

    folder = Path(src)
    extra = hf_to_gguf(config)
    data["remap"] = extra["remap"] + data["remap"]
    kept = data.setdefault("filter", {"exclude": []})
    kept["exclude"] = extra["filter"]["exclude"] + kept["exclude"]
    data["ops"] = extra["ops"]
    data["target"]["metadata"] = {**extra["metadata"], **data["target"]["metadata"]}
    if "rope_scaling" in extra:
        data["target"]["rope_scaling"] = extra["rope_scaling"]
    if (folder / "tokenizer.model").is_file():
        data["target"]["tokenizer"] = "tokenizer.model"
    elif (folder / "tokenizer.json").is_file() and _byte_level_bpe(folder / "tokenizer.json"):
        data["target"]["tokenizer"] = "tokenizer.json"


ADAPTER_CONFIG = "adapter_config.json"


def lora_adapter(src: str | os.PathLike[str], dst: str | os.PathLike[str], target_format_name: str) -> bool:
    """Whether this conversion writes a PEFT LoRA adapter folder (one with adapter_config.json) as a GGUF
    LoRA adapter: llama.cpp's names and layout, the base model read for them (`_lora_to_gguf`)."""
    from ..formats.registry import target_is

    return (target_is(dst, target_format_name, llama_cpp=True) and not os.fspath(dst).endswith(("/", os.sep))
            and (Path(src) / ADAPTER_CONFIG).is_file())


def _lora_to_gguf(data: dict[str, Any], src: str | os.PathLike[str], o: ConvertOptions) -> None:
    """A PEFT LoRA adapter folder as llama.cpp's LoRA adapter of its base model (`formats/gguf/lora.py`):
    names, the q/k permute of B, key/values, F32 unless --dtype says otherwise; the base found from
    --base or adapter_config.json, its config.json and weights' shapes read (headers only)."""
    from ..core.errors import AdapterError
    from ..files.io import open_file
    from ..files.model_config import ConfigError, load_config
    from ..formats.bounded_json import read_json_object
    from ..formats.gguf.lora import check_config, lora_recipe

    adapter = Path(src)
    where = adapter / ADAPTER_CONFIG
    config = check_config(read_json_object(where, 16 << 20, "adapter config"), str(where))
    if o.base is not None:
        base = Path(o.base)
        if not base.is_dir():
            raise ConvertUsageError(f"{row('base').flag} {os.fspath(o.base)}: not a folder (the base model's folder, "
                                    "with its config.json and weights)")
    else:
        named = config.get("base_model_name_or_path")
        if not isinstance(named, str) or not named or not Path(named).expanduser().is_dir():
            said = f"base_model_name_or_path {named!r} is not a local folder" if named else \
                "no base_model_name_or_path"
            raise ConvertUsageError(f"{where}: {said}: name the base model folder with {row('base').flag} DIR")
        base = Path(named).expanduser()
    try:
        base_config = load_config(base / "config.json")
    except ConfigError as e:
        raise AdapterError(f"the base model: {e}") from None
    with open_file(base) as reader:
        base_shapes = {t.name: tuple(t.shape) for t in reader.tensors}
    with open_file(adapter) as reader:
        adapter_shapes = {t.name: tuple(t.shape) for t in reader.tensors}
    extra = lora_recipe(config, base_config, adapter_shapes, base_shapes, adapter=str(adapter), base=str(base))
    data["remap"] = extra["remap"] + data["remap"]
    data["ops"] = extra["ops"]
    data["target"]["metadata"] = {**extra["metadata"], **data["target"]["metadata"]}
    if extra["exclude"]:
        kept = data.setdefault("filter", {"exclude": []})
        kept["exclude"] = [{"regex": r} for r in extra["exclude"]] + kept["exclude"]
    if not o.dtype:  # llama.cpp's converter writes F32 unless told otherwise (--outtype f32)
        data["dtype"] = {"cast": "F32"}


def _byte_level_bpe(path: Path) -> bool:
    """Whether a folder's tokenizer.json is a byte-level BPE the GGUF writer converts (else the weights
    are written without a tokenizer, and the plan says llama.cpp needs one). An unreadable one is
    taken, so the plan names its problem."""
    from ..core.errors import FormatError
    from ..formats.gguf.bpe import byte_level_problem, read_json

    try:
        return byte_level_problem(read_json(path)) is None
    except FormatError:
        return True


def llama_gguf(src: str | os.PathLike[str], dst: str | os.PathLike[str],
               max_shard_size: object, target_format_name: str = "auto") -> dict[str, str] | None:
    """The key/values of a GGUF model (of an architecture `gguf_to_hf` knows) being converted into a Hugging
    Face model folder (a sharded target not in GGUF: that is split GGUF files), else None. The model is a
    `.gguf` file, one file of a split GGUF (the whole set is read) or a folder holding a split GGUF."""
    sharded = max_shard_size is not None or os.fspath(dst).endswith(("/", os.sep))
    from ..formats.registry import is_format

    if not sharded or is_format(target_format_name, llama_cpp=True):
        return None
    path = os.fspath(src)
    if os.path.isdir(path):
        from ..core.errors import FormatError
        from ..files.sharded import folder_weights

        try:
            path = os.fspath(folder_weights(Path(path)))
        except FormatError:  # not a model folder: the plan says so
            return None
    if not path.endswith(".gguf") or not os.path.isfile(path):
        return None
    from ..files.io import open_file

    with open_file(path, "gguf") as reader:
        meta = dict(reader.metadata)
    from ..formats.gguf.llama import HF_CLASSES

    return meta if getattr(meta.get("general.architecture"), "data", None) in HF_CLASSES else None


def _gguf_to_hf(data: dict[str, Any], src: str | os.PathLike[str], dst: str | os.PathLike[str],
                target_format_name: str) -> None:
    """A llama GGUF converted into a model folder: Hugging Face names and layout, and a config.json."""
    meta = llama_gguf(src, dst, data["target"].get("shard"), target_format_name)
    if meta is None:
        return
    from ..formats.gguf.llama import gguf_to_hf

    extra = gguf_to_hf(meta)
    data["remap"] = extra["remap"] + data["remap"]
    data["ops"] = extra["ops"]
    kept = data.setdefault("filter", {"exclude": []})
    kept["exclude"] = extra["filter"]["exclude"] + kept["exclude"]
    data["target"]["hf_config"] = True


_ADAPTER_FORMS = adapter_names.CLI_FORMS


def _adapter_spec(value: str) -> str | dict[str, Any]:
    """`--adapter NAME` or `--adapter float_cast:DTYPE` as the recipe spells it."""
    name, sep, arg = value.partition(":")
    if name == "float_cast":
        if not arg:
            raise ConvertUsageError(f"--adapter '{value}': float_cast needs a dtype, e.g. --adapter float_cast:BF16 "
                                    "(or --dtype BF16, the recipe's dtype cast of every float tensor)")
        return {"float_cast": {"to": arg}}
    if sep or name not in _ADAPTER_FORMS:
        from ..naming.similarity import did_you_mean

        guess = did_you_mean(value, list(_ADAPTER_FORMS))
        lead = f"did you mean '{guess}'? " if guess else ""
        raise ConvertUsageError(f"--adapter: unknown adapter '{value}' (hint: {lead}valid adapters: "
                                f"{', '.join(_ADAPTER_FORMS)})")
    return name


def _usage_error(data: dict[str, Any], module_options: list[tuple[str, int, str]]) -> ConvertUsageError:
    """The recipe loader's messages for what the model refused (the same words as for a recipe
    file: "did you mean 'F16'?"), each naming the command-line option instead of a recipe line."""
    import yaml

    from .loader import RecipeError, parse_recipe

    try:
        parse_recipe(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    except RecipeError as e:
        lines = [f"{_option_for(issue.loc, data, module_options)}: {issue.message}"
                 + (f" (hint: {issue.hint})" if issue.hint else "") for issue in e.issues]
        return ConvertUsageError("invalid option: " + "; ".join(lines))  # an error is one line
    return ConvertUsageError("invalid option")  # the loader accepts what the model refused: not expected


def _option_for(loc: str, data: dict[str, Any], module_options: list[tuple[str, int, str]]) -> str:
    """The option (and value) a recipe location comes from, e.g. 'adapters[1].float_cast.to' -> --adapter
    'float_cast:X': the table's flag (`convert_options.flag_for`), with the value given for a repeated one."""
    import re

    head = re.match(r"([a-z_]+)(?:\.([^.\[]+))?(?:\[(\d+)\])?", loc)
    if head is None:
        return "option"
    first, second, index = head.group(1), head.group(2), head.group(3)
    flag = flag_for(loc)
    if index is None:
        return flag
    n = int(index)
    if first == "adapters":
        spec = data["adapters"][n]
        return f"{flag} '" + (spec if isinstance(spec, str) else f"float_cast:{spec['float_cast']['to']}") + "'"
    if first == "modules" and second is not None:
        given = [item for type_name, i, item in module_options if type_name == second and i == n]
        return f"{flag} '{given[0]}'" if given else flag
    if first == "remap":
        rule = data["remap"][n]
        return f"{flag} '{rule['from']}={rule['to']}'"
    if first == "filter" and second in ("include", "exclude"):
        return f"{flag} '{data['filter'][second][n]['regex']}'"
    return flag


def _put(data: dict[str, Any], location: str, value: Any) -> None:
    """`value` at a dotted recipe location ('source.top_level_key')."""
    *parents, key = location.split(".")
    for part in parents:
        data = data.setdefault(part, {})
    data[key] = value


def emit_recipe(recipe: Recipe, out: str | os.PathLike[str] | None = None) -> str:
    """The recipe as YAML to check in. With `out` (the file it will be written to), its paths are
    made relative to that file's folder, as a recipe's paths are read; without, they stay as given
    (relative to the current folder, where a recipe printed to stdout is usually saved)."""
    import yaml

    data = recipe.dump()
    if out is not None:
        folder = os.path.dirname(os.path.abspath(out))
        data["source"]["path"] = _relative_to(data["source"]["path"], folder)
        lora = data["source"].get("lora")
        if isinstance(lora, str):
            data["source"]["lora"] = _relative_to(lora, folder)
        elif isinstance(lora, dict):
            lora["path"] = _relative_to(lora["path"], folder)
        if data["source"].get("param_order"):
            data["source"]["param_order"] = _relative_to(data["source"]["param_order"], folder)
        data["target"]["path"] = _relative_to(data["target"]["path"], folder)
        if data["target"].get("template"):
            data["target"]["template"] = _relative_to(data["target"]["template"], folder)
    return schema_line() + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def _relative_to(path: str, folder: str) -> str:
    """A command-line path (relative to the current folder) as seen from `folder`; a trailing '/'
    (a folder target) is kept."""
    rel = os.path.relpath(os.path.abspath(os.path.expanduser(path)), folder)
    return rel + "/" if path.endswith(("/", os.sep)) and not rel.endswith("/") else rel


def schema_line() -> str:
    """The yaml-language-server line naming the recipe schema: the schema file of this installation
    as an absolute file URL when it is there (a checkout or an editable install), else how to make one."""
    schema = Path(__file__).resolve().parents[2] / "schemas" / "recipe.schema.json"
    if schema.is_file():
        return f"# yaml-language-server: $schema={schema.as_uri()}\n"
    return ("# schema: run `migrate schema -o recipe.schema.json` and add the line\n"
            "# yaml-language-server: $schema=recipe.schema.json\n")
