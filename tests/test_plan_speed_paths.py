"""The plan's speed paths give what the general code gives."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from migrator import dtypes, from_numpy, save
from migrator.plan import build_plan
from migrator.recipe import Recipe
from migrator.tensor import LazyTensor


def _slots(t: LazyTensor) -> tuple[object, ...]:
    return tuple(getattr(t, f.name) for f in dataclasses.fields(LazyTensor))


def test_hand_written_lazy_tensor_init_matches_the_fields() -> None:
    """LazyTensor.__init__ fills the slots itself: same order, defaults, keywords and frozenness."""
    f32 = dtypes.parse("F32")
    names = [f.name for f in dataclasses.fields(LazyTensor)]
    values = ["w", f32, (2, 3), 24, lambda: b"", None, 7, "file", None]
    assert _slots(LazyTensor(*values)) == tuple(values)
    assert _slots(LazyTensor(**dict(zip(names, values, strict=True)))) == tuple(values)
    short = LazyTensor("b", f32, (3,), 12, values[4])
    assert _slots(short) == ("b", f32, (3,), 12, values[4], None, None, None, None)
    assert [f.name for f in dataclasses.fields(LazyTensor) if f.default is dataclasses.MISSING] == names[:5]
    assert _slots(dataclasses.replace(short, name="c", param_id=3)) == ("c", f32, (3,), 12, values[4], None, 3, None,
                                                                         None)
    assert _slots(short.renamed("d"))[1:] == _slots(short)[1:]
    with pytest.raises(dataclasses.FrozenInstanceError):
        short.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        LazyTensor("a", f32, (1,), 4)  # type: ignore[call-arg]


def test_plan_ops_and_names_match_a_step_by_step_account(tmp_path: Path) -> None:
    """Shared ops tuples, the name lists and the per-signature module types change no entry."""
    tensors = []
    for layer in (0, 2, 3):  # a gap: indices are renumbered
        tensors += [from_numpy(f"m.h.{layer}.fc.weight", np.ones((4, 3), np.float32)),
                    from_numpy(f"m.h.{layer}.fc.bias", np.ones(4, np.float32)),
                    from_numpy(f"m.h.{layer}.ln_1.weight", np.ones(3, np.float32)),
                    from_numpy(f"m.h.{layer}.ln_1.bias", np.ones(3, np.float32))]
    tensors.append(from_numpy("m.wte.weight", np.ones((5, 3), np.float32)))
    save(tensors, tmp_path / "src.safetensors")
    r = Recipe.model_validate({"version": 1, "source": {"path": "src.safetensors", "contiguous_indices": True},
                               "remap": [{"from": r"^m\.", "to": ""}], "adapters": ["pytorch_to_burn"],
                               "dtype": {"cast": "F16"}, "target": {"path": "out.bpk"}})
    with build_plan(r, tmp_path) as plan:
        got = {e.source: (e.target, list(e.ops), e.module.name if e.module else None) for e in plan.entries}
    new_layer = {"0": "0", "2": "1", "3": "2"}
    want = {}
    for t in tensors:
        ops, name = [], t.name[2:]
        ops.append(f"remap {t.name} -> {name}")
        parts = name.split(".")
        if parts[0] == "h" and new_layer[parts[1]] != parts[1]:
            renumbered = ".".join([parts[0], new_layer[parts[1]], *parts[2:]])
            ops.append(f"index {name} -> {renumbered}")
            name = renumbered
        module = "Linear" if ".fc." in name else "LayerNorm" if ".ln_1." in name else "Embedding"
        if module == "Linear" and name.endswith("weight"):
            ops.append("transpose [4, 3] -> [3, 4]")
        if module == "LayerNorm":
            new = name.replace(".weight", ".gamma").replace(".bias", ".beta")
            ops.append(f"rename {name.rpartition('.')[2]} -> {new.rpartition('.')[2]}")
            name = new
        ops.append("cast F32 -> F16")
        want[t.name] = (name, ops, module)
    assert got == want
