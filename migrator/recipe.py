"""The recipe (version 1): what a migration reads, how it renames, filters, adapts and casts, and
what it writes. Pydantic models with `extra="forbid"`; regexes and dtypes are checked here, at
validation, so a bad recipe never fails halfway through a run.

Field names are part of the user-facing contract (recipes are checked in): change them only with
a new `version`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

FormatName = Literal["auto", "burnpack", "safetensors", "pytorch"]
AdapterName = Literal["identity", "pytorch_to_burn", "burn_to_pytorch", "half_precision"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _check_dtype(value: str) -> str:
    from .dtypes import parse

    try:
        parse(value)
    except Exception as e:  # UnsupportedDTypeError; the message lists known dtypes
        raise ValueError(str(e)) from None
    return value


def _check_regex(value: str) -> str:
    from .naming import NamingError, compile_regex

    try:
        compile_regex(value)
    except NamingError as e:
        raise ValueError(f"invalid regex: {e}") from None
    return value


class SourceSpec(_Strict):
    """The file tensors come from."""

    path: Path = Field(description="File to read, relative to the recipe's folder.")
    format: FormatName = Field("auto", description="Detected from magic bytes when auto.")
    top_level_key: str | list[str] | None = Field(
        None, description="Nested dict holding the tensors: a dotted path ('model.state_dict') or a list of keys.")
    contiguous_indices: bool | None = Field(
        None, description="Renumber index segments 0,1,2,... (spec §4.2). Default: true for PyTorch sources.")
    skip_enum_variants: bool | None = Field(
        None, description="Match template paths with enum-variant segments removed (spec §4.3). "
                          "Default: true for PyTorch sources.")


class RemapRule(_Strict):
    """One regex rename; every rule sees the previous rule's output."""

    from_: str = Field(alias="from", description="Regex searched anywhere in the name (anchor with ^ and $).")
    to: str = Field(description="Replacement: $1 / ${name} (Burn style) or \\1 / \\g<name> (Python style).")
    syntax: Literal["auto", "rust", "python"] = Field(
        "auto", description="Replacement syntax; auto picks python when the text has \\<digit> or \\g<.")

    @model_validator(mode="after")
    def _compiles(self) -> RemapRule:
        from .naming import NamingError
        from .naming import RemapRule as CompiledRule

        try:
            CompiledRule(self.from_, self.to, self.syntax)
        except NamingError as e:
            raise ValueError(f"invalid remap rule: {e}") from None
        return self


class Criterion(_Strict):
    """Exactly one of: a regex (searched in the name), an exact path, or a Python predicate."""

    regex: str | None = None
    path: str | None = None
    predicate: str | None = Field(None, description="'package.module:function', called with the tensor name.")

    @field_validator("regex")
    @classmethod
    def _regex_ok(cls, v: str | None) -> str | None:
        return None if v is None else _check_regex(v)

    @field_validator("predicate")
    @classmethod
    def _predicate_form(cls, v: str | None) -> str | None:
        if v is not None and (v.count(":") != 1 or not all(v.split(":"))):
            raise ValueError("predicate must look like 'package.module:function'")
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> Criterion:
        given = [k for k in ("regex", "path", "predicate") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of regex, path, predicate (got {', '.join(given) or 'none'})")
        return self


class FilterSpec(_Strict):
    """Which tensors take part. `include` entries are OR-ed (absent = everything); `exclude` wins."""

    include: list[Criterion] | None = None
    exclude: list[Criterion] = Field(default_factory=list)


class HalfPrecisionOptions(_Strict):
    with_: list[str] = Field(default_factory=list, alias="with", description="Module types to add (e.g. BatchNorm).")
    without: list[str] = Field(default_factory=list, description="Module types to remove from the default set.")


class HalfPrecisionAdapter(_Strict):
    half_precision: HalfPrecisionOptions


class FloatCastOptions(_Strict):
    to: str = Field(description="Float dtype: F64, F32, Flex32, F16, BF16.")

    @field_validator("to")
    @classmethod
    def _float_dtype(cls, v: str) -> str:
        from .dtypes import parse

        _check_dtype(v)
        if not parse(v).is_float:
            raise ValueError(f"float_cast target must be a float dtype, got {v}")
        return v


class FloatCastAdapter(_Strict):
    float_cast: FloatCastOptions


AdapterSpec = Annotated[AdapterName | HalfPrecisionAdapter | FloatCastAdapter, Field(union_mode="left_to_right")]


class CastPolicy(_Strict):
    cast: str = Field(description="Cast every float tensor to this dtype (ints and bools pass through).")

    @field_validator("cast")
    @classmethod
    def _float_dtype(cls, v: str) -> str:
        from .dtypes import parse

        _check_dtype(v)
        if not parse(v).is_float:
            raise ValueError(f"dtype cast must name a float dtype, got {v}")
        return v


DTypePolicy = Literal["keep", "template"] | CastPolicy


class ScalarValue(_Strict):
    """A typed burnpack scalar: exactly one of int, uint, float, bool."""

    int_: int | None = Field(None, alias="int")
    uint: int | None = None
    float_: float | None = Field(None, alias="float")
    bool_: bool | None = Field(None, alias="bool")

    @model_validator(mode="after")
    def _exactly_one(self) -> ScalarValue:
        given = [k for k in ("int_", "uint", "float_", "bool_") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of int, uint, float, bool")
        if self.uint is not None and not 0 <= self.uint < 2**64:
            raise ValueError("uint must be in [0, 2**64)")
        if self.int_ is not None and not -(2**63) <= self.int_ < 2**63:
            raise ValueError("int must fit in 64 bits")
        return self


class TargetSpec(_Strict):
    """The file to write."""

    path: Path = Field(description="File to write, relative to the recipe's folder (.bpk appended if no extension).")
    format: FormatName = Field("auto", description="From the extension when auto.")
    template: Path | None = Field(
        None, description="A file holding exactly the tensors the output must have (Burn's load-into-a-model).")
    template_format: FormatName = "auto"
    overwrite: bool = False
    metadata: dict[str, str] = Field(default_factory=dict, description="Entries added to the output's metadata.")
    clear_metadata: bool = Field(False, description="Write no metadata except the entries given here.")
    scalars: Literal["keep", "none"] | dict[str, ScalarValue] = Field(
        "keep", description="burnpack scalars: keep the source's, none, or declare them.")


class Recipe(_Strict):
    """A migration, version 1."""

    version: Literal[1]
    description: str | None = None
    source: SourceSpec
    remap: list[RemapRule] = Field(default_factory=list)
    filter: FilterSpec = Field(default_factory=FilterSpec)
    modules: dict[str, list[str]] = Field(
        default_factory=dict, description="Module type -> regexes of module paths (tensor name minus last segment).")
    adapters: list[AdapterSpec] = Field(default_factory=list)
    dtype: DTypePolicy = "keep"
    target: TargetSpec
    allow_partial: bool = Field(False, description="With a template: keep template values for missing tensors.")
    validate_shapes: bool = Field(True, alias="validate", description="Shape mismatches are errors.")

    @field_validator("modules")
    @classmethod
    def _module_regexes(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for patterns in v.values():
            for p in patterns:
                _check_regex(p)
        return v

    def dump(self) -> dict[str, Any]:
        """Plain data with the YAML spellings (`from`, `validate`, `with`), defaults left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=True)
