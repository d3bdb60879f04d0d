"""Tensor-name transforms: key remapping, contiguous indices, enum-variant stripping, collisions.

These are the pure building blocks of a recipe (no file I/O). Their semantics follow Burn's
burn-store crate (spec §4) so that a recipe written against Burn's documentation renames tensors
exactly as Burn would.

Regex dialect
-------------
Patterns are Python ``re`` patterns with the Rust-only spellings translated so that patterns
copied from Burn code behave the same:

* a bare ``$`` outside a character class (and outside multi-line mode) becomes ``\\Z``: in Rust it
  matches only at the very end, Python's ``$`` also matches before a trailing newline;
* ``\\z`` becomes ``\\Z``; ``\\x{..}``, ``\\u{..}``, ``\\U{..}`` become Python code-point escapes;
* ``(?<name>..)`` becomes ``(?P<name>..)``;
* inline flags in the middle of a pattern (``a(?i)b``), which Python rejects, become scoped
  groups covering the rest of the enclosing group;
* ``\\<``, ``\\>`` and ``\\b{start}``/``\\b{end}``/``\\b{start-half}``/``\\b{end-half}`` become
  look-around word boundaries; ``[[:alpha:]]``-style ASCII classes are expanded.

Rust features with no faithful Python spelling are rejected with a `NamingError`: Unicode
property classes (``\\p{..}``), nested classes and class set operations (``&&``, ``--``, ``~~``),
and the ``U``/``R``/``-u`` flags. Python-only features (look-around, back-references) are
accepted.

Replacement syntax
------------------
A `RemapRule` has ``syntax``: ``"rust"`` (Burn's ``$1``/``${name}``/``$$`` rules, backslashes
literal), ``"python"`` (``re.sub`` templates: ``\\1``, ``\\g<name>``, ``\\g<1>``) or ``"auto"``
(default): Python when the replacement contains a backslash followed by a digit or ``\\g<``,
otherwise Rust. An ``auto`` replacement that uses both styles of group reference is rejected as
ambiguous. Whatever the syntax, matches are found with Rust's iteration rule (an empty match right
after the previous match is skipped), which differs from ``re.sub`` since Python 3.7.

Index arithmetic (migrator's extension; Burn's replacements have none): in the Rust syntax,
``${1+12}`` / ``${1-12}`` (also ``${name+3}``) is the group's decimal value plus or minus the
offset, so layers can be renumbered (``layer\\.(\\d+)\\.`` -> ``layer.${1-12}.``). The group must
hold ASCII digits and the result must not be negative, else the rename fails with an
`IndexArithmeticError` naming the tensor. A group written with leading zeros keeps its width
(``07`` + 1 = ``08``, ``09`` + 1 = ``10``, ``99`` + 1 = ``100``); one without is written plainly.
Only the braced form computes: ``$1+12`` is still group 1 followed by the text ``+12``, as in Rust.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "IndexArithmeticError",
    "KeyRemapper",
    "NamingError",
    "RemapRule",
    "ReplacementSyntax",
    "compile_regex",
    "contiguous_names",
    "expand_replacement",
    "find_collisions",
    "parse_usize",
    "strip_enum_variant",
]

ReplacementSyntax = Literal["rust", "python", "auto"]

_USIZE_MAX = 2**64 - 1


class NamingError(ValueError):
    """A bad regex or replacement in a name transform; the recipe layer wraps it with the file name.

    ``position`` is an index into ``pattern`` (the text the user wrote), or None when unknown.
    """

    def __init__(self, message: str, *, pattern: str, position: int | None = None) -> None:
        self.message = message
        self.pattern = pattern
        self.position = position
        where = f" at position {position}" if position is not None else ""
        super().__init__(f"{message} in {pattern!r}{where}")


class IndexArithmeticError(NamingError):
    """``${1+12}`` / ``${1-12}`` met a group that is not a number, or gave a negative index."""

    def __str__(self) -> str:
        return self.message  # names the tensor already


# ---------------------------------------------------------------------------------------------
# Regex translation (Rust `regex` spellings -> Python `re`)
# ---------------------------------------------------------------------------------------------

_POSIX_CLASSES = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": "\\x00-\\x7F",
    "blank": "\\t ",
    "cntrl": "\\x00-\\x1F\\x7F",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": "!-/:-@\\[-`{-~",
    "space": "\\t\\n\\v\\f\\r ",
    "upper": "A-Z",
    "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}

_WORD_BOUNDARIES = {
    "start": "\\b(?=\\w)",
    "end": "\\b(?<=\\w)",
    "start-half": "(?<!\\w)",
    "end-half": "(?!\\w)",
}

_FLAG_GROUP = re.compile(r"\(\?([A-Za-z-]*)([:)])")
_NAMED_GROUP = re.compile(r"\(\?P?<([^>=!]*)>")
_POSIX = re.compile(r"\[:(\^?)([a-z]*):\]")
_HEX_BRACED = re.compile(r"\{([0-9A-Fa-f]{1,8})\}")


@dataclass
class _Group:
    """Flag state of one open group; `wrappers` are scoped-flag groups opened for bare `(?x)`."""

    multiline: bool
    verbose: bool
    wrappers: list[str] = field(default_factory=list)


class _Translator:
    """Single pass over a Rust-style pattern, emitting Python text and a map back to source offsets."""

    def __init__(self, pattern: str) -> None:
        self.src = pattern
        self.i = 0
        self.out: list[str] = []
        self.origin: list[int] = []
        self.stack: list[_Group] = [_Group(multiline=False, verbose=False)]

    def fail(self, message: str, position: int) -> NamingError:
        return NamingError(message, pattern=self.src, position=position)

    def emit(self, text: str, src_pos: int) -> None:
        self.out.append(text)
        self.origin.extend([src_pos] * len(text))

    def run(self) -> tuple[str, list[int]]:
        src = self.src
        while self.i < len(src):
            c = src[self.i]
            top = self.stack[-1]
            if c == "\\":
                self.escape(in_class=False)
            elif c == "[":
                self.char_class()
            elif c == "(":
                self.open_group()
            elif c == ")":
                self.close_group()
            elif c == "|":
                self.alternation()
            elif c == "$":
                self.emit("$" if top.multiline else "\\Z", self.i)
                self.i += 1
            elif c == "#" and top.verbose:
                end = src.find("\n", self.i)
                end = len(src) if end < 0 else end
                self.emit(src[self.i : end], self.i)
                self.i = end
            else:
                self.emit(c, self.i)
                self.i += 1
        if self.stack[0].wrappers:
            if self.stack[-1].verbose:  # a trailing (?x) comment would swallow the closing ')'
                self.emit("\n", len(src))
            self.emit(")" * len(self.stack[0].wrappers), len(src))
        return "".join(self.out), [*self.origin, len(src)]

    # -- escapes --------------------------------------------------------------------------------
    def escape(self, *, in_class: bool) -> None:
        src, start = self.src, self.i
        if start + 1 >= len(src):
            self.emit("\\", start)  # Python reports the dangling backslash
            self.i += 1
            return
        c = src[start + 1]
        if c in "pP":
            raise self.fail(
                "Unicode property classes (\\p{...}, \\P{...}) are Rust regex syntax that Python's re "
                "does not support; write an explicit character class instead",
                start,
            )
        if c in "xuU" and start + 2 < len(src) and src[start + 2] == "{":
            m = _HEX_BRACED.match(src, start + 2)
            if m is None:
                raise self.fail(f"malformed \\{c}{{...}} escape", start)
            value = int(m.group(1), 16)
            if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
                raise self.fail(f"\\{c}{{{m.group(1)}}} is not a Unicode scalar value", start)
            self.emit(f"\\U{value:08X}", start)
            self.i = m.end()
            return
        if not in_class:
            if c == "z":
                self.emit("\\Z", start)
                self.i += 2
                return
            if c == "<":
                self.emit(_WORD_BOUNDARIES["start"], start)
                self.i += 2
                return
            if c == ">":
                self.emit(_WORD_BOUNDARIES["end"], start)
                self.i += 2
                return
            if c == "b" and start + 2 < len(src) and src[start + 2] == "{":
                close = src.find("}", start + 3)
                kind = src[start + 3 : close] if close > 0 else ""
                if kind not in _WORD_BOUNDARIES:
                    raise self.fail("unknown word boundary \\b{...} (expected start, end, start-half, end-half)", start)
                self.emit(_WORD_BOUNDARIES[kind], start)
                self.i = close + 1
                return
        self.emit(src[start : start + 2], start)
        self.i += 2

    # -- character classes ----------------------------------------------------------------------
    def char_class(self) -> None:
        src, open_pos = self.src, self.i
        verbose = self.stack[-1].verbose
        self.emit("[", open_pos)
        self.i += 1
        if self.i < len(src) and src[self.i] == "^":
            self.emit("^", self.i)
            self.i += 1
        if self.i < len(src) and src[self.i] == "]":  # a leading ']' is literal in both dialects
            self.emit("\\]", self.i)
            self.i += 1
        while self.i < len(src):
            c = src[self.i]
            if c == "]":
                self.emit("]", self.i)
                self.i += 1
                return
            if c == "\\":
                self.escape(in_class=True)
                continue
            if c == "[":
                m = _POSIX.match(src, self.i)
                if m is None:
                    raise self.fail(
                        "nested character classes are Rust regex syntax; escape '[' as '\\[' or flatten the class",
                        self.i,
                    )
                if m.group(1) or m.group(2) not in _POSIX_CLASSES:
                    raise self.fail(f"unsupported ASCII class '{m.group(0)}'", self.i)
                self.emit(_POSIX_CLASSES[m.group(2)], self.i)
                self.i = m.end()
                continue
            pair = src[self.i : self.i + 2]
            if pair in ("&&", "--", "~~"):
                raise self.fail(
                    f"'{pair}' inside a character class is a Rust set operation; escape the "
                    "characters (e.g. '\\-') to mean them literally",
                    self.i,
                )
            if c == "|":  # literal in both; escaped so Python does not warn about set union
                self.emit("\\|", self.i)
            elif verbose and c.isspace():  # Rust's x flag ignores whitespace inside classes too
                pass
            else:
                self.emit(c, self.i)
            self.i += 1
        raise self.fail("unterminated character class", open_pos)

    # -- groups and flags -----------------------------------------------------------------------
    def open_group(self) -> None:
        src, start = self.src, self.i
        top = self.stack[-1]
        m = _NAMED_GROUP.match(src, start)
        if m is not None:
            self.emit(f"(?P<{m.group(1)}>", start)
            self.i = m.end()
            self.stack.append(_Group(top.multiline, top.verbose))
            return
        m = _FLAG_GROUP.match(src, start)
        if m is not None and m.group(1):
            flags, terminator = m.group(1), m.group(2)
            multiline, verbose = self.apply_flags(flags, start, top)
            if terminator == ":":
                self.emit(m.group(0), start)
                self.stack.append(_Group(multiline, verbose))
            else:  # bare (?flags): scope it over the rest of the enclosing group
                self.emit(f"(?{flags}:", start)
                top.wrappers.append(flags)
                top.multiline, top.verbose = multiline, verbose
            self.i = m.end()
            return
        if src.startswith("(?#", start):  # Python comment group: copy verbatim
            end = src.find(")", start)
            end = len(src) - 1 if end < 0 else end
            self.emit(src[start : end + 1], start)
            self.i = end + 1
            return
        self.emit("(", start)
        self.i += 1
        self.stack.append(_Group(top.multiline, top.verbose))

    def apply_flags(self, flags: str, position: int, top: _Group) -> tuple[bool, bool]:
        multiline, verbose = top.multiline, top.verbose
        on = True
        for ch in flags:
            if ch == "-":
                on = False
            elif ch in "imsxa" or (ch == "u" and on):
                if ch == "m":
                    multiline = on
                elif ch == "x":
                    verbose = on
            elif ch == "U":
                raise self.fail(
                    "the Rust flag U (swap greed) is not supported; use lazy quantifiers such as '*?'", position
                )
            elif ch == "u":
                raise self.fail("(?-u) is not supported; use (?a) for ASCII-only classes", position)
            else:
                raise self.fail(f"unsupported regex flag {ch!r}", position)
        return multiline, verbose

    def close_group(self) -> None:
        start = self.i
        top = self.stack[-1]
        self.emit(")" * len(top.wrappers), start)
        if len(self.stack) > 1:
            self.stack.pop()
        else:
            top.wrappers.clear()
        self.emit(")", start)  # an unbalanced ')' is left for Python to report
        self.i += 1

    def alternation(self) -> None:
        start = self.i
        top = self.stack[-1]
        self.emit(")" * len(top.wrappers), start)
        self.emit("|", start)
        for flags in top.wrappers:  # flags set by a bare (?x) persist into later branches
            self.emit(f"(?{flags}:", start)
        self.i += 1


def compile_regex(pattern: str) -> re.Pattern[str]:
    """Compile a Rust-style pattern; every failure is a `NamingError` pointing into `pattern`."""
    if not isinstance(pattern, str):
        raise NamingError(f"pattern must be a string, not {type(pattern).__name__}", pattern=str(pattern))
    translated, origin = _Translator(pattern).run()
    try:
        return re.compile(translated)
    except re.error as exc:
        pos = exc.pos
        src_pos = origin[min(pos, len(origin) - 1)] if pos is not None else None
        raise NamingError(f"invalid regex: {exc.msg}", pattern=pattern, position=src_pos) from None
    except (OverflowError, RecursionError) as exc:
        raise NamingError(f"invalid regex: {exc}", pattern=pattern) from None


# ---------------------------------------------------------------------------------------------
# Replacements
# ---------------------------------------------------------------------------------------------

_CAP_LETTERS = re.compile(r"[A-Za-z0-9_]+")
_PY_GROUP_REF = re.compile(r"\\(?:[0-9]|g<)")
_RUST_GROUP_REF = re.compile(r"\$(?:\{[^}]*\}|[A-Za-z0-9_])")


def parse_usize(text: str) -> int | None:
    """Rust's `str::parse::<usize>` on a 64-bit target: '+'? ASCII digits, no overflow; else None."""
    digits = text[1:] if text.startswith("+") else text
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    value = int(digits)
    return value if value <= _USIZE_MAX else None


