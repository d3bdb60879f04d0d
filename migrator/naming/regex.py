"""Rust `regex` spellings translated to Python `re`, so patterns copied from Burn match the same.

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["NamingError", "compile_regex"]


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
