"""User regexes (remaps, filters, ops, module rules), run on RE2: linear time, Burn's dialect.

Engine
------
Every pattern a user writes is compiled by RE2 (the `google-re2` package), whose matching time is
linear in the length of the name, whatever the pattern: ``(a+)+$`` on a 31-character name or
``(.*)\\.weight$`` on a 60,000-segment one cost what one pass over the name costs. A backtracking
engine (Python's ``re``) can take exponential time on the first and quadratic on the second. RE2's
dialect is nearly the one of Rust's ``regex`` crate, which Burn's ``KeyRemapper`` uses, because
both deliberately leave out the constructs that need backtracking.

Dialect
-------
Rust ``regex`` syntax, as Burn reads it. Spellings RE2 lacks are translated:

* ``\\u{..}``, ``\\U{..}``, ``\\uXXXX``, ``\\UXXXXXXXX`` become ``\\x{..}``;
* ``\\d``, ``\\w``, ``\\s`` and their negations (outside a class; ``\\d``, ``\\w``, ``\\s`` inside
  one) are Unicode-aware as in Rust (RE2's are ASCII); ``(?a)`` (Python's flag) keeps them ASCII;
* ``(?x)`` (whitespace and ``#`` comments ignored) is applied here, RE2 having no such flag;
* Python spellings accepted before RE2 keep working: ``\\Z`` (end of text), ``(?P<name>..)``,
  ``(?#comment)``.

``$`` matches only at the very end of the name (not before a trailing newline), as in Rust; under
``(?m)`` at the end of each line.

Refused, with a `NamingError` that says why and where: look-around (``(?=``, ``(?!``, ``(?<=``,
``(?<!``) and back-references (``\\1``, ``(?P=name)``, ``\\k<name>``) -- neither RE2 nor Rust has
them, so no linear-time engine can run them; Rust's start- and end-of-word assertions ``\\<``, ``\\>``,
``\\b{start}`` and friends (RE2 has only ``\\b``, and it is ASCII-only); nested classes
and class set operations (``&&``, ``--``, ``~~``); the flags ``R`` and ``-u``; a counted repetition
above 1,000 (RE2's limit) and patterns whose compiled program exceeds RE2's memory budget.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

import re2

__all__ = ["MAX_CAPTURES", "MAX_GROUPS", "MAX_PATTERN_CHARS", "NamingError", "Regex", "RegexMatch", "compile_regex",
           "not_text"]


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

# Rust's Unicode Perl classes (RE2's are ASCII): as class items, and whole for the negations.
_UNICODE_ITEMS = {"d": "\\p{Nd}", "w": "\\p{L}\\p{M}\\p{Nd}\\p{Pc}", "s": "\\s\\p{Z}\\x{85}"}
_UNICODE_NEGATED = {"D": "[^\\p{Nd}]", "W": "[^\\p{L}\\p{M}\\p{Nd}\\p{Pc}]", "S": "[^\\s\\p{Z}\\x{85}]"}

_NO_LOOKAROUND = ("needs look-around, which neither RE2 (migrator's linear-time regex engine) nor Burn's "
                  "Rust regex has")
_NO_BACKREFERENCE = ("back-references need a backtracking engine, which neither RE2 (migrator's linear-time "
                     "regex engine) nor Burn's Rust regex is; match the text again explicitly instead")

_FLAG_GROUP = re.compile(r"\(\?([A-Za-z-]*)([:)])")
_NAMED_GROUP = re.compile(r"\(\?P?<([^>=!]*)>")
_POSIX = re.compile(r"\[:(\^?)([a-z]*):\]")
_HEX_BRACED = re.compile(r"\{([0-9A-Fa-f]{1,8})\}")
_HEX_FIXED = {"x": 2, "u": 4, "U": 8}


@dataclass
class _Group:
    """Flag state of one open group."""

    verbose: bool
    ascii: bool
    opened_at: int = -1


class _Translator:
    """Single pass over a Rust-style pattern, emitting RE2 text and a map back to source offsets."""

    def __init__(self, pattern: str) -> None:
        self.src = pattern
        self.i = 0
        self.out: list[str] = []
        self.origin: list[int] = []
        self.stack: list[_Group] = [_Group(verbose=False, ascii=False)]
        self.names: set[str] = set()
        self.groups = 0  # groups opened, capturing or not (`MAX_GROUPS`)

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
                if len(self.stack) == 1:
                    raise self.fail("invalid regex: unbalanced ')', no group is open", self.i)
                self.stack.pop()
                self.emit(")", self.i)
                self.i += 1
            elif top.verbose and c.isspace():
                self.i += 1
            elif top.verbose and c == "#":
                end = src.find("\n", self.i)
                self.i = len(src) if end < 0 else end
            else:
                self.emit(c, self.i)
                self.i += 1
        if len(self.stack) > 1:
            raise self.fail("invalid regex: missing ), unterminated group", self.stack[-1].opened_at)
        return "".join(self.out), [*self.origin, len(src)]

    # -- escapes --------------------------------------------------------------------------------
    def escape(self, *, in_class: bool) -> None:
        src, start = self.src, self.i
        if start + 1 >= len(src):
            raise self.fail("invalid regex: the pattern ends with a lone backslash", start)
        c = src[start + 1]
        if c in _HEX_FIXED:
            self.code_point(c, start)
            return
        if c in "123456789" or (c == "k" and src.startswith("<", start + 2)):
            raise self.fail(_NO_BACKREFERENCE, start)
        if (c in "<>" or (c == "b" and src.startswith("{", start + 2))) and not in_class:
            raise self.fail(f"{src[start:start + 2]}{'{...}' if c == 'b' else ''}: RE2 (migrator's linear-time "
                            "regex engine) has no start- or end-of-word assertion; use \\b", start)
        if c == "Z" and not in_class:  # Python's end of text
            self.emit("\\z", start)
        elif not self.stack[-1].ascii and in_class and c in _UNICODE_ITEMS:
            self.emit(_UNICODE_ITEMS[c], start)
        elif not self.stack[-1].ascii and not in_class and c in _UNICODE_ITEMS:
            self.emit("[" + _UNICODE_ITEMS[c] + "]", start)
        elif not self.stack[-1].ascii and not in_class and c in _UNICODE_NEGATED:
            self.emit(_UNICODE_NEGATED[c], start)
        else:
            self.emit(src[start : start + 2], start)
        self.i = start + 2

    def code_point(self, c: str, start: int) -> None:
        src = self.src
        if src.startswith("{", start + 2):
            m = _HEX_BRACED.match(src, start + 2)
            if m is None:
                raise self.fail(f"malformed \\{c}{{...}} escape", start)
            digits, end = m.group(1), m.end()
        else:
            width = _HEX_FIXED[c]
            digits, end = src[start + 2 : start + 2 + width], start + 2 + width
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"\\{c} takes {width} hex digits or {{...}}", start)
        value = int(digits, 16)
        if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
            raise self.fail(f"\\{c}{{{digits}}} is not a Unicode scalar value", start)
        self.emit(f"\\x{{{value:X}}}", start)
        self.i = end

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
                        "nested character classes are Rust regex syntax RE2 lacks; escape '[' as '\\[' or "
                        "flatten the class", self.i)
                if m.group(2) not in _POSIX_CLASSES:
                    raise self.fail(f"unknown ASCII class '{m.group(0)}'", self.i)
                self.emit(m.group(0), self.i)  # RE2 reads [:alpha:] and [:^alpha:] as Rust does
                self.i = m.end()
                continue
            pair = src[self.i : self.i + 2]
            if pair in ("&&", "--", "~~"):
                raise self.fail(
                    f"'{pair}' inside a character class is a Rust set operation RE2 lacks; escape the "
                    "characters (e.g. '\\-') to mean them literally, or write the resulting class",
                    self.i,
                )
            if not (verbose and c.isspace()):  # Rust's x flag ignores whitespace inside classes too
                self.emit(c, self.i)
            self.i += 1
        raise self.fail("unterminated character class", open_pos)

    # -- groups and flags -----------------------------------------------------------------------
    def open_group(self) -> None:
        src, start = self.src, self.i
        top = self.stack[-1]
        self.groups += 1
        for opener, what in (("(?=", "(?=...) look-ahead"), ("(?!", "(?!...) negative look-ahead"),
                             ("(?<=", "(?<=...) look-behind"), ("(?<!", "(?<!...) negative look-behind")):
            if src.startswith(opener, start):
                raise self.fail(f"{what} {_NO_LOOKAROUND}", start)
        if src.startswith("(?P=", start):
            raise self.fail(_NO_BACKREFERENCE, start)
        if src.startswith("(?>", start):
            raise self.fail("atomic groups (?>...) are not regex syntax Rust or RE2 read", start)
        m = _NAMED_GROUP.match(src, start)
        if m is not None:
            if m.group(1) in self.names:
                raise self.fail(f"duplicate group name {m.group(1)!r}", start)
            self.names.add(m.group(1))
            self.emit(f"(?P<{m.group(1)}>", start)
            self.i = m.end()
            self.stack.append(_Group(top.verbose, top.ascii, start))
            return
        m = _FLAG_GROUP.match(src, start)
        if m is not None and m.group(1):
            flags, terminator = m.group(1), m.group(2)
            kept, verbose, ascii_ = self.apply_flags(flags, start, top)
            if terminator == ":":
                self.emit(f"(?{kept}:" if kept.strip("-") else "(?:", start)
                self.stack.append(_Group(verbose, ascii_, start))
            else:  # a bare (?flags) holds to the end of the enclosing group, in Rust and in RE2 alike
                if kept.strip("-"):
                    self.emit(f"(?{kept})", start)
                top.verbose, top.ascii = verbose, ascii_
            self.i = m.end()
            return
        if src.startswith("(?#", start):  # Python's comment group; RE2 has none
            end = src.find(")", start)
            if end < 0:
                raise self.fail("unterminated (?#...) comment", start)
            self.i = end + 1
            return
        self.emit("(", start)
        self.i += 1
        self.stack.append(_Group(top.verbose, top.ascii, start))

    def apply_flags(self, flags: str, position: int, top: _Group) -> tuple[str, bool, bool]:
        """The flags RE2 is given (i, m, s, U) and the verbose and ASCII state this group gets."""
        verbose, ascii_ = top.verbose, top.ascii
        kept: list[str] = []
        on = True
        for ch in flags:
            if ch == "-":
                on = False
                kept.append("-")
            elif ch in "imsU":
                kept.append(ch)
            elif ch == "x":
                verbose = on
            elif ch == "a":
                ascii_ = on
            elif ch == "u":
                if not on:
                    raise self.fail("(?-u) is not supported; use (?a) for ASCII-only classes", position)
            elif ch == "R":
                raise self.fail("the Rust flag R (CRLF mode) is not supported", position)
            else:
                raise self.fail(f"unsupported regex flag {ch!r}", position)
        text = "".join(kept)
        return (text[:-1] if text.endswith("-") else text), verbose, ascii_


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # RE2 would print every refused pattern to stderr itself
    return options


_OPTIONS = _options()


class RegexMatch:
    """One match of a `Regex` in a name: Python `re.Match`'s reading methods, offsets in characters."""

    __slots__ = ("_spans", "re", "string")

    def __init__(self, regex: Regex, string: str, spans: Sequence[tuple[int, int]]) -> None:
        self.re = regex
        self.string = string
        self._spans = spans

    def _index(self, group: int | str) -> int:
        if isinstance(group, str):
            try:
                return self.re.groupindex[group]
            except KeyError:
                raise IndexError(f"no such group {group!r}") from None
        if not 0 <= group <= self.re.groups:
            raise IndexError(f"no such group {group}")
        return group

    def span(self, group: int | str = 0) -> tuple[int, int]:
        return self._spans[self._index(group)]

    def start(self, group: int | str = 0) -> int:
        return self.span(group)[0]

    def end(self, group: int | str = 0) -> int:
        return self.span(group)[1]

    def group(self, group: int | str = 0) -> str | None:
        start, end = self.span(group)
        return None if start < 0 else self.string[start:end]

    def __getitem__(self, group: int | str) -> str | None:
        return self.group(group)

    def groups(self) -> tuple[str | None, ...]:
        return tuple(self.group(g) for g in range(1, self.re.groups + 1))

    def groupdict(self) -> dict[str, str | None]:
        return {name: self.group(index) for name, index in self.re.groupindex.items()}