_ARITH = re.compile(r"([A-Za-z0-9_]+)([+-])([0-9]{1,18})")
"""`${GROUP+N}` / `${GROUP-N}`: index arithmetic on a numeric group."""


@dataclass(frozen=True)
class _Arith:
    """A parsed `${GROUP+N}`: the group (number or name), the signed offset and its spelling."""

    group: int | str
    offset: int
    spelled: str


def _parse_rust_replacement(replacement: str) -> list[str | int | _Arith]:
    """Split a Rust replacement into literal text (str) and group refs (int number or `_Name`).

    Mirrors the regex crate's interpolation: `$$` is `$`; `${...}` takes everything up to `}`;
    `$name` takes the longest `[A-Za-z0-9_]` run; a ref that parses as usize is a number, anything
    else a name; a `$` starting no ref is literal. Backslashes carry no meaning.
    """
    parts: list[str | int | _Arith] = []
    literal: list[str] = []

    def flush() -> None:
        text = "".join(literal)
        literal.clear()
        if text:
            parts.append(text)

    i, n = 0, len(replacement)
    while i < n:
        dollar = replacement.find("$", i)
        if dollar < 0:
            literal.append(replacement[i:])
            break
        literal.append(replacement[i:dollar])
        i = dollar
        if replacement.startswith("$$", i):
            literal.append("$")
            i += 2
            continue
        ref: str | None = None
        end = i + 1
        if i + 1 < n and replacement[i + 1] == "{":
            close = replacement.find("}", i + 2)
            if close >= 0:
                ref, end = replacement[i + 2 : close], close + 1
        else:
            m = _CAP_LETTERS.match(replacement, i + 1)
            if m is not None:
                ref, end = m.group(0), m.end()
        if ref is None:
            literal.append("$")
            i += 1
            continue
        flush()
        arith = _ARITH.fullmatch(ref) if replacement[i + 1] == "{" else None
        if arith is not None:
            group = parse_usize(arith[1])
            offset = int(arith[3]) * (1 if arith[2] == "+" else -1)
            parts.append(_Arith(arith[1] if group is None else group, offset, replacement[i:end]))
        else:
            number = parse_usize(ref)
            parts.append(number if number is not None else _Name(ref))
        i = end
    flush()
    return parts


