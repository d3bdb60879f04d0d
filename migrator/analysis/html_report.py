"""HTML reports: one self-contained page for a plan, a run report, a diff or an inspect document.

The page is built from the same JSON documents the commands print (`plan --json`, the run's
`--report`, `diff --json`, `inspect --json`), so it shows nothing the JSON does not hold. What holds:

- One file, no network: the CSS and JS (`migrator/analysis/assets/`) are inlined, and a Content-Security-Policy
  forbids every fetch and runs only those two (by hash), so the page opens from `file://` offline
  and cannot load or run anything else.
- Names are untrusted. They reach the page only as JSON inside `<script type="application/json">`,
  with every `<` written `\\u003c` (no `</script>` can end the element early), and the script
  puts them into the DOM as text nodes, never as markup. The few strings the page's HTML itself
  holds (its title) are HTML-escaped.
- It scales to 100k tensors: names are stored once as a trie of dotted segments (a node is its
  parent's index and its own segment), per-tensor data as columns of small integers into tables
  of shared strings (dtype and shape texts, op lists, module types), and the script renders a
  module's children only when it is expanded.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from typing import Any

from ..core.display import json_text
from ..core.redact import redact
from ..plan.report import fate_text

__all__ = ["diff_page", "inspect_page", "is_html_path", "plan_page", "write_page"]

MAX_DEPTH = 48
"""Segments a name is split into at most (the rest stays in its last segment): a hostile name of
thousands of dots must not nest the page thousands deep."""

# Module levels: a module shows the worst level of the tensors below it.
OK, WARN, ERR = 0, 1, 2

_PLAN_STATUSES = [  # key, label, icon, level (Burn's summary icons)
    ("applied", "applied", "✓", OK),
    ("kept", "kept (missing)", "✗", WARN),
    ("missing", "missing in source", "✗", WARN),
    ("error", "error", "!", ERR),
]
_PLAN_LEVELS = [("ok", "✓", "all applied"), ("warn", "✗", "some missing"), ("err", "!", "errors")]

_DIFF_STATUSES = [
    ("identical", "identical", "=", OK),
    ("close", "close", "≈", OK),
    ("different", "different", "≠", ERR),
    ("only_in_a", "only in A", "◧", WARN),
    ("only_in_b", "only in B", "◨", WARN),
    ("shape_mismatch", "shape mismatch", "!", ERR),
    ("dtype_mismatch", "dtype mismatch", "!", ERR),
]
_DIFF_LEVELS = [("ok", "=", "all match"), ("warn", "◧", "some only in one file"), ("err", "≠", "differences")]

_INSPECT_STATUSES = [("ok", "no flags", "✓", OK), ("flagged", "flagged", "⚠", WARN)]
_INSPECT_LEVELS = [("ok", "✓", "no flags"), ("warn", "⚠", "some flagged"), ("err", "!", "errors")]

_RUN_ERROR = "run_error"


def is_html_path(path: str | os.PathLike[str]) -> bool:
    """A report path that asks for HTML (`.html`, `.htm`); anything else stays JSON."""
    return os.fspath(path).lower().endswith((".html", ".htm"))


class _Strings:
    """Shared strings, each stored once; rows refer to them by index (`intern`)."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.items: list[str] = []

    def intern(self, s: str | None) -> int:
        if s is None:
            return -1
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.items)
            self.items.append(s)
        return i

    __call__ = intern


class _Names:
    """Every name of the page as a trie of dotted segments: node i = (parent[i], segment[i]), and
    the name of node i is its ancestors' segments joined by dots, so `by_name` (name -> node) is
    one-to-one. A name of more than MAX_DEPTH segments keeps its tail, dots and all, in its last
    segment. A name beside one already seen costs one `rpartition` and two dict lookups.
    """

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.segment: list[str] = []
        self.by_name: dict[str, int] = {}

    def node(self, name: str | None) -> int:
        if name is None:
            return -1
        i = self.by_name.get(name)
        if i is not None:
            return i
        if name.count(".") < MAX_DEPTH:
            head, sep, tail = name.rpartition(".")
            if sep:
                p = self.by_name.get(head)
                if p is None:
                    p = self.node(head)  # recursion: at most MAX_DEPTH deep
            else:
                p = -1
        else:
            parts = name.split(".", MAX_DEPTH - 1)
            p, tail = self.node(".".join(parts[:-1])), parts[-1]
        i = self.by_name[name] = len(self.parent)
        self.parent.append(p)
        self.segment.append(tail)
        return i

    __call__ = node


