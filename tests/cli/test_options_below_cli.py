"""Nothing below `cli/` sees argparse: the command line hands frozen options objects down."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "migrator"
PICKLED = {"formats/safepickle/allowlist.py", "formats/pytorch/namespace.py"}
"""Modules naming `argparse.Namespace` as a class a checkpoint's pickle holds (Megatron-LM's `args`), read as
data by the restricted interpreter: never the command line's options."""


def test_no_module_below_the_command_line_reads_argparse() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "cli" or path.relative_to(PACKAGE).as_posix() in PICKLED:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bargparse\b|\bNamespace\b", line):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}")
    assert found == []
