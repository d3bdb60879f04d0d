"""Hostile pickles within the documented bounds (issue 19 items 6, 7, 9).

Typed errors, never tracebacks (values that overflow, nesting that would recurse, integers too big
to print); dict and set construction that stays linear when every key has one hash value; and memory
per input byte within SECURITY.md's budget for every container kind the interpreter builds.
"""

from __future__ import annotations

import pickle
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

import migrator
from migrator.core.errors import FormatError, LimitExceededError, MigratorError
from migrator.formats import pytorch
from migrator.formats import safepickle as sp
from tests.support.pickles import P2, REBUILD, in_legacy, in_zip, u
from tools import fuzz

HASH_MOD = (1 << 61) - 1  # CPython hashes an int as its value modulo this prime


def long4(v: int) -> bytes:
    raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8b" + struct.pack("<i", len(raw)) + raw


def long1(v: int) -> bytes:
    raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def opened(data: bytes, tmp_path: Path, container: Callable[[bytes], bytes] = in_zip,
           **options: object) -> BaseException | None:
    """Open `data` as a checkpoint's main pickle; the error (None if it opened), with an alarm as safety net."""
    path = tmp_path / "case.pt"
    path.write_bytes(container(data))
    try:
        with fuzz.time_limit(60), migrator.open_file(path, **options) as r:  # type: ignore[arg-type]
            for t in r.tensors:
                t.numpy()
    except Exception as e:  # the type is what the tests check
        return e
    return None


# ----------------------------------------------------------------------------------------------
# item 9: typed errors, never tracebacks

BIG = 1 << 4000  # far beyond float range and beyond Python's 4300-digit int-to-str limit when 4 KiB long
HUGE_KEY = (1 << 32760) - 1  # 4 KiB


@pytest.mark.parametrize("args", [long4(BIG) + b"\x85", b"G?\xf0\x00\x00\x00\x00\x00\x00" + long4(-BIG) + b"\x86",
                                  long4(BIG) + long4(BIG) + b"\x86", long1(1 << 1023) + b"\x85"],
                         ids=["real", "imag", "both", "2**1023"])
def test_complex_of_a_huge_integer_is_a_format_error(args: bytes) -> None:
    with pytest.raises(FormatError, match="does not fit in a float"):
        sp.load(P2 + b"c__builtin__\ncomplex\n" + args + b"R.")
    assert sp.load(P2 + b"c__builtin__\ncomplex\nK\x01K\x02\x86R.") == complex(1, 2)  # the control


def nested_rebuild_from_type(levels: int) -> bytes:
    """_rebuild_from_type_v2(_rebuild_from_type_v2, Tensor, (... levels ...), {}), built level by level
    through the memo (one MARK open at a time), as a 60 KB file does at 3,000 levels."""
    out = P2 + b"ctorch._tensor\n_rebuild_from_type_v2\nq\x00ctorch\nTensor\nq\x01(h\x00h\x01)}tr"
    out += struct.pack("<I", 2)
    for i in range(levels):
        out += b"0(h\x00h\x01j" + struct.pack("<I", 2 + i) + b"}tr" + struct.pack("<I", 3 + i)
    return out + b"0h\x00j" + struct.pack("<I", 2 + levels) + b"R."


@pytest.mark.parametrize("levels", [33, 300, 3000])
def test_nested_rebuild_calls_are_bounded_like_containers(tmp_path: Path, levels: int) -> None:
    data = nested_rebuild_from_type(levels)
    with pytest.raises(LimitExceededError, match="nested deeper than 32"):
        sp.load(data)
    for container in (in_zip, in_legacy):
        assert isinstance(opened(data, tmp_path, container), LimitExceededError)
    # within the limit, the nesting is read (and fails on its innermost call's arguments, typed)
    with pytest.raises(FormatError, match="expects"):
        sp.load(nested_rebuild_from_type(30))


