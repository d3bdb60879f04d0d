"""Values a recipe takes from the checkpoint's own config (`config.json`, Meta's `params.json`).

A recipe value written as one `${...}` expression is replaced, before validation, by what the config
declares: `heads: ${config.num_attention_heads}`. The expression grammar is small on purpose:

    ${ choice | choice | ... }        the first choice whose config keys all exist
    choice := term (('*' | '//') term)*
    term   := config.KEY[.KEY...] | an integer | a number

so `${config.num_key_value_heads | config.num_attention_heads}` (Llama's rule when a config has no
KV head count) and `${config.head_dim | config.hidden_size // config.num_attention_heads}` work, and
`${config.n_kv_heads | 8}` gives a default. Only a whole value is an expression: a string holding
`${` among other text is left as it is.

Which config: the recipe's `config:` path (relative to the recipe), else `config.json` beside the
(first) source, else `params.json` there (Meta's releases). A config is read only when a value
refers to it or when an op can be checked against it (`rope_permute`: `head_dim_of`); it is JSON of
at most `MAX_CONFIG_BYTES`, read from a local path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..files.model_config import CONFIG_NAMES, MAX_CONFIG_BYTES, ConfigError, config_folder, find_config, load_config

__all__ = ["MAX_CONFIG_BYTES", "ConfigError", "config_folder", "find_config", "head_dim_of", "load_config",
           "resolve_references"]

_EXPRESSION = re.compile(r"^\$\{(.*)\}$", re.DOTALL)
_TOKEN = re.compile(r"\s*(?:(//|\*|\|)|(config(?:\.[A-Za-z_][A-Za-z0-9_-]*)+)|(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?))")
MAX_EXPRESSION_CHARS = 512


class NoConfigError(ConfigError):
    """A reference with no config to read: none is named, and none is beside the source (yet: a recipe
    is often checked before its source exists). The loader defers it to planning."""

PLACEHOLDER = 2
"""What a deferred reference stands for while the recipe is validated: a value every integer field
that takes a reference accepts (heads >= 1, head_dim even). A plan refuses a recipe holding one."""


def is_reference(value: object) -> bool:
    return isinstance(value, str) and value.startswith("${") and value.endswith("}")


def _lookup(config: dict[str, Any], key: str) -> tuple[bool, Any]:
    node: Any = config
    for part in key.split(".")[1:]:
        if not isinstance(node, dict) or part not in node or node[part] is None:
            return False, None
        node = node[part]
    return True, node


def _tokens(text: str) -> Iterator[tuple[str, str]]:
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ConfigError(f"cannot read '{text[pos:].strip()[:40]}': a choice is config.KEY, a number, "
                              "or those joined by * and //; choices are separated by |")
        op, key, number = m.groups()
        yield ("op", op) if op else ("key", key) if key else ("number", number)
        pos = m.end()


def evaluate(expression: str, config: dict[str, Any] | None, config_path: Path | None) -> Any:
    """The value of one `${...}` expression (see the module docstring). `config_path` is the config
    read, or with no config the folder where none was found (for the message)."""
    m = _EXPRESSION.match(expression)
    if m is None or len(expression) > MAX_EXPRESSION_CHARS:
        raise ConfigError(f"'{expression[:60]}' is not a ${{...}} expression of at most {MAX_EXPRESSION_CHARS} "
                          "characters")
    choices: list[list[tuple[str, str]]] = [[]]
    for kind, text in _tokens(m.group(1)):
        if kind == "op" and text == "|":
            choices.append([])
        else:
            choices[-1].append((kind, text))
    wanted: list[str] = []
    for choice in choices:
        if not choice or len(choice) % 2 == 0 or any((k == "op") != (i % 2 == 1) for i, (k, _) in enumerate(choice)):
            raise ConfigError(f"'{expression}': each choice is a term, or terms joined by * or //")
        keys = [t for k, t in choice if k == "key"]
        if keys and config is None:
            wanted += keys
            continue
        found = [_lookup(config or {}, key) for key in keys]
        if not all(ok for ok, _ in found):
            wanted += [key for key, (ok, _) in zip(keys, found, strict=True) if not ok]
            continue
        values = iter(v for _, v in found)
        result: Any = None
        op = None
        for kind, text in choice:
            if kind == "op":
                op = text
                continue
            value = next(values) if kind == "key" else (float(text) if any(c in text for c in ".eE") else int(text))
            result = value if op is None else _apply(op, result, value, expression)
        return result
    if config is None:  # config_path is then the folder looked in, if any
        if config_path is not None and not config_path.exists():
            raise NoConfigError(f"'{expression}' refers to {', '.join(wanted)}, but there is no config: the source "
                                f"{config_path} does not exist")
        where = f"in {config_path}" if config_path is not None else "beside the source"
        raise NoConfigError(f"'{expression}' refers to {', '.join(wanted)}, but there is no config: none of "
                            f"{', '.join(CONFIG_NAMES)} is {where}; name one with `config:`")
    raise ConfigError(f"'{expression}': the config {config_path} has no {' or '.join(sorted(set(wanted)))}")


def _apply(op: str, a: Any, b: Any, expression: str) -> Any:
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        raise ConfigError(f"'{expression}': {op} takes numbers, got {a!r} and {b!r}")
    if op == "*":
        return a * b
    if b == 0:
        raise ConfigError(f"'{expression}': division by zero")
    return a // b


def resolve_references(data: Any, config_for: Callable[[], tuple[dict[str, Any] | None, Path | None]],
                       report: Callable[[tuple[Any, ...], str], None],
                       defer: Callable[[tuple[Any, ...], str], None]) -> Any:
    """`data` (a loaded recipe, plain YAML data) with every `${...}` value replaced; `config_for`
    loads the config on the first reference (so a recipe without one never reads it), `report`
    takes (path in data, message) for a value that cannot be resolved (it is then left as written),
    `defer` one that has no config to read (it becomes PLACEHOLDER until a plan refuses it)."""
    state: dict[str, Any] = {}

    def config() -> tuple[dict[str, Any] | None, Path | None]:
        if "config" not in state:
            state["config"] = config_for()
        return state["config"]

    def walk(node: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, (*path, k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, (*path, i)) for i, v in enumerate(node)]
        if is_reference(node):
            try:
                cfg, where = config()
                return evaluate(node, cfg, where)
            except NoConfigError as e:
                defer(path, str(e))
                return PLACEHOLDER
            except ConfigError as e:
                report(path, str(e))
        return node

    return walk(data, ())


def head_dim_of(config: dict[str, Any]) -> tuple[int, str] | None:
    """The attention head size a config declares, and how it is known (for messages): Hugging Face's
    `head_dim`, else `hidden_size / num_attention_heads`; Meta's `dim / n_heads`. None when it does not
    say (not an attention model, or keys this does not know)."""
    def number(key: str) -> int | None:
        v = config.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    if (hd := number("head_dim")) is not None:
        return hd, f"head_dim {hd}"
    for size, heads in (("hidden_size", "num_attention_heads"), ("dim", "n_heads")):
        s, h = number(size), number(heads)
        if s is not None and h is not None and s % h == 0:
            return s // h, f"{size} {s} / {heads} {h} = {s // h}"
    return None
