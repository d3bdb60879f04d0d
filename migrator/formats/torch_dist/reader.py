"""`TorchDistReader`: a Megatron-core `torch_dist` checkpoint as one source of per-layer tensors.

The DCP reader (`formats.dcp.reader`) reads `.metadata` (megatron-core's additions as inert records)
and assembles the chunks; over it, this reader:

* cuts the stacked axes (`layers.py`): `decoder.layers.<param>` `[num_layers, ...]` becomes
  `decoder.layers.<i>.<param>`, `decoder.layers.mlp.experts.experts.<param>` `[num_layers, num_experts,
  ...]` becomes `decoder.layers.<i>.mlp.experts.local_experts.<e>.<param>` (SequentialMLP's module
  names); the axes must match the arguments' `num_layers` / `num_experts` when they are saved;
* leaves out Transformer Engine's `_extra_state` items (FP8 scaling state, not weights) and every other
  non-tensor item (RNG states, optimizer step counts), with a note;
* cuts the vocabulary's padding rows of `embedding.word_embeddings.weight` and `output_layer.weight`
  when the arguments give both `padded_vocab_size` and the tokenizer's `vocab_size`;
* reads `common.pt`'s arguments (`common.py`) for `${config.KEY}` and a Hugging Face config.json.

A wrapper (NeMo 2's folder, `formats.nemo`) may give the arguments from elsewhere (`args`, `args_say`
naming where they come from) and a `prefix` its trainer puts before every model name (`module.`): the
names holding it are read without it, and a note says so; with `only_prefixed`, the other tensors
(the optimizer's state beside the model) are left out, with a note.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ...core.errors import FormatError
from ...core.tensor import LazyTensor
from ...storage.read_context import DEFAULT_READ, ReadContext
from ..base import Reader
from ..dcp.assemble import assemble
from ..dcp.reader import DcpReader
from ..megatron.args import megatron_config
from ..pytorch.tree import CheckpointTree
from .common import read_common
from .layers import index, rows
from .layout import BACKEND_FILE, COMMON_FILE, backend
from .optimizer import STEP, assign_groups, find, tree

STATE = "optimizer.state."

_STACKED = re.compile(r"^(?P<pre>(?:[\w.]+\.)?decoder\.layers)\.(?P<rest>(?!\d+\.)[^.].*)$")
_EXPERTS = "mlp.experts.experts."
_VOCAB = ("embedding.word_embeddings.weight", "output_layer.weight")
EXTRA_STATE = "_extra_state"


class TorchDistReader(Reader):
    format = "torch_dist"

    def __init__(self, folder: str | os.PathLike[str], *, read: ReadContext = DEFAULT_READ,
                 keep_structure: bool = False, prefix: str = "", args: dict[str, Any] | None = None,
                 args_say: str = "the arguments say", only_prefixed: bool = False) -> None:
        self.dcp = DcpReader(folder, read=read)
        self.structure: CheckpointTree | None = None
        self._says = args_say
        try:
            self._open(read, keep_structure, prefix, args, only_prefixed)
        except BaseException:
            self.dcp.close()
            raise

    def _open(self, read: ReadContext, keep_structure: bool, prefix: str, given: dict[str, Any] | None,
              only: bool) -> None:
        dcp = self.dcp
        self.folder = folder = dcp.folder
        assert folder is not None
        self.source = dcp.source
        self.metadata: dict[str, str] = {}
        self.scalars = {}
        label = str(folder)
        found = backend(folder) if (folder / BACKEND_FILE).is_file() else "torch_dist"
        if found is None:
            raise FormatError(f"{BACKEND_FILE} is not megatron-core's: no JSON object naming its sharded_backend",
                              file=str(folder / BACKEND_FILE))
        if found != "torch_dist":
            raise FormatError(f"megatron-core saved this checkpoint with the '{found}' backend; migrator reads "
                              "torch_dist", file=str(folder / BACKEND_FILE))
        self.common: dict[str, Any] = {}
        common = folder / COMMON_FILE
        if common.is_file():
            src = dcp._file(COMMON_FILE, COMMON_FILE)
            self.common = read_common(src, read.limits)
        args = self.common.get("args") if given is None else given
        self.args: dict[str, Any] = args if isinstance(args, dict) else {}
        notes: list[str] = []
        stripped = 0
        outside: list[str] = []
        where = str(common)  # the arguments' own file, for what is wrong with them alone
        layers = _int(self.args, "num_layers", where)
        experts = _int(self.args, "num_experts", where)  # Megatron-LM's --num-experts
        vocab, padded = _int(self.args, "vocab_size", where), _int(self.args, "padded_vocab_size", where)
        if vocab is not None and padded is not None and vocab > padded:
            raise FormatError(f"common.pt's args.vocab_size {vocab} exceeds its padded_vocab_size {padded}: "
                              "megatron pads the vocabulary, never cuts it", file=where)
        limits = read.limits
        common_src = dcp._file(COMMON_FILE, COMMON_FILE) if common.is_file() else None
        params = {n for n in dcp.meta.tensors if not n.startswith("optimizer.") and not n.endswith(EXTRA_STATE)}
        reshaped = {k for k, v in dcp.meta.mcore_data.items()  # megatron-core <= 0.15's N-D reformulated keys
                    if isinstance(v, dict) and v.get("nd_reformulated_orig_global_shape") is not None}
        # a wrapper's model alone (only_prefixed): the state beside it is left out, not read as megatron's
        self.optimizer = None if only and prefix else find(
            {n: e.size for n, e in dcp.meta.tensors.items()}, params, common_src, limits, reshaped)
        moment_of = {} if self.optimizer is None else {
            m: (p, k) for p, pairs in self.optimizer.moments.items() for k, m in pairs}
        flat = set() if self.optimizer is None else set(self.optimizer.flat)
        self._cut_args = (layers, experts, vocab, padded, label, limits)
        self._axes: dict[tuple[str, int], tuple[int, str]] = {}  # (prefix, axis) -> (length, first tensor)
        tensors: list[LazyTensor] = []
        per_layer: dict[tuple[str, int], list[LazyTensor]] = {}  # layer-major, where the first stacked tensor was
        at: int | None = None
        stacked = 0
        for t in dcp.tensors:
            name = stored = t.name
            if name.endswith(EXTRA_STATE) or name in moment_of:
                continue
            if prefix and name.startswith(prefix):
                name, stripped = name[len(prefix):], stripped + 1
                t = t.renamed(name)
            elif only and prefix:
                outside.append(name)
                continue
            if stored in flat:  # optimizer state not matched to a parameter: as stored, uncut
                tensors.append(t)
                continue
            cut = self._cut(name, stored)
            if cut is None:
                tensors.append(t)
                continue
            if cut[0][0] is None:  # the vocabulary's padding rows cut
                notes.append(f"{name}: the {(padded or 0) - (vocab or 0)} rows of vocabulary padding are cut "
                             f"(padded_vocab_size {padded}, vocab_size {vocab})")
                tensors.append(cut[0][1])
                continue
            stacked += 1
            at = len(tensors) if at is None else at
            pre = _STACKED.match(name).group("pre")  # type: ignore[union-attr]
            for i, out in cut:
                per_layer.setdefault((pre, i if i is not None else 0), []).append(out)
        if at is not None:
            tensors[at:at] = [t for layer in per_layer.values() for t in layer]
        if self.optimizer is not None:
            notes += self._optimizer(tensors, keep_structure)
        extra = [n for n in dcp.meta.order if n.split("/")[0].endswith(EXTRA_STATE)]
        others = [n for n in dcp.meta.byte_values if n not in set(extra)]
        if stacked:
            notes.insert(0, f"{stacked} stacked tensors of megatron-core (a leading layer axis) are read as one "
                         "tensor per layer (decoder.layers.<i>.<param>)")
        if extra:
            notes.append(f"{len(extra)} Transformer Engine _extra_state items (FP8 scaling state, not weights) are "
                         "left out")
        if others:
            notes.append(f"{len(others)} other non-tensor items ({', '.join(others[:3])}"
                         f"{', ...' if len(others) > 3 else ''}) are left out")
        if stripped:
            notes.insert(0, f"{stripped} tensors are read without the '{prefix}' prefix their names are saved with "
                         f"({prefix}decoder.layers... as decoder.layers...)")
        if outside:
            notes.append(f"{len(outside)} tensors outside the model (not under '{prefix}': "
                         f"{', '.join(outside[:2])}{', ...' if len(outside) > 2 else ''}) are left out")
        if not self.args:
            notes.append("common.pt holds no training arguments (args): stacked axes and the vocabulary's padding "
                         "are not checked against them")
        elif padded is not None and vocab is None:
            notes.append(f"the vocabulary keeps its padding (padded_vocab_size {padded}): the arguments do not give "
                         "the tokenizer's vocab_size; cut it with a slice op")
        self.notes = notes
        self.tensors = tensors

    def _optimizer(self, tensors: list[LazyTensor], keep_structure: bool) -> list[str]:
        """megatron's optimizer state after the model's tensors (`tensors`, extended in place): each moment
        cut as its parameter is and named `optimizer.state.<param>.<key>`, in the model's order; with
        `keep_structure`, each parameter's `step` too and the tree of the whole training checkpoint."""
        opt = self.optimizer
        assert opt is not None
        if not opt.moments:
            shown = ", ".join(opt.flat[:2]) + (", ..." if len(opt.flat) > 2 else "")
            return [f"optimizer state in megatron-core's '{opt.layout}' layout: {len(opt.flat)} flat buffers listed as "
                    f"stored ({shown}); where each parameter's elements sit in them is not in the checkpoint, so "
                    "they are not matched to parameters"]
        found: dict[str, list[tuple[str, LazyTensor]]] = {}
        for param, pairs in opt.moments.items():
            for key, stored in pairs:
                cut = self._cut(param, stored)
                pieces = [(param, self.dcp[stored])] if cut is None else [(t.name, t) for _, t in cut]
                for name, t in pieces:
                    found.setdefault(name, []).append((key, t.renamed(f"{STATE}{name}.{key}")))
        model = [t.name for t in tensors]
        shapes = {t.name: t.shape for t in tensors}
        state = [(n, found[n]) for n in model if n in found]
        keys = sorted({k for _, pairs in state for k, _ in pairs})
        notes = [f"megatron-core optimizer state ({opt.layout} layout; {', '.join(keys)}) listed per parameter as "
                 f"{STATE}<param>.<key>, cut per layer as its parameter"]
        if opt.flat:
            notes.append(f"{len(opt.flat)} other optimizer tensors listed as stored ({', '.join(opt.flat[:2])}...)")
        members = assign_groups(opt, {n: shapes[n] for n, _ in state}) if opt.refusal is None else opt.refusal
        if isinstance(members, str):
            opt.refusal = opt.refusal or f"{members}: which group each parameter is in is not certain"
        step = opt.step
        if keep_structure and not isinstance(members, str) and step is not None and not opt.flat:
            state = [(n, [("step", step.renamed(f"{STATE}{n}.step")), *pairs]) for n, pairs in state]
            self.structure = tree(model, [(n, [k for k, _ in pairs]) for n, pairs in state], opt, members)
            notes.append(f"the optimizer's step (common.pt's optimizer.state.{STEP}) is each parameter's step; its "
                         f"{len(opt.groups)} param groups list their parameters by megatron-core's default rule "
                         "(wd_mult 0.0 for biases and 1-D parameters), as megatron-core saves none")
        tensors += [t for _, pairs in state for _, t in pairs]
        return notes

    def _cut(self, param: str, stored: str) -> list[tuple[int | None, LazyTensor]] | None:
        """The stored tensor `stored` cut as megatron stacks the parameter `param` (itself, or one of its
        moments): per layer (and expert), or the vocabulary's rows; each named as `param`'s piece is
        (`decoder.layers.<i>.<param>`); None when nothing is cut. Refuses axes that disagree with the args."""
        layers, experts, vocab, padded, label, limits = self._cut_args
        dcp = self.dcp
        entry, pieces = dcp.meta.tensors[stored], dcp.pieces[stored]
        m = _STACKED.match(param)
        if m is None:
            if param in _VOCAB and padded is not None and entry.size[:1] != (padded,):
                raise FormatError(f"{entry.size[0] if entry.size else 0} rows, but {self._says} "
                                  f"padded_vocab_size {padded}", file=label, tensor=stored)
            if param in _VOCAB and vocab is not None and padded is not None and padded > vocab:
                shape = (vocab, *entry.size[1:])
                return [(None, assemble(param, entry.dtype, shape, rows(pieces, vocab), label, limits))]
            return None
        pre, rest = m.group("pre"), m.group("rest")
        expert = rest.startswith(_EXPERTS)
        lead = 2 if expert else 1
        if len(entry.size) < lead:
            raise FormatError(f"a stacked tensor of {len(entry.size)} dimensions (shape {list(entry.size)})",
                              file=label, tensor=stored)
        if pre == "decoder.layers" and layers is not None and entry.size[0] != layers:
            raise FormatError(f"its stacked layer axis has {entry.size[0]} layers (shape {list(entry.size)}), "
                              f"{self._says} num_layers {layers}", file=label, tensor=stored)
        if expert and experts is not None and entry.size[1] != experts:
            raise FormatError(f"its stacked expert axis has {entry.size[1]} experts (shape {list(entry.size)}), "
                              f"{self._says} num_experts {experts}", file=label, tensor=stored)
        for axis in range(lead):  # without the arguments, the stacked tensors must still agree
            n, first = self._axes.setdefault((pre, axis), (entry.size[axis], stored))
            if n != entry.size[axis]:
                raise FormatError(f"its stacked {'layer' if axis == 0 else 'expert'} axis has {entry.size[axis]} "
                                  f"(shape {list(entry.size)}), {first}'s has {n}", file=label, tensor=stored)
        shape = entry.size[lead:]
        out: list[tuple[int | None, LazyTensor]] = []
        for i in range(entry.size[0]):
            if expert:
                for e in range(entry.size[1]):
                    name = f"{pre}.{i}.mlp.experts.local_experts.{e}.{rest[len(_EXPERTS):]}"
                    out.append((i, assemble(name, entry.dtype, shape, index(pieces, (i, e)), label, limits)))
            else:
                out.append((i, assemble(f"{pre}.{i}.{rest}", entry.dtype, shape, index(pieces, (i,)), label, limits)))
        return out

    def config(self) -> dict[str, Any]:
        """The training arguments as a recipe's `${config.KEY}` reads them (`files.model_config`)."""
        return megatron_config(self.args)

    def extra(self) -> dict[str, Any]:
        return {"container": "torch_dist", "dcp_version": self.dcp.meta.version,
                "iteration": self.common.get("iteration"),
                "checkpoint_version": self.common.get("checkpoint_version"),
                "files": self.dcp.extra()["files"], "notes": list(self.notes),
                "args": {k: self.args[k] for k in _SHOWN_ARGS if k in self.args}}

    def hf_config(self) -> dict[str, Any] | None:
        from .hf_config import hf_config

        return hf_config(self.args, {t.name: t.shape for t in self.tensors}, str(self.folder))

    def close(self) -> None:
        self.dcp.close()


_SHOWN_ARGS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
               "group_query_attention", "kv_channels", "num_experts", "padded_vocab_size", "vocab_size",
               "tensor_model_parallel_size", "pipeline_model_parallel_size", "params_dtype")


def _int(args: dict[str, Any], key: str, label: str) -> int | None:
    v = args.get(key)
    if v is None:
        return None
    if type(v) is not int or v < 0:
        raise FormatError(f"common.pt's args.{key} is {v!r}, not a count", file=label)
    return v