class _Page:
    """The payload being built: names, shared strings, per-row columns, side lists."""

    def __init__(self, kind: str, statuses: list[tuple[str, str, str, int]],
                 levels: list[tuple[str, str, str]]) -> None:
        self.kind = kind
        self.names = _Names()
        self.strs = _Strings()
        self.statuses = statuses
        self.status_code = {s[0]: i for i, s in enumerate(statuses)}
        self.levels = levels
        self.columns: dict[str, list[Any]] = {"t": [], "st": []}
        self.notes: dict[str, dict[int, str]] = {}
        self.info: list[list[str]] = []
        self.summary: list[list[Any]] = []
        self.lists: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}

    def column(self, key: str) -> list[Any]:
        return self.columns.setdefault(key, [])

    def note(self, key: str, row: int, text: str) -> None:
        """A per-row text few rows have (a hint, an error message): stored sparsely."""
        self.notes.setdefault(key, {})[row] = text

    def add_list(self, key: str, title: str, icon: str, level: int, items: Iterable[tuple[str, str | None]],
                 empty: str | None = None) -> None:
        self.lists.append({"key": key, "title": title, "icon": icon, "level": level,
                           "items": [[text, note] for text, note in items], "empty": empty})

    def payload(self, title: str, subtitle: str) -> dict[str, Any]:
        return {
            "v": 1, "kind": self.kind, "title": title, "subtitle": subtitle, "info": self.info,
            "summary": self.summary, "statuses": self.statuses, "levels": self.levels,
            "names": {"p": self.names.parent, "s": self.names.segment}, "strs": self.strs.items,
            "rows": self.columns, "notes": {k: {str(r): t for r, t in v.items()} for k, v in self.notes.items()},
            "lists": self.lists, **self.extra,
        }


