"""What every command prints under `--json`: an error object, and large documents one tensor a line."""

from __future__ import annotations

import json
import sys
from typing import Any


def print_json_error(error: dict[str, Any]) -> None:
    from ..core.display import print_json
    print_json({"error": error})


def write_inspect_json(info: dict[str, Any], out: Any) -> None:
    """`info` as indented JSON, one tensor a line: `indent` makes `json` use its pure-Python
    encoder (~30 us a tensor), while each compact tensor line is encoded in C."""
    from ..core.display import write_lines

    encode = json.JSONEncoder(default=str).encode  # one encoder: json.dumps(default=...) builds one a call
    lines = ["{"]
    for n, (key, value) in enumerate(info.items()):
        comma = "," if n < len(info) - 1 else ""
        if key == "tensors" and value:
            lines.append(f"  {json.dumps(key)}: [")
            lines += [f"    {encode(t)}," for t in value]
            lines[-1] = lines[-1][:-1]
            lines.append("  ]" + comma)
        else:
            lines.append(f"  {json.dumps(key)}: " + json.dumps(value, indent=2, default=str).replace("\n", "\n  ")
                         + comma)
    lines.append("}")
    write_lines(out, lines)


def print_written(result: Any, *, as_json: bool, headline: str, recipe_output: str | None,
                  recipe_written: bool, problem: str | None, what: str) -> int:
    """What `convert` and `merge` print once the output is written: `result`'s fields as JSON (with
    the recipe file when one was written), or `headline`, the notes and the recipe line ("the
    recipe of this `what`"); a recipe that could not be written after the output is exit 1."""
    from ..core.display import escape, print_json
    from ..core.errors import EXIT_MIGRATION, EXIT_OK

    if as_json:  # URLs redacted, as every document printed
        print_json(result.__dict__ | ({"recipe": recipe_output} if recipe_written and not problem else {}))
    else:
        print(headline)
        for note in result.notes:
            print(f"  note: {escape(note, keep_newlines=True)}")
        if recipe_written and not problem:
            print(f"wrote {escape(recipe_output)}, the recipe of this {what} (again: migrate run "
                  f"{escape(recipe_output)} --overwrite)")
    if problem:
        print(f"migrate: error: wrote {escape(result.target)}, but the recipe was not written: "
              f"{escape(problem, keep_newlines=True)}", file=sys.stderr)
        return EXIT_MIGRATION
    return EXIT_OK
