"""`migrate run` of many jobs: several recipes, or one recipe over `--each` sources, in parallel.

Every job is a whole `migrate run` of one recipe (plan, stream, atomic publish, report) in a worker
process of its own (`--jobs N` at once, default: the CPUs this process may use; `--jobs 1`: one after
the other, still each in its own process, so a job killed by the out-of-memory killer takes no other
job with it) or in a Ray task (`--executor ray`). A job's failure does not stop the others; the exit code is
the worst. Before any job runs, the jobs are checked against each other: two jobs writing one target,
or a job writing a file another job reads, are a usage error (exit 2) and nothing runs.

Each job is `recipe.run_recipe`, whose outcome (a value: nothing is printed in a worker) is sent back
whole (`JobResult`); `migrate run` prints each one, with a heading line, as its job ends
(`cli/recipe.py`; no progress bars in parallel), and `--json` and `--report` give one document with
every job (`jobs_document`, `jobs_report`).

One job can also be written by several workers (`--workers W`, or `--jobs W` with one job):
`recipe.runner_for` picks the runner of `migrator.run.parallel_write` (threads here, or Ray tasks).
"""

from __future__ import annotations

import glob as globlib
import os
import re
import string
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from ..core.cpus import available_cpus as available_cpus  # --jobs' default (`cli/recipe.py`)
from ..core.errors import EXIT_MIGRATION, EXIT_OK, MigratorError
from ..storage.paths import where
from ..storage.remote import is_url

if TYPE_CHECKING:
    from ..plan.outputs import Output
    from .recipe import RunOptions, RunOutcome

PLACEHOLDERS = {
    "stem": "the source's file (or folder) name without its last extension: runs/a/last.pt -> last",
    "name": "the source's file name: last.pt",
    "parent": "the name of the folder holding the source: a",
    "i": "the source's position among the matches (sorted, from 0; {i:03d} pads it)",
}
_GLOB_CHARS = set("*?[")


def is_many(recipes: Sequence[str], each: Sequence[str] = ()) -> bool:
    """Whether `migrate run` was given several jobs: several recipes, or one over `--each` sources."""
    return len(recipes) > 1 or bool(each)


def describe_job(spec: dict[str, Any]) -> str:
    source = spec["given"].get("source")
    return spec["label"] + (f" ({source})" if source else "")


class JobsUsageError(MigratorError):
    """The jobs cannot all run as given (a glob matching nothing, two jobs writing one target...)."""


def _glob(pattern: str) -> list[str]:
    """A glob's matches, sorted: local files, or objects of a store through fsspec's glob (the store's
    listing; `**` recursive), as URLs."""
    if not is_url(pattern):
        return sorted(globlib.glob(os.path.expanduser(pattern), recursive=True))
    from ..storage.remote import protocol, url_of
    from ..storage.remote.fs import deadline, describe, filesystem, tuning

    url = url_of(pattern)
    fs, path = filesystem(url)
    try:
        found = fs.glob(path, **deadline(fs, tuning(url)))
    except FileNotFoundError:
        return []
    except Exception as e:
        raise JobsUsageError(f"--each '{pattern}': cannot list the store: {describe(e)}") from None
    proto = protocol(url)
    return sorted(f"{proto}://{p.lstrip('/')}" for p in found)


def _glob_part(pattern: str) -> str:
    """What of `pattern` may hold glob characters: over http(s) a '?' starts the query (a presigned
    URL, a SAS token), which is part of the address, not a wildcard."""
    if is_url(pattern) and pattern.split(":", 1)[0].lower() in ("http", "https"):
        return pattern.split("?", 1)[0]
    return pattern


def expand_each(patterns: list[str]) -> list[str]:
    """The sources of `--each`: each pattern's matches (a glob, sorted; `**` recursive; on a store,
    its objects through fsspec) or the path as given, in order, each once."""
    out: list[str] = []
    for pattern in patterns:
        if _GLOB_CHARS & set(_glob_part(pattern)):
            matches = _glob(pattern)
            if not matches:
                raise JobsUsageError(f"--each '{pattern}' matches no file")
        else:
            matches = [pattern]
        out += [m for m in matches if m not in out]
    return out


