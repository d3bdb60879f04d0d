"""What a target keeps beside its tensors: a PyTorch checkpoint's structure (each tensor where its
source was, under its new name) and burnpack's typed scalars."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import PlanError
from ..core.scalars import Scalar
from ..files.io import Reader
from ..formats.registry import is_format
from ..recipe.model import Recipe

if TYPE_CHECKING:
    from ..formats.pytorch.tree import Node


def checkpoint_structure(recipe: Recipe, reader: Reader, out_fmt: str, tpl_path: Path | None,
                         moved: Iterable[tuple[str | None, str]],
                         notes: list[str], fatal: list[str],
                         swap: Mapping[str, tuple[Node | None, int]] | None = None) -> Node | None:
    """The checkpoint's structure for a PyTorch -> PyTorch run of one whole source into one file (no
    top_level_key, template or shards; those write a flat state_dict), with each tensor where its
    source was, under its new name (`formats.pytorch.tree`; `moved` pairs each planned tensor's source
    name with its target name); None otherwise, or when refused (`fatal`). `swap`: containers put in
    place of the source's (an optimizer rebuilt for the output, or None to leave it out), by path."""
    tree = reader.structure
    if (tree is None or not is_format(out_fmt, keeps_structure=True) or recipe.target.shard is not None
            or tpl_path is not None):
        return None
    from ..formats.pytorch.tree import place_tensors

    names = reader.names()
    known = set(names)
    # an op's output made from several inputs names them all ("a, b"): it goes where its first input was
    moves = [(source if source in known else source.split(", ", 1)[0], target)
             for source, target in moved if source is not None]
    try:
        placed = place_tensors(tree, names, moves, reader.label, swap=swap)
    except PlanError as e:
        fatal.append(str(e))
        return None
    notes += placed.notes
    return placed.root


def target_scalars(recipe: Recipe, reader: Reader, out_fmt: str, notes: list[str],
                   fatal: list[str]) -> dict[str, Scalar]:
    """The burnpack scalars `target.scalars` asks for: the source's, none, or the recipe's own."""
    spec = recipe.target.scalars
    if spec == "none":
        return {}
    if spec == "keep":
        if not is_format(out_fmt, scalars=True):
            if reader.scalars:
                notes.append(f"{len(reader.scalars)} source scalars not written: {out_fmt} has no typed scalars")
            return {}
        return dict(reader.scalars)
    if not is_format(out_fmt, scalars=True):
        fatal.append(f"target.scalars: {out_fmt} files cannot hold typed scalars (only burnpack can)")
        return {}
    out: dict[str, Scalar] = {}
    for name, v in spec.items():
        if v.int_ is not None:
            out[name] = Scalar("Int", v.int_)
        elif v.uint is not None:
            out[name] = Scalar("UInt", v.uint)
        elif v.float_ is not None:
            out[name] = Scalar("Float", float(v.float_))
        else:
            out[name] = Scalar("Bool", bool(v.bool_))
    return out


def optimizer_as_weights(names: list[str], out_fmt: str, *, folder: bool, hint_syntax: str,
                         notes: list[str], fatal: list[str]) -> None:
    """A training checkpoint's optimizer state about to be written as weights (`names`: the output's),
    into a format with no place for it: refused for a model folder (what from_pretrained loads: three
    times the weights, and keys no model has), said for one file. A PyTorch target keeps it as state."""
    from ..core.display import count
    from ..naming.optimizer_names import optimizer_owners

    owners = optimizer_owners(names) if not is_format(out_fmt, keeps_structure=True) else {}
    if not owners:
        return
    inside = tuple(o + "." for o in owners if o)
    roots = sorted({n.split(".", 1)[0] for n in names if not n.startswith(inside) and "." in n})
    key = roots[0] if len(roots) == 1 else "KEY"
    option = f"--top-level-key {key}" if hint_syntax == "convert" else f"source.top_level_key: {key}"
    if len(roots) > 1 and inside and len(owners) == 1:  # the model at the top level beside it (Megatron's)
        pattern = "^" + inside[0].replace(".", "\\.")
        option = (f"--exclude '{pattern}'" if hint_syntax == "convert"
                  else f"filter: {{exclude: [{{regex: '{pattern}'}}]}}")
    where = ", ".join(f"'{o}'" if o else "the top level" for o in owners)
    what = f"{count(sum(owners.values()), 'tensor')} of optimizer state ({where})"
    alone = f"{option} writes the model alone (a .pt target keeps the whole checkpoint)"
    if folder:
        fatal.append(f"a model folder target would hold {what} as weights beside the model; {alone}")
    else:
        notes.append(f"{what} written as weights beside the model, as the source names them; {alone}")
