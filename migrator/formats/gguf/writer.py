"""The GGUF writer: the whole header planned from shapes, then the data one tensor at a time.

Every tensor info (name, dims, ggml type, offset) follows from the tensor's shape and its output
type, so the header is complete before any tensor is read; the data is then streamed a tensor at
a time (quantized a few MiB at a time), so peak memory does not grow with the number of tensors.

Output types: without `quantize` rules each tensor keeps its dtype (F32, F16, BF16, F64, I8..I64),
and a quantized tensor read from a GGUF file and not changed since (renames aside) keeps its stored
ggml type: its blocks are copied as they are.
`quantize` is a list of (regex, type) rules, the first whose regex is found in a tensor's name
choosing its type (F32, F16, BF16 or a quantized type in `quants.QUANTIZERS`), with llama.cpp's
conventions: 1-D tensors and norms matched by a rule are written F32, and a tensor whose rows are not a whole number of
blocks falls back as llama.cpp's does (a K-quant to Q5_0/Q5_1/Q8_0/Q4_0, else F16; `notes` says so). Non-float
tensors are never converted. `quantize` may instead name one of llama.cpp's K-quant mixes (`Q4_K_M` ...,
`mixes.py`), which chooses each tensor's type as llama-quantize does and sets `general.file_type` to the mix's.

Metadata: `header.Value`s keep their GGUF type (a GGUF source's key/values); plain strings get the
type llama.cpp gives the key (`_KEY_TYPES`), else STRING. `general.file_type` and
`general.quantization_version` are computed from the tensors written.
"""

from __future__ import annotations

import re
import struct
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import BinaryIO

from ...core import dtypes
from ...core.errors import PlanError, UnsupportedDTypeError
from ...core.scalars import Scalar
from ...core.streaming import write_all, write_computed, write_tensor, write_zeros
from ...core.tensor import LazyTensor, stored
from ...naming import NamingError, Regex, compile_regex
from ..base import Writer
from .constants import (
    ALIGNMENT_KEY,
    BY_NAME,
    DEFAULT_ALIGNMENT,
    FILE_TYPES,
    MAGIC,
    QUANTIZATION_VERSION,
    SCALAR_FORMATS,
    GGMLType,
    ValueType,
)
from .header import Value
from .mixes import BASE_TYPES, caveat, describe, fallback, is_mix, mix_types
from .mixes import FILE_TYPES as MIX_FILE_TYPES
from .quants import K_QUANTIZED, QUANTIZERS, require_kernels
from .reader import GGML_OF, Dequantized

VERSION = 3
MAX_NAME_BYTES = 63  # llama.cpp's GGML_MAX_NAME (64) with its terminating NUL
WRITABLE_TYPES = ("F32", "F16", "BF16", *sorted(QUANTIZERS), *K_QUANTIZED)
PIECE_VALUES = 1 << 21  # values quantized per streamed piece (8 MiB of F32 input)

# The GGUF type llama.cpp gives a key, by its suffix (after the architecture prefix), for metadata
# given as text (a recipe's target.metadata). Anything else is a STRING.
_KEY_TYPES: dict[str, ValueType] = {
    **{k: ValueType.UINT32 for k in (
        ".context_length", ".embedding_length", ".block_count", ".feed_forward_length", ".vocab_size",
        ".attention.head_count", ".attention.head_count_kv", ".attention.key_length", ".attention.value_length",
        ".rope.dimension_count", ".rope.scaling.original_context_length", ".attention.sliding_window",
        ".expert_count", ".expert_used_count", "general.alignment", "general.file_type",
        "general.quantization_version", "_token_id")},
    **{k: ValueType.FLOAT32 for k in (
        ".attention.layer_norm_epsilon", ".attention.layer_norm_rms_epsilon", ".rope.freq_base",
        ".rope.scaling.factor", ".attn_logit_softcapping", ".final_logit_softcapping", "adapter.lora.alpha")},
    **{k: ValueType.BOOL for k in ("add_bos_token", "add_eos_token", "add_space_prefix")},
}
_NORM = re.compile(r"norm", re.IGNORECASE)
# Keys llama.cpp reads as arrays: text cannot give them (a STRING there makes a file it refuses)
_ARRAY_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
               "tokenizer.ggml.added_tokens")
