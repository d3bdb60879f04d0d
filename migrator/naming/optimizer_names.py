"""Which flat tensor names are a torch optimizer's per-parameter state, by name alone.

A whole training checkpoint read without its structure (into SafeTensors, a model folder, a burnpack)
names its optimizer's tensors `<owner>.state.<param>.<key>`: `optimizer.state.0.exp_avg` in a `.pt`,
`optim.state.layers.0.weight.exp_avg` in a DCP folder. Written as they are, they would be weights; the
plan refuses or says so (`plan/kept.py`), and a `top_level_key` that leaves them out says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

STATE_KEYS = ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg", "acc_delta",
              "grad_avg", "exp_inf", "mu_product", "ax", "eta", "mu", "prev", "step_size", "sum")
"""The per-parameter state tensors torch's optimizers keep (Adam, AdamW, SGD, RMSprop, Adadelta, Adamax,
NAdam, ASGD, Rprop, Adagrad; `step` a 0-d tensor of most): each under `state.<param>.`."""

_STATE = re.compile(r"^(?:(?P<owner>.+)\.)?state\.(?:.+\.)?(?:" + "|".join(STATE_KEYS) + r")$")


def optimizer_owners(names: Iterable[str]) -> dict[str, int]:
    """Each optimizer's dotted place (`optim`, `optimizer`; '' at the top level) -> how many of `names`
    are its per-parameter state, in the order first met."""
    owners: dict[str, int] = {}
    for name in names:
        m = _STATE.match(name)
        if m is not None:
            owner = m.group("owner") or ""
            owners[owner] = owners.get(owner, 0) + 1
    return owners
