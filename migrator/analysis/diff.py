"""Compare two checkpoints tensor by tensor, streamed: `migrate diff A B`.

Pairs: by name; through a recipe (A is its source, B its output: each A tensor goes through the
plan's renames, layout ops and casts, and is compared with B's tensor of the planned name); or
through convert-style options (a one-off recipe). A tensor the plan casts is cast by migrator's
own bit-exact kernels before the comparison, so a correct cast compares equal in exact mode,
and differences are measured between the values as B stores them (widened to float64).

Values, window by window (windows.py): bytes compared with memcmp first, so identical data costs
one read and one compare; only windows that differ, or the windows of a cross-dtype tolerance
comparison, are looked at element by element, in blocks of BLOCK elements. What holds:

- exact mode (the default): elements equal when their bits are equal: a NaN equals a NaN with the
  same payload, -0.0 differs from 0.0. Different dtypes are a `dtype_mismatch`.
- tolerance mode (`atol` or `rtol` given): |a - b| <= atol + rtol * |b| (numpy's isclose), any NaN
  equals any NaN, an infinity only itself. Numeric tensors of different dtypes are compared by
  value; their dtypes show in the entry.
- `max_abs_diff` and `max_rel_diff` (|a - b| / |b|, over b != 0) are over the pairs where both
  values are finite; pairs with a NaN or infinity that differ are counted in `differing` and in
  `nonfinite_differing`, never as an infinite difference (the JSON stays standard JSON).
- `first_index`: the first differing element's index in B's shape (row-major).
- dtypes without a numpy view (packed F4/F6, QFloat) compare as bytes; `differing` is then None
  for a tensor that differs.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core import native
from ..core.dtypes import DType, Kind
from ..core.tensor import LazyTensor
from ..files.io import Reader, open_file
from ..recipe.convert_options import DIFF
from .windows import DEFAULT_WINDOW, Window, windows

if TYPE_CHECKING:  # numpy is imported when a window differs: identical models never need it
    import numpy as np

    from ..plan.build import Plan

Planner = Callable[[Callable[["Plan"], Any]], Any]
"""Opens a recipe's plan, calls the function with it, returns what it returned (`diff_document`)."""

BLOCK = 1 << 17
"""Elements looked at per step in a window that differs: its float64 scratch stays small."""

STATUSES = ("identical", "close", "different", "only_in_a", "only_in_b", "shape_mismatch", "dtype_mismatch")
MATCHED = frozenset({"identical", "close"})
_ITEM_SIZES = (1, 2, 4, 8)  # compared as unsigned integers of that width


def _uint(itemsize: int) -> Any:
    import numpy as np

    return {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize]


@dataclass(frozen=True)
class Tolerance:
    atol: float = 0.0
    rtol: float = 0.0


@dataclass
class Pair:
    """One row of the diff: B's tensor and what A makes of it (None where one side lacks it)."""

    name: str
    a: LazyTensor | None
    b: LazyTensor | None
    a_name: str | None
    b_name: str | None
    ops: tuple[str, ...] = ()
    from_template: bool = False


def _numeric(dtype: DType) -> bool:
    return dtype.numpy_name is not None and dtype.kind in (Kind.FLOAT, Kind.INT, Kind.UINT, Kind.BOOL)


def _same_bytes(x: Window, y: Window) -> bool:
    """memcmp: bytes/bytearray compare with it (windows.py hands those out for gathered windows),
    the compiled `same_bytes` for any two buffers; else numpy (two memoryviews compare element
    by element in Python, over ten times slower)."""
    if type(x) in (bytes, bytearray):
        return bool(x == y)
    if type(y) in (bytes, bytearray):
        return bool(y == x)
    if len(x) != len(y):
        return False
    kernels = native.kernels
    if kernels is not None:
        return bool(kernels.same_bytes(x, y))
    if len(x) <= 1 << 16:
        return bytes(x) == y
    import numpy as np

    unit = np.uint64 if len(x) % 8 == 0 else np.uint8  # fewer, wider elements: a smaller bool temporary
    return bool(np.array_equal(np.frombuffer(x, dtype=unit), np.frombuffer(y, dtype=unit)))


def _values(raw: np.ndarray) -> np.ndarray:
    """Numeric elements as float64 values (bools as 0/1)."""
    import numpy as np

    if raw.dtype.name == "bfloat16":
        raw = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float64)