def _finite(v: Any) -> Any:
    """A number JSON can hold: non-finite floats as the strings "nan", "inf", "-inf"."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    return v


def _dtype_shape(dtype: Any, shape: Any) -> str | None:
    """`F32 [64, 16]`: a JSON shape is a list of ints, whose `str` is that text."""
    if dtype is None and shape is None:
        return None
    dims = "?" if shape is None else str(list(shape)) if not isinstance(shape, list) else str(shape)
    return f"{dtype if dtype is not None else '?'} {dims}"


def _error_text(e: Mapping[str, Any]) -> str:
    from ..plan.report import ReportError, error_display

    try:
        return error_display(ReportError.from_json(e))
    except (ValueError, TypeError):
        return str(e.get("message", e))


def _op_node_text(node: Mapping[str, Any]) -> str:
    """`split ops[0] (recipe.yaml:11:5): a -> b, c`, as the summary text lists op nodes."""
    at = f" ({node['at']})" if node.get("at") else ""
    inputs, outputs = (", ".join(map(str, node.get(k) or ())) for k in ("inputs", "outputs"))
    return f"{node.get('op')} ops[{node.get('index')}]{at}: {inputs} -> {outputs}"


def _count_item(key: str, label: str, n: int, icon: str, level: int) -> list[Any]:
    return [key, label, n, icon, level]


def _metadata_info(page: _Page, metadata: Mapping[str, Any] | None, scalars: Mapping[str, Any] | None) -> None:
    if metadata:
        page.extra["metadata"] = [[str(k), v if isinstance(v, str) else json.dumps(v)] for k, v in metadata.items()]
    if scalars:
        page.extra["scalars"] = [[str(k), v if isinstance(v, str) else json.dumps(v)] for k, v in scalars.items()]


def _op_encoder(page: _Page) -> Any:
    """An encoder of op lists: (template index, name nodes).

    A remap or renumber op holds two whole names; stored as text it would repeat every name of
    the model twice more. So an op list is split into a template shared by every tensor with the
    same ops (string ops as their index in `strs`, a remap/renumber as -(index of its kind) - 1)
    and the names those ops go from and to, as trie nodes, per tensor. The names are found by
    following the chain from the source name (never by splitting at ' -> ', which a name may
    hold); an op that does not fit is kept as text.
    """
    templates: dict[tuple[int, ...], int] = {}
    table: list[list[int]] = page.extra.setdefault("ops", [])
    intern, node = page.strs.intern, page.names.node
    kinds = {k: -intern(k) - 1 for k in ("remap", "index")}

    def encode(source: str | None, ops: Sequence[str]) -> tuple[int, list[int] | None]:
        template: list[int] = []
        nodes: list[int] | None = None
        current = source
        for op in ops:
            kind = op[:op.find(" ")]
            if kind in kinds and current is not None and op.startswith(f"{kind} {current} -> "):
                new = op[len(kind) + len(current) + 5:]
                template.append(kinds[kind])
                if nodes is None:
                    nodes = []
                nodes += (node(current), node(new))
                current = new
            else:
                template.append(intern(op))
        key = tuple(template)
        idx = templates.get(key)
        if idx is None:
            idx = templates[key] = len(table)
            table.append(template)
        return idx, nodes

    return encode


def plan_page(plan: Mapping[str, Any], report: Mapping[str, Any] | None = None) -> bytes:
    """The page of `plan --json`'s document; with `report` (the run's `--report` document), the
    page of that run: its counts, status and errors, the plan's per-tensor detail."""
    run = report is not None
    rep: Mapping[str, Any] = report if report is not None else plan["report"]
    page = _Page("run" if run else "plan", _PLAN_STATUSES, _PLAN_LEVELS)
    names, strs = page.names, page.strs
    missing = {m["path"]: m.get("did_you_mean") for m in rep.get("missing", [])}
    errors = list(rep.get("errors", []))
    if not run:  # problems a run would refuse that the apply report has no entry for (as the run's --report)
        known = {_error_text(e) for e in errors}
        errors += [{"path": str(plan.get("target")), "kind": _RUN_ERROR, "message": m, "expected": None,
                    "found": None} for m in plan.get("errors", []) if m not in known]
    tensor_errors: dict[str, list[str]] = {}
    for e in errors:
        if e.get("kind") != _RUN_ERROR:
            tensor_errors.setdefault(str(e.get("path")), []).append(_error_text(e))
    t, st = page.column("t"), page.column("st")
    src, ops_col, op_names, before, after, nbytes, module, why = (
        page.column(k) for k in ("s", "o", "on", "b", "a", "n", "m", "mr"))
    encode_ops = _op_encoder(page)
    code = page.status_code
    seen: set[str] = set()
    node, intern = names.node, strs.intern
    shape_texts: dict[tuple[Any, str], int] = {}
    module_texts: dict[tuple[Any, Any], int] = {}

    def shape_text(d: Mapping[str, Any] | None) -> int:
        if d is None:
            return -1
        dtype, shape = d.get("dtype"), d.get("shape")
        key = (dtype, str(shape))
        i = shape_texts.get(key)
        if i is None:
            i = shape_texts[key] = intern(_dtype_shape(dtype, shape))
        return i

    def add_row(target: str, status: str) -> int:
        t.append(node(target))
        st.append(code[status])
        return len(t) - 1

    applied_code, kept_code = code["applied"], code["kept"]
    for e in plan.get("entries", []):  # the hot loop of a 100k-tensor page: locals, memoised texts
        target = e["target"]
        seen.add(target)
        t.append(node(target))
        if target in tensor_errors:
            st.append(code["error"])
        else:
            st.append(kept_code if e.get("kept_from_template") else applied_code)
        source = e.get("source")
        src.append(node(source))
        ops = e.get("ops")
        if ops:
            idx, nodes = encode_ops(source, ops)
            ops_col.append(idx)
            op_names.append(nodes or 0)
        else:
            ops_col.append(-1)
            op_names.append(0)
        before.append(shape_text(e.get("before")))
        after.append(shape_text(e.get("after")))
        nbytes.append(e.get("nbytes", 0))
        m = e.get("module")
        if m is None:
            module.append(-1)
            why.append(-1)
        else:
            mkey = (m.get("type"), m.get("how"))
            mi = module_texts.get(mkey)
            if mi is None:
                mi = module_texts[mkey] = intern(f"{mkey[0] or '?'} ({mkey[1]})")
            module.append(mi)
            why.append(intern(m.get("reason") or None))
        if target in missing or target in tensor_errors:
            r = len(t) - 1
            if missing.get(target):
                page.note("hint", r, missing[target])
            if target in tensor_errors:
                page.note("error", r, "\n".join(tensor_errors[target]))

    def add_bare(target: str, status: str) -> int:
        r = add_row(target, status)
        for col, v in ((src, -1), (ops_col, -1), (op_names, 0), (before, -1), (after, -1), (nbytes, 0), (module, -1),
                       (why, -1)):
            col.append(v)
        seen.add(target)
        return r

    for path, hint in missing.items():
        if path not in seen:
            r = add_bare(path, "missing")
            if hint:
                page.note("hint", r, hint)
    for path, texts in tensor_errors.items():
        if path not in seen:
            r = add_bare(path, "error")
            page.note("error", r, "\n".join(texts))

    applied = rep.get("applied", [])
    page.summary = [
        _count_item("applied", "applied", len(applied), "✓", OK),
        _count_item("skipped", "skipped (filtered)", len(rep.get("skipped", [])), "⊘", OK),
        _count_item("missing", "missing in source", len(missing), "✗", WARN),
        _count_item("unused", "unused in source", len(rep.get("unused", [])), "?", WARN),
        _count_item("errors", "errors", len(errors), "!", ERR),
    ]
    source = str(rep.get("source") or plan.get("source"))
    target = str(rep.get("target") or plan.get("target"))
    page.info = [["Source", f"{source} ({plan.get('source_format')})"],
                 ["Target", f"{target} ({plan.get('target_format')})"]]
    if plan.get("template"):
        page.info.append(["Template", str(plan["template"])])
    if run:
        status = rep.get("status")
        written = "written" if rep.get("written") else "nothing written"
        page.info.append(["Run", f"{status} ({written})"])
        for k, v in (rep.get("overrides") or {}).items():
            page.info.append([f"--{k}", str(v)])
    else:
        page.info.append(["Plan", "would fail: nothing would be written" if errors else "would run"])
    page.info.append(["Tensors in target", f"{len(plan.get('entries', [])):,}"])
    _metadata_info(page, plan.get("metadata"), plan.get("scalars"))
    page.add_list("missing", "Missing tensors", "✗", WARN, ((p, f"Did you mean '{h}'?" if h else None)
                                                            for p, h in sorted(missing.items())),
                  "No tensor the target needs is missing.")
    page.add_list("unused", "Unused source tensors", "?", WARN, ((u, None) for u in rep.get("unused", [])),
                  "Every source tensor is used or filtered out.")
    page.add_list("skipped", "Skipped source tensors (filtered out)", "⊘", OK,
                  ((s, None) for s in rep.get("skipped", [])), "No source tensor was filtered out.")
    if rep.get("ops"):  # the recipe's op nodes (split, merge, permute, ...): which tensors each made
        page.add_list("ops", "Recipe ops", "⚙", OK, ((_op_node_text(n), None) for n in rep["ops"]))
    if rep.get("optimizer"):  # training_state: each optimizer state value's fate
        page.add_list("optimizer", "Optimizer state", "↻", OK, ((fate_text(f), None) for f in rep["optimizer"]))
    page.add_list("errors", "Errors", "!", ERR, ((_error_text(e), None) for e in errors), "No errors.")
    if plan.get("notes"):
        page.add_list("notes", "Notes", "i", OK, ((n, None) for n in plan["notes"]))
    what = "Migration run" if run else "Migration plan"
    return _html(page.payload(what, f"{source} → {target}"))


