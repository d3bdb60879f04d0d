"""What an op is, and the registry of them.

An op is a subclass of `Op` given its name (`class Split(Op, name="split")`): defining it registers it
in `OPS`, makes its `ops:` entry's model (`{name: options}`) from its `options` model, and tells every
model holding the entries (the recipe's `ops:`) to take it in. The op says everything the rest of
migrator asks about it:

- `options`: the pydantic model of its entry (what a recipe checks without the source's shapes);
- `build`: its shape rule and the lazy tensors it makes (nothing is read);
- `joins`: whether `from` names several inputs (a list, or one regex with `over`);
- `computes`: whether its outputs are new values (a training checkpoint's optimizer state is dropped);
- `keeps_layout`: whether each output holds its input's numbers in the input's layout, so optimizer
  state not shaped like its parameter (Adafactor's factored moments) still fits it;
- `new_rows`: whether its outputs hold rows its inputs do not (added rows): a training checkpoint's moments
  go through it with `Step.for_state` set, and it gives their new rows zeros (the new rows have no
  history); the plan names them;
- `reads_head_dim`: whether `build` checks the head size the model's config declares (`Step.head_dim`);
- `summary` and `example`: its line in the schema and its section of docs/ops.md.

The graph engine (`transform/ops.py`) matches names, groups them into nodes, and refuses
collisions; each node is handed to `build` with a `Step`, which places a problem at the op's
recipe line. Also here: what the options share (the `from`/`to` checks, `$i`, numbers that may be
`${config...}` references, a computed tensor's dtype).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Protocol

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from .checks import check_regex, recipe_value_error

if TYPE_CHECKING:
    from ..core.tensor import LazyTensor
    from ..naming import RemapRule

# -- names: `$i`, templates ---------------------------------------------------------------------------------

_INDEX_REF = re.compile(r"\$\$|\$\{i\}|\$i(?![A-Za-z0-9_])")


def substitute_index(text: str, index: int | None) -> str:
    """`text` with every `$i` / `${i}` replaced by `index` (`$$` is left for the remap syntax)."""
    if index is None:
        return text
    return _INDEX_REF.sub(lambda m: m.group(0) if m.group(0) == "$$" else str(index), text)


def has_index_ref(text: str) -> bool:
    return any(m.group(0) != "$$" for m in _INDEX_REF.finditer(text))


def problem(message: str, *, key: str | None = None, hint: str | None = None) -> Exception:
    """A validator's complaint, placed by the recipe loader at the key it is about."""
    return recipe_value_error(message, key=key, hint=hint)


def whole_name_pattern(pattern: str) -> str:
    """`pattern` anchored to the whole name (same groups, same numbering)."""
    return f"^(?:{pattern})$"


def check_template(pattern: str, template: str, key: str, *, index_ok: bool) -> None:
    """`template` may refer only to groups `pattern` has (and to `$i` where `index_ok`)."""
    from ..naming import NamingError, RemapRule

    if has_index_ref(template) and not index_ok:
        raise problem(f"'{template}' uses $i, but this op has no part index", key=key,
                      hint="$i is the part number of split and unstack outputs")
    try:
        rule = RemapRule(whole_name_pattern(pattern), substitute_index(template, 0))
    except NamingError as e:
        raise problem(e.message, key=key) from None
    found = rule.missing_group_problem()
    if found is not None:
        raise problem(found[0], key=key, hint=found[1])


# -- numbers ------------------------------------------------------------------------------------------------

def _no_bool(value: object) -> object:
    if isinstance(value, bool):
        raise problem(f"expected a number, got {str(value).lower()}")
    return value


def _no_bools(value: object) -> object:
    if isinstance(value, list):
        for v in value:
            _no_bool(v)
    return value


def _no_bool_float(value: object) -> object:
    if isinstance(value, bool) or (isinstance(value, list) and any(isinstance(v, bool) for v in value)):
        raise problem("expected a number, got a boolean")
    return value


F32_MAX = 3.4028234663852886e38
"""The largest float32: merges compute in F32 (F64 only when an input is F64), so a parameter beyond
it would be inf there, and every output value inf or NaN."""


def _finite(value: float) -> float:
    if not math.isfinite(value) or abs(value) > F32_MAX:
        raise problem(f"expected a finite number (at most {F32_MAX:.4g} in magnitude), got {value!r}: it would "
                      "make every merged value inf or NaN")
    return value


