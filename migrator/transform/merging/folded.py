"""A base model with a PEFT LoRA adapter folded in, read as one source.

`FoldedReader` lists the base's tensors in the base's order, each folded weight (`W + s B A`) or
`modules_to_save` replacement a lazy tensor computed when written: remaps, filters, ops, adapters,
dtype casts and any writer then treat it as a plain checkpoint. `notes` say what the fold did (how
many weights folded, which replaced, what was inferred), for the plan and the report.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...core.tensor import LazyTensor
from ...formats.base import Reader
from .peft_adapter import FoldPlan, PeftAdapter, fold_plan, open_adapter
from .tensors import ModelPart, fold_tensors

MAX_NAMED = 8
"""Tensor names listed in a note (the count of the rest follows)."""


class FoldedReader(Reader):
    """`base` with `adapter` folded in (see the module docstring); closing it closes both."""

    format = "mixed"  # set per instance: the base's format

    def __init__(self, base: Reader, adapter: PeftAdapter, *, lora_scale: float | None = None) -> None:
        self.base = base
        self.adapter = adapter
        self.plan: FoldPlan = fold_plan(base, adapter, lora_scale=lora_scale)
        self.tensors: list[LazyTensor] = fold_tensors(base, self.plan)
        self.format = base.format  # type: ignore[misc]
        self.source = base.source
        self.metadata = dict(base.metadata)
        self.scalars = dict(base.scalars)
        # what target.copy and --hash-sources look at
        self.folder, self.shards, self.index_path = base.folder, base.shards, base.index_path
        # a dequantized base's config.json changes (no quantization_config, its new dtype) hold for the fold too
        self.config_update, self.config_drop, self.consumed = base.config_update, base.config_drop, base.consumed
        # the base's own notes first (a quantized base's dequantization), then the fold's
        self.notes = [*base.notes, *fold_notes(self.plan, adapter.folder)]
        self.parts = [ModelPart(base.label, Path(base.label), base)]  # what a run protects: base and adapter
        if isinstance(adapter.tensors, Reader):
            self.parts.append(ModelPart(adapter.weights_file, Path(adapter.weights_file), adapter.tensors))

    def file_readers(self) -> list[Reader]:
        """The base's readers and the adapter's weights reader: what a run protects from its output."""
        return [f for p in self.parts for f in p.reader.file_readers()]

    def extra(self) -> dict[str, Any]:
        return {**self.base.extra(), "lora": {"adapter": self.adapter.folder, "folded": self.plan.folded(),
                                              "replaced": self.plan.replaced()}}

    def close(self) -> None:
        try:
            self.adapter.close()
        finally:
            self.base.close()


def fold_notes(plan: FoldPlan, adapter: str) -> list[str]:
    """What a fold did, as plan notes: the folded and replaced tensors, then the fold plan's own notes."""
    def listed(names: list[str]) -> str:
        more = f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else ""
        return ", ".join(names[:MAX_NAMED]) + more

    folded, replaced = plan.folded(), plan.replaced()
    notes = [f"LoRA adapter {adapter}: folded into {len(folded)} weights"
             + (f" ({listed(folded)})" if folded else "")]
    if replaced:
        notes.append(f"LoRA adapter {adapter}: {len(replaced)} tensors replaced by the adapter's copies "
                     f"(modules_to_save or base_layer): {listed(replaced)}")
    return notes + [f"LoRA adapter {adapter}: {n}" for n in plan.notes]


def open_folded(base: Reader, adapter: str | os.PathLike[str], *, lora_scale: float | None = None) -> FoldedReader:
    """`base` with the PEFT adapter folder `adapter` folded in; on an error both are closed."""
    try:
        peft = open_adapter(adapter)
    except BaseException:
        base.close()
        raise
    try:
        return FoldedReader(base, peft, lora_scale=lora_scale)
    except BaseException:
        peft.close()
        base.close()
        raise
