"""Loading recipe files: YAML -> `Recipe`, with every problem reported as `recipe.yaml:LINE:COL`.

This module is the entry (`load_recipe`, `parse_recipe`, the JSON Schema) and the checks beyond
the model (target is not the source, where `modules:` and `ops:` entries are written). The steps
have their own modules: `yaml_nodes` (bounded SafeLoader parsing, node marks, duplicate keys),
`model_types` (pydantic error paths through the model's types and tagged unions), `placement`
(pydantic errors -> issues on YAML nodes), `wording` (how values and types are described, and the
hints), `issues` (`RecipeIssue`, `RecipeError`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from yaml.nodes import MappingNode

from ..storage.atomic import same_file
from .issues import RecipeError, RecipeIssue
from .model import Recipe
from .placement import _Issue, _Mapper, _sorted_unique
from .yaml_nodes import MAX_NONSTRING_KEYS, MAX_YAML_NODES, _decode, _parse_yaml

__all__ = [
    "MAX_NONSTRING_KEYS",
    "MAX_RECIPE_BYTES",
    "MAX_YAML_NODES",
    "LoadedRecipe",
    "RecipeError",
    "RecipeIssue",
    "load_recipe",
    "parse_recipe",
    "recipe_json_schema",
    "recipe_json_schema_text",
    "reload_for_source",
]

MAX_RECIPE_BYTES = 10 * 1024 * 1024
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_REGENERATE = ".venv/bin/python tools/gen_schema.py"


@dataclass(frozen=True)
class LoadedRecipe:
    """A validated recipe plus what running it needs: where it lives and what it hashed to."""

    recipe: Recipe
    path: Path
    base_dir: Path
    text: str
    sha256: str
    warnings: tuple[RecipeIssue, ...] = field(default=())
    # (type, index) of each `modules:` regex -> 'recipe.yaml:LINE:COL', for errors found when planning
    module_origins: dict[tuple[str, int], str] = field(default_factory=dict)
    # index of each `sources:` entry -> 'recipe.yaml:LINE:COL', for errors naming a source
    source_origins: dict[int, str] = field(default_factory=dict)
    # (op index, key or '') -> (file, line, col) of each `ops:` entry and its keys, for op errors found when planning
    op_origins: dict[tuple[int, str], tuple[str, int, int]] = field(default_factory=dict)

    def resolve(self, path: str | os.PathLike[str]) -> Path:
        """A recipe path made absolute: `~` expanded, relative ones taken from the recipe's folder."""
        p = Path(os.path.expanduser(os.fspath(path)))
        return p if p.is_absolute() else self.base_dir / p

    @property
    def source_path(self) -> Path:
        """The (first) source's path."""
        return self.source_paths[0]

    @property
    def source_paths(self) -> list[Path]:
        """Every source's path: `source`, or each `sources` entry in order."""
        return [self.resolve(s.path) for s in self.recipe.inputs()]

    @property
    def target_path(self) -> Path:
        """As written in the recipe; the burnpack writer may still append `.bpk`."""
        return self.resolve(self.recipe.target.path)

    @property
    def template_path(self) -> Path | None:
        template = self.recipe.target.template
        return None if template is None else self.resolve(template)


def load_recipe(path: str | os.PathLike[str]) -> LoadedRecipe:
    """Read, parse and validate a recipe file; raise `RecipeError` listing every problem found."""
    shown = os.fspath(path)
    from ..core.bytesource import read_regular

    try:
        raw = read_regular(path, MAX_RECIPE_BYTES)  # a FIFO would block, a device never end
    except OSError as e:
        raise RecipeError([RecipeIssue(shown, 0, 0, "", f"cannot read the recipe: {e.strerror or e}")]) from None
    absolute = Path(os.path.abspath(path))
    return _load(raw, shown, absolute, absolute.parent)


def reload_for_source(loaded: LoadedRecipe, source: str | os.PathLike[str], *,
                      config: str | os.PathLike[str] | None = None) -> LoadedRecipe:
    """`loaded` validated again with its `${config...}` values read from the config beside `source`
    (the checkpoint a command line or a job puts in place of the first source), not beside the
    recipe's own example source. A recipe with an explicit `config:` keeps it (relative to the
    recipe), unless `config` (`--config FILE`, absolute) replaces it; a recipe without references is
    returned as it is. The paths themselves are still replaced by the caller (`plan.loaded.with_paths`)."""
    if config is None and ("${" not in loaded.text or loaded.recipe.config is not None):
        return loaded
    if config is not None:
        config = os.path.abspath(os.fspath(config))
    if "${" not in loaded.text:
        again = loaded
    else:
        raw = loaded.text.encode("utf-8", "surrogatepass")
        again = _load(raw, str(loaded.path), loaded.path, loaded.base_dir, config_source=source, config_named=config)
    if config is not None:  # kept on the recipe: the run protects it as one of its inputs
        again = dataclasses.replace(again, recipe=again.recipe.model_copy(update={"config": config}))
    return dataclasses.replace(again, sha256=loaded.sha256, warnings=loaded.warnings)