MAX_FORMAT_WIDTH = 255
"""The widest a placeholder's format spec may pad (`{i:04}`): a path part is at most 255 bytes."""


def _check_format_spec(pattern: str, field: str, spec: str) -> None:
    """A placeholder's format spec is the user's, never a source's: no nested placeholder (`{i:{stem}}`
    would let a file name choose the padding: 900 MB of it), and no width beyond MAX_FORMAT_WIDTH."""
    if "{" in spec or "}" in spec:
        raise JobsUsageError(f"--target '{pattern}': {{{field}:{spec}}} nests a placeholder in a format spec; "
                             "a format spec is literal, e.g. {i:04}")
    for digits in re.findall(r"\d+", spec):
        if len(digits) > 3 or int(digits) > MAX_FORMAT_WIDTH:
            raise JobsUsageError(f"--target '{pattern}': {{{field}:{spec}}} pads beyond {MAX_FORMAT_WIDTH} "
                                 "characters")


def target_for(pattern: str, source: str, i: int) -> str:
    """`--target` with its placeholders ({stem}, {name}, {parent}, {i}) filled in for one source; a
    match whose values would make a path part `..`, `.` or empty is refused, naming it."""
    fields = []
    try:
        for _, field, spec, conversion in string.Formatter().parse(pattern):
            if field is None:
                continue
            if field not in PLACEHOLDERS or conversion:
                raise JobsUsageError(f"--target '{pattern}': unknown placeholder {{{field}}}; use "
                                     + ", ".join(f"{{{k}}}" for k in PLACEHOLDERS) + " ({{ and }} for braces)")
            _check_format_spec(pattern, field, spec or "")
            fields.append(field)
    except ValueError as e:
        raise JobsUsageError(f"--target '{pattern}': {e} ({{{{ and }}}} for literal braces)") from None
    if is_url(source):  # from the URL's path: s3://bucket/runs/a/last.pt has parent a (bucket at the top)
        from pathlib import PurePosixPath

        from ..storage.remote import url_of

        u: PurePath = PurePosixPath("/" + url_of(source).split("://", 1)[1].split("?", 1)[0].rstrip("/"))
        parent = u.parent.name
    else:
        p = Path(source.rstrip("/" + os.sep) or source)
        u, parent = PurePath(p), p.absolute().parent.name
    values: dict[str, Any] = {"stem": u.stem, "name": u.name, "parent": parent, "i": i}
    try:
        filled = pattern.format(**values)
    except (ValueError, TypeError) as e:
        raise JobsUsageError(f"--target '{pattern}': {e}") from None
    problem = _placed_part_problem(pattern, filled)
    if problem is not None:
        from ..storage.remote import redact

        raise JobsUsageError(f"--each match {redact(source)}: {problem} in the target {redact(filled)}, which would "
                             "write outside the target folder; rename it, or give --each a glob that leaves it out")
    return filled


def _placed_part_problem(pattern: str, filled: str) -> str | None:
    """Why the target `filled` from `pattern` may not be written (None: it may): a placeholder (of
    any scheme's match: fsspec's globs match dot names such as `in/..`) made a path part `..`, `.` or
    empty, or a `/`. Parts as the pattern spells them are the user's own (`../out/{stem}.bpk`)."""
    want, got = pattern.split("/"), filled.split("/")
    if len(want) != len(got):
        return "a placeholder made a '/'"
    for typed, part in zip(want, got, strict=True):
        if typed != part and part in ("", ".", ".."):
            return f"a placeholder made the path part '{part}'" if part else "a placeholder made an empty path part"
    return None


