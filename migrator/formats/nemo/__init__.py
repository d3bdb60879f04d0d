"""NeMo 2 checkpoints: the folder NeMo's `MegatronCheckpointIO` and `io.dump` write, `weights/` (a
Megatron-core `torch_dist` checkpoint whose model names carry NeMo's `module.` prefix) beside
`context/` (the model's configuration: `model.yaml`, and `io.json`, fiddle's serialization of it).

`layout` says whether a path is one (names only), `config` reads `context/` as data (bounded YAML and
JSON, nothing of fiddle's run) into Megatron-LM's argument names, `reader` reads `weights/` through
the torch_dist reader with that configuration.
"""

from __future__ import annotations

from .layout import nemo_folder

__all__ = ["nemo_folder"]  # the reader: `formats.nemo.reader.NemoReader`