class Regex:
    """A compiled user pattern: `search`, `match` and `fullmatch` as Python's `re` has them, in linear time.

    Names are matched as UTF-8 bytes; the last name's bytes (and, for a non-ASCII name, its
    character offsets) are kept, so the many searches of one name (a remap's every match) encode it
    once rather than once per match."""

    def __init__(self, source: str, translated: str, compiled: re2._Regexp) -> None:
        self.source = source  # what the user wrote
        self.pattern = translated  # what RE2 was given
        self._re2 = compiled  # given bytes: its str path would encode the whole name again on every call
        self.groups: int = compiled.groups
        self.groupindex: dict[str, int] = dict(compiled.groupindex)
        self._last: tuple[str, bytes, list[int] | None] = ("", b"", None)

    def __repr__(self) -> str:
        return f"Regex({self.source!r})"

    def _encoded(self, text: str) -> tuple[bytes, list[int] | None]:
        last = self._last  # one tuple read: threads sharing a pattern never see half an update
        if last[0] is text:
            return last[1], last[2]
        data = text.encode("utf-8", "surrogatepass")
        offsets = None
        if len(data) != len(text):  # byte offset of every character (and of the end)
            offsets = [0] * (len(text) + 1)
            at = 0
            for k, ch in enumerate(text):
                offsets[k] = at
                at += len(ch.encode("utf-8", "surrogatepass"))
            offsets[len(text)] = at
        self._last = (text, data, offsets)
        return data, offsets

    def _run(self, how: str, text: str, pos: int, endpos: int | None) -> RegexMatch | None:
        if not isinstance(text, str):
            raise TypeError(f"a name must be a string, not {type(text).__name__}")
        n = len(text)
        pos = max(0, min(pos, n))
        endpos = n if endpos is None else max(0, min(endpos, n))
        if pos > endpos:
            return None
        data, offsets = self._encoded(text)
        if offsets is not None:
            pos, endpos = offsets[pos], offsets[endpos]
        found = getattr(self._re2, how)(data, pos, endpos)
        if found is None:
            return None
        spans = [found.span(g) for g in range(self.groups + 1)]
        if offsets is not None:  # every span lands on a character boundary: a search in the name's offsets
            # (log n per span; a map built per match made a remap of a long non-ASCII name quadratic)
            spans = [(-1, -1) if s < 0 else (bisect_left(offsets, s), bisect_left(offsets, e)) for s, e in spans]
        return RegexMatch(self, text, spans)

    def search(self, text: str, pos: int = 0, endpos: int | None = None) -> RegexMatch | None:
        return self._run("search", text, pos, endpos)

    def match(self, text: str, pos: int = 0, endpos: int | None = None) -> RegexMatch | None:
        return self._run("match", text, pos, endpos)

    def fullmatch(self, text: str, pos: int = 0, endpos: int | None = None) -> RegexMatch | None:
        return self._run("fullmatch", text, pos, endpos)