def diff_page(doc: Mapping[str, Any]) -> bytes:
    """The page of `diff --json`'s document: a row per tensor, a log-scale bar of its max abs diff."""
    page = _Page("diff", _DIFF_STATUSES, _DIFF_LEVELS)
    names, strs, code = page.names, page.strs, page.status_code
    t, st = page.column("t"), page.column("st")
    a_name, b_name, before, after, absd, reld, differing, nonfinite, first = (
        page.column(k) for k in ("an", "bn", "b", "a", "x", "y", "k", "nf", "f"))
    worst: list[tuple[float, str]] = []
    for e in doc.get("tensors", []):
        name = str(e.get("name") or e.get("b_name") or e.get("a_name"))
        status = e.get("status")
        t.append(names(name))
        st.append(code.get(str(status), code["different"]))
        a_name.append(-1 if e.get("a_name") in (None, name) else names(e["a_name"]))
        b_name.append(-1 if e.get("b_name") in (None, name) else names(e["b_name"]))
        before.append(strs(_dtype_shape(e.get("dtype_a"), e.get("shape_a"))))
        after.append(strs(_dtype_shape(e.get("dtype_b"), e.get("shape_b"))))
        d = e.get("max_abs_diff")
        absd.append(_finite(d))
        reld.append(_finite(e.get("max_rel_diff")))
        differing.append(e.get("differing"))
        nonfinite.append(e.get("nonfinite_differing") or 0)
        fi = e.get("first_index")
        first.append(None if fi is None else json.dumps(fi))
        if isinstance(d, (int, float)) and d != 0:
            worst.append((math.inf if d != d else float(d), name))
    summary = doc.get("summary", {})
    page.summary = [_count_item(k, label, int(summary.get(k, 0)), icon, level)
                    for k, label, icon, level in _DIFF_STATUSES]
    page.info = [["A", str(doc.get("a"))], ["B", str(doc.get("b"))]]
    mode = doc.get("mode")
    page.info.append(["Comparison", "bit-exact" if mode == "exact"
                      else f"tolerance (atol {doc.get('atol')}, rtol {doc.get('rtol')})"])
    if doc.get("recipe"):
        page.info.append(["Recipe", str(doc["recipe"])])
    if "matched" in doc:
        page.info.append(["Result", "A and B match" if doc["matched"] else "A and B differ"])
    worst.sort(key=lambda x: -x[0])
    page.add_list("largest", "Largest differences", "≠", ERR,
                  ((n, f"max abs diff {d:.6g}") for d, n in worst[:50]), "No tensor differs.")
    if doc.get("plan_errors"):
        page.add_list("plan-errors", "The recipe's plan fails", "!", ERR, ((str(m), None) for m in doc["plan_errors"]))
    dropped = doc.get("dropped") or {}
    for key, title in (("skipped", "Left out by the recipe: filtered"), ("unused", "Left out by the recipe: unused")):
        if dropped.get(key):
            page.add_list(f"dropped-{key}", title, "⊘", OK, ((str(n), None) for n in dropped[key]))
    return _html(page.payload("Diff", f"{doc.get('a')} ↔ {doc.get('b')}"))