def _python_refs(replacement: str) -> list[tuple[str | int, str]]:
    """The group references of a Python `re` template (``\\1``, ``\\12``, ``\\g<n>``, ``\\g<name>``),
    as `re` reads them, each with its spelling: ``\\0`` and three octal digits are character escapes."""
    refs: list[tuple[str | int, str]] = []
    i, n = 0, len(replacement)
    while i < n - 1:
        if replacement[i] != "\\":
            i += 1
            continue
        nxt = replacement[i + 1]
        if nxt == "g":
            m = re.match(r"g<([^>]*)>", replacement[i + 1 :])
            if m is not None:
                ref = m.group(1)
                refs.append((int(ref) if ref.isascii() and ref.isdigit() else ref, "\\" + m.group(0)))
                i += 1 + m.end()
                continue
        elif nxt.isascii() and nxt.isdigit() and nxt != "0" and not re.match(r"[0-7]{3}", replacement[i + 1 :]):
            digits = re.match(r"\d\d?", replacement[i + 1 :]).group(0)  # type: ignore[union-attr]
            refs.append((int(digits), "\\" + digits))
            i += 1 + len(digits)
            continue
        i += 2
    return refs


def _has_group(regex: re.Pattern[str], ref: str | int) -> bool:
    return ref <= regex.groups if isinstance(ref, int) else ref in regex.groupindex