def not_text(text: str) -> str | None:
    """Why `text` (a pattern or a replacement) is not Unicode text, or None: a command-line argument of
    bytes that are not UTF-8 arrives holding surrogate escapes, which no name can hold."""
    for k, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            what = f"byte 0x{ord(ch) - 0xDC00:02x}" if ord(ch) >= 0xDC80 else "a surrogate"
            return f"not UTF-8 text (character {k} is {what})"
    return None


MAX_PATTERN_CHARS = 4_096
"""Characters of one pattern: matching costs up to (compiled pattern) x (name), so both are bounded
(names by `Limits.max_name_chars`)."""
MAX_GROUPS = 256
"""Groups of one pattern, capturing or not (each adds states to what a match walks)."""
MAX_CAPTURES = 64
"""Capturing groups of one pattern: each is tracked for every character of a name a match walks (a
pattern of 64 on a 65,536-character name takes ~0.5 s; 250 took 8 s)."""


def compile_regex(pattern: str) -> Regex:
    """Compile a Rust-style pattern for RE2; every failure is a `NamingError` pointing into `pattern`."""
    if not isinstance(pattern, str):
        raise NamingError(f"pattern must be a string, not {type(pattern).__name__}", pattern=str(pattern))
    bad = not_text(pattern)
    if bad is not None:
        raise NamingError(bad, pattern=pattern.encode("utf-8", "backslashreplace").decode("ascii", "replace"))
    if len(pattern) > MAX_PATTERN_CHARS:
        raise NamingError(f"a pattern of {len(pattern):,} characters, over the {MAX_PATTERN_CHARS:,} a pattern may "
                          "have", pattern=pattern[:60] + "...")
    translator = _Translator(pattern)
    translated, origin = translator.run()
    shown = pattern if len(pattern) <= 200 else pattern[:200] + "..."
    if translator.groups > MAX_GROUPS:
        raise NamingError(f"{translator.groups:,} groups, over the {MAX_GROUPS} a pattern may have", pattern=shown)
    try:
        compiled = re2.compile(translated, _OPTIONS)
    except re2.error as exc:
        detail = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        # RE2 names the piece it stopped at ("missing ): (abc", "bad repetition operator: **"), not where
        reason, _, piece = detail.partition(": ")
        at = translated.find(piece) if piece else -1
        position = origin[at] if at >= 0 else None
        if at >= 0:  # the piece as the user wrote it, not as translated
            detail = f"{reason}: {pattern[origin[at]:origin[at + len(piece)]]}"
        raise NamingError(f"invalid regex: {_said(detail)}", pattern=pattern, position=position) from None
    if compiled.groups > MAX_CAPTURES:
        raise NamingError(f"{compiled.groups:,} capturing groups, over the {MAX_CAPTURES} a pattern may have (write "
                          "(?:...) for a group that captures nothing)", pattern=shown)
    return Regex(pattern, translated, compiled)


def _said(detail: str) -> str:
    """RE2's reason, with the limits it names said in the user's terms."""
    if "repetition size" in detail:
        m = re.search(r"\{(\d+)(?:,(\d*))?\}", detail)
        if m is not None and m.group(2) and int(m.group(2)) < int(m.group(1)):
            return detail + " (min repeat greater than max repeat)"
        return detail + " (a counted repetition takes at most 1000)"
    if "pattern too large" in detail:
        return detail + " (the compiled pattern exceeds RE2's memory budget; simplify it)"
    return detail
