"""What the Python API accepts as tensors and scalars, turned into numpy arrays and `Scalar`s
(`tensor.as_tensors` makes the arrays lazy tensors).

A user hands `save`, `to_bytes` and `from_numpy` whatever they hold: numpy arrays, torch
tensors (parameters, bf16, tensors that need grad), other array libraries, plain Python numbers.
torch is never imported here: a torch tensor is recognised by its class (`torch.Tensor` in its
MRO, looked up by module and name), and torch's own functions are taken from the module that
made it (`sys.modules`), which is loaded whenever such a tensor exists.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .errors import MigratorError
from .scalars import Scalar

if TYPE_CHECKING:
    import numpy as np


def is_torch_tensor(obj: object) -> bool:
    return any(c.__name__ == "Tensor" and c.__module__ == "torch" for c in type(obj).__mro__)


def as_array(obj: Any, name: str) -> np.ndarray:
    """`obj` as a numpy array, sharing its memory where the library allows."""
    import numpy as np

    if isinstance(obj, np.ndarray):
        return obj
    if is_torch_tensor(obj):
        return _torch_array(obj, name)
    if hasattr(obj, "__dlpack__"):
        try:
            return np.from_dlpack(obj)
        except (TypeError, BufferError, RuntimeError, ValueError):
            pass  # e.g. a dtype dlpack cannot carry: the other ways may still work
    if hasattr(obj, "__array__") or isinstance(obj, (list, tuple, int, float, bool)):
        return np.asarray(obj)
    to_numpy = getattr(obj, "numpy", None)
    if callable(to_numpy):
        return np.asarray(to_numpy())
    raise MigratorError(f"cannot make a tensor of a {type(obj).__module__}.{type(obj).__qualname__} (give a numpy "
                        "array, a torch tensor, a LazyTensor or anything with __array__ or __dlpack__)", tensor=name)


def _torch_array(t: Any, name: str) -> np.ndarray:
    """A torch tensor's values as numpy: on the CPU, detached, conjugation resolved; dtypes numpy
    lacks (bf16, float8) are viewed as same-width integers by torch, then as ml_dtypes types."""
    from . import dtypes

    torch = sys.modules["torch"]
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    dtype_name = str(t.dtype).removeprefix("torch.")
    dt = dtypes.BY_TORCH.get(dtype_name)
    if dt is None or dt.numpy_name is None:
        raise MigratorError(f"torch dtype {t.dtype} has no migrator equivalent", tensor=name)
    try:
        if dt.numpy_name in ("bfloat16",) or dt.numpy_name.startswith("float8"):
            same_width = {2: torch.int16, 1: torch.uint8}[t.element_size()]
            return t.contiguous().view(same_width).numpy().view(dt.numpy())
        return t.numpy()
    except (RuntimeError, TypeError) as e:  # sparse, quantized, meta tensors...
        raise MigratorError(f"cannot read this torch tensor's values: {e}", tensor=name) from None


def as_scalars(scalars: Mapping[str, Any] | None) -> dict[str, Scalar] | None:
    """Scalars as `Scalar`s: plain bools, ints and floats (and 0-d numpy values) take Burn's variant."""
    if scalars is None:
        return None
    out: dict[str, Scalar] = {}
    for key, value in scalars.items():
        if isinstance(value, Scalar):
            out[key] = value
            continue
        if not isinstance(value, (bool, int, float)) and getattr(value, "shape", None) == () \
                and callable(getattr(value, "item", None)):
            value = value.item()  # a numpy or torch scalar
        try:
            out[key] = Scalar.of(value)
        except (TypeError, ValueError) as e:
            raise MigratorError(f"scalar '{key}': {e} (give a bool, int, float or migrator.Scalar)") from None
    return out
