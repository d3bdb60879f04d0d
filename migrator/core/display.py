"""Text for a terminal: untrusted strings made literal, sizes and counts, tables that fit.

Names, metadata, scalar names and paths come from files anyone can write. On a terminal such a
string could carry escape sequences (ESC, OSC 52 clipboard writes, CSI clear-screen, BEL, C1
controls), bidi overrides that reorder what is shown, or Rich markup (`[/bold]`). Everything that
prints text from a file goes through `escape()` first and never through Rich markup, so what is
shown is the string itself, its unprintable characters written as `\\x1b`, `\\u202e`, ...
JSON output is not escaped this way: `json.dumps` already writes every control character as
`\\u001b` and a reader gets the exact string back.

Both kinds of output show URLs redacted (`remote.redact`: user info as `***@`, a query such as a
presigned signature or a SAS token as `?***`): `escape` for text and `json_text` for JSON documents
(stdout, reports, HTML pages) are the two ways out, so a credential in a URL reaches no output.
"""

from __future__ import annotations

import json
import os
import sys
import unicodedata
from collections.abc import Collection, Sequence
from typing import Any, TextIO

from .redact import redact

__all__ = [
    "clip_words",
    "count",
    "escape",
    "fit_table",
    "human_bytes",
    "json_text",
    "print_json",
    "print_table",
    "shortened",
    "terminal_width",
    "wrap",
    "write_lines",
]


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape(text: object, *, keep_newlines: bool = False) -> str:
    """`text` with every character Python does not call printable written as an escape.

    Unprintable means the Unicode categories Cc (C0, DEL, C1), Cf (bidi overrides and isolates,
    zero-width characters), Cs (lone surrogates, which would also fail to encode), Co, Cn and
    the separators other than the space (line/paragraph separators, no-break spaces).
    `keep_newlines` keeps `\\n` for messages migrator lays out in lines itself; a newline inside
    a name embedded in such a message can then start a line, but never an escape sequence.
    Backslashes are kept as they are (regex patterns stay readable): the exact string is in `--json`.
    """
    s = redact(text if isinstance(text, str) else str(text))
    if s.isprintable():  # the common case, checked in C
        return s
    out = []
    for ch in s:
        if ch.isprintable() or (keep_newlines and ch == "\n"):
            out.append(ch)
        else:
            out.append(_escape_char(ch))
    return "".join(out)


def shortened(text: str, most: int = 200) -> str:
    """`text` cut in the middle when longer than `most` characters, saying how much was left out."""
    if len(text) <= most:
        return text
    head, tail = most * 2 // 3, most // 6
    return f"{text[:head]}...({len(text) - head - tail:,} characters)...{text[len(text) - tail:]}"


def clip_words(message: str, most: int = 300) -> str:
    """An error message with every space-free run longer than `most` characters (a 60,000-segment
    tensor name, a path) `shortened`, so that one message stays a readable line; `--json` keeps them whole."""
    if len(message) <= most:
        return message
    return " ".join(shortened(word, most) for word in message.split(" "))


def json_text(doc: Any, *, indent: int | None = 2, **kwargs: Any) -> str:
    """`doc` as JSON text with every URL in it redacted: what `--json`, reports and pages carry."""
    return redact(json.dumps(doc, indent=indent, **kwargs))


def print_json(doc: Any, out: TextIO | None = None) -> None:
    """`doc` as indented JSON and a newline on `out` (stdout), URLs redacted."""
    out = out or sys.stdout
    out.write(json_text(doc) + "\n")


_IEC_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def human_bytes(n: int) -> str:
    """A size in IEC units with one decimal (`1.5 MiB`); below 1 KiB in bytes (`512 B`)."""
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in _IEC_UNITS:
        size /= 1024
        if size < 1023.95 or unit == _IEC_UNITS[-1]:  # 1023.96 KiB would print as "1024.0 KiB"
            return f"{size:.1f} {unit}"
    raise AssertionError("unreachable")


def count(n: int, noun: str, plural: str | None = None) -> str:
    """`1 tensor`, `2 tensors`, `0 tensors`."""
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"


PIPED_WIDTH = 160
"""Tables written to a pipe or file fit this many columns (long names wrap at dots, every character
kept): a 400-column line is unreadable in a pager or a CI log. `COLUMNS` sets another width, and
`--json` gives every name whole on one line."""


