"""One job of `migrate run`, as a value every worker can use: the recipe, its overrides (absolute
paths or URLs) and the command-line options it shares with the other jobs; and the job's plan as
`migrate run` builds it, for the workers that re-plan a job (`--executor ray` write tasks).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..plan.build import Plan

# what a job's worker needs of the command line, beside the recipe and its paths
JOB_OPTIONS = ("overwrite", "no_fsync", "hash_sources", "json", "workers", "executor", "ray_address", "reader_limits")


def _is_url(path: object) -> bool:
    from ..storage.remote import is_url

    return is_url(path)


def where(path: str, *, real: bool = False) -> str:
    """A path as every worker can use it: a URL as spelled (scheme normalised), a local path absolute
    (`real`: with links resolved, to compare what jobs read and write)."""
    if _is_url(path):
        from ..storage.remote import url_of

        return url_of(path)
    from ..storage.remote import local_of

    path = os.path.expanduser(os.fspath(local_of(path)))
    return os.path.realpath(path) if real else os.path.abspath(path)


def namespace(spec: dict[str, Any]) -> argparse.Namespace:
    ns = argparse.Namespace(source=spec.get("source"), target=spec.get("target"),
                            **{k: spec.get(k) for k in JOB_OPTIONS}, jobs=None,
                            no_progress=spec.get("no_progress", True), report=None)
    if ns.reader_limits is None:  # the readers' defaults (`--limit` not given)
        del ns.reader_limits
    return ns


@contextmanager
def open_job_plan(spec: dict[str, Any], *, hash_sources: bool | None = None) -> Iterator[Plan]:
    """The plan of one job, as `migrate run` builds it (used by workers that re-plan a job)."""
    from ..plan.loaded import load, open_plan

    ns = namespace(spec)
    if hash_sources is not None:
        ns.hash_sources = hash_sources
    with open_plan(load(spec["recipe"], ns), ns) as plan:
        yield plan


def describe_job(spec: dict[str, Any]) -> str:
    source = spec["given"].get("source")
    return spec["label"] + (f" ({source})" if source else "")


def is_many(args: argparse.Namespace) -> bool:
    return len(args.recipes) > 1 or bool(getattr(args, "each", None))