def job_specs(recipes: Sequence[str], options: RunOptions, each: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One spec per job: the recipe, its `--source`/`--target` overrides (absolute, so any worker
    can use them; `given` keeps them as typed, for the report) and the options every job shares
    (`options`: the command line's, `--source`/`--target` being each job's own)."""
    shared = replace(options, source=None, target=None, report=None, one_of_many=True)
    if each:
        if len(recipes) != 1:
            raise JobsUsageError("--each runs one recipe over many sources: give one recipe")
        if options.source:
            raise JobsUsageError("--each gives the sources: --source cannot be used with it")
        if not options.target:
            raise JobsUsageError("--each needs --target with placeholders, e.g. --target 'out/{stem}.bpk' "
                                 "(" + ", ".join(f"{{{k}}}" for k in PLACEHOLDERS) + ")")
        sources = expand_each(list(each))
        target = options.target
        pairs = [(recipes[0], {"source": s, "target": target_for(target, s, i)}) for i, s in enumerate(sources)]
    else:
        given = {k: v for k, v in (("source", options.source), ("target", options.target)) if v}
        pairs = [(r, dict(given)) for r in recipes]
    specs = []
    for recipe, given in pairs:
        paths = {k: where(v) for k, v in given.items()}
        specs.append({"recipe": os.path.abspath(recipe), "label": recipe, "given": given, **paths,
                      "options": replace(shared, source=paths.get("source"), target=paths.get("target"))})
    return specs


def _planned(spec: dict[str, Any]) -> tuple[list[Output], list[str]] | None:
    """(outputs, reads) of a job as its run will resolve them, from the recipe alone (no file is
    opened): every file it may write (`plan.outputs.recipe_outputs`: the model, Burn's optimizer
    record, ...) and every file it reads (sources, template, config, tokenizer, the folder companions
    are copied from); None when the recipe does not load (the job then fails on its own)."""
    from ..plan.outputs import recipe_outputs
    from ..recipe.loader import RecipeError, load_recipe

    try:  # without the overrides: the check of an override target onto its own source is the job's
        loaded = load_recipe(spec["recipe"])
    except (RecipeError, MigratorError):
        return None
    recipe = loaded.recipe

    def resolve(p: Any) -> str:  # a URL as written, a local path from the recipe's folder
        return str(p) if is_url(p) else str(loaded.resolve(p))

    options = spec.get("options")
    outputs = recipe_outputs(recipe, resolve, target=spec.get("target"),
                             training_state=getattr(options, "training_state", None))
    sources = [spec["source"]] if spec.get("source") else [resolve(s.path) for s in recipe.inputs()]
    also = [recipe.target.template, recipe.config, recipe.target.tokenizer, recipe.target.copy_from]
    sources += [resolve(p) for p in also if p]
    return ([replace(o, path=where(o.path, real=True)) for o in outputs],
            [where(s, real=True) for s in sources])


def check_jobs(specs: list[dict[str, Any]], report: str | None) -> None:
    """Refuse, before anything runs, jobs that would write one file twice, or write onto or into what
    another job reads (its recipe, sources, template...) or writes, and a `--report` that is one of
    those files or inside a target folder. A job's outputs are every file it may write (its target,
    Burn's optimizer record beside a .bpk: `plan.outputs`), each checked as the target is. Paths are
    compared by containment (`_ancestors`: a folder target holds everything under it, a folder source
    its shards), local ones with links resolved, and by inode (`_check_identities`: a hard link, a
    bind mount)."""
    written: dict[str, tuple[int, str, Output]] = {}  # output path -> (the job writing it, its name, the output)
    reads: dict[str, list[tuple[int, str]]] = {}  # path read -> the jobs reading it
    jobs: list[tuple[str, list[Output], list[str]]] = []
    for i, spec in enumerate(specs):  # a job is its position: one recipe may be given twice
        what = describe_job(spec)
        planned = _planned(spec)
        outputs, sources = planned if planned is not None else ([], [])
        read = [*sources, where(spec["recipe"], real=True)]
        for out in outputs:
            prior = written.get(out.path)
            if prior is not None and prior[0] == i:
                raise JobsUsageError(f"{what}: {prior[2].describe()} and {out.describe()} are one file")
            if prior is not None:
                raise JobsUsageError(f"two jobs write {out.path}: {prior[1]} ({prior[2].role}) and {what} "
                                     f"({out.role}); give each job its own target (--target 'out/{{stem}}.bpk') "
                                     "and optimizer record")
            written[out.path] = (i, what, out)
        for r in read:
            reads.setdefault(r, []).append((i, what))
        jobs.append((what, outputs, read))
    for i, (what, outputs, read) in enumerate(jobs):
        mine = {o.path for o in outputs}
        for path in (*read, *mine):  # under another job's output folder (or that output)
            for folder in _ancestors(path):
                hit = written.get(folder)
                if hit is not None and hit[0] != i:
                    verb = "writes" if path in mine else "reads"
                    raise JobsUsageError(f"{hit[1]} writes {folder}, which holds {path} that {what} {verb}")
        for out in outputs:  # onto or inside a file or folder another job reads
            for folder in _ancestors(out.path):
                owner = next((o for o in reads.get(folder, ()) if o[0] != i), None)
                if owner is not None:
                    raise JobsUsageError(f"{what} writes {out.path} ({out.role}), which {owner[1]} reads")
    _check_identities(jobs)
    if report:
        rep = where(report, real=True)
        for folder in _ancestors(rep):
            if folder in written or folder in reads:
                raise JobsUsageError(f"--report {report} is, or is inside, a file the jobs read or write ({folder})")
        ident = _identity(rep)
        if ident is not None and ident in _identities([*reads, *written], False):
            raise JobsUsageError(f"--report {report} is a file the jobs read or write (the same file by inode)")


def _ancestors(path: str) -> list[str]:
    """`path` and every folder above it (a URL's up to its bucket), as `where` spells them."""
    out = [path.rstrip("/") or path]
    if is_url(path):
        scheme, rest = path.split("://", 1)
        parts = rest.rstrip("/").split("/")
        out += [f"{scheme}://" + "/".join(parts[:n]) for n in range(len(parts) - 1, 0, -1)]
        return out
    parent = os.path.dirname(out[0])
    while parent and parent != out[-1]:
        out.append(parent)
        parent = os.path.dirname(parent)
    return out


def _identity(path: str) -> tuple[int, int] | None:
    if is_url(path):
        return None
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


MAX_WALKED = 100_000
"""Entries of existing target folders compared by inode with what the other jobs read."""


def _identities(paths: list[str], walk: bool) -> set[tuple[int, int]]:
    """(device, inode) of each existing local path, and of what a folder holds (its top level; with
    `walk`, all of it, up to MAX_WALKED entries)."""
    out: set[tuple[int, int]] = set()
    seen = 0
    for path in paths:
        ident = _identity(path)
        if ident is None:
            continue
        out.add(ident)
        if not os.path.isdir(path):
            continue
        for folder, dirs, files in os.walk(path):
            if not walk:
                dirs.clear()
            for name in files + dirs:
                seen += 1
                if seen > MAX_WALKED:
                    return out
                entry = _identity(os.path.join(folder, name))
                if entry is not None:
                    out.add(entry)
    return out


def _check_identities(jobs: list[tuple[str, list[Output], list[str]]]) -> None:
    """No job's output is, or (a folder) holds, by inode, a file another job reads or writes."""
    if len(jobs) < 2:
        return
    read_by: dict[tuple[int, int], list[tuple[int, str]]] = {}
    for i, (what, _, read) in enumerate(jobs):
        for ident in _identities(read, False):
            read_by.setdefault(ident, []).append((i, what))
    written_by: dict[tuple[int, int], tuple[int, str, str]] = {}
    for i, (what, outputs, _) in enumerate(jobs):
        for out in outputs:
            for ident in _identities([out.path], True):
                owner = next((o for o in read_by.get(ident, ()) if o[0] != i), None)
                if owner is not None:
                    raise JobsUsageError(f"{what} writes {out.path} ({out.role}), which is or holds a file "
                                         f"{owner[1]} reads (the same file by inode: a hard link or a bind mount)")
                other = written_by.setdefault(ident, (i, what, out.path))
                if other[0] != i:
                    raise JobsUsageError(f"{what} writes {out.path} ({out.role}), which is or holds the file "
                                         f"{other[2]} that {other[1]} writes (the same file by inode: a hard link "
                                         "or a bind mount)")


@dataclass(frozen=True)
class JobResult:
    """One job's end: its run's outcome (`recipe.RunOutcome`, sent back whole from a worker), or, for
    a job that did not finish, `lost`: its error (kind "WorkerError": its worker died; "InternalError":
    a bug in migrator, which must not take the other jobs down)."""

    index: int
    outcome: RunOutcome | None = None
    lost: dict[str, Any] | None = None

    @property
    def code(self) -> int:
        return self.outcome.code if self.outcome is not None else EXIT_MIGRATION

    @property
    def document(self) -> dict[str, Any]:
        return self.outcome.document if self.outcome is not None else {"error": self.lost}

    @property
    def report(self) -> dict[str, Any]:
        from .recipe import report_of

        return self.outcome.report if self.outcome is not None else report_of(EXIT_MIGRATION, self.lost or {})


def run_job(spec: dict[str, Any], progress: bool | None = False) -> JobResult:
    """One job (a whole run of one recipe: `recipe.run_recipe`) in this process. Never raises for a
    failed job: its outcome says how it failed."""
    from .recipe import run_recipe

    try:
        return JobResult(spec.get("index", 0), run_recipe(spec["recipe"], replace(spec["options"], progress=progress)))
    except Exception as e:  # a bug in one job must not take the others down
        return JobResult(spec.get("index", 0), lost={"kind": "InternalError", "message": f"{type(e).__name__}: {e}",
                                                     "file": spec["recipe"], "tensor": None})


def run_local(specs: list[dict[str, Any]], jobs: int, *, progress: bool | None = False,
              started: Callable[[dict[str, Any]], None] | None = None) -> Iterator[JobResult]:
    """Each job's result as it ends: every job in a worker process of its own (forked: the parent's
    imports are reused), at most `jobs` at once, `--jobs 1` included. A worker that dies without a
    result (SIGKILL from the out-of-memory killer, a crash) fails its own job only: it is reported,
    its scratch files are removed (`_clean_scratch`), and the other jobs, running or queued, go on.
    (A process pool would break as a whole when one worker dies, failing every other job; so would
    jobs run in this process, one after the other, which is what `--jobs 1`, and the default on a
    machine that gives this process one CPU, did.) `progress`: the workers' progress bars (None: on a
    terminal; for one job at a time); `started(spec)`: called as each job's worker starts."""
    import multiprocessing
    from multiprocessing.connection import Connection, wait

    # fork is safe here: this process has loaded recipes but started no thread (no plan, no cast pool)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    queued = list(specs)
    running: dict[Connection, tuple[Any, dict[str, Any]]] = {}
    try:
        while queued or running:
            while queued and len(running) < jobs:
                spec = queued.pop(0)
                receive, send = context.Pipe(duplex=False)
                # not daemonic, as a process pool's workers: a job may start processes of its own
                if started is not None:
                    started(spec)
                worker = context.Process(target=_job_process, args=(spec, send, progress))  # type: ignore[attr-defined]
                worker.start()
                send.close()  # the worker holds the only write end: its death is end-of-file here
                running[receive] = (worker, spec)
            for conn in wait(list(running)):
                assert isinstance(conn, Connection)
                worker, spec = running.pop(conn)
                try:
                    result: JobResult | None = conn.recv()
                except (EOFError, OSError):
                    result = None
                conn.close()
                worker.join()
                if result is None:
                    _clean_scratch(spec)
                    result = died(spec, _death(worker.exitcode))
                yield result
    finally:
        for conn, (worker, spec) in running.items():  # interrupted: stop the jobs still running
            worker.kill()
            worker.join()
            conn.close()
            _clean_scratch(spec)


def _job_process(spec: dict[str, Any], conn: Any, progress: bool | None = False) -> None:
    """A worker process: run one job and send its result to the parent."""
    conn.send(run_job(spec, progress))
    conn.close()


def _death(exitcode: int | None) -> str:
    """How a worker ended without sending its job's result."""
    import signal

    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        why = " (the out-of-memory killer sends it when memory runs out)" if name == "SIGKILL" else ""
        return f"its worker process was killed by {name}{why}"
    return f"its worker process exited with code {exitcode} before reporting"


def _clean_scratch(spec: dict[str, Any]) -> None:
    """Remove the scratch files or folders a dead worker left beside its job's outputs (the target, Burn's
    optimizer record; only those of processes that no longer exist: `atomic.clean_stale_scratch`,
    `atomic_folder.clean_stale_folders`)."""
    from ..storage.atomic import clean_stale_scratch
    from ..storage.atomic_folder import clean_stale_folders

    planned = _planned(spec)
    for out in planned[0] if planned is not None else []:  # the model, and Burn's optimizer record
        if is_url(out.path):
            continue
        with suppress(OSError):
            clean_stale_scratch(Path(out.path))
            clean_stale_folders(Path(out.path))


def died(spec: dict[str, Any], why: str) -> JobResult:
    message = f"job {describe_job(spec)} did not finish: {why}"
    return JobResult(spec["index"], lost={"kind": "WorkerError", "message": message, "file": spec["recipe"],
                                          "tensor": None})


def prepare(recipes: Sequence[str], options: RunOptions, each: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The jobs of `migrate run` of several (numbered), checked against each other before any runs
    (a `JobsUsageError` otherwise), and the `--report` they share checked too."""
    specs = job_specs(recipes, options, each)
    for i, spec in enumerate(specs):
        spec["index"] = i
    report = options.report
    check_jobs(specs, report)
    if report and report.lower().endswith((".html", ".htm")):
        raise JobsUsageError("--report of several jobs is one JSON document: give a .json file")
    if report:
        from ..storage.atomic import check_target

        check_target(Path(report), overwrite=bool(options.overwrite))
    return specs


def _job_head(spec: dict[str, Any], result: JobResult) -> dict[str, Any]:
    return {"recipe": spec["label"], **({"overrides": spec["given"]} if spec["given"] else {}),
            "exit_code": result.code}


def jobs_document(specs: list[dict[str, Any]], results: list[JobResult], worst: int) -> dict[str, Any]:
    """`run --json` of several jobs: {"ok", "exit_code", "jobs": [per job: recipe, overrides,
    exit_code and the one-recipe document (report, errors, notes, or error)]}."""
    return {"ok": worst == EXIT_OK, "exit_code": worst,
            "jobs": [{**(h := _job_head(s, r)), **r.document, **h} for s, r in zip(specs, results, strict=True)]}


def jobs_report(specs: list[dict[str, Any]], results: list[JobResult], worst: int) -> dict[str, Any]:
    """`--report` of several jobs: {"status", "exit_code", "jobs": [per job: recipe, overrides,
    exit_code and the one-recipe report (`recipe.RunOutcome.report`: status, target, written...)]}."""
    jobs = []
    for s, r in zip(specs, results, strict=True):
        head = _job_head(s, r)
        jobs.append({**head, **r.report, **head})  # the head first, and its values
    return {"status": "ok" if worst == EXIT_OK else "failed", "exit_code": worst, "jobs": jobs}


def jobs_executor(options: RunOptions, specs: list[dict[str, Any]]) -> tuple[str, str | None]:
    """Where several jobs run: `--executor` when given, else their recipes' common `executor:` (one
    dispatcher runs them all, so recipes that disagree need the flag)."""
    from .recipe import executor_for

    if options.executor:
        return executor_for(options.executor, options.ray_address, None)
    from ..recipe.loader import RecipeError, load_recipe

    seen: dict[tuple[str, str | None], str] = {}
    for spec in specs:
        try:
            recipe = load_recipe(spec["recipe"]).recipe
        except (RecipeError, MigratorError):
            continue  # that job fails on its own
        seen.setdefault(executor_for(options.executor, options.ray_address, recipe), spec["label"])
    if len(seen) > 1:
        (a, first), (b, second) = list(seen.items())[:2]
        raise JobsUsageError(f"the recipes ask for different executors ({first}: {_spell(a)}, {second}: "
                             f"{_spell(b)}): give --executor (and --ray-address) for the run")
    return next(iter(seen), ("local", None))


def _spell(executor: tuple[str, str | None]) -> str:
    name, address = executor
    return name + (f" at {address}" if address else "")


def run_ray_jobs(specs: list[dict[str, Any]], address: str | None) -> Iterator[JobResult]:
    """Each job's result (`run_job`) as its Ray task ends (`--executor ray`)."""
    from .ray_executor import TASK_RETRIES, _cause, ray_module

    ray = ray_module(address)
    remote = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(run_job)
    # no tasks inside tasks
    refs = {remote.remote({**spec, "options": replace(spec["options"], executor="local")}): spec for spec in specs}
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    yield ray.get(ref)
                except Exception as e:
                    _clean_scratch(refs[ref])  # a killed task's scratch, when its worker shared this machine
                    yield died(refs[ref], f"its Ray task failed: {_cause(e)}")
    except BaseException:
        for ref in pending:
            ray.cancel(ref)
        raise
