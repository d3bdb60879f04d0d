"""JSON from untrusted files (SafeTensors headers, shard indexes), bounded before and after parsing.

`json.loads` builds Python objects far larger than the text that makes them: `[],` is three bytes
and an 88-byte list. Each object, array, pair and string the parser creates needs at least one `{`,
`[`, `:` or two `"` bytes of its own, so counting those bytes (in C, before parsing) bounds what
parsing can build; it overcounts such bytes inside strings, which real headers have few of. The
budget is the one every header reader uses: `Limits.header_object_bytes` x the text's size +
`Limits.header_object_base`.

Nesting: the parser's own recursion check ends a very deep document (a RecursionError, reported as
a FormatError); what parses is then walked (without recursion) and refused beyond `MAX_DEPTH` levels,
so no later step (`json.dumps` of metadata, a report) can hit Python's recursion limit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.errors import FormatError, LimitExceededError
from ..core.limits import Limits

__all__ = ["MAX_DEPTH", "check_json_budget", "json_cost", "load_bounded_json", "read_capped", "read_json_object"]

# Upper bounds, in bytes, of what one `{`/`[`, one `:` and one `"` lets json.loads build (CPython
# 64-bit, GC headers included): a list or dict; a (key, value) pair and its slot; half a string.
CONTAINER_COST = 88
PAIR_COST = 80
QUOTE_COST = 36
MAX_DEPTH = 64
"""Levels of arrays and objects a parsed document may hold (an index needs 3, a SafeTensors header 3)."""


def json_cost(raw: bytes) -> int:
    """An upper bound of the bytes of Python objects `json.loads(raw)` builds (see the module doc)."""
    return (CONTAINER_COST * (raw.count(b"{") + raw.count(b"[")) + PAIR_COST * raw.count(b":")
            + QUOTE_COST * raw.count(b'"'))


def check_json_budget(raw: bytes, limits: Limits, file: str | None, what: str = "JSON") -> None:
    """A LimitExceededError when parsing `raw` could build more than the header budget of `limits`."""
    cost = json_cost(raw)
    per_byte, base = limits.header_object_bytes, limits.header_object_base
    if cost > per_byte * len(raw) + base:
        raise LimitExceededError(
            f"the {len(raw)}-byte {what} could build ~{cost} bytes of objects (from its count of objects, arrays, "
            f"pairs and strings), over the budget of {per_byte} x its size + {base} bytes "
            "(header_object_bytes, header_object_base)", file=file)


def _too_deep(value: Any, limit: int) -> bool:
    """Whether `value` nests arrays and objects more than `limit` levels (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            children: Any = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def load_bounded_json(raw: bytes, limits: Limits, file: str | None, what: str = "JSON") -> Any:
    """`json.loads(raw)` for untrusted bytes: budget checked first, UTF-8 and JSON errors, nesting beyond
    `MAX_DEPTH`, NaN/Infinity constants and integers beyond Python's digit limit are FormatErrors."""
    check_json_budget(raw, limits, file, what)

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=no_constant)
    except UnicodeDecodeError as e:
        raise FormatError(f"{what} is not UTF-8 (byte {e.start}: {e.reason})", file=file) from None
    except RecursionError:
        raise FormatError(f"{what} is nested too deeply (at most {MAX_DEPTH} levels)", file=file) from None
    except ValueError as e:  # JSONDecodeError, and integers beyond Python's digit limit
        if "integer string conversion" in str(e):  # Python's own advice (set_int_max_str_digits) is not the user's
            raise FormatError(f"{what} holds an integer of thousands of digits", file=file) from None
        raise FormatError(f"{what} is not JSON: {e}", file=file) from None
    if _too_deep(value, MAX_DEPTH):
        raise FormatError(f"{what} is nested too deeply (at most {MAX_DEPTH} levels)", file=file)
    return value


def read_capped(path: Path, max_bytes: int, what: str) -> bytes:
    """A small untrusted file's bytes, refused (FormatError naming it) beyond `max_bytes`: a tokenizer
    or companion file is read whole, so its size is checked before it is read."""
    from ..core.bytesource import read_regular

    label = str(path)
    try:
        raw = read_regular(path, max_bytes)
    except OSError as e:
        raise FormatError(f"cannot read the {what}: {e.strerror}", file=label) from None
    if len(raw) > max_bytes:
        raise FormatError(f"a {what} file of more than {max_bytes} bytes; at most {max_bytes} are read", file=label)
    return raw


def read_json_object(path: Path, max_bytes: int, what: str) -> dict[str, Any]:
    """A JSON object from a small untrusted file (a tokenizer.json, a companion config): `read_capped`,
    then parsed by `load_bounded_json` with the default limits; FormatError naming the file otherwise."""
    from ..core.limits import DEFAULT_LIMITS

    label = str(path)
    value = load_bounded_json(read_capped(path, max_bytes, what), DEFAULT_LIMITS, label, f"the {what}")
    if not isinstance(value, dict):
        raise FormatError(f"the {what} is not a JSON object", file=label)
    return value
