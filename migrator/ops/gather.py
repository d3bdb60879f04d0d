"""`gather`: rows of one dim picked by index (tensor.index_select(dim, index)): kept, dropped or
reordered by a list, a range or a map.

The picked indices are cut into runs of consecutive rows; each run is a `slice` (of a stored tensor,
a span of the file again) and the runs are joined end to end (`concat.concat`), so the output streams
band by band and nothing is held whole. A training checkpoint's moments are gathered the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, model_validator

from ..core.tensor import LazyTensor
from .base import Failed, Input, Int, Ints, Made, Op, Step, UnaryOptions, problem


class GatherSpec(UnaryOptions):
    """Rows of `dim` picked by index (tensor.index_select): exactly one of keep, drop, range, map."""

    dim: Int = Field(0, description="The dimension whose rows are picked (negative counts from the end).")
    keep: Ints | None = Field(None, description="The rows kept, in the output's order (reorders them); each at most "
                              "once. Negative indices count from the end.")
    drop: Ints | None = Field(None, description="The rows left out (each at most once); the others keep their order.")
    range: Ints | None = Field(None, description="[start, stop] or [start, stop, step] as Python's range "
                               "(step may be negative; stop may be negative, counting from the end).")
    map: dict[int, int] | None = Field(None, description="Input row -> output row: the output rows are exactly "
                                       "0..N-1, each once; input rows not listed are left out.")

    @model_validator(mode="after")
    def _one_way(self) -> GatherSpec:
        given = [k for k in ("keep", "drop", "range", "map") if getattr(self, k) is not None]
        if len(given) != 1:
            got = f" (got {', '.join(given)})" if given else ""
            raise problem(f"give exactly one of keep, drop, range, map{got}", hint="keep: [0, 2] keeps rows 0 and 2")
        for key in ("keep", "drop"):
            values = getattr(self, key)
            if values is not None:
                seen: set[int] = set()
                for v in values:
                    if v in seen:
                        raise problem(f"{key} lists row {v} twice", key=key,
                                      hint="repeat rows with repeat, or append copies with add_rows fill: row")
                    seen.add(v)
        if self.range is not None:
            if not 2 <= len(self.range) <= 3:
                raise problem(f"range {self.range}: give [start, stop] or [start, stop, step]", key="range")
            if len(self.range) == 3 and self.range[2] == 0:
                raise problem("range's step is 0", key="range")
        if self.map is not None:
            outs = sorted(self.map.values())
            first = next((i for i, v in enumerate(outs) if v != i), None)
            if first is not None:
                twice = first > 0 and outs[first] == outs[first - 1]
                raise problem(f"map's output rows must be 0..{len(outs) - 1}, each once: "
                              + (f"row {outs[first]} appears twice" if twice else f"row {first} is missing"), key="map")
        return self


class Gather(Op, name="gather"):
    options = GatherSpec
    summary = ("Keep, drop or reorder rows of one dim of each matching tensor by a list, a range or a map "
               "(tensor.index_select).")
    example = r"{gather: {from: 'model\.layers\.\d+\.block_sparse_moe\.gate\.weight', dim: 0, keep: [0, 2]}}"

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        spec, s = step.spec, inputs[0]
        step.byte_sized(s)
        name, shape = s.name, s.tensor.shape
        d = step.dim(spec.dim, len(shape), name, shape)
        index = picked(step, spec, shape[d], f"dim {d} of '{name}' (size {shape[d]}, shape {list(shape)})")
        if not index:
            step.fail(f"gather leaves no row of dim {d} of '{name}' (shape {list(shape)})", "from")
            raise Failed
        out = gather(s.tensor, step.output_name(name), d, index)
        return [(out, f"gather dim {d}: {described(index)}")]


def picked(step: Step, spec: GatherSpec, size: int, where: str) -> list[int]:
    """The input row of each output row, checked against `size`."""
    def row(v: int, key: str) -> int:
        r = v + size if v < 0 else v
        if not 0 <= r < size:
            step.fail(f"row {v} is outside {where}", key)
            raise Failed
        return r

    if spec.keep is not None:
        rows = [row(v, "keep") for v in spec.keep]
        if len(set(rows)) != len(rows):
            step.fail(f"keep names one row twice (negative and positive) in {where}", "keep")
            raise Failed
        return rows
    if spec.drop is not None:
        gone = {row(v, "drop") for v in spec.drop}
        if len(gone) != len(spec.drop):
            step.fail(f"drop names one row twice (negative and positive) in {where}", "drop")
            raise Failed
        return [r for r in range(size) if r not in gone]
    if spec.range is not None:
        start, stop, stride = (*spec.range, 1)[:3]
        rows = list(range(*slice(start, stop, stride).indices(size)))
        if not rows:
            step.fail(f"range {spec.range} picks no row of {where}", "range")
            raise Failed
        return rows
    assert spec.map is not None  # one of the four is given (the options' check)
    by_out = {out: row(v, "map") for v, out in spec.map.items()}
    if len(set(by_out.values())) != len(by_out):
        step.fail(f"map names one input row twice (negative and positive) in {where}", "map")
        raise Failed
    return [by_out[k] for k in range(len(by_out))]


def described(index: Sequence[int]) -> str:
    """The report's words for an index: short lists whole, long ones as their runs' count."""
    if len(index) <= 8:
        return f"rows {list(index)}"
    return f"{len(index)} rows in {len(runs(index))} runs"


def runs(index: Sequence[int]) -> list[tuple[int, int]]:
    """[start, stop) of each run of consecutive rows, in order."""
    out: list[tuple[int, int]] = []
    for v in index:
        if out and out[-1][1] == v:
            out[-1] = (out[-1][0], v + 1)
        else:
            out.append((v, v + 1))
    return out


def gather(t: LazyTensor, name: str, dim: int, index: Sequence[int]) -> LazyTensor:
    """`t.index_select(dim, index)`: each run of consecutive rows a slice, the slices joined."""
    from .concat import concat
    from .slice import slice_

    parts = runs(index)
    out_shape = (*t.shape[:dim], len(index), *t.shape[dim + 1:])
    if len(parts) == 1:
        return slice_(t, name, dim, *parts[0])
    if not parts:
        return slice_(t, name, dim, 0, 0)
    return concat([slice_(t, f"{name}[{a}:{b}]", dim, a, b) for a, b in parts], name, dim, out_shape)
