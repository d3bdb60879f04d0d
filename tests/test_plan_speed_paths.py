"""The plan's speed paths give what the general code gives."""

from __future__ import annotations

import dataclasses

import pytest

from migrator import dtypes
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
