"""The recipe's `ops:` as a lazy tensor graph: matched, checked from shapes alone, then built.

`apply_ops` runs after remap and filter and before adapters. Each op, in recipe order, sees the
names the previous one left: it matches its `from` pattern against whole names, groups the
matches into nodes (one per input for one-input ops; per first-pattern match, or per value of
the `over` group, for concat and stack), checks every node from dtypes and shapes (sizes add up,
dims exist, joined shapes and dtypes agree, reshapes keep the element count, each expected input is
there, no output lands on a name that stays) and replaces the node's inputs by its outputs, where
its first input was. Nothing is read: outputs are `lazy` tensors. Problems are recipe errors at
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
from ..naming import RemapRule, compile_regex, parse_usize
from ..recipe.merge_ops import MERGE_OP_NAMES
from ..recipe.ops import MAX_PARTS, op_kind_and_spec, substitute_index, whole_name_pattern
from . import lazy_ops as lazy

Origins = Mapping[tuple[int, str], tuple[str, int, int]]
"""(op index, key or '') -> (recipe file, line, column), from the loader."""


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


class _Failed(Exception):
    pass


class _Op:
    """One `ops:` entry being applied: its spec, where it is written, and the problems found."""

    def __init__(self, index: int, op: Any, origins: Origins | None, recipe_file: str,
                 head_dim: HeadDim | None = None) -> None:
        self.index = index
        self.head_dim = head_dim
        self.kind, self.spec = op_kind_and_spec(op)
        self.origins = origins or {}
        self.file = recipe_file
        self.issues: list[Any] = []
        pattern = self.spec.from_ if isinstance(self.spec.from_, str) else self.spec.from_[0]
        self.pattern = pattern
        self.regex = compile_regex(whole_name_pattern(pattern))
        self._rules: dict[str, RemapRule] = {}

    def where(self, key: str = "") -> tuple[str, int, int]:
        return self.origins.get((self.index, key)) or self.origins.get((self.index, "")) or (self.file, 0, 0)

    def at(self) -> str:
        f, line, col = self.where()
        return f"{f}:{line}:{col}" if line else f

    def fail(self, message: str, key: str = "", hint: str | None = None) -> None:
        from ..recipe.loader import RecipeIssue

        f, line, col = self.where(key)
        loc = f"ops[{self.index}].{self.kind}" + (f".{key}" if key else "")
        self.issues.append(RecipeIssue(f, line, col, loc, message, hint))

    def expand(self, template: str, name: str, index: int | None = None) -> str:
        text = substitute_index(template, index)
        rule = self._rules.get(text)
        if rule is None:
            rule = self._rules[text] = RemapRule(whole_name_pattern(self.pattern), text)
        return rule.apply(name)

    def dim(self, d: int, rank: int, name: str, shape: tuple[int, ...], key: str = "dim", extra: int = 0) -> int:
        n = rank + extra
        if not -n <= d < n:
            self.fail(f"dim {d} does not exist in '{name}' (shape {list(shape)}, rank {rank})", key)
            raise _Failed
        return d % n if n else 0


COMPUTING = frozenset(MERGE_OP_NAMES)
"""The ops that compute values (`recipe/merge_ops.py`, `transform/merging`)."""
JOINING = frozenset({"concat", "stack"} | COMPUTING - {"scale"})
"""The ops whose `from` may list several inputs."""

HeadDim = tuple[int, str, str]
"""The head size the model's config declares, how (`recipe.config.head_dim_of`), and the config's path."""


def apply_ops(ops: Sequence[Any], tensors: Sequence[LazyTensor], names: Sequence[str],
              remap_ops: Mapping[str, Sequence[str]] | None = None, origins: Origins | None = None,
              recipe_file: str = "<recipe>", head_dim: HeadDim | None = None) -> OpsResult:
    """The tensors and names after every op (new lists), or a `RecipeError` naming the op and tensors.
    `head_dim`: what the model's config declares, which each `rope_permute` must agree with."""
    from ..recipe.loader import RecipeError

    remap_ops = remap_ops or {}
    slots = [_Slot(n, t, t, tuple(remap_ops.get(t.name, ()))) for t, n in zip(tensors, names, strict=True)]
    nodes: list[OpNode] = []
    for i, op in enumerate(ops):
        step = _Op(i, op, origins, recipe_file, head_dim)
        slots = _apply_one(step, slots, nodes)
        if step.issues:
            raise RecipeError(_capped(step.issues))
    made = {id(s.tensor): (s.src, s.pre) for s in slots if s.made}
    return OpsResult([s.tensor for s in slots], [s.name for s in slots], made, nodes)


