"""`ZeroReader`: a DeepSpeed ZeRO-1/2/3 checkpoint step as one source, consolidated lazily.

What it lists is what DeepSpeed's `zero_to_fp32` returns, in its order: the buffers (floats as
fp32), the frozen parameters, every trained parameter's fp32 master rebuilt from the ranks'
partitions (`partitions.py`), then tied names (`shared_params`). Each parameter is a lazy tensor
that reads only its own byte ranges of the rank files, piece by piece. With `top_level_key="module"`
it lists the module's own weights instead (16-bit under bf16/fp16 training) from the model states
file, as saved; ZeRO-3 saves no module weights (only empty partitions), which is an error then.
With `keep_structure` (a `.pt` target with `training_state: keep`) it lists the whole training
checkpoint instead: `model.<name>` for the fp32 view, then each parameter's optimizer state
(`optimizer.state.<name>.exp_avg`, ...; `optimizer.py`), with `structure` the nested dict to write.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...core.bytesource import FileSet
from ...core.casts import cast
from ...core.dtypes import F32, Kind
from ...core.errors import FormatError, LimitExceededError, TensorNotFoundError
from ...core.limits import DEFAULT_LIMITS, Limits
from ...core.tensor import LazyTensor
from ..base import Reader
from .folder import StepFolder, find_step
from .optimizer import MODEL, describe, read_optimizer, whole_tree
from .partitions import Piece, RankFiles, Span, gathered, zero3_pieces, zero12_pieces
from .states import StateFile, numel

WEIGHTS = ("fp32", "module")
"""What a ZeRO checkpoint offers: the fp32 masters (the default), or the module's state_dict."""


CLIPPING_DEFAULT = 1.0
"""DeepSpeed's `gradient_clipping` when its config sets none (`GRADIENT_CLIPPING_DEFAULT`,
deepspeed/runtime/constants.py)."""


def clipping_note(config: Any) -> str:
    """What a resume outside DeepSpeed must redo: the engine clipped every step's gradients to the norm
    its config's `gradient_clipping` says (the model states file keeps the config as `ds_config`), a
    setting and not state, so no checkpoint carries it over."""
    value = config.get("gradient_clipping", CLIPPING_DEFAULT) if isinstance(config, dict) else None
    said = ("its ds_config's gradient_clipping" if isinstance(config, dict) and "gradient_clipping" in config
            else "DeepSpeed's default: its ds_config sets no gradient_clipping")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ("DeepSpeed clips gradients by its config's gradient_clipping (1.0 unless set), which this checkpoint "
                "does not record as a number: a setting of the engine, not state in the checkpoint; a resume "
                "outside DeepSpeed clips as the run did (torch.nn.utils.clip_grad_norm_) before each step")
    if value <= 0:
        return "DeepSpeed did not clip gradients in this run (gradient_clipping 0)"
    return (f"DeepSpeed clipped the gradients to norm {value:g} ({said}): a setting of the engine, not state in "
            f"the checkpoint; to step as DeepSpeed did, a resume outside DeepSpeed calls "
            f"torch.nn.utils.clip_grad_norm_(model.parameters(), {value:g}) before each optimizer step")




