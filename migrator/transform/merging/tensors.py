"""A fold plan or a merge spec turned into the output's lazy tensors, which any of migrator's writers saves.

`fold_tensors` folds a PEFT adapter's plan into its base's tensors, `merge_tensors` builds each
tensor of a mergekit merge spec from the models' tensors, `open_models` opens a merge's models (a
`base+lora` one with its adapter folded in, lazily).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.dtypes import DType
from ...core.errors import MergeInputError
from ...core.tensor import LazyTensor
from ...formats.base import Reader
from ...ops.compute.lora import fold
from .peft_adapter import Folded, FoldPlan, Replaced, fold_plan, open_adapter

if TYPE_CHECKING:
    from ...recipe.mergekit import MergeSpec
    from .vocabulary import Vocabulary


def fold_tensors(base: Mapping[str, LazyTensor], plan: FoldPlan, *, out_dtype: DType | None = None) -> list[LazyTensor]:
    """The output tensors of a fold plan, in the base's order, each in `out_dtype` (default: the base's)."""
    from ...core.casts import cast

    out: list[LazyTensor] = []
    for name, entry in plan.entries.items():
        dtype = out_dtype if out_dtype is not None else base[name].dtype
        if isinstance(entry, Folded):
            weight = entry.weight if entry.weight is not None else base[name]
            out.append(fold(name, weight, entry.fold, out_dtype=dtype))
        elif isinstance(entry, Replaced):
            out.append(cast(entry.tensor.renamed(name), dtype))
        else:
            t = base[name]
            out.append(cast(t, dtype) if out_dtype is not None else t)
    return out


def merge_tensors(spec: MergeSpec, models: Mapping[str, Mapping[str, LazyTensor]],
                  vocabulary: Vocabulary | None = None) -> list[LazyTensor]:
    """The output tensors of a merge spec, given each model's tensors by the spec's model ids; with a
    `vocabulary`, the embedding and lm_head inputs rebuilt in its order first."""
    from ...ops.compute import arithmetic
    from .vocabulary import is_vocabulary_tensor, permuted

    out: list[LazyTensor] = []
    for item in spec.tensors:
        inputs = []
        for model, name in item.inputs:
            tensors = models[model]
            if name not in tensors:
                raise MergeInputError(f"model '{model}' has no tensor '{name}' (needed for '{item.name}')",
                                      tensor=name)
            inputs.append(tensors[name])
        if vocabulary is not None and is_vocabulary_tensor(inputs[0]):
            assert spec.tokenizer is not None
            inputs = permuted(vocabulary, item.name, [(m, t) for (m, _), t in zip(item.inputs, inputs, strict=True)],
                              spec.tokenizer.base_model, spec.dtype)
        p = item.params
        dtype = spec.out_dtype or spec.dtype
        if item.op == "passthrough":
            out.append(arithmetic.passthrough(item.name, inputs[0], factor=p.get("scale"), out_dtype=dtype))
        elif item.op == "linear":
            out.append(arithmetic.linear(item.name, inputs, p["weights"], normalize=p["normalize"], out_dtype=dtype))
        elif item.op == "slerp":
            out.append(arithmetic.slerp(item.name, inputs[0], inputs[1], p["t"], out_dtype=dtype))
        else:
            out.append(arithmetic.task_arithmetic(
                item.name, inputs[0], inputs[1:], p["weights"], densities=p["densities"], sparsify=p["sparsify"],
                consensus=p["consensus"], normalize=p["normalize"], lambda_=p["lambda"], rescale=p["rescale"],
                seed=p.get("seed"), out_dtype=dtype))
    return out


@dataclass
class ModelPart:
    """One input a computed source reads (a model, an adapter's weights): its label, path and reader. A
    reader's `parts` are what a run protects from its output and takes the permission bits of."""

    label: str
    path: Path
    reader: Reader


def open_models(paths: Mapping[str, str], loras: Mapping[str, str], stack: ExitStack,
                readers: dict[str, Reader] | None = None) -> dict[str, Mapping[str, LazyTensor]]:
    """Each model opened (once per folder), a `base+lora` one with its adapter folded in (lazily);
    `readers`, when given, receives each folder's reader and each adapter's weights reader."""
    from ...files.io import open_file

    readers = {} if readers is None else readers
    models: dict[str, Mapping[str, LazyTensor]] = {}
    for ref, path in paths.items():
        if path not in readers:
            readers[path] = stack.enter_context(open_file(path))
        tensors: Mapping[str, LazyTensor] = readers[path]
        lora = loras.get(ref)
        if lora is not None:
            adapter = stack.enter_context(open_adapter(lora))
            if isinstance(adapter.tensors, Reader):
                readers.setdefault(adapter.weights_file, adapter.tensors)
            folded = fold_tensors(tensors, fold_plan(tensors, adapter))
            tensors = {t.name: t for t in folded}
        models[ref] = tensors
    return models
