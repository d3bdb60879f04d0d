"""The recipe (version 1): what a migration reads, how it renames, filters, adapts and casts, and
what it writes. Pydantic models with `extra="forbid"`; regexes and dtypes are checked here, at
validation, so a bad recipe never fails halfway through a run.

Field names are part of the user-facing contract (recipes are checked in): change them only with
a new `version`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    PrivateAttr,
    Tag,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..formats import registry as formats
from ..ops.base import on_new_op
from ..ops.checks import check_regex, recipe_value_error
from . import adapter_names
from .ops import OpSpec


def _format_choices(kind: str) -> tuple[str, ...]:
    """`auto` and the registered formats a `format:` of this kind takes: a target's have a writer, a
    template's and a source's a reader (a source may also be `mergekit`, a mergekit YAML whose merged
    tensors are read)."""
    found = formats.choices(writable=kind == "target", readable=kind != "target")
    return (*found, "mergekit") if kind == "source" else found


def _format_name(kind: str) -> Any:
    """A `format:` value, checked against the registry when a recipe is validated (so a format registered
    after this module was imported is taken) and worded as a Literal's error is (`recipe.placement`);
    the schema's enum is the formats registered when it is generated (`tools/gen_schema.py`)."""

    def check(value: object) -> str:
        options = _format_choices(kind)
        if isinstance(value, str) and value in options:
            return value
        raise PydanticCustomError("literal_error", "Input should be {expected}",
                                  {"expected": " or ".join(map(repr, options)), "options": list(options)})

    return Annotated[str, PlainValidator(check), WithJsonSchema({"enum": list(_format_choices(kind)),
                                                                 "type": "string"})]


if TYPE_CHECKING:
    FormatName = str
    ReadFormatName = str
    SourceFormatName = str
else:
    FormatName = _format_name("target")
    ReadFormatName = _format_name("template")
    SourceFormatName = _format_name("source")
GGUFTypeName = Literal["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                       "Q6_K"]
"""The ggml types a GGUF target can be written in (formats/gguf/writer.py's WRITABLE_TYPES)."""
GGUFMixName = Literal["Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q2_K"]
"""llama.cpp's K-quant mixes (formats/gguf/mixes.py): a type per tensor by llama-quantize's rules."""
if TYPE_CHECKING:
    QuantizeSchemeName = str
else:  # the schemes `formats.compressed_tensors_schemes` declares, as a Literal: the schema's enum and the choices
    from ..formats.compressed_tensors_schemes import scheme_names

    QuantizeSchemeName = Literal[scheme_names()]
if TYPE_CHECKING:
    AdapterName = str
else:  # the names `adapter_names` lists, as a Literal: the schema's enum and the validator's choices
    AdapterName = Literal[adapter_names.NAMED]


class _Strict(BaseModel):
    # defer_build: a model's validator is built when first used, not at import. Validating a recipe
    # then builds one validator for the whole tree instead of one per model (~35 ms of start-up).
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)


NO_MEMBER = "recipe_union"
"""The error type of a union value that fits none of its members' shapes (see `_tagged`)."""


def _shape_tag(value: object, mapping: str = "map") -> str | None:
    """The member of a tagged union a value is meant to be, from its shape alone.

    Strings go to the member tagged 'name', lists to 'list', a one-key mapping naming a model
    (`{float_cast: {...}}`) to the member tagged with that key, other mappings to `mapping`.
    Anything else picks no member: the loader reports the union as a whole.
    """
    if isinstance(value, BaseModel):  # serialising: the member is the model itself
        return next(iter(type(value).model_fields))
    if isinstance(value, str | PurePath):  # a path member serialises from its Path
        return "name"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        if len(value) == 1:
            key = next(iter(value))
            if isinstance(key, str) and key in _MODEL_TAGS:
                return key
        return mapping
    return None


_MODEL_TAGS = frozenset({"half_precision", "float_cast", "cast"})


def _tagged(what: str, mapping: str = "map") -> Discriminator:
    """`mapping`: the member for a mapping that names no model (a union with one model member
    sends every mapping there, so that `{cats: F16}` is reported as that model's unknown key)."""
    def tag(value: object) -> str | None:
        return _shape_tag(value, mapping)

    return Discriminator(tag, custom_error_type=NO_MEMBER,
                         custom_error_message=f"expected {what}")


def _castable_names() -> list[str]:
    """Burn's float dtypes, the only ones `casts` converts (FP8/FP6/FP4 have no Burn equivalent)."""
    from ..core.casts import CASTABLE
    from ..core.dtypes import FLOAT_DTYPES

    return [d.display for d in FLOAT_DTYPES if d.name in CASTABLE]