def _absent_text(refs: Sequence[tuple[str | int, str]], regex: re.Pattern[str]) -> str:
    """"$2: group 2 does not exist; the pattern has 1 group" (and which are named), for each (ref, spelling)."""
    count = regex.groups
    has = f"the pattern has {count} group{'' if count == 1 else 's'}"
    if regex.groupindex:
        has += " (named: " + ", ".join(regex.groupindex) + ")"
    parts = [f"{spelled}: group {ref if isinstance(ref, int) else repr(ref)} does not exist"
             for ref, spelled in dict.fromkeys(refs)]
    return "; ".join(parts) + f"; {has}"


class _Name(str):
    """A group reference by name (distinguishes it from literal text in a parsed replacement)."""


@dataclass(frozen=True)
class _Ref:
    """A group reference resolved to a group index of the compiled pattern; `offset` (with its
    `spelled` text) for index arithmetic."""

    index: int
    offset: int = 0
    spelled: str = ""


def _shifted(value: str | None, ref: _Ref, name: str) -> str:
    """The group's number moved by `ref.offset` (leading zeros keep the width; see the module doc)."""
    if value is None or not value or not value.isascii() or not value.isdigit():
        shown = "did not take part in the match" if value is None else f"is '{value}', not a number"
        raise IndexArithmeticError(f"{ref.spelled} on tensor '{name}': group {ref.index} {shown}", pattern=name)
    result = int(value) + ref.offset
    if result < 0:
        raise IndexArithmeticError(f"{ref.spelled} on tensor '{name}' gives {result} (group {ref.index} is "
                                   f"'{value}'): an index cannot be negative", pattern=name)
    text = str(result)
    return text.zfill(len(value)) if len(value) > 1 and value[0] == "0" else text