_STAT_KEYS = (("min", "mn"), ("max", "mx"), ("mean", "me"), ("std", "sd"), ("mean_abs", "ma"),
              ("zeros_fraction", "z"), ("nan", "nan"), ("inf", "inf"))


def inspect_page(doc: Mapping[str, Any]) -> bytes:
    """The page of `inspect --json`'s document (with `--stats`: a value-range bar and the flags)."""
    page = _Page("inspect", _INSPECT_STATUSES, _INSPECT_LEVELS)
    names, strs = page.names, page.strs
    t, st, shape, nbytes, offset = (page.column(k) for k in ("t", "st", "a", "n", "off"))
    tensors = doc.get("tensors", [])
    with_stats = any("stats" in e for e in tensors)
    stat_cols = [(key, page.column(col)) for key, col in _STAT_KEYS] if with_stats else []
    flags_col = page.column("fl") if with_stats else None
    flag_lists: dict[tuple[str, ...], int] = {}
    flag_table: list[list[int]] = []
    flagged = 0
    for e in tensors:
        t.append(names(str(e.get("name"))))
        shape.append(strs(_dtype_shape(e.get("dtype"), e.get("shape"))))
        nbytes.append(e.get("nbytes", 0))
        offset.append(e.get("offset"))
        flags = tuple(str(f) for f in e.get("flags") or ())
        st.append(1 if flags else 0)
        flagged += bool(flags)
        if with_stats and flags_col is not None:
            stats = e.get("stats") or {}
            for key, col in stat_cols:
                col.append(_finite(stats.get(key)))
            if flags:
                idx = flag_lists.get(flags)
                if idx is None:
                    idx = flag_lists[flags] = len(flag_table)
                    flag_table.append([strs(f) for f in flags])
                flags_col.append(idx)
            else:
                flags_col.append(-1)
    page.extra["flags"] = flag_table
    page.extra["stats"] = with_stats
    totals = doc.get("totals") or {}
    page.summary = [_count_item("tensors", "tensors", int(totals.get("tensors", len(tensors))), "#", OK)]
    if with_stats:
        page.summary += [_count_item("flagged", "flagged", flagged, "⚠", WARN),
                         _count_item("unflagged", "no flags", len(tensors) - flagged, "✓", OK)]
    page.info = [["File", f"{doc.get('path')} ({doc.get('format')})"], ["File size", _size(doc.get("file_size"))],
                 ["Tensor bytes", _size(totals.get("nbytes"))]]
    _metadata_info(page, doc.get("metadata"), doc.get("scalars"))
    if with_stats:
        page.add_list("flagged", "Flagged tensors", "⚠", WARN,
                      ((str(e.get("name")), ", ".join(map(str, e["flags"]))) for e in tensors if e.get("flags")),
                      "No tensor is all zeros, all equal, or holds NaN or Inf.")
    warnings = (doc.get("details") or {}).get("warnings") or []
    if warnings:
        page.add_list("warnings", "Warnings", "⚠", WARN, ((str(w), None) for w in warnings))
    return _html(page.payload("Tensors", str(doc.get("path"))))


