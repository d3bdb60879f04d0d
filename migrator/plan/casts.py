"""The dtype policy's casts of a plan's tensors: which cast each source dtype gets, and the ops text
the plan shows for it, each decided once per dtype pair rather than once per tensor."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from ..core.dtypes import DType
from ..core.tensor import LazyTensor

_CAST_OPS: dict[tuple[DType, DType], tuple[str, ...]] = {}
"""The ops text of each (from, to) cast, made once: a 100k-tensor plan would format it 100k times."""


def apply_cast(t: LazyTensor, to: DType | None) -> tuple[LazyTensor, tuple[str, ...]]:
    if to is None:
        return t, ()
    dtype = t.dtype
    if not dtype.is_float or dtype == to:
        return t, ()
    from ..core.casts import cast

    return cast(t, to), cast_ops(dtype, to)


def cast_ops(dtype: DType, to: DType) -> tuple[str, ...]:
    text = _CAST_OPS.get((dtype, to))
    if text is None:
        text = _CAST_OPS[(dtype, to)] = (f"cast {dtype.display} -> {to.display}",)
    return text


class Casts:
    """The dtype policy's cast for one plan's tensors, decided once per source dtype, not per tensor.

    Keyed by the dtype's identity (a C-level id() rather than DType's Python-level hash): the plan's
    tensors keep their dtypes alive, and the entry keeps it too, so an id is never reused meanwhile.
    """

    def __init__(self, to: DType | None) -> None:
        self.to = to
        self.by_dtype: dict[int, tuple[DType, Callable[[LazyTensor], LazyTensor] | None, tuple[str, ...]]] = {}

    def __call__(self, t: LazyTensor) -> tuple[LazyTensor, tuple[str, ...]]:
        """As `apply_cast(t, to)`."""
        if self.to is None:
            return t, ()
        how = self.by_dtype.get(id(t.dtype))
        if how is None:
            how = self.by_dtype[id(t.dtype)] = self._decide(t.dtype, self.to)
        _, fn, text = how
        return (t, ()) if fn is None else (fn(t), text)

    @staticmethod
    def _decide(dtype: DType, to: DType) -> tuple[DType, Callable[[LazyTensor], LazyTensor] | None, tuple[str, ...]]:
        if not dtype.is_float or dtype == to:
            return dtype, None, ()
        from ..core.casts import cast, caster

        one = caster(dtype, to)
        if one is None:  # not a plain float cast: `cast` decides (and names the tensor in its error)
            one = partial(cast, to=to)
        return dtype, one, cast_ops(dtype, to)