def _resolve_parts(parsed: Sequence[str | int | _Arith], regex: re.Pattern[str]
                   ) -> tuple[list[str | _Ref], list[str]]:
    """A parsed Rust replacement bound to `regex`'s groups: (parts, references to missing groups)."""
    parts: list[str | _Ref] = []
    missing: list[str] = []
    for part in parsed:
        if isinstance(part, _Arith):
            ref = part.group
            index = (ref if ref <= regex.groups else None) if isinstance(ref, int) else regex.groupindex.get(ref)
            if index is None:
                missing.append(part.spelled)  # '${2+1}': shown as written
            else:
                parts.append(_Ref(index, part.offset, part.spelled))
            continue
        if isinstance(part, int):
            index = part if part <= regex.groups else None
        elif isinstance(part, _Name):
            index = regex.groupindex.get(part)
        else:
            parts.append(part)
            continue
        if index is None:
            missing.append(str(part))  # Burn expands these to '' without complaint
        else:
            parts.append(_Ref(index))
    return parts, missing


def _missing_ref(m: str) -> tuple[str | int, str]:
    """(group, spelling) of a reference to a missing group: `2`, `name`, or an arithmetic `${2+1}`."""
    arith = _ARITH.fullmatch(m[2:-1]) if m.startswith("${") and m.endswith("}") else None
    if arith is not None:
        return (int(arith[1]) if arith[1].isdigit() else arith[1]), m
    if m.isdigit():
        return int(m), f"${m}"
    return m, f"${m}" if _CAP_LETTERS.fullmatch(m) else f"${{{m}}}"