def _castable_enum(schema: dict[str, Any]) -> None:
    """A cast's dtype as an enum in the JSON Schema (computed when the schema is made, not at import;
    the validator also takes other spellings such as 'f16' or 'torch.bfloat16')."""
    schema["enum"] = _castable_names()


def _check_float_dtype(value: str, what: str) -> str:
    """A dtype a cast can target, checked now so that a run never stops at its first tensor."""
    from ..core.dtypes import parse
    from ..core.errors import UnsupportedDTypeError
    from ..naming.similarity import did_you_mean

    castable = _castable_names()
    use = f"use one of {', '.join(castable)}"
    try:
        dtype = parse(value)
    except UnsupportedDTypeError:
        guess = did_you_mean(value, castable)
        raise recipe_value_error(f"unknown dtype '{value}'",
                               hint=f"did you mean '{guess}'? {use}" if guess else use) from None
    if not dtype.is_float:
        raise recipe_value_error(f"{what} must be a float dtype, got {value}", hint=use)
    if dtype.display not in castable:
        raise recipe_value_error(f"{what} cannot be {value}: migrator casts to Burn's float dtypes only", hint=use)
    return value


def _nonempty_path(value: object) -> object:
    """An empty path would silently mean the recipe's folder; a NUL cannot be in any path."""
    if isinstance(value, str) and not value.strip():
        raise recipe_value_error("path is empty")
    if isinstance(value, str) and "\0" in value:
        raise recipe_value_error("path contains a NUL character", hint="no file name can hold one")
    return value


def _no_bool(value: object) -> object:
    """YAML `true` is not the number 1, whatever Python thinks."""
    if isinstance(value, bool):
        raise recipe_value_error(f"expected a number, got {str(value).lower()}")
    return value


Regex = Annotated[str, AfterValidator(check_regex)]
"""A regex in migrator's dialect (see `naming`), checked at validation."""

_Path = Annotated[Path, BeforeValidator(_nonempty_path)]


def _no_secrets(value: dict[str, str | int | float | bool]) -> dict[str, str | int | float | bool]:
    """Storage options never hold credentials: they come from the environment (migrator.storage.remote.fs)."""
    from ..storage.remote.options import secret_key

    bad = secret_key(value)
    if bad is not None:
        raise recipe_value_error(f"'{bad}' looks like a credential, and credentials never go in a recipe", key=bad,
                                 hint="set them in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                                      "AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*, HF_TOKEN) or "
                                      "the protocol's config files")
    return value


_StorageOptions = Annotated[dict[str, str | int | float | bool], AfterValidator(_no_secrets)]
_STORAGE_HELP = ("fsspec options for a URL path (s3://, gs://, az://, hf://, http(s)://, memory://), e.g. "
                 "{endpoint_url: 'http://127.0.0.1:9000', profile: dev}; never credentials (keys such as key, "
                 "secret, token, password are refused; token: anon, anonymous access, is not a credential): those come "
                 "from the environment.")
_Number = BeforeValidator(_no_bool)


def _finite_scale(value: float) -> float:
    if not math.isfinite(value) or abs(value) > 3.4028234663852886e38:  # folds compute in float32
        raise recipe_value_error(f"a LoRA scale must be a finite number within float32, got {value!r}: every folded "
                                 "weight would be inf or NaN")
    return value


class LoraSpec(_Strict):
    """A PEFT LoRA adapter folded into the source's weights as PEFT's merge_and_unload does."""

    path: _Path = Field(description="The adapter folder (adapter_config.json plus adapter_model.safetensors or "
                                    ".bin), relative to the recipe's folder.")
    scale: Annotated[float, _Number, AfterValidator(_finite_scale)] | None = Field(
        None, description="Multiplies every module's scaling (lora_alpha / r): PEFT's merge with a scale. Default 1.")


