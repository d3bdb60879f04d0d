"""The outcome of applying source tensors to a target: Burn's `ApplyResult`, its text and JSON.

The text of `ApplyReport.display()` follows Burn's `Display` for `ApplyResult`
(docs/burn-compatibility.md, "The apply report") line for line, so users comparing migrator's output
with Burn's see the same summary, with these deliberate differences: counts are singular or plural
as they should be ("1 tensor"), the source tensors no target uses are "Unused in source" (Burn:
"Unused in target"), names are escaped for the terminal (`display.escape`: a name from a file never
reaches it raw), and a shape mismatch prints its shapes as `[256, 32]` (Burn: its Debug form `Shape
{ dims: [256, 32] }`), names the source tensor it came from, and may end in a hint. The JSON form is
migrator's own, for machines (CI checks, the CLI's `--json`), with the exact names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from ..core.display import count as _count
from ..core.display import escape
from ..naming.similarity import did_you_mean

__all__ = ["ApplyReport", "ErrorKind", "ReportError", "error_display"]

ErrorKind = Literal["shape_mismatch", "dtype_mismatch", "load_error", "adapter_error", "run_error"]
_KINDS: tuple[str, ...] = get_args(ErrorKind)

Shape = tuple[int, ...]
_LIST_LIMIT = 10
_ENUM_EXAMPLE_REMAP = r'.with_key_remapping(r"field\.(\w+)", "field.BaseConv.$1")'


def _shape_text(value: Shape | str | None) -> str:
    """A shape as `[2, 3]` (Burn prints its Debug form, `Shape { dims: [2, 3] }`); strings pass through."""
    if value is None:
        return "None"
    if isinstance(value, str):
        return value
    return "[" + ", ".join(str(d) for d in value) + "]"


def _as_shape_or_str(value: Any) -> Shape | str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Sequence) and all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        return tuple(value)
    raise ValueError(f"expected a shape (list of ints), a string or None, got {value!r}")


@dataclass(frozen=True)
class ReportError:
    """One failed parameter. `expected`/`found` are shapes (shape_mismatch) or dtype names.

    `message` is the detail after the path in the displayed text; the factories fill it in.
    `path` is the target's name; `source` the source tensor's name as the source file spells it
    (before remaps and renumbering), when the error is about one. `run_error` is a problem that
    stopped a run without belonging to one tensor (the `--report` of a failed run lists them).
    """

    path: str
    kind: ErrorKind
    message: str = ""
    expected: Shape | str | None = None
    found: Shape | str | None = None
    source: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"unknown error kind {self.kind!r} (expected one of {', '.join(_KINDS)})")
        object.__setattr__(self, "expected", _as_shape_or_str(self.expected))
        object.__setattr__(self, "found", _as_shape_or_str(self.found))

    @classmethod
    def shape_mismatch(cls, path: str, expected: Sequence[int], found: Sequence[int], *, source: str | None = None,
                       hint: str | None = None) -> ReportError:
        """`path` is the target's name, `source` the source tensor's (as the source file names it)."""
        exp, fnd = tuple(expected), tuple(found)
        message = f"expected {_shape_text(exp)}, found {_shape_text(fnd)}"
        if source is not None:
            message += f" in source tensor '{source}'"
        if hint:
            message += f" (hint: {hint})"
        return cls(path, "shape_mismatch", message, exp, fnd, source)

    @classmethod
    def dtype_mismatch(cls, path: str, expected: str, found: str, *, source: str | None = None) -> ReportError:
        return cls(path, "dtype_mismatch", f"expected {expected}, found {found}", expected, found, source)

    @classmethod
    def adapter_error(cls, path: str, message: str, *, source: str | None = None) -> ReportError:
        """`source` (when it differs from `path`) is named in the message: the user finds it in the file."""
        if source is not None and source != path:
            message += f" (source tensor '{source}')"
        return cls(path, "adapter_error", message, source=source)

    def display(self) -> str:
        return error_display(self)

    def __str__(self) -> str:
        return error_display(self)

    def to_json(self) -> dict[str, Any]:
        def plain(v: Shape | str | None) -> list[int] | str | None:
            return list(v) if isinstance(v, tuple) else v

        data = {
            "path": self.path,
            "kind": self.kind,
            "message": self.message,
            "expected": plain(self.expected),
            "found": plain(self.found),
        }
        if self.source is not None:
            data["source"] = self.source
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReportError:
        if not isinstance(data, Mapping):
            raise ValueError(f"an error entry must be an object, got {data!r}")
        try:
            return cls(
                path=str(data["path"]),
                kind=data["kind"],
                message=str(data.get("message", "")),
                expected=data.get("expected"),
                found=data.get("found"),
                source=None if data.get("source") is None else str(data["source"]),
            )
        except KeyError as exc:
            raise ValueError(f"error entry lacks {exc.args[0]!r}: {data!r}") from None


def error_display(e: ReportError) -> str:
    """Burn's `Display` of an `ApplyError`: the same one-line text per error kind."""
    if e.kind == "shape_mismatch" and not e.message and e.expected is not None and e.found is not None:
        return f"Shape mismatch for '{e.path}': expected {_shape_text(e.expected)}, found {_shape_text(e.found)}"
    if e.kind == "dtype_mismatch" and e.expected is not None and e.found is not None:
        return f"DType mismatch for '{e.path}': expected {e.expected}, found {e.found}"
    prefix = {
        "shape_mismatch": "Shape mismatch",
        "dtype_mismatch": "DType mismatch",
        "adapter_error": "Adapter error",
        "load_error": "Load error",
        "run_error": "Run error",
    }[e.kind]
    return f"{prefix} for '{e.path}': {e.message}"


