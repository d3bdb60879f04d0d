"""Check the relative links between the documentation pages: every linked file exists, every
`#anchor` names a heading of the page it points to.

    python tools/check_doc_links.py        # exit 1 and one line per broken link, if any

Pages: README.md, SECURITY.md, benchmarks/README.md and docs/*.md. Anchors are spelled as GitHub
spells them (lower case, punctuation dropped, spaces as hyphens). Links inside code blocks and
links to web addresses are not checked.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*)")
CODE_BLOCK = re.compile(r"^```.*?^```", re.S | re.M)


def pages() -> list[Path]:
    return [REPO / "README.md", REPO / "SECURITY.md", REPO / "benchmarks" / "README.md",
            *sorted((REPO / "docs").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub derives them."""
    found = set()
    for line in CODE_BLOCK.sub("", page.read_text(encoding="utf-8")).splitlines():
        m = HEADING.match(line)
        if m:
            found.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return found


def broken_links() -> list[str]:
    problems = []
    for page in pages():
        if not page.exists():
            continue
        for target in LINK.findall(CODE_BLOCK.sub("", page.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = page.relative_to(REPO)
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