_F32_MAX = 3.4028234663852886e38


def typed(key: str, value: str) -> Value:
    """A metadata entry given as text, with the type llama.cpp gives `key` (PlanError if unparsable)."""
    if isinstance(value, Value):
        return value
    if key.startswith("split."):
        # they describe a split set's files and the writer sets them: a single file claiming
        # split.count 7 is one llama.cpp looks for 6 more files of
        raise PlanError(f"metadata '{key}': split.* key/values describe split files and are written by the "
                        "writer (a folder target with --max-shard-size); they cannot be given")
    if key in _ARRAY_KEYS:
        raise PlanError(f"metadata '{key}' is a GGUF array; it cannot be given as text (it comes from the "
                        "tokenizer files, target.tokenizer)")
    vtype = next((t for suffix, t in _KEY_TYPES.items() if key.endswith(suffix)), ValueType.STRING)
    try:
        if vtype is ValueType.UINT32:
            n = int(value)
            if not 0 <= n < 2**32:
                raise ValueError(value)
            return Value(vtype, n)
        if vtype is ValueType.FLOAT32:
            f = float(value)
            if not abs(f) <= _F32_MAX:  # NaN, inf, or inf once stored as float32 (an epsilon, a RoPE base)
                raise ValueError(value)
            return Value(vtype, f)
        if vtype is ValueType.BOOL:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(value)
            return Value(vtype, value.lower() in ("true", "1"))
    except ValueError:
        raise PlanError(f"metadata '{key}' is a GGUF {vtype.name}; '{value}' is not one") from None
    return Value(ValueType.STRING, value)


def _encode_string(s: str) -> bytes:
    try:
        raw = s.encode("utf-8", "surrogateescape")  # a GGUF source's undecodable bytes, back as they were
    except UnicodeEncodeError:
        raise PlanError(f"{s!a} cannot be written as UTF-8 (it holds a lone surrogate)") from None
    return struct.pack("<Q", len(raw)) + raw


def _encode_value(v: Value) -> bytes:
    """The value's bytes after its type tag."""
    if v.type is ValueType.STRING:
        return _encode_string(v.data)
    if v.type is not ValueType.ARRAY:
        return struct.pack(SCALAR_FORMATS[v.type][0], v.data)
    assert v.item_type is not None
    head = struct.pack("<IQ", v.item_type, len(v.data))
    if v.item_type is ValueType.STRING:
        return head + b"".join(map(_encode_string, v.data))
    if v.item_type is ValueType.ARRAY:
        return head + b"".join(map(_encode_value, v.data))  # each item: its item type, count, values
    import numpy as np

    return head + np.asarray(v.data).astype(SCALAR_FORMATS[v.item_type][1]).tobytes()


def _kv(key: str, v: Value) -> bytes:
    return _encode_string(key) + struct.pack("<I", v.type) + _encode_value(v)