def _size(n: Any) -> str:
    if not isinstance(n, int):
        return "?"
    from ..core.display import human_bytes

    return f"{human_bytes(n)} ({n:,} bytes)"


def _asset(name: str) -> str:
    return resources.files("migrator.analysis").joinpath("assets", name).read_text(encoding="utf-8")


def _csp(script: str, style: str) -> str:
    """The page's policy: nothing may be fetched, and only the page's own script and stylesheet
    (by their sha256) run, so even markup that got into the page could run nothing."""
    def digest(text: str) -> str:
        return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"

    return (f"default-src 'none'; script-src {digest(script)}; style-src {digest(style)}; img-src data:; "
            "base-uri 'none'; form-action 'none'")


def _html(payload: Mapping[str, Any]) -> bytes:
    """The page: static markup, the inlined assets, the payload as escaped JSON."""
    css, js = _asset("report.css"), _asset("report.js")
    if "</" in css or "</script" in js.lower():  # an asset must never end its own element
        raise AssertionError("an inlined asset holds '</'")
    data = json_text(payload, indent=None, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    data = data.replace("<", "\\u003c")
    title = html.escape(redact(f"{payload['title']}: {payload['subtitle']}"))
    script, style = f"\n{js}", f"\n{css}"
    return "".join((
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n',
        f'<meta http-equiv="Content-Security-Policy" content="{_csp(script, style)}">\n',
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
        '<meta name="generator" content="migrator">\n',
        f"<title>{title}</title>\n<style>{style}</style>\n</head>\n<body>\n",
        '<noscript><p>This report needs JavaScript to show its tensors; its data is the JSON in the element '
        '<code>report-data</code>.</p></noscript>\n<div id="app"></div>\n',
        f'<script type="application/json" id="report-data">{data}</script>\n',
        f"<script>{script}</script>\n</body>\n</html>\n",
    )).encode("utf-8")


def write_page(path: str | os.PathLike[str], data: bytes, **options: Any) -> None:
    """Through the one atomic path every output takes (`atomic.write_file`)."""
    from ..storage.atomic import write_file

    write_file(path, data, **options)
