"""The recipe's `ops:` entries (split, concat, stack, unstack, reshape, permute, slice, rope_permute, offset; the
arithmetic ops linear, scale, slerp, task_arithmetic, ties, dare_ties, dare_linear, lora_fold are `merge_ops.py`).

Each entry is a one-key mapping naming its op, like an adapter with options. What can be checked
without the source's shapes is checked here, at validation (sizes and parts, dims forming a
permutation, `to` referring only to groups its pattern has); the shape checks run when the plan
is built (`migrator.transform.ops`). Names: `from` is a regex that must match a whole (post-remap) name;
`to` is a replacement in remap syntax ($1, ${name}) and `$i` is the part index where an op has
parts (split, unstack).

Kept apart from model.py (which imports this module) so the op surface can grow without touching
the shared model; what both validate with is in checks.py.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    Discriminator,
    Field,
    Tag,
    model_validator,
)

from . import merge_ops
from .op_base import (  # noqa: F401  re-exported: the ops' helpers are imported from here
    _INDEX_REF,
    Int,
    Ints,
    Pattern,
    _no_bool,
    _no_bools,
    _Op,
    _problem,
    _regex,
    check_template,
    has_index_ref,
    substitute_index,
    whole_name_pattern,
)

OP_NAMES = ("split", "concat", "stack", "unstack", "reshape", "permute", "slice", "rope_permute", "offset", "linear",
            "scale", "slerp", "task_arithmetic", "ties", "dare_ties", "dare_linear", "lora_fold")


class _Unary(_Op):
    from_: Pattern = Field(alias="from", description="Regex matching whole tensor names (after remap and filter); "
                           "every match is one input.")
    to: str | None = Field(None, description="Output name, with $1 / ${name} from `from`'s groups; default: the "
                           "input's name.")

    @model_validator(mode="after")
    def _to_groups(self) -> Any:
        if self.to is not None:
            check_template(self.from_, self.to, "to", index_ok=False)
        return self


MAX_PARTS = 1 << 16
"""Outputs one `split` or `unstack` may make: a name each, so a count from a recipe (`parts: 2**63`) or
from a header (a dim of [2**40, 0]) must not decide how many are built."""


class SplitSpec(_Op):
    """One input cut along `dim` into consecutive parts (torch.split / torch.chunk)."""

    from_: Pattern = Field(alias="from", description="Regex matching whole tensor names; every match is split.")
    dim: Int = Field(0, description="Dimension to cut (negative counts from the end).")
    sizes: Ints | None = Field(None, description="Length of each part along dim; they must add up to its size.")
    parts: Int | None = Field(None, description="Number of equal parts (instead of sizes); must divide the size.")
    to: Annotated[Annotated[str, Tag("name")] | Annotated[list[str], Tag("list")],
                  Discriminator(lambda v: "list" if isinstance(v, list) else "name")] = Field(
        description="A name per part (a list), or one name with $i for the part index; $1 / ${name} from `from`.")

    @model_validator(mode="after")
    def _parts(self) -> SplitSpec:
        if (self.sizes is None) == (self.parts is None):
            raise _problem("give exactly one of sizes, parts", hint="sizes: [768, 768, 768] or parts: 3")
        if self.sizes is not None and (not self.sizes or any(s < 0 for s in self.sizes)):
            raise _problem("sizes must be a non-empty list of lengths >= 0", key="sizes")
        if self.parts is not None and self.parts < 1:
            raise _problem("parts must be at least 1", key="parts")
        if self.parts is not None and self.parts > MAX_PARTS:
            raise _problem(f"parts must be at most {MAX_PARTS}", key="parts")
        if self.sizes is not None and len(self.sizes) > MAX_PARTS:
            raise _problem(f"sizes may list at most {MAX_PARTS} parts", key="sizes")
        n = len(self.sizes) if self.sizes is not None else self.parts
        if isinstance(self.to, list):
            if len(self.to) != n:
                raise _problem(f"to names {len(self.to)} outputs for {n} parts", key="to")
            for t in self.to:
                check_template(self.from_, t, "to", index_ok=True)
        else:
            if not has_index_ref(self.to) and n != 1:
                raise _problem(f"one name for {n} parts: every part would get it", key="to",
                               hint="use $i for the part index, or list one name per part")
            check_template(self.from_, self.to, "to", index_ok=True)
        return self


_From = Annotated[Annotated[str, Tag("name")] | Annotated[list[str], Tag("list")],
                  Discriminator(lambda v: "list" if isinstance(v, list) else "name")]


class _Joining(_Op):
    from_: _From = Field(
        alias="from", description="Either a list: a regex, then the other inputs' names with $1 / ${name} from its "
        "groups (in order); or one regex with `over`: all its matches, ordered by that group's integer value.")
    over: Annotated[int | str, BeforeValidator(_no_bool)] | None = Field(
        None, description="With one regex: the group (number or name) holding the input's index; the matches that "
        "agree on every other group form one output, indices 0..N-1.")
    dim: Int = Field(0, description="Dimension to join along.")
    to: str = Field(description="Output name, with $1 / ${name} from the (first) pattern's groups.")

    @model_validator(mode="after")
    def _inputs(self) -> Any:
        from ..naming import compile_regex

        if isinstance(self.from_, list):
            if self.over is not None:
                raise _problem("over needs `from` to be one regex, not a list", key="over")
            if len(self.from_) < 1:
                raise _problem("from lists no input", key="from")
            _regex(self.from_[0])
            for name in self.from_[1:]:
                check_template(self.from_[0], name, "from", index_ok=False)
            pattern = self.from_[0]
        else:
            if self.over is None:
                raise _problem("one `from` regex needs `over`: the group holding each input's index",
                               key="from", hint="or list the inputs: from: [REGEX, NAME, ...]")
            _regex(self.from_)
            pattern = self.from_
            compiled = compile_regex(pattern)
            if isinstance(self.over, int):
                if not 1 <= self.over <= compiled.groups:
                    raise _problem(f"over: group {self.over} does not exist; the pattern has {compiled.groups} "
                                   f"group{'' if compiled.groups == 1 else 's'}", key="over")
            elif self.over not in compiled.groupindex:
                raise _problem(f"over: the pattern has no group named '{self.over}'", key="over")
        check_template(pattern, self.to, "to", index_ok=False)
        return self


class ConcatSpec(_Joining):
    """Inputs joined end to end along an existing `dim` (torch.cat)."""


class StackSpec(_Joining):
    """Inputs of one shape joined along a new `dim` (torch.stack)."""


class UnstackSpec(_Op):
    """One input cut along `dim` into its slices, that dim removed (torch.unbind)."""

    from_: Pattern = Field(alias="from", description="Regex matching whole tensor names; every match is unstacked.")
    dim: Int = Field(0, description="Dimension to remove.")
    to: str = Field(description="Output name with $i for the index; $1 / ${name} from `from`.")

    @model_validator(mode="after")
    def _index(self) -> UnstackSpec:
        if not has_index_ref(self.to):
            raise _problem("to must use $i: every output would get the same name", key="to",
                           hint="e.g. 'layers.$1.experts.$i.w1.weight'")
        check_template(self.from_, self.to, "to", index_ok=True)
        return self


class ReshapeSpec(_Unary):
    """The same elements in a new shape (torch.reshape of a contiguous tensor: no byte moves)."""

    shape: Ints = Field(description="New shape; one entry may be -1 (inferred from the element count).")

    @model_validator(mode="after")
    def _shape(self) -> ReshapeSpec:
        if any(d < -1 for d in self.shape) or self.shape.count(-1) > 1:
            raise _problem(f"shape {self.shape}: lengths are >= 0, with at most one -1", key="shape")
        return self


class PermuteSpec(_Unary):
    """Dimensions reordered (torch.permute; [1, 0] is a transpose)."""

    dims: Ints = Field(description="Output dim k is input dim dims[k]: a permutation of 0..rank-1.")

    @model_validator(mode="after")
    def _perm(self) -> PermuteSpec:
        if sorted(self.dims) != list(range(len(self.dims))):
            raise _problem(f"dims {self.dims} is not a permutation of 0..{len(self.dims) - 1}", key="dims")
        return self


class SliceSpec(_Unary):
    """The range [start, stop) of `dim` (tensor[..., start:stop])."""

    dim: Int = Field(0, description="Dimension to cut (negative counts from the end).")
    start: Int = Field(0, description="First index kept (negative counts from the end).")
    stop: Int | None = Field(None, description="One past the last index kept (negative counts from the end); "
                             "default: the end.")


class RopePermuteSpec(_Unary):
    """Meta's rotary layout of a q/k projection (interleaved pairs) to Hugging Face's (two halves per head),
    the permutation of Hugging Face's Llama conversion script; `inverse` goes back."""

    heads: Int = Field(description="Attention heads in this weight (for k: the key/value heads). Take it from the "
                               "model's config: ${config.num_attention_heads}, or for k ${config.num_key_value_heads "
                               "| config.num_attention_heads}.")
    head_dim: Int | None = Field(None, description="Size of one head; each matched tensor must have heads x head_dim "
                                                   "rows. Default: rows / heads, checked against the config's.")
    inverse: bool = Field(False, description="Hugging Face layout -> Meta layout.")

    @model_validator(mode="after")
    def _heads(self) -> RopePermuteSpec:
        if self.heads < 1:
            raise _problem("heads must be at least 1", key="heads")
        if self.head_dim is not None and (self.head_dim < 2 or self.head_dim % 2):
            raise _problem(f"head_dim {self.head_dim} must be even (rotary pairs) and at least 2", key="head_dim")
        return self