@dataclass
class ApplyReport:
    """What happened to each target parameter (Burn's `ApplyResult` fields).

    `skipped`, `missing` and `unused` are kept sorted (normalised on construction and on output);
    `applied` and `errors` keep traversal order. Success means no errors: missing and unused
    tensors are policy decisions for the caller.

    `sources` runs parallel to `applied`: the source tensor each applied target name came from, as
    the source file spells it (so renumbering reads `features.4.weight -> features.3.weight`);
    empty when not recorded. `target`, `status` (`ok`/`failed`) and `written` describe the run that
    used the report (a `--report` file has them); None when the report is only a plan's.

    With several sources (a recipe's `sources:`), `applied_from` runs parallel to `applied` (the
    source's name per tensor), and `skipped_from` / `unused_from` hold (name, source name, tensor
    name in that source) per skipped / unused tensor, in the order of `skipped` / `unused`.
    """

    applied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    errors: list[ReportError] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    applied_from: list[str] = field(default_factory=list)
    skipped_from: list[tuple[str, str, str]] = field(default_factory=list)
    unused_from: list[tuple[str, str, str]] = field(default_factory=list)
    ops: list[dict[str, Any]] = field(default_factory=list)
    """The recipe's op nodes (`migrator.transform.ops.OpNode.to_json`: op, index, at, inputs, outputs), in order."""
    renumbered: list[tuple[str, str]] = field(default_factory=list)
    """(name before, name after) per tensor whose index segments were renumbered (contiguous_indices)."""
    consumed: list[tuple[str, str]] = field(default_factory=list)
    """(stored tensor, the tensor it went into) per tensor a source consumed to make another: a quantized
    weight's scales, dequantized into it (`files.quantized`)."""
    optimizer: list[dict[str, Any]] = field(default_factory=list)
    """Each optimizer state tensor's fate (`plan.training_state`): optimizer, param, state, fate (followed, copied,
    dropped), tensor (its name in the output, or in the source when dropped)."""
    quantized: dict[str, Any] | None = None
    """`quantize:`'s outcome (`transform.quantize.Quantization.summary`): scheme, the weights quantized
    (`tensors`) and the Linear modules kept (`kept`: {module, why}, as config.json's ignore lists them)."""
    target: str | None = None
    status: str | None = None
    written: bool | None = None

    def __post_init__(self) -> None:
        self.skipped = sorted(self.skipped)
        self.missing = sorted((str(p), str(c)) for p, c in self.missing)
        self.unused = sorted(self.unused)
        if self.sources and len(self.sources) != len(self.applied):
            raise ValueError(f"sources has {len(self.sources)} names for {len(self.applied)} applied tensors")
        if self.applied_from and len(self.applied_from) != len(self.applied):
            raise ValueError(f"applied_from has {len(self.applied_from)} names for {len(self.applied)} applied tensors")

    def concluded(self, target: str, problems: Sequence[str], written: str | None) -> ApplyReport:
        """This plan's report as its run ended (a copy: the plan's own summary stays as planned).

        The one rule for a run's report: a failed run says so, `status` "failed", `written` false,
        and every problem that stopped it is in `errors` (as a `run_error` when the plan's report has
        no entry for it), never `"errors": []`; `target` is what was published, else the planned path.
        """
        known = {str(e) for e in self.errors}
        added = [ReportError(target, "run_error", m, None, None) for m in problems if m not in known]
        ok = not problems
        return replace(self, errors=[*self.errors, *added], status="ok" if ok else "failed",
                                   target=written if ok and written else target, written=ok)

    def renames(self) -> list[tuple[str, str]]:
        """(source name, target name) per applied tensor, in applied order (needs `sources`)."""
        return list(zip(self.sources, self.applied, strict=True))

    def is_success(self) -> bool:
        return not self.errors

    def displayed_errors(self) -> list[ReportError]:
        """The errors `display()` lists (the first 10, as Burn's summary), so a caller printing every
        error can leave these out instead of printing them twice."""
        return self.errors[:_LIST_LIMIT]

    def suggestion(self, missing_path: str) -> str | None:
        """The "did you mean" hint for a missing path, from this report's unused names."""
        return did_you_mean(missing_path, sorted(self.unused))

    def display(self, ops_limit: int | None = _LIST_LIMIT) -> str:
        """Burn's multi-line summary (docs/burn-compatibility.md), without a trailing newline; op nodes after the first
        `ops_limit` are counted, not listed (None: all, as `migrate plan` shows them)."""
        skipped = sorted(self.skipped)
        missing = sorted(self.missing)
        unused = sorted(self.unused)
        lines = [
            "┌─ Tensor Loading Summary " + "─" * 25,
            "│",
            f"│ ✓ Successfully applied: {_count(len(self.applied), 'tensor')}",
            f"│ ⊘ Skipped (filtered):  {_count(len(skipped), 'tensor')}",
            f"│ ✗ Missing in source:    {_count(len(missing), 'tensor')}",
            f"│ ? Unused in source:     {_count(len(unused), 'tensor')}",  # Burn: "Unused in target"
            f"│ ! Errors:               {_count(len(self.errors), 'error')}",
        ]
        if missing:
            lines += ["│", "├─ Missing Tensors (requested by model but not found in source)", "│"]
            enum_paths = sum(1 for _, container in missing if "Enum:" in container)
            if enum_paths:
                lines += _enum_advisory(enum_paths)
            lines.append("│  First 10 missing tensors:")
            for path, _ in missing[:_LIST_LIMIT]:
                lines.append(f"│    • {escape(path)}")
                hint = did_you_mean(path, unused)
                if hint is not None:
                    lines.append(f"│        Did you mean: '{escape(hint)}'?")
            if len(missing) > _LIST_LIMIT:
                lines.append(f"│    ... and {len(missing) - _LIST_LIMIT} more")
        if unused:
            lines += ["│", "├─ Unused Tensors (in source but not used by model)", "│"]
            lines.append("│  First 10 unused tensors:")
            if self.unused_from:  # several sources: which one each came from
                lines += [f"│    • {escape(path)} (source '{escape(src)}')"
                          for path, src, _ in sorted(self.unused_from)[:_LIST_LIMIT]]
            else:
                lines += [f"│    • {escape(path)}" for path in unused[:_LIST_LIMIT]]
            if len(unused) > _LIST_LIMIT:
                lines.append(f"│    ... and {len(unused) - _LIST_LIMIT} more")
        if self.consumed:
            lines += ["│", f"├─ Consumed by dequantization ({_count(len(self.consumed), 'tensor')}: scales, "
                      "not unused)"]
            lines += [f"│    • {escape(t)} -> {escape(into)}" for t, into in self.consumed[:_LIST_LIMIT]]
            if len(self.consumed) > _LIST_LIMIT:
                lines.append(f"│    ... and {len(self.consumed) - _LIST_LIMIT} more")
        if self.renumbered:
            lines += ["│", f"├─ Renumbered indices ({_count(len(self.renumbered), 'tensor')}, contiguous_indices)",
                      "│"]
            lines += [f"│    • {escape(old)} -> {escape(new)}" for old, new in self.renumbered[:_LIST_LIMIT]]
            if len(self.renumbered) > _LIST_LIMIT:
                lines.append(f"│    ... and {len(self.renumbered) - _LIST_LIMIT} more")
        if self.ops:
            lines += ["│", f"├─ Ops ({_count(len(self.ops), 'node')})", "│"]
            shown = self.ops if ops_limit is None else self.ops[:ops_limit]
            lines += [f"│    • {escape(_op_text(n))}" for n in shown]
            if len(self.ops) > len(shown):
                lines.append(f"│    ... and {len(self.ops) - len(shown)} more")
        if self.optimizer:
            fates = [f["fate"] for f in self.optimizer]
            counts = ", ".join(f"{fates.count(k)} {k}" for k in ("followed", "copied", "dropped") if k in fates)
            lines += ["│", f"├─ Optimizer state ({counts})", "│"]
            lines += [f"│    • {escape(fate_text(f))}" for f in self.optimizer[:_LIST_LIMIT]]
            if len(self.optimizer) > _LIST_LIMIT:
                lines.append(f"│    ... and {len(self.optimizer) - _LIST_LIMIT} more")
        if self.quantized:
            q = self.quantized
            lines += ["│", f"├─ Quantized {q['scheme']} ({_count(len(q['tensors']), 'weight')}, "
                      f"{_count(len(q['kept']), 'Linear module')} kept)", "│"]
            lines += [f"│    • {escape(t)}" for t in q["tensors"][:_LIST_LIMIT]]
            if len(q["tensors"]) > _LIST_LIMIT:
                lines.append(f"│    ... and {len(q['tensors']) - _LIST_LIMIT} more")
            lines += [f"│    • kept {escape(k['module'])} ({escape(k['why'])})" for k in q["kept"][:_LIST_LIMIT]]
            if len(q["kept"]) > _LIST_LIMIT:
                lines.append(f"│    ... and {len(q['kept']) - _LIST_LIMIT} more kept")
        if self.errors:
            lines += ["│", "├─ Errors", "│"]
            lines += [f"│  ⚠️  {escape(error_display(e), keep_newlines=True)}" for e in self.errors[:_LIST_LIMIT]]
            if len(self.errors) > _LIST_LIMIT:
                lines.append(f"│    ... and {len(self.errors) - _LIST_LIMIT} more")
        lines += ["│", "└" + "─" * 51]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.display()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: applied, skipped, missing, unused, errors; then `tensors` (a
        `{"source", "target"}` object per applied tensor) when sources are recorded, and `status`,
        `target`, `written` when set."""
        unused = sorted(self.unused)
        data: dict[str, Any] = {
            "applied": list(self.applied),
            "skipped": sorted(self.skipped),
            "missing": [
                {"path": p, "container_path": c, "did_you_mean": did_you_mean(p, unused)}
                for p, c in sorted(self.missing)
            ],
            "unused": unused,
            "errors": [e.to_json() for e in self.errors],
        }
        if self.sources:
            data["tensors"] = [{"source": s, "target": t} for s, t in zip(self.sources, self.applied, strict=True)]
            if self.applied_from:
                for entry, label in zip(data["tensors"], self.applied_from, strict=True):
                    entry["from"] = label
        for key in ("skipped_from", "unused_from"):
            if getattr(self, key):
                data[key] = [{"path": p, "source": s, "tensor": t} for p, s, t in sorted(getattr(self, key))]
        if self.ops:
            data["ops"] = [dict(n) for n in self.ops]
        if self.renumbered:
            data["renumbered"] = [{"from": old, "to": new} for old, new in self.renumbered]
        if self.consumed:
            data["consumed"] = [{"tensor": t, "into": into} for t, into in self.consumed]
        if self.optimizer:
            data["optimizer"] = [dict(f) for f in self.optimizer]
        if self.quantized:
            data["quantized"] = {"scheme": self.quantized["scheme"], "tensors": list(self.quantized["tensors"]),
                                 "kept": [dict(k) for k in self.quantized["kept"]]}
        for key in _RUN_KEYS:
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ApplyReport:
        """Inverse of `to_json` (suggestions are recomputed, not read); reads `--report` files too."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a report must be an object, got {type(data).__name__}")
        keys = {"applied", "skipped", "missing", "unused", "errors"}
        if not keys <= set(data) or not set(data) <= keys | _OPTIONAL_KEYS:
            raise ValueError(f"a report needs the keys {sorted(keys)} and may have {sorted(_OPTIONAL_KEYS)}, "
                             f"got {sorted(data)}")
        applied = [str(p) for p in data["applied"]]
        sources: list[str] = []
        applied_from: list[str] = []
        for i, entry in enumerate(data.get("tensors", [])):
            if not isinstance(entry, Mapping) or i >= len(applied) or str(entry.get("target")) != applied[i]:
                raise ValueError(f"tensors entry {i} does not match applied: {entry!r}")
            sources.append(str(entry["source"]))
            if "from" in entry:
                applied_from.append(str(entry["from"]))
        origins: dict[str, list[tuple[str, str, str]]] = {}
        for key in ("skipped_from", "unused_from"):
            items = data.get(key, [])
            if not isinstance(items, list) or not all(isinstance(e, Mapping) for e in items):
                raise ValueError(f"{key} must be a list of {{path, source, tensor}} objects")
            origins[key] = [(str(e["path"]), str(e["source"]), str(e["tensor"])) for e in items]
        renumbered = data.get("renumbered", [])
        if not isinstance(renumbered, list) or not all(isinstance(e, Mapping) and {"from", "to"} <= set(e)
                                                       for e in renumbered):
            raise ValueError("renumbered must be a list of {from, to} objects")
        consumed = data.get("consumed", [])
        if not isinstance(consumed, list) or not all(isinstance(e, Mapping) and {"tensor", "into"} <= set(e)
                                                     for e in consumed):
            raise ValueError("consumed must be a list of {tensor, into} objects")
        status, target, written = data.get("status"), data.get("target"), data.get("written")
        if status is not None and status not in ("ok", "failed"):
            raise ValueError(f"status must be 'ok' or 'failed', got {status!r}")
        if written is not None and not isinstance(written, bool):
            raise ValueError(f"written must be true or false, got {written!r}")
        missing: list[tuple[str, str]] = []
        for entry in data["missing"]:
            if isinstance(entry, Mapping):
                missing.append((str(entry["path"]), str(entry.get("container_path", ""))))
            elif isinstance(entry, (list, tuple)) and len(entry) == 2:
                missing.append((str(entry[0]), str(entry[1])))
            else:
                raise ValueError(f"bad missing entry {entry!r}")
        return cls(
            applied=applied,
            skipped=[str(p) for p in data["skipped"]],
            missing=missing,
            unused=[str(p) for p in data["unused"]],
            errors=[ReportError.from_json(e) for e in data["errors"]],
            sources=sources,
            applied_from=applied_from,
            skipped_from=origins["skipped_from"],
            unused_from=origins["unused_from"],
            ops=[_op_entry(n) for n in data.get("ops", [])],
            renumbered=[(str(e["from"]), str(e["to"])) for e in renumbered],
            consumed=[(str(e["tensor"]), str(e["into"])) for e in consumed],
            optimizer=_optimizer_fates(data.get("optimizer", [])),
            quantized=_quantized(data.get("quantized")),
            target=None if target is None else str(target),
            status=status,
            written=written,
        )