_F64_MAX = sys.float_info.max
"""Where a difference beyond float64's range is shown: JSON holds no Infinity (`diff --json`)."""


class _Tally:
    """What the element-wise looks found so far in one tensor."""

    __slots__ = ("differing", "first", "max_abs", "max_rel", "nonfinite")

    def __init__(self) -> None:
        self.differing = 0
        self.first: int | None = None
        self.max_abs = 0.0
        self.max_rel: float | None = None
        self.nonfinite = 0

    def note(self, base: int, mismatch: np.ndarray, va: np.ndarray | None, vb: np.ndarray | None) -> None:
        """`mismatch`: the block's differing elements (bool); `va`/`vb`: the values whose differences
        count (None: not numeric)."""
        import numpy as np

        count = int(np.count_nonzero(mismatch))
        if count and self.first is None:
            self.first = base + int(np.argmax(mismatch))
        self.differing += count
        if va is None or vb is None or len(va) == 0:
            return
        finite = np.isfinite(va) & np.isfinite(vb)
        if not finite.all():
            self.nonfinite += int(np.count_nonzero(mismatch & ~finite))
            va, vb = va[finite], vb[finite]
            if len(va) == 0:
                return
        with np.errstate(over="ignore"):  # two finite F64s can differ by more than F64 holds
            d = np.abs(va - vb)
            self.max_abs = max(self.max_abs, min(float(d.max()), _F64_MAX))
            mag = np.abs(vb)
            nz = mag != 0
            if nz.any():
                rel = min(float((d[nz] / mag[nz]).max()), _F64_MAX)
                self.max_rel = rel if self.max_rel is None else max(self.max_rel, rel)


def compare(a: LazyTensor, b: LazyTensor, tol: Tolerance | None = None,
            window: int = DEFAULT_WINDOW) -> dict[str, Any]:
    """The comparison fields of one pair: status, max_abs_diff, max_rel_diff, differing, first_index
    (and nonfinite_differing). Shapes must be equal for values to be compared."""
    out: dict[str, Any] = {"status": None, "max_abs_diff": None, "max_rel_diff": None, "differing": None,
                           "first_index": None}
    if a.shape != b.shape:
        out["status"] = "shape_mismatch"
        return out
    same_dtype = a.dtype == b.dtype
    if not same_dtype and (tol is None or not (_numeric(a.dtype) and _numeric(b.dtype))):
        out["status"] = "dtype_mismatch"
        return out
    numel = b.numel
    if same_dtype:
        identical, tally = _compare_same(a, b, tol, window)
    else:
        identical, tally = False, _compare_values(a, b, tol or Tolerance(), window)
    if identical:
        out.update(status="identical", max_abs_diff=0.0, max_rel_diff=0.0 if numel else None, differing=0)
        return out
    out["status"] = "close" if tally is not None and tally.differing == 0 else "different"
    if tally is None:  # compared as bytes only
        return out
    numeric = _numeric(b.dtype) and b.dtype.kind is not Kind.COMPLEX
    out["differing"] = tally.differing
    out["nonfinite_differing"] = tally.nonfinite
    if numeric:
        out["max_abs_diff"] = tally.max_abs
        out["max_rel_diff"] = tally.max_rel if tally.max_rel is not None else (0.0 if tally.max_abs == 0 else None)
    if tally.first is not None:
        out["first_index"] = _unravel(tally.first, b.shape)
    return out


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    """A flat row-major index as an index into `shape`."""
    index = []
    for dim in reversed(shape):
        flat, i = divmod(flat, dim)
        index.append(i)
    return index[::-1]


def _compare_same(a: LazyTensor, b: LazyTensor, tol: Tolerance | None,
                  window: int) -> tuple[bool, _Tally | None]:
    """(bit-identical, tally of the windows that differ; None when the dtype has no elements to
    look at, e.g. packed F4 or QFloat)."""
    dtype = b.dtype
    itemsize = dtype.itemsize
    elementwise = itemsize in _ITEM_SIZES
    # whole elements per window, one at least (`--window 1` on F32 data)
    step = max(itemsize, window - window % itemsize) if elementwise and itemsize else window
    tally = _Tally() if elementwise else None
    identical = True
    base = 0
    for wa, wb in zip(windows(a, step), windows(b, step), strict=True):
        if _same_bytes(wa, wb):
            base += len(wb) // (itemsize or 1)
            continue
        identical = False
        if tally is None:
            continue
        _look(wa, wb, dtype, dtype, tol, base, tally)
        base += len(wb) // itemsize  # type: ignore[operator]
    return identical, tally


