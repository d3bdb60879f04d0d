"""A ZeRO checkpoint folder: which step (`latest` or a tag), and the state files of each rank in it.

`engine.save_checkpoint(dir)` writes `dir/latest` (the tag of the newest step, `global_step<N>` by
default) and `dir/<tag>/` holding, for data-parallel ranks 0..N-1 and model-parallel rank 00:

* `mp_rank_00_model_states.pt` (ZeRO-1/2) or `zero_pp_rank_<r>_mp_rank_00_model_states.pt` per rank
  (ZeRO-3): the module's state_dict (16-bit weights under bf16/fp16; empty partitions under ZeRO-3),
  `param_shapes`, `buffer_names`, frozen parameters, tied (`shared_params`) names;
* `zero_pp_rank_<r>_mp_rank_00_optim_states.pt` (`bf16_zero_pp_rank_...` from the bf16 optimizer):
  the rank's flat fp32 partitions and its optimizer state.

Only names are looked at here; nothing is opened.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ...core.bytesource import read_short_text
from ...core.errors import FormatError
from ...storage.paths import require_inside

OPTIM_RE = re.compile(r"^(?:(?P<prefix>bf16|fp16)_)?zero_pp_rank_(?P<rank>\d{1,6})_mp_rank_(?P<mp>\d{2,6})"
                      r"_optim_states\.pt$")
MODEL_RE = re.compile(r"^(?:zero_pp_rank_(?P<rank>\d{1,6})_)?mp_rank_(?P<mp>\d{2,6})_model_states\.pt$")
STEP_RE = re.compile(r"^global_step\d+$")
MAX_TAG_BYTES = 4096
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".bpk", ".pt", ".pth", ".index.json")


@dataclass
class StepFolder:
    """One step's files: `optim[rank]`, `models[rank]` (None: ZeRO-1/2's single file), the tag."""

    root: Path  # the folder holding `latest` (the step folder's parent when given a step folder)
    path: Path
    tag: str
    optim: dict[int, Path] = field(default_factory=dict)
    models: dict[int | None, Path] = field(default_factory=dict)


def _names(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _is_step(path: Path) -> bool:
    names = _names(path)
    return any(OPTIM_RE.match(n) for n in names) and any(MODEL_RE.match(n) for n in names)


def is_zero_checkpoint(path: str | os.PathLike[str], tag: str | None = None) -> bool:
    """Whether `path` is a ZeRO step folder, or a folder of steps (`latest`, `global_step<N>/`) that
    holds no weights of its own (a Hugging Face Trainer checkpoint with `model.safetensors` beside its
    `global_step<N>/` opens as that model folder unless a `tag` is given)."""
    p = Path(path)
    if not p.is_dir():
        return False
    if _is_step(p):
        return True
    names = _names(p)
    if tag is not None:
        return "latest" in names or any(STEP_RE.match(n) for n in names) or _is_step(p / tag)
    if any(n.endswith(_WEIGHT_SUFFIXES) for n in names):
        return False
    if "latest" in names and (p / "latest").is_file():
        return True
    return any(STEP_RE.match(n) and _is_step(p / n) for n in names[:10_000])


def find_step(path: str | os.PathLike[str], tag: str | None) -> StepFolder:
    """The step folder `path` names (itself, its `tag`, or the tag in its `latest` file) and its files."""
    p = Path(path)
    if _is_step(p):
        if tag is not None and tag != p.name:
            raise FormatError(f"this is the step folder of '{p.name}'; --tag {tag} names another: give the "
                              "checkpoint folder above it with --tag, or the step folder alone", file=str(p))
        step = StepFolder(p.parent, p, p.name)
    else:
        if tag is None:
            latest = p / "latest"
            steps = sorted((n for n in _names(p) if STEP_RE.match(n)), key=lambda n: int(n[len("global_step"):]))
            if not latest.is_file():
                shown = f"; it holds {', '.join(steps[:20])}" if steps else ""
                raise FormatError(f"no 'latest' file names the step to read: pick one with --tag{shown}", file=str(p))
            require_inside(latest, p, str(p), "'latest'")
            tag = read_short_text(latest, MAX_TAG_BYTES, "utf-8", "'latest'")
            if not tag:
                raise FormatError("'latest' does not hold a step tag (one short line, such as global_step10)",
                                  file=str(latest))
        if tag in ("", ".", "..") or "/" in tag or "\\" in tag or "\0" in tag:
            raise FormatError(f"step tag {tag!r} is not the name of a folder inside the checkpoint", file=str(p))
        where = p / tag
        if not where.is_dir():
            steps = sorted(n for n in _names(p) if (p / n).is_dir() and _is_step(p / n))
            raise FormatError(f"no step folder '{tag}'" + (f"; the steps here are {', '.join(steps[:20])}" if steps
                                                           else ""), file=str(p))
        require_inside(where, p, str(p), "step folder")
        step = StepFolder(p, where, tag)
    for name in sorted(_names(step.path)):
        if OPTIM_RE.match(name) or MODEL_RE.match(name):  # the one rule for a checkpoint's files
            require_inside(step.path / name, p, str(p), "state file")
        m = OPTIM_RE.match(name)
        if m is not None:
            _check_mp(m["mp"], step.path / name)
            rank = int(m["rank"])
            if rank in step.optim:
                raise FormatError(f"two optimizer state files for rank {rank}: {step.optim[rank].name} and {name}",
                                  file=str(step.path))
            step.optim[rank] = step.path / name
            continue
        m = MODEL_RE.match(name)
        if m is not None:
            _check_mp(m["mp"], step.path / name)
            step.models[None if m["rank"] is None else int(m["rank"])] = step.path / name
    if not step.optim:
        raise FormatError("no '*_optim_states.pt' file: not a ZeRO checkpoint step (a ZeRO-0 or pipeline "
                          "checkpoint holds its weights in the model states file)", file=str(step.path))
    return step


def _check_mp(mp: str, path: Path) -> None:
    if int(mp) != 0:
        raise FormatError("a tensor-parallel (mp_rank > 00) ZeRO checkpoint: migrator consolidates data-parallel "
                          "ranks of model-parallel rank 00 only", file=str(path))