def _expand_parts(parts: Sequence[str | _Ref], m: re.Match[str]) -> str:
    out: list[str] = []
    for p in parts:
        if isinstance(p, str):
            out.append(p)
        elif p.offset or p.spelled:
            out.append(_shifted(m.group(p.index), p, m.string))
        else:
            out.append(m.group(p.index) or "")
    return "".join(out)


def expand_replacement(m: re.Match[str], replacement: str) -> str:
    """`replacement` (Rust syntax, index arithmetic included) expanded for match `m`.

    For callers that build their own matches (op output names); a reference to a group the
    pattern lacks is a `NamingError`, a bad index arithmetic an `IndexArithmeticError`."""
    parts, missing = _resolve_parts(_parse_rust_replacement(replacement), m.re)
    if missing:
        refs = [_missing_ref(x) for x in missing]
        raise NamingError(_absent_text(refs, m.re), pattern=m.re.pattern)
    return _expand_parts(parts, m)


def _resolve_syntax(replacement: str, syntax: str, pattern: str) -> Literal["rust", "python"]:
    if syntax in ("rust", "python"):
        return syntax  # type: ignore[return-value]
    if syntax != "auto":
        raise NamingError(f"unknown replacement syntax {syntax!r} (expected rust, python or auto)", pattern=pattern)
    if not _PY_GROUP_REF.search(replacement):
        return "rust"
    if _RUST_GROUP_REF.search(replacement.replace("$$", "")):
        raise NamingError(
            f"replacement {replacement!r} mixes Rust ($1) and Python (\\1) group references; "
            "set syntax to 'rust' or 'python'",
            pattern=pattern,
        )
    return "python"