_RUN_KEYS = ("status", "target", "written")
_FATE_KEYS = ("optimizer", "param", "state", "fate", "tensor")


def fate_text(f: Mapping[str, Any]) -> str:
    """One optimizer state value's fate in a line: `k.weight.exp_avg: followed optimizer.state.1.exp_avg ->
    optimizer.state.2.exp_avg` (where it comes from when that is another name, where it goes unless dropped)."""
    text = f"{f['param']}.{f['state']}: {f['fate']}"
    if f.get("from") and f["from"] != f["tensor"]:
        text += f" {f['from']}"
    if f["fate"] != "dropped" and f["tensor"]:
        text += f" -> {f['tensor']}"
    return text


def _optimizer_fates(items: Any) -> list[dict[str, Any]]:
    if not isinstance(items, list) or not all(isinstance(e, Mapping) and set(_FATE_KEYS) <= set(e) for e in items):
        raise ValueError("optimizer must be a list of {optimizer, param, state, fate, tensor} objects")
    return [{**{k: e[k] for k in _FATE_KEYS}, "from": e.get("from", e["tensor"])} for e in items]
_OPTIONAL_KEYS = frozenset({"tensors", "ops", "renumbered", "consumed", "optimizer", "skipped_from", "unused_from",
                            "quantized", *_RUN_KEYS})


