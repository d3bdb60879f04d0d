"""Remap rules: a regex and a replacement, applied in order to every tensor name,
as Burn's KeyRemapper does (docs/burn-compatibility.md, "Names").

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

from .indices import parse_usize
from .regex import NamingError, Regex, RegexMatch, compile_regex, not_text

__all__ = ["MAX_NAME_GROWTH", "IndexArithmeticError", "KeyRemapper", "NameTooLongError", "RemapRule",
           "ReplacementSyntax", "expand_replacement"]

ReplacementSyntax = Literal["rust", "python", "auto"]


class IndexArithmeticError(NamingError):
    """``${1+12}`` / ``${1-12}`` met a group that is not a number, or gave a negative index."""

    def __str__(self) -> str:
        return self.message  # names the tensor already


_CAP_LETTERS = re.compile(r"[A-Za-z0-9_]+")
_PY_GROUP_REF = re.compile(r"\\(?:[0-9]|g<)")
_RUST_GROUP_REF = re.compile(r"\$(?:\{[^}]*\}|[A-Za-z0-9_])")


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


_PY_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}
_OCTAL = "01234567"


def _parse_python_template(template: str, pattern: str, spelled: list[tuple[str | int, str]] | None = None
                           ) -> list[str | int | _Name]:
    """A Python `re` template (``\\1``, ``\\12``, ``\\g<n>``, ``\\g<name>``, ``\\n``...) split as `re` reads
    it into literal text and group references (their spelling kept in `_PY_SPELLED`): ``\\0`` and
    three octal digits are character escapes, an escaped ASCII letter without a meaning is an error."""
    parts: list[str | int | _Name] = []
    literal: list[str] = []

    def bad(why: str) -> NamingError:
        return NamingError(f"invalid Python replacement {template!r}: {why}", pattern=pattern)

    def ref(value: int | _Name, start: int, end: int) -> None:
        if spelled is not None:
            spelled.append((value if isinstance(value, int) else str(value), template[start:end]))
        if literal:
            parts.append("".join(literal))
            literal.clear()
        parts.append(value)

    i, n = 0, len(template)
    while i < n:
        c = template[i]
        if c != "\\":
            literal.append(c)
            i += 1
            continue
        if i + 1 >= n:
            raise bad("bad escape (end of pattern)")
        nxt = template[i + 1]
        if nxt == "g":
            close = template.find(">", i + 3) if template.startswith("<", i + 2) else -1
            if close < 0:
                raise bad("\\g needs <number> or <name>")
            name = template[i + 3 : close]
            if name.isascii() and name.isdigit():
                ref(int(name), i, close + 1)
            elif name.isidentifier():
                ref(_Name(name), i, close + 1)
            else:
                raise bad(f"bad character in group name {name!r}")
            i = close + 1
        elif nxt == "0":
            digits = nxt
            while len(digits) < 3 and i + 1 + len(digits) < n and template[i + 1 + len(digits)] in _OCTAL:
                digits += template[i + 1 + len(digits)]
            literal.append(chr(int(digits, 8)))
            i += 1 + len(digits)
        elif nxt.isascii() and nxt.isdigit():
            three = template[i + 1 : i + 4]
            if len(three) == 3 and all(d in _OCTAL for d in three):
                if int(three, 8) > 0o377:
                    raise bad(f"octal escape value \\{three} outside of range 0-0o377")
                literal.append(chr(int(three, 8)))
                i += 4
                continue
            digits = nxt + (template[i + 2] if i + 2 < n and template[i + 2].isascii() and template[i + 2].isdigit()
                            else "")
            ref(int(digits), i, i + 1 + len(digits))
            i += 1 + len(digits)
        elif nxt in _PY_ESCAPES:
            literal.append(_PY_ESCAPES[nxt])
            i += 2
        elif nxt.isascii() and nxt.isalpha():
            raise bad(f"bad escape \\{nxt}")
        else:
            literal.append("\\" + nxt)
            i += 2
    if literal:
        parts.append("".join(literal))
    return parts


def _has_group(regex: Regex, ref: str | int) -> bool:
    return ref <= regex.groups if isinstance(ref, int) else ref in regex.groupindex


def _absent_text(refs: Sequence[tuple[str | int, str]], regex: Regex) -> str:
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
    if len(value.lstrip("0")) > 20:  # beyond 64 bits (and int() refuses 4,300+ digits)
        raise IndexArithmeticError(f"{ref.spelled} on tensor '{name[:200]}': group {ref.index} is a number of "
                                   f"{len(value)} digits; index arithmetic takes indices below 2^64", pattern=name)
    result = int(value.lstrip("0") or "0") + ref.offset
    if result < 0:
        raise IndexArithmeticError(f"{ref.spelled} on tensor '{name}' gives {result} (group {ref.index} is "
                                   f"'{value}'): an index cannot be negative", pattern=name)
    text = str(result)
    return text.zfill(len(value)) if len(value) > 1 and value[0] == "0" else text


def _resolve_parts(parsed: Sequence[str | int | _Arith], regex: Regex
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


MAX_NAME_GROWTH = 65_536
"""Characters a name may grow by through its remap rules (all of them, in turn) or an op's output
name: `$1$1` doubles a name, a few such rules chained would make gigabytes of it. Checked while a
replacement is expanded and between rules, so no longer name is ever built."""


class NameTooLongError(NamingError):
    """A remap or output name would grow past `MAX_NAME_GROWTH` characters more than its input."""

    def __str__(self) -> str:
        return self.message  # names the tensor already


def _too_long(name: str, most: int) -> NameTooLongError:
    shown = name if len(name) <= 80 else name[:80] + "..."
    return NameTooLongError(f"renaming '{shown}' would make a name of more than {most:,} characters (a name may "
                            f"grow by at most {MAX_NAME_GROWTH:,} through its rules)", pattern="")


def _expand_parts(parts: Sequence[str | _Ref], m: RegexMatch, most: int | None = None) -> str:
    """The replacement for match `m`; `most`: the characters it may have (else `NameTooLongError`)."""
    if most is None:
        most = len(m.string) + MAX_NAME_GROWTH
    out: list[str] = []
    size = 0
    for p in parts:
        if isinstance(p, str):
            piece = p
        elif p.offset or p.spelled:
            piece = _shifted(m.group(p.index), p, m.string)
        else:
            piece = m.group(p.index) or ""
        size += len(piece)
        if size > most:
            raise _too_long(m.string, most)
        out.append(piece)
    return "".join(out)


def expand_replacement(m: RegexMatch, replacement: str) -> str:
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
    _regex: Regex = field(init=False, repr=False, compare=False)
    _resolved: Literal["rust", "python"] = field(init=False, repr=False, compare=False)
    _parts: tuple[str | _Ref, ...] = field(init=False, repr=False, compare=False)
    _missing: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        regex = compile_regex(self.pattern)
        if not isinstance(self.replacement, str):
            raise NamingError("replacement must be a string", pattern=self.pattern)
        bad = not_text(self.replacement)
        if bad is not None:
            raise NamingError(f"replacement {bad}", pattern=self.pattern)
        resolved = _resolve_syntax(self.replacement, self.syntax, self.pattern)
        parts: list[str | _Ref] = []
        missing: list[str] = []
        if resolved == "rust":
            parts, missing = _resolve_parts(_parse_rust_replacement(self.replacement), regex)
        else:
            refs: list[tuple[str | int, str]] = []
            parsed = _parse_python_template(self.replacement, self.pattern, refs)
            absent = [(ref, spelled) for ref, spelled in refs if not _has_group(regex, ref)]
            if absent:  # re would say "invalid group reference 2 at position 8"
                raise NamingError(_absent_text(absent, regex), pattern=self.pattern)
            parts, _ = _resolve_parts(parsed, regex)
        object.__setattr__(self, "_regex", regex)
        object.__setattr__(self, "_resolved", resolved)
        object.__setattr__(self, "_parts", tuple(parts))
        object.__setattr__(self, "_missing", tuple(missing))

    @property
    def regex(self) -> Regex:
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

    def apply(self, name: str, most: int | None = None) -> str:
        """Replace every non-overlapping match in `name`, iterating matches the way Rust does. `most`:
        the characters the result may have (default: `name`'s plus `MAX_NAME_GROWTH`), checked as it
        is built (`NameTooLongError`)."""
        regex = self._regex
        if most is None:
            most = len(name) + MAX_NAME_GROWTH
        pieces: list[str] = []
        size = 0
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
            size += m.start() - last
            pieces.append(_expand_parts(self._parts, m, most - size))
            size += len(pieces[-1])
            last = pos = last_end = m.end()
        if not pieces:
            return name
        if size + n - last > most:
            raise _too_long(name, most)
        pieces.append(name[last:])
        return "".join(pieces)


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
        """`name` after all rules, in insertion order (chaining, not first-match-wins); it may grow by
        at most `MAX_NAME_GROWTH` characters through all of them."""
        most = len(name) + MAX_NAME_GROWTH
        for rule in self._rules:
            name = rule.apply(name, most)
        return name

    def remap(self, names: Iterable[str]) -> list[tuple[str, str]]:
        """`(new, original)` for every name, input order kept; unchanged names included."""
        return [(self.remap_name(name), name) for name in names]