def terminal_width(stream: TextIO | None = None) -> int | None:
    """The width to fit: the terminal's (`COLUMNS` wins, as everywhere); piped, `COLUMNS` if set,
    else PIPED_WIDTH."""
    stream = sys.stdout if stream is None else stream
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns or None
    except (OSError, ValueError, AttributeError):
        pass
    return PIPED_WIDTH


def cell_width(s: str) -> int:
    """Columns a string takes on a terminal: wide (CJK) characters two, combining marks none."""
    if s.isascii():
        return len(s)
    width = 0
    for ch in s:
        if unicodedata.combining(ch):
            continue
        width += 2 if unicodedata.east_asian_width(ch) in "WF" else 1
    return width


_BREAK_AFTER = frozenset("./ ,;:")


def wrap(text: str, width: int) -> list[str]:
    """Lines of at most `width` columns, broken after a dot (or `/`, space, `,`, `;`, `:`);
    a piece with no break point that is wider than `width` is split where it must be."""
    if width <= 0 or cell_width(text) <= width:
        return [text]
    pieces: list[str] = []
    start = 0
    for i, ch in enumerate(text):
        if ch in _BREAK_AFTER:
            pieces.append(text[start:i + 1])
            start = i + 1
    if start < len(text):
        pieces.append(text[start:])
    lines: list[str] = []
    line, used = "", 0
    for piece in pieces:
        w = cell_width(piece)
        if used + w <= width:
            line, used = line + piece, used + w
            continue
        if line:
            lines.append(line)
            line, used = "", 0
        while w > width:  # no break point inside: split at the width
            head, rest = _split_at(piece, width)
            lines.append(head)
            piece, w = rest, cell_width(rest)
        line, used = piece, w
    if line:
        lines.append(line)
    return lines


def _split_at(s: str, width: int) -> tuple[str, str]:
    used = 0
    for i, ch in enumerate(s):
        w = 0 if unicodedata.combining(ch) else (2 if not ch.isascii() and unicodedata.east_asian_width(ch) in "WF"
                                                 else 1)
        if used + w > width and i > 0:
            return s[:i], s[i:]
        used += w
    return s, ""


MIN_WRAP_WIDTH = 12
LAST_RESORT_WIDTH = 4
GAP = 2


def fit_table(widths: Sequence[int], wrap_cols: Collection[int], width: int | None,
              overhead: int | None = None) -> list[int]:
    """Column widths that fit `width` (`overhead`: what gaps or borders take). Only wrap columns
    shrink, the widest first, down to MIN_WRAP_WIDTH; if that is not enough, down to
    LAST_RESORT_WIDTH. A table that cannot fit even then keeps those floors."""
    fitted = list(widths)
    if overhead is None:
        overhead = GAP * (len(widths) - 1)
    excess = sum(widths) + overhead - (width or 0)
    if width is None or excess <= 0:
        return fitted
    for floor in (MIN_WRAP_WIDTH, LAST_RESORT_WIDTH):
        while excess > 0:
            shrinkable = [i for i in wrap_cols if fitted[i] > floor]
            if not shrinkable:
                break
            widest = max(shrinkable, key=lambda i: fitted[i])
            second = max([fitted[i] for i in shrinkable if i != widest] + [floor])
            step = max(1, min(excess, fitted[widest] - second))  # down to the next widest at once
            fitted[widest] -= step
            excess -= step
    return fitted


