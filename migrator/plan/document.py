"""A plan as a JSON document: `migrate plan --json`, and the data of the plan's HTML page."""

from __future__ import annotations

from typing import Any

from ..core.errors import not_written
from .build import Plan
from .outputs import plan_outputs


def plan_json(p: Plan) -> dict[str, Any]:
    """`outputs`: every file the run writes (`outputs.plan_outputs`: the target, Burn's optimizer
    record). With several sources, each entry has `from` (its source's name) and `from_tensor` (the tensor's
    name in that source), and `sources` lists them."""
    entries = []
    union = p.union
    for e in p.entries:
        origin = union.origin_of.get(e.source) if union is not None and e.source is not None else None
        entries.append({**({} if union is None or origin is None else {"from": union.parts[origin.part].label,
                                                                        "from_tensor": origin.tensor}),
            "source": e.source, "target": e.target, "ops": e.ops,
            "before": None if e.before is None else {"dtype": e.before[0].display, "shape": list(e.before[1])},
            "after": {"dtype": e.tensor.dtype.display, "shape": list(e.tensor.shape)},
            "nbytes": e.tensor.nbytes,
            "module": None if e.module is None else {"type": e.module.name, "how": e.module.how,
                                                     "reason": e.module.reason},
            "kept_from_template": e.kept_from_template,
            **({} if e.optimizer is None else {"optimizer": e.optimizer}),
        })
    return {"source": str(p.source_path), "source_format": p.source_format, "target": str(p.target_path),
            "target_format": p.target_format, "template": None if p.template_path is None else str(p.template_path),
            "outputs": [{"role": o.role, "path": o.path} for o in plan_outputs(p)],
            "entries": entries, "metadata": p.metadata, "scalars": {k: v.to_json() for k, v in p.scalars.items()},
            "report": p.report.to_json(), "errors": p.fatal, "notes": p.notes, **plan_error(p),
            **({"sources": [{"name": label, "path": str(path)} for label, path in p.inputs]} if union else {})}


def plan_error(p: Plan) -> dict[str, Any]:
    """`{"error": ...}` when the plan cannot run (as every failing `--json` command prints), else {}."""
    if not p.fatal:
        return {}
    return {"error": {"kind": "MigrationError", "message": not_written(p.fatal),
                      "file": str(p.target_path), "tensor": None}}
