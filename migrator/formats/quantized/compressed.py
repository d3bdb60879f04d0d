"""compressed-tensors checkpoints (`quant_method: compressed-tensors`): what every format of it shares
(the config groups, their targets and `ignore`), and the `float-quantized` format.

A config group says which modules it `targets` (module names, `re:` regexes, or a class name such as
`Linear`, which a checkpoint cannot show: compressed-tensors' own checkpoint tools take every module
then, and so does migrator), and how their `weights` and `input_activations` are quantized. `ignore`
removes modules, by the same rule (`declared.ct_matches`: `re:` is `re.match`, else the exact name).

`float-quantized` (FP8 W8A8: RedHat/NeuralMagic `-FP8-Dynamic`, `-FP8`, `FP8_BLOCK`): each quantized
module `M` stores `M.weight` as F8_E4M3 and `M.weight_scale` (strategy `tensor`: one value; `channel`:
one per row, shape [rows, 1]; `block`: one per `block_structure` block, the grid cropped); a static
activation scheme adds `M.input_scale`, consumed with the weight. Dequantized as compressed-tensors'
`dequantize` does: code and scale in the scale's dtype, product rounded to it, then cast to the output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .blocks import FLOAT_SCALES, check_scales, e4m3_values, expanded, grid, scale_values
from .declared import CONFIG_KEY, ct_any, ct_matches, module_of, string_list
from .scheme import Band, QuantizationError, QuantizedWeight, Scheme

if TYPE_CHECKING:
    import numpy as np

    from ...core.tensor import LazyTensor


@dataclass(frozen=True)
class Group:
    """One config group: its name, targets and the quantization arguments it gives."""

    name: str
    targets: tuple[str, ...]
    weights: Mapping[str, Any] | None
    input_activations: Mapping[str, Any] | None
    output_activations: Mapping[str, Any] | None

    def names_module(self, module: str) -> bool:
        """A target that names `module` (its name or a `re:` regex)."""
        return any(ct_matches(module, t) for t in self.targets if t.startswith("re:") or "." in t)

    @property
    def by_class(self) -> bool:
        """A target that is a class name (`Linear`): every module, as far as a checkpoint shows."""
        return any(not t.startswith("re:") and "." not in t for t in self.targets)


class CompressedTensors(Scheme):
    """What every compressed-tensors format shares: parsing the groups, matching modules to them."""

    method = "compressed-tensors"
    scale_suffix = "weight_scale"
    weight_suffix = "weight"

    def __init__(self, config: Mapping[str, Any], file: str, *, fmt: str, groups: list[Group],
                 ignore: list[str]) -> None:
        super().__init__(config, file)
        self.format, self.groups, self.ignore = fmt, groups, ignore

    @classmethod
    def parse(cls, config: Mapping[str, Any], file: str) -> CompressedTensors:
        fmt = config.get("format")
        groups_value = config.get("config_groups")
        if not isinstance(groups_value, Mapping) or not groups_value:
            raise QuantizationError(f"{CONFIG_KEY}.config_groups must name at least one group", file=file)
        status = config.get("quantization_status", "compressed")
        if status != "compressed":
            raise QuantizationError(f"{CONFIG_KEY}.quantization_status '{status}': only a compressed checkpoint's "
                                    "weights are stored quantized", file=file)
        if config.get("kv_cache_scheme") is not None:
            raise QuantizationError(f"{CONFIG_KEY}.kv_cache_scheme: a quantized KV cache's scales are not read",
                                    file=file)
        groups = []
        for name, g in groups_value.items():
            where = f"{CONFIG_KEY}.config_groups.{name}"
            if not isinstance(g, Mapping):
                raise QuantizationError(f"{where} must be an object", file=file)
            targets = string_list(g, "targets", file, where)
            if not targets:
                raise QuantizationError(f"{where}.targets names no module", file=file)
            args = {k: g.get(k) for k in ("weights", "input_activations", "output_activations")}
            for k, v in args.items():
                if v is not None and not isinstance(v, Mapping):
                    raise QuantizationError(f"{where}.{k} must be an object or null", file=file)
            groups.append(Group(str(name), tuple(targets), args["weights"], args["input_activations"],
                                args["output_activations"]))
        ignore = string_list(config, "ignore", file)
        scheme = cls(config, file, fmt=str(fmt or cls.formats[0]), groups=groups, ignore=ignore)
        for g in groups:
            if g.weights is not None:
                scheme.check_args(g, f"{CONFIG_KEY}.config_groups.{g.name}.weights")
        return scheme

    def check_args(self, group: Group, where: str) -> None:
        """Refuse weight arguments this format does not read (`QuantizationError` naming `where`)."""

    def skipped(self) -> list[str]:
        return self.ignore

    def group_of(self, module: str, origin: str | None, tensor: str) -> Group | None:
        """The group whose weights quantize `module`: one naming it, else one targeting a class; None
        when `ignore` removes it or no group targets it."""
        if ct_any(module, self.ignore):
            return None
        named = [g for g in self.groups if g.weights is not None and g.names_module(module)]
        if len(named) > 1:
            raise QuantizationError(f"module '{module}' is targeted by config groups {', '.join(g.name for g in named)}"
                                    f" of {self.file}: one group per module", file=origin, tensor=tensor)
        if named:
            return named[0]
        by_class = [g for g in self.groups if g.weights is not None and g.by_class]
        return by_class[0] if by_class else None

    def weights(self, tensors: Mapping[str, LazyTensor]) -> list[QuantizedWeight]:
        found: list[QuantizedWeight] = []
        claimed: set[str] = set()
        suffix = "." + self.scale_suffix
        for t in tensors.values():
            if not t.name.endswith(suffix):
                continue
            module = module_of(t.name)
            weight = tensors.get(f"{module}.{self.weight_suffix}")
            if weight is None:
                raise QuantizationError(f"a {self.scale_suffix} without its weight: '{module}.{self.weight_suffix}' "
                                        "is not in the checkpoint", file=t.origin, tensor=t.name)
            if ct_any(module, self.ignore):
                raise QuantizationError(f"module '{module}' is in the ignore list of {self.file}, yet it stores a "
                                        f"{self.scale_suffix}", file=t.origin, tensor=t.name)
            group = self.group_of(module, t.origin, t.name)
            if group is None:
                raise QuantizationError(f"no config group of {self.file} targets module '{module}', yet it stores a "
                                        f"{self.scale_suffix}", file=t.origin, tensor=t.name)
            w = self.quantized(module, group, weight, t, tensors)
            found.append(w)
            claimed.update(w.stored())
        order = {name: i for i, name in enumerate(tensors)}
        found.sort(key=lambda w: order[next(iter(w.parts.values()))])
        self.unclaimed(tensors, claimed)
        return found

    def unclaimed(self, tensors: Mapping[str, LazyTensor], claimed: set[str]) -> None:
        """Refuse a stored tensor the declaration says is quantized that no weight took: a weight a group
        names (or of a quantized dtype) without its scale."""
        for t in tensors.values():
            if t.name in claimed or not t.name.endswith("." + self.weight_suffix):
                continue
            module = module_of(t.name)
            if ct_any(module, self.ignore):
                continue
            named = any(g.weights is not None and g.names_module(module) for g in self.groups)
            if named or self.looks_quantized(t):
                raise QuantizationError(f"'{module}.{self.scale_suffix}' is not in the checkpoint, yet {self.file} "
                                        "declares this module quantized", file=t.origin, tensor=t.name)

    def looks_quantized(self, t: LazyTensor) -> bool:
        """Whether a stored weight's dtype is one only a quantized weight has (no float model stores it)."""
        return False

    def quantized(self, module: str, group: Group, weight: LazyTensor, scale: LazyTensor,
                  tensors: Mapping[str, LazyTensor]) -> QuantizedWeight:
        """The quantized weight of `module` (its group, weight and scale), checked."""
        raise NotImplementedError

    def activation_scales(self, module: str, group: Group, weight: LazyTensor,
                          tensors: Mapping[str, LazyTensor]) -> tuple[str, ...]:
        """The static activations' scales the module stores (consumed); refused when the group's
        declaration disagrees (static without one, dynamic with one)."""
        out = []
        for kind, name in (("input_activations", "input_scale"), ("output_activations", "output_scale")):
            args = getattr(group, kind)
            stored = f"{module}.{name}" in tensors
            static = args is not None and not args.get("dynamic", False)
            if static and not stored:
                raise QuantizationError(f"config group {group.name} declares static {kind}, but '{module}.{name}' is "
                                        "not in the checkpoint", file=weight.origin, tensor=weight.name)
            if stored and not static:
                raise QuantizationError(f"'{module}.{name}' is stored, but config group {group.name} declares no "
                                        f"static {kind}", file=weight.origin, tensor=weight.name)
            if stored:
                out.append(f"{module}.{name}")
        zero = f"{module}.weight_zero_point"
        if zero in tensors:
            raise QuantizationError(f"'{zero}': asymmetric weights (with zero points) are not read in this format",
                                    file=weight.origin, tensor=weight.name)
        return tuple(out)


