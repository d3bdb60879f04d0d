"""Tensor-name transforms: key remapping, contiguous indices, enum-variant stripping, collisions.

These are the pure building blocks of a recipe (no file I/O). Their semantics follow Burn's
burn-store crate (docs/burn-compatibility.md, "Names") so that a recipe written against Burn's
documentation renames tensors exactly as Burn would.

The package's modules: `regex` (Rust pattern spellings), `remap` (replacements, index arithmetic,
ordered rules), `indices` (contiguous indices, enum variants, collisions) and `filters` (the
recipe's include/exclude criteria).
"""

from __future__ import annotations

from .filters import NameFilter
from .indices import contiguous_names, find_collisions, parse_usize, strip_enum_variant
from .regex import NamingError, Regex, RegexMatch, compile_regex
from .remap import IndexArithmeticError, KeyRemapper, RemapRule, ReplacementSyntax, expand_replacement

__all__ = [
    "IndexArithmeticError",
    "KeyRemapper",
    "NameFilter",
    "NamingError",
    "Regex",
    "RegexMatch",
    "RemapRule",
    "ReplacementSyntax",
    "compile_regex",
    "contiguous_names",
    "expand_replacement",
    "find_collisions",
    "parse_usize",
    "strip_enum_variant",
]
