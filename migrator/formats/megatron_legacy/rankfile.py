"""One rank's `model_optim_rng.pt`, read by the PyTorch reader: its `model` state dict, and its `args`.

Megatron-LM saves `{'args': the run's arguments, 'checkpoint_version': 3.0, 'iteration': N, 'model': state_dict,
'optimizer': ..., 'opt_param_scheduler': ..., 'rng_state': [...]}` per rank (`generate_state_dict` in
megatron/training/checkpointing.py). The pickle goes through the restricted interpreter: the `args`
object is an allow-listed record whose fields are read as plain data as `common.pt`'s are
(`formats.megatron.args`), every other class (an enum in `args`, the optimizer's objects) an inert
placeholder, None in the args; nothing is run. Only `model` is
listed (flattened with dots: the nested dicts of pre-megatron-core checkpoints become
`language_model.encoder.layers...`); `_extra_state` entries (Transformer Engine's, not weights) are
counted and left out.
"""

from __future__ import annotations

from typing import Any

from ...core.bytesource import ByteSource
from ...core.errors import FormatError
from ...core.limits import Limits
from ..megatron.args import saved_values
from ..pytorch.namespace import described
from ..pytorch.reader import PytorchReader


class RankFile(PytorchReader):
    """A rank file: `tensors` (its `model`, or its chunks'), `args` (a dict), `iteration`, `version`, `chunks`."""

    def __init__(self, source: ByteSource, limits: Limits) -> None:
        self.args: dict[str, Any] = {}
        self.iteration: Any = None
        self.version: Any = None
        self.extra_states: list[str] = []
        self.top_keys: list[str] = []
        self.chunks = 0
        """Virtual-pipeline chunks (`model0`, ...) the file holds, their tensors named `model<c>.<name>`; 0: `model`."""
        super().__init__(source, top_level_key="model", limits=limits)

    def _select(self, root: Any, key: Any) -> tuple[Any, str]:
        if not isinstance(root, dict):
            raise self._err(f"holds {described(root)}, not the dict Megatron-LM saves (model, args, ...)")
        self.top_keys = [k for k in root if isinstance(k, str)][:100]
        chunks = [k for k in root if isinstance(k, str) and k.startswith("model") and k[5:].isdigit()]
        if "model" not in root and not chunks:
            raise self._err(f"has no 'model' (its keys: {', '.join(self.top_keys[:20]) or 'none'}): not a Megatron-LM "
                            "checkpoint rank file")
        if "model" in root and chunks:
            raise self._err(f"holds both 'model' and {chunks[0]}: a model and virtual-pipeline chunks at once")
        saved = saved_values(root, self._err)
        self.args, self.iteration, self.version = saved.args, saved.iteration, saved.checkpoint_version
        if not chunks:
            return super()._select(root, key)
        # a virtual pipeline: `model0`, `model1`, ... (one per chunk), listed as `model<c>.<name>`
        if sorted(chunks, key=lambda k: int(k[5:])) != [f"model{c}" for c in range(len(chunks))]:
            raise self._err(f"its model chunks are {', '.join(sorted(chunks)[:8])}, not model0..model{len(chunks) - 1}")
        for k in chunks:
            if not isinstance(root[k], dict):
                raise self._err(f"'{k}' holds {described(root[k])}, not a state dict")
        self.chunks = len(chunks)
        self._root, self._whole = root, False
        return {k: root[k] for k in sorted(chunks, key=lambda k: int(k[5:]))}, ""

    def _leaf(self, name: str, value: Any, seen: set[str]) -> None:
        if name.endswith("_extra_state"):  # None, BytesIO or a byte tensor: Transformer Engine's, never a weight
            self.extra_states.append(name)
            return
        super()._leaf(name, value, seen)

    def bad(self, message: str, tensor: str | None = None) -> FormatError:
        return FormatError(message, file=self.label, tensor=tensor)
