"""Adapters with Burn's semantics (docs/burn-compatibility.md, "Module types and adapters"), applied file
to file.

An adapter turns one tensor (plus its module type, see `modules`) into an `Adapted` tensor: maybe
renamed (last segment only), maybe transposed or cast — lazily, as ops wrapped around the loader,
so a plan costs no tensor bytes. Burn decides from the live module's container stack; here the
module type comes from the recipe's ``modules:`` or from inference, and where Burn's decision
would depend on a type migrator does not know, the adapter raises `AdapterError` instead of
guessing (Burn itself would silently leave such a tensor unchanged).

When an adapter needs the module type:

* ``pytorch_to_burn``: a rank-2 ``weight`` (Linear -> transpose, anything else -> keep); a 1-D
  ``weight``/``bias`` unless the siblings rule out a norm layer (norm -> rename to gamma/beta).
* ``burn_to_pytorch``: a rank-2 ``weight``; a 1-D ``gamma``/``beta`` unless the siblings rule out a
  norm layer.
* ``Conv1D`` (GPT-2's, ``[in, out]``, already Burn's Linear layout) is kept as stored by both layout
  adapters; ``half_precision`` converts it when its set holds Linear (in Burn it is a Linear).
* ``half_precision``: every F32/F16 tensor (convert only in the module set). Burn leaves a tensor
  with no container unchanged; a file has no containers at all, so an unresolved type is an error
  here rather than a silent "keep F32".
* ``float_cast`` and ``identity``: never.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from ..core import dtypes
from ..core.casts import CASTABLE, cast, transpose2d
from ..core.dtypes import DType
from ..core.errors import MigratorError
from ..core.tensor import LazyTensor
from ..recipe import adapter_names
from ..recipe.adapter_names import DEFAULT_HALF_PRECISION_MODULES, half_precision_module_set
from .modules import CONV1D, AdapterError, ModuleType, exact_regex, module_path, qualify, yaml_quoted

__all__ = [
    "DEFAULT_HALF_PRECISION_MODULES", "NORM_MODULES", "Adapted", "Adapter", "AdapterError", "BurnToPyTorchAdapter",
    "ChainAdapter", "FloatCastAdapter", "HalfPrecisionAdapter", "IdentityAdapter", "PyTorchToBurnAdapter",
    "build_adapter", "half_precision_module_set",
]

LINEAR = "Struct:Linear"
NORM_MODULES: frozenset[str] = frozenset({"Struct:BatchNorm", "Struct:LayerNorm", "Struct:GroupNorm", "Struct:RmsNorm"})
"""Module types whose weight/bias Burn renames to gamma/beta (not InstanceNorm: Burn's code does not)."""

@dataclass(frozen=True)
class Adapted:
    """An adapter's result: the (lazy) tensor and what was done to it, for `migrate plan`."""

    tensor: LazyTensor
    ops: tuple[str, ...] = ()


@runtime_checkable
class Adapter(Protocol):
    name: str

    def adapt(self, tensor: LazyTensor, module: ModuleType) -> Adapted: ...

    def alternative_name(self, param: str, module: ModuleType) -> str | None: ...


def _with_param(tensor: LazyTensor, param: str) -> LazyTensor:
    path = module_path(tensor.name)
    return tensor.renamed(f"{path}.{param}" if path else param)


def _dims(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


_OPS_TEXTS: dict[tuple[object, ...], tuple[str, ...]] = {}
"""Ops texts by what they say: models repeat a few shapes thousands of times, so format each once."""
_OPS_TEXTS_MAX = 4096


def _transpose_ops(before: tuple[int, ...], after: tuple[int, ...]) -> tuple[str, ...]:
    key = ("transpose", before, after)
    text = _OPS_TEXTS.get(key)
    if text is None:
        text = (f"transpose {_dims(before)} -> {_dims(after)}",)
        if len(_OPS_TEXTS) < _OPS_TEXTS_MAX:  # bounded: a long-lived process may see many shapes
            _OPS_TEXTS[key] = text
    return text


def _rename_ops(param: str, new: str) -> tuple[str, ...]:
    key = ("rename", param, new)
    text = _OPS_TEXTS.get(key)
    if text is None:
        text = _OPS_TEXTS[key] = (f"rename {param} -> {new}",)
    return text


def _entry(tensor: LazyTensor, type_name: str) -> str:
    """A ``modules:`` entry to paste that matches exactly this tensor's module, nothing else."""
    return f"modules: {{{type_name}: [{yaml_quoted(exact_regex(module_path(tensor.name)))}]}}"


def _declare_hint(tensor: LazyTensor, type_name: str, others: str) -> str:
    return f"declare its type in the recipe, e.g. {_entry(tensor, type_name)} ({others})"


_WHAT_IT_DOES = {"Linear": "transposed", "Conv1D": "GPT-2's Conv1D, kept as stored",
                 "Embedding": "kept"}


class IdentityAdapter:
    """Burn's IdentityAdapter: every tensor unchanged, no alternative names."""

    name = "identity"

    def adapt(self, tensor: LazyTensor, module: ModuleType) -> Adapted:
        return Adapted(tensor)

    def alternative_name(self, param: str, module: ModuleType) -> str | None:
        return None


class _LayoutAdapter:
    """Shared rules of PyTorchToBurn and BurnToPyTorch (transpose Linear weights, rename norm
    gamma/beta); only the rename direction differs."""

    name: str
    renames: ClassVar[dict[str, str]]  # applied by adapt on norm modules
    alternatives: ClassVar[dict[str, str]]  # tried on load when the exact name is missing
    expected_layout: str  # the Linear weight layout this direction reads
    source_side: str

    def adapt(self, tensor: LazyTensor, module: ModuleType) -> Adapted:
        param = tensor.name.rpartition(".")[2]
        qualified = module.qualified
        if qualified is None:
            self._check_unneeded(tensor, module, param, len(tensor.shape))
            return Adapted(tensor)
        if qualified == LINEAR and param == "weight" and len(tensor.shape) == 2:
            if module.weight_layout is not None and module.weight_layout != self.expected_layout:
                have = "[in, out] (Burn's layout)" if module.weight_layout == "in_out" else "[out, in] (PyTorch's)"
                if module.weight_layout == "in_out":  # what GPT-2's Conv1D stores, in either file
                    advice = (f"if this is GPT-2's Conv1D, declare {_entry(tensor, 'Conv1D')} (kept as stored); "
                              "any other type name but Linear also keeps it")
                else:
                    advice = f"it is not a {self.source_side} Linear: declare the module's real type in modules:"
                raise AdapterError(
                    f"{self.name}: Linear weight {_dims(tensor.shape)} already looks {have}: its bias matches "
                    f"the other dimension; transposing would break the layer; {advice}", tensor=tensor.name)
            out = transpose2d(tensor)
            return Adapted(out, _transpose_ops(tensor.shape, out.shape))
        if qualified in NORM_MODULES and param in self.renames:
            if len(tensor.shape) != 1:  # the resolver refuses such modules; no rename ever passes unchecked
                raise AdapterError(f"{self.name}: a {module.name}'s {param} is 1-D, this one is "
                                   f"{_dims(tensor.shape)} ({module.how}: {module.reason})", tensor=tensor.name)
            new = self.renames[param]
            return Adapted(_with_param(tensor, new), _rename_ops(param, new))
        return Adapted(tensor)

    def _check_unneeded(self, tensor: LazyTensor, module: ModuleType, param: str, rank: int) -> None:
        """Raise when the unresolved type would change the outcome; otherwise Burn keeps the tensor."""
        if param == "weight" and rank == 2:
            fitting = self._fitting(module)
            one = fitting[0] if fitting is not None and len(fitting) == 1 else None
            # one answer: the plan gives one declaration for every such module (modules.declaration_hint)
            hint = (f"declare it {one} ({_WHAT_IT_DOES[one]}): one declaration for all such modules follows"
                    if one is not None else self._two_d_hint(tensor, module))
            error = AdapterError(
                f"{self.name} must know if this 2-D weight is a Linear's (transpose) or not (e.g. an "
                f"Embedding's: keep), but its module type is unresolved: {module.reason}; {hint}",
                tensor=tensor.name)
            if one is not None:
                error.declare = (one, module_path(tensor.name), _WHAT_IT_DOES[one])
            raise error
        if param in self.renames and rank == 1 and not module.norm_excluded:
            raise AdapterError(
                f"{self.name} must know if this is a norm layer's {param} (rename to {self.renames[param]}) "
                f"or not (keep), but its module type is unresolved: {module.reason}; "
                f"{_declare_hint(tensor, 'LayerNorm', 'or GroupNorm, RmsNorm: the same here; other types keep it')}",
                tensor=tensor.name)

    def _fitting(self, module: ModuleType) -> list[str] | None:
        """The types that fit the module's tensors and this direction (None: not worked out)."""
        if module.candidates is None:
            return None
        return [t for t in module.candidates
                if not (t == "Linear" and module.weight_layout not in (None, self.expected_layout))]

    def _two_d_hint(self, tensor: LazyTensor, module: ModuleType) -> str:
        """Only the types that fit the module's tensors and this direction: never one that would write
        wrong weights (a Linear whose bias shows the other layout; GPT-2's square c_proj as a Linear)."""
        fitting = self._fitting(module)
        if fitting is None:  # not worked out by the resolver: the generic choice
            return _declare_hint(tensor, "Linear", "or Embedding, or any other type name, to keep it")
        if not fitting:
            return ("no module type migrator knows fits these tensors; check the names (a remap gone wrong?) "
                    "or declare a type name of your own to keep them as they are")
        if len(fitting) == 1:
            return f"declare its type in the recipe: {_entry(tensor, fitting[0])} ({_WHAT_IT_DOES[fitting[0]]})"
        return "declare its type in the recipe, one of: " + "; ".join(
            f"{_entry(tensor, t)} ({_WHAT_IT_DOES[t]})" for t in fitting)

    def alternative_name(self, param: str, module: ModuleType) -> str | None:
        if module.qualified in NORM_MODULES:
            return self.alternatives.get(param)
        return None


class PyTorchToBurnAdapter(_LayoutAdapter):
    """PyTorch -> Burn: Linear weight [out, in] -> [in, out]; norm weight/bias -> gamma/beta."""

    name = "pytorch_to_burn"
    renames: ClassVar[dict[str, str]] = {"weight": "gamma", "bias": "beta"}
    alternatives: ClassVar[dict[str, str]] = {"gamma": "weight", "beta": "bias"}
    expected_layout = "out_in"
    source_side = "PyTorch"


class BurnToPyTorchAdapter(_LayoutAdapter):
    """Burn -> PyTorch: Linear weight [in, out] -> [out, in]; norm gamma/beta -> weight/bias."""

    name = "burn_to_pytorch"
    renames: ClassVar[dict[str, str]] = {"gamma": "weight", "beta": "bias"}
    alternatives: ClassVar[dict[str, str]] = {"weight": "gamma", "bias": "beta"}
    expected_layout = "in_out"
    source_side = "Burn"


_HALF_DTYPES = {"F32": dtypes.F16, "F16": dtypes.F32}


class HalfPrecisionAdapter:
    """Burn's HalfPrecisionAdapter: F32 <-> F16 (direction from the tensor's dtype) in a module set."""

    name = "half_precision"

    def __init__(self, modules: Iterable[str] = DEFAULT_HALF_PRECISION_MODULES) -> None:
        self.modules = frozenset(qualify(m) for m in modules)

    def adapt(self, tensor: LazyTensor, module: ModuleType) -> Adapted:
        target = _HALF_DTYPES.get(tensor.dtype.name)
        if target is None:  # F64, BF16, Flex32, ints, bools, QFloat: unchanged, whatever the module
            return Adapted(tensor)
        qualified = module.qualified
        if qualified is None:
            raise AdapterError(
                f"half_precision converts {tensor.dtype.display} tensors only in modules of types "
                f"{', '.join(sorted(m.removeprefix('Struct:') for m in self.modules))}, but this tensor's module "
                f"type is unresolved: {module.reason}; declare its type in the recipe: a type name of your own, "
                f"e.g. {_entry(tensor, 'Kept')}, keeps it as it is, as Burn keeps a tensor outside the set; a "
                f"type in the set that fits the module's tensors converts it", tensor=tensor.name)
        if qualified == CONV1D:  # GPT-2's Conv1D is a Linear in Burn, and converts when Linear does
            qualified = LINEAR
        if qualified not in self.modules:
            return Adapted(tensor)
        return Adapted(cast(tensor, target), (f"cast {tensor.dtype.display} -> {target.display}",))

    def alternative_name(self, param: str, module: ModuleType) -> str | None:
        return None


class FloatCastAdapter:
    """Burn's FloatCastAdapter: every float tensor not already `to` is cast, whatever its module."""

    name = "float_cast"

    def __init__(self, to: DType) -> None:
        if not to.is_float:
            raise AdapterError(f"float_cast target must be a float dtype, got {to.display}")
        if to.name not in CASTABLE:
            raise AdapterError(f"float_cast target must be one of Burn's float dtypes "
                               f"(F64, F32, Flex32, F16, BF16), got {to.display}")
        self.to = to

    def adapt(self, tensor: LazyTensor, module: ModuleType) -> Adapted:
        if not tensor.dtype.is_float or tensor.dtype == self.to:
            return Adapted(tensor)
        return Adapted(cast(tensor, self.to), (f"cast {tensor.dtype.display} -> {self.to.display}",))

    def alternative_name(self, param: str, module: ModuleType) -> str | None:
        return None


class ChainAdapter:
    """Burn's ChainAdapter over several adapters, in order (a.chain(b).chain(c)...)."""

    def __init__(self, adapters: Sequence[Adapter]) -> None:
        self.adapters = tuple(adapters)
        self.name = " -> ".join(a.name for a in self.adapters) or "identity"

    def adapt(self, tensor: LazyTensor, module: ModuleType) -> Adapted:
        ops: list[str] = []
        for a in self.adapters:
            step = a.adapt(tensor, module)
            tensor = step.tensor
            ops.extend(step.ops)
        return Adapted(tensor, tuple(ops))

    def alternative_name(self, param: str, module: ModuleType) -> str | None:
        """Burn's chain, folded left: the first adapter's answer goes to the next; each adapter is
        consulted exactly once."""
        if not self.adapters:
            return None
        current = self.adapters[0].alternative_name(param, module)
        for b in self.adapters[1:]:
            if current is not None:
                further = b.alternative_name(current, module)
                current = further if further is not None else current
            else:
                current = b.alternative_name(param, module)
        return current


NAMED_ADAPTERS: dict[str, type[Adapter]] = {
    "identity": IdentityAdapter, "pytorch_to_burn": PyTorchToBurnAdapter, "burn_to_pytorch": BurnToPyTorchAdapter,
    "half_precision": HalfPrecisionAdapter,
}
"""The class of each adapter `adapter_names.NAMED` lists (tests check the two agree)."""


def _one(spec: Any) -> Adapter:
    from ..recipe.model import FloatCastSpec, HalfPrecisionSpec

    if isinstance(spec, str):
        if spec not in NAMED_ADAPTERS:
            raise AdapterError(f"unknown adapter '{spec}' (known: {', '.join(adapter_names.ALL)})")
        return NAMED_ADAPTERS[spec]()
    if isinstance(spec, HalfPrecisionSpec):
        options = spec.half_precision
        try:
            return HalfPrecisionAdapter(half_precision_module_set(options.with_, options.without))
        except ValueError as e:
            raise AdapterError(f"half_precision: {e}") from None
    if isinstance(spec, FloatCastSpec):
        try:
            to = dtypes.parse(spec.float_cast.to)
        except MigratorError as e:
            raise AdapterError(f"float_cast: {e.detail}") from None
        return FloatCastAdapter(to)
    if isinstance(spec, Adapter):
        return spec
    raise AdapterError(f"not an adapter spec: {spec!r}")


def build_adapter(specs: Sequence[Any]) -> Adapter:
    """The recipe's `adapters:` list as one adapter, chained in order; [] is the identity."""
    built = [_one(s) for s in specs]
    if not built:
        return IdentityAdapter()
    if len(built) == 1:
        return built[0]
    return ChainAdapter(built)
