"""The per-tensor steps of a compilation (`build.Compilation`) that need none of its state: names
after remaps and contiguous indices, tensors adapted, results by name or in source order, a result fit
to a template slot, and the hints a mismatch gets."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.dtypes import DType
from ..core.errors import LimitExceededError, MigratorError, PlanError
from ..core.limits import Limits
from ..core.tensor import LazyTensor
from ..naming import KeyRemapper, NamingError, RemapRule, contiguous_names, find_collisions, strip_enum_variant
from ..recipe.model import Recipe
from .casts import Casts, apply_cast
from .entry import PlanEntry
from .report import ReportError


def enum_free(name: str) -> str:
    """The name with every enum-variant-looking segment removed: Burn strips the variants its live
    module has; a file has no module, so every inner CamelCase segment counts."""
    while (stripped := strip_enum_variant(name)) is not None:
        name = stripped
    return name


@dataclass
class Declarations:
    """Adapter errors that one module declaration each would fix ((type, module path, what it does)),
    and every module path of the plan, so that one hint covers them all (`modules.declaration_hint`)."""

    wanted: list[tuple[str, str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

Item = tuple[LazyTensor, LazyTensor, tuple[str, ...], Any]
"""A kept source tensor after renames and adapters: (source, result, ops, module)."""


def check_name_lengths(names: Iterable[str], limits: Limits, file: str) -> None:
    """Refuse a name longer than `limits.max_name_chars` (when set: 0, the default, is no cap) before
    any pattern sees it. Patterns run on RE2 in time linear in the name, so no cap is needed for speed."""
    most = limits.max_name_chars
    if not most:
        return
    for name in names:
        if len(name) > most:
            raise LimitExceededError(f"tensor name of {len(name):,} characters ('{name[:60]}...'): names longer than "
                                     f"{most} characters are not matched against patterns (max_name_chars)", file=file)


def renamed(recipe: Recipe, names: list[str], renumber_default: bool, label: str,
             describe: Callable[[str], str] = repr, renumbered: list[tuple[str, str]] | None = None
             ) -> tuple[list[str], dict[str, list[str]]]:
    """Step 1, names: remaps, then contiguous indices (`renumber_default` when the recipe does not
    say: a PyTorch source whose output is for Burn). Returns the new names (`names` itself when none
    changes) and the ops of the renamed tensors only; each renumbering (name before -> after) is
    appended to `renumbered`. `describe` shows a source name in an error (with several sources:
    which one it is from)."""
    ops: dict[str, list[str]] = {}  # only for renamed tensors: most names pass unchanged
    remapper = KeyRemapper([RemapRule(r.from_, r.to, r.syntax) for r in recipe.remap]) if recipe.remap else None
    current = names
    if remapper is not None:
        try:
            current = list(map(remapper.remap_name, names))
        except NamingError as e:  # validated already; kept for safety
            raise PlanError(f"remap: {e}") from None
        ops = {orig: [f"remap {orig} -> {new}"] for orig, new in zip(names, current, strict=True) if new != orig}
    # several sources: each entry renumbered its own indices already
    contiguous = recipe.source.contiguous_indices if recipe.source is not None else False
    if contiguous is None:
        contiguous = renumber_default
    if contiguous:
        mapped = contiguous_names(current)
        if mapped is not current:
            for orig, before, new in zip(names, current, mapped, strict=True):
                if new is not before and new != before:  # unchanged names come back as the same object
                    ops.setdefault(orig, []).append(f"index {before} -> {new}")
                    if renumbered is not None:
                        renumbered.append((before, new))
        current = mapped
    # a set is enough to know there is no collision; find_collisions only names them
    collisions = find_collisions(zip(current, names, strict=True)) if len(set(current)) != len(current) else None
    if collisions:
        lines = [f"'{new}' <- {', '.join(describe(o) for o in origs)}" for new, origs in sorted(collisions.items())]
        raise PlanError("several source tensors map to the same name after remap/indices: " + "; ".join(lines),
                        file=label)
    return current, ops


def adapted(kept: list[LazyTensor], kept_names: list[str], ops: dict[str, list[str]], adapter: Any, resolver: Any,
             errors: list[ReportError], made: dict[int, tuple[LazyTensor, Any]] | None = None,
             declares: Declarations | None = None) -> Iterator[Item]:
    """Each kept tensor renamed, then adapted; a tensor whose adapter fails is reported in `errors` and
    left out. Lazy, so a plan without a template never holds these tuples for all tensors at once.
    `made`: op outputs (by id) -> the source tensor the report names and their ops so far."""
    if adapter is None or resolver is None:
        for t, new in zip(kept, kept_names, strict=True):
            pre = ops.get(t.name) if ops else None
            src = t
            if made and id(t) in made:
                src, pre = made[id(t)]
            yield src, t if new is t.name or new == t.name else t.renamed(new), () if pre is None else tuple(pre), None
        return
    resolve, adapt = resolver.resolve, adapter.adapt
    for t, new in zip(kept, kept_names, strict=True):
        base = t if new is t.name or new == t.name else t.renamed(new)
        pre = ops.get(t.name) if ops else None
        src = t
        if made and id(t) in made:
            src, pre = made[id(t)]
        try:
            module = resolve(new)
            result = adapt(base, module)
        except MigratorError as e:
            errors.append(ReportError.adapter_error(new, e.detail, source=src.name))
            if declares is not None and getattr(e, "declare", None) is not None:
                declares.wanted.append(e.declare)  # type: ignore[attr-defined]
            continue
        yield src, result.tensor, result.ops if pre is None else (*pre, *result.ops), module


def by_name(items: Iterable[Item], fatal: list[str]) -> dict[str, Item]:
    """Results by name; two results with one name are fatal (the later one is kept)."""
    by_name: dict[str, Item] = {}
    for item in items:
        name = item[1].name
        if name in by_name:
            fatal.append(f"adapters map '{by_name[name][0].name}' and '{item[0].name}' onto the same name "
                         f"'{name}'")
        by_name[name] = item
    return by_name


def in_source_order(items: Iterator[Item], cast_to: DType | None) -> tuple[list[PlanEntry], list[str]]:
    """An entry per adapted tensor, cast by the dtype policy, and the names applied."""
    entries: list[PlanEntry] = []
    applied: list[str] = []
    append_entry, append_applied = entries.append, applied.append
    cast = Casts(cast_to)
    joined: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[str, ...]] = {}  # few distinct op lists
    for src, result, t_ops, module in items:
        tensor, more = cast(result)
        name = result.name
        if more and t_ops:  # e.g. transpose + cast: one shared tuple per distinct pair, not one per tensor
            all_ops = joined.get((t_ops, more))
            if all_ops is None:
                all_ops = t_ops + more
                if len(joined) < 4096:
                    joined[(t_ops, more)] = all_ops
        else:
            all_ops = more or t_ops
        append_entry(PlanEntry(name, src.name, tensor, src, all_ops, module))
        append_applied(name)
    return entries, applied


def alternative_name(adapter: Any, resolver: Any, slot_name: str,
                 by_name: dict[str, tuple[LazyTensor, LazyTensor, tuple[str, ...], Any]]) -> str | None:
    """Burn's alternative-name lookup: the template's `norm.gamma` may be the source's `norm.weight`."""
    if resolver is None:
        return None
    module_path, _, param = slot_name.rpartition(".")
    try:
        module = resolver.resolve(slot_name)
    except MigratorError:  # a conflicting declaration: reported where the source tensor is adapted
        return None
    if module.name is None:
        return None
    alt = adapter.alternative_name(param, module)
    if alt is None:
        return None
    key = f"{module_path}.{alt}" if module_path else alt
    return key if key in by_name else None