def _capped(issues: list[Any], limit: int = 10) -> list[Any]:
    """The first `limit` problems of an op and a count of the rest: one rule over 48 layers fails 48 times."""
    if len(issues) <= limit:
        return issues
    last = issues[limit - 1]
    more = dataclasses.replace(last, message=f"... and {len(issues) - limit} more like these", hint=None)
    return [*issues[:limit], more]


def _apply_one(step: _Op, slots: list[_Slot], nodes: list[OpNode]) -> list[_Slot]:
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
        except _Failed:
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


def _instances(step: _Op, slots: list[_Slot], by_name: dict[str, int]) -> list[list[int]]:
    """The nodes of this op, each as its input slots in order."""
    spec = step.spec
    matches = [(k, m) for k, s in enumerate(slots) if (m := step.regex.search(s.name)) is not None]
    if step.kind not in JOINING:
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


def _byte_sized(step: _Op, s: _Slot) -> None:
    if s.tensor.dtype.itemsize is None:
        step.fail(f"'{s.name}' is {s.tensor.dtype.display}: its elements are not whole bytes, so {step.kind} "
                  "cannot move them", "from")
        raise _Failed


def _out(step: _Op, src_slot: _Slot, tensor: LazyTensor, text: str) -> _Slot:
    return _Slot(tensor.name, tensor, src_slot.src, (*src_slot.pre, text), True)


def _check_heads(step: _Op, name: str, rows: int, heads: int) -> None:
    """A rope_permute's heads must cut the tensor's rows into heads of the size the recipe's `head_dim`
    and the model's config declare: a head count that merely divides the rows permutes the wrong pairs."""
    per = rows // heads
    given = step.spec.head_dim
    if given is not None and per != given:
        step.fail(f"'{name}' has {rows} rows: {heads} heads x head_dim {given} = {heads * given} do not fit", "heads")
        raise _Failed
    if step.head_dim is not None:
        size, how, path = step.head_dim
        if per != size:
            held = f"holds {rows // size} heads" if rows % size == 0 else "is not a whole number of heads"
            meta = "n_heads" in how  # Meta's params.json spells the counts its own way
            q, kv = ("n_heads", "n_kv_heads") if meta else ("num_attention_heads", "num_key_value_heads")
            step.fail(f"heads: {heads} cuts '{name}' ({rows} rows) into heads of {per}, but the config {path} says "
                      f"{how}: this tensor {held}", "heads",
                      f"take the count from the config: heads: ${{config.{q}}}, for k "
                      f"${{config.{kv} | config.{q}}}")
            raise _Failed


