"""Which parameter each id of a Hugging Face Trainer's `optimizer.pt` is.

The Trainer builds its optimizer from two param groups (`Trainer.create_optimizer`): the parameters
weight decay applies to (`Trainer.get_decay_parameter_names`), then the others, each in the model's
`named_parameters()` order, trainable ones only. torch numbers them 0, 1, ... in that order and saves
no names, and `model.safetensors` lists its tensors sorted by name: the order comes from the model's
code. It is derived without running a model, in this order:

1. a file the user gives (`param_order`: any state dict or template migrator reads, whose tensor
   names, in stored order, are the model's parameters in `named_parameters()` order): which of
   them is in which group is the one interleaving the moments' shapes allow (refused when several do);
2. transformers, when installed (`pip install 'migrator[trainer]'`): the architecture `config.json`
   names, built on the meta device (no weights, no remote code), and the installed Trainer's own
   decay rule;
3. otherwise the read is refused, saying what to pass.

Whatever derived it, the order is checked: the groups' sizes, every name a tensor of the model, and
every per-element state tensor (`exp_avg`, ...) shaped like its parameter. A misaligned optimizer
is never read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import FormatError

Shape = tuple[int, ...]

PER_ELEMENT = frozenset({"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg", "acc_delta",
                         "sum", "exp_inf", "ax", "grad_avg", "prev", "step_size", "mu", "nu"})
"""State keys torch's optimizers keep one value per element of the parameter under (Adam, AdamW,
Adamax, NAdam, RAdam, SGD, RMSprop, Adadelta, Adagrad, ASGD, Rprop; Lion's `mu`/`nu` kin): each must
have its parameter's shape."""

HINT = ("pass the model's parameter order: --param-order FILE (source.param_order in a recipe), a state dict "
        "saved from the model, e.g. torch.save(dict(model.named_parameters()), FILE), or install transformers "
        "(pip install 'migrator[trainer]') to derive it from config.json; or set training_state: drop")

GIVE_ORDER = ("pass the model's parameter order: --param-order FILE (source.param_order in a recipe), a state dict "
              "saved from the model the Trainer trained, e.g. torch.save(dict(model.named_parameters()), FILE); or "
              "set training_state: drop")

MAX_STATES = 100_000
"""Partial interleavings followed at once when matching a template to the groups (a bound on work)."""


class Unavailable(Exception):
    """No way to derive the order from this source (the message says why)."""


@dataclass
class Order:
    """Per param group, its parameters' names in the optimizer's order, and how that was derived."""

    groups: list[list[str]]
    rule: str


def parameter_order(folder: Path, model: Mapping[str, Shape], sizes: Sequence[int],
                    shapes: Sequence[dict[str, Shape]], label: str, param_order: str | os.PathLike[str] | None = None,
                    limits: Any = None) -> Order:
    """The names of the Trainer optimizer's ids: `model` the model's tensors (name -> shape), `sizes`
    each param group's count of ids, `shapes` per id (in the groups' order) its state tensors' shapes
    by key. Raises a one-line `FormatError` when no order is certain."""
    if param_order is not None:
        names = _template_names(param_order, model, limits)
        groups = _interleave(names, sizes, shapes, model, os.fspath(param_order), label)
        order = Order(groups, f"the parameter order of {os.fspath(param_order)}, grouped by the moments' shapes")
    else:
        try:
            names, decay = _from_transformers(folder / "config.json")
        except Unavailable as e:
            raise FormatError(f"optimizer.pt numbers its parameters in the order of the model's code and saves no "
                              f"names; {e}: {HINT}", file=label) from None
        if len(sizes) != 2:
            raise FormatError(f"optimizer.pt has {len(sizes)} param groups, not the Trainer's two (weight decay, "
                              f"none): a custom optimizer, whose order transformers cannot tell; {HINT}", file=label)
        groups = [[n for n in names if n in decay], [n for n in names if n not in decay]]
        order = Order(groups, "the Trainer's param groups of the model config.json describes (transformers)")
    check(order, model, sizes, shapes, label)
    return order


def check(order: Order, model: Mapping[str, Shape], sizes: Sequence[int], shapes: Sequence[dict[str, Shape]],
          label: str) -> None:
    """Refuse an order that contradicts the optimizer: group sizes, names, moments' shapes."""
    counts = [len(g) for g in order.groups]
    if counts != list(sizes):
        raise FormatError(f"optimizer.pt's param groups hold {list(sizes)} parameters, but {order.rule} gives "
                          f"{counts}: the order is not this optimizer's; {GIVE_ORDER}", file=label)
    flat = [n for g in order.groups for n in g]
    for i, name in enumerate(flat):
        if name not in model:
            raise FormatError(f"{order.rule} names parameter '{name}', which is no tensor of the model; {GIVE_ORDER}",
                              file=label, tensor=name)
        for key, shape in shapes[i].items():
            if shape != model[name]:
                raise FormatError(f"optimizer.pt's state {i} '{key}' has shape {list(shape)}, but its parameter by "
                                  f"{order.rule} is '{name}' of shape {list(model[name])}: the order is not this "
                                  f"optimizer's; {GIVE_ORDER}", file=label, tensor=name)


def per_element(state: Mapping[str, Shape], numel_of: Mapping[str, int]) -> dict[str, Shape]:
    """The per-element state of one id (key -> shape), to be checked against its parameter."""
    return {k: s for k, s in state.items() if k in PER_ELEMENT and numel_of.get(k, 0) > 1}


# ---------------------------------------------------------------------------------------------------
# a template's order


