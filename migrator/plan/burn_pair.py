"""A model and Burn's optimizer record as one pair: one stamp in both files, ids no replaced pair has.

The two files are published by two renames (`storage.atomic_pair`: the record first, the model, the
commit point, last), and a kill between them leaves an old model beside a new record. That state is
never mistaken for a pair:

- both files carry the same stamp, `migrator.pair` in their metadata (16 hex digits of a SHA-256 of
  the model's param_ids), and each names the other, relative to its own folder (`migrator.pair.record`
  in the model, `migrator.pair.model` in the record): `inspect` reports whether the file beside it is
  its pair (`check_pair`). Burn ignores both keys: `load_record` keeps only metadata keys that parse
  as a u64 (a ParamId), and a model's metadata is not read by its load;
- the ids are derived from the checkpoint (`burn_optimizer.derived_ids`), plus a generation chosen so
  that the new pair's stamp and ids are none of those the files at its two paths hold
  (`choose_generation`): a new record never shares an id with the old model it may be left beside,
  so Burn applies none of its state to it (Burn keys the state by ParamId alone). Into a place that
  holds no pair of the same checkpoint the generation is 0: the same files, byte for byte, as every
  migrator output; a run replacing its own earlier pair writes the next generation.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .burn_optimizer import BurnRecord
    from .entry import PlanEntry
    from .training_state import Training

PAIR_KEY = "migrator.pair"
RECORD_KEY = "migrator.pair.record"
MODEL_KEY = "migrator.pair.model"
MAX_GENERATIONS = 16
"""Generations tried before refusing: two pair files hold at most two stamps, so 3 always suffice
unless the files at the target were made to hold the ids of every generation."""


def stamp_of(ids: Iterable[int]) -> str:
    """The pair's stamp: 16 hex digits of a SHA-256 of the model's param_ids (sorted)."""
    digest = hashlib.sha256(b"".join(i.to_bytes(8, "little") for i in sorted(ids)))
    return digest.hexdigest()[:16]


@dataclass
class Marks:
    """What the files already at a pair's paths hold: pair stamps and param_ids."""

    stamps: set[str] = field(default_factory=set)
    ids: set[int] = field(default_factory=set)


def marks_at(paths: Sequence[str | os.PathLike[str]]) -> Marks:
    """The stamps and param_ids of the burnpack files at `paths` (headers only, within the default
    limits); a missing, unreadable or other file adds nothing."""
    from ..core.bytesource import FileSource
    from ..core.errors import MigratorError
    from ..formats.burnpack import BurnpackReader

    out = Marks()
    for path in paths:
        if not os.path.isfile(path):
            continue
        try:
            source = FileSource(path)
        except MigratorError:
            continue
        try:
            reader = BurnpackReader(source)
            out.ids.update(t.param_id for t in reader.tensors if t.param_id is not None)
            stamp = reader.metadata.get(PAIR_KEY)
            if isinstance(stamp, str):
                out.stamps.add(stamp)
        except MigratorError:
            pass
        finally:
            source.close()
    return out


class GenerationError(Exception):
    """No generation gives ids apart from those at the target."""


def choose_generation(ids_of: Callable[[int], list[int]], taken: Marks) -> int:
    """The first generation whose ids and stamp the files at the pair's paths do not hold."""
    for generation in range(MAX_GENERATIONS):
        ids = ids_of(generation)
        if stamp_of(ids) not in taken.stamps and not taken.ids.intersection(ids):
            return generation
    raise GenerationError(f"the files at the target hold the ids of {MAX_GENERATIONS} generations of this "
                          "checkpoint's pair; move them away")


def relative(path: str | os.PathLike[str], start: str | os.PathLike[str]) -> str:
    """`path` as the file at `start` names it: relative to that file's folder, '/'-separated."""
    rel = os.path.relpath(os.path.abspath(path), os.path.dirname(os.path.abspath(start)))
    return rel.replace(os.sep, "/")


def check_pair(path: str | os.PathLike[str], metadata: dict[str, str]) -> dict[str, str] | None:
    """What `inspect` says of a file of a pair (None: it is none): {"stamp", "other" (the file it names),
    "status": "paired" | "missing" | "unpaired", "message"}: whether that file is there with the same stamp."""
    stamp = metadata.get(PAIR_KEY)
    if not isinstance(stamp, str):
        return None
    other_key, role = (RECORD_KEY, "optimizer record") if RECORD_KEY in metadata else (MODEL_KEY, "model")
    other = metadata.get(other_key)
    if not isinstance(other, str):
        return {"stamp": stamp, "other": "", "status": "missing", "message": f"pair {stamp}: names no {role}"}
    where = Path(os.path.dirname(os.path.abspath(path))) / other
    if not where.is_file():
        return {"stamp": stamp, "other": other, "status": "missing",
                "message": f"pair {stamp}: its {role} {other} is missing"}
    found = marks_at([where])
    if stamp in found.stamps:
        return {"stamp": stamp, "other": other, "status": "paired",
                "message": f"pair {stamp}: its {role} {other} carries the same stamp"}
    theirs = ", ".join(sorted(found.stamps)) or "none"
    return {"stamp": stamp, "other": other, "status": "unpaired",
            "message": f"pair {stamp}: its {role} {other} is not its pair (stamp {theirs}): the two were not written "
                       "together (a run killed between its two renames, or one of them replaced since)"}


@dataclass
class Pair:
    """The record planned with its model: where each goes and the metadata each file adds."""

    record_file: str
    model_meta: dict[str, str]
    record_meta: dict[str, str]


def paired_record(training: Training, entries: Sequence[PlanEntry], reader: Any, fatal: list[str],
                  model_file: str, record_file: str) -> tuple[list[PlanEntry], BurnRecord | None, Pair | None]:
    """`burn_optimizer.burn_record` of the generation the files at `model_file` and `record_file` do not
    hold (`choose_generation`), and the pair's metadata when there is a record."""
    from .burn_optimizer import burn_record, derived_ids

    generation = 0
    if training.mode == "keep" and training.optimizers:
        names = [e.target for e in entries if e.optimizer is None]
        try:
            generation = choose_generation(lambda g: derived_ids(reader, names, training, g),
                                           marks_at([model_file, record_file]))
        except GenerationError as e:
            fatal.append(f"training_state: keep into burnpack: {record_file}: {e}")
            return list(entries), None, None
    model, record = burn_record(training, entries, reader, fatal, generation)
    if record is None:
        return model, None, None
    stamp = stamp_of(e.tensor.param_id for e in model if e.tensor.param_id is not None)
    return model, record, Pair(record_file, {PAIR_KEY: stamp, RECORD_KEY: relative(record_file, model_file)},
                               {PAIR_KEY: stamp, MODEL_KEY: relative(model_file, record_file)})