class OffsetSpec(_Unary):
    """A constant added to every element (x + value): Gemma's RMSNorm weights, which llama.cpp stores as
    weight + 1 (Hugging Face's Gemma multiplies by 1 + weight)."""

    value: merge_ops.Number = Field(description="The constant added (1.0, or -1.0 to undo it).")
    dtype: merge_ops.ComputedDType = Field(None, description="Output dtype (F64, F32, F16, BF16); default: the "
                                           "input's. Computed in F32 (F64 when the input or output is F64), "
                                           "rounded once.")

    @model_validator(mode="after")
    def _dtype(self) -> OffsetSpec:
        merge_ops._float_dtype(self.dtype)
        return self


class SplitOpSpec(BaseModel):
    model_config = _Op.model_config
    split: SplitSpec = Field(description="Cut each matching tensor along a dim into parts (torch.split / torch.chunk).")


class ConcatOpSpec(BaseModel):
    model_config = _Op.model_config
    concat: ConcatSpec = Field(description="Join inputs end to end along an existing dim (torch.cat).")


class StackOpSpec(BaseModel):
    model_config = _Op.model_config
    stack: StackSpec = Field(description="Join inputs of one shape along a new dim (torch.stack).")


class UnstackOpSpec(BaseModel):
    model_config = _Op.model_config
    unstack: UnstackSpec = Field(
        description="Cut each matching tensor into its slices along a dim, removing it (torch.unbind).")