class GGUFWriter(Writer):
    """Plans a GGUF file in the constructor (types, offsets, header), then streams it."""

    format = "gguf"
    default_extension = ".gguf"

    def __init__(self, tensors: Sequence[LazyTensor], *, metadata: Mapping[str, str] | None = None,
                 scalars: Mapping[str, Scalar] | None = None,
                 quantize: Sequence[tuple[str, str]] | Mapping[str, str] | str | None = None, general: bool = True,
                 types: Sequence[GGMLType] | None = None) -> None:
        """`general`: compute general.file_type / quantization_version (and note a missing architecture or
        tokenizer); a split file (`split_writers`) takes its key/values as given. `types`: each tensor's
        output type as already decided (a split file's, by the whole model's plan), else chosen here."""
        super().__init__(tensors, metadata=metadata, scalars=scalars)
        if self.scalars:
            raise PlanError(f"GGUF has no typed scalars ({', '.join(sorted(self.scalars))}); drop them "
                            "(target.scalars: none) or store them as metadata")
        meta = {k: typed(k, v) for k, v in self.metadata.items()}
        self.mix: str | None = None
        if isinstance(quantize, str):
            self.mix = quantize.upper()
            rules = self._mix_rules(self.mix, meta)
        else:
            rules = list(quantize.items() if isinstance(quantize, Mapping) else quantize or ())
        self.rules = [(_compile(pattern), _check_type(name)) for pattern, name in rules]
        self.passed_through = 0
        self.alignment = _alignment(meta)
        self.types = list(types) if types is not None else [self._output_type(t) for t in self.tensors]
        if self.rules:
            counts = Counter(g.name for g in self.types)
            self.notes.append("GGUF types written: " + ", ".join(f"{n} x {k}" for k, n in counts.most_common()))
        long = [t.name for t in self.tensors if len(t.name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES]
        if long:
            self.notes.append(f"{len(long)} tensor names are longer than {MAX_NAME_BYTES} bytes, which llama.cpp "
                              f"refuses (e.g. {long[0]!a}): rename them (remap) for llama.cpp")
        if self.passed_through:
            self.notes.append(f"{self.passed_through} quantized tensors of the GGUF source written in their stored "
                              "ggml types, block for block (a quantize rule re-quantizes them from F32)")
        seen: set[str] = set()
        for t in self.tensors:
            if t.name in seen:
                raise PlanError("two tensors have this name", tensor=t.name)
            seen.add(t.name)
        self.sizes = [_numel(t.shape) // g.block_size * g.type_size for t, g in zip(self.tensors, self.types,
                                                                                     strict=True)]
        self.offsets: list[int] = []
        pos = 0
        for size in self.sizes:
            self.offsets.append(pos)
            pos += size + (-size % self.alignment)
        self.data_size = pos
        if general:
            meta.update(self._general(meta))
        self.kv = meta
        self.header = self._header()

    # -- planning ---------------------------------------------------------------------------------

    def _output_type(self, t: LazyTensor) -> GGMLType:
        own = GGML_OF.get(t.dtype.name)
        if own is None:
            raise UnsupportedDTypeError(f"GGUF has no ggml type for {t.dtype.display}; cast it first (GGUF holds F32, "
                                        "F16, BF16, F64, I8, I16, I32, I64)", tensor=t.name)
        if len(t.shape) > 4:
            raise PlanError(f"has {len(t.shape)} dimensions; GGUF tensors have at most 4", tensor=t.name)
        chosen = next((name for regex, name in self.rules if regex.search(t.name)), None)
        stored = t.loader.gtype if isinstance(t.loader, Dequantized) else None
        if stored is not None and chosen is None:  # a GGUF source's quantized tensor, unchanged: its blocks as stored
            self.passed_through += 1
            return stored
        if chosen is None or not t.dtype.is_float or chosen == own:
            return BY_NAME[own]
        gtype = BY_NAME[chosen]
        if len(t.shape) < 2 or _NORM.search(t.name):  # llama.cpp keeps these F32 at every output type
            return BY_NAME["F32"]
        if gtype.quantized and t.shape[-1] % gtype.block_size:
            instead = fallback(chosen, t.shape[-1])
            self.notes.append(f"{t.name}: rows of {t.shape[-1]} are not a multiple of {chosen}'s block of "
                              f"{gtype.block_size}; written {instead} (as llama.cpp does)")
            return BY_NAME[instead]
        return gtype

    def _mix_rules(self, mix: str, meta: dict[str, Value]) -> list[tuple[str, str]]:
        """One exact-name rule per tensor llama-quantize would quantize under `mix`."""
        if not is_mix(mix):
            raise PlanError(f"unknown quantization mix '{mix}' (mixes: {', '.join(BASE_TYPES)})")
        floats = [(t.name, t.shape) for t in self.tensors if t.dtype.is_float]
        chosen = mix_types(mix, floats, meta)
        kept_f32 = {t.name: "F32" for t in self.tensors if t.dtype.is_float and t.name not in chosen
                    and (len(t.shape) < 2 or _NORM.search(t.name))}  # as in every GGUF llama.cpp quantizes
        self.notes.append(f"{mix}: llama.cpp's per-tensor types: {describe(chosen)} (norms and 1-D tensors F32)")
        warning = caveat(meta)
        if warning:
            self.notes.append(f"{mix}: {warning}")
        return [("^" + re.escape(name) + "$", gtype) for name, gtype in {**chosen, **kept_f32}.items()]

    def _general(self, meta: dict[str, Value]) -> dict[str, Value]:
        """general.file_type and general.quantization_version, from the types written."""
        out: dict[str, Value] = {}
        weights = Counter(g.name for t, g in zip(self.tensors, self.types, strict=True) if len(t.shape) >= 2)
        quantized = [name for name in weights if BY_NAME[name].quantized]
        main = max(quantized, key=weights.__getitem__) if quantized else (
            max(weights, key=weights.__getitem__) if weights else "F32")
        adapter = getattr(meta.get("general.type"), "data", None) == "adapter"
        if self.mix is not None:
            out["general.file_type"] = Value(ValueType.UINT32, MIX_FILE_TYPES[self.mix])
        elif main in FILE_TYPES and not adapter:  # an adapter's types are its tensors' (llama.cpp's converter)
            out["general.file_type"] = Value(ValueType.UINT32, FILE_TYPES[main])
        out["general.quantization_version"] = Value(ValueType.UINT32, QUANTIZATION_VERSION)
        if "general.architecture" not in meta:
            self.notes.append("general.architecture is not set: llama.cpp needs it (set it in target.metadata)")
        elif "tokenizer.ggml.model" not in meta and not adapter:  # an adapter runs with its base's
            self.notes.append("no tokenizer.ggml.* key/values: llama.cpp needs a tokenizer to run the model "
                              "(target.tokenizer: a SentencePiece tokenizer.model or a byte-level BPE tokenizer.json)")
        return out

    def _header(self) -> bytes:
        kv = dict(self.kv)
        ordered = ([("general.architecture", kv.pop("general.architecture"))] if "general.architecture" in kv else [])
        ordered += list(kv.items())
        parts = [MAGIC, struct.pack("<IQQ", VERSION, len(self.tensors), len(ordered))]
        parts += [_kv(k, v) for k, v in ordered]
        for t, g, offset in zip(self.tensors, self.types, self.offsets, strict=True):
            dims = t.shape[::-1] or ()
            parts.append(_encode_string(t.name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, g.code, offset))
        header = b"".join(parts)
        return header + bytes(-len(header) % self.alignment)

    @property
    def total_size(self) -> int:
        return len(self.header) + self.data_size

    def ggml_types(self) -> dict[str, str]:
        """Each tensor's output ggml type, by name (for plans and tests)."""
        return {t.name: g.name for t, g in zip(self.tensors, self.types, strict=True)}

    # -- streaming --------------------------------------------------------------------------------

    def write_to(self, sink: BinaryIO) -> None:
        write_all(sink, memoryview(self.header))
        for t, g, size in zip(self.tensors, self.types, self.sizes, strict=True):
            produced = self._produce(t, g, size)
            if produced is t or produced.span is not None:  # bytes as they lie in a file: copied, not computed
                write_tensor(sink, produced)
            else:
                write_computed(sink, produced)
            write_zeros(sink, -size % self.alignment)

    def _produce(self, t: LazyTensor, g: GGMLType, size: int) -> LazyTensor:
        """`t` itself when its bytes are written as they are, else a tensor computing the output bytes."""
        loader = t.loader
        if isinstance(loader, Dequantized) and loader.gtype is g:  # the source's blocks, verbatim
            return stored(t.name, dtypes.U8, (size,), loader.source, loader.offset, loader.length)
        if not g.quantized:
            from ...core.casts import cast

            target = dtypes.BY_NAME.get(g.name, t.dtype)
            return t if target == t.dtype else cast(t, target)
        pieces = _QuantizedPieces(t, g)
        return LazyTensor(t.name, dtypes.U8, (size,), size, pieces.whole, None, None, t.origin, pieces)