def test_a_4kib_integer_as_dict_key_or_storage_key_is_typed(tmp_path: Path) -> None:
    as_key = P2 + b"}(" + u("w") + REBUILD + long4(HUGE_KEY) + REBUILD + b"u."
    assert opened(as_key, tmp_path) is None  # the integer key is skipped; 'w' loads
    with migrator.open_file(tmp_path / "case.pt") as r:
        assert [t.name for t in r.tensors] == ["w"]
        assert "<non-string key>" in r.extra()["ignored"]
    err = opened(as_key, tmp_path, top_level_key="5")  # the message lists the keys: no str() of the integer
    assert isinstance(err, MigratorError) and "'w'" in str(err)
    for replaced in (REBUILD.replace(u("0"), long4(HUGE_KEY)), REBUILD.replace(u("0"), long4(-1))):
        err = opened(P2 + b"}(" + u("w") + replaced + b"u.", tmp_path)
        assert isinstance(err, FormatError) and "storage key" in str(err), err
    # legacy: the storage key list and the protocol version
    legacy = in_legacy(P2 + b"}(" + u("w") + REBUILD + b"u.")
    keys = pickle.dumps(["0"], protocol=2)
    assert legacy.count(keys) == 1
    err = opened(legacy.replace(keys, P2 + b"]" + long4(HUGE_KEY) + b"a."), tmp_path, lambda d: d)
    assert isinstance(err, FormatError) and "storage key list" in str(err), err
    # a memo read whose index has 4,000 digits
    with pytest.raises(FormatError, match=r"memo entry a .*-bit integer"):
        sp.load(b"g" + b"9" * 4000 + b"\n.")
    with pytest.raises(FormatError, match="memo index"):
        sp.load(b"Np" + b"9" * 4000 + b"\n.")
    with pytest.raises(FormatError, match=r"torch\.device"):
        sp.load(P2 + b"ctorch\ndevice\n" + u("cuda") + long4(HUGE_KEY) + b"\x86R.")


def test_a_huge_legacy_protocol_version_is_typed(tmp_path: Path) -> None:
    path = tmp_path / "v.pt"

    path.write_bytes(pickle.dumps(pytorch.LEGACY_MAGIC, protocol=2) + P2 + long4(HUGE_KEY) + b".")
    with pytest.raises(FormatError, match="protocol version a 32760-bit integer"):
        migrator.open_file(path)


# ----------------------------------------------------------------------------------------------
# item 6: hash collisions


def colliding(n: int) -> list[bytes]:
    return [long1(i * HASH_MOD) for i in range(n)]  # all hash to 0


@pytest.mark.parametrize("shape", ["SETITEMS", "SETITEM", "DICT", "ADDITEMS", "FROZENSET", "OrderedDict pairs",
                                   "set()", "float keys"])
def test_colliding_keys_are_refused_not_quadratic(tmp_path: Path, shape: str) -> None:
    keys = colliding(70_000)
    if shape == "float keys":  # x * 2**61 hashes like x: 35 exponents of one mantissa, times 2**-k shifts
        keys = [b"G" + struct.pack(">d", 1.5 * 2.0 ** (61 * k - 1000)) for k in range(30)] * 3
    body = {
        "SETITEMS": b"}(" + b"".join(k + b"N" for k in keys) + b"u",
        "SETITEM": b"}" + b"".join(k + b"Ns" for k in keys),
        "DICT": b"(" + b"".join(k + b"N" for k in keys) + b"d",
        "ADDITEMS": b"\x8f(" + b"".join(keys) + b"\x90",
        "FROZENSET": b"(" + b"".join(keys) + b"\x91",
        "OrderedDict pairs": b"ccollections\nOrderedDict\n((" + b"".join(k + b"N\x86" for k in keys) + b"ltR",
        "set()": b"c__builtin__\nset\n(" + b"".join(keys) + b"l\x85R",
        "float keys": b"}(" + b"".join(k + b"N" for k in keys) + b"u",
    }[shape]
    data = P2 + body + b"."
    with fuzz.time_limit(60):  # a safety net only: the refusal is what is checked
        if shape == "float keys":  # 30 distinct floats of one hash: below the cap, and equal ones merge
            assert len(sp.load(data)) == 30
            return
        with pytest.raises(LimitExceededError, match="share a hash value"):
            sp.load(data)
    assert isinstance(opened(P2 + b"}(" + u("w") + REBUILD + u("x") + body + b"u.", tmp_path), LimitExceededError)


def test_many_distinct_integer_keys_still_load() -> None:
    # an optimizer's state keyed 0..n-1, and ints of every size below 2**63: distinct hashes
    d = sp.load(P2 + b"}(" + b"".join(long1(i) + b"N" for i in range(20_000)) + b"u.")
    assert len(d) == 20_000
    keys = [long1(i * HASH_MOD) for i in range(sp.DEFAULT_LIMITS.max_same_hash)]  # exactly the cap: accepted
    assert len(sp.load(P2 + b"}(" + b"".join(k + b"N" for k in keys) + b"u.")) == len(keys)


