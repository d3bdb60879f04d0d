"""Quantize a plan's Linear weights into compressed-tensors' float-quantized layout (`quantize:`).

Which tensors: a 2-D `<module>.weight` whose module is a Linear, declared (`modules:`) or inferred
(`transform.modules`; here a name holding `proj`, as DeepSeek's `q_a_proj`, also counts), and whose
module path no `ignore` regex finds. The default ignore list is compressed-tensors' usual one:
`lm_head` and the MoE routers (modules named `gate`, `router`, `shared_expert_gate`). A 2-D weight
whose module is neither a Linear nor of a known other type (Embedding, a norm...) is refused, with
the declaration that settles it: a Linear left out of the config's `ignore` would be loaded as
quantized. Everything else (embeddings, norms, biases, 3-D expert stacks) is kept as it is.

Each quantized weight becomes two streamed tensors: `<module>.weight` in F8_E4M3 and
`<module>.weight_scale` in the weight's dtype ([rows, 1], or one per 128x128 block), computed by
`core.fp8_quantize` band by band: the channel strategy reads a band of rows, the block strategy a
band of 128 rows. The scales of a band are known once the band is read; the weight's pass keeps them
for the scale tensor, which otherwise (written first, or the weight's pass not finished) reads the
weight once more for its row maxima.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core import dtypes
from ..core.errors import MigratorError, UnsupportedDTypeError
from ..core.tensor import LazyTensor
from ..formats.compressed_tensors_schemes import SCHEMES, Scheme
from ..naming import compile_regex
from .modules import ModuleResolver, declaration_hint, module_path

if TYPE_CHECKING:
    import numpy as np

DEFAULT_IGNORE: tuple[tuple[str, str], ...] = (
    (r"(?:^|\.)lm_head$", "the output head"),
    (r"(?:^|\.)(?:gate|router)$", "an MoE router"),
    (r"(?:^|\.)shared_expert_gate$", "an MoE shared-expert gate"),
)
"""(regex searched in the module path, what it is): kept unquantized unless the recipe's `ignore` says."""

BAND_BYTES = 4 << 20
"""About this many F32 bytes per band of the channel strategy (the block strategy: 128 rows)."""

_PROJ = compile_regex(r"proj")
_NOT_A_LINEAR = frozenset({"Embedding", "LayerNorm", "RmsNorm", "GroupNorm", "BatchNorm", "InstanceNorm", "PRelu",
                           "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
                           "Conv1D"})
_QUANTIZED_NAMES = ("weight_scale", "weight_scale_inv", "weight_packed", "weight_zero_point", "weight_shape")


class QuantizeError(MigratorError):
    """A weight cannot be quantized (NaN or inf values, a dtype that is not F32/BF16/F16)."""


@dataclass
class Quantization:
    """What the planner does with each tensor: `replaced[i]` the (weight, scale) of tensor i, and the
    `ignore` list of config.json (the Linear modules kept); `notes` and `fatal` for the plan."""

    scheme: Scheme
    replaced: dict[int, tuple[LazyTensor, LazyTensor]] = field(default_factory=dict)
    ignore: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fatal: list[str] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (module, why), in `ignore`'s order
    names: list[str] = field(default_factory=list)  # the weights quantized, in the plan's order

    def summary(self) -> dict[str, Any]:
        """What the run's report says (`ApplyReport.quantized`)."""
        return {"scheme": self.scheme.name, "tensors": list(self.names),
                "kept": [{"module": m, "why": w} for m, w in self.kept]}

    def op(self, weight: LazyTensor, scale: LazyTensor) -> str:
        return (f"quantize {self.scheme.name}: {weight.dtype.display} + weight_scale {list(scale.shape)} "
                f"{scale.dtype.display}")


