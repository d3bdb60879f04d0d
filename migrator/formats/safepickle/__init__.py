"""A restricted pickle interpreter: reads the data torch checkpoints hold and never runs code.

Python's `pickle` imports every global a file names and calls whatever the file asks it to; even
torch's `weights_only` mode imports torch. This module interprets the opcodes itself (protocols
0-5) and resolves globals against an allow-list into inert placeholder objects, so the worst a
hostile file can do is make the load fail with a typed error:

* allow-listed globals (tensor rebuild functions, storage classes, dtypes, `OrderedDict`, a few
  builtins and numpy scalar types) are replaced by handlers written here that only build data;
* any other global becomes an `Opaque` placeholder; calling or instantiating it builds an inert
  `Placeholder` that records only the class name (nothing is imported, called or built, and its
  arguments and state are dropped), so a training checkpoint's `args`, `hyper_parameters` or
  callbacks do not stop the weights beside them from loading: the reader refuses a placeholder only
  inside the selected part of the checkpoint. Globals of code-running modules (`os`, `subprocess`,
  `builtins`, `functools`, ...) are refused the moment something calls them;
* every size is bounded before anything is allocated (see `Limits`).

Tensors are returned as `TensorRef` descriptions; the container format (zip, legacy, tar) turns
the persistent ids into `StorageRef`s through the `persistent_load` callback.

Modules: `values` (what the interpreter builds, `Limits`), `vm` (the interpreter's state and shared
checks), `opcodes` (one handler per opcode), `allowlist` (the allowed globals and their handlers),
`records` (the tensor-record scanner, a speed-up the opcode loop is the reference for).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...core.limits import DEFAULT_LIMITS, Limits
from . import allowlist, opcodes, records, values, vm
from .values import (
    ELEMENT_SIZES,
    Builtin,
    Device,
    DTensorRef,
    NumpyArray,
    NumpyDtype,
    ODict,
    Opaque,
    Placeholder,
    Record,
    StorageRef,
    StorageType,
    TensorRef,
    TorchDtype,
    TorchType,
    UnsupportedTensor,
    WholeModelPickleError,
    describe,
    storage_type_dtype,
)
from .vm import Unpickler

__all__ = [
    "DEFAULT_LIMITS",
    "ELEMENT_SIZES",
    "Builtin",
    "DTensorRef",
    "Device",
    "Limits",
    "NumpyArray",
    "NumpyDtype",
    "ODict",
    "Opaque",
    "Placeholder",
    "Record",
    "StorageRef",
    "StorageType",
    "TensorRef",
    "TorchDtype",
    "TorchType",
    "Unpickler",
    "UnsupportedTensor",
    "WholeModelPickleError",
    "describe",
    "load",
    "storage_type_dtype",
]
_MODULES = (allowlist, opcodes, records, values, vm)  # the parts, as `safepickle.records` etc.


def load(
    data: bytes | bytearray | memoryview,
    *,
    label: str | None = None,
    persistent_load: Callable[[Any], Any] | None = None,
    limits: Limits | None = None,
) -> Any:
    """Interpret one whole pickle held in memory."""
    return Unpickler(data, label=label, persistent_load=persistent_load,
                     limits=DEFAULT_LIMITS if limits is None else limits).load()