def _look(wa: Window, wb: Window, da: DType, db: DType, tol: Tolerance | None, base: int, tally: _Tally) -> None:
    """Element by element, one window pair that differs (or is of two dtypes)."""
    import numpy as np

    ra = np.frombuffer(wa, dtype=da.numpy() if da.numpy_name else _uint(da.itemsize or 1))
    rb = np.frombuffer(wb, dtype=db.numpy() if db.numpy_name else _uint(db.itemsize or 1))
    numeric = _numeric(da) and _numeric(db) and Kind.COMPLEX not in (da.kind, db.kind)
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, len(rb), BLOCK):
            xa, xb = ra[start:start + BLOCK], rb[start:start + BLOCK]
            va = _values(xa) if numeric else None
            vb = _values(xb) if numeric else None
            if tol is None or not numeric:  # bits (complex and byte-coded dtypes: always)
                ua = xa.view(_uint(xa.dtype.itemsize))
                ub = xb.view(_uint(xb.dtype.itemsize))
                mismatch = ua != ub
                if numeric and va is not None and vb is not None:
                    va, vb = va[mismatch], vb[mismatch]  # equal bits: a difference of 0
                    tally.note(base + start, mismatch, va, vb)
                else:
                    tally.note(base + start, mismatch, None, None)
                continue
            assert va is not None and vb is not None
            close = (va == vb) | (np.isnan(va) & np.isnan(vb))
            d = np.abs(va - vb)
            close |= d <= tol.atol + tol.rtol * np.abs(vb)
            tally.note(base + start, ~close, va, vb)


