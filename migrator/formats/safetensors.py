"""SafeTensors: an 8-byte little-endian header length N, N bytes of JSON, then the tensor data.

The reader parses and validates the header itself (no `safetensors` import) so that every rule the
library enforces fails with a typed error naming the file and tensor, sizes are checked before
anything is allocated, and tensor data stays lazy, zero-copy views of the source.

The writer reproduces the library's output byte for byte (tensor order, compact JSON, space padding)
so a file we write is indistinguishable from one `safetensors.numpy.save_file` writes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping, Sequence
from itertools import accumulate, chain, islice, repeat
from operator import add, itemgetter, lt, sub
from typing import Any, BinaryIO, ClassVar, Literal

from ..core import dtypes
from ..core.bytesource import ByteSource
from ..core.dtypes import DType
from ..core.errors import FormatError, LimitExceededError, PlanError, UnsupportedDTypeError
from ..core.limits import DEFAULT_LIMITS, Limits
from ..core.scalars import Scalar
from ..core.streaming import Ahead, write_all, write_tensor
from ..core.tensor import LazyTensor, stored, stored_many
from .base import (
    Reader,
    Writer,
    WriterKind,
    check_u64_sizes,
    distinct_str_names,
    get_dtype,
    get_name,
    get_nbytes,
    lengths_match,
    shapes_of,
    utf8_ok,
)
from .bounded_json import check_json_budget

MAX_HEADER_SIZE = 100_000_000  # the library's limit: the writer makes no larger header (the reader: Limits)
METADATA_KEY = "__metadata__"
_ENTRY_FIELDS = ("dtype", "shape", "data_offsets")
_U64_MAX = 2**64 - 1

# The library's `Dtype` enum order; it writes tensors by this rank descending, then by name.
LIBRARY_DTYPE_ORDER: tuple[str, ...] = (
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16",
    "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64",
)
_RANK = {name: i for i, name in enumerate(LIBRARY_DTYPE_ORDER)}

# Burn-only dtypes SafeTensors has no name for, written with the name Burn gives them
# (docs/burn-compatibility.md, "PyTorch and SafeTensors files").
_BURN_ALIASES: dict[str, str] = {"FLEX32": "F32", "BOOL_U8": "U8", "BOOL_U32": "U32"}


def safetensors_name(dtype: DType, tensor: str | None = None) -> str:
    """The dtype string a SafeTensors header uses for `dtype`, or UnsupportedDTypeError."""
    if dtype.safetensors:
        return dtype.safetensors
    alias = _BURN_ALIASES.get(dtype.name)
    if alias:
        return alias
    raise UnsupportedDTypeError(
        f"SafeTensors cannot hold dtype {dtype.display} (it has no SafeTensors name); cast it first",
        tensor=tensor,
    )


# -- checks in bulk ---------------------------------------------------------------------------------
# One parser: json.loads. A header is then checked either entry by entry (`_parse`, `_layout`: every
# rule, every error message) or, when it has the common shape (each entry's fields in the order
# dtype, shape, data_offsets), column by column with C-level passes over the parsed values and one
# computation per distinct (dtype, shape). The bulk checks accept exactly what the per-entry checks
# accept and build the same tensors; on any doubt they return None, and the per-entry checks decide
# and explain. tools/fuzz.py --differential compares the two on mutated headers.

_FIRST, _SECOND = itemgetter(0), itemgetter(1)

# metadata; per tensor in data order its name and (dtype, shape, nbytes); data_start, then each tensor's end
_FastHeader = tuple[dict[str, str], list[str], list[tuple[DType, tuple[int, ...], int]], list[int]]


def _bulk_metadata(value: object) -> dict[str, str] | None:
    if value is None:
        return {}
    if type(value) is not _Pairs:
        return None
    metadata = dict(value)
    if len(metadata) != len(value) or not set(map(type, metadata.values())) <= {str}:
        return None
    return metadata


def _bulk_size(dtype: DType, shape: tuple[int, ...]) -> int | None:
    """Byte length of a [shape] tensor of dtype, or None where `_entry`/`_layout` would refuse it."""
    assert dtype.bits is not None
    numel = 1
    for d in shape:
        if d < 0 or d > _U64_MAX:
            return None
        numel *= d
        if numel > _U64_MAX:
            return None
    bits = numel * dtype.bits
    return None if bits > _U64_MAX or bits % 8 else bits // 8


class _Pairs(list):
    """A JSON object kept as its (key, value) pairs, so duplicate keys stay visible."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _is_uint(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _kind(v: object) -> str:
    if isinstance(v, _Pairs):
        return "an object"
    if isinstance(v, list):
        return "an array"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, str):
        return "a string"
    return "a number"