def _listed(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


@dataclass(frozen=True)
class SourceFacts:
    """What quantizing reads of the source beside its tensors: its format (the module types its reader
    knows), its config.json (`config`: its `tie_word_embeddings`, and a `quantization_config` that says
    the source is quantized already, unless the reader `dequantized` it: then the values are quantized
    again) and that config's path for messages (`config_name`)."""

    format: str | None = None
    config: Mapping[str, Any] | None = None
    config_name: str | None = None
    dequantized: bool = False


def plan_quantization(scheme_name: str, ignore: Sequence[str] | None, tensors: Sequence[LazyTensor],
                      declared: Mapping[str, Sequence[str]], origins: Mapping[tuple[str, int], str] | None,
                      source: SourceFacts, hint_syntax: str = "recipe") -> Quantization:
    """Which of the plan's final `tensors` are quantized, and their replacements (module docstring).
    `origins`: the recipe line of each module declaration, for errors; `source`: what is read of the
    source beside its tensors."""
    scheme = SCHEMES[scheme_name]
    out = Quantization(scheme)
    config = source.config
    if config is not None and isinstance(config.get("quantization_config"), Mapping) and not source.dequantized:
        method = config["quantization_config"].get("quant_method", "?")
        out.fatal.append(f"{source.config_name}: the source is quantized already (quantization_config, quant_method "
                         f"{method}): dequantize it as it is read (--dtype BF16, or dtype: {{cast: BF16}}) to "
                         "quantize it again")
        return out
    quantized_already = [t.name for t in tensors if (t.dtype.is_float and (t.dtype.itemsize or 0) < 2
                                                     and t.dtype.name.startswith(("F8", "F6", "F4")))
                         or t.name.rpartition(".")[2] in _QUANTIZED_NAMES]
    if quantized_already:
        out.fatal.append(f"tensor '{quantized_already[0]}': the source holds quantized tensors already "
                         f"({len(quantized_already)}: FP8 values or scales): dequantize them as they are read "
                         "(--dtype BF16, or dtype: {cast: BF16}) to quantize them again")
        return out
    rules = [(compile_regex(p), f"ignore '{p}'") for p in ignore] if ignore is not None else [
        (compile_regex(p), f"default ignore: {what}") for p, what in DEFAULT_IGNORE]
    resolver = ModuleResolver(declared, [(t.name, t.shape) for t in tensors], origins, source.format)
    kept_why: dict[str, list[str]] = {}
    wanted: list[tuple[str, str, str]] = []
    names = {t.name for t in tensors}
    for i, t in enumerate(tensors):
        if not t.name.endswith(".weight") or len(t.shape) != 2:
            continue
        path = module_path(t.name)
        try:
            module = resolver.resolve(t.name)
        except MigratorError as e:
            out.fatal.append(str(e))
            continue
        linear = module.name == "Linear" or (module.name is None and _PROJ.search(path.rpartition(".")[2]) is not None)
        if module.name is not None and not linear:
            continue  # an Embedding, a norm, a conv: not quantized, and no Linear of the config's
        rule = next((why for rx, why in rules if rx.search(path)), None)
        if rule is not None:
            out.ignore.append(path)
            kept_why.setdefault(rule, []).append(path)
            continue
        if not linear:
            wanted.append(("Linear", path, "quantized"))
            continue
        if t.dtype.name not in ("F32", "BF16", "F16"):
            out.fatal.append(str(UnsupportedDTypeError(
                f"quantize {scheme.name} computes in the weight's dtype, F32, BF16 or F16, as compressed-tensors "
                f"does; this weight is {t.dtype.display} (cast it first: dtype: {{cast: F32}} / --dtype F32)",
                file=t.origin, tensor=t.name)))
            continue
        out.replaced[i] = _fp8_pair(t, scheme)
    if wanted:
        out.fatal.append(f"quantize {scheme.name}: {len(wanted)} 2-D weights belong to modules of no known type, "
                         f"which may be Linears (quantized) or not (kept): "
                         + declaration_hint(wanted, resolver.module_paths, hint_syntax)
                         + ", or add them to the quantize ignore list")
    if not out.replaced and not out.fatal and not wanted:  # compressed-tensors writes no config for that either
        out.fatal.append(f"quantize {scheme.name}: no Linear weight to quantize (none, or every one ignored: "
                         f"{', '.join(out.ignore) or 'no Linear module'})")
    tied = config is not None and config.get("tie_word_embeddings", True) is not False
    if tied and "lm_head.weight" not in names and any(n.endswith("embed_tokens.weight") for n in names) \
            and "lm_head" not in out.ignore:
        out.ignore.append("lm_head")  # transformers' tied head is a Linear of the model with no tensor of its own
        kept_why.setdefault("tied to the input embeddings (tie_word_embeddings): no tensor of its own", []).append(
            "lm_head")
    out.ignore.sort(key=_module_order)
    why_of = {p: why for why, paths in kept_why.items() for p in paths}
    out.kept = [(p, why_of[p]) for p in out.ignore]
    done = out.names = [tensors[i].name for i in sorted(out.replaced)]
    out.notes.append(f"quantize {scheme.name} (compressed-tensors {SCHEMES[scheme.name].strategy} strategy): "
                     f"{len(done)} Linear weights written F8_E4M3 with a weight_scale"
                     + (f": {_listed(done)}" if done else ""))
    for why, paths in kept_why.items():
        out.notes.append(f"quantize {scheme.name}: {len(paths)} Linear modules kept unquantized and listed in "
                         f"quantization_config.ignore ({why}): {_listed(paths)}")
    return out


def _module_order(path: str) -> tuple[Any, ...]:
    """A Hugging Face model's `named_modules` order, as compressed-tensors lists `ignore` in, guessed from the
    paths alone (a file lists its tensors sorted by name): layer numbers in numeric order, and a
    top-level head (`lm_head`, registered after the `model` it reads) after the paths inside modules."""
    return ("." not in path, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.split(".")))