def _all_finite(values: list[float]) -> list[float]:
    for v in values:
        _finite(v)
    return values


Pattern = Annotated[str, AfterValidator(check_regex)]
Int = Annotated[int, BeforeValidator(_no_bool), WithJsonSchema({"anyOf": [
    {"type": "integer"},
    {"type": "string", "pattern": r"^\$\{.*\}$", "description": "A value from the model's config, resolved when "
     "the recipe is loaded: ${config.KEY}, with fallbacks after '|' (${config.num_key_value_heads | "
     "config.num_attention_heads}) and * or // between terms."}]})]
Ints = Annotated[list[int], BeforeValidator(_no_bools)]
Number = Annotated[float, BeforeValidator(_no_bool_float), AfterValidator(_finite)]
Numbers = Annotated[list[float], BeforeValidator(_no_bool_float), AfterValidator(_all_finite)]


def float_dtype(value: str | None) -> str | None:
    """A computed tensor's dtype: F64, F32, F16 or BF16 (any spelling a cast takes)."""
    if value is None:
        return value
    from ..core.dtypes import parse
    from ..core.errors import UnsupportedDTypeError

    use = "use one of F64, F32, F16, BF16"
    try:
        dtype = parse(value)
    except UnsupportedDTypeError:
        raise problem(f"unknown dtype '{value}'", key="dtype", hint=use) from None
    if dtype.name not in ("F64", "F32", "F16", "BF16"):
        raise problem(f"a computed tensor's dtype is a float dtype, got {value}", key="dtype", hint=use)
    return value


ComputedDType = Annotated[str | None, WithJsonSchema({"anyOf": [{"enum": ["F64", "F32", "F16", "BF16"]},
                                                                 {"type": "null"}]})]
"""A computed tensor's dtype (other spellings such as 'bf16' are taken too, as a cast's)."""


# -- options ------------------------------------------------------------------------------------------------

class Options(BaseModel):
    """What every op's options have: `optional`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)

    optional: bool = Field(False, description="A `from` pattern matching no tensor is not an error.")


class UnaryOptions(Options):
    """An op of one input per match, keeping its name unless `to` gives one."""

    from_: Pattern = Field(alias="from", description="Regex matching whole tensor names (after remap and filter); "
                           "every match is one input.")
    to: str | None = Field(None, description="Output name, with $1 / ${name} from `from`'s groups; default: the "
                           "input's name.")

    @model_validator(mode="after")
    def _to_groups(self) -> Any:
        if self.to is not None:
            check_template(self.from_, self.to, "to", index_ok=False)
        return self


# -- what `build` is given ----------------------------------------------------------------------------------

class Failed(Exception):
    """An op's node failed; its problem is in `Step.issues`."""


class Input(Protocol):
    """One input of a node: its name as the recipe sees it (after remap, filter and earlier ops)."""

    @property
    def name(self) -> str: ...

    @property
    def tensor(self) -> LazyTensor: ...


Made = tuple["LazyTensor", str]
"""An output of a node: the lazy tensor (named) and what the plan's ops column says of it."""

Issue = tuple[str, int, int, str, str, "str | None"]
"""(recipe file, line, column, 'ops[N].KIND.KEY', message, hint): a `RecipeIssue`'s fields."""

Origins = Mapping[tuple[int, str], tuple[str, int, int]]
"""(op index, key or '') -> (recipe file, line, column), from the loader."""

HeadDim = tuple[int, str, str]
"""The head size the model's config declares, how (`recipe.config.head_dim_of`), and the config's path."""


