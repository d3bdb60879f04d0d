"""Check the relative links between the documentation pages: every linked file exists, every
`#anchor` names a heading (or an `<a id="...">`) of the page it points to.

    python tools/check_doc_links.py        # exit 1 and one line per broken link, if any

Pages: every `*.md` at the top of the repository (README, SECURITY, CHANGELOG), benchmarks/README.md
and docs/*.md. Anchors are spelled as GitHub spells them (lower case, punctuation dropped, spaces as
hyphens, `-1`, `-2` ... for a repeated heading). Links inside code blocks and inline code, and links
to web addresses, are not checked. `make test` runs it (tests/test_doc_links.py).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*)")
HTML_ANCHOR = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")
CODE_BLOCK = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def pages(root: Path = REPO) -> list[Path]:
    return [*sorted(root.glob("*.md")), root / "benchmarks" / "README.md", *sorted((root / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page: its headings' as GitHub derives them, and its explicit `<a id>`s."""
    text = CODE_BLOCK.sub("", page.read_text(encoding="utf-8"))
    found: set[str] = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for line in text.splitlines():
        m = HEADING.match(line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(root: Path = REPO) -> list[str]:
    problems = []
    for page in pages(root):
        if not page.exists():
            continue
        text = INLINE_CODE.sub("", CODE_BLOCK.sub("", page.read_text(encoding="utf-8")))
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = page.relative_to(root)
            if not dest.exists():
                problems.append(f"{where}: {target}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                problems.append(f"{where}: {target}: no such heading")
    return problems


def main() -> int:
    problems = broken_links()
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