def _compare_values(a: LazyTensor, b: LazyTensor, tol: Tolerance, window: int) -> _Tally:
    """Tolerance mode across dtypes: aligned windows of the same element count on both sides."""
    isa, isb = a.dtype.numpy().itemsize, b.dtype.numpy().itemsize
    elements = max(1, window // max(isa, isb))
    tally = _Tally()
    base = 0
    for wa, wb in zip(windows(a, elements * isa), windows(b, elements * isb), strict=True):
        _look(wa, wb, a.dtype, b.dtype, tol, base, tally)
        base += len(wb) // isb
    return tally


def direct_pairs(ra: Reader, rb: Reader) -> list[Pair]:
    """Pairs by name, in B's order, then A's tensors B lacks in A's order."""
    by_a = {t.name: t for t in ra.tensors}
    pairs = [Pair(t.name, by_a.get(t.name), t, t.name if t.name in by_a else None, t.name) for t in rb.tensors]
    in_b = {t.name for t in rb.tensors}
    pairs += [Pair(t.name, t, None, t.name, None) for t in ra.tensors if t.name not in in_b]
    return pairs


def plan_pairs(plan: Plan, rb: Reader) -> list[Pair]:
    """Pairs of the plan's output tensors (A through the recipe) with B's, in B's order, then
    planned tensors B lacks. Template values the plan keeps are compared too (`from_template`)."""
    by_b = {t.name: t for t in rb.tensors}
    planned: dict[str, Pair] = {}
    for e in plan.entries:
        planned[e.target] = Pair(e.target, e.tensor, by_b.get(e.target), None if e.kept_from_template else e.source,
                                 e.target if e.target in by_b else None, tuple(e.ops), e.kept_from_template)
    pairs = []
    for t in rb.tensors:
        pair = planned.pop(t.name, None)
        pairs.append(pair if pair is not None else Pair(t.name, None, t, None, t.name))
    pairs += planned.values()
    return pairs


def diff_pairs(pairs: Sequence[Pair], tol: Tolerance | None = None, window: int = DEFAULT_WINDOW,
               each: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """A tensor entry per pair (see the module docstring and `diff_document`)."""
    entries = []
    for p in pairs:
        entry: dict[str, Any] = {
            "name": p.name, "a_name": p.a_name, "b_name": p.b_name, "status": None,
            "dtype_a": p.a.dtype.display if p.a is not None else None,
            "dtype_b": p.b.dtype.display if p.b is not None else None,
            "shape_a": list(p.a.shape) if p.a is not None else None,
            "shape_b": list(p.b.shape) if p.b is not None else None,
            "max_abs_diff": None, "max_rel_diff": None, "differing": None, "first_index": None,
        }
        if p.ops:
            entry["ops"] = list(p.ops)
        if p.from_template:
            entry["from_template"] = True
        if p.b is None:
            entry["status"] = "only_in_a"
        elif p.a is None:
            entry["status"] = "only_in_b"
        else:
            entry.update(compare(p.a, p.b, tol, window))
        if each is not None:
            each(entry)
        entries.append(entry)
    return entries


def prefix_hint(entries: Sequence[dict[str, Any]]) -> str | None:
    """When the names only in A are those only in B with a prefix more (or less), such as a training
    checkpoint's `model.`: the option that pairs them. None when no prefix pairs half of them."""
    only_a = [e["name"] for e in entries if e["status"] == "only_in_a"]
    only_b = [e["name"] for e in entries if e["status"] == "only_in_b"]
    if not only_a or not only_b:
        return None
    best: tuple[int, str, str] | None = None  # (names paired, prefix, side that has it)
    for longer, shorter, side in ((only_a, set(only_b), "A"), (only_b, set(only_a), "B")):
        # the prefixes a few names have before a name of the other side (an optimizer's come first too)
        prefixes = {n[:i + 1] for n in longer[:64] for i, ch in enumerate(n) if ch == "." and n[i + 1:] in shorter}
        for prefix in sorted(prefixes):
            paired = sum(1 for n in longer if n.startswith(prefix) and n[len(prefix):] in shorter)
            if best is None or paired > best[0]:
                best = (paired, prefix, side)
    if best is None or best[0] * 2 < min(len(only_a), len(only_b)):
        return None
    paired, prefix, side = best
    escaped = prefix.replace(".", "\\.")
    if side == "A":
        how = f"--top-level-key {prefix[:-1]} (or --remap '^{escaped}=') reads A without it"
    else:
        how = f"--remap '^={prefix}' gives A's names the prefix"
    return f"{paired:,} names only in {side} are the other side's with the prefix '{prefix}': {how}"


def summary(entries: Sequence[dict[str, Any]]) -> dict[str, int]:
    counts = dict.fromkeys(STATUSES, 0)
    for e in entries:
        counts[e["status"]] += 1
    return counts


def matched(doc: dict[str, Any]) -> bool:
    """Every tensor identical or close, and nothing else wrong (a plan that cannot run)."""
    s = doc["summary"]
    return all(s[k] == 0 for k in STATUSES if k not in MATCHED) and not doc.get("plan_errors")


def tolerance(atol: float | None, rtol: float | None) -> Tolerance | None:
    """Tolerance mode when either is given (the other then 0); None: exact mode."""
    if atol is None and rtol is None:
        return None
    for name, v in (("atol", atol), ("rtol", rtol)):
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise ValueError(f"--{name} must be a finite number >= 0, got {v}")
    return Tolerance(atol or 0.0, rtol or 0.0)


def _options_plan(a: str | os.PathLike[str], b: str | os.PathLike[str], options: dict[str, Any],
                  b_format: str) -> Plan:
    """A one-off recipe from convert-style options (`recipe.convert.build_recipe`); its target is never written.
    It is planned as B's format when B is a burnpack (so a PyTorch A is renumbered by default, as
    `convert` to a .bpk does), else as SafeTensors (names kept)."""
    from ..formats.registry import default_sharded, is_format
    from ..plan.build import build_plan
    from ..recipe.convert import build_recipe

    planned_as = b_format if is_format(b_format, for_burn=True) else default_sharded().name
    recipe = build_recipe(a, os.path.abspath(os.fspath(b)), target_format_name=planned_as, overwrite=True,
                          **options)
    return build_plan(recipe, Path.cwd(), overwrite=True)


PLAN_OPTIONS = DIFF
"""`recipe.convert.build_recipe` options `diff_document` takes (the rows of `ConvertOptions` marked for
diff; any set but `source_format` and `top_level_key`: through a plan)."""


@dataclass(frozen=True)
class DiffOptions:
    """How `diff_document` compares A and B, as one value (what `migrate diff`'s options say).

    `recipe`: A is that recipe's source (in place of its `source.path`), B its output. `atol`/`rtol`:
    tolerance mode when either is given (`tolerance`), else exact. `b_format`: how B is read. `window`:
    the bytes compared at a time. `convert`: `recipe.convert.build_recipe`'s options for A (`remaps`,
    `adapters`, `dtype`, `modules`, `contiguous_indices`, `includes`, `excludes`: `PLAN_OPTIONS`) make a
    one-off recipe the same way; `source_format` and `top_level_key` only say how to read A;
    `dtype` also dequantizes a quantized B."""

    recipe: str | os.PathLike[str] | None = None
    atol: float | None = None
    rtol: float | None = None
    b_format: str = "auto"
    window: int = DEFAULT_WINDOW
    convert: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, keywords: Mapping[str, Any]) -> DiffOptions:
        """From `diff_document`'s keywords: this value's fields, and convert's options for A."""
        own = {f.name for f in fields(cls)} - {"convert"}
        return cls(**{k: v for k, v in keywords.items() if k in own},
                   convert={k: v for k, v in keywords.items() if k not in own})


def diff_document(a: str | os.PathLike[str], b: str | os.PathLike[str], compare_as: DiffOptions | None = None, *,
                  planner: Planner | None = None, each: Callable[[dict[str, Any]], None] | None = None,
                  **keywords: Any) -> dict[str, Any]:
    """The `migrate diff --json` document comparing A and B (files, folders, indexes, globs), as
    `compare_as` says (a `DiffOptions`), or its fields and convert's options as keywords.

    With a `recipe`, its plan is opened by `planner`, which calls the function it is given with the
    open plan and returns what that returned (`migrate diff` passes the engine,
    `migrator.run.recipe.run_recipe` with `use=`: the plan is built as `migrate run` builds it, and
    never written). `each` is called with every tensor entry as it is made.
    """
    if compare_as is not None and keywords:
        raise TypeError("give DiffOptions or their keywords, not both")
    given = compare_as if compare_as is not None else DiffOptions.of(keywords)
    recipe, atol, rtol, b_format, window = given.recipe, given.atol, given.rtol, given.b_format, given.window
    options = given.convert
    unknown = set(options) - set(PLAN_OPTIONS)
    if unknown:
        raise TypeError(f"unknown options: {', '.join(sorted(unknown))}")
    tol = tolerance(atol, rtol)
    through_plan = {k: v for k, v in options.items() if v not in (None, (), [], False)
                    and k not in ("source_format", "top_level_key")}
    if "contiguous_indices" in options and options["contiguous_indices"] is False:
        through_plan["contiguous_indices"] = False
    doc: dict[str, Any] = {"a": os.fspath(a), "b": os.fspath(b), "mode": "exact" if tol is None else "tolerance",
                           "atol": None if tol is None else tol.atol, "rtol": None if tol is None else tol.rtol,
                           "recipe": os.fspath(recipe) if recipe is not None else None}
    # a quantized B (its config.json declares a scheme) is dequantized by the same cast as A: two
    # schemes of one model compare as values (within a tolerance), not as codes and scales
    cast = options.get("dtype")
    with open_file(b, b_format, **({"dequantize": cast} if cast else {})) as rb:
        if recipe is not None or through_plan:
            if recipe is not None and through_plan:
                raise ValueError("give a recipe or convert options, not both")
            def compare(plan: Plan) -> list[dict[str, Any]]:
                found = diff_pairs(plan_pairs(plan, rb), tol, window, each)
                doc["a_format"], doc["b_format"] = plan.source_format, rb.format
                doc["plan_errors"] = list(plan.fatal)
                doc["dropped"] = {"skipped": list(plan.report.skipped), "unused": list(plan.report.unused)}
                return found

            if recipe is not None:
                if planner is None:
                    raise TypeError("a recipe's plan is opened by `planner` (migrator.run.recipe.run_recipe)")
                entries = planner(compare)
            else:
                read = {k: options[k] for k in ("source_format", "top_level_key") if options.get(k)}
                with _options_plan(a, b, {**through_plan, **read}, rb.format) as plan:
                    entries = compare(plan)
        else:
            read = {"top_level_key": options["top_level_key"]} if options.get("top_level_key") else {}
            with open_file(a, options.get("source_format") or "auto", **read) as ra:
                entries = diff_pairs(direct_pairs(ra, rb), tol, window, each)
                doc["a_format"], doc["b_format"] = ra.format, rb.format
    doc["summary"] = summary(entries)
    doc["hint"] = prefix_hint(entries)
    doc["tensors"] = entries
    doc["matched"] = matched(doc)
    return doc

