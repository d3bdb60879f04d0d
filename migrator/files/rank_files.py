"""Which files make one checkpoint of many ranks (verl's `<stem>_world_size_N_rank_K.pt`; DCP's Hugging
Face layout, `shard-R-model-F-of-N.safetensors`; `...rank<K>...` files, candidates only): found from names
alone, with no reader imported, since every source a command opens is asked (`files.io.open_file`)."""

from __future__ import annotations

import glob as globlib
import os
import re
from collections.abc import Sequence
from pathlib import Path

from ..core.errors import FormatError, LimitExceededError
from ..core.limits import DEFAULT_LIMITS, Limits
from ..storage.paths import require_inside

GLOB_CHARS = frozenset("*?[")

SHARD_FILE = re.compile(r"^shard-(?P<rank>\d{1,9})-model-(?P<file>\d{1,9})-of-(?P<count>\d{1,9})\.safetensors$")
"""A DCP checkpoint in the Hugging Face storage layout: rank R's output file F of N (`files.dcp_safetensors`)."""

RANK_FILE = re.compile(r"^(?P<stem>.+)_world_size_(?P<n>\d{1,6})_rank_(?P<k>\d{1,6})\.(?:pt|pth|bin)$")
"""verl's per-rank file names (`model_world_size_8_rank_3.pt`; also `optim_` and `extra_state_`)."""


RANK_ANY = re.compile(r"^(?P<head>(?:.*[_.-])?rank[_-]?)(?P<k>\d{1,6})(?P<tail>(?:[_.-].*)?)\.(?P<ext>pt|pth|bin)$")
"""Any other per-rank name: `rank` (at the start or after `_`, `-` or `.`), the rank, then the end or a
separator: `model_rank0.pt`, Accelerate's `pytorch_model_fsdp_rank1.bin`, `rank_3-model.pt`. Unlike
verl's, such a name does not give the world size, nor prove that the file is one rank's part: the files
only make a set when they hold ShardedTensors or DTensors (`files.sharded_tensor_ranks.open_rank_set`)."""


def rank_name(f: Path, k: int) -> str:
    """The name rank `k`'s file has in the set of `f` (`model_rank0.pt`, 3 -> `model_rank3.pt`)."""
    m = RANK_ANY.match(f.name)
    assert m is not None
    return f"{m['head']}{k}{m['tail']}.{m['ext']}"


def _set_key(m: re.Match[str]) -> tuple[str, str, str]:
    return m["head"], m["tail"], m["ext"]


def any_rank_files(path: str | os.PathLike[str]) -> list[list[tuple[int, Path]]] | None:
    """The candidate sets of `...rank<K>...` files `path` names, each as (rank, file) in rank order: a
    folder's sets (the ones whose name says `model` first), or the one set of a glob or of one of its
    files; None when it names none. Refused: a glob matching several sets, a rank twice (`rank1`,
    `rank01`). Which set, if any, is a checkpoint is for their content to say (`open_rank_set`)."""
    text = os.fspath(path)
    p = Path(text)
    if p.is_dir():
        groups: dict[tuple[str, str, str], list[Path]] = {}
        for n in sorted(os.listdir(p)):
            if (m := RANK_ANY.match(n)) and not RANK_FILE.match(n) and (p / n).is_file():
                groups.setdefault(_set_key(m), []).append(p / n)
        if not groups:
            return None
        keys = sorted(groups, key=lambda k: "model" not in k[0] + k[1])
        return [_ranked(_inside(groups[k], text), text) for k in keys]
    if p.is_file():
        m = RANK_ANY.match(p.name)
        if m is None or RANK_FILE.match(p.name):
            return None
        folder = p.parent
        return [_ranked(_inside([folder / n for n in sorted(os.listdir(folder))
                                 if (r := RANK_ANY.match(n)) and _set_key(r) == _set_key(m) and (folder / n).is_file()],
                                text), text)]
    if not os.path.exists(text) and GLOB_CHARS.intersection(os.path.basename(text)):
        matched = [Path(f) for f in sorted(globlib.glob(text)) if os.path.isfile(f)]
        found = [(RANK_ANY.match(f.name), f) for f in matched]
        if not matched or not all(m is not None and not RANK_FILE.match(f.name) for m, f in found):
            return None
        distinct = {_set_key(m) for m, _ in found if m is not None}
        if len(distinct) > 1:
            sets = ", ".join(sorted(f"{h}*{t}.{e}" for h, t, e in distinct))
            raise FormatError(f"rank files of different checkpoints: {sets}", file=text)
        return [_ranked(_inside(matched, text), text)]
    return None