def _quantized(data: Any) -> dict[str, Any] | None:
    if data is None:
        return None
    if (not isinstance(data, Mapping) or not isinstance(data.get("scheme"), str)
            or not isinstance(data.get("tensors"), list) or not isinstance(data.get("kept"), list)
            or not all(isinstance(k, Mapping) and {"module", "why"} <= set(k) for k in data["kept"])):
        raise ValueError("quantized must be {scheme, tensors: [...], kept: [{module, why}]}")
    return {"scheme": data["scheme"], "tensors": [str(t) for t in data["tensors"]],
            "kept": [{"module": str(k["module"]), "why": str(k["why"])} for k in data["kept"]]}


def _op_text(node: Mapping[str, Any]) -> str:
    """`split ops[0] (recipe.yaml:5:5): a -> b, c`."""
    at = f" ({node['at']})" if node.get("at") else ""
    return (f"{node['op']} ops[{node['index']}]{at}: {', '.join(node['inputs'])} -> "
            f"{', '.join(node['outputs'])}")


def _op_entry(data: Any) -> dict[str, Any]:
    if not isinstance(data, Mapping) or not {"op", "index", "inputs", "outputs"} <= set(data):
        raise ValueError(f"bad ops entry {data!r}")
    return {"op": str(data["op"]), "index": int(data["index"]), "at": str(data.get("at", "")),
            "inputs": [str(x) for x in data["inputs"]], "outputs": [str(x) for x in data["outputs"]]}


def _enum_advisory(count: int) -> list[str]:
    """Lines explaining that Burn paths name enum variants where PyTorch paths do not."""
    return [
        f"│  ⚠️  {count} paths contain enum variants (detected from container stack)",
        "│     Burn puts enum variant names into paths (e.g. 'field.BaseConv.weight'),",
        "│     PyTorch does not (e.g. 'field.weight'), so these names cannot line up.",
        "│",
        "│     Solution 1: leave variant names out with skip_enum_variants(true):",
        "│",
        '│       PytorchStore::from_file("model.pth")',
        "│           .skip_enum_variants(true)",
        "│",
        "│     Solution 2: insert the variant name with a key remap:",
        "│",
        '│       SafetensorsStore::from_file("model.safetensors")',
        f"│           {_ENUM_EXAMPLE_REMAP}",
        "│",
    ]
