"""Mutations: each op is a plain tuple, so Hypothesis (tests/formats/test_fuzz.py) and the random loop
share one interpreter; the format-aware ops and fields come from each family's module."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from . import gguf, headers, megatron, pytorch, recipe, torch_dist
from .headers import JSON_NUMBERS
from .pytorch import _mutate_zip_member, _tar_size, fix_tar_checksums
from .recipe import _yaml_line

SEEDS: dict[str, Callable[[], list[bytes]]] = {
    "burnpack": headers.burnpack_seeds, "safetensors": headers.safetensors_seeds,
    "pytorch-zip": pytorch.pytorch_zip_seeds, "pytorch-legacy": pytorch.pytorch_legacy_seeds,
    "pytorch-tar": pytorch.pytorch_tar_seeds, "gguf": gguf.gguf_seeds, "recipe": recipe.recipe_seeds,
    "megatron-legacy": megatron.megatron_legacy_seeds, "torch-dist": torch_dist.torch_dist_seeds,
}


def build_seeds(reader: str) -> list[bytes]:
    """Valid inputs for `reader`; each must pass `exercise` unchanged (checked by the tests)."""
    return SEEDS[reader]()


INTERESTING = (0, 1, 2, 7, 8, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000,
               0xFFFFFFFF, 1 << 32, 1 << 40, 1 << 53, (1 << 62), (1 << 63) - 1, 1 << 63, (1 << 64) - 1, -1, -2,
               -256, -(1 << 31), -(1 << 63))


def _op_at(data: bytes, pos: int) -> int:
    return pos % (len(data) + 1)


def apply_op(data: bytes, op: tuple[Any, ...], reader: str, seeds: Sequence[bytes] = ()) -> bytes:
    """Apply one mutation; ops whose positions exceed the input wrap around (never fail)."""
    kind = op[0]
    if kind == "flip":
        if not data:
            return data
        p = op[1] % len(data)
        return data[:p] + bytes([data[p] ^ (1 << (op[2] % 8))]) + data[p + 1 :]
    if kind == "set":
        if not data:
            return data
        p = op[1] % len(data)
        return data[:p] + bytes([op[2] % 256]) + data[p + 1 :]
    if kind == "truncate":
        return data[: _op_at(data, op[1])]
    if kind == "insert":
        p = _op_at(data, op[1])
        return data[:p] + op[2] + data[p:]
    if kind == "delete":
        p = _op_at(data, op[1])
        return data[:p] + data[p + op[2] :]
    if kind == "dup":  # copy a chunk over another place (repeats structure: duplicate names, entries)
        if not data:
            return data
        p, n, q = op[1] % len(data), op[2], _op_at(data, op[3])
        return data[:q] + data[p : p + n] + data[q:]
    if kind == "int":  # overwrite `width` bytes at any position with an interesting integer
        return _put_int(data, _op_at(data, op[1]), op[2], op[3], op[4])
    if kind == "field":  # overwrite a length/offset/count field found by format-aware scanning
        fields = length_fields(data, reader)
        if not fields:
            return data
        pos, width, order = fields[op[1] % len(fields)]
        return _put_int(data, pos, width, op[2], order)
    if kind == "splice":
        if not seeds:
            return data
        other = seeds[op[1] % len(seeds)]
        return data[: _op_at(data, op[2])] + other[_op_at(other, op[3]) :]
    if kind == "json-num":
        return _replace_nth(data, rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?", op[1], op[2].encode())
    if kind == "zip-pkl":
        if reader == "torch-dist":  # behind the byte naming the file: common.pt, a rank file's first item
            return data[:1] + _mutate_zip_member(data[1:], op[1], reader, seeds)
        return _mutate_zip_member(data, op[1], reader, seeds)
    if kind == "tar-fix":
        return fix_tar_checksums(data)
    if kind == "tar-size":
        return _tar_size(data, op[1], op[2])
    if kind == "yaml-line":
        return _yaml_line(data, op[1], op[2], op[3])
    raise ValueError(f"unknown mutation {kind}")


def apply_ops(data: bytes, ops: Sequence[tuple[Any, ...]], reader: str, seeds: Sequence[bytes] = ()) -> bytes:
    for op in ops:
        data = apply_op(data, op, reader, seeds)
    return data


def _put_int(data: bytes, pos: int, width: int, value: int, order: str) -> bytes:
    raw = (value % (1 << (8 * width))).to_bytes(width, "little" if order == "<" else "big")
    return data[:pos] + raw + data[pos + width :]


def _replace_nth(data: bytes, pattern: bytes, n: int, repl: bytes) -> bytes:
    matches = list(re.finditer(pattern, data[:4096]))
    if not matches:
        return data
    m = matches[n % len(matches)]
    return data[: m.start()] + repl + data[m.end() :]


def length_fields(data: bytes, reader: str) -> list[tuple[int, int, str]]:
    """(position, width, byte order) of fields that hold lengths, offsets or counts: each family's."""
    if reader in ("burnpack", "safetensors"):
        return headers.header_fields(data, reader)
    if reader.startswith("pytorch-"):
        return pytorch.pytorch_fields(data, reader)
    if reader == "megatron-legacy":  # one rank file: a torch.save zip, or torch's legacy pickle stream
        return pytorch.pytorch_fields(data, "pytorch-zip" if data[:2] == b"PK" else "pytorch-legacy")
    if reader == "torch-dist":  # one file of the folder, behind the byte naming it
        return torch_dist.torch_dist_fields(data)
    if reader == "gguf":
        return gguf.gguf_fields(data)
    return []