def _build(step: _Op, inputs: list[_Slot]) -> list[_Slot]:
    kind, spec = step.kind, step.spec
    s = inputs[0]
    t, name, shape = s.tensor, s.name, s.tensor.shape
    rank = len(shape)
    if kind in ("concat", "stack"):
        return [_join(step, inputs)]
    if kind in COMPUTING:
        return [_compute(step, inputs)]
    if kind == "reshape":
        target = _reshaped(step, s, list(spec.shape))
        out_name = step.expand(spec.to, name) if spec.to else name
        return [_out(step, s, lazy.reshape(t, out_name, target), f"reshape {list(shape)} -> {list(target)}")]
    if kind == "offset":
        return [_offset(step, s)]
    _byte_sized(step, s)
    if kind == "permute":
        dims = tuple(spec.dims)
        if len(dims) != rank:
            step.fail(f"dims {list(dims)} has {len(dims)} entries, but '{name}' has rank {rank} (shape {list(shape)})",
                      "dims")
            raise _Failed
        out_name = step.expand(spec.to, name) if spec.to else name
        return [_out(step, s, lazy.permute(t, out_name, dims), f"permute {list(dims)}")]
    if kind == "rope_permute":
        heads = spec.heads
        if rank not in (1, 2) or shape[0] % (2 * heads):
            step.fail(f"'{name}' (shape {list(shape)}) cannot be cut into {heads} heads of rotary pairs: its first dim "
                      f"must be a multiple of 2 x heads = {2 * heads}" if rank in (1, 2) else
                      f"'{name}' has rank {rank} (shape {list(shape)}); rope_permute takes a weight [out, in] or a "
                      "bias [out]", "heads" if rank in (1, 2) else "from")
            raise _Failed
        _check_heads(step, name, shape[0], heads)
        out_name = step.expand(spec.to, name) if spec.to else name
        text = f"rope_permute{' inverse' if spec.inverse else ''} heads {heads}"
        return [_out(step, s, lazy.rope_permute(t, out_name, heads, spec.inverse), text)]
    if kind == "slice":
        d = step.dim(spec.dim, rank, name, shape)
        size = shape[d]
        start = spec.start + size if spec.start < 0 else spec.start
        stop = size if spec.stop is None else spec.stop + size if spec.stop < 0 else spec.stop
        if not 0 <= start <= stop <= size:
            step.fail(f"[{spec.start}:{'' if spec.stop is None else spec.stop}] is outside dim {d} of '{name}' "
                      f"(size {size}, shape {list(shape)})", "stop" if stop > size or stop < start else "start")
            raise _Failed
        out_name = step.expand(spec.to, name) if spec.to else name
        return [_out(step, s, lazy.slice_(t, out_name, d, start, stop), f"slice dim {d} [{start}:{stop}]")]
    if kind == "split":
        d = step.dim(spec.dim, rank, name, shape)
        size = shape[d]
        if spec.sizes is not None:
            sizes = list(spec.sizes)
            if sum(sizes) != size:
                step.fail(f"sizes {sizes} add up to {sum(sizes)}, but '{name}' has {size} along dim {d} "
                          f"(shape {list(shape)})", "sizes")
                raise _Failed
        else:
            if size % spec.parts:
                step.fail(f"'{name}' has {size} along dim {d} (shape {list(shape)}): not divisible into {spec.parts} "
                          "equal parts", "parts", "give sizes: [...] for unequal parts")
                raise _Failed
            if spec.parts > MAX_PARTS:  # checked by the recipe too; a caller may build specs itself
                step.fail(f"split into {spec.parts} parts: at most {MAX_PARTS}", "parts")
                raise _Failed
            sizes = [size // spec.parts] * spec.parts
        outs, start = [], 0
        for k, n in enumerate(sizes):
            template = spec.to[k] if isinstance(spec.to, list) else spec.to
            out_name = step.expand(template, name, k)
            outs.append(_out(step, s, lazy.slice_(t, out_name, d, start, start + n),
                             f"split dim {d}: part {k} of {len(sizes)} [{start}:{start + n}]"))
            start += n
        return outs
    if kind == "unstack":
        d = step.dim(spec.dim, rank, name, shape)
        if shape[d] > MAX_PARTS:  # a header may declare [2**40, 0]: that many names would exhaust memory
            step.fail(f"unstacking '{name}' (shape {list(shape)}) along dim {d} would make {shape[d]} tensors "
                      f"(at most {MAX_PARTS})", "dim")
            raise _Failed
        rest = (*shape[:d], *shape[d + 1:])
        outs = []
        for k in range(shape[d]):
            out_name = step.expand(spec.to, name, k)
            part = lazy.slice_(t, out_name, d, k, k + 1)
            outs.append(_out(step, s, lazy.reshape(part, out_name, rest), f"unstack dim {d}: index {k}"))
        return outs
    raise AssertionError(kind)


def _offset(step: _Op, s: _Slot) -> _Slot:
    """x + value, checked now (a float input of a castable dtype), computed when written."""
    from ..core.casts import CASTABLE
    from ..core.dtypes import parse

    spec, t = step.spec, s.tensor
    if not t.dtype.is_float or t.dtype.name not in CASTABLE:
        step.fail(f"'{s.name}' is {t.dtype.display}: offset adds to F64, F32, F16 or BF16 tensors", "from")
        raise _Failed
    out_dtype = parse(spec.dtype) if spec.dtype else t.dtype
    out_name = step.expand(spec.to, s.name) if spec.to else s.name
    text = f"offset {spec.value:+g}" + (f" -> {out_dtype.name}" if out_dtype != t.dtype else "")
    return _out(step, s, lazy.offset(t, out_name, float(spec.value), out_dtype), text)


def _reshaped(step: _Op, s: _Slot, want: list[int]) -> tuple[int, ...]:
    shape = s.tensor.shape
    numel = 1
    for d in shape:
        numel *= d
    known = 1
    for d in want:
        if d != -1:
            known *= d
    if -1 in want:
        if known == 0 or numel % known:
            step.fail(f"shape {want} cannot hold the {numel} elements of '{s.name}' (shape {list(shape)})", "shape")
            raise _Failed
        want = [numel // known if d == -1 else d for d in want]
    elif known != numel:
        step.fail(f"shape {want} has {known} elements, '{s.name}' has {numel} (shape {list(shape)})", "shape")
        raise _Failed
    target = tuple(want)
    if s.tensor.dtype.nbytes(target) != s.tensor.nbytes:
        step.fail(f"'{s.name}' is {s.tensor.dtype.display}: packed elements cannot be regrouped as {want}", "shape")
        raise _Failed
    return target


def _join(step: _Op, inputs: list[_Slot]) -> _Slot:
    spec, kind = step.spec, step.kind
    first = inputs[0]
    for s in inputs:
        _byte_sized(step, s)
    shape, dtype = first.tensor.shape, first.tensor.dtype
    rank = len(shape)
    d = step.dim(spec.dim, rank, first.name, shape, extra=1 if kind == "stack" else 0)
    bad = [s for s in inputs[1:] if s.tensor.dtype != dtype]
    if bad:
        step.fail(f"{kind} inputs differ in dtype: '{first.name}' is {dtype.display}, '{bad[0].name}' is "
                  f"{bad[0].tensor.dtype.display}", "from")
        raise _Failed
    for s in inputs[1:]:
        other = s.tensor.shape
        same = other == shape if kind == "stack" else (
            len(other) == rank and all(a == b for k, (a, b) in enumerate(zip(other, shape, strict=True)) if k != d))
        if not same:
            rule = "equal shapes" if kind == "stack" else f"equal shapes except along dim {d}"
            step.fail(f"{kind} needs {rule}: '{first.name}' is {list(shape)}, '{s.name}' is {list(other)}", "from")
            raise _Failed
    parts = [s.tensor for s in inputs]
    if kind == "stack":
        lifted = (*shape[:d], 1, *shape[d:])
        parts = [lazy.reshape(p, p.name, lifted) for p in parts]
        out_shape = (*shape[:d], len(inputs), *shape[d:])
    else:
        out_shape = (*shape[:d], sum(s.tensor.shape[d] for s in inputs), *shape[d + 1:])
    out_name = step.expand(spec.to, first.name)
    tensor = lazy.concat(parts, out_name, d, out_shape)
    label = ", ".join(dict.fromkeys(s.src.name for s in inputs))
    src = first.src if label == first.src.name else first.src.renamed(label)
    return _Slot(out_name, tensor, src, (f"{kind} dim {d} of {len(inputs)}",), True)


_TASK_DEFAULTS: dict[str, tuple[str | None, str | None, bool, bool]] = {
    "task_arithmetic": (None, None, False, False), "ties": ("magnitude", "sum", True, False),
    "dare_ties": ("random", "sum", False, True), "dare_linear": ("random", None, False, True)}
"""(sparsify, consensus, normalize, rescale) of each task-arithmetic op when the recipe does not say: mergekit's."""


def _compute(step: _Op, inputs: list[_Slot]) -> _Slot:
    """A computed tensor (`recipe/merge_ops.py`): shapes and dtypes checked now, values when written."""
    from ..core.dtypes import parse
    from ..core.errors import AdapterError, MergeInputError, UnsupportedDTypeError
    from .merging import arithmetic, lora

    spec, kind = step.spec, step.kind
    first = inputs[0]
    out_name = step.expand(spec.to, first.name) if spec.to else first.name
    dtype = parse(spec.dtype) if spec.dtype else None
    ts = [s.tensor.renamed(s.name) for s in inputs]  # errors name the tensors as the recipe sees them
    try:
        if kind == "linear":
            tensor = arithmetic.linear(out_name, ts, spec.weights, normalize=spec.normalize, out_dtype=dtype)
            text = f"linear of {len(ts)}, weights {spec.weights}"
        elif kind == "scale":
            tensor = arithmetic.scale(out_name, ts[0], spec.factor, out_dtype=dtype)
            text = f"scale {spec.factor}"
        elif kind == "slerp":
            tensor = arithmetic.slerp(out_name, ts[0], ts[1], spec.t, out_dtype=dtype)
            text = f"slerp t {spec.t}"
        elif kind == "lora_fold":
            tensor = lora.fold(out_name, ts[0], lora.Fold(ts[1], ts[2], spec.scaling, form=spec.form),
                               out_dtype=dtype)
            text = f"lora_fold scaling {spec.scaling}"
        else:
            sparsify, consensus, normalize, rescale = _TASK_DEFAULTS[kind]
            tensor = arithmetic.task_arithmetic(
                out_name, ts[0], ts[1:], spec.weights, densities=spec.densities(),
                sparsify=sparsify,  # type: ignore[arg-type]
                consensus=consensus,  # type: ignore[arg-type]
                normalize=normalize if spec.normalize is None else spec.normalize, lambda_=spec.lambda_,
                rescale=rescale if spec.rescale is None else spec.rescale, seed=spec.seed, out_dtype=dtype)
            text = f"{kind} of {len(ts)}, weights {spec.weights}"
    except (MergeInputError, AdapterError, UnsupportedDTypeError) as e:
        step.fail(e.detail if e.tensor is None or e.tensor in e.detail else f"'{e.tensor}': {e.detail}", "from")
        raise _Failed from None
    label = ", ".join(dict.fromkeys(s.src.name for s in inputs))
    src = first.src if label == first.src.name else first.src.renamed(label)
    return _Slot(out_name, tensor, src, (text,), True)