class SourceSpec(_Strict):
    """The file tensors come from."""

    path: _Path = Field(description="File to read, relative to the recipe's folder.")
    format: SourceFormatName = Field(
        "auto", description="Detected from magic bytes when auto; mergekit: path is a mergekit YAML config, read "
                            "as its merged tensors (docs/merging.md).")
    top_level_key: Annotated[Annotated[str, Tag("name")] | Annotated[list[str], Tag("list")],
                             _tagged("a string or a list of strings")] | None = Field(
        None, description="Nested dict holding the tensors: a dotted path ('model.state_dict') or a list of keys.")
    tag: str | None = Field(
        None, description="A DeepSpeed ZeRO checkpoint folder: the step to read (its folder name, such as "
                          "global_step10). Default: the step its 'latest' file names.")
    param_order: _Path | None = Field(
        None, description="A Hugging Face Trainer checkpoint folder with training_state: keep: a file whose tensor "
                          "names, in stored order, are the model's parameters in named_parameters() order (relative "
                          "to the recipe's folder); optimizer.pt numbers them so. Default: derived with transformers "
                          "from config.json.")
    contiguous_indices: bool | None = Field(
        None, description="Renumber index segments 0,1,2,... as Burn's Vec<Module> needs. Default: true for a "
                          "PyTorch source whose output is for Burn (a burnpack target or the pytorch_to_burn "
                          "adapter); other targets keep the names.")
    skip_enum_variants: bool | None = Field(
        None, description="Match template paths with enum-variant (inner CamelCase) segments removed, as Burn does. "
                          "Default: true for PyTorch sources.")
    storage_options: _StorageOptions = Field(default_factory=dict, description=_STORAGE_HELP)
    lora: Annotated[Annotated[_Path, Tag("name")] | Annotated[LoraSpec, Tag("map")],
                    _tagged("an adapter folder or {path, scale}")] | None = Field(
        None, description="A PEFT LoRA adapter folder folded into this source's weights (W + scaling B A, DoRA, "
                          "modules_to_save) before anything else: {path: ADAPTER, scale: S} or the folder alone. "
                          "See docs/merging.md.")

    seed: Annotated[int, _Number] | None = Field(
        None, description="format mergekit: the seed of DARE's random drop (dare_ties, dare_linear with density "
                          "< 1 need one), so a run is reproducible.")

    def lora_adapter(self) -> tuple[Path, float | None] | None:
        """(adapter folder as written, scale) when `lora` is given."""
        if self.lora is None:
            return None
        if isinstance(self.lora, LoraSpec):
            return self.lora.path, self.lora.scale
        return self.lora, None


class RemapSpec(_Strict):
    """One regex rename; every rule sees the previous rule's output."""

    from_: Regex = Field(alias="from", description="Regex searched anywhere in the name (anchor with ^ and $).")
    to: str = Field(description="Replacement: $1 / ${name} (Burn style) or \\1 / \\g<name> (Python style).")
    syntax: Literal["auto", "rust", "python"] = Field(
        "auto", description="Replacement syntax; auto picks python when the text has \\<digit> or \\g<.")

    @model_validator(mode="after")
    def _compiles(self) -> RemapSpec:
        """The pattern is already checked (`Regex`); what is left to fail is the replacement."""
        from ..naming import NamingError
        from ..naming import RemapRule as CompiledRule

        try:
            compiled = CompiledRule(self.from_, self.to, self.syntax)
        except NamingError as e:
            # naming quotes the replacement with repr(), which doubles every backslash the user wrote
            raise recipe_value_error(e.message.replace(repr(self.to), f"'{self.to}'"), key="to") from e
        # Burn expands a reference to a missing group to '' and then, typically, two names collide:
        # refused here, at the line of `to`, instead of as a collision when planning
        problem = compiled.missing_group_problem()
        if problem is not None:
            raise recipe_value_error(problem[0], key="to", hint=problem[1])
        return self


class CriterionSpec(_Strict):
    """Exactly one of: a regex (searched in the name), an exact path, or a Python predicate."""

    regex: Regex | None = Field(None, description="Regex searched anywhere in the (remapped) tensor name.")
    path: str | None = Field(None, description="An exact (remapped) tensor name.")
    predicate: str | None = Field(None, description="'package.module:function', called with the tensor name.")

    @field_validator("predicate")
    @classmethod
    def _predicate_form(cls, v: str | None) -> str | None:
        """Checked for shape only: importing user code while validating would run it."""
        if v is None:
            return v
        module, sep, func = v.partition(":")
        dotted_ok = all(part.isidentifier() for part in module.split(".")) and all(
            part.isidentifier() for part in func.split("."))
        if not sep or not dotted_ok:
            raise recipe_value_error(f"predicate '{v}' is not an import path",
                                   hint="write 'package.module:function'")
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> CriterionSpec:
        given = [k for k in ("regex", "path", "predicate") if getattr(self, k) is not None]
        if len(given) != 1:
            hint = "put each in its own list entry" if given else None
            raise recipe_value_error(
                f"give exactly one of regex, path, predicate (got {', '.join(given) or 'none'})", hint=hint)
        return self


