"""What a reader may be made to allocate: every bound on untrusted input, as one value.

A `Limits` is passed to `open_file(..., limits=)` and `build_plan(..., limits=)` (and from the
command line with `--limit NAME=VALUE`); each reader reads its bounds from the value it was given,
so two readers in one process can have different limits and nothing is changed process-wide.
Every field is checked in the places its comment names (one per format that has such a bound).
SECURITY.md lists them.

Bounds that are part of a format rather than a defence (Burn's CBOR nesting of 128, torch's int64
sizes, the counts Burn's own reader refuses when migrator writes a burnpack) are constants of
their modules, not fields here: raising them would only admit files the format's own tools refuse.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """Upper bounds on what one file may make a reader hold (all counts and byte sizes are >= 0)."""

    # burnpack (formats/burnpack.py)
    max_file_bytes: int = 100 * GiB  # a burnpack file's size (files only, not buffers)
    max_metadata_bytes: int = 100 * MiB  # its CBOR metadata
    max_tensors: int = 100_000  # tensors in its tensor map (GGUF: tensor infos, formats/gguf/header.py)
    max_tensor_bytes: int = 10 * GiB  # bytes of one tensor (elements: at most 8 x this)
    # SafeTensors (formats/safetensors.py)
    max_header_bytes: int = 100_000_000  # the JSON header (the safetensors library's bound); a GGUF header
    # burnpack CBOR (formats/cbor.py), SafeTensors JSON (formats/safetensors.py), GGUF (formats/gguf/header.py)
    header_object_bytes: int = 14  # bytes of Python objects a header may build per header byte...
    header_object_base: int = 56 * MiB  # ...plus this many, whatever its size
    # PyTorch containers (formats/pytorch/)
    max_pickle_bytes: int = GiB  # a zip's data.pkl (zip.py)
    max_zip_entries: int = 1_000_000  # zip central directory entries (zip.py)
    max_zip_directory_bytes: int = 256 * MiB  # the central directory (zip.py)
    max_small_record_bytes: int = MiB  # byteorder, version, sys_info, tar pax headers (zip.py, tar.py)
    max_tar_members: int = 100_000  # members of a legacy tar checkpoint (tar.py)
    max_nodes: int = 1_000_000  # values visited while flattening: Burn's memo-bomb bound (flatten.py)
    max_nesting: int = 1_000  # dicts/lists nested while flattening (flatten.py)
    max_expanded_bytes: int = GiB  # a stride-0 view materialised, or its storage window (views.py)
    # the pickle interpreter (safepickle/)
    max_memo: int = 5_000_000  # memo entries (opcodes.py)
    max_stack: int = 5_000_000  # values on the stack, one MARK frame (vm.py)
    max_marks: int = 1_000  # MARK frames open at once (opcodes.py)
    max_objects: int = 10_000_000  # values pushed in total (vm.py)
    max_long_bytes: int = 4096  # LONG1/LONG4 payloads and text integer digits (opcodes.py)
    max_key_depth: int = 32  # tuple nesting in dict keys / set members; nested rebuild calls (vm.py)
    max_dims: int = 64  # tensor rank (allowlist.py; tar.py for legacy tensors)
    max_same_hash: int = 64  # non-string keys of one dict (members of one set) sharing a hash (vm.py)
    max_object_bytes: int = 80  # bytes of containers built per pickle byte... (vm.py)
    pickle_object_base: int = MiB  # ...plus this many, whatever the pickle's size (vm.py)
    # sharded sources (formats/sharded.py)
    max_index_bytes: int = 64 * MiB  # a `*.index.json`
    max_shards: int = 100_000  # files of one sharded source
    # names (plan/build.py): characters of a name matched against patterns; 0 is no cap. Patterns run
    # on RE2, linear in the name, but a match costs up to (pattern) x (name): patterns are bounded
    # (naming.regex.MAX_PATTERN_CHARS, MAX_GROUPS) and so, by default, are names
    max_name_chars: int = 65_536

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if type(v) is not int or v < 0:
                raise ValueError(f"limit {f.name} must be an integer >= 0, not {v!r}")

    def replace(self, **changes: int) -> Limits:
        """This value with some fields changed (unknown names: ValueError with a suggestion)."""
        for name in changes:
            _check_name(name)
        return dataclasses.replace(self, **changes)

    def with_settings(self, settings: Iterable[str]) -> Limits:
        """This value with `NAME=VALUE` settings applied in order (the command line's `--limit`)."""
        changes: dict[str, int] = {}
        for text in settings:
            name, sep, value = text.partition("=")
            name = name.strip()
            if not sep or not name:
                raise LimitSettingError(f"--limit {text!r}: write NAME=VALUE, e.g. max_tensor_bytes=20GiB")
            _check_name(name)
            changes[name] = parse_value(name, value)
        return dataclasses.replace(self, **changes)


DEFAULT_LIMITS = Limits()
NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Limits))


class LimitSettingError(ValueError):
    """A `--limit` setting that names no limit or gives no valid value."""


def _check_name(name: str) -> None:
    if name not in NAMES:
        import difflib

        close = difflib.get_close_matches(name, NAMES, n=1)
        hint = f"did you mean '{close[0]}'?" if close else "the limits are: " + ", ".join(NAMES)
        raise LimitSettingError(f"unknown limit '{name}': {hint}")


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_VALUE = re.compile(r"\s*(\d[\d_]*)\s*([KMGT]i?B|B)?\s*", re.IGNORECASE)


def parse_value(name: str, value: str) -> int:
    """An integer, with `_` separators; a byte size may carry a unit (5GB = 5*10^9, 5GiB = 5*2^30)."""
    m = _VALUE.fullmatch(value)
    unit = (m[2] or "") if m else ""
    if m is None or m[1].endswith("_") or "__" in m[1] or (unit and unit[-1] == "b"):
        raise LimitSettingError(f"--limit {name}={value}: not an integer"
                                + (" or a size such as 20GiB or 500MB" if "bytes" in name else ""))
    if unit and "bytes" not in name:
        raise LimitSettingError(f"--limit {name}={value}: {name} is a count, without a unit")
    return int(m[1]) * _UNITS[unit.upper()]
