"""docs/ops.md's reference of every op, written from the registry: a section per op with its summary, its
keys (from its options model: name, default, description), what it does to the optimizer's state, and
its example. `tools/gen_schema.py` writes it between the markers; a test fails when it is stale."""

from __future__ import annotations

import json
from typing import Any

from .base import OPS, Op

BEGIN = "<!-- The ops' reference: written by tools/gen_schema.py from migrator/ops; do not edit by hand. -->"
END = "<!-- End of the ops' reference. -->"


def reference() -> str:
    """The markdown between BEGIN and END (without them)."""
    from .. import ops  # noqa: F401  importing the package registers its ops

    return "\n".join(section(op) for op in OPS.values())


def section(op: Op) -> str:
    """One op's section: heading, summary, keys, and its example as a recipe's `ops:` entry."""
    module = type(op).__module__.replace(".", "/") + ".py"
    inputs = ("its inputs listed (`from: [REGEX, NAME, ...]`) or grouped by an index (`over`)" if op.joins
              else "one input per match of `from`")
    effect = ("makes new values, so a training checkpoint's optimizer state is dropped" if op.computes else
              "keeps each value in its layout, so all of a parameter's optimizer state follows it" if op.keeps_layout
              else "optimizer state shaped like its parameter goes through it too, the rows it adds getting zero "
              "moments (the run says so); other state (Adafactor's factored moments) is refused" if op.new_rows
              else "optimizer state shaped like its parameter goes through it too; other state (Adafactor's "
              "factored moments) is refused")
    lines = [f"### `{op.name}`", "", op.summary, "", f"`{module}`: {inputs}; {effect}.", "",
             "| key | default | meaning |", "| --- | --- | --- |"]
    for name, field in op.options.model_fields.items():
        key = field.alias or name
        lines.append(f"| `{key}` | {_default(field)} | {_cell(field.description or '')} |")
    lines += ["", "```yaml", "ops:", f"  - {op.example}", "```", ""]
    return "\n".join(lines)


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    return "none" if value is None else f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def replaced(document: str) -> str:
    """`document` (docs/ops.md) with its reference written anew; ValueError without the markers."""
    start, end = document.find(BEGIN), document.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the markers of the ops' reference are missing: {BEGIN} ... {END}")
    return document[:start + len(BEGIN)] + "\n\n" + reference() + "\n" + document[end:]
