"""`MegatronLegacyReader`: a legacy Megatron-LM checkpoint iteration as one global state dict, lazily.

Every (tensor-parallel rank, pipeline stage) saved its own `model_optim_rng.pt` (`folder.py`). The
reader opens each (headers only, `rankfile.py`), checks the files against the `args` they hold (the
ranks `tensor_model_parallel_size` x `pipeline_model_parallel_size` make, the same args in each file,
the iteration the folder names, every stage's layers against `num_layers`), then makes each global
tensor from its ranks' pieces as `splits.py` says (rows, columns, replicated, SwiGLU's per-rank
`[gate_r; up_r]` re-interleaved), renumbering each stage's layers by the layers before it. A tensor is
a lazy assembly of byte ranges of the rank files (`formats.dcp.assemble`): nothing is read until it is
streamed, then one tensor at a time. Names are megatron-core's (`splits.OLD_NAMES` renames older ones).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...core.bytesource import FileSet
from ...core.errors import FormatError, LimitExceededError
from ...core.limits import DEFAULT_LIMITS, Limits
from ...core.reopening import Descriptors, reopening
from ...core.tensor import LazyTensor
from ..base import Reader
from ..dcp.assemble import Piece, assemble
from .folder import RANK_FILE, IterationFolder, find_iteration, rank_dir_name
from .layers import Unit, units, virtual_chunks
from .rankfile import RankFile
from .rows import row_slice
from .shapes import check_shapes
from .splits import LAYER, OLD_NAMES_NOTE, Split, mcore_name, split_of

MIN_VERSION = 2.0
"""Megatron reorders the QKV rows of checkpoints before version 2.0 when it loads them
(`fix_query_key_value_ordering`); migrator reads 2.0 and later (3.0 since 2020)."""




class MegatronLegacyReader(Reader):
    """A legacy Megatron-LM checkpoint (`iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt`) as global tensors."""

    format = "megatron-legacy"

    def __init__(self, path: str | os.PathLike[str], *, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self.metadata: dict[str, str] = {}
        self.scalars = {}
        self.tensors: list[LazyTensor] = []
        self.fds = Descriptors()
        self.ranks: dict[tuple[int, int], RankFile] = {}
        self._splits: dict[str, str] = {}
        self._skipped = 0  # `_extra_state` tensors left out
        self.virtual = 1
        notes: list[str] = []
        try:
            it = find_iteration(path)
            self.iteration_folder = it
            self.folder = it.path
            self._open(it, notes)
        except BaseException:
            self.close()
            raise
        self.notes = notes
        files = list(self.ranks.values())
        mode = 0o7777
        for f in files:
            mode &= f.source.mode or 0
        self.source = FileSet(str(it.path), sum(f.source.size for f in files),
                              [f.source.identity for f in files if f.source.identity is not None], mode,
                              kind="a Megatron checkpoint")

    # -- the files and their args

    def _open(self, it: IterationFolder, notes: list[str]) -> None:
        label = str(it.path)
        if not it.ranks:
            raise FormatError(f"no mp_rank_* folder with {RANK_FILE}", file=label)
        first_key = min(it.ranks, key=lambda k: (k[1] or 0, k[0]))
        first = self._rank(it.ranks[first_key])
        args = first.args
        if not args:
            raise first.bad("holds no 'args': the tensor- and pipeline-parallel sizes cannot be read or checked")
        tp = _count(first, args, "tensor_model_parallel_size")
        pp = _count(first, args, "pipeline_model_parallel_size")
        if tp * pp > self.limits.max_shards:
            raise LimitExceededError(f"args name {tp} x {pp} ranks, over the {self.limits.max_shards} limit "
                                     "(max_shards)", file=first.label)
        if int(args.get("expert_model_parallel_size") or 1) > 1:
            raise first.bad("expert_model_parallel_size > 1: migrator joins tensor- and pipeline-parallel ranks "
                            "of legacy Megatron checkpoints, not expert-parallel ones")
        etp = args.get("expert_tensor_parallel_size")
        if args.get("num_experts") and etp is not None and etp != tp:
            raise first.bad(f"expert_tensor_parallel_size {_shown(etp)} differs from tensor_model_parallel_size {tp}: "
                            "experts divided over other ranks than the rest of the model, which migrator does not join")
        staged = pp > 1
        want = {(t, p if staged else None) for t in range(tp) for p in range(pp)}
        for key in sorted(want, key=lambda k: (k[1] or 0, k[0])):
            if key not in it.ranks:
                where = it.path / rank_dir_name(*key) / RANK_FILE
                raise FormatError(f"rank file {rank_dir_name(*key)}/{RANK_FILE} is missing: the args of "
                                  f"{_short(first, it)} say tensor_model_parallel_size {tp} x "
                                  f"pipeline_model_parallel_size {pp} ({len(it.ranks)} of the {tp * pp} rank "
                                  "files are here)", file=str(where))
        extra = sorted((k for k in it.ranks if k not in want), key=lambda k: (k[1] or 0, k[0]))
        if extra:
            raise FormatError(f"rank folder {rank_dir_name(*extra[0])} is beyond the tensor_model_parallel_size "
                              f"{tp} x pipeline_model_parallel_size {pp} that the args of {_short(first, it)} say",
                              file=str(it.ranks[extra[0]]))
        for key in sorted(want, key=lambda k: (k[1] or 0, k[0])):
            f = first if key == first_key else self._rank(it.ranks[key])
            self.ranks[(key[0], key[1] or 0)] = f
            self._check_file(f, first, it)
        self.tp, self.pp = tp, pp
        self.args = args
        v = virtual_chunks(args, pp, first)
        for f in self.ranks.values():
            if f.chunks != (v if v > 1 else 0):
                held = f"model0..model{f.chunks - 1}" if f.chunks else "one 'model'"
                raise f.bad(f"holds {held}, but virtual_pipeline_model_parallel_size "
                            f"{_shown(args.get('virtual_pipeline_model_parallel_size'))} makes {v} model chunks per "
                            "stage" + (" (model0, model1, ...)" if v > 1 else ""))
        self.virtual = v
        gated = bool(args.get("swiglu"))
        seen: dict[str, str] = {}
        renamed = False
        for unit in units(args, pp, v, first):
            renamed |= self._unit(unit, [self.ranks[(t, unit.stage)] for t in range(tp)], gated, seen, it)
        skipped = sum(len(self.ranks[(0, p)].extra_states) for p in range(pp)) + self._skipped
        check_shapes(self.tensors, args, label=str(it.path))
        if renamed:
            notes.append(OLD_NAMES_NOTE)
        if skipped:
            notes.append(f"{skipped} _extra_state entries (Transformer Engine's FP8 bookkeeping, not weights) "
                         "left out")
        if "optimizer" in first.top_keys or "rng_state" in first.top_keys:
            notes.append("the optimizer, scheduler and RNG states of the rank files are not read: the model's "
                         "weights only")
        vocab = args.get("padded_vocab_size")
        if type(vocab) is int:
            notes.append(f"the embedding and output rows are padded_vocab_size ({vocab}): the tokenizer's "
                         "vocabulary plus Megatron's padding, which a recipe trims (slice) to the model's vocab_size")

    def _unit(self, unit: Unit, stage: list[RankFile], gated: bool, seen: dict[str, str],
              it: IterationFolder) -> bool:
        """The tensors of one stage's chunk, joined over its tensor-parallel ranks; whether a name was an old one."""
        prefix = f"model{unit.chunk}." if self.virtual > 1 else ""
        where = f"stage {unit.stage}" + (f" chunk {unit.chunk}" if prefix else "")
        names = [n for n in stage[0].names() if n.startswith(prefix)]
        for t, other in enumerate(stage[1:], 1):
            theirs = [n for n in other.names() if n.startswith(prefix)]
            if set(theirs) != set(names):
                odd = sorted(set(theirs) ^ set(names))[0]
                holder = other if odd in other else stage[0]
                raise FormatError(f"tensor-parallel ranks 0 and {t} of {where} hold different tensors: "
                                  f"'{odd}' is only in {_short(holder, it)}", file=holder.label, tensor=odd)
        layers: set[int] = set()
        renamed = False
        for name in names:
            gname, old = mcore_name(name[len(prefix):])
            renamed |= old
            m = LAYER.match(gname)
            if m is not None:
                local = int(m["index"])
                if local >= unit.count:
                    raise stage[0].bad(f"layer {local} of {where}, which holds {unit.count} layers (num_layers "
                                       f"{self.args.get('num_layers')} over {self.pp} pipeline stages)", name)
                layers.add(local)
                gname = f"{m['pre']}{unit.first + local}{m['post']}"
            split = split_of(gname)
            if split is not None and split.kind == "skip":
                self._skipped += 1
                continue
            if gname in seen:
                raise FormatError(f"'{gname}' is in two pipeline stages: {seen[gname]} and {_short(stage[0], it)}",
                                  file=stage[0].label, tensor=name)
            seen[gname] = _short(stage[0], it) + (f" ({prefix[:-1]})" if prefix else "")
            self.tensors.append(self._join(gname, name, split, stage, gated, it))
        if layers != set(range(unit.count)):
            held = f"layers {min(layers)}..{max(layers)} ({len(layers)})" if layers else "no layer"
            raise stage[0].bad(f"{where} holds {held}, but num_layers {self.args.get('num_layers')} over {self.pp} "
                               f"pipeline stages" + (f" x {self.virtual} virtual chunks" if prefix else "")
                               + f" gives it {unit.count}")
        return renamed

    def _rank(self, path: Path) -> RankFile:
        return RankFile(reopening(path, self.fds), self.limits)

    def _check_file(self, f: RankFile, first: RankFile, it: IterationFolder) -> None:
        if f is not first:
            for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "num_layers",
                        "padded_vocab_size", "swiglu", "virtual_pipeline_model_parallel_size"):
                if f.args.get(key) != first.args.get(key):
                    raise f.bad(f"args say {key} {_shown(f.args.get(key))}, but {_short(first, it)} says "
                                f"{_shown(first.args.get(key))}")
        version = f.version
        if not isinstance(version, (int, float)) or isinstance(version, bool) or version < MIN_VERSION:
            raise f.bad(f"checkpoint_version {_shown(version)}: its QKV rows are in the order of Megatron before "
                        "version 2.0, which migrator does not reorder")
        if it.tag.startswith("iter_") and f.iteration != int(it.tag[5:]):
            raise f.bad(f"holds iteration {_shown(f.iteration)}, but its folder is {it.tag}")

    # -- one global tensor

    def _join(self, gname: str, name: str, split: Split | None, stage: list[RankFile], gated: bool,
              it: IterationFolder) -> LazyTensor:
        parts = [f[name] for f in stage]
        first = parts[0]
        if len(stage) == 1:
            self._splits[gname] = "whole"
            return first.renamed(gname)
        if split is None:
            raise stage[0].bad("no split rule for this tensor: migrator does not know how Megatron divides it "
                               f"between the {len(stage)} tensor-parallel ranks (formats/megatron_legacy/splits.py)",
                               name)
        for t, (f, part) in enumerate(zip(stage, parts, strict=True)):
            if part.dtype is not first.dtype or part.shape != first.shape:  # Megatron divides evenly
                raise f.bad(f"tensor-parallel rank {t} holds {part.dtype.display}{list(part.shape)} in "
                            f"{_short(f, it)}, rank 0 {first.dtype.display}{list(first.shape)} in "
                            f"{_short(stage[0], it)}: ranks of a {split.kind} tensor must agree", name)
        self._splits[gname] = split.kind + (" (gate/up per rank)" if split.gated and gated else "")
        if split.kind == "replicated":
            return first.renamed(gname)
        d = split.dim
        assert d is not None
        shape = first.shape
        if len(shape) <= d:
            raise stage[0].bad(f"a {len(shape)}-dimensional tensor cannot be split along dim {d} ({split.why})", name)
        n = len(stage)
        whole = tuple(s * n if i == d else s for i, s in enumerate(shape))
        pieces: list[Piece] = []
        zeros = (0,) * (len(shape) - 1)
        if split.gated and gated:
            half, odd = divmod(shape[0], 2)
            if odd:
                raise stage[0].bad(f"{shape[0]} rows per rank cannot be a rank's [gate; up] halves (swiglu)", name)
            sizes = (half, *shape[1:])
            for t, (f, part) in enumerate(zip(stage, parts, strict=True)):
                pieces.append(Piece((t * half, *zeros), sizes, f.label, row_slice(part, 0, half, f.source)))
                pieces.append(Piece((n * half + t * half, *zeros), sizes, f.label,
                                    row_slice(part, half, 2 * half, f.source)))
        else:
            for t, (f, part) in enumerate(zip(stage, parts, strict=True)):
                offsets = tuple(t * shape[i] if i == d else 0 for i in range(len(shape)))
                pieces.append(Piece(offsets, tuple(shape), f.label, part))
        return assemble(gname, first.dtype, whole, pieces, str(it.path), self.limits)

    # -- what inspect shows

    def extra(self) -> dict[str, Any]:
        keys = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "num_layers", "hidden_size",
                "num_attention_heads", "num_query_groups", "ffn_hidden_size", "padded_vocab_size", "swiglu",
                "untie_embeddings_and_output_weights")
        args = getattr(self, "args", {})
        return {
            "container": "megatron-legacy",
            "iteration": self.iteration_folder.tag,
            "virtual_pipeline_chunks": self.virtual,
            "args": {k: args.get(k) for k in keys if isinstance(args.get(k), (int, float, bool, str))},
            "files": [str(f.label) for f in self.ranks.values()],
            "splits": dict(list(self._splits.items())[:1000]),
            "notes": list(self.notes),
        }

    def describe(self, name: str) -> str:
        return f"{name!r} (Megatron checkpoint {self.iteration_folder.tag})"

    def close(self) -> None:
        for f in getattr(self, "ranks", {}).values():
            f.close()
        fds = getattr(self, "fds", None)
        if fds is not None:
            fds.close()


def _count(f: RankFile, args: dict[str, Any], key: str) -> int:
    value = args.get(key)
    if type(value) is not int or value < 1:
        raise f.bad(f"args.{key} is {_shown(value)}, not a positive integer")
    return value


def _shown(value: Any) -> str:
    if type(value) is int:
        return str(value) if value.bit_length() <= 64 else "a huge integer"
    if isinstance(value, (float, bool)) or value is None:
        return str(value)
    if isinstance(value, str):
        return repr(value[:40])
    return f"a {type(value).__name__}"


def _short(f: RankFile, it: IterationFolder) -> str:
    """A rank file's name below its iteration folder (`mp_rank_01_000/model_optim_rng.pt`)."""
    try:
        return str(Path(f.label).relative_to(it.path))
    except ValueError:
        return f.label