class FilterSpec(_Strict):
    """Which tensors take part. `include` entries are OR-ed (absent = everything); `exclude` wins."""

    include: list[CriterionSpec] | None = Field(  # default= by keyword: type checkers then see it optional
        default=None, description="Keep only tensors matching one of these (OR); absent keeps every tensor.")
    exclude: list[CriterionSpec] = Field(default_factory=list, description="Drop tensors matching any of these.")


class SourceEntry(SourceSpec):
    """One of several sources (`sources:`): a checkpoint plus the renames that apply to it alone.

    Its tensors go through its own `filter` (on their stored names), `remap`, contiguous indices,
    then get `prefix`; the recipe's global steps then see the union of every entry's tensors (see
    `migrator.plan.sources`)."""

    name: str | None = Field(
        None, description="What reports, plan tables, errors and `--source NAME=PATH` call this source. "
                          "Default: its path as written.")
    remap: list[RemapSpec] = Field(default_factory=list, description="Renames for this source's tensors only, "
                                                                     "after its filter, before its prefix.")
    filter: FilterSpec = Field(default_factory=FilterSpec,
                               description="Which of this source's tensors take part, on their names as stored "
                                           "(before its remap).")
    prefix: str = Field("", description="Text put in front of each of this source's names after its filter and "
                                        "remap (verbatim: write the dot, 'bert.').")

    @property
    def label(self) -> str:
        return self.name if self.name is not None else str(self.path)


class HalfPrecisionOptionsSpec(_Strict):
    with_: list[str] = Field(default_factory=list, alias="with", description="Module types to add (e.g. BatchNorm).")
    without: list[str] = Field(default_factory=list, description="Module types to remove from the default set.")

    @model_validator(mode="after")
    def _without_known(self) -> HalfPrecisionOptionsSpec:
        try:
            adapter_names.half_precision_module_set(self.with_, self.without)
        except ValueError as e:
            raise recipe_value_error(str(e), key="without",
                                   hint="Burn's without_module accepts only names in the set") from None
        return self


class HalfPrecisionSpec(_Strict):
    half_precision: HalfPrecisionOptionsSpec = Field(
        description="F32 <-> F16 for Burn's default module types, with types added (with) or removed (without).")


class FloatCastOptionsSpec(_Strict):
    to: str = Field(description="Float dtype: F64, F32, Flex32, F16, BF16.", json_schema_extra=_castable_enum)

    @field_validator("to")
    @classmethod
    def _float_dtype(cls, v: str) -> str:
        return _check_float_dtype(v, "float_cast target")


class FloatCastSpec(_Strict):
    float_cast: FloatCastOptionsSpec = Field(description="Cast every float tensor to one dtype (Burn's float_cast).")


AdapterSpec = Annotated[
    Annotated[AdapterName, Tag("name")]
    | Annotated[HalfPrecisionSpec, Tag("half_precision")]
    | Annotated[FloatCastSpec, Tag("float_cast")],
    _tagged("an adapter"),
]


class CastSpec(_Strict):
    cast: str = Field(description="Cast every float tensor to this dtype (ints and bools pass through).",
                      json_schema_extra=_castable_enum)

    @field_validator("cast")
    @classmethod
    def _float_dtype(cls, v: str) -> str:
        return _check_float_dtype(v, "dtype cast")


DTypePolicy = Annotated[
    Annotated[Literal["keep", "template"], Tag("name")] | Annotated[CastSpec, Tag("cast")],
    _tagged("'keep', 'template' or {cast: DTYPE}", mapping="cast"),
]


class ScalarSpec(_Strict):
    """A typed burnpack scalar: exactly one of int, uint, float, bool."""

    int_: Annotated[int | None, _Number] = Field(None, alias="int", description="A signed 64-bit integer.")
    uint: Annotated[int | None, _Number] = Field(None, description="An unsigned 64-bit integer.")
    float_: Annotated[float | None, _Number] = Field(None, alias="float", description="A 64-bit float.")
    bool_: bool | None = Field(None, alias="bool", description="A boolean.")

    @model_validator(mode="after")
    def _exactly_one(self) -> ScalarSpec:
        given = [k for k in ("int_", "uint", "float_", "bool_") if getattr(self, k) is not None]
        if len(given) != 1:
            raise recipe_value_error("give exactly one of int, uint, float, bool", hint="e.g. {int: 42}")
        if self.uint is not None and not 0 <= self.uint < 2**64:
            raise recipe_value_error("uint must be in [0, 2**64)", key="uint")
        if self.int_ is not None and not -(2**63) <= self.int_ < 2**63:
            raise recipe_value_error("int must fit in 64 bits", key="int")
        return self