class FloatQuantized(CompressedTensors, name="compressed-tensors float-quantized"):
    formats = ("float-quantized",)

    def describe(self) -> str:
        strategies = sorted({str(g.weights.get("strategy")) for g in self.groups if g.weights is not None})
        return f"compressed-tensors float-quantized (F8_E4M3 weights, {', '.join(strategies)} scales)"

    def check_args(self, group: Group, where: str) -> None:
        w = group.weights
        assert w is not None
        if w.get("num_bits") != 8 or w.get("type") != "float":
            raise QuantizationError(f"{where}: num_bits {w.get('num_bits')}, type {w.get('type')}: float-quantized "
                                    "weights are read as 8-bit floats", file=self.file)
        if w.get("symmetric", True) is not True:
            raise QuantizationError(f"{where}.symmetric false: asymmetric float weights are not read", file=self.file)
        if w.get("dynamic", False):
            raise QuantizationError(f"{where}.dynamic true: a stored weight's scales are static", file=self.file)
        strategy = w.get("strategy")
        if strategy not in ("tensor", "channel", "block"):
            raise QuantizationError(f"{where}.strategy '{strategy}': float-quantized weights are read with tensor, "
                                    "channel or block scales", file=self.file)
        if strategy == "block":
            b = w.get("block_structure")
            if (not isinstance(b, list) or len(b) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in b)):
                raise QuantizationError(f"{where}.block_structure must be two positive integers, not {b!r}",
                                        file=self.file)

    def looks_quantized(self, t: LazyTensor) -> bool:
        return t.dtype.name == "F8_E4M3"

    def quantized(self, module: str, group: Group, weight: LazyTensor, scale: LazyTensor,
                  tensors: Mapping[str, LazyTensor]) -> QuantizedWeight:
        args = group.weights
        assert args is not None
        if weight.dtype.name != "F8_E4M3":
            raise QuantizationError(f"is {weight.dtype.display}, but config group {group.name} declares 8-bit float "
                                    "weights (F8_E4M3)", file=weight.origin, tensor=weight.name)
        if len(weight.shape) != 2:
            raise QuantizationError(f"shape {list(weight.shape)}: a float-quantized weight is a 2-D matrix",
                                    file=weight.origin, tensor=weight.name)
        if scale.dtype.name not in FLOAT_SCALES:
            raise QuantizationError(f"scales are {scale.dtype.display}: F32, BF16 or F16 expected", file=scale.origin,
                                    tensor=scale.name)
        rows, cols = weight.shape
        strategy = args["strategy"]
        block: tuple[int, int]
        if strategy == "tensor":
            block, ok, want = (rows, cols), scale.numel == 1, "one scale (strategy tensor)"
        elif strategy == "channel":
            block, ok, want = (1, cols), tuple(scale.shape) == (rows, 1), f"[{rows}, 1] (strategy channel)"
        else:
            bh, bw = args["block_structure"]
            block = (bh, bw)
            expected = grid(tuple(weight.shape), block)
            ok = tuple(scale.shape) == expected
            want = f"{list(expected)}: weight {list(weight.shape)} in blocks of {[bh, bw]}, the last ones cropped"
        if not ok:
            raise QuantizationError(f"scale shape {list(scale.shape)} disagrees with the blocks: expected {want}",
                                    file=scale.origin, tensor=scale.name)
        consumed = self.activation_scales(module, group, weight, tensors)
        return QuantizedWeight(weight.name, tuple(weight.shape), {"weight": weight.name, "scale": scale.name},
                               consumed=consumed, info={"block": block, "scale_dtype": scale.dtype,
                                                        "strategy": strategy})

    def row_step(self, weight: QuantizedWeight) -> int:
        return int(weight.info["block"][0]) if weight.info["strategy"] == "block" else 1

    def check(self, weight: QuantizedWeight, whole: Mapping[str, np.ndarray]) -> None:
        check_scales(scale_values(whole["scale"], weight.info["scale_dtype"]), weight.parts["scale"], None)

    def dequantize(self, weight: QuantizedWeight, band: Band) -> np.ndarray:
        from ...core.casts import rounded_f32

        dtype = weight.info["scale_dtype"]
        scales = scale_values(band.parts["scale"], dtype)
        values = e4m3_values(band.parts["weight"]).reshape(band.stop - band.start, weight.columns)
        if scales.size == 1:
            values *= scales.reshape(())
        else:
            values *= expanded(scales.reshape(-1, scales.shape[-1]), band.start, band.stop, weight.shape[0],
                               weight.info["block"], weight.columns)
        # compressed-tensors multiplies in the scale's dtype: an F16/BF16 product is rounded to it first
        return rounded_f32(values, dtype)