@dataclass(frozen=True)
class RemapRule:
    """One `(regex, replacement)` pair of a `KeyRemapper`, compiled and validated on creation."""

    pattern: str
    replacement: str
    syntax: ReplacementSyntax = "auto"
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _resolved: Literal["rust", "python"] = field(init=False, repr=False, compare=False)
    _parts: tuple[str | _Ref, ...] = field(init=False, repr=False, compare=False)
    _missing: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        regex = compile_regex(self.pattern)
        if not isinstance(self.replacement, str):
            raise NamingError("replacement must be a string", pattern=self.pattern)
        resolved = _resolve_syntax(self.replacement, self.syntax, self.pattern)
        parts: list[str | _Ref] = []
        missing: list[str] = []
        if resolved == "rust":
            parts, missing = _resolve_parts(_parse_rust_replacement(self.replacement), regex)
        else:
            absent = [(ref, spelled) for ref, spelled in _python_refs(self.replacement) if not _has_group(regex, ref)]
            if absent:  # re would say "invalid group reference 2 at position 8"
                raise NamingError(_absent_text(absent, regex), pattern=self.pattern)
            try:
                regex.sub(self.replacement, "")  # makes re parse and check the template now
            except (re.error, IndexError) as exc:
                raise NamingError(
                    f"invalid Python replacement {self.replacement!r}: {exc}", pattern=self.pattern
                ) from None
        object.__setattr__(self, "_regex", regex)
        object.__setattr__(self, "_resolved", resolved)
        object.__setattr__(self, "_parts", tuple(parts))
        object.__setattr__(self, "_missing", tuple(missing))

    @property
    def regex(self) -> re.Pattern[str]:
        """The compiled (translated) pattern."""
        return self._regex

    @property
    def missing_groups(self) -> tuple[str, ...]:
        """Rust-syntax references to groups the pattern lacks (they expand to '').

        Burn accepts these silently; recipes and ``migrate convert --remap`` refuse them
        (`missing_group_problem`; the classic trap is ``$1_x``, group ``1_x``).
        """
        return self._missing

    def missing_group_problem(self) -> tuple[str, str | None] | None:
        """(message, hint) when the replacement refers to a group the pattern does not have.

        Python-syntax replacements never get here: such a rule does not compile (`NamingError`)."""
        if not self._missing:
            return None
        refs = [_missing_ref(m) for m in self._missing]
        glued = next((m for m in self._missing if re.match(r"\d+\w", m)), None)
        hint = None
        if glued is not None:
            digits = re.match(r"\d+", glued).group(0)  # type: ignore[union-attr]
            rest = glued[len(digits):]
            hint = f"write ${{{digits}}}{rest} for group {digits} followed by '{rest}'"
        return _absent_text(refs, self._regex), hint

    def apply(self, name: str) -> str:
        """Replace every non-overlapping match in `name`, iterating matches the way Rust does."""
        regex = self._regex
        pieces: list[str] = []
        last = pos = 0
        last_end: int | None = None
        n = len(name)
        while pos <= n:
            m = regex.search(name, pos)
            if m is None:
                break
            if m.start() == m.end() == last_end:
                # Rust skips an empty match touching the previous match and searches one further on.
                if pos >= n:
                    break
                m = regex.search(name, pos + 1)
                if m is None:
                    break
            pieces.append(name[last : m.start()])
            pieces.append(self._expand(m))
            last = pos = last_end = m.end()
        if not pieces:
            return name
        pieces.append(name[last:])
        return "".join(pieces)

    def _expand(self, m: re.Match[str]) -> str:
        if self._resolved == "python":
            return m.expand(self.replacement)
        return _expand_parts(self._parts, m)


class KeyRemapper:
    """Ordered remap rules; every rule applies to every name, each seeing the previous output."""

    def __init__(self, rules: Iterable[RemapRule | tuple[str, str]] = ()) -> None:
        self._rules: list[RemapRule] = []
        for rule in rules:
            if isinstance(rule, RemapRule):
                self._rules.append(rule)
            else:
                self.add_pattern(*rule)

    def add_pattern(self, pattern: str, replacement: str, syntax: ReplacementSyntax = "auto") -> KeyRemapper:
        """Append a rule (compiled now, so a bad regex fails here); returns self for chaining."""
        self._rules.append(RemapRule(pattern, replacement, syntax))
        return self

    @property
    def rules(self) -> tuple[RemapRule, ...]:
        return tuple(self._rules)

    def __len__(self) -> int:
        return len(self._rules)

    def remap_name(self, name: str) -> str:
        """`name` after all rules, in insertion order (chaining, not first-match-wins)."""
        for rule in self._rules:
            name = rule.apply(name)
        return name

    def remap(self, names: Iterable[str]) -> list[tuple[str, str]]:
        """`(new, original)` for every name, input order kept; unchanged names included."""
        return [(self.remap_name(name), name) for name in names]


