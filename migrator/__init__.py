"""migrator: move neural-network weights between burnpack, SafeTensors, PyTorch and GGUF files (and
read PyTorch Distributed Checkpoint, Megatron Core torch_dist, DeepSpeed ZeRO, Hugging Face Trainer
checkpoint, Megatron-LM legacy checkpoint and NeMo 2 checkpoint folders;
`migrator.formats.registry` lists them).

Public API (each name is imported on first use, so `import migrator` and `migrate --help` do
not pay for numpy):

- `open_file(path)`: a reader of a file in any registered format, a model folder, an index or a
  glob of shards, a DCP or ZeRO folder, a set of rank files. A reader is a read-only mapping of name -> `LazyTensor`
  (`r["w"].numpy()`, `r.keys()`, `r.items()`, `dict(r)`, `len(r)`, `"w" in r`; a missing name is
  a KeyError with a "did you mean"), and a context manager: read its tensors before it closes.
- `save(tensors, path, metadata=..., scalars=...)`, `to_bytes(tensors, fmt, ...)`: write tensors:
  LazyTensors, or a dict of name -> LazyTensor / numpy array / torch tensor; scalars as `Scalar`s
  or plain bools, ints and floats.
- `from_numpy(name, array)`: a `LazyTensor` from a numpy array or a torch tensor (bf16 too; torch
  is not imported by migrator for it).
- `LazyTensor`: a tensor read on demand; `Scalar`: a typed scalar (burnpack's scalars).
- `run_recipe(path_or_recipe, overwrite=...)`: what `migrate run` does; returns the `ApplyReport`.
- `ApplyReport`: the report of a run (`ApplyReport.from_json` loads a `--report` file).
- `param_groups(ckpt["optimizer"], model)`: a kept optimizer's param groups over any module's
  `named_parameters()`, by name in the saved order, to build the optimizer that resumes
  (`torch.optim.AdamW(migrator.param_groups(...))`, then `load_state_dict`); migrator imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .core.version import PRODUCER, __version__

if TYPE_CHECKING:
    from .api import run_recipe
    from .core.scalars import Scalar
    from .core.tensor import LazyTensor, from_numpy
    from .files.io import open_file, save, to_bytes
    from .plan.report import ApplyReport
    from .plan.resume import param_groups

_LAZY = {"open_file": "files.io", "save": "files.io", "to_bytes": "files.io",
         "LazyTensor": "core.tensor", "from_numpy": "core.tensor", "Scalar": "core.scalars",
         "ApplyReport": "plan.report", "run_recipe": "api", "param_groups": "plan.resume"}

__all__ = ["PRODUCER", "ApplyReport", "LazyTensor", "Scalar", "__version__", "from_numpy", "open_file",
           "param_groups", "run_recipe", "save", "to_bytes"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'migrator' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names and the module's own dunders: not what its code imports (`Any`, `annotations`)."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
