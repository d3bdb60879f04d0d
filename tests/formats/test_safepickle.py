"""The restricted unpickler: data round-trips for every protocol, hostile pickles never run."""

from __future__ import annotations

import collections
import io
import os
import pickle
import pickletools
import struct
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from migrator.core.errors import FormatError, LimitExceededError, MigratorError, UnsafePickleError
from migrator.formats import safepickle as sp

torch = pytest.importorskip("torch")

PROTOCOLS = list(range(0, pickle.HIGHEST_PROTOCOL + 1))


# ----------------------------------------------------------------------------------------------
# plain data: every opcode Python emits, every protocol


DATA = {
    "none": None, "t": True, "f": False, "small": 7, "neg": -300, "i16": 40000, "i32": -(2**31),
    "i64": 2**63 - 1, "huge": -(2**200), "float": 1.5, "nan_free": -0.0, "inf": float("inf"),
    "str": "héllo ✓", "empty": "", "bytes": b"\x00\xffabc", "no_bytes": b"", "ba": bytearray(b"xy"),
    "list": [1, [2, [3, []]]], "tuple0": (), "tuple1": (1,), "tuple2": (1, 2), "tuple3": (1, 2, 3),
    "tuple5": (1, 2, 3, 4, 5), "set": {1, 2, 3}, "fset": frozenset({"a"}), "empty_set": set(),
    "complex": complex(1, -2), "slice": slice(1, 10, 2), "int_keys": {1: "a", 2: "b"},
    "tuple_key": {(1, "a"): 3}, "long_str": "x" * 70000, "long_bytes": b"y" * 300,
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_plain_data_round_trips(protocol: int) -> None:
    data = dict(DATA)
    shared = [1, 2]
    data["shared"] = (shared, shared)
    out = sp.load(pickle.dumps(data, protocol=protocol))
    if protocol < 3:  # Python < 3 has no bytes type: they come back through _codecs.encode
        assert isinstance(out["bytes"], bytes)
    assert out == data
    assert out["shared"][0] is out["shared"][1]  # memo gives shared references, never copies


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ordered_dict_and_defaultdict(protocol: int) -> None:
    od = collections.OrderedDict([("b", 1), ("a", 2)])
    od.attr = {"version": 1}  # type: ignore[attr-defined]
    dd = collections.defaultdict(list, {"k": [1]})
    out = sp.load(pickle.dumps({"od": od, "dd": dd}, protocol=protocol))
    assert isinstance(out["od"], sp.ODict) and list(out["od"].items()) == [("b", 1), ("a", 2)]
    assert out["od"].attrs == {"attr": {"version": 1}}
    assert dict(out["dd"]) == {"k": [1]}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_numpy_scalars_without_numpy_pickle_code(protocol: int) -> None:
    values = {"f8": np.float64(0.25), "f4": np.float32(-1.5), "i8": np.int64(-7), "u1": np.uint8(200),
              "b": np.bool_(True), "f2": np.float16(2.0)}
    out = sp.load(pickle.dumps(values, protocol=protocol))
    assert out == {k: v.item() for k, v in values.items()}
    assert type(out["i8"]) is int and type(out["b"]) is bool
    arr = sp.load(pickle.dumps({"a": np.zeros((2, 3), dtype=np.float32)}, protocol=protocol))["a"]
    assert isinstance(arr, sp.NumpyArray) and arr.shape == (2, 3)


def test_text_opcodes_of_python2_pickles() -> None:
    # protocol 0 as Python 2 wrote it: STRING, INT booleans, LONG with L, FLOAT, text PUT/GET, DICT
    data = b"(dp0\nS'name'\np1\nS'caf\\xc3\\xa9'\np2\nsS'flag'\np3\nI01\nsS'n'\nL12345678901234567890L\n" \
           b"sS'x'\nF0.5\nsS'again'\ng2\ns."
    assert sp.load(data) == {"name": "café", "flag": True, "n": 12345678901234567890, "x": 0.5,
                             "again": "café"}
    binstring = b"\x80\x02}q\x00(T\x03\x00\x00\x00abcq\x01U\x01zq\x02u."
    assert sp.load(binstring) == {"abc": "z"}


def test_stack_manipulation_opcodes() -> None:
    # MARK ... POP_MARK, POP, DUP, MEMOIZE, LONG_BINPUT/LONG_BINGET, FRAME
    body = b"(K\x01K\x021K\x03K\x040\x94r\xe8\x03\x00\x00j\xe8\x03\x00\x00\x86\x94h\x00\x86."
    data = b"\x80\x04\x95" + struct.pack("<Q", len(body)) + body
    assert sp.load(data) == ((3, 3), 3)
    assert sp.load(b"\x80\x02K\x052\x86.") == (5, 5)


def test_every_pickle_opcode_is_handled_or_refused() -> None:
    handled = set(sp.opcodes._DISPATCH)
    for op in pickletools.opcodes:
        assert op.code.encode("latin-1")[0] in handled, op.name


def test_tensor_rebuilds_into_descriptions() -> None:
    buf = io.BytesIO()
    torch.save({"w": torch.arange(6.0).reshape(2, 3).t(), "p": torch.nn.Parameter(torch.ones(2))}, buf)
    import zipfile

    with zipfile.ZipFile(buf) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    pids: list[Any] = []

    def persistent(pid: Any) -> sp.StorageRef:
        pids.append(pid)
        return sp.StorageRef(pid[2], pid[1].name, pid[1].dtype, pid[4], pid[3])

    out = sp.load(data, persistent_load=persistent)
    w = out["w"]
    assert isinstance(w, sp.TensorRef) and w.size == (3, 2) and w.stride == (1, 3) and w.dtype_name == "float32"
    assert isinstance(out["p"], sp.TensorRef) and out["p"].requires_grad
    assert isinstance(pids[0][1], sp.StorageType) and pids[0][1].name == "FloatStorage"


def test_a_pickle_that_ends_before_its_buffer_reads_only_up_to_its_end() -> None:
    """`end` bounds the fast path's cached tails: a tensor record cut by `end`, with more record bytes
    (and tail end marks) after it in the buffer, reads as the general loop reads it, for every cut."""
    import zipfile

    from migrator import from_numpy
    from migrator.files import io as formats

    tensors = [from_numpy(f"h.{i}.w", np.ones((i % 3 + 1, 2), np.float32)) for i in range(12)]
    with zipfile.ZipFile(io.BytesIO(formats.to_bytes(tensors, "pytorch"))) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    buf = data + b")RtR" * 40  # what a tail lookup past `end` would find

    def persistent(pid: Any) -> sp.StorageRef:
        return sp.StorageRef(pid[2], pid[1].name, pid[1].dtype, pid[4], pid[3])

    def outcome(end: int, fast: bool) -> Any:
        u = sp.Unpickler(buf, end=end, persistent_load=persistent, fast=fast)
        try:
            root = u.load()
        except FormatError as e:
            return "error", str(e)
        return "ok", u.pos, [(k, t.storage.key, t.size, t.stride) for k, t in root.items()]

    full = outcome(len(data), True)
    assert full[0] == "ok" and len(full[2]) == 12
    for end in range(len(data) - 300, len(data) + 1):
        assert outcome(end, True) == outcome(end, False), end


# ----------------------------------------------------------------------------------------------
# hostile pickles: a typed error and no side effect


class _Reduce:
    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> Any:
        return self.func, self.args


class Evil:
    """A user class whose unpickling would run a command."""

    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __setstate__(self, state: Any) -> None:  # pragma: no cover - must never run
        os.system(state["cmd"])


def _touch(path: Path) -> str:
    return f"touch {path}"


def hostile_payloads(sentinel: Path) -> dict[str, bytes]:
    cmd = _touch(sentinel)
    ecmd = cmd.encode()
    out: dict[str, bytes] = {}
    for proto in (0, 2, 4, 5):
        out[f"os.system-p{proto}"] = pickle.dumps(_Reduce(os.system, cmd), protocol=proto)
        out[f"eval-p{proto}"] = pickle.dumps(_Reduce(eval, f"__import__('os').system({cmd!r})"), protocol=proto)
        out[f"exec-p{proto}"] = pickle.dumps(_Reduce(exec, f"import os; os.system({cmd!r})"), protocol=proto)
        out[f"popen-p{proto}"] = pickle.dumps(_Reduce(subprocess.Popen, ["touch", str(sentinel)]), protocol=proto)
        out[f"user-class-setstate-p{proto}"] = pickle.dumps(Evil(cmd), protocol=proto)
        out[f"nested-in-dict-p{proto}"] = pickle.dumps({"ok": [1, {"x": _Reduce(os.system, cmd)}]},
                                                        protocol=proto)
    out["getattr-import"] = (b"c__builtin__\ngetattr\n(c__builtin__\n__import__\n(S'os'\ntRS'system'\ntR(S'"
                             + ecmd + b"'\ntR.")
    out["inst"] = b"(S'" + ecmd + b"'\nios\nsystem\n."
    out["obj"] = b"(cos\nsystem\nS'" + ecmd + b"'\no."
    out["newobj"] = b"\x80\x02cos\nsystem\nX" + struct.pack("<I", len(ecmd)) + ecmd + b"\x85\x81."
    out["newobj_ex"] = b"\x80\x04cos\nsystem\n)}\x92."
    out["stack_global"] = (b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c" + bytes([len(ecmd)]) + ecmd + b"\x85R.")
    out["stack_global_dotted"] = b"\x80\x04\x8c\x02os\x8c\x0bpath.exists\x93\x8c\x01/\x85R."
    out["reconstructor"] = b"ccopy_reg\n_reconstructor\n(c__main__\nEvil\nc__builtin__\nobject\nNtR."
    out["build-on-global"] = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n}X\x08\x00\x00\x00__code__K\x01sb."
    out["rebuild-from-type-calls-system"] = (
        b"\x80\x02ctorch._tensor\n_rebuild_from_type_v2\n(cos\nsystem\nctorch\nTensor\n(X"
        + struct.pack("<I", len(ecmd)) + ecmd + b"t}tR.")
    out["ext1"] = b"\x80\x02\x82\x01."
    out["ext4"] = b"\x80\x02\x84\x01\x00\x00\x00."
    out["getattr-on-torch"] = b"\x80\x02c__builtin__\ngetattr\nctorch\nops\nX\x04\x00\x00\x00aten\x86R."
    out["runpy"] = b"\x80\x02crunpy\n_run_code\nX\x01\x00\x00\x001}\x86R."
    out["apply-via-functools"] = b"\x80\x02cfunctools\npartial\ncos\nsystem\n\x85R)R."
    return out


def test_hostile_pickles_raise_typed_errors_and_run_nothing(tmp_path: Path) -> None:
    sentinel = tmp_path / "sentinel"
    payloads = hostile_payloads(sentinel)
    for name, data in payloads.items():
        if name.startswith(("user-class", "reconstructor")):  # an instance of a user class: an inert record
            out = sp.load(data, label="evil.pkl")
            assert isinstance(out, sp.Placeholder) and out.name.endswith(".Evil") and not out.module, name
        else:
            with pytest.raises(UnsafePickleError) as e:
                sp.load(data, label="evil.pkl")
            assert "evil.pkl" in str(e.value), name
        assert not sentinel.exists(), name
    # the controls really are live: Python's own pickle would have run them
    pickle.loads(payloads["os.system-p2"])
    assert sentinel.exists()


def test_refusals_name_the_callee(tmp_path: Path) -> None:
    payloads = hostile_payloads(tmp_path / "s")
    with pytest.raises(UnsafePickleError, match=r"'posix\.system'"):
        sp.load(payloads["os.system-p2"])
    with pytest.raises(UnsafePickleError, match=r"'builtins\.eval'"):
        sp.load(payloads["eval-p2"])
    with pytest.raises(UnsafePickleError, match=r"'subprocess\.Popen'"):
        sp.load(payloads["popen-p4"])
    with pytest.raises(UnsafePickleError, match=r"refusing to call 'functools\.partial'"):
        sp.load(payloads["apply-via-functools"])
    with pytest.raises(UnsafePickleError, match=r"BUILD would modify"):
        sp.load(payloads["build-on-global"])


def test_a_whole_model_is_a_module_placeholder() -> None:
    buf = io.BytesIO()
    torch.save(torch.nn.Sequential(torch.nn.Linear(1, 1)), buf)
    import zipfile

    with zipfile.ZipFile(buf) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    out = sp.load(data, persistent_load=lambda pid: sp.StorageRef(pid[2], "FloatStorage", "float32", pid[4], "cpu"))
    assert isinstance(out, sp.Placeholder) and out.name == "torch.nn.modules.container.Sequential" and out.module


def test_globals_as_data_are_opaque_and_reported() -> None:
    u = sp.Unpickler(pickle.dumps({"fn": os.system, "cls": Evil}, protocol=2))
    out = u.load()
    assert isinstance(out["fn"], sp.Opaque) and out["fn"].name == "posix.system"
    assert out["cls"].name.endswith(".Evil") and repr(out["cls"]).startswith("Opaque('")
    assert u.opaque == {"posix.system", out["cls"].name}


def test_persistent_id_tricks() -> None:
    # no persistent_load: a pickle with persistent ids has no data source
    with pytest.raises(FormatError, match="no data section"):
        sp.load(b"\x80\x02X\x01\x00\x00\x000Q.")
    # a rebuild whose storage is not a storage persistent id
    evil = b"\x80\x02ctorch._utils\n_rebuild_tensor\n(cos\nsystem\nK\x00))tR."
    with pytest.raises(FormatError, match="storage persistent id"):
        sp.load(evil)
    # sizes must be non-negative integers
    bad = b"\x80\x02ctorch._utils\n_rebuild_tensor\n(X\x01\x00\x00\x00kQK\x00J\xff\xff\xff\xff\x85K\x01\x85tR."
    with pytest.raises(FormatError, match="size"):
        sp.load(bad, persistent_load=lambda pid: sp.StorageRef("k", "FloatStorage", "float32", 1, "cpu"))


def test_bounds() -> None:
    def err(data: bytes, kind: type[MigratorError] = FormatError, match: str | None = None) -> None:
        with pytest.raises(kind, match=match):
            sp.load(data)

    err(b"\x80\x02X\xff\xff\xff\x7fabc.", match="declares 2147483647 bytes")  # string longer than input
    err(b"\x80\x04\x8e\x00\x00\x00\x00\x00\x00\x00\x40abc.", match="remain")  # BINBYTES8 of 2**62
    err(b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x01\x00.", match="FRAME")
    err(b"\x80\x02\x8b\xff\xff\xff\x7f.", LimitExceededError, "LONG4")
    err(b"\x80\x02\x8b\xff\xff\xff\xff.", match="negative")
    err(b"L" + b"9" * 5000 + b"\n.", LimitExceededError, "digits")
    err(b"\x80\x02h\x05.", match="memo entry 5")
    err(b"\x80\x06N.", match="protocol 6")
    err(b"\x80\x02N", match="truncated")
    err(b"\x80\x02}", match="truncated")
    err(b"\x80\x02\x97.", match="out-of-band")
    err(b"\x80\x05N\x98.", match="out-of-band")
    err(b"\x80\x02(" * 2000 + b".", LimitExceededError, "MARK")
    err(b"\x80\x02K\x01K\x02a.", match="APPEND to a int")
    err(b"\x80\x02}]K\x01s.", match="unhashable")
    err(b"\xff.", match="unknown opcode 0xff")
    err(b"S'unterminated\n.", match="STRING")
    err(b"\x80\x02X\x02\x00\x00\x00\xff\xfe.", match="utf-8")
    err(b"\x80\x02c__builtin__\nbytearray\nJ\x00\x00\x00\x7f\x85R.", match="bytearray")  # no bytearray(n)
    deep_key = b"\x80\x02}" + b"K\x01\x85" + b"\x85" * 100 + b"K\x00s."
    err(deep_key, LimitExceededError, "nested deeper")


def test_limits_are_configurable() -> None:
    small = sp.Limits(max_memo=2, max_stack=3, max_objects=10)
    with pytest.raises(LimitExceededError, match="memo"):
        sp.load(b"\x80\x02Nq\x00q\x01q\x02.", limits=small)
    with pytest.raises(LimitExceededError, match="stack"):
        sp.load(b"\x80\x02NNNN.", limits=small)
    with pytest.raises(LimitExceededError, match="values in one pickle"):
        sp.load(b"\x80\x02" + b"N0" * 11 + b"N.", limits=small)


def test_memo_bomb_stays_linear() -> None:
    # 30 levels of "a list holding the previous list twice": 2**30 paths, 30 lists in memory
    data = b"\x80\x02]q\x00" + b"".join(b"]q%c(h%ch%ce" % (i + 1, i, i) for i in range(30)) + b"."
    out = sp.load(data)
    depth = 0
    while isinstance(out, list) and out:
        assert out[0] is out[1]
        out, depth = out[0], depth + 1
    assert depth == 30