class ReshapeOpSpec(BaseModel):
    model_config = _Op.model_config
    reshape: ReshapeSpec = Field(
        description="Give each matching tensor a new shape with the same elements (torch.reshape).")


class PermuteOpSpec(BaseModel):
    model_config = _Op.model_config
    permute: PermuteSpec = Field(description="Reorder each matching tensor's dims (torch.permute).")


class SliceOpSpec(BaseModel):
    model_config = _Op.model_config
    slice: SliceSpec = Field(description="Keep a range of one dim of each matching tensor (tensor[..., start:stop]).")


class RopePermuteOpSpec(BaseModel):
    model_config = _Op.model_config
    rope_permute: RopePermuteSpec = Field(
        description="Meta's interleaved rotary layout of q/k weights to Hugging Face's, or back (inverse).")


class OffsetOpSpec(BaseModel):
    model_config = _Op.model_config
    offset: OffsetSpec = Field(description="Add a constant to every element of each matching float tensor "
                               "(x + value; Gemma's norms in GGUF are weight + 1).")


def _wrapper(kind: str, spec: type[BaseModel], text: str) -> type[BaseModel]:
    """The one-key model `{KIND: SPEC}` of an op."""
    from pydantic import create_model

    model: type[BaseModel] = create_model(  # type: ignore[call-overload]
        f"{''.join(p.title() for p in kind.split('_'))}OpSpec", __config__=_Op.model_config,
        **{kind: (spec, Field(description=text))})
    return model