def parse_recipe(text: str, name: str = "<recipe>", base_dir: Path | None = None) -> LoadedRecipe:
    """Validate an in-memory recipe (`migrate convert --emit-recipe`); paths resolve from `base_dir`."""
    base = Path(os.path.abspath(base_dir if base_dir is not None else os.getcwd()))
    # surrogatepass: a str holding lone surrogates becomes bytes that fail the UTF-8 check with a RecipeError
    return _load(text.encode("utf-8", "surrogatepass"), name, base / name, base)


def recipe_json_schema() -> dict[str, Any]:
    """The JSON Schema of recipe files (validation mode, YAML spellings), for editors and CI."""
    body = Recipe.model_json_schema(by_alias=True, mode="validation")
    body.pop("title", None)
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$comment": f"Generated from migrator/recipe/model.py; regenerate with: {SCHEMA_REGENERATE}",
        "title": "migrator recipe (version 1)",
        **body,
    }


def recipe_json_schema_text() -> str:
    """The checked-in form of `recipe_json_schema()`: stable key order, 2-space indent, newline."""
    return json.dumps(recipe_json_schema(), indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def _load(raw: bytes, shown: str, path: Path, base_dir: Path, *,
          config_source: str | os.PathLike[str] | None = None, config_named: str | None = None) -> LoadedRecipe:
    if len(raw) > MAX_RECIPE_BYTES:
        raise RecipeError([RecipeIssue(shown, 0, 0, "", f"file is larger than {MAX_RECIPE_BYTES // 2**20} MiB",
                                       "a recipe is a few KiB of YAML; is this the right file?")])
    text = _decode(raw, shown)
    root, data, keys, issues = _parse_yaml(text, shown)
    unresolved: set[tuple[int, int]] = set()  # where a ${config...} value failed: validation adds nothing there
    deferred: list[RecipeIssue] = []  # references with no config to read yet: refused when planned
    if "${" in text:
        data = _with_config_values(data, base_dir, _Mapper(shown, root, keys), issues, unresolved, deferred,
                                   config_source, config_named)
    recipe: Recipe | None = None
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as e:
        issues.extend(i for i in _Mapper(shown, root, keys).issues(e) if (i.line, i.col) not in unresolved)
        issues.extend(deferred)
    if recipe is not None:
        recipe.defer_references(deferred)
    loaded = None
    if recipe is not None:
        loaded = LoadedRecipe(recipe, path, base_dir, text, hashlib.sha256(raw).hexdigest())
        issues.extend(_path_issues(loaded, shown, root, keys))
    if issues or loaded is None:
        raise RecipeError(_sorted_unique(issues))
    return dataclasses.replace(loaded, module_origins=_module_origins(loaded.recipe, shown, root, keys),
                               source_origins=_source_origins(loaded.recipe, shown, root, keys),
                               op_origins=_op_origins(loaded.recipe, shown, root, keys))


def _with_config_values(data: Any, base_dir: Path, mapper: _Mapper, issues: list[RecipeIssue],
                        unresolved: set[tuple[int, int]], deferred: list[RecipeIssue],
                        config_source: str | os.PathLike[str] | None = None,
                        config_named: str | None = None) -> Any:
    """`data` with each `${config...}` value replaced by what the model's config declares
    (`config.py`); a value that cannot be resolved becomes an issue at its LINE:COL, one with no
    config to read (none beside a source that may not exist yet) a deferred issue. The config is
    looked for beside `config_source` when given (the checkpoint actually read), else beside the
    recipe's first source; `config_named` (absolute) replaces the recipe's `config:`."""
    from .config import config_folder, find_config, load_config, resolve_references

    def config_for() -> tuple[dict[str, Any] | None, Path | None]:
        named = config_named
        if named is None and isinstance(data, dict) and isinstance(data.get("config"), str):
            named = data["config"]
        beside = config_source if config_source is not None else _first_source_path(data)
        path = find_config(named, beside, base_dir)
        if path is not None:
            return load_config(path), path
        folder = config_folder(beside, base_dir)
        if named is None and folder is not None and beside is not None:
            source = Path(os.path.expanduser(os.fspath(beside)))
            source = source if source.is_absolute() else base_dir / source
            if not source.exists():  # say that, not that no config is beside it
                return None, source
        return None, folder

    def issue(at: tuple[Any, ...], message: str) -> RecipeIssue:
        node, _, _ = mapper._locate(at)
        return mapper._render(_Issue(at, node, message, "a value from the config is written ${config.KEY}, "
                                                        "with fallbacks after '|': ${config.KEY | 8}"))

    def report(at: tuple[Any, ...], message: str) -> None:
        found = issue(at, message)
        unresolved.add((found.line, found.col))
        issues.append(found)

    return resolve_references(data, config_for, report, lambda at, message: deferred.append(issue(at, message)))


def _first_source_path(data: Any) -> str | None:
    """The first source's path as written (`source.path`, or the first `sources:` entry's)."""
    if not isinstance(data, dict):
        return None
    source = data.get("source")
    if source is None and isinstance(data.get("sources"), list) and data["sources"]:
        source = data["sources"][0]
    path = source.get("path") if isinstance(source, dict) else None
    return path if isinstance(path, str) else None


def _path_issues(loaded: LoadedRecipe, shown: str, root: MappingNode, keys: dict[int, Any]) -> list[RecipeIssue]:
    """The output must not be a file the run reads (the run would destroy its own input)."""
    mapper = _Mapper(shown, root, keys)
    target = loaded.target_path
    outputs = written_candidates(target, loaded.recipe.target.format)
    issues: list[RecipeIssue] = []
    if loaded.recipe.sources is None:
        checks = [("source.path", loaded.source_path)]
    else:
        checks = [(f"sources[{i}].path", p) for i, p in enumerate(loaded.source_paths)]
    if loaded.template_path is not None:
        checks.append(("target.template", loaded.template_path))
    for what, read in checks:
        if any(same_file(out, cand) for out in outputs for cand in read_candidates(read)):
            node, _, _ = mapper._locate(("target", "path"))
            issues.append(mapper._render(_Issue(("target", "path"), node,
                                                f"the target is the same file as {what}",
                                                "write the output to a new file")))
    return issues


def written_candidates(path: Path, fmt: str) -> list[Path]:
    """The burnpack writer appends `.bpk` to an extension-less path."""
    out = [path]
    from ..formats.registry import AUTO, extension_less, is_format

    if (fmt == AUTO or is_format(fmt, for_burn=True)) and not os.path.splitext(path.name)[1]:
        out.append(path.with_name(path.name + extension_less().extension))
    return out


def read_candidates(path: Path) -> list[Path]:
    """Burn's reader: an extension-less path that does not exist may mean `path.bpk`."""
    out = [path]
    if not os.path.splitext(path.name)[1]:
        out.append(path.with_name(path.name + ".bpk"))
    return out


def _source_origins(recipe: Recipe, shown: str, root: MappingNode, keys: dict[int, Any]) -> dict[int, str]:
    """Where each `sources:` entry is written, so a name clash between sources can name their lines."""
    mapper = _Mapper(shown, root, keys)
    out: dict[int, str] = {}
    for i in range(len(recipe.sources or [])):
        node, _, found = mapper._locate(("sources", i))
        if found:
            issue = mapper._render(_Issue((), node, ""))
            out[i] = f"{issue.file}:{issue.line}:{issue.col}"
    return out


def _module_origins(recipe: Recipe, shown: str, root: MappingNode, keys: dict[int, Any]) -> dict[tuple[str, int], str]:
    """Where each `modules:` regex is written, so a plan's misfit error can name the recipe line."""
    mapper = _Mapper(shown, root, keys)
    out: dict[tuple[str, int], str] = {}
    for type_name, patterns in recipe.modules.items():
        for i in range(len(patterns)):
            node, _, found = mapper._locate(("modules", type_name, i))
            if found:
                issue = mapper._render(_Issue((), node, ""))
                out[(type_name, i)] = f"{issue.file}:{issue.line}:{issue.col}"
    return out


def _op_origins(recipe: Recipe, shown: str, root: MappingNode, keys: dict[int, Any]
                ) -> dict[tuple[int, str], tuple[str, int, int]]:
    """Where each `ops:` entry (key '') and each of its keys is written: an op's shape errors come from the plan."""
    from .ops import op_kind_and_spec

    mapper = _Mapper(shown, root, keys)
    out: dict[tuple[int, str], tuple[str, int, int]] = {}
    for i, op in enumerate(recipe.ops):
        kind, spec = op_kind_and_spec(op)
        for key in ("", *(f.alias or name for name, f in type(spec).model_fields.items())):
            node, key_node, found = mapper._locate(("ops", i, kind, key) if key else ("ops", i))
            if found:  # at the key: what the message is about (a flow-style value's mark is its ':')
                issue = mapper._render(_Issue((), key_node or node, ""))
                out[(i, key)] = (issue.file, issue.line, issue.col)
    return out


def locate(loaded: LoadedRecipe, data: tuple[Any, ...], shown: str | None = None) -> str | None:
    """'recipe.yaml:LINE:COL' of the value at `data` (e.g. ("source", "top_level_key")), for an error
    found after loading (when planning) that is about one recipe value; None when it is not written.
    `shown`: the recipe's path as the user gave it (default: the loaded path)."""
    shown = shown or str(loaded.path)
    try:
        root, _, keys, _ = _parse_yaml(loaded.text, shown)
    except RecipeError:
        return None
    mapper = _Mapper(shown, root, keys)
    node, _, found = mapper._locate(data)
    if not found:
        return None
    issue = mapper._render(_Issue((), node, ""))
    return f"{issue.file}:{issue.line}:{issue.col}"
