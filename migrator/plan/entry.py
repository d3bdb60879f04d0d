"""One tensor of a plan's output and how it is made (`build.PlanEntry`; its own module so that the
planner's helpers, such as `training_state`, can make entries without importing the planner)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.dtypes import DType
from ..core.tensor import LazyTensor

if TYPE_CHECKING:
    from ..transform.modules import ModuleType


@dataclass(slots=True)
class PlanEntry:
    """One tensor of the output and how it is made (slotted: a 100k-tensor plan holds 100k)."""

    target: str
    source: str | None  # name in the source file; None when a template value is kept
    tensor: LazyTensor  # the final lazy tensor (target name, dtype, shape, param_id)
    source_tensor: LazyTensor | None  # as read from the source file
    ops: tuple[str, ...] = ()
    module: ModuleType | None = None
    kept_from_template: bool = False
    optimizer: str | None = None  # optimizer state: "followed" (its parameter's plan) or "copied" (a scalar)

    @property
    def before(self) -> tuple[DType, tuple[int, ...]] | None:
        """The source tensor's dtype and shape."""
        t = self.source_tensor
        return None if t is None else (t.dtype, t.shape)
