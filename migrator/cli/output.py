"""What every command prints under `--json`: an error object, and large documents one tensor a line."""

from __future__ import annotations

import json
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