class SafetensorsReader(Reader):
    """A validated SafeTensors header; tensors are lazy views of `source` in data order.

    `top_level_key="model"` keeps only tensors named `model.<rest>` and names them `<rest>` (the
    SafeTensors counterpart of PyTorch's nested state dict); the whole header is still validated.
    """

    format = "safetensors"
    nested_keys = True
    fast_path: ClassVar[bool] = True  # False: always the per-entry checks (tests compare the two)

    def __init__(self, source: ByteSource, *, top_level_key: str | None = None,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        if top_level_key is not None and not isinstance(top_level_key, str):
            raise TypeError(f"top_level_key must be a string or None, not {type(top_level_key).__name__}")
        if top_level_key == "":
            raise ValueError("top_level_key must not be empty (use None to keep every tensor)")
        self.source = source
        self.limits = limits
        self.scalars: dict[str, Scalar] = {}
        self.header_size, raw = self._read_raw()
        self._check_budget(raw)
        header = self._decode(raw)
        del raw
        fast = self._bulk(header) if self.fast_path else None
        if fast is not None:
            del header  # before the tensors are made
            self.metadata, names, described, bounds = fast
            del fast
            self.tensors = stored_many(source, names, [d[0] for d in described], [d[1] for d in described],
                                       bounds[:-1], [d[2] for d in described])
        else:  # anything unusual, including every invalid header: the per-entry checks and their messages
            self.metadata, entries = self._parse(header)
            del header
            self.tensors = self._layout(entries)
        if top_level_key is not None:
            self.select(top_level_key)

    # -- header ---------------------------------------------------------------------------------

    def _error(self, message: str, tensor: str | None = None) -> FormatError:
        return FormatError(message, file=self.label, tensor=tensor)

    def _read_raw(self) -> tuple[int, bytes]:
        """The header's length and bytes, its size checked before anything is read."""
        size = self.source.size
        if size < 8:
            raise self._error(f"too short for SafeTensors: {size} bytes, the header length alone takes 8")
        (n,) = struct.unpack("<Q", self.source.read(0, 8, "SafeTensors header length"))
        if n > self.limits.max_header_bytes:
            raise LimitExceededError(f"declares a {n}-byte JSON header; SafeTensors allows at most "
                                     f"{self.limits.max_header_bytes} (max_header_bytes)", file=self.label)
        if n > size - 8:
            raise self._error(f"declares a {n}-byte JSON header but only {size - 8} bytes follow the length")
        return n, self.source.read(8, n, "SafeTensors header")

    def _check_budget(self, raw: bytes) -> None:
        """Refuse a header whose parse could build more than `header_object_bytes` x its size +
        `header_object_base` bytes of Python objects (the limits), before parsing it
        (`bounded_json.check_json_budget`: the rule every JSON header follows)."""
        check_json_budget(raw, self.limits, self.label, "JSON header")

    def _decode(self, raw: bytes) -> _Pairs:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self._error(f"the header is not UTF-8 (byte {e.start}: {e.reason})") from None
        try:
            value = json.loads(text, object_pairs_hook=_Pairs, parse_constant=_reject_constant)
        except RecursionError:
            raise self._error("the header JSON is nested too deeply") from None
        except ValueError as e:  # JSONDecodeError, and ints beyond Python's digit limit
            raise self._error(f"the header is not valid JSON: {e}") from None
        if not isinstance(value, _Pairs):
            raise self._error(f"the header must be a JSON object, found {_kind(value)}")
        if "\\u" in text:  # only a \u escape can spell a surrogate (raw UTF-8 cannot hold one)
            self._refuse_surrogates(value)
        return value

    def _refuse_surrogates(self, header: _Pairs) -> None:
        """A FormatError for the first string holding a lone surrogate escape (`\\ud800`): the format
        is UTF-8 text and the library (serde_json) refuses it; such a name could not be printed,
        written or compared with what other tools read."""
        for name, value in header:
            where = None
            if not utf8_ok(name):
                where = "a tensor name" if name != METADATA_KEY else "a key"
            elif name == METADATA_KEY and isinstance(value, _Pairs):
                for k, v in value:
                    if not utf8_ok(k) or (isinstance(v, str) and not utf8_ok(v)):
                        where = f"__metadata__ {'key' if not utf8_ok(k) else f'value of {k!a}'}"
                        break
            elif not all(map(utf8_ok, _strings(value))):
                where = f"the entry of tensor {name!a}"
            if where is not None:
                raise self._error(f"{where} holds a lone surrogate escape ({_surrogate(name, value)}): "
                                  "SafeTensors headers are UTF-8 text, which cannot hold one")

    def _fast(self, raw: bytes) -> _FastHeader | None:
        """`_bulk` of the parsed header (None also when it does not parse); for tests and the fuzzer."""
        try:
            return self._bulk(self._decode(raw))
        except FormatError:
            return None

    def _bulk(self, header: _Pairs) -> _FastHeader | None:
        """Metadata and entries of a header in the common shape, with every check `_parse` and `_layout`
        make; None when anything is unusual or wrong (the per-entry checks then decide and explain)."""
        names = list(map(_FIRST, header))
        values = list(map(_SECOND, header))
        metadata: dict[str, str] = {}
        if METADATA_KEY in names:
            i = names.index(METADATA_KEY)
            found = _bulk_metadata(values[i])
            if found is None:
                return None
            metadata = found
            del names[i], values[i]
        if len(set(names)) != len(names) or METADATA_KEY in names:  # a repeat, or a second __metadata__
            return None
        data_start = 8 + self.header_size
        data_len = self.source.size - data_start
        if not names:
            return (metadata, [], [], [data_start]) if data_len == 0 else None
        if set(map(type, values)) != {_Pairs} or set(map(len, values)) != {3}:
            return None
        dtype_f, shape_f, offsets_f = zip(*values, strict=True)
        keys = (set(map(_FIRST, dtype_f)), set(map(_FIRST, shape_f)), set(map(_FIRST, offsets_f)))
        if keys != ({"dtype"}, {"shape"}, {"data_offsets"}):
            return None
        spelled, shapes, offsets = (list(map(_SECOND, f)) for f in (dtype_f, shape_f, offsets_f))
        del dtype_f, shape_f, offsets_f, values
        if (set(map(type, spelled)) != {str} or set(map(type, shapes)) != {list}
                or set(map(type, offsets)) != {list} or set(map(len, offsets)) != {2}
                or not set(map(type, chain.from_iterable(shapes))) <= {int}
                or set(map(type, chain.from_iterable(offsets))) != {int}):
            return None  # type(), not isinstance: bools and _Pairs (a list) are not taken
        dts: dict[str, DType] = {}
        for k in set(spelled):
            dt = dtypes.BY_SAFETENSORS.get(k)
            if dt is None:
                return None
            dts[k] = dt
        dt_col = list(map(dts.__getitem__, spelled))
        shape_col = list(map(tuple, shapes))
        del spelled, shapes
        sizes: dict[tuple[DType, tuple[int, ...]], int] = {}
        for dt_shape in set(zip(dt_col, shape_col, strict=True)):
            size = _bulk_size(*dt_shape)
            if size is None:
                return None
            sizes[dt_shape] = size
        lengths = list(map(sizes.__getitem__, zip(dt_col, shape_col, strict=True)))
        starts, ends = (list(col) for col in zip(*offsets, strict=True))
        del offsets
        if min(starts) < 0 or min(ends) < 0:
            return None
        if not all(map(lt, starts, islice(starts, 1, None))):  # not plainly in data order: sort as `_layout`
            key = list(zip(starts, ends, strict=True))
            order = sorted(range(len(key)), key=key.__getitem__)
            del key
            names, dt_col, shape_col, lengths, starts, ends = ([*map(col.__getitem__, order)] for col in
                                                              (names, dt_col, shape_col, lengths, starts, ends))
        # contiguous from 0 to the end of the file, each tensor exactly shape x dtype long
        if (starts[0] != 0 or starts[1:] != ends[:-1] or ends[-1] != data_len
                or list(map(sub, ends, starts)) != lengths):
            return None
        bounds = [data_start, *map(add, ends, repeat(data_start))]
        return metadata, names, list(zip(dt_col, shape_col, lengths, strict=True)), bounds

    def _parse(self, header: _Pairs) -> tuple[dict[str, str], list[tuple[str, DType, tuple[int, ...], int, int]]]:
        metadata: dict[str, str] = {}
        entries: list[tuple[str, DType, tuple[int, ...], int, int]] = []
        seen: set[str] = set()
        for name, value in header:
            if name in seen:
                what = "the header repeats __metadata__" if name == METADATA_KEY else "duplicate tensor name"
                raise self._error(what, None if name == METADATA_KEY else name)
            seen.add(name)
            if name == METADATA_KEY:
                metadata = self._metadata(value)
            else:
                entries.append(self._entry(name, value))
        return metadata, entries

    def _metadata(self, value: object) -> dict[str, str]:
        if value is None:  # the library accepts `null` as "no metadata"
            return {}
        if not isinstance(value, _Pairs):
            raise self._error(f"__metadata__ must be an object of strings, found {_kind(value)}")
        out: dict[str, str] = {}
        for k, v in value:
            if k in out:
                raise self._error(f"__metadata__ repeats the key '{k}'")
            if not isinstance(v, str):
                raise self._error(f"__metadata__ value for '{k}' must be a string, found {_kind(v)}")
            out[k] = v
        return out

    def _entry(self, name: str, value: object) -> tuple[str, DType, tuple[int, ...], int, int]:
        if not isinstance(value, _Pairs):
            raise self._error(f"header entry must be an object with dtype, shape and data_offsets, found "
                              f"{_kind(value)}", name)
        fields: dict[str, object] = {}
        for k, v in value:
            if k in fields:
                raise self._error(f"header entry repeats the field '{k}'", name)
            fields[k] = v
        missing = [f for f in _ENTRY_FIELDS if f not in fields]
        unknown = sorted(set(fields) - set(_ENTRY_FIELDS))
        if missing:
            raise self._error(f"header entry lacks {', '.join(missing)}", name)
        if unknown:
            raise self._error(f"header entry has unknown field(s) {', '.join(unknown)} "
                              "(expected exactly dtype, shape, data_offsets)", name)

        spelled = fields["dtype"]
        if not isinstance(spelled, str):
            raise self._error(f"dtype must be a string, found {_kind(spelled)}", name)
        dtype = dtypes.BY_SAFETENSORS.get(spelled)
        if dtype is None:
            known = ", ".join(LIBRARY_DTYPE_ORDER)
            raise UnsupportedDTypeError(f"unknown SafeTensors dtype '{spelled}' (known: {known})",
                                        file=self.label, tensor=name)

        shape = fields["shape"]
        if not isinstance(shape, list) or isinstance(shape, _Pairs) or not all(_is_uint(d) for d in shape):
            raise self._error(f"shape must be a list of non-negative integers, found {_short(shape)}", name)
        numel = 1
        for d in shape:  # checked per dimension, like the library's checked_mul (and never quadratic)
            if d > _U64_MAX:
                raise LimitExceededError(f"shape {_short(shape)} has a dimension beyond 64 bits",
                                         file=self.label, tensor=name)
            numel *= d
            if numel > _U64_MAX:
                raise LimitExceededError(f"shape {_short(shape)} overflows 64-bit sizes (element count)",
                                         file=self.label, tensor=name)
        assert dtype.bits is not None  # every SafeTensors dtype has a fixed width
        if numel * dtype.bits > _U64_MAX:
            raise LimitExceededError(f"shape {_short(shape)} of {spelled} overflows 64-bit sizes",
                                     file=self.label, tensor=name)

        offsets = fields["data_offsets"]
        if (not isinstance(offsets, list) or isinstance(offsets, _Pairs) or len(offsets) != 2
                or not all(_is_uint(o) for o in offsets)):
            raise self._error(f"data_offsets must be [start, end] with non-negative integers, found "
                              f"{_short(offsets)}", name)
        start, end = offsets
        if end < start:
            raise self._error(f"data_offsets [{start}, {end}] end before they start", name)
        return name, dtype, tuple(shape), start, end

    def _layout(self, entries: list[tuple[str, DType, tuple[int, ...], int, int]]) -> list[LazyTensor]:
        """Check the library's layout rules and build lazy tensors in data order."""
        data_start = 8 + self.header_size
        data_len = self.source.size - data_start
        ordered = sorted(entries, key=lambda e: (e[3], e[4]))  # stable: ties keep header order
        tensors: list[LazyTensor] = []
        expected = 0
        for name, dtype, shape, start, end in ordered:
            if start != expected:
                how = "leave a gap" if start > expected else "overlap the previous tensor"
                raise self._error(f"data_offsets [{start}, {end}] {how}: data must be contiguous, this tensor "
                                  f"should start at {expected}", name)
            assert dtype.bits is not None
            bits = _numel(shape) * dtype.bits
            if bits % 8:
                raise self._error(f"shape {list(shape)} of {dtype.safetensors} is {bits} bits, not a whole "
                                  "number of bytes", name)
            if end - start != bits // 8:
                raise self._error(f"data_offsets [{start}, {end}] cover {end - start} bytes but shape {list(shape)} "
                                  f"of {dtype.safetensors} needs {bits // 8}", name)
            if end > data_len:
                raise self._error(f"data_offsets [{start}, {end}] run past the end of the data section "
                                  f"({data_len} bytes)", name)
            tensors.append(stored(name, dtype, shape, self.source, data_start + start, end - start))
            expected = end
        if expected != data_len:
            raise self._error(f"the data section has {data_len} bytes but the tensors cover {expected}; "
                              "the file must end exactly at the last tensor")
        return tensors

    def extra(self) -> dict[str, Any]:
        return {"header_size": self.header_size, "data_start": 8 + self.header_size}


def _strings(value: object) -> Iterator[str]:
    """Every string in a decoded JSON value, keys included (iteratively: nesting is bounded by json)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, _Pairs):
            for k, item in v:
                yield k
                stack.append(item)
        elif isinstance(v, list):
            stack.extend(v)


def _surrogate(*values: object) -> str:
    """The first lone surrogate among the strings of `values`, as its escape (`\\ud800`)."""
    for v in values:
        for text in _strings(v):
            for ch in text:
                if 0xD800 <= ord(ch) <= 0xDFFF:
                    return f"\\u{ord(ch):04x}"
    return "?"


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _short(value: object, limit: int = 80) -> str:
    """A JSON value shortened for an error message (headers can be 100 MB)."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SafetensorsWriter(Writer):
    """Plans a SafeTensors file in the constructor, then streams it tensor by tensor.

    Dtype mapping: Burn's Flex32 is written as F32 (the same IEEE bits), and Burn's Bool(U8) and
    Bool(U32) as U8 and U32, exactly as Burn saves them (they reload as integers). QFloat and the
    FNUZ fp8 types have no SafeTensors name and are refused. SafeTensors has no scalars, so passing
    any is a PlanError rather than a silent loss.

    `order="library"` (default) writes tensors the way the `safetensors` library does (dtype rank
    descending, then name), so without metadata the output equals `safetensors.numpy.save`'s
    byte for byte; `order="given"` keeps the caller's order. Metadata keys are written sorted
    (the library's own order comes from a hash map and is not reproducible); an empty mapping
    writes no `__metadata__` at all.
    """

    format = "safetensors"
    default_extension = ".safetensors"
    kind = WriterKind.LAID_OUT

    def __init__(
        self,
        tensors: Sequence[LazyTensor],
        *,
        metadata: Mapping[str, str] | None = None,
        scalars: Mapping[str, Scalar] | None = None,
        order: Literal["library", "given"] = "library",
    ) -> None:
        super().__init__(tensors, metadata=metadata, scalars=scalars)
        if order not in ("library", "given"):
            raise PlanError(f"order must be 'library' or 'given', not {order!r}")
        if self.scalars:
            raise PlanError(f"SafeTensors cannot store scalars ({', '.join(sorted(self.scalars))}); "
                            "drop them or store them as tensors")
        self._check_metadata()
        tensors = self.tensors
        st_names = self._fast_checks()
        if st_names is None:  # some tensor is wrong: the per-tensor checks find it and say what
            st_names = self._check_tensors()
        check_u64_sizes(tensors, "the safetensors library refuses it")
        if order == "library":  # dtype rank descending, then name: two stable sorts, no key tuples
            by = sorted(range(len(tensors)), key=list(map(get_name, tensors)).__getitem__)
            by.sort(key=list(map(_NEG_RANK.__getitem__, st_names)).__getitem__)
            tensors, st_names = list(map(tensors.__getitem__, by)), list(map(st_names.__getitem__, by))
        ends = list(accumulate(map(get_nbytes, tensors)))
        starts = [0, *ends[:-1]] if ends else []
        self.order: list[LazyTensor] = tensors  # data order (no copy); offsets live only in the header
        self.data_size = ends[-1] if ends else 0
        self.header = self._header(st_names, starts, ends)
        del st_names, starts, ends
        if len(self.header) > MAX_HEADER_SIZE:
            raise PlanError(f"the JSON header would take {len(self.header)} bytes; SafeTensors readers refuse "
                            f"more than {MAX_HEADER_SIZE}")

    def _check_metadata(self) -> None:
        for k, v in self.metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise PlanError(f"SafeTensors metadata maps strings to strings; got {k!r}: {type(v).__name__} "
                                f"{v!r}")
            if not utf8_ok(k) or not utf8_ok(v):
                raise PlanError(f"metadata {k!r} is not encodable as UTF-8")

    def _fast_checks(self) -> list[str] | None:
        """Each tensor's SafeTensors dtype name when every tensor passes `_check_tensors`, checked per
        distinct name set, dtype and shape rather than per tensor; None when any tensor fails."""
        tensors = self.tensors
        names = distinct_str_names(tensors)
        if names is None or METADATA_KEY in names or not utf8_ok("".join(names)):  # utf8: a lone surrogate
            return None
        dts = list(map(get_dtype, tensors))
        by_id = dict(zip(map(id, dts), dts, strict=True))  # each distinct dtype once
        try:
            st_of = {i: safetensors_name(dt) for i, dt in by_id.items()}
        except UnsupportedDTypeError:
            return None
        # lengths as `_check_tensors` computes them: from the dtype SafeTensors names
        if not lengths_match(tensors, dts, lambda dt, shape: dtypes.BY_SAFETENSORS[st_of[id(dt)]].nbytes(shape)):
            return None
        return list(map(st_of.__getitem__, map(id, dts)))

    def _check_tensors(self) -> list[str]:
        """Each tensor's SafeTensors dtype name, or PlanError for the first tensor that fails."""
        seen: set[str] = set()
        planned: list[str] = []
        for t in self.tensors:
            name = t.name
            if not isinstance(name, str) or not utf8_ok(name):
                raise PlanError(f"tensor name {name!r} is not a UTF-8 encodable string")
            if name == METADATA_KEY:
                raise PlanError("the name is reserved for SafeTensors metadata", tensor=name)
            if name in seen:
                raise PlanError(f"Duplicate tensor name '{name}'", tensor=name)
            seen.add(name)
            st_name = safetensors_name(t.dtype, name)
            bits = _numel(t.shape) * dtypes.BY_SAFETENSORS[st_name].bits  # type: ignore[operator]
            if bits % 8:
                raise PlanError(f"shape {list(t.shape)} of {t.dtype.display} is {bits} bits, not a whole number "
                                "of bytes", tensor=name)
            if t.nbytes != bits // 8:
                raise PlanError(f"declares {t.nbytes} bytes but its shape {list(t.shape)} and dtype "
                                f"{t.dtype.display} need {bits // 8}", tensor=name)
            planned.append(st_name)
        return planned

    def _header(self, st_names: Sequence[str], starts: Sequence[int], ends: Sequence[int]) -> bytes:
        """The JSON exactly as the library (serde_json) writes it, padded with spaces to 8 bytes.

        Entries are formatted and encoded a batch at a time and joined once: the transient memory is
        one batch of strings plus the encoded header, not a string per tensor plus two copies.
        """
        parts: list[bytes] = [b"{"]
        if self.metadata:
            meta = {k: self.metadata[k] for k in sorted(self.metadata)}
            parts += (f"{_json(METADATA_KEY)}:{_json(meta)}".encode(), b",")
        tensors = self.order
        shapes = shapes_of(tensors)
        shape_json = {shape: "[" + ",".join(map(str, shape)) + "]" for shape in set(shapes)}
        entries = map('%s:{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}'.__mod__,
                      zip(map(_JSON_STR, map(get_name, tensors)), st_names, map(shape_json.__getitem__, shapes), starts,
                          ends, strict=True))
        del shapes
        while batch := ",".join(islice(entries, 8192)):
            parts += (batch.encode("utf-8"), b",")
        if len(parts) > 1:
            parts[-1] = b"}"  # in place of the last separator
        else:
            parts.append(b"}")
        size = sum(map(len, parts))
        parts.append(b" " * (-size % 8))
        return b"".join(parts)

    @property
    def total_size(self) -> int:
        return 8 + len(self.header) + self.data_size

    def layout(self) -> tuple[bytes, list[LazyTensor], list[int]]:
        """What `write_to` writes, as placed pieces (see `BurnpackWriter.layout`): the length and header,
        the tensors in data order and each one's file offset (they follow each other, no gaps)."""
        prefix = struct.pack("<Q", len(self.header)) + self.header
        offsets = list(accumulate(map(get_nbytes, self.order[:-1]), initial=len(prefix))) if self.order else []
        return prefix, self.order, offsets

    def write_to(self, sink: BinaryIO) -> None:
        write_all(sink, memoryview(struct.pack("<Q", len(self.header)) + self.header))
        with Ahead(self.order) as ahead:
            for t in self.order:
                write_tensor(sink, t, ahead)


_NEG_RANK = {name: -rank for name, rank in _RANK.items()}
# json.dumps(s, ensure_ascii=False) for a str (what JSONEncoder.encode calls), without an encoder per call
_JSON_STR = json.encoder.encode_basestring


def _json(value: object) -> str:
    # Python's compact, non-ASCII-preserving JSON matches serde_json: only `"`, `\`, and control
    # characters are escaped, with \b \f \n \r \t short forms and lowercase \u00XX otherwise.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


