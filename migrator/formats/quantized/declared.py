"""Which scheme a model's config declares, and the name rules the declarations use.

`scheme_of(config, file)` reads the config.json object: its `quantization_config` (or a key another
scheme declares itself by, MLX's `quantization`) picks the registered scheme by `quant_method` (and,
for compressed-tensors, `format`); an unknown method or format is a `QuantizationError` naming the key
and what is known. No tensor name is looked at here: a checkpoint is quantized because its config says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .scheme import SCHEMES, QuantizationError, Scheme

CONFIG_KEY = "quantization_config"
COMPRESSED_TENSORS = "compressed-tensors"


def scheme_of(config: Mapping[str, Any], file: str) -> Scheme | None:
    """The scheme `config` (a parsed config.json) declares, or None when it declares none."""
    declaration = config.get(CONFIG_KEY)
    if declaration is None:
        for cls in SCHEMES.values():  # a scheme declared under its own key (MLX's `quantization`)
            if cls.config_key != CONFIG_KEY and config.get(cls.config_key) is not None:
                return cls.parse(_object(config[cls.config_key], cls.config_key, file), file)
        return None
    declaration = _object(declaration, CONFIG_KEY, file)
    if "quant_method" not in declaration:
        for cls in SCHEMES.values():  # mlx-lm copies its `quantization` here too, without a method
            if cls.config_key != CONFIG_KEY and config.get(cls.config_key) == declaration:
                return cls.parse(declaration, file)
    method = declaration.get("quant_method")
    if not isinstance(method, str):
        raise QuantizationError(f"{CONFIG_KEY}.quant_method is {method!r}: a quantization method name is expected "
                                f"(known: {', '.join(known_methods())})", file=file)
    candidates = [c for c in SCHEMES.values() if c.method == method and c.config_key == CONFIG_KEY]
    if not candidates:
        raise QuantizationError(f"{CONFIG_KEY}.quant_method '{method}' is not a method migrator reads (known: "
                                f"{', '.join(known_methods())})", file=file)
    if method != COMPRESSED_TENSORS:
        return candidates[0].parse(declaration, file)
    fmt = compressed_format(declaration, file)
    for cls in candidates:
        if fmt in cls.formats:
            return cls.parse(declaration, file)
    known = sorted(f for c in candidates for f in c.formats)
    raise QuantizationError(f"{CONFIG_KEY}.format '{fmt}' is not a compressed-tensors format migrator reads (known: "
                            f"{', '.join(known)})", file=file)


def known_methods() -> list[str]:
    return sorted({c.method for c in SCHEMES.values() if c.config_key == CONFIG_KEY})


def compressed_format(declaration: Mapping[str, Any], file: str) -> str:
    """A compressed-tensors config's one format: the top `format`, or every config group's (they must
    agree: a mixed-format checkpoint is not read)."""
    formats = set()
    top = declaration.get("format")
    groups = declaration.get("config_groups") or {}
    if not isinstance(groups, Mapping):
        raise QuantizationError(f"{CONFIG_KEY}.config_groups must be an object", file=file)
    for group in groups.values():
        if isinstance(group, Mapping) and isinstance(group.get("format"), str):
            formats.add(group["format"])
    if isinstance(top, str) and top != "mixed-precision":
        formats.add(top)
    if not formats:
        raise QuantizationError(f"{CONFIG_KEY}.format is missing: compressed-tensors declares how its weights are "
                                "stored there (e.g. float-quantized)", file=file)
    if len(formats) > 1:
        raise QuantizationError(f"{CONFIG_KEY} mixes formats {', '.join(sorted(formats))}: one format per "
                                "checkpoint is read", file=file)
    return formats.pop()


def _object(value: Any, key: str, file: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise QuantizationError(f"{key} must be a JSON object, not {type(value).__name__}", file=file)
    return value


# -- the name rules ------------------------------------------------------------------------------------


def ct_matches(name: str, target: str) -> bool:
    """compressed-tensors' rule (`match_name`): `re:PATTERN` is `re.match` (anchored at the start only),
    anything else the exact module name."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name


def ct_any(name: str, targets: Iterable[str]) -> bool:
    return any(ct_matches(name, t) for t in targets)


def hf_skips(module: str, patterns: Sequence[str] | None) -> bool:
    """transformers' rule for `modules_to_not_convert` (`should_convert_module`, inverted): a pattern
    matches from the start up to a module boundary (also as a regex), or as a suffix of the name."""
    if not patterns:
        return False
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    for key in patterns:
        try:
            if re.match(rf"(?:{key}){boundary}", module):
                return True
        except re.error:
            pass  # not a regex: the suffix rule alone
        if module.endswith(key):
            return True
    return False


def module_of(tensor: str) -> str:
    """`a.b.weight` -> `a.b`."""
    return tensor.rpartition(".")[0]


def string_list(declaration: Mapping[str, Any], key: str, file: str, where: str = CONFIG_KEY) -> list[str]:
    """A list of strings the config gives under `key` (absent or null: empty)."""
    value = declaration.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise QuantizationError(f"{where}.{key} must be a list of strings", file=file)
    for v in value:
        if v.startswith("re:"):
            try:
                re.compile(v[3:])
            except re.error as e:
                raise QuantizationError(f"{where}.{key}: '{v}' is not a valid regex ({e})", file=file) from None
    return list(value)