def test_the_collision_cap_moves_with_the_limits() -> None:
    data = P2 + b"\x8f(" + b"".join(colliding(10)) + b"\x90."
    assert len(sp.load(data)) == 10
    with pytest.raises(LimitExceededError, match="more than 4 keys"):
        sp.load(data, limits=sp.Limits(max_same_hash=4))


# ----------------------------------------------------------------------------------------------
# item 7: memory per input byte, for every container kind

N = 200_000
KINDS: dict[str, bytes] = {
    "EMPTY_SET": P2 + b"\x8f" * N + b".",
    "FROZENSET": P2 + b"(\x91" * (N // 2) + b".",
    "set()": P2 + b"c__builtin__\nset\nq\x01" + b"h\x01)R" * (N // 4) + b".",
    "frozenset()": P2 + b"c__builtin__\nfrozenset\nq\x01" + b"h\x01)R" * (N // 4) + b".",
    "EMPTY_DICT": P2 + b"}" * N + b".",
    "dict()": P2 + b"c__builtin__\ndict\nq\x01" + b"h\x01)R" * (N // 4) + b".",
    "OrderedDict()": P2 + b"ccollections\nOrderedDict\nq\x01" + b"h\x01)R" * (N // 4) + b".",
    "EMPTY_LIST": P2 + b"]" * N + b".",
    "list()": P2 + b"c__builtin__\nlist\nq\x01" + b"h\x01)R" * (N // 4) + b".",
    "TUPLE1 chain": P2 + b"N" + b"\x85" * N + b".",
    "TUPLE2": P2 + b"N" + b"2\x86" * (N // 2) + b".",
    "EMPTY_TUPLE": P2 + b")" * N + b".",
    "MEMOIZE": b"\x80\x04N" + b"\x94" * N + b".",
    "LONG_BINPUT": P2 + b"N" + b"".join(b"r" + struct.pack("<I", i) for i in range(N // 5)) + b".",
    "SHORT_BINBYTES": P2 + b"C\x02ab" * (N // 4) + b".",
    "bytes()": P2 + b"c__builtin__\nbytes\nq\x01" + b"h\x01)R" * (N // 4) + b".",
    "BYTEARRAY8": b"\x80\x05" + b"\x96" + struct.pack("<Q", 0) * 1 + b"0" + (b"\x96" + struct.pack("<Q", 0)) * (N // 9)
    + b".",
    "SHORT_BINUNICODE": P2 + b"\x8c\x02ab" * (N // 4) + b".",
    "set members": P2 + b"\x8f(" + b"".join(b"M" + struct.pack("<H", i) for i in range(65_536)) + b"\x90.",
    "dict items": P2 + b"}(" + b"".join(b"M" + struct.pack("<H", i) + b"N" for i in range(N // 4)) + b"u.",
    "list items": P2 + b"](" + b"J\x00\x00\x01\x00" * (N // 5) + b"e.",
    "placeholder objects": P2 + b"cm\nC\nq\x01" + b"h\x01)\x81" * (N // 4) + b".",
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_memory_per_input_byte_stays_within_the_budget(kind: str) -> None:
    data = KINDS[kind]
    budget = 80 * len(data) + (1 << 20)  # SECURITY.md: 80 bytes per input byte + 1 MiB
    tracemalloc.start()
    try:
        sp.load(data)
    except LimitExceededError as e:
        assert "bytes of objects per input byte" in str(e)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak <= budget, f"{kind}: {peak / len(data):.1f} bytes per input byte"


def test_sets_from_one_byte_each_are_refused_at_the_budget() -> None:
    with pytest.raises(LimitExceededError, match="80 bytes of objects per input byte"):
        sp.load(KINDS["EMPTY_SET"])
    few = P2 + b"(" + b"\x8f" * 5000 + b"l."  # 5,000 sets: within 80 B/byte + the 1 MiB any pickle may use
    assert len(sp.load(few)) == 5000
    with pytest.raises(LimitExceededError, match="per input byte"):  # the budget moves with the limits
        sp.load(few, limits=sp.Limits(max_object_bytes=0))