class ShardSpec(_Strict):
    """Write a folder of shards in Hugging Face's layout (`model-00001-of-0000N.safetensors` + index)."""

    max_size: Annotated[int | str, _Number] = Field(
        "5GB", description="Largest shard, as Hugging Face reads sizes: 5GB = 5*10^9 bytes, 5GiB = 5*2^30, an "
        "integer = bytes. A tensor larger than this gets a shard of its own.")

    @field_validator("max_size")
    @classmethod
    def _size(cls, v: int | str) -> int | str:
        from ..files.shard_layout import parse_size

        try:
            parse_size(v)
        except ValueError as e:
            raise recipe_value_error(str(e), hint="e.g. 5GB, 500MB, 2GiB or 1000000") from None
        return v

    name: str | None = Field(
        None, description="The weights' file name in the folder: the one file, or the shards' stem and the index "
        "(NAME.index.json). Default: model.safetensors / pytorch_model.bin, adapter_model.* for a PEFT adapter "
        "source, as save_pretrained names them.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        from ..files.shard_layout import check_weights_name

        if v is not None:
            try:
                check_weights_name(v)
            except ValueError as e:
                raise recipe_value_error(str(e), hint="e.g. model.safetensors or llama.bin") from None
        return v


class CopySpec(_Strict):
    """A companion file (or glob) copied byte for byte into the output folder."""

    path: str = Field(description="Glob relative to the source's folder (e.g. 'tokenizer*').")
    optional: bool = Field(False, description="No matching file is not an error.")


class RopeScalingSpec(_Strict):
    """Llama 3.1's RoPE scaling (config.json's `rope_scaling` with `rope_type: llama3`)."""

    rope_type: Literal["llama3"] = Field(description="The scaling llama.cpp writes as per-dimension factors.")
    factor: float = Field(gt=0, description="How much the lowest frequencies are slowed (8.0 in Llama 3.1).")
    low_freq_factor: float = Field(1.0, gt=0, description="Wavelengths above original / this are divided by factor.")
    high_freq_factor: float = Field(4.0, gt=0, description="Wavelengths below original / this are kept.")
    original_max_position_embeddings: int = Field(gt=0, description="The context the model was trained with.")

    @model_validator(mode="after")
    def _ordered(self) -> RopeScalingSpec:
        if self.high_freq_factor <= self.low_freq_factor:
            raise recipe_value_error("high_freq_factor must be above low_freq_factor (they bound the smoothed band)",
                                     key="high_freq_factor")
        return self


class QuantizeSpec(_Strict):
    """Quantize the Linear weights into compressed-tensors' layout (no calibration data)."""

    scheme: QuantizeSchemeName = Field(
        description="FP8_DYNAMIC: F8_E4M3 weights with one scale per output channel, activations per token at run "
        "time; FP8_BLOCK: one scale per 128x128 block, activations per group of 128. Written as compressed-tensors "
        "0.20 writes them (its float-quantized layout and config.json's quantization_config).")
    ignore: list[Regex] | None = Field(
        None, description="Module paths (tensor name minus .weight; regexes searched in them) whose Linear weights "
        "stay as they are, listed in quantization_config.ignore. Default: lm_head and MoE routers (modules named "
        "gate, router or shared_expert_gate). Given, it replaces the default (e.g. [] quantizes lm_head too).")


class TargetSpec(_Strict):
    """The file (or, for a sharded output, the folder) to write."""

    path: _Path = Field(description="File to write, relative to the recipe's folder (.bpk appended if no extension).")
    format: FormatName = Field("auto", description="From the extension when auto.")
    template: _Path | None = Field(
        None, description="A file holding exactly the tensors the output must have (Burn's load-into-a-model).")
    template_format: ReadFormatName = Field("auto", description="The template's format; detected when auto.")
    storage_options: _StorageOptions = Field(default_factory=dict, description=_STORAGE_HELP)
    template_storage_options: _StorageOptions = Field(
        default_factory=dict, description="storage_options for a template URL (the target's by default).")
    overwrite: bool = Field(False, description="Replace an existing target (otherwise the run refuses it).")
    fsync: bool = Field(
        True, description="Flush the output to disk before publishing it. false is faster (like cp); the file is "
        "still never partial after a crash of migrator, but a power loss soon after may lose it.")
    metadata: dict[str, str] = Field(default_factory=dict, description="Entries added to the output's metadata.")
    clear_metadata: bool = Field(False, description="Write no metadata except the entries given here.")
    scalars: Annotated[
        Annotated[Literal["keep", "none"], Tag("name")] | Annotated[dict[str, ScalarSpec], Tag("map")],
        _tagged("'keep', 'none' or a mapping"),
    ] = Field(
        "keep", description="burnpack scalars: keep the source's, none, or declare them.")
    quantize: dict[Regex, GGUFTypeName] | GGUFMixName = Field(
        default_factory=dict, description="GGUF targets: the ggml type of each tensor, {regex: type}, the first regex "
        "found in a tensor's name deciding (e.g. {'.*': Q8_0}). As llama.cpp does, 1-D tensors and norms stay F32, a "
        "tensor whose rows are not whole blocks falls back (K-quants to Q5_0/Q5_1/Q8_0/Q4_0, else F16; the plan notes "
        "it), non-float tensors keep their type; tensors no rule matches keep their dtype. Or one of llama.cpp's "
        "K-quant mixes (Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q6_K, Q3_K_S, Q3_K_M, Q3_K_L, Q2_K), which picks "
        "each tensor's type as llama-quantize does.")
    tokenizer: str | None = Field(
        None, description="GGUF targets: a SentencePiece model (e.g. tokenizer.model) or a byte-level BPE "
        "tokenizer.json, relative to the source's folder, written as the tokenizer.ggml.* key/values llama.cpp reads "
        "(special tokens and add_bos/add_eos from config.json / tokenizer_config.json beside it).")
    rope_scaling: RopeScalingSpec | None = Field(
        None, description="Llama 3.1 RoPE scaling. A GGUF target: written as llama.cpp does, a rope_freqs.weight F32 "
        "tensor of per-dimension factors (from these, the rope.freq_base and rope.dimension_count key/values), and "
        "the settings as the migrator.rope_scaling key (JSON). A folder with hf_config: the config.json's "
        "rope_scaling, for a GGUF whose rope_freqs.weight came without its settings (checked against it).")
    hf_config: bool = Field(
        False, description="A folder target from a llama GGUF source: write the config.json of a LlamaForCausalLM "
        "made from its key/values (with the remaps and permute `migrate convert model.gguf out/` adds).")
    shard: ShardSpec | None = Field(
        None, description="Write a folder of shards plus an index (SafeTensors or PyTorch), or of llama.cpp's split "
        "files (GGUF: NAME-00001-of-0000N.gguf, no index). Implied by a path ending "
        "with '/'.")
    copy_: list[Annotated[Annotated[str, Tag("name")] | Annotated[CopySpec, Tag("path")],  # a model's tag: its
                          _tagged("a glob or {path, optional}", mapping="path")]] = Field(  # first field's name
        default_factory=list, alias="copy",
        description="Companion files copied byte for byte from the source's folder into a sharded output folder "
        "(e.g. [config.json, 'tokenizer*', {path: generation_config.json, optional: true}]); an entry matching no "
        "file is an error unless optional.")
    config: dict[str, Any] = Field(
        default_factory=dict, description="Entries set in the config.json copied into a folder target (null removes "
        "one), each checked against the tensors written: vocab_size against the embedding's rows, num_local_experts "
        "/ num_experts / n_routed_experts against the routers' rows, tie_word_embeddings: false against a head "
        "tensor. Those the tensors determine are also updated without being asked, where the config holds them.")
    copy_from: str | None = Field(
        None, description="The folder `copy` globs read from, relative to the recipe (default: the source's "
                          "folder); e.g. the Hugging Face folder whose config and tokenizer go with a .bpk source.")
    optimizer: _Path | None = Field(
        None, description="With training_state: keep, a PyTorch training checkpoint into a .bpk: where Burn's "
        "OptimizerRecord of its optimizer is written, relative to the recipe (default: beside the model, "
        "<stem>-optim.bpk). Burn loads it with ModuleOptimizer::load.")
    param_order: _Path | None = Field(
        None, description="With training_state: keep into a .pt: a state dict of the new model whose tensors are in "
        "the model's own order (torch.save(new_model.state_dict()), or a .bpk), relative to the recipe. Each kept "
        "param group lists its parameters, and ids are numbered, in that order, so an optimizer built over "
        "new_model.parameters() loads the state by position as well as by param_names.")

    @model_validator(mode="before")
    @classmethod
    def _folder_path(cls, data: Any) -> Any:
        """A path ending with '/' names a folder: a sharded output (the slash is lost once it is a Path)."""
        if isinstance(data, dict) and isinstance(data.get("path"), str) and data["path"].endswith(("/", "\\")) \
                and data.get("shard") is None:
            if formats.is_format(data.get("format"), folder=True):  # a DCP checkpoint: the folder is the target
                return data
            return {**data, "shard": {}}
        return data

    @model_validator(mode="after")
    def _sharded_format(self) -> TargetSpec:
        if self.shard is not None:
            why = formats.not_shardable(formats.target_format(self.path, self.format, sharded=True))
            if why is not None:
                problem, _, instead = why.partition("; ")
                raise recipe_value_error(problem, key="shard", hint=f"{instead}, or drop target.shard")
        elif self.copy_:
            raise recipe_value_error("target.copy needs a folder target", key="copy",
                                   hint="end target.path with '/' or set target.shard")
        if self.copy_from is not None and not self.copy_:
            raise recipe_value_error("target.copy_from says where target.copy reads, but there is no copy",
                                     key="copy_from", hint="add copy: [config.json, 'tokenizer*']")
        return self

    def copies(self) -> list[tuple[str, bool]]:
        """(glob, optional) per `copy` entry."""
        return [(c, False) if isinstance(c, str) else (c.path, c.optional) for c in self.copy_]


class RaySpec(_Strict):
    address: str | None = Field(
        None, description="The Ray cluster to join: an address, or auto (a running local head); default: "
                          "$RAY_ADDRESS, else a local Ray started for the run.")


class ExecutorSpec(_Strict):
    ray: RaySpec | None = Field(None, description="Run the jobs and write tasks as Ray tasks (pip install "
                                                  "'migrator[ray]').")


class AddTokensSpec(_Strict):
    """New tokens: added to the tokenizer files (tokenizer.json, and tokenizer_config.json's
    added_tokens_decoder when it has one) and as new rows of the input embedding and the LM head."""

    tokens: list[str] | None = Field(None, description="The tokens, in the order their ids are given.")
    file: _Path | None = Field(None, description="A file of tokens, relative to the recipe: a JSON list of strings "
                               "(when it starts with '['), else one token per line as written (blank lines skipped).")
    fill: Literal["mean", "zeros"] = Field(
        "mean", description="The new rows: the mean of the existing rows (as add_rows' fill: mean), or zeros.")

    @model_validator(mode="after")
    def _one_list(self) -> AddTokensSpec:
        if (self.tokens is None) == (self.file is None):
            raise recipe_value_error("give exactly one of tokens, file", hint="tokens: ['<tool>', '</tool>']")
        return self


class Recipe(_Strict):
    """A migration, version 1."""

    version: Annotated[Literal[1], BeforeValidator(_no_bool)] = Field(description="Recipe format version: 1.")
    description: str | None = Field(None, description="What the recipe is for (free text).")
    config: str | None = Field(
        None, description="The model's config (JSON) that ${config.KEY} values come from and ops are checked "
                          "against, relative to the recipe. Default: config.json beside the first source, else "
                          "params.json there.")
    source: SourceSpec | None = Field(
        None, description="The file (or model folder, index, glob of shards) tensors come from. Give this or "
                          "sources.")
    sources: list[SourceEntry] | None = Field(
        None, description="Several checkpoints read as one (model surgery), each with its own remap, filter and "
                          "prefix; the global remap, filter, adapters and target apply to their union. Give this or "
                          "source.")
    remap: list[RemapSpec] = Field(default_factory=list, description="Regex renames, applied in order.")
    filter: FilterSpec = Field(default_factory=FilterSpec, description="Which tensors take part.")
    modules: dict[str, list[Regex]] = Field(
        default_factory=dict, description="Module type -> regexes of module paths (tensor name minus last segment).")
    ops: list[OpSpec] = Field(
        default_factory=list, description="Tensor ops, each a one-key mapping {OP: {options}} naming one of the "
        "ops below (docs/ops.md), in order, on the names after remap and filter, before adapters.")
    add_tokens: AddTokensSpec | None = Field(
        None, description="Grow the vocabulary: tokens added to the tokenizer files written beside a folder target, "
        "and rows to the input embedding and the LM head (each tensor named like embed_tokens.weight, wte.weight, "
        "word_embeddings.weight, tok_embeddings.weight, embed_in.weight, lm_head.weight, embed_out.weight; the head "
        "when it is stored: a tied one follows its embedding), after the recipe's ops; config.json's vocab_size "
        "follows.")
    adapters: list[AdapterSpec] = Field(
        default_factory=list,
        description="Layout adapters, chained in order: " + ", ".join(adapter_names.ALL[1:] + adapter_names.ALL[:1])
        + ".")
    dtype: DTypePolicy = Field("keep", description="keep the source dtypes, take the template's, or {cast: DTYPE}.")
    quantize: QuantizeSpec | None = Field(
        None, description="Quantize the Linear weights (after the dtype policy) into compressed-tensors' layout, "
        "in a SafeTensors model folder target whose copied config.json gets the quantization_config: "
        "{scheme: FP8_DYNAMIC} (docs/quantizing.md).")
    target: TargetSpec = Field(description="The file (or folder of shards) to write.")
    allow_partial: bool = Field(False, description="With a template: keep template values for missing tensors.")
    validate_shapes: bool = Field(True, alias="validate", description="Shape mismatches are errors.")
    training_state: Literal["keep", "drop"] | None = Field(
        None, description="A training checkpoint's optimizer state: keep (every optimizer state dict rewritten so "
                          "its moments follow their parameters through the recipe) or drop. Default: keep for a "
                          "whole-checkpoint .pt -> .pt run, drop otherwise.")
    executor: ExecutorSpec | None = Field(
        None, description="Where the run's jobs and write tasks run when the command line does not say "
                          "(--executor and --ray-address win): {ray: {address: auto}}. Default: this machine.")

    @model_validator(mode="after")
    def _one_source_key(self) -> Recipe:
        if (self.source is None) == (self.sources is None):
            both = self.source is not None
            raise recipe_value_error("give source or sources, not both" if both else "the recipe reads nothing: "
                                   "give source: (one checkpoint) or sources: (a list)",
                                   key="sources" if both else None,
                                   hint="source: {path: model.safetensors}, or sources: [{path: a.pt}, {path: b.pt}]")
        if self.sources is not None:
            if not self.sources:
                raise recipe_value_error("sources is empty", key="sources", hint="list at least one {path: ...}")
            labels = [s.label for s in self.sources]
            twice = sorted({x for x in labels if labels.count(x) > 1})
            if twice:
                raise recipe_value_error(f"two sources are called '{twice[0]}'", key="sources",
                                       hint="give each a distinct name: (name: encoder)")
        return self

    @model_validator(mode="after")
    def _quantized_target(self) -> Recipe:
        if self.quantize is None:
            return self
        from ..core.errors import MigratorError

        try:
            fmt = formats.target_format(self.target.path, self.target.format, sharded=self.target.shard is not None)
        except MigratorError:  # an extension no writer takes: the run names it
            return self
        from ..formats.compressed_tensors_schemes import can_hold

        if not can_hold(fmt, folder=self.target.shard is not None):
            raise recipe_value_error(
                f"quantize ({self.quantize.scheme}) writes compressed-tensors' layout, a SafeTensors model folder "
                f"with its config.json; this target is {'a folder of ' if self.target.shard else ''}{fmt}",
                key="quantize", hint="end target.path with '/' (format safetensors), or drop quantize")
        return self

    _deferred: list[Any] = PrivateAttr(default_factory=list)

    def defer_references(self, issues: Sequence[Any]) -> None:
        """Record `${config...}` values that had no config to read when loaded (`RecipeIssue`s): they
        hold a placeholder, so a plan of this recipe is refused (`unresolved_references`)."""
        self._deferred = list(issues)

    @property
    def unresolved_references(self) -> list[Any]:
        """The `RecipeIssue` of each `${config...}` value resolved to nothing (see `defer_references`)."""
        return list(self._deferred)

    def for_burn(self, target_format: str) -> bool:
        """Whether the output is for Burn: a burnpack target or the `pytorch_to_burn` adapter. Only
        then are a PyTorch source's index segments renumbered by default (`contiguous_indices`):
        Burn's `Vec<Module>` has no gaps, while a PyTorch module loads the names as stored."""
        return formats.is_format(target_format, for_burn=True) or "pytorch_to_burn" in self.adapters

    def inputs(self) -> list[SourceSpec]:
        """The sources read: `source` alone, or every `sources` entry."""
        return [self.source] if self.source is not None else list(self.sources or [])

    def dump(self) -> dict[str, Any]:
        """Plain data with the YAML spellings (`from`, `validate`, `with`), defaults left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=True)


def _take_new_op() -> None:
    """An op registered after `Recipe` was built (a plugin's module): its `ops:` union is made again."""
    if Recipe.__pydantic_complete__:
        Recipe.model_rebuild(force=True)


on_new_op(_take_new_op)
