"""`NemoReader`: a NeMo 2 checkpoint folder as one source, its `weights/` read by the torch_dist
reader with the configuration of its `context/`.

NeMo's `MegatronParallel` saves each model chunk's sharded state dict under the prefix `module.`
(`module.decoder.layers.self_attention.linear_qkv.weight`): those names are read without it, so the
Megatron recipes apply unchanged, and a note says so. The optimizer's state NeMo saves beside them by
default (`optimizer.state.exp_avg.module....`) is left out, with a note: converting a training
checkpoint gives the model, never its moments as weights (`--from torch_dist` on `weights/` lists
everything under the saved names). `context/model.yaml`'s configuration, in
Megatron-LM's argument names (`config.py`), takes the place of `common.pt`'s arguments: it checks the
stacked layer and expert axes, gives `${config.KEY}` and makes a Hugging Face config.json.
"""

from __future__ import annotations

import os
from typing import Any

from ...core.errors import FormatError
from ...storage.read_context import DEFAULT_READ, ReadContext
from ..torch_dist.layout import torch_dist_folder
from ..torch_dist.reader import TorchDistReader
from .config import read_context
from .layout import CONTEXT, IO_JSON, MODEL_YAML, WEIGHTS

PREFIX = "module."
"""What NeMo's MegatronParallel puts before each model name (`_module_sharded_state_dict`)."""


class NemoReader(TorchDistReader):
    format = "nemo"

    def __init__(self, folder: str | os.PathLike[str], *, read: ReadContext = DEFAULT_READ) -> None:
        from pathlib import Path

        root = Path(folder)
        weights = root / WEIGHTS
        if not weights.is_dir():
            raise FormatError(f"a NeMo 2 checkpoint (it has {CONTEXT}/) without its {WEIGHTS}/ folder, which holds the "
                              "tensors", file=str(weights))
        if torch_dist_folder(weights) is None:
            raise FormatError("not a Megatron-core torch_dist checkpoint (NeMo saves one there: .metadata with "
                              "metadata.json or common.pt)", file=str(weights))
        found = read_context(root, read.limits)
        context_notes: list[str] = []
        if found is None:
            args: dict[str, Any] | None = None
            context_notes.append(f"{CONTEXT}/ has no {MODEL_YAML}: the model's configuration is not read ({IO_JSON} "
                                 "records only the arguments given to its classes, not their defaults)")
        else:
            args, context_notes = found
        super().__init__(weights, read=read, prefix=PREFIX, args=args, args_say=f"{CONTEXT}/{MODEL_YAML} says",
                         only_prefixed=True)
        self.nemo_folder = root
        if found is not None:  # in place of the torch_dist reader's note on common.pt holding no args
            self.notes = [n for n in self.notes if not n.startswith("common.pt holds no training arguments")]
        self.notes = [*self.notes, *context_notes]

    def hf_config(self) -> dict[str, Any] | None:
        if not self.args:
            from ...core.errors import PlanError

            raise PlanError(f"target.hf_config: {self.nemo_folder / CONTEXT} has no {MODEL_YAML} to make a "
                            "config.json from")
        return super().hf_config()

    def extra(self) -> dict[str, Any]:
        out = super().extra()
        out["container"] = "nemo2"
        out["nemo"] = {"folder": str(self.nemo_folder), "model_class": self.args.get("nemo_model_class"),
                       "config_class": self.args.get("nemo_config_class")}
        return out