def plain_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, right: Collection[int] = (),
                wrap_cols: Collection[int] = (0,), width: int | None = None) -> list[str]:
    """Aligned text lines, no trailing spaces. Cells are escaped here; rows too long for `width`
    get their wrap columns broken over several lines (at dots, see `wrap`).

    Linear and column-wise: each column is checked once (printable? ASCII? wider than its
    share?), so only the rows that need it are escaped, measured or wrapped cell by cell."""
    ncols = len(header)
    head = tuple(map(escape, header))
    columns = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in header]
    slow: set[int] = set()  # rows with a wide character or a cell to wrap
    natural = []
    escaped = False
    for col, column in enumerate(columns):
        joined = "".join(column)
        if not joined.isprintable():
            column[:] = map(escape, column)
            joined = "".join(column)
            escaped = True
        if joined.isascii():
            natural.append(max([len(head[col]), *map(len, column)]))
        else:
            slow.update(i for i, c in enumerate(column) if not c.isascii())
            natural.append(max([cell_width(head[col]), *map(cell_width, column)]))
    widths = fit_table(natural, wrap_cols, width)
    for col in wrap_cols:
        if widths[col] < natural[col]:
            w = widths[col]
            slow.update(i for i, c in enumerate(columns[col]) if len(c) > w or cell_width(c) > w)
    tuples = all(type(row) is tuple for row in rows)  # `%` takes a tuple
    cells = rows if tuples and not escaped else list(zip(*columns, strict=True))
    last = ncols - 1
    # A left-aligned last column is not padded; only an empty last cell leaves a gap to strip.
    fmt = "  ".join(f"%{w}s" if i in right else ("%s" if i == last else f"%-{w}s") for i, w in enumerate(widths))
    lines = [(fmt % head).rstrip(), ("  ".join("-" * w for w in widths))]
    if not slow:
        if "" in columns[last]:
            lines += [line.rstrip() for line in map(fmt.__mod__, cells)]
        else:
            lines += map(fmt.__mod__, cells)  # `%`: cheaper than str.format
        return lines
    for i, row in enumerate(cells):
        if i in slow:
            lines += _slow_row(row, widths, right, wrap_cols)
        else:
            lines.append((fmt % row).rstrip())
    return lines


def _slow_row(row: Sequence[str], widths: Sequence[int], right: Collection[int],
              wrap_cols: Collection[int]) -> list[str]:
    parts = [wrap(c, w) if i in wrap_cols else [c] for i, (c, w) in enumerate(zip(row, widths, strict=True))]
    height = max(map(len, parts))
    out = []
    for k in range(height):
        cols = []
        for i, w in enumerate(widths):
            text = parts[i][k] if k < len(parts[i]) else ""
            pad = " " * max(0, w - cell_width(text))
            cols.append(pad + text if i in right else text + pad)
        out.append("  ".join(cols).rstrip())
    return out


RICH_TABLE_ROWS = 2000
"""Up to this many rows a terminal gets a Rich table; above, plain aligned text: Rich measures
every cell of every row for its layout (~1 ms a row)."""


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], *, right: Collection[int] = (),
                wrap_cols: Collection[int] = (0,), stream: TextIO | None = None,
                rich: bool | None = None) -> None:
    """A table on `stream`: Rich's (bold header) on a terminal for up to RICH_TABLE_ROWS rows, plain
    aligned text otherwise. Both fit `terminal_width()` by wrapping the wrap columns at dots.
    Every cell and the title are escaped and shown literally (no Rich markup)."""
    stream = sys.stdout if stream is None else stream
    width = terminal_width(stream)
    if rich is None:
        rich = len(rows) <= RICH_TABLE_ROWS and _isatty(stream)
    if not rich:
        lines = wrap(escape(title), width or 0)
        lines += plain_table(header, rows, right=right, wrap_cols=wrap_cols, width=width)
        write_lines(stream, lines)
        return
    _rich_table(title, header, rows, right, wrap_cols, width, stream)


def write_lines(stream: TextIO, lines: Sequence[str], chunk: int = 1000) -> None:
    """Each line and a newline, a chunk of lines a write. One huge write into a pipe whose reader
    left (`| head`) can end silently part way; later writes raise BrokenPipeError as they should.
    URLs are redacted (the lines may be JSON: `inspect --json`)."""
    for start in range(0, len(lines), chunk):
        stream.write(redact("\n".join(lines[start:start + chunk])) + "\n")


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _rich_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], right: Collection[int],
                wrap_cols: Collection[int], width: int | None, stream: TextIO) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    cells = [tuple(map(escape, row)) for row in rows]
    head = [escape(h) for h in header]
    natural = [max([cell_width(h)] + [cell_width(r[i]) for r in cells]) for i, h in enumerate(head)]
    widths = fit_table(natural, wrap_cols, width)  # the box below takes GAP columns between cells, like plain
    table = Table(title=Text(escape(title)), title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, padding=(0, 1, 0, 0))
    for i, h in enumerate(head):
        table.add_column(Text(h), justify="right" if i in right else "left", overflow="fold")
    for row in cells:
        # Pre-wrapped at dots; Rich would fold mid-word. Text: literal, never parsed as markup.
        table.add_row(*(Text("\n".join(wrap(c, widths[i])) if i in wrap_cols else c) for i, c in enumerate(row)))
    Console(file=stream, width=width, highlight=False).print(table)