def _template_names(path: str | os.PathLike[str], model: Mapping[str, Shape], limits: Any) -> list[str]:
    from ..core.limits import DEFAULT_LIMITS
    from .sharded import ShardedReader, is_sharded_path
    from .single import open_single

    limits = DEFAULT_LIMITS if limits is None else limits
    try:  # a file or a model folder (not through files.io, which opens Trainer folders with this module)
        with (ShardedReader(path, "auto", limits=limits) if is_sharded_path(path) else
              open_single(path, "auto", limits, {})) as reader:
            names = reader.names()
    except OSError as e:
        raise FormatError(f"cannot read the parameter order: {e.strerror}", file=os.fspath(path)) from None
    # a state dict also lists tied weights twice and buffers: only the model's own tensors count
    return list(dict.fromkeys(n for n in names if n in model))


def _interleave(names: Sequence[str], sizes: Sequence[int], shapes: Sequence[dict[str, Shape]],
                model: Mapping[str, Shape], template: str, label: str) -> list[list[str]]:
    """Split `names` (in the model's order) into the groups, each keeping that order, so that every id's
    moments fit its parameter; refused unless exactly one split does."""
    total = sum(sizes)
    if len(names) != total:
        raise FormatError(f"{template} lists {len(names)} of the model's tensors, but optimizer.pt's param groups "
                          f"hold {total} parameters (frozen parameters or buffers?): save only the trained ones, "
                          f"e.g. {{n: p for n, p in model.named_parameters() if p.requires_grad}}", file=label)
    if len(sizes) > 2:
        raise FormatError(f"optimizer.pt has {len(sizes)} param groups: a template orders one or two (the Trainer's)",
                          file=label)
    starts = [0, sizes[0]] if len(sizes) == 2 else [0]

    def fits(name: str, g: int, k: int) -> bool:
        return all(s == model[name] for s in shapes[starts[g] + k].values())

    # partial interleavings: taken from group 0 -> (ways, one assignment), capped at two ways
    states: dict[int, tuple[int, tuple[int, ...]]] = {0: (1, ())}
    for p, name in enumerate(names):
        nxt: dict[int, tuple[int, tuple[int, ...]]] = {}
        for i, (ways, picks) in states.items():
            j = p - i
            for g, (k, new_i) in enumerate(((i, i + 1), (j, i))):
                if g < len(sizes) and k < sizes[g] and fits(name, g, k):
                    old = nxt.get(new_i)
                    nxt[new_i] = (min(2, ways + (old[0] if old else 0)), old[1] if old else (*picks, g))
        if not nxt:
            raise FormatError(f"the order of {template} fits no split of optimizer.pt's param groups: '{name}' "
                              "has no place whose moments have its shape; it is not this model's order", file=label,
                              tensor=name)
        if len(nxt) > MAX_STATES:
            raise FormatError(f"the order of {template} leaves too many ways to split it into optimizer.pt's param "
                              "groups (the moments' shapes tell too few parameters apart)", file=label)
        states = nxt
    ways, picks = states.get(sizes[0], (0, ()))
    if ways != 1:
        raise FormatError(f"{template}'s parameters can be split into optimizer.pt's param groups in several ways "
                          "that fit the moments' shapes: which parameter is in which group is not certain; install "
                          "transformers (pip install 'migrator[trainer]') to derive it from config.json", file=label)
    groups: list[list[str]] = [[] for _ in sizes]
    for name, g in zip(names, picks, strict=True):
        groups[g].append(name)
    return groups


# ---------------------------------------------------------------------------------------------------
# transformers' order


def trainer_groups(config_path: Path) -> list[list[str]]:
    """The Trainer's two param groups (decay, then none; each in `named_parameters()` order) of the model
    `config_path` describes, built with transformers on the meta device; `Unavailable` says why not."""
    names, decay = _from_transformers(config_path)
    return [[n for n in names if n in decay], [n for n in names if n not in decay]]



def _from_transformers(config_path: Path) -> tuple[list[str], set[str]]:
    """The model's trainable parameters in `named_parameters()` order and the names the Trainer decays,
    from the architecture `config_path` names, built on the meta device. transformers' own classes
    only: a config that needs remote code is not built."""
    from .model_config import MAX_CONFIG_BYTES

    if not config_path.is_file():
        raise Unavailable(f"no config.json beside it ({config_path.parent}) to build the model from")
    try:
        import torch
        import transformers
    except ImportError:
        raise Unavailable("transformers is not installed") from None
    from ..formats.bounded_json import read_json_object

    try:
        config = read_json_object(config_path, MAX_CONFIG_BYTES, "config.json")
    except Exception as e:  # any unreadable config: the hint still says what to pass
        raise Unavailable(f"config.json cannot be read ({e})") from None
    archs = config.get("architectures")
    if not isinstance(archs, list) or len(archs) != 1 or not isinstance(archs[0], str):
        raise Unavailable("config.json names no single architecture ('architectures')")
    cls = getattr(transformers, archs[0], None)
    if not isinstance(cls, type) or not issubclass(cls, transformers.PreTrainedModel):
        raise Unavailable(f"config.json's architecture '{archs[0]}' is not a transformers model class (remote code "
                          "is never run)")
    model_type = config.get("model_type")
    try:
        config_cls = transformers.CONFIG_MAPPING[str(model_type)]
    except KeyError:
        raise Unavailable(f"config.json's model_type {model_type!r} is not one transformers knows") from None
    try:
        with _quiet(transformers), torch.device("meta"):
            model = cls(config_cls.from_dict(config))
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        rule: Any = transformers.Trainer.get_decay_parameter_names  # the installed Trainer's rule; `self` unused
        decay = set(rule(None, model))
    except Exception as e:  # transformers' own errors on a config it cannot build
        raise Unavailable(f"transformers cannot build '{archs[0]}' from config.json ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return names, decay


@contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    """transformers' warnings and logs silenced while it builds an empty model (they are not ours to show)."""
    import warnings

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(level)
