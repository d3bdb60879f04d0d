"""The recipe's `ops:` as a lazy tensor graph: matched, grouped into nodes, checked, then built.

This is the engine only: what each op checks and makes is its module's (`migrator.ops`, `Op.build`).

`apply_ops` runs after remap and filter and before adapters. Each op, in recipe order, sees the
names the previous one left: it matches its `from` pattern against whole names, groups the
matches into nodes (one per input for one-input ops; per first-pattern match, or per value of
the `over` group, for concat and stack), checks every node from dtypes and shapes (sizes add up,
dims exist, joined shapes and dtypes agree, reshapes keep the element count, each expected input is
there, no output lands on a name that stays) and replaces the node's inputs by its outputs, where
its first input was. Nothing is read: outputs are lazy tensors. Problems are recipe errors at
the op's LINE:COL, all of one op at once; a later op is not checked once one has failed.

Output names are expanded with naming's remap replacement (`RemapRule`) against the whole-name
match, so whatever that replacement syntax supports applies here too; `$i` is the part index.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.tensor import LazyTensor
from ..naming import parse_usize
from ..ops.base import Failed, HeadDim, Origins, Step


@dataclass(frozen=True)
class OpNode:
    """One op applied to one set of inputs: what the plan and the report list."""

    op: str
    index: int  # position in ops:
    at: str  # 'recipe.yaml:LINE:COL' or ''
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "index": self.index, "at": self.at, "inputs": list(self.inputs),
                "outputs": list(self.outputs)}


@dataclass
class OpsResult:
    tensors: list[LazyTensor]
    names: list[str]
    made: dict[int, tuple[LazyTensor, tuple[str, ...]]]
    """id(output tensor) -> (the source tensor the report names, its ops text)."""
    nodes: list[OpNode] = field(default_factory=list)


@dataclass
class _Slot:
    name: str
    tensor: LazyTensor
    src: LazyTensor  # as the report names it: the source tensor (or, joined, the first renamed to all)
    pre: tuple[str, ...]
    made: bool = False


def apply_ops(ops: Sequence[Any], tensors: Sequence[LazyTensor], names: Sequence[str],
              remap_ops: Mapping[str, Sequence[str]] | None = None, origins: Origins | None = None,
              recipe_file: str = "<recipe>", head_dim: HeadDim | None = None, for_state: bool = False) -> OpsResult:
    """The tensors and names after every op (new lists), or a `RecipeError` naming the op and tensors.
    `head_dim`: what the model's config declares, which each `rope_permute` must agree with; `for_state`:
    the tensors are an optimizer's moments in their parameters' places (`Op.new_rows`)."""
    from ..recipe.loader import RecipeError, RecipeIssue

    remap_ops = remap_ops or {}
    slots = [_Slot(n, t, t, tuple(remap_ops.get(t.name, ()))) for t, n in zip(tensors, names, strict=True)]
    nodes: list[OpNode] = []
    for i, op in enumerate(ops):
        step = Step(i, op, origins, recipe_file, head_dim, for_state)
        slots = _apply_one(step, slots, nodes)
        if step.issues:
            raise RecipeError(_capped([RecipeIssue(*issue) for issue in step.issues]))
    made = {id(s.tensor): (s.src, s.pre) for s in slots if s.made}
    return OpsResult([s.tensor for s in slots], [s.name for s in slots], made, nodes)


def _capped(issues: list[Any], limit: int = 10) -> list[Any]:
    """The first `limit` problems of an op and a count of the rest: one rule over 48 layers fails 48 times."""
    if len(issues) <= limit:
        return issues
    last = issues[limit - 1]
    more = dataclasses.replace(last, message=f"... and {len(issues) - limit} more like these", hint=None)
    return [*issues[:limit], more]


def _apply_one(step: Step, slots: list[_Slot], nodes: list[OpNode]) -> list[_Slot]:
    kind, spec = step.kind, step.spec
    by_name = {s.name: k for k, s in enumerate(slots)}
    groups = _instances(step, slots, by_name)
    if step.issues:
        return slots
    if not groups:
        if not spec.optional:
            step.fail(f"'{step.pattern}' matches no tensor name", "from", _names_hint(slots))
        return slots
    consumed: dict[int, int] = {}  # slot -> node
    built: list[tuple[list[int], list[_Slot]]] = []
    for g, members in enumerate(groups):
        inputs = [slots[k] for k in members]
        for k in members:
            if k in consumed:
                step.fail(f"'{slots[k].name}' is an input of two {kind} nodes", "from")
            consumed[k] = g
        try:
            outs = _build(step, inputs)
        except Failed:
            continue
        built.append((members, outs))
    if step.issues:
        return slots
    # outputs may not collide with each other, nor with a name that stays
    staying = {s.name for k, s in enumerate(slots) if k not in consumed}
    seen: dict[str, str] = {}
    for members, outs in built:
        first = slots[members[0]].name
        for o in outs:
            if o.name in seen:
                step.fail(f"two outputs are named '{o.name}' (from '{seen[o.name]}' and '{first}')", "to")
            elif o.name in staying:
                step.fail(f"output '{o.name}' (from '{first}') is already a tensor name that this op does not "
                          "consume", "to", "name the output differently, or remap or filter out the other tensor")
            seen[o.name] = first
    if step.issues:
        return slots
    at = step.at()
    firsts = {members[0]: outs for members, outs in built}
    out: list[_Slot] = []
    for k, s in enumerate(slots):
        if k in firsts:
            out.extend(firsts[k])
        elif k not in consumed:
            out.append(s)
    for members, outs in built:
        nodes.append(OpNode(kind, step.index, at, tuple(slots[k].name for k in members), tuple(o.name for o in outs)))
    return out


def _names_hint(slots: list[_Slot]) -> str:
    shown = ", ".join(f"'{s.name}'" for s in slots[:3])
    more = f" (of {len(slots)})" if len(slots) > 3 else ""
    return (f"patterns match whole names after remap and filter, e.g. {shown}{more}; set optional: true if it "
            "may match nothing") if slots else "no tensors are left after remap and filter"


def _instances(step: Step, slots: list[_Slot], by_name: dict[str, int]) -> list[list[int]]:
    """The nodes of this op, each as its input slots in order."""
    spec = step.spec
    matches = [(k, m) for k, s in enumerate(slots) if (m := step.regex.search(s.name)) is not None]
    if not step.op.joins:
        return [[k] for k, _ in matches]
    if isinstance(spec.from_, list):
        out = []
        for k, _ in matches:
            members = [k]
            for j, template in enumerate(spec.from_[1:], start=1):
                want = step.expand(template, slots[k].name)
                if want not in by_name:
                    step.fail(f"input '{want}' (from[{j}], for '{slots[k].name}') is not a tensor name", "from")
                    continue
                members.append(by_name[want])
            out.append(members)
        return out
    over = spec.over
    group_no = over if isinstance(over, int) else step.regex.groupindex[over]
    others = [g for g in range(1, step.regex.groups + 1) if g != group_no]
    keyed: dict[tuple[str | None, ...], list[tuple[int, int]]] = {}
    for k, m in matches:
        text = m.group(group_no)
        value = parse_usize(text) if text is not None else None
        if value is None:
            step.fail(f"'{slots[k].name}': group {over} is '{text}', not an index", "over")
            continue
        keyed.setdefault(tuple(m.group(g) for g in others), []).append((value, k))
    out = []
    for indexed in keyed.values():
        indexed.sort()
        indices = [v for v, _ in indexed]
        # the first place the sorted indices leave 0, 1, 2, ...: found in one pass, whatever the
        # indices are (0 and 4e9 must not build a four-billion-entry range to name the gap)
        first = next((i for i, v in enumerate(indices) if v != i), None)
        if first is not None:
            names = ", ".join(f"'{slots[k].name}'" for _, k in indexed[:4])
            twice = first > 0 and indices[first] == indices[first - 1]
            what = f"index {indices[first]} appears twice" if twice else f"index {first} is missing"
            step.fail(f"{step.kind} inputs must have indices 0..N-1 in group {over}: {what} (inputs {names}"
                      f"{', ...' if len(indexed) > 4 else ''})", "over")
            continue
        out.append([k for _, k in indexed])
    return out


def _build(step: Step, inputs: list[_Slot]) -> list[_Slot]:
    """The node's outputs as slots. An op of several inputs, or one computing values, starts the report's
    history afresh (its source is the inputs' names joined); any other carries its input's on."""
    made = step.op.build(step, inputs)
    if step.op.joins or step.op.computes:
        first = inputs[0]
        label = ", ".join(dict.fromkeys(s.src.name for s in inputs))
        src = first.src if label == first.src.name else first.src.renamed(label)
        return [_Slot(t.name, t, src, (text,), True) for t, text in made]
    s = inputs[0]
    return [_Slot(t.name, t, s.src, (*s.pre, text), True) for t, text in made]