def _fp8_pair(t: LazyTensor, scheme: Scheme) -> tuple[LazyTensor, LazyTensor]:
    """The F8_E4M3 weight and its weight_scale, streamed from `t`."""
    from ..ops.streams import Gathered

    source = _Fp8Source(t, scheme)
    rows, cols = t.shape
    weight = LazyTensor(t.name, dtypes.F8_E4M3, t.shape, rows * cols, Gathered(source.weight_chunks, rows * cols),
                        None, t.param_id, t.origin, source.weight_chunks)
    shape = scheme.scale_shape(t.shape)
    nbytes = t.dtype.nbytes(shape)
    assert nbytes is not None
    scale = LazyTensor(t.name + "_scale", t.dtype, shape, nbytes, source.scale_bytes, None, None, t.origin)
    return weight, scale


class _Fp8Source:
    """One weight's quantization: its bands, their scales (kept once a pass has all of them) and bytes."""

    def __init__(self, tensor: LazyTensor, scheme: Scheme) -> None:
        self.tensor, self.scheme = tensor, scheme
        _rows, cols = tensor.shape
        self.block = scheme.block[1] if scheme.block is not None else None
        self.band_rows = scheme.block[0] if scheme.block is not None else max(1, BAND_BYTES // max(1, cols * 4))
        self._scales: np.ndarray | None = None
        self._lock = threading.Lock()

    def _bands(self) -> Iterator[tuple[memoryview, int]]:
        """The weight's rows as bands of stored bytes (and their row count), front to back."""
        from ..ops.compute.bands import BandReader

        rows, cols = self.tensor.shape
        reader = BandReader(self.tensor)
        size = self.tensor.dtype.itemsize or 4
        for start in range(0, rows, self.band_rows):
            n = min(self.band_rows, rows - start)
            yield reader.read(n * cols * size), n

    def _band_scales(self, raw: memoryview, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        """A band's scales, and its F32 values when numpy computes them (None with the compiled loops)."""
        import numpy as np

        from ..core import fp8_quantize as fq
        from ..ops.compute.bands import decode

        name, cols = self.tensor.dtype.name, self.tensor.shape[1]
        values = None
        if fq.compiled(name):
            absmax = fq.absmax_raw(raw, name, n, cols, self.block or 0)
        else:
            values = decode(raw, self.tensor.dtype, dtypes.F32).reshape(n, cols)
            absmax = fq.channel_absmax(values) if self.block is None else fq.block_absmax(values, self.block)
        if not np.isfinite(absmax).all():
            raise QuantizeError("NaN or inf values cannot be quantized (their scale would be too)",
                                file=self.tensor.origin, tensor=self.tensor.name)
        return fq.scales_from_absmax(absmax, name), values

    def _quantized(self, band: tuple[memoryview, int]) -> tuple[memoryview, np.ndarray]:
        from ..core import fp8_quantize as fq

        raw, n = band
        name, cols = self.tensor.dtype.name, self.tensor.shape[1]
        scales, values = self._band_scales(raw, n)
        if values is None:
            q = fq.quantize_raw(raw, name, n, cols, scales, self.block or 0)
        else:
            per = scales if self.block is None else fq.block_columns(scales, cols, self.block)
            q = fq.quantize_band(values, per, name)
        return q.reshape(-1).view("uint8").data, scales

    def weight_chunks(self) -> Iterator[memoryview]:
        import numpy as np

        from ..ops.compute.bands import over_bands

        seen: list[np.ndarray] = []
        for data, scales in over_bands(self._quantized, self._bands()):
            seen.append(scales)
            yield data
        with self._lock:
            if self._scales is None and seen:
                self._scales = np.concatenate(seen)

    def scales(self) -> np.ndarray:
        import numpy as np

        with self._lock:
            if self._scales is None:
                parts = [self._band_scales(raw, n)[0] for raw, n in self._bands()]
                self._scales = np.concatenate(parts) if parts else np.zeros(
                    self.scheme.scale_shape(self.tensor.shape), dtype=np.float32)
            return self._scales

    def scale_bytes(self) -> memoryview:
        """The weight_scale's bytes in the weight's dtype (the F32 scales hold values of it exactly)."""
        from ..core import fp8_quantize as fq

        values = self.scales().astype(fq.np_dtype(self.tensor.dtype.name))
        return values.reshape(-1).view("uint8").data