class _QuantizedPieces:
    """A float tensor's quantized bytes, made PIECE_BLOCKS blocks at a time from its F32 values."""

    def __init__(self, tensor: LazyTensor, gtype: GGMLType) -> None:
        self.tensor, self.gtype = tensor, gtype

    def __call__(self) -> Iterator[memoryview]:
        import numpy as np

        from ...core.casts import cast, source_pieces
        from .quants import quantize

        f32 = cast(self.tensor, dtypes.F32)
        step = max(1, PIECE_VALUES // self.gtype.block_size) * self.gtype.block_size * 4
        pending = b""
        for piece in source_pieces(f32, step):
            data = pending + bytes(piece) if pending else piece
            whole = len(data) - len(data) % (self.gtype.block_size * 4)
            if whole:
                yield quantize(np.frombuffer(data, dtype="<f4", count=whole // 4), self.gtype).data
            pending = bytes(memoryview(data)[whole:])
        if pending:  # the shape promised whole blocks
            raise PlanError("the tensor's values end inside a block", tensor=self.tensor.name)

    def whole(self) -> memoryview:
        return memoryview(b"".join(bytes(p) for p in self()))


def _compile(pattern: str) -> Regex:
    """A quantize rule's pattern, on RE2 as every user regex is (`naming.regex`)."""
    try:
        return compile_regex(pattern)
    except NamingError as e:
        raise PlanError(f"quantize rule '{pattern}' is not a valid regex: {e.message}") from None


def _check_type(name: str) -> str:
    if name.upper() not in WRITABLE_TYPES:
        raise PlanError(f"cannot write ggml type '{name}' (writable: {', '.join(WRITABLE_TYPES)}; "
                        f"mixes: {', '.join(BASE_TYPES)})")
    require_kernels(name.upper())
    return name.upper()


def _alignment(meta: dict[str, Value]) -> int:
    value = meta.get(ALIGNMENT_KEY)
    if value is None:
        return DEFAULT_ALIGNMENT
    a = int(value.data) if value.type is ValueType.UINT32 else 0
    if a <= 0 or a & (a - 1):
        raise PlanError(f"{ALIGNMENT_KEY} must be a UINT32 power of two, not {value}")
    return a


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n



# -- split files (llama.cpp's gguf-split layout) ------------------------------------------------------

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
MAX_SPLITS = 65535  # split.no / split.count are UINT16
SPLIT_NAME = "{stem}-{no:05d}-of-{count:05d}.gguf"


def split_writers(tensors: Sequence[LazyTensor], max_size: int, stem: str = "model", *,
                  metadata: Mapping[str, str] | None = None,
                  quantize: Sequence[tuple[str, str]] | Mapping[str, str] | str | None = None
                  ) -> tuple[list[tuple[str, GGUFWriter]], list[str]]:
    """One model as llama.cpp's gguf-split writes it: files `STEM-00001-of-0000N.gguf`, each a GGUF of its
    own tensors (in order; a new file starts when the next tensor's data would pass `max_size` bytes, so a
    tensor larger than that has a file of its own), every file carrying split.no (0-based), split.count and
    split.tensors.count (all files' tensors), the first also every other key/value. Types, general.* keys
    and notes are the whole model's, planned once. Returns ((file name, writer) per file, notes)."""
    whole = GGUFWriter(tensors, metadata=metadata, quantize=quantize)
    groups: list[list[int]] = []
    size = 0
    for i, start in enumerate(whole.offsets):
        padded = (whole.offsets[i + 1] if i + 1 < len(whole.offsets) else whole.data_size) - start
        if not groups or (size + padded > max_size and size > 0):
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += padded
    groups = groups or [[]]
    count = len(groups)
    if count > MAX_SPLITS:
        raise PlanError(f"{count} split files: GGUF counts splits in a UINT16 (at most {MAX_SPLITS}); raise the "
                        "shard size")
    total = Value(ValueType.INT32, len(whole.tensors))
    alignment = {ALIGNMENT_KEY: whole.kv[ALIGNMENT_KEY]} if ALIGNMENT_KEY in whole.kv else {}
    files = []
    for no, group in enumerate(groups):
        split = {SPLIT_NO: Value(ValueType.UINT16, no), SPLIT_COUNT: Value(ValueType.UINT16, count),
                 SPLIT_TENSORS: total}
        kv = {**whole.kv, **split} if no == 0 else {**alignment, **split}
        writer = GGUFWriter([whole.tensors[i] for i in group], metadata=kv, general=False,
                            types=[whole.types[i] for i in group])  # the whole model's choices, not re-made per file
        files.append((SPLIT_NAME.format(stem=stem, no=no + 1, count=count), writer))
    return files, list(whole.notes)