def random_ops(rng: random.Random, data: bytes, reader: str) -> list[tuple[Any, ...]]:
    """1-4 random mutations, weighted towards the ones that reach deep."""
    ops: list[tuple[Any, ...]] = []
    n = len(data) or 1
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
        r = rng.random()
        value = rng.choice((*INTERESTING, n, n - 1, n + 1, rng.getrandbits(64)))
        if reader == "recipe" and r < 0.45:
            ops.append(("yaml-line", rng.randrange(7), rng.randrange(1 << 16), rng.randrange(1 << 16)))
        elif reader in ("pytorch-zip", "megatron-legacy", "torch-dist") and r < 0.4:
            ops.append(("zip-pkl", [_byte_op(rng, 512) for _ in range(rng.choice((1, 1, 2)))]))
        elif reader == "pytorch-tar" and r < 0.15:
            ops.append(("tar-size", rng.randrange(8), value))
        elif reader == "safetensors" and r < 0.25:
            ops.append(("json-num", rng.randrange(256), rng.choice(JSON_NUMBERS)))
        elif r < 0.6:
            ops.append(_byte_op(rng, n))
        elif r < 0.8:
            ops.append(("field", rng.randrange(1 << 16), value))
        elif r < 0.9:
            ops.append(("int", rng.randrange(n), rng.choice((1, 2, 4, 8)), value, rng.choice("<>")))
        else:
            ops.append(("splice", rng.randrange(64), rng.randrange(n), rng.randrange(1 << 16)))
    if reader == "pytorch-tar" and rng.random() < 0.6:
        ops.append(("tar-fix",))
    return ops


def _byte_op(rng: random.Random, n: int) -> tuple[Any, ...]:
    k = rng.randrange(6)
    pos = rng.randrange(max(n, 1))
    if k == 0:
        return ("flip", pos, rng.randrange(8))
    if k == 1:
        return ("set", pos, rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256))))
    if k == 2:
        return ("truncate", pos)
    if k == 3:
        return ("insert", pos, rng.randbytes(rng.choice((1, 1, 2, 4, 8, 64))))
    if k == 4:
        return ("delete", pos, rng.choice((1, 2, 4, 8, 64)))
    return ("dup", pos, rng.choice((1, 4, 16, 64, 256)), rng.randrange(max(n, 1)))