# ---------------------------------------------------------------------------------------------
# Contiguous indices, enum variants, collisions
# ---------------------------------------------------------------------------------------------


_MAY_HAVE_INDEX = re.compile(r"(?:^|\.)\+?[0-9]")
"""A segment that parse_usize accepts starts like this; names without one are left alone quickly."""


def contiguous_names(names: list[str]) -> list[str]:
    """Every numeric path segment renumbered to 0, 1, 2, … per position key (spec §4.2), in input order.

    Closes the gaps PyTorch's `nn.Sequential` leaves for parameter-free layers. The key of an index
    is the *original* prefix before it, so renumbering one level never changes another's key. An
    unchanged name is the same object.

    Why per prefix: the sibling tensors of a model share most of their path (``h.7.attn.c_attn`` is
    the head of both ``.weight`` and ``.bias``), so each distinct path prefix is split, parsed and
    renumbered once, not once per tensor and segment.
    """
    seen: dict[str, set[int]] = {}
    # prefix -> (parent prefix or None at the root, index value of its last segment or None)
    nodes: dict[str, tuple[str | None, int | None]] = {}
    may_have_index = _MAY_HAVE_INDEX.search
    respelled = False
    for name in names:
        if may_have_index(name) is None:
            continue
        path = name
        while path not in nodes:
            head, sep, last = path.rpartition(".")
            value = parse_usize(last) if last and (last[0].isdigit() or last[0] == "+") else None
            if value is not None:
                seen.setdefault(head + "." if sep else "", set()).add(value)
                respelled = respelled or last != str(value)  # '01', '+2': renumbering rewrites them
            if not sep:
                nodes[path] = (None, value)
                break
            nodes[path] = (head, value)
            path = head
    if not respelled and all(max(values) == len(values) - 1 for values in seen.values()):
        return list(names)  # every key already numbers 0..n-1 (distinct values): nothing moves
    tables = {key: {v: new for new, v in enumerate(sorted(values))} for key, values in seen.items()}
    renamed: dict[str, str] = {}

    def rename(path: str) -> str:
        """`path` with its indices renumbered (memoised; iterative up to the first known ancestor)."""
        chain: list[str] = []
        while path not in renamed:
            chain.append(path)
            parent = nodes[path][0]
            if parent is None:
                break
            path = parent
        for p in reversed(chain):
            parent, value = nodes[p]
            if parent is None:
                new = p if value is None else str(tables[""][value])
                renamed[p] = p if new == p else new
            else:
                new_parent = renamed[parent]
                if value is None:
                    renamed[p] = p if new_parent is parent else f"{new_parent}.{p.rpartition('.')[2]}"
                else:
                    new = f"{new_parent}.{tables[parent + '.'][value]}"
                    renamed[p] = p if new == p else new
        return renamed[chain[0]] if chain else renamed[path]

    return [rename(name) if name in nodes else name for name in names]


def _is_variant_segment(segment: str) -> bool:
    """Burn's CamelCase heuristic for an enum variant name (e.g. `BaseConv`)."""
    return (
        bool(segment)
        and segment[0].isupper()
        and len(segment.encode("utf-8")) > 1
        and any(ch.islower() for ch in segment[1:])
    )


def strip_enum_variant(path: str) -> str | None:
    """`path` without its first inner CamelCase segment, or None when it has none (spec §5.8 step 1).

    Used to suggest `feature.weight` for a missing `feature.BaseConv.weight`.
    """
    segments = path.split(".")
    for i in range(1, len(segments) - 1):
        if _is_variant_segment(segments[i]):
            return ".".join(segments[:i] + segments[i + 1 :])
    return None


def find_collisions(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """New names that two or more originals map onto, with those originals in input order.

    Burn lets the later tensor win silently; migrator reports instead.
    """
    by_new: dict[str, list[str]] = {}
    for new, original in pairs:
        by_new.setdefault(new, []).append(original)
    return {new: originals for new, originals in by_new.items() if len(originals) > 1}
