"""A mergekit config read as one source: its merged tensors, lazily, in the reference model's order.

`MergedReader` opens every model of the config (headers only; a `base+lora` one with its adapter
folded in), resolves the config against their tensor names (`recipe.mergekit.merge_spec`) and lists
one computed lazy tensor per output tensor: remaps, filters, dtype casts and any writer then treat
it as a plain checkpoint. What a Hugging Face folder written from it needs beside the weights comes
with it: the folder whose companion files (config, tokenizer) go with the merge (`folder`), what
changes in its config.json (`config_update`: `num_hidden_layers` after slices, the dtype) and the
files it makes (`generated`: the config itself as `mergekit_config.yml`, and with a tokenizer source
the output vocabulary's tokenizer files, `vocabulary.py`).
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ...core.bytesource import ByteSource
from ...core.errors import FormatError
from ...core.tensor import LazyTensor
from ...formats.base import Reader
from ...recipe.mergekit import LoadedConfig, MergeSpec, load_config, merge_spec, model_paths
from .tensors import ModelPart, merge_tensors, open_models
from .vocabulary import Vocabulary, build_vocabulary

CONFIG_NAME = "mergekit_config.yml"
"""The name mergekit gives the config it copies into its output folder."""


class _Config(ByteSource):
    """The reader's `source`: the config file (its tensors' bytes are read from the models)."""

    def __init__(self, path: Path) -> None:
        self.label = str(path)
        self.path = path
        self.size = path.stat().st_size

    def view(self, offset: int, length: int) -> memoryview:
        raise FormatError("a merge config holds no tensor bytes; read its tensors", file=self.label)


class MergedReader(Reader):
    """The merged tensors of a mergekit config (see the module docstring); closing it closes every model."""

    format = "mergekit"

    def __init__(self, config: str | os.PathLike[str] | LoadedConfig, *, seed: int | None = None) -> None:
        self.loaded = config if isinstance(config, LoadedConfig) else load_config(config)
        self._stack = ExitStack()
        try:
            paths, loras = model_paths(self.loaded)
            readers: dict[str, Reader] = {}
            models = open_models(paths, loras, self._stack, readers)
            self.spec: MergeSpec = merge_spec(self.loaded, {ref: list(t.keys()) for ref, t in models.items()},
                                              seed=seed)
            self.vocabulary: Vocabulary | None = None
            if self.spec.tokenizer is not None:  # rows rebuilt in the output vocabulary's order
                self.vocabulary = build_vocabulary(self.spec.tokenizer, self.spec.models, list(self.spec.models))
            self.plain_base = self.spec.tokenizer is not None and self.vocabulary is None
            self.tensors: list[LazyTensor] = merge_tensors(self.spec, models, self.vocabulary)
        except BaseException:
            self._stack.close()
            raise
        # what a run protects from its output: every model and adapter file it reads
        self.parts = [ModelPart(path, Path(path), r) for path, r in readers.items()]
        formats = {r.format for r in readers.values()}
        self.format = formats.pop() if len(formats) == 1 else "mixed"  # type: ignore[misc]
        self.source = _Config(Path(self.loaded.file))
        self.metadata: dict[str, str] = {}
        self.scalars = {}
        companions = self.spec.models.get(self.spec.companions_from or "")
        self.folder = Path(companions) if companions and Path(companions).is_dir() else None
        self.config_update: dict[str, Any] = dict(self.spec.config_update or {})
        self.generated = [(CONFIG_NAME, self.loaded.text.encode())]
        if self.vocabulary is not None:  # the output tokenizer's files, and its size in config.json
            self.generated += self.vocabulary.files
            self.config_update["vocab_size"] = self.vocabulary.size
        self.notes = [f"merge_method {self.spec.method}: {len(self.tensors)} tensors from "
                      f"{len(self.spec.models)} models" + (f", DARE seed {seed}" if seed is not None else "")]
        if self.vocabulary is not None:
            v = self.vocabulary
            shown = ", ".join(map(repr, v.added[:5])) + (", ..." if len(v.added) > 5 else "")
            source = v.spec.source if v.spec.source in ("base", "union") else f"from {v.spec.source}"
            self.notes.append(f"tokenizer {source}: {len(v.tokens)} tokens"
                              + (f", {len(v.added)} added ({shown})" if v.added else "")
                              + f", {v.size} rows; each model's embedding and lm_head rows rebuilt in its order")
        elif self.plain_base:
            self.notes.append("tokenizer_source base: no model has a tokenizer.json, so they share the base's "
                              "vocabulary (as mergekit takes them); its tokenizer files are copied, the rows kept")

    def file_readers(self) -> list[Reader]:
        """Every model's reader and every adapter's weights reader: what a run protects from its output."""
        return [f for p in self.parts for f in p.reader.file_readers()]

    def extra(self) -> dict[str, Any]:
        return {"merge_method": self.spec.method, "models": dict(self.spec.models)}

    def close(self) -> None:
        self._stack.close()