class Step:
    """One `ops:` entry being applied: its op and options, where it is written, and the problems found."""

    def __init__(self, index: int, entry: Any, origins: Origins | None, recipe_file: str,
                 head_dim: HeadDim | None = None, for_state: bool = False) -> None:
        from ..naming import compile_regex

        self.index = index
        self.for_state = for_state  # the node is built for an optimizer's moments in their parameters' places
        self.head_dim = head_dim
        self.op, self.spec = entry_op(entry)
        self.kind = self.op.name
        self.origins = origins or {}
        self.file = recipe_file
        self.issues: list[Issue] = []
        self.pattern = self.spec.from_ if isinstance(self.spec.from_, str) else self.spec.from_[0]
        self.regex = compile_regex(whole_name_pattern(self.pattern))
        self._rules: dict[str, RemapRule] = {}

    def where(self, key: str = "") -> tuple[str, int, int]:
        return self.origins.get((self.index, key)) or self.origins.get((self.index, "")) or (self.file, 0, 0)

    def at(self) -> str:
        f, line, col = self.where()
        return f"{f}:{line}:{col}" if line else f

    def fail(self, message: str, key: str = "", hint: str | None = None) -> None:
        f, line, col = self.where(key)
        loc = f"ops[{self.index}].{self.kind}" + (f".{key}" if key else "")
        self.issues.append((f, line, col, loc, message, hint))

    def expand(self, template: str, name: str, index: int | None = None) -> str:
        """An output name: `template` with `$i` and the groups of `from`'s match of `name`."""
        from ..naming import RemapRule

        text = substitute_index(template, index)
        rule = self._rules.get(text)
        if rule is None:
            rule = self._rules[text] = RemapRule(whole_name_pattern(self.pattern), text)
        return rule.apply(name)

    def output_name(self, name: str) -> str:
        """A one-input op's output name: `to` expanded, else the input's."""
        return self.expand(self.spec.to, name) if self.spec.to else name

    def dim(self, d: int, rank: int, name: str, shape: tuple[int, ...], key: str = "dim", extra: int = 0) -> int:
        n = rank + extra
        if not -n <= d < n:
            self.fail(f"dim {d} does not exist in '{name}' (shape {list(shape)}, rank {rank})", key)
            raise Failed
        return d % n if n else 0

    def byte_sized(self, s: Input) -> None:
        """Refuse an input whose elements are not whole bytes: only a reshape can move those."""
        if s.tensor.dtype.itemsize is None:
            self.fail(f"'{s.name}' is {s.tensor.dtype.display}: its elements are not whole bytes, so {self.kind} "
                      "cannot move them", "from")
            raise Failed


# -- the registry -------------------------------------------------------------------------------------------

OPS: dict[str, Op] = {}
"""Every op by name, in the order they were defined (the schema's and the docs' order)."""
_watchers: list[Callable[[], None]] = []


def on_new_op(watcher: Callable[[], None]) -> None:
    """Call `watcher` whenever an op is registered (a model holding `ops:` entries rebuilds itself)."""
    _watchers.append(watcher)


class Op:
    """A recipe op. Subclass it with `name=` to register one (see the module's docstring)."""

    name: ClassVar[str]
    options: ClassVar[type[Options]]
    summary: ClassVar[str]
    example: ClassVar[str]
    joins: ClassVar[bool] = False
    computes: ClassVar[bool] = False
    keeps_layout: ClassVar[bool] = False
    new_rows: ClassVar[bool] = False
    reads_head_dim: ClassVar[bool] = False
    entry: ClassVar[type[BaseModel]]
    """The `ops:` entry's model, `{name: options}` (made when the op is registered)."""

    def __init_subclass__(cls, *, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if name is None:  # a base shared by several ops
            return
        if name in OPS:
            raise ValueError(f"op '{name}' is registered twice ({type(OPS[name]).__qualname__}, {cls.__qualname__})")
        for needed in ("options", "summary", "example"):
            if not hasattr(cls, needed):
                raise TypeError(f"op '{name}' ({cls.__qualname__}) has no {needed}")
        from pydantic import create_model

        cls.name = name
        cls.entry = create_model(  # type: ignore[call-overload]
            f"{''.join(p.title() for p in name.split('_'))}OpSpec", __config__=Options.model_config,
            **{name: (cls.options, Field(description=cls.summary))})
        OPS[name] = cls()
        for watcher in _watchers:
            watcher()

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        """The node's outputs, checked from shapes and dtypes alone (`step.fail` and raise `Failed` when not)."""
        raise NotImplementedError


def entry_op(entry: Any) -> tuple[Op, Any]:
    """The op of an `ops:` entry, and its options."""
    kind = next(iter(type(entry).model_fields))
    return OPS[kind], getattr(entry, kind)


def op_kind_and_spec(entry: Any) -> tuple[str, Any]:
    """('split', SplitSpec(...)) for an entry."""
    kind = next(iter(type(entry).model_fields))
    return kind, getattr(entry, kind)
