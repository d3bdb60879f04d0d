"""`common.pt`: what megatron-core saves unsharded beside the DCP files, read as plain data.

Megatron-LM puts its training arguments there (`args`, a pickled arguments object), with
`checkpoint_version` and `iteration`. The restricted interpreter reads the file; the arguments object
is an allow-listed record of its attributes (`formats.pytorch.namespace`), never built. Every value becomes plain
data for a recipe's `${config.KEY}`: numbers, strings, lists, a torch dtype as its name
(`torch.bfloat16` -> "bfloat16"); objects of other classes (an enum of Megatron's, a function) are
left out (None). No code from the file runs.
"""

from __future__ import annotations

from typing import Any

from ...core.bytesource import ByteSource
from ...core.errors import FormatError
from ...core.limits import Limits
from ..pytorch.namespace import namespace_fields
from ..pytorch.reader import PytorchReader
from ..safepickle import values as sp

MAX_DEPTH = 16


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
    out = {}
    for k, v in root.items():
        if type(k) is str:
            out[k] = plain(v)
    args = out.get("args")
    if "args" in root and not isinstance(args, dict):
        raise FormatError(f"common.pt's args is {sp.describe(root['args'])}, not Megatron's arguments object",
                          file=source.label)
    return out


def plain(v: Any, depth: int = 0) -> Any:
    """`v` as JSON-like data; what is not data (a placeholder of another class) becomes None."""
    if depth > MAX_DEPTH:
        return None
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, sp.TorchDtype):
        return v.name.removeprefix("torch.")
    fields = namespace_fields(v)
    if fields is not None:
        return {k: plain(x, depth + 1) for k, x in fields.items()}
    if isinstance(v, dict):
        return {k: plain(x, depth + 1) for k, x in v.items() if type(k) in (str, int)}
    if isinstance(v, (list, tuple)):
        return [plain(x, depth + 1) for x in v]
    return None


def megatron_config(args: dict[str, Any]) -> dict[str, Any]:
    """The arguments, with `num_query_groups` as Megatron uses it: the saved value under
    `group_query_attention`, else one group per attention head (the saved value is then unused)."""
    config = dict(args)
    if not args.get("group_query_attention") and args.get("num_attention_heads") is not None:
        config["num_query_groups"] = args["num_attention_heads"]
    if config.get("kv_channels") is None and args.get("hidden_size") and args.get("num_attention_heads"):
        config["kv_channels"] = args["hidden_size"] // args["num_attention_heads"]
    return config