def _inside(files: list[Path], given: str) -> list[Path]:
    """`files`, each checked to resolve inside the folder it was listed in or matched from (the one
    rule for every file a source of several files reads: `storage.paths.require_inside`)."""
    for f in files:
        require_inside(f, f.parent, given, "rank file")
    return files


def set_pattern(ranked: list[tuple[int, Path]]) -> str:
    """A glob naming the set of `ranked` (`ckpt/model_rank*.pt`), for the errors that ask for one."""
    f = ranked[0][1]
    m = RANK_ANY.match(f.name)
    assert m is not None
    return str(f.parent / f"{m['head']}*{m['tail']}.{m['ext']}")


def _ranked(files: list[Path], given: str) -> list[tuple[int, Path]]:
    by_rank: dict[int, Path] = {}
    for f in files:
        m = RANK_ANY.match(f.name)
        assert m is not None
        k = int(m["k"])
        if k in by_rank:
            raise FormatError(f"rank {k} twice: {by_rank[k].name} and {f.name}", file=given)
        by_rank[k] = f
    return sorted(by_rank.items())


def rank_files(path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS) -> list[Path] | None:
    """Every rank's file of the set `path` names (a folder, a glob or one rank file), in rank order;
    None when `path` names no rank file. Refused: a missing rank, a rank twice, a rank beyond N."""
    text = os.fspath(path)
    p = Path(text)
    if p.is_dir():
        found = [p / n for n in sorted(os.listdir(p)) if RANK_FILE.match(n) and (p / n).is_file()]
        if not found:
            return None
        stems = sorted({_match(f)["stem"] for f in found})
        stem = "model" if "model" in stems else stems[0] if len(stems) == 1 else None
        if stem is None:
            raise FormatError(f"the folder holds the rank files of {', '.join(stems)}; name one set with a glob "
                              f"(e.g. {p / (stems[0] + '_world_size_*_rank_*.pt')})", file=text)
        return _checked(_inside([f for f in found if _match(f)["stem"] == stem], text), text, limits)
    if p.is_file():
        m = RANK_FILE.match(p.name)
        if m is None:
            return None
        folder = p.parent
        same = [folder / n for n in sorted(os.listdir(folder))
                if (r := RANK_FILE.match(n)) and r["stem"] == m["stem"] and (folder / n).is_file()]
        return _checked(_inside(same, text), text, limits)
    if not os.path.exists(text) and GLOB_CHARS.intersection(os.path.basename(text)):
        matched = [Path(f) for f in sorted(globlib.glob(text)) if os.path.isfile(f)]
        if matched and all(RANK_FILE.match(f.name) for f in matched):
            return _checked(_inside(matched, text), text, limits)
    return None


def _match(f: Path) -> re.Match[str]:
    m = RANK_FILE.match(f.name)
    assert m is not None
    return m


