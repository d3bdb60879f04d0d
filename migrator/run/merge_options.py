"""`migrate merge`'s options, declared once.

Each option of a merge is a field of `MergeOptions`, the frozen value the command line builds
(`cli/merge.py` generates its parser from these rows, as convert's come from
`recipe/convert_options.py`) and `run/merge.py` turns into the one-off recipe. A field's metadata is
its row (`Option`): its flag, help text, metavar and how it takes its value; its group says where
it goes in `--help` (`merge`: before `--emit-recipe`, `output`: after it).

Light on purpose (no pydantic, no parser): `migrate --help` builds every parser.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..recipe.convert_options import Option

DEFAULT_SHARD = "5GB"


def _option(default: Any, flag: str, group: str, help: str, **row: Any) -> Any:
    return field(default=default, metadata={"option": Option(flag, group, help, **row)})


@dataclass(frozen=True)
class MergeOptions:
    """A merge's options as a value (what `migrate merge`'s command line says, or the keywords of
    `merge_folder`). The defaults are the command's."""

    seed: int | None = _option(
        None, "--seed", "merge", "the seed of DARE's random drop (needed by dare_ties and dare_linear with density "
        "< 1); the same seed gives the same bytes", kind="integer", metavar="N")
    dtype: str | None = _option(
        None, "--dtype", "merge", "cast the merged weights (F32, F16, BF16, F64); default: the config's out_dtype "
        "or dtype, else the reference model's", metavar="DTYPE")
    max_shard_size: int | str = _option(
        DEFAULT_SHARD, "--max-shard-size", "merge", "the largest shard (5GB = 5*10^9 bytes, 5GiB = 5*2^30, an "
        "integer = bytes; default 5GB)", metavar="SIZE")
    overwrite: bool = _option(False, "--overwrite", "output", "replace an existing OUT (and -o FILE)", kind="switch")
    fsync: bool = _option(
        True, "--no-fsync", "output", "publish without flushing to disk first (faster, like cp): never partial "
        "after a crash of migrator, but a power loss soon after may lose the new file", kind="off")


def table(group: str | None = None) -> tuple[Option, ...]:
    """The rows (of one group), in `--help` order, each knowing its field."""
    rows = (dataclasses.replace(f.metadata["option"], name=f.name) for f in dataclasses.fields(MergeOptions))
    return tuple(r for r in rows if group is None or r.group == group)


DEFAULTS = MergeOptions()
"""The command's defaults (a default argument: one frozen value shared)."""