def fit_to_slot(slot: LazyTensor, item: Item, recipe: Recipe, cast_to: DType | None,
                errors: list[ReportError]) -> PlanEntry:
    """Put a source tensor (after renames and adapters) into a template slot: shape check, dtype policy,
    param_id, name."""
    src, result, ops, module = item
    if result.shape != slot.shape:
        errors.append(ReportError.shape_mismatch(slot.name, slot.shape, result.shape, source=src.name,
                                                 hint=shape_hint(result, slot.shape, ops, recipe)))
        return PlanEntry(slot.name, src.name, slot, src, (*ops, "shape mismatch: template value kept"), module, True)
    tensor, more = apply_cast(result, cast_to)
    if recipe.dtype == "template" and tensor.dtype != slot.dtype:
        if tensor.dtype.is_float and slot.dtype.is_float:
            tensor, more = apply_cast(tensor, slot.dtype)
        else:
            errors.append(ReportError.dtype_mismatch(slot.name, slot.dtype.display, tensor.dtype.display,
                                                     source=src.name))
            return PlanEntry(slot.name, src.name, slot, src, ops, module, True)
    param_id = src.param_id if src.param_id is not None else slot.param_id
    final = replace(tensor, name=slot.name, param_id=param_id)
    return PlanEntry(slot.name, src.name, final, src, (*ops, *more), module)


def shape_hint(result: LazyTensor, expected: tuple[int, ...], ops: tuple[str, ...], recipe: Recipe) -> str | None:
    """What likely fixes a 2-D weight that arrives transposed (the one mismatch with a usual cause)."""
    found = result.shape
    if len(found) != 2 or found[::-1] != tuple(expected):
        return None
    from ..transform.modules import GPT2_CONV1D, exact_regex, module_path, yaml_quoted

    path = module_path(result.name)
    entry = "modules: {%s: [" + yaml_quoted(exact_regex(path)) + "]}"
    if GPT2_CONV1D.match(path.rpartition(".")[2]):
        return (f"GPT-2's Conv1D is stored [in, out], already Burn's Linear layout: declare {entry % 'Conv1D'} "
                "(kept as stored)")
    if any(op.startswith("transpose") for op in ops):
        return "an adapter transposed it as a Linear's weight; if it is none, declare its module's type in modules:"
    layout = [a for a in recipe.adapters if a in ("pytorch_to_burn", "burn_to_pytorch")]
    if layout:
        return f"{layout[0]} transposes only Linear weights: declare it a Linear, {entry % 'Linear'}"
    return "the shape is transposed: add pytorch_to_burn to adapters: (burn_to_pytorch from a Burn file)"
