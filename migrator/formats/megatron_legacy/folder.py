"""A legacy Megatron-LM checkpoint folder: which iteration, and the rank file of each (TP, PP) rank in it.

Megatron-LM's `torch` checkpoint format (`--ckpt-format torch`, the only one before `torch_dist`) writes:

* `<save>/latest_checkpointed_iteration.txt`: the newest iteration's number, or `release`;
* `<save>/iter_0000100/` (seven digits) or `<save>/release/`, holding one folder per model-parallel rank:
  `mp_rank_TT/` without pipeline parallelism, `mp_rank_TT_PPP/` with it (TT the tensor-parallel rank,
  PPP the pipeline stage), each with `model_optim_rng.pt`; an expert-parallel rank adds `_EEE`;
  the distributed optimizer puts `distrib_optim.pt` beside it.

Only names are looked at here; nothing is opened but the tracker file (one short line, bounded).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ...core.bytesource import read_short_text
from ...core.errors import FormatError
from ...storage.paths import require_inside

TRACKER = "latest_checkpointed_iteration.txt"
RANK_FILE = "model_optim_rng.pt"
RANK_DIR_RE = re.compile(r"^mp_rank_(?P<tp>\d{2,6})(?:_(?P<pp>\d{3,6}))?(?:_(?P<ep>\d{3,6}))?$")
ITER_RE = re.compile(r"^iter_(?P<n>\d{7,12})$")
MAX_TRACKER_BYTES = 64
MAX_LISTED = 100_000


@dataclass
class IterationFolder:
    """One iteration's rank folders: `ranks[(tp, pp)]` the path of its `model_optim_rng.pt` (pp None when
    the folder names carry no stage), `root` the save folder, `tag` the folder's name."""

    root: Path
    path: Path
    tag: str
    ranks: dict[tuple[int, int | None], Path] = field(default_factory=dict)
    expert_ranks: bool = False


def _names(path: Path) -> list[str]:
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return names[:MAX_LISTED]


def _is_iteration(path: Path) -> bool:
    """Rank folders `mp_rank_*` each holding `model_optim_rng.pt` (the first one found is looked into)."""
    for name in sorted(_names(path)):
        if RANK_DIR_RE.match(name) and (path / name).is_dir():
            return (path / name / RANK_FILE).is_file()
    return False


def is_megatron_legacy(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a legacy Megatron save folder (its tracker file beside `iter_*` or `release`
    folders) or one iteration's folder of `mp_rank_*` rank folders."""
    p = Path(path)
    if not p.is_dir():
        return False
    if (p / TRACKER).is_file():
        return True
    return _is_iteration(p)


def find_iteration(path: str | os.PathLike[str]) -> IterationFolder:
    """The iteration folder `path` names (itself, or the one its tracker file names) and its rank files."""
    p = Path(path)
    if _is_iteration(p):
        it = IterationFolder(p.parent, p, p.name)
    else:
        tracker = p / TRACKER
        require_inside(tracker, p, str(p), f"'{TRACKER}'")
        text = read_short_text(tracker, MAX_TRACKER_BYTES, "ascii", "the tracker file")
        if not (text == "release" or (text.isdigit() and len(text) <= 12)):
            raise FormatError("the tracker file does not hold an iteration number or 'release' (one short line)",
                              file=str(tracker))
        tag = "release" if text == "release" else f"iter_{int(text):07d}"
        where = p / tag
        if not where.is_dir():
            held = sorted(n for n in _names(p) if ITER_RE.match(n) or n == "release")
            raise FormatError(f"{TRACKER} names iteration {text}, but there is no folder '{tag}'"
                              + (f"; the iterations here are {', '.join(held[:20])}" if held else ""), file=str(p))
        require_inside(where, p, str(p), "iteration folder")
        it = IterationFolder(p, where, tag)
        if not _is_iteration(where):
            raise FormatError(f"'{tag}' holds no mp_rank_* folder with {RANK_FILE}", file=str(where))
    for name in sorted(_names(it.path)):
        m = RANK_DIR_RE.match(name)
        if m is None or not (it.path / name).is_dir():
            continue
        if m["ep"] is not None:
            it.expert_ranks = True
            continue
        file = it.path / name / RANK_FILE
        if not os.path.lexists(file):  # a rank folder without its file: named as missing by the reader
            continue
        require_inside(file, p, str(p), "rank file")
        it.ranks[(int(m["tp"]), None if m["pp"] is None else int(m["pp"]))] = file
    if it.expert_ranks:
        raise FormatError("expert-parallel rank folders (mp_rank_TT_PPP_EEE): migrator joins tensor- and "
                          "pipeline-parallel ranks of legacy Megatron checkpoints, not expert-parallel ones",
                          file=str(it.path))
    staged = {pp is not None for _, pp in it.ranks}
    if len(staged) > 1:
        raise FormatError("both mp_rank_TT and mp_rank_TT_PPP folders: the ranks of two different layouts",
                          file=str(it.path))
    return it


def rank_dir_name(tp: int, pp: int | None) -> str:
    """The folder Megatron names for a rank (`mp_rank_01`, `mp_rank_01_002`)."""
    return f"mp_rank_{tp:02d}" if pp is None else f"mp_rank_{tp:02d}_{pp:03d}"