LinearOpSpec = _wrapper("linear", merge_ops.LinearSpec, "A weighted sum of inputs (mergekit's linear).")
ScaleOpSpec = _wrapper("scale", merge_ops.ScaleSpec, "Each matching tensor times a factor.")
SlerpOpSpec = _wrapper("slerp", merge_ops.SlerpSpec, "Spherical interpolation of two inputs (mergekit's slerp).")
TaskArithmeticOpSpec = _wrapper("task_arithmetic", merge_ops.TaskArithmeticSpec,
                                "A base plus weighted deltas of models (mergekit's task_arithmetic).")
TiesOpSpec = _wrapper("ties", merge_ops.TaskArithmeticSpec, "TIES: trimmed deltas, sign election, disjoint mean.")
DareTiesOpSpec = _wrapper("dare_ties", merge_ops.TaskArithmeticSpec,
                          "DARE-TIES: deltas dropped at random, sign election.")
DareLinearOpSpec = _wrapper("dare_linear", merge_ops.TaskArithmeticSpec, "DARE: deltas dropped at random, summed.")
LoraFoldOpSpec = _wrapper("lora_fold", merge_ops.LoraFoldSpec, "A LoRA pair folded into its weight: W + s B @ A.")


def _op_tag(value: object) -> str | None:
    if isinstance(value, BaseModel):
        return next(iter(type(value).model_fields))
    if isinstance(value, dict) and len(value) == 1:
        key = next(iter(value))
        return key if key in OP_NAMES else None
    return None


def _known_op(value: object) -> object:
    """An entry is a one-key mapping naming a known op: said so with the valid names, not a union dump."""
    if isinstance(value, BaseModel):
        return value
    valid = "ops: " + ", ".join(OP_NAMES)
    if not isinstance(value, dict) or len(value) != 1:
        keys = ", ".join(map(str, value)) if isinstance(value, dict) else None
        raise _problem("an op entry has exactly one key, the op's name" + (f" (got {keys})" if keys else ""),
                       hint="e.g. {split: {from: ..., dim: 1, parts: 3, to: 'x.$i'}}; " + valid)
    name = next(iter(value))
    if name not in OP_NAMES:
        from ..naming.similarity import did_you_mean

        guess = did_you_mean(str(name), list(OP_NAMES))
        raise _problem(f"unknown op '{name}'", hint=(f"did you mean '{guess}'? " if guess else "") + valid)
    return value


OpSpec = Annotated[
    Annotated[SplitOpSpec, Tag("split")]
    | Annotated[ConcatOpSpec, Tag("concat")]
    | Annotated[StackOpSpec, Tag("stack")]
    | Annotated[UnstackOpSpec, Tag("unstack")]
    | Annotated[ReshapeOpSpec, Tag("reshape")]
    | Annotated[PermuteOpSpec, Tag("permute")]
    | Annotated[SliceOpSpec, Tag("slice")]
    | Annotated[RopePermuteOpSpec, Tag("rope_permute")]
    | Annotated[OffsetOpSpec, Tag("offset")]
    | Annotated[LinearOpSpec, Tag("linear")]  # type: ignore[valid-type]
    | Annotated[ScaleOpSpec, Tag("scale")]  # type: ignore[valid-type]
    | Annotated[SlerpOpSpec, Tag("slerp")]  # type: ignore[valid-type]
    | Annotated[TaskArithmeticOpSpec, Tag("task_arithmetic")]  # type: ignore[valid-type]
    | Annotated[TiesOpSpec, Tag("ties")]  # type: ignore[valid-type]
    | Annotated[DareTiesOpSpec, Tag("dare_ties")]  # type: ignore[valid-type]
    | Annotated[DareLinearOpSpec, Tag("dare_linear")]  # type: ignore[valid-type]
    | Annotated[LoraFoldOpSpec, Tag("lora_fold")],  # type: ignore[valid-type]
    Discriminator(_op_tag, custom_error_type="recipe_union", custom_error_message="expected an op"),
    BeforeValidator(_known_op),
]
"""One `ops:` entry: `{OP: {options}}`."""


def op_kind_and_spec(op: BaseModel) -> tuple[str, Any]:
    """('split', SplitSpec(...)) for an entry."""
    kind = next(iter(type(op).model_fields))
    return kind, getattr(op, kind)