def _checked(files: list[Path], given: str, limits: Limits) -> list[Path]:
    """The files in rank order, after checking that they are one set of N ranks, each once."""
    sizes = {int(_match(f)["n"]) for f in files}
    stems = {_match(f)["stem"] for f in files}
    if len(stems) > 1:
        raise FormatError(f"rank files of different checkpoints: {', '.join(sorted(stems))}", file=given)
    n = max(sizes)
    if n > limits.max_shards:
        raise LimitExceededError(f"world size {n}, over the {limits.max_shards} limit (max_shards)", file=given)
    stem = next(iter(stems))
    if len(sizes) > 1:
        odd = next(f for f in files if int(_match(f)["n"]) != n)
        raise FormatError(f"extra rank file {odd.name}: it is of world size {_match(odd)['n']}, the others of {n}",
                          file=given)
    by_rank: dict[int, Path] = {}
    for f in files:
        k = int(_match(f)["k"])
        if k >= n:
            raise FormatError(f"extra rank file {f.name}: rank {k} of a world of {n} ranks (0..{n - 1})", file=given)
        if k in by_rank:
            raise FormatError(f"rank {k} twice: {by_rank[k].name} and {f.name}", file=given)
        by_rank[k] = f
    missing = [k for k in range(n) if k not in by_rank]
    if missing:
        names = ", ".join(f"{stem}_world_size_{n}_rank_{k}.pt" for k in missing[:5])
        raise FormatError(f"rank {missing[0]} of {n} is missing ({names}{' ...' if len(missing) > 5 else ''} not "
                          "found)", file=given)
    return [by_rank[k] for k in range(n)]


def dcp_safetensors_files(path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS) -> list[Path] | None:
    """The shard files of the folder `path` (or of its `sharded/` subfolder), in (rank, file) order;
    None when it holds none. The subfolder and every file must resolve inside `path`
    (`storage.paths.require_inside`)."""
    p = Path(path)
    for folder in (p, p / "sharded"):
        if not folder.is_dir():
            continue
        found = [(m, folder / n) for n in os.listdir(folder) if (m := SHARD_FILE.match(n)) and (folder / n).is_file()]
        if found:
            for _, f in found:
                require_inside(f, p, str(p), "shard file")
            found.sort(key=lambda mf: (int(mf[0]["rank"]), int(mf[0]["file"])))
            _check_complete([m for m, _ in found], str(folder), limits)
            return [f for _, f in found]
    return None


def _check_complete(names: Sequence[re.Match[str]], label: str, limits: Limits) -> None:
    """Ranks 1..R each with files 1..N of one N: a missing rank before the last, or a missing file of a
    rank, is named. (A missing *last* rank leaves no trace in the names or the sharding info, which
    records no global shape: its chunks' rows are simply not there.) What the names claim (N, the
    ranks) is checked by arithmetic on the files that are there, never by listing what they claim:
    a name saying `-of-10000000` costs nothing before it is refused."""
    counts = {int(m["count"]) for m in names}
    if len(counts) != 1:
        raise FormatError(f"shard files of different counts ({', '.join(map(str, sorted(counts)))})", file=label)
    count = counts.pop()
    if count > limits.max_shards:
        raise LimitExceededError(f"the names claim {count} shard files per rank, over the {limits.max_shards} limit "
                                 "(max_shards)", file=label)
    by_rank: dict[int, set[int]] = {}
    for m in names:
        by_rank.setdefault(int(m["rank"]), set()).add(int(m["file"]))
    rank = 1
    while rank in by_rank:  # bounded by the files listed
        rank += 1
    if rank <= max(by_rank):
        raise FormatError(f"rank {rank}'s shard files are missing (shard-{rank:05d}-model-*-of-{count:05d}"
                          ".safetensors)", file=label)
    for rank in sorted(by_rank):
        files = by_rank[rank]
        odd = next((f for f in sorted(files) if not 1 <= f <= count), None)
        if odd is not None:
            raise FormatError(f"shard-{rank:05d}-model-{odd:05d}-of-{count:05d}.safetensors: file {odd} of a set of "
                              f"{count}", file=label)
        if len(files) != count:
            first = next(f for f in range(1, len(files) + 2) if f not in files)
            raise FormatError(f"shard-{rank:05d}-model-{first:05d}-of-{count:05d}.safetensors is missing",
                              file=label)