class ZeroReader(Reader):
    """A ZeRO checkpoint step: its fp32 masters (default) or module weights (`top_level_key="module"`)."""

    format = "deepspeed"
    nested_keys = True  # the constructor takes `top_level_key`: which weights
    keeps_structure = True  # the whole training checkpoint, when asked (`training_state: keep`)

    def __init__(self, path: str | os.PathLike[str], *, tag: str | None = None,
                 top_level_key: str | Sequence[str] | None = None, keep_structure: bool = False,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        key = top_level_key if isinstance(top_level_key, str) or top_level_key is None else ".".join(top_level_key)
        self.weights = "fp32" if key in (None, "", "fp32") else key
        self._whole = keep_structure and self.weights == "fp32"
        self.structure = None
        self._optimizer: dict[str, Any] | None = None
        step = find_step(path, tag)
        self.step = step
        self.folder = step.root
        if self.weights not in WEIGHTS:
            raise TensorNotFoundError(f"top_level_key '{key}': a ZeRO checkpoint holds the fp32 master weights "
                                      "(the default) or the module's own weights ('module')", file=str(step.path))
        self.metadata: dict[str, str] = {}
        self.scalars = {}
        self._limits = limits
        self._opened: list[StateFile] = []
        try:
            model0 = self._open_all(step)
        except BaseException:
            for state in self._opened:
                state.close()
            raise
        files = [s.file for s in self._opened]
        self.source = FileSet(str(step.path), sum(s.source.size for s in self._opened),
                              [s.source.identity for s in self._opened if s.source.identity is not None],
                              _shared_mode(s.source.mode for s in self._opened), kind="a ZeRO checkpoint")
        self._files_shown = files
        for state in self._opened:  # partitions are read by `RankFiles`; only the model states' own
            if state is not model0:  # tensors (buffers, module weights) read through their file
                state.close()
        self._model0 = model0
        del self._opened

    def _open_all(self, step: StepFolder) -> StateFile:
        """Parse the step's state files and list its tensors; returns rank 0's model states."""
        first = self._state(step.optim[min(step.optim)])
        osd = first.at(first.root, "optimizer_state_dict")
        self.stage = first.int_of(first.at(osd, "zero_stage"), "optimizer_state_dict.zero_stage")
        if self.stage not in (1, 2, 3):
            raise first.bad(f"ZeRO stage {self.stage}: only stages 1, 2 and 3 keep flat fp32 partitions")
        counts = first.at(osd, "partition_count")
        self.world = max(first.ints(counts, "partition_count")) if isinstance(counts, (list, tuple)) else \
            first.int_of(counts, "partition_count")
        if self.world > self._limits.max_shards:
            raise LimitExceededError(f"partition_count names {self.world} ranks, over the {self._limits.max_shards} "
                                     "limit (max_shards)", file=first.file)
        self._check_ranks(step, self.world, first.file)
        models = self._model_files(step)
        model0 = self._state(models[0])
        self.tensors = (self._module(model0) if self.weights == "module" else
                        self._masters(step, first, model0, models))
        return model0

    # -- files

    def _state(self, path: Path) -> StateFile:
        state = StateFile(path, self._limits)
        self._opened.append(state)
        return state

    def _check_ranks(self, step: StepFolder, world: int, label: str) -> None:
        missing = [r for r in range(world) if r not in step.optim]
        if missing:
            prefix = step.optim[min(step.optim)].name.split("zero_pp_rank_")[0]
            raise FormatError(f"rank {missing[0]}'s partition file {prefix}zero_pp_rank_{missing[0]}_mp_rank_00_"
                              f"optim_states.pt is missing ({len(step.optim)} of the {world} ranks that "
                              "partition_count names are here)", file=str(step.path))
        extra = sorted(r for r in step.optim if r >= world)
        if extra:
            raise FormatError(f"rank {extra[0]}'s file {step.optim[extra[0]].name} is beyond the {world} ranks "
                              f"partition_count names in {os.path.basename(label)} (a leftover of another run?)",
                              file=str(step.path))

    def _model_files(self, step: StepFolder) -> list[Path]:
        """The model states file of each rank (ZeRO-3) or the one of all (ZeRO-1/2), as DeepSpeed reads them."""
        if self.stage <= 2:
            found = step.models.get(None)
            if found is None:
                raise FormatError("mp_rank_00_model_states.pt is missing (it holds param_shapes)", file=str(step.path))
            return [found]
        out = []
        for r in range(self.world):
            found = step.models.get(r)
            if found is None:
                raise FormatError(f"rank {r}'s model states file zero_pp_rank_{r}_mp_rank_00_model_states.pt is "
                                  "missing", file=str(step.path))
            out.append(found)
        return out

    # -- the module's weights

    def _module(self, model: StateFile) -> list[LazyTensor]:
        module = model.at(model.root, "module")
        if not isinstance(module, dict):
            raise model.bad("'module' is not a state_dict")
        shapes = self._param_shapes(model)
        out = []
        for name, value in module.items():
            t = model.tensor_of(value, f"module['{name}']")
            want = shapes.get(name)
            if want is not None and tuple(t.shape) != want:
                raise model.bad(f"the module states hold shape {list(t.shape)} but param_shapes says {list(want)}"
                                + (": ZeRO-3 saves only empty partitions of each parameter there; read the fp32 "
                                   "master weights (no --top-level-key) instead" if self.stage == 3 else ""), name)
            out.append(t.renamed(str(name)))
        return out

    def _param_shapes(self, model: StateFile) -> dict[str, tuple[int, ...]]:
        return {k: v for group in self._groups_of_shapes(model) for k, v in group.items()}

    def _groups_of_shapes(self, model: StateFile) -> list[dict[str, tuple[int, ...]]]:
        raw = model.at(model.root, "param_shapes")
        groups = raw if isinstance(raw, (list, tuple)) else [raw]
        return [model.shapes(g, f"param_shapes[{i}]") for i, g in enumerate(groups)]

    # -- the fp32 masters

    def _masters(self, step: StepFolder, first: StateFile, model0: StateFile, models: list[Path]) -> list[LazyTensor]:
        key = "single_partition_of_fp32_groups" if self.stage <= 2 else "fp32_flat_groups"
        ranks = [first] + [self._state(step.optim[r]) for r in range(1, self.world)]
        files = RankFiles([], [], [])
        flats: list[list[tuple[LazyTensor, int, int]]] = []  # per rank, per group: tensor, file index, data offset
        for rank, state in enumerate(ranks):
            if rank:
                self._check_same_stage(state)
            groups = state.at(state.root, "optimizer_state_dict", key)
            if not isinstance(groups, (list, tuple)):
                raise state.bad(f"optimizer_state_dict.{key} is not a list of flat tensors")
            index = _add_file(files, state)
            row = []
            for g, value in enumerate(groups):
                t = state.tensor_of(value, f"optimizer_state_dict.{key}[{g}]")
                if len(t.shape) != 1 or t.dtype.kind is not Kind.FLOAT:
                    raise state.bad(f"partition {g} has shape {list(t.shape)} and dtype {t.dtype.display}; a flat "
                                    "float vector was expected", t.name)
                row.append((t, index, state.data_offset(t, f"partition {g}")))
            flats.append(row)
        lengths = [[t.shape[0] for t, _, _ in row] for row in flats]
        shapes = self._groups_of_shapes(model0)
        label = str(step.path)
        if self.stage <= 2:
            if any(len(row) != len(shapes) for row in lengths):
                bad = next(r for r, row in enumerate(lengths) if len(row) != len(shapes))
                raise FormatError(f"rank {bad} holds {len(lengths[bad])} partitions but param_shapes lists "
                                  f"{len(shapes)} parameter groups", file=ranks[bad].file)
            pads_raw = first.at(first.root, "optimizer_state_dict", "param_alignment_paddings", default=None)
            pads = None if pads_raw is None else [first.ints(p, f"param_alignment_paddings[{i}]")
                                                  for i, p in enumerate(_listed(first, pads_raw))]
            pieces = zero12_pieces(shapes, lengths, pads, label)
        else:
            for r, sizes in enumerate(lengths):
                if sizes != lengths[0]:
                    raise FormatError(f"rank {r}'s flat groups hold {sizes} elements but rank 0's hold {lengths[0]}: "
                                      "ZeRO-3 ranks partition every parameter alike", file=ranks[r].file)
            pieces = zero3_pieces(shapes, lengths, label)
        out: dict[str, LazyTensor] = {}
        module = model0.at(model0.root, "module", default={})
        for name in _listed_names(model0, model0.at(model0.root, "buffer_names", default=[])):
            value = module.get(name) if isinstance(module, dict) else None
            if value is None:
                continue
            t = model0.tensor_of(value, f"module['{name}']").renamed(name)
            out[name] = cast(t, F32) if t.dtype.kind is Kind.FLOAT else t
        out.update(self._frozen(model0, models, files))
        for group in shapes:
            for name, shape in group.items():
                out[name] = self._param(name, shape, pieces[name], flats, files, label)
        shared = model0.at(model0.root, "shared_params", default={})
        if isinstance(shared, dict):
            for alias, target in shared.items():
                if isinstance(alias, str) and isinstance(target, str) and target in out:
                    out[alias] = out[target].renamed(alias)
        self._pieces = pieces
        self._files = files
        self._optimizer = describe(first, self.stage)
        if not self._whole:
            return list(out.values())
        # the whole checkpoint: the fp32 view under `model.`, then each parameter's optimizer state
        optimizer = read_optimizer(self.stage, ranks, flats, shapes, pieces, files, label)
        self.structure = whole_tree(list(out), optimizer)
        self.notes = [clipping_note(model0.at(model0.root, "ds_config", default=None))]
        return [t.renamed(f"{MODEL}.{name}") for name, t in out.items()] + optimizer.tensors()

    def _check_same_stage(self, state: StateFile) -> None:
        stage = state.int_of(state.at(state.root, "optimizer_state_dict", "zero_stage"), "zero_stage")
        if stage != self.stage:
            raise state.bad(f"ZeRO stage {stage}, but rank 0's file says {self.stage}")

    def _param(self, name: str, shape: tuple[int, ...], pieces: list[Piece],
               flats: list[list[tuple[LazyTensor, int, int]]], files: RankFiles, label: str) -> LazyTensor:
        dtypes = {flats[p.rank][p.group][0].dtype for p in pieces}
        if len(dtypes) > 1:
            raise FormatError(f"its partitions are of several dtypes ({', '.join(sorted(d.display for d in dtypes))})",
                              file=label, tensor=name)
        dtype = dtypes.pop() if dtypes else flats[0][0][0].dtype
        size = dtype.itemsize or 4
        spans = [Span(flats[p.rank][p.group][1], flats[p.rank][p.group][2] + p.start * size, p.count * size)
                 for p in pieces]
        return gathered(name, dtype, shape, files, spans, label)

    def _frozen(self, model0: StateFile, models: list[Path], files: RankFiles) -> dict[str, LazyTensor]:
        """Frozen parameters: whole in the model states file (ZeRO-1/2), or a fragment per rank (ZeRO-3)."""
        raw = model0.at(model0.root, "frozen_param_shapes", default=None)
        if not raw:
            return {}
        shapes = model0.shapes(raw, "frozen_param_shapes")
        states = [model0] + [self._state(p) for p in models[1:]]
        fragments = []
        for state in states:
            frags = state.at(state.root, "frozen_param_fragments")
            if not isinstance(frags, dict):
                raise state.bad("frozen_param_fragments is not a dict of tensors")
            fragments.append((state, frags, _add_file(files, state)))
        out = {}
        for name, shape in shapes.items():
            want = numel(shape)
            if self.stage <= 2:
                t = model0.tensor_of(model0.at(fragments[0][1], name), f"frozen_param_fragments['{name}']")
                if t.numel != want:
                    raise model0.bad(f"frozen fragment has {t.numel} elements but frozen_param_shapes says "
                                     f"{list(shape)}", name)
                out[name] = LazyTensor(name, t.dtype, shape, t.nbytes, t.loader, t.span, None, t.origin, t.chunks)
                continue
            spans, have, dtype = [], 0, None
            for state, frags, index in fragments:
                t = state.tensor_of(state.at(frags, name), f"frozen_param_fragments['{name}']")
                if dtype is not None and t.dtype != dtype:
                    raise state.bad(f"fragment dtype {t.dtype.display} differs from rank 0's {dtype.display}", name)
                dtype = t.dtype
                take = min(t.numel, want - have)
                if take > 0:
                    size = t.dtype.itemsize or 1
                    spans.append(Span(index, state.data_offset(t, "frozen fragment"), take * size))
                    have += take
            if have != want or dtype is None:
                raise FormatError(f"the ranks' frozen fragments hold {have} elements but frozen_param_shapes says "
                                  f"{list(shape)}", file=str(self.step.path), tensor=name)
            out[name] = gathered(name, dtype, shape, files, spans, str(self.step.path))
        return out

    # -- what inspect shows

    def extra(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "zero_stage": self.stage, "world_size": self.world, "tag": self.step.tag,
            "weights": ("module weights from the model states file" if self.weights == "module" else
                        "the whole training checkpoint: fp32 master weights under 'model.', the optimizer state "
                        "under 'optimizer.' (training_state: keep)" if self._whole else
                        "fp32 master weights rebuilt from the optimizer partitions (--top-level-key module: the "
                        "module's own weights)"),
            "files": self._files_shown,
        }
        if self._optimizer is not None:
            info["optimizer"] = self._optimizer
            if not self._whole:
                keys = ", ".join(self._optimizer["state"]) or "none"
                info["notes"] = [f"optimizer state (not listed): {keys} per parameter, "
                                 f"{len(self._optimizer['param_groups'])} param groups"
                                 + (f", step {', '.join(map(str, self._optimizer['step']))}"
                                    if self._optimizer["step"] else "")
                                 + "; --training-state keep into a .pt target writes it beside the fp32 model, "
                                 "consolidated per parameter"]
        pieces = getattr(self, "_pieces", None)
        if pieces is not None:
            info["partitions"] = {name: [[p.rank, p.group, p.start, p.count] for p in ps]
                                  for name, ps in list(pieces.items())[:1000]}
        return info

    def describe(self, name: str) -> str:
        return f"{name!r} (ZeRO-{self.stage} checkpoint {self.step.tag})"

    def close(self) -> None:
        files = getattr(self, "_files", None)
        if files is not None:
            files.close()
        model0 = getattr(self, "_model0", None)
        if model0 is not None:
            model0.close()


def _add_file(files: RankFiles, state: StateFile) -> int:
    files.paths.append(state.file)
    files.identities.append(state.source.identity)  # type: ignore[arg-type]
    files.sizes.append(state.source.size)
    return len(files.paths) - 1


def _listed(state: StateFile, value: Any) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise state.bad("param_alignment_paddings is not a list")
    return list(value)


def _listed_names(state: StateFile, value: Any) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise state.bad("buffer_names is not a list of names")
    return list(value)


def _shared_mode(modes: Any) -> int:
    """The permission bits every file allows (an output gets no more)."""
    out = 0o7777
    for m in modes:
        if m is not None:
            out &= m
    return out
