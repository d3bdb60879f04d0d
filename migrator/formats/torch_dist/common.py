"""`common.pt`: what megatron-core saves unsharded beside the DCP files, read as plain data.

Megatron-LM puts its training arguments there (`args`, a pickled arguments object), with
`checkpoint_version` and `iteration`. The restricted interpreter reads the file; the arguments object
is an allow-listed record of its attributes, never built, made plain data as a legacy rank file's are
(`formats.megatron.args`): numbers, strings, lists, a torch dtype as its name (`torch.bfloat16` ->
"bfloat16"); objects of other classes (an enum of Megatron's, a function) are left out (None). No code
from the file runs.
"""

from __future__ import annotations

from typing import Any

from ...core.bytesource import ByteSource
from ...core.errors import FormatError
from ...core.limits import Limits
from ..megatron.args import saved_values
from ..pytorch.namespace import plain
from ..pytorch.reader import PytorchReader
from ..safepickle import values as sp


class _CommonReader(PytorchReader):
    """common.pt's root object kept as the interpreter built it; tensors in it are not listed."""

    root: Any = None

    def _flatten(self, root: Any, prefix: str) -> Any:
        self.root = root
        return super()._flatten({}, prefix)


def read_common(source: ByteSource, limits: Limits) -> dict[str, Any]:
    """common.pt as plain data: `args` a dict of the training arguments (absent when not saved)."""
    reader = _CommonReader(source, limits=limits)
    root = reader.root
    if not isinstance(root, dict):
        raise FormatError(f"common.pt holds {sp.describe(root)}, not megatron-core's dict of common values",
                          file=source.label)
    saved = saved_values(root, lambda message: FormatError(f"common.pt's {message}", file=source.label))
    out = {k: plain(v) for k, v in root.items() if type(k) is str and k != "args"}
    if "args" in root:
        out["args"] = saved.args
    return out
