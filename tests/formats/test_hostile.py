"""A hostile corpus, generated here: every file must fail with a typed error, run no code, stay small.

* >= 20 pickle attacks, each as a bare pickle, as `data.pkl` of a real `.pt` zip and as the main
  pickle of a legacy `torch.save` stream. A sentinel file is what each payload would create: the
  attacks marked `live` are first shown to create it under Python's own `pickle.loads` (in a
  subprocess), then shown not to under migrator.
* SafeTensors header bombs, burnpack bombs, zip bombs and absurd member sizes.

Every case runs under a SIGALRM time limit and tracemalloc: the peak of Python and numpy
allocations must stay below a small multiple of the input size plus a constant (see `BUDGETS`).
test_safepickle.py holds ~38 more bare-pickle payloads (protocols 0-5 of os.system, eval, exec,
Popen, user classes, ...); this file adds the containers, the sentinels per container and the
allocation bound.
"""

from __future__ import annotations

import functools
import io
import json
import os
import pickle
import re
import signal
import struct
import subprocess
import sys
import textwrap
import tracemalloc
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import migrator
from migrator.core import limits as limits_mod
from migrator.core.errors import FormatError, LimitExceededError, MigratorError, UnsafePickleError
from migrator.core.limits import DEFAULT_LIMITS, Limits
from migrator.formats import burnpack, cbor, pytorch, safetensors  # imported now, not counted per case
from migrator.formats.safepickle import WholeModelPickleError

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import fuzz  # noqa: E402  (tools/fuzz.py: the SIGALRM time limit shared with the fuzzers)

torch = pytest.importorskip("torch")
from tests.support.pickles import P2, P4, REBUILD, MiB, in_legacy, in_zip, outcome, u  # noqa: E402

# Allowed tracemalloc peak = factor x input bytes + constant. Pickles get a larger factor: every
# 1-byte opcode may create one Python object (~60 bytes); the Limits cap the count.


# ----------------------------------------------------------------------------------------------
# pickle building blocks (hand-written opcodes, so each attack is exactly what it claims)


def s0(text: str) -> bytes:
    """Protocol-0 STRING (no quotes or backslashes in `text`)."""
    assert "'" not in text and "\\" not in text and "\n" not in text
    return b"S'" + text.encode() + b"'\n"


def su(text: str) -> bytes:
    """SHORT_BINUNICODE (protocol 4)."""
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


def with_tensor(value: bytes) -> bytes:
    """{'w': <a real tensor>, 'x': value}: the payload sits inside an otherwise valid state_dict."""
    return P2 + b"}(" + u("w") + REBUILD + u("x") + value + b"u."


@dataclass(frozen=True)
class Attack:
    name: str
    build: Callable[[Path], bytes]  # sentinel path -> pickle bytes
    expect: type[MigratorError] = UnsafePickleError
    live: bool = False  # torch.load / pickle.loads create the sentinel (checked in a subprocess)
    bare_expect: type[MigratorError] | None = None  # a bare pickle may fail earlier (no data section)
    match: str | None = None  # the message, in the zip and legacy containers


def _cmd(s: Path) -> str:
    return f"touch {s}"


def _nested_pickle(s: Path) -> bytes:
    inner = b"cos\nsystem\n(" + s0(_cmd(s)) + b"tR."
    return P2 + b"c_pickle\nloads\nc_codecs\nencode\n" + u(inner.decode("latin-1")) + u("latin1") + b"\x86R\x85R."


def _memo_bomb(s: Path) -> bytes:
    """{'w': t, 'x': L30} where L(i+1) = [L(i), L(i)] and L0 = t: 2**30 paths to one tensor."""
    body = P2 + b"}(" + u("w") + REBUILD + b"q\x00" + u("x")
    body += b"".join(b"(h%ch%clq%c0" % (i, i, i + 1) for i in range(30))
    return body + b"h\x1eu."


ATTACKS: list[Attack] = [
    Attack("GLOBAL os.system + REDUCE", lambda s: b"cos\nsystem\n(" + s0(_cmd(s)) + b"tR.", live=True),
    Attack("GLOBAL posix.system + REDUCE", lambda s: b"cposix\nsystem\n(" + s0(_cmd(s)) + b"tR.", live=True),
    Attack("STACK_GLOBAL os.system", lambda s: P4 + su("os") + su("system") + b"\x93" + su(_cmd(s)) + b"\x85R.",
           live=True),
    Attack("GLOBAL subprocess.Popen", lambda s: b"csubprocess\nPopen\n((" + s0("touch") + s0(str(s)) + b"ltR.",
           live=True),
    Attack("STACK_GLOBAL subprocess.check_call",
           lambda s: P4 + su("subprocess") + su("check_call") + b"\x93](" + su("touch") + su(str(s)) + b"e\x85R.",
           live=True),
    Attack("builtins.eval", lambda s: b"c__builtin__\neval\n(S\"__import__('os').system('" + _cmd(s).encode()
           + b"')\"\ntR.", live=True),
    Attack("builtins.exec", lambda s: b"cbuiltins\nexec\n(S\"open('" + str(s).encode() + b"', 'w').close()\"\ntR.",
           live=True),
    Attack("builtins.getattr(__import__('os'), 'system')",
           lambda s: b"c__builtin__\ngetattr\n(c__builtin__\n__import__\n(" + s0("os") + b"tR" + s0("system")
           + b"tR(" + s0(_cmd(s)) + b"tR.", live=True),
    Attack("builtins.open for writing", lambda s: b"cbuiltins\nopen\n(" + s0(str(s)) + s0("w") + b"tR.", live=True),
    Attack("INST os.system", lambda s: b"(" + s0(_cmd(s)) + b"ios\nsystem\n.", live=True),
    Attack("OBJ os.system", lambda s: b"(cos\nsystem\n" + s0(_cmd(s)) + b"o.", live=True),
    Attack("NEWOBJ subprocess.Popen",
           lambda s: P2 + b"csubprocess\nPopen\n](" + u("touch") + u(str(s)) + b"e\x85\x81."),
    Attack("NEWOBJ_EX of a user class", lambda s: P4 + b"c__main__\nEvil\n)}\x92.", bare_expect=FormatError),
    Attack("REDUCE on a user class", lambda s: b"c__main__\nEvil\n(" + s0(_cmd(s)) + b"tR.", live=True,
           bare_expect=FormatError),
    Attack("BUILD with __setstate__", lambda s: P2 + b"c__main__\nEvil\n)\x81}" + u("cmd") + u(_cmd(s)) + b"sb.",
           live=True, bare_expect=FormatError),
    Attack("copyreg._reconstructor + BUILD",
           lambda s: b"ccopy_reg\n_reconstructor\n(c__main__\nEvil\nc__builtin__\nobject\nNtR}" + s0("cmd")
           + s0(_cmd(s)) + b"sb.", live=True, bare_expect=FormatError),
    Attack("BUILD on an allow-listed global (__code__)",
           lambda s: P2 + b"ctorch._utils\n_rebuild_tensor_v2\n}" + u("__code__") + b"K\x01sb."),
    Attack("functools.partial(os.system)", lambda s: P2 + b"cfunctools\npartial\ncos\nsystem\n" + u(_cmd(s))
           + b"\x86R)R.", live=True),
    Attack("operator.attrgetter on a module",
           lambda s: b"(coperator\nattrgetter\n(" + s0("system") + b"tR(cbuiltins\n__import__\n(" + s0("os")
           + b"tRtR(" + s0(_cmd(s)) + b"tR.", live=True),
    Attack("numpy.testing runstring gadget",
           lambda s: b"cnumpy.testing._private.utils\nrunstring\n(S\"import os; os.system('" + _cmd(s).encode()
           + b"')\"\n}tR.", live=True, bare_expect=FormatError),
    Attack("nested pickle via _codecs.encode + _pickle.loads", _nested_pickle, live=True),
    Attack("_rebuild_from_type_v2 calling os.system",
           lambda s: P2 + b"ctorch._tensor\n_rebuild_from_type_v2\n(cos\nsystem\nctorch\nTensor\n(" + u(_cmd(s))
           + b"t}tR.", live=True),
    Attack("torch.load as a gadget", lambda s: P2 + b"ctorch.serialization\nload\n" + u(str(s)) + b"\x85R."),
    Attack("EXT1 extension registry", lambda s: P2 + b"\x82\x01."),
    Attack("payload inside a valid state_dict", lambda s: with_tensor(b"cos\nsystem\n" + u(_cmd(s)) + b"\x85R"),
           live=True, bare_expect=FormatError),
    Attack("persistent id naming a whole nn.Module",
           lambda s: P2 + b"(" + u("module") + b"c__main__\nNet\n" + u("net.py") + b"NtQ.", FormatError,
           match=r"whole nn\.Module"),
    Attack("persistent id with os.system as storage type",
           lambda s: with_tensor(b"ctorch._utils\n_rebuild_tensor_v2\n((" + u("storage") + b"cos\nsystem\n"
                                 + u("0") + u("cpu") + b"K\x01tQK\x00K\x01\x85K\x01\x85\x89}tR"), FormatError,
           match="not a torch storage class"),
    Attack("persistent id with a path-traversal key",
           lambda s: P2 + b"}(" + u("w") + REBUILD.replace(u("0"), u("../../../../../etc/passwd")) + b"u.",
           FormatError, match="missing from the archive|never referenced|has no data"),
    Attack("persistent id declaring 2**62 elements",
           lambda s: P2 + b"}(" + u("w") + REBUILD.replace(b"K\x02tQ", b"\x8a\x08" + struct.pack("<q", 1 << 62)
                                                            + b"tQ") + b"u.", FormatError,
           match="declares .* bytes but the file holds"),
    Attack("persistent id declaring a 4 KiB element count",
           lambda s: P2 + b"}(" + u("w") + REBUILD.replace(b"K\x02tQ", b"\x8b\x00\x10\x00\x00" + b"\xff" * 4095
                                                            + b"\x7ftQ") + b"u.", FormatError, match="64-bit"),
    Attack("persistent id that is text (PERSID)", lambda s: b"(dS'w'\nP0\ns.", FormatError,
           match="persistent id is a str"),
    Attack("memo bomb (2**30 paths, 31 lists)", _memo_bomb, FormatError, match="memo bomb"),
    Attack("deep nesting (50k lists)", lambda s: with_tensor(b"]" * 50_000 + b"a" * 49_999), FormatError,
           match="nested more than"),
    Attack("deep MARK nesting", lambda s: P2 + b"(" * 5000 + b".", LimitExceededError, match="nested MARKs"),
    Attack("tuple nested 100 deep as a dict key",
           lambda s: P2 + b"}K\x01\x85" + b"\x85" * 100 + b"K\x00s.", LimitExceededError,
           match="nested deeper"),
    Attack("bytearray(2**31) allocation", lambda s: P2 + b"c__builtin__\nbytearray\nJ\xff\xff\xff\x7f\x85R.",
           FormatError, match="bytearray"),
    Attack("BINUNICODE declaring 4 GiB", lambda s: P2 + b"X\xff\xff\xff\xffabc.", FormatError,
           match="declares 4294967295 bytes"),
    Attack("LONG4 of 2 GiB", lambda s: P2 + b"\x8b\xff\xff\xff\x7f.", LimitExceededError, match="LONG4"),
    Attack("tensor size beyond int64 (4 KiB LONG4)",
           lambda s: P2 + b"}(" + u("w") + REBUILD.replace(b"K\x02\x85", b"\x8b\x00\x10\x00\x00" + b"\xff" * 4095
                                                            + b"\x7f\x85") + b"u.", FormatError,
           match="64 bits"),
]


def bare(payload: bytes) -> bytes:
    return payload


CONTAINERS = {"bare": bare, "zip": in_zip, "legacy": in_legacy}


def test_the_corpus_is_big_enough() -> None:
    assert len(ATTACKS) >= 20
    assert len({a.name for a in ATTACKS}) == len(ATTACKS)


def child_pids() -> set[int]:
    """The processes whose parent is this one, exited ones not yet waited for included."""
    me, found = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == me:
            found.add(int(stat.parent.name))
    return found


@pytest.mark.parametrize("container", list(CONTAINERS))
@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_pickle_attack_is_refused_and_runs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   attack: Attack, container: str) -> None:
    sentinel = tmp_path / "pwned"
    path = tmp_path / f"evil-{container}.pt"
    path.write_bytes(CONTAINERS[container](attack.build(sentinel)))
    before = child_pids()
    err = outcome(path, budget="pickle", limits=Limits(max_nodes=20_000))  # the memo bomb's walk, kept quick
    expect = attack.bare_expect if container == "bare" and attack.bare_expect else attack.expect
    assert isinstance(err, expect), f"{type(err).__name__}: {err}"
    if attack.expect is UnsafePickleError and container != "bare":
        assert "refus" in str(err) or isinstance(err, WholeModelPickleError), err
    if attack.match and container != "bare":
        assert re.search(attack.match, str(err)), err
    # os.system and friends would have created the sentinel before returning; a Popen would still be a child
    assert child_pids() <= before, "the payload started a process"
    assert not sentinel.exists()


def test_memo_bomb_memory_grows_with_the_node_limit_not_the_paths(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk is refused after `max_nodes` visits; what it holds until then is O(max_nodes)."""
    path = tmp_path / "bomb.pt"
    path.write_bytes(in_zip(_memo_bomb(tmp_path / "s")))
    peaks = []
    for limit in (10_000, 40_000):
        tracemalloc.start()
        with pytest.raises(LimitExceededError, match="memo bomb"), fuzz.time_limit(20):
            migrator.open_file(path, limits=Limits(max_nodes=limit))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    per_node = (peaks[1] - peaks[0]) / 30_000
    assert per_node < 400, f"{per_node:.0f} bytes per visited node"  # ~100 MB at the default 1M


LIVE_CONTROL = textwrap.dedent("""
    import json, os, pickle, sys

    class Evil:  # what a whole-model pickle's class could do
        def __init__(self, cmd=None):
            if cmd:
                os.system(cmd)

        def __setstate__(self, state):
            os.system(state["cmd"])

    created = []
    for how, path, sentinel in json.loads(sys.argv[1]):
        try:
            if how == "torch.load":
                import torch
                torch.load(path, weights_only=False)
            else:
                pickle.loads(open(path, "rb").read())
        except Exception as e:
            print("control:", path, type(e).__name__, e, file=sys.stderr)
        while True:  # wait for what the payload started (subprocess.Popen runs `touch` in a child)
            try:
                os.wait()
            except ChildProcessError:
                break
        if os.path.exists(sentinel):
            created.append(path)
    print(json.dumps(created))
""")


def test_live_attacks_really_run_under_torch_load_and_pickle(tmp_path: Path) -> None:
    """The control: the payloads marked live do create their sentinel when loaded for real, by
    `torch.load(weights_only=False)` from the zip and by `pickle.loads` from the bare pickle."""
    runs = []
    for i, attack in enumerate(a for a in ATTACKS if a.live):
        for how, container in (("torch.load", in_zip), ("pickle.loads", bare)):
            if how == "pickle.loads" and attack.bare_expect is not None:
                continue  # persistent ids come first: pickle.loads stops before the payload
            sentinel = tmp_path / f"sentinel-{i}-{container.__name__}"
            path = tmp_path / f"live-{i}-{container.__name__}.pt"
            path.write_bytes(container(attack.build(sentinel)))
            runs.append((how, str(path), str(sentinel)))
    out = subprocess.run([sys.executable, "-c", LIVE_CONTROL, json.dumps(runs)], capture_output=True, text=True,
                         timeout=300, check=True)
    created = set(json.loads(out.stdout))
    assert created == {p for _, p, _ in runs}, out.stderr


# ----------------------------------------------------------------------------------------------
# SafeTensors header bombs


def st_file(header: object | bytes, data: bytes = b"", *, length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def _entry(shape: list[object], offsets: list[object], dtype: str = "F32") -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


SAFETENSORS_BOMBS: dict[str, tuple[bytes, type[MigratorError]]] = {
    "declared length 2**64-1": (st_file(b"{}", length=2**64 - 1), LimitExceededError),
    "declared length over the 100 MB limit": (st_file(b"{}", length=100_000_001), LimitExceededError),
    "declared length past the end": (st_file(b"{}", length=99_999_999), FormatError),
    "nested arrays 100k deep": (st_file(b"[" * 100_000 + b"]" * 100_000), FormatError),
    "nested objects 50k deep": (st_file(b'{"a":' * 50_000 + b"1" + b"}" * 50_000), FormatError),
    "overlapping offsets": (st_file({"a": _entry([2], [0, 8]), "b": _entry([2], [4, 12])}, bytes(12)), FormatError),
    "offsets out of bounds": (st_file({"a": _entry([2], [0, 8])}, bytes(4)), FormatError),
    "offsets beyond 64 bits": (st_file({"a": _entry([1], [2**70, 2**70 + 4])}, bytes(4)), FormatError),
    "negative shape": (st_file({"a": _entry([-1], [0, 4])}, bytes(4)), FormatError),
    "float shape": (st_file(b'{"a":{"dtype":"F32","shape":[1e400],"data_offsets":[0,4]}}', bytes(4)), FormatError),
    "shape overflowing 64 bits": (st_file({"a": _entry([2**32, 2**32, 2**32], [0, 4])}, bytes(4)),
                                  LimitExceededError),
    "shape bomb: 100k dims of 2**64-1": (st_file({"a": _entry([2**64 - 1] * 100_000, [0, 4])}, bytes(4)),
                                         LimitExceededError),
    "5000-digit integer": (st_file(b'{"a":{"dtype":"F32","shape":[' + b"9" * 5000 + b'],"data_offsets":[0,4]}}'),
                           FormatError),
    "non-string metadata value": (st_file({"__metadata__": {"k": 1}}), FormatError),
    "nested metadata value": (st_file({"__metadata__": {"k": {"x": "y"}}}), FormatError),
    "metadata not an object": (st_file({"__metadata__": ["k"]}), FormatError),
    "duplicate tensor names": (st_file(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                       b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', bytes(2)), FormatError),
    "NaN constant": (st_file(b'{"a":NaN}'), FormatError),
    "not UTF-8": (st_file(b'{"\xff":1}'), FormatError),
    "header is an array": (st_file(b"[1,2]"), FormatError),
    "unknown dtype": (st_file({"a": _entry([1], [0, 4], "F128")}, bytes(4)), MigratorError),
}


@pytest.mark.parametrize("case", list(SAFETENSORS_BOMBS))
def test_safetensors_header_bombs(tmp_path: Path, case: str) -> None:
    data, expect = SAFETENSORS_BOMBS[case]
    path = tmp_path / "bomb.safetensors"
    path.write_bytes(data)
    err = outcome(path, fmt="safetensors")
    assert isinstance(err, expect), f"{type(err).__name__}: {err}"


# ----------------------------------------------------------------------------------------------
# burnpack bombs


def bpk(meta: bytes, data: bytes = b"", *, declared: int | None = None) -> bytes:
    head = b"NRUB" + struct.pack("<HI", 1, len(meta) if declared is None else declared) + meta
    return head + bytes(-len(head) % 256) + data


def bpk_tensors(tensors: dict[str, object], data: bytes = b"") -> bytes:
    return bpk(cbor.encode({"tensors": tensors}), data)


def _d(shape: list[int], offsets: list[int], dtype: str = "F32") -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


BURNPACK_BOMBS: dict[str, tuple[bytes, type[MigratorError]]] = {
    "metadata size 2**32-1": (bpk(b"\xa0", declared=2**32 - 1), LimitExceededError),
    "metadata size just over 100 MiB": (bpk(b"\xa0", declared=100 * MiB + 1), LimitExceededError),
    "metadata past the end": (bpk(b"\xa0", declared=50_000), FormatError),
    "CBOR nesting bomb (arrays)": (bpk(b"\x81" * 200_000 + b"\x00"), FormatError),
    "CBOR nesting bomb (maps)": (bpk(b"\xa1\x00" * 100_000 + b"\x00"), FormatError),
    "CBOR nesting bomb (tags)": (bpk(b"\xc0" * 200_000 + b"\x00"), FormatError),
    "CBOR nesting bomb (indefinite)": (bpk(b"\x9f" * 200_000), FormatError),
    "CBOR array declaring 2**64-1 items": (bpk(b"\x9b" + b"\xff" * 8), FormatError),
    "CBOR text declaring 4 GiB": (bpk(b"\xa1\x7a\xff\xff\xff\xff"), FormatError),
    "offsets past the end": (bpk_tensors({"a": _d([4], [0, 16])}, bytes(8)), FormatError),
    "misaligned offsets": (bpk_tensors({"a": _d([1], [0, 4]), "b": _d([1], [4, 8])}, bytes(8)), FormatError),
    "overlapping tensors": (bpk_tensors({"a": _d([64], [0, 256]), "b": _d([128], [0, 512])}, bytes(512)),
                            FormatError),
    "shape x dtype overflow": (bpk_tensors({"a": _d([2**63, 2**63], [0, 4])}, bytes(4)), LimitExceededError),
    "shape bomb: 80k dims of 2**64-1": (bpk_tensors({"a": _d([2**64 - 1] * 80_000, [0, 4])}, bytes(4)),
                                        LimitExceededError),
    "tensor over 10 GiB": (bpk_tensors({"a": _d([2**32], [0, 2**34], "F32")}, bytes(4)), LimitExceededError),
    "shape disagrees with bytes": (bpk_tensors({"a": _d([3], [0, 4])}, bytes(4)), FormatError),
    "duplicate descriptor field": (bpk(cbor.encode({"tensors": {"a": cbor.RawCbor(
        b"\xa4" + cbor.encode("dtype") + cbor.encode("F32") + cbor.encode("shape") + cbor.encode([1])
        + cbor.encode("shape") + cbor.encode([1]) + cbor.encode("data_offsets") + cbor.encode([0, 4]))}}),
        bytes(4)), FormatError),
    "offsets beyond u64": (bpk_tensors({"a": _d([1], [0, 2**64 - 1])}, bytes(4)), MigratorError),
}


@pytest.mark.parametrize("case", list(BURNPACK_BOMBS))
def test_burnpack_bombs(tmp_path: Path, case: str) -> None:
    data, expect = BURNPACK_BOMBS[case]
    path = tmp_path / "bomb.bpk"
    path.write_bytes(data)
    err = outcome(path, fmt="burnpack")
    assert isinstance(err, expect), f"{type(err).__name__}: {err}"


def test_burnpack_duplicate_names_keep_the_last_like_burn(tmp_path: Path) -> None:
    """A CBOR map naming a tensor twice is not an error in Burn (serde keeps the last): one tensor results."""
    first = cbor.encode("a") + cbor.encode(_d([1], [0, 4]))
    second = cbor.encode("a") + cbor.encode(_d([2], [256, 264]))
    meta = cbor.encode({"tensors": cbor.RawCbor(b"\xa2" + first + second)})
    path = tmp_path / "dup.bpk"
    path.write_bytes(bpk(meta, np.ones(64, np.float32).tobytes() + np.full(2, 7, np.float32).tobytes()))
    with migrator.open_file(path) as r:
        assert r.names() == ["a"]
        assert r["a"].numpy().tolist() == [7.0, 7.0]


# ----------------------------------------------------------------------------------------------
# zip bombs and absurd member sizes


def real_pt() -> bytes:
    buf = io.BytesIO()
    torch.save({"w": torch.ones(4), "b": torch.zeros(2)}, buf)
    return buf.getvalue()


def rebuilt(transform: Callable[[zipfile.ZipInfo, bytes], tuple[bytes, int]]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(real_pt())) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            data, method = transform(info, zin.read(info))
            zout.writestr(zipfile.ZipInfo(info.filename), data, compress_type=method)
    return out.getvalue()


@functools.cache
def deflate_bomb() -> bytes:
    """Storage '0' replaced by 256 MiB of zeros, deflated to ~250 KB."""
    return rebuilt(lambda info, data: (bytes(256 * MiB), zipfile.ZIP_DEFLATED) if info.filename.endswith("data/0")
                   else (data, zipfile.ZIP_STORED))


def patch_central(raw: bytes, suffix: str, **fields: int) -> bytes:
    """Overwrite central-directory fields (csize, usize, lho, nlen) of the member ending in `suffix`."""
    buf = bytearray(raw)
    offsets = {"crc": (16, "<I"), "csize": (20, "<I"), "usize": (24, "<I"), "xlen": (30, "<H"), "lho": (42, "<I"),
               "method": (10, "<H")}
    i = buf.find(b"PK\x01\x02")
    while i >= 0:
        nlen = struct.unpack_from("<H", buf, i + 28)[0]
        if buf[i + 46 : i + 46 + nlen].decode().endswith(suffix):
            for k, v in fields.items():
                off, fmt = offsets[k]
                struct.pack_into(fmt, buf, i + off, v)
            return bytes(buf)
        i = buf.find(b"PK\x01\x02", i + 4)
    raise AssertionError(suffix)


def patch_eocd(raw: bytes, **fields: int) -> bytes:
    """Patch the end record and, when there is one (torch.save always writes one), the zip64 end record:
    torch's reader, like migrator's, takes the zip64 record's values when its locator is present."""
    buf = bytearray(raw)
    i = buf.rfind(b"PK\x05\x06")
    z64 = buf.rfind(b"PK\x06\x06", 0, i)
    offsets = {"n_disk": (8, "<H", 24), "n_total": (10, "<H", 32), "cd_size": (12, "<I", 40), "cd_off": (16, "<I", 48)}
    for k, v in fields.items():
        off, fmt, off64 = offsets[k]
        struct.pack_into(fmt, buf, i + off, v)
        if z64 >= 0 and buf[i - 20 : i - 16] == b"PK\x06\x07":
            struct.pack_into("<Q", buf, z64 + off64, v)
    return bytes(buf)


def _dup_member() -> bytes:
    raw = real_pt()
    name = next(n for n in zipfile.ZipFile(io.BytesIO(raw)).namelist() if n.endswith("data/1"))
    return raw.replace(name.encode(), name[:-1].encode() + b"0")


ZIP_BOMBS: dict[str, Callable[[], bytes]] = {
    "deflated 256 MiB storage": deflate_bomb,
    "deflated data.pkl": lambda: rebuilt(lambda info, data: (data, zipfile.ZIP_DEFLATED
                                                             if info.filename.endswith("data.pkl")
                                                             else zipfile.ZIP_STORED)),
    "storage size 4 GiB - 1": lambda: patch_central(real_pt(), "data/0", csize=2**32 - 2, usize=2**32 - 2),
    "data.pkl declared 4 GiB - 1": lambda: patch_central(real_pt(), "data.pkl", csize=2**32 - 2, usize=2**32 - 2),
    "saturated sizes without zip64": lambda: patch_central(real_pt(), "data/0", csize=2**32 - 1, usize=2**32 - 1),
    "local header offset past the end": lambda: patch_central(real_pt(), "data/0", lho=2**32 - 2),
    "65535 entries in a small directory": lambda: patch_eocd(real_pt(), n_disk=0xFFFE, n_total=0xFFFE),
    "central directory size 4 GiB - 2": lambda: patch_eocd(real_pt(), cd_size=2**32 - 2),
    "multi-disk counts": lambda: patch_eocd(real_pt(), n_disk=1),
    "extra field length runs past the directory": lambda: patch_central(real_pt(), "data.pkl", xlen=0xFFFF),
    "CRC mismatch on data.pkl": lambda: patch_central(real_pt(), "data.pkl", crc=0),
    "unknown compression method": lambda: patch_central(real_pt(), "data/0", method=99),
    "duplicate member names": _dup_member,
    "zip inside the zip as data.pkl": lambda: rebuilt(lambda info, data: (real_pt() if info.filename.endswith(
        "data.pkl") else data, zipfile.ZIP_STORED)),
}


@pytest.mark.parametrize("case", list(ZIP_BOMBS))
def test_zip_bombs_and_absurd_member_sizes(tmp_path: Path, case: str) -> None:
    path = tmp_path / "bomb.pt"
    path.write_bytes(ZIP_BOMBS[case]())
    err = outcome(path)
    assert isinstance(err, FormatError), f"{type(err).__name__}: {err}"


def test_zip_bomb_is_refused_before_inflating(tmp_path: Path) -> None:
    data = deflate_bomb()
    assert len(data) < 2 * MiB
    path = tmp_path / "bomb.pt"
    path.write_bytes(data)
    err = outcome(path)  # tracemalloc peak bounded by 16 x 0.3 MB + 8 MiB, far below 256 MiB
    assert "compressed" in str(err) and "zip-bomb" in str(err)


TAR_BOMBS = {
    "member size 2**80 (base-256)": lambda hdr: hdr[:124] + b"\x80" + (2**80).to_bytes(11, "big") + hdr[136:],
    "member size 8 GiB (octal)": lambda hdr: hdr[:124] + b"%011o\0" % (8 << 30) + hdr[136:],
}


@pytest.mark.parametrize("case", list(TAR_BOMBS))
def test_tar_absurd_member_sizes(tmp_path: Path, case: str) -> None:
    seed = fuzz.pytorch_tar_seeds()[1]
    patched = fuzz.fix_tar_checksums(TAR_BOMBS[case](seed[:512]) + seed[512:])
    path = tmp_path / "bomb.tar"
    path.write_bytes(patched)
    assert isinstance(outcome(path), FormatError)


def test_legacy_storage_count_beyond_the_file(tmp_path: Path) -> None:
    data = in_legacy(with_tensor(b"N")).replace(struct.pack("<q", 2) + np.ones(2, np.float32).tobytes(),
                                                  struct.pack("<q", 2**62) + np.ones(2, np.float32).tobytes())
    path = tmp_path / "legacy.pt"
    path.write_bytes(data)
    assert isinstance(outcome(path, budget="pickle"), FormatError)


def test_sys_info_with_a_huge_integer_still_inspects(tmp_path: Path) -> None:
    """A 4 KiB LONG in sys_info must not reach `inspect --json` (str() of it would raise ValueError)."""
    from migrator.analysis.inspect import summarize

    sys_info = P2 + b"}(" + u("little_endian") + b"\x88" + u("x") + b"\x8b\x00\x10\x00\x00" + b"\x01" * 4096 + b"u."
    head = pickle.dumps(pytorch.LEGACY_MAGIC, protocol=2) + pickle.dumps(1001, protocol=2)
    tail = pickle.dumps(["0"], protocol=2) + struct.pack("<q", 2) + np.ones(2, np.float32).tobytes()
    path = tmp_path / "legacy.pt"
    path.write_bytes(head + sys_info + with_tensor(b"N") + tail)
    with migrator.open_file(path) as r:
        json.dumps(summarize(r))
        assert "x" not in r.extra()["sys_info"] and r.extra()["sys_info"]["little_endian"] is True


def test_names_that_are_not_unicode_fail_typed(tmp_path: Path) -> None:
    """A pickle may name a tensor with a lone surrogate (BINUNICODE, surrogatepass): the reader refuses
    it, as SafeTensors and burnpack readers do; writers refuse such a name from anywhere else too."""
    payload = P2 + b"}(" + u(b"w\xed\xa0\x80") + REBUILD + b"u."
    path = tmp_path / "odd.pt"
    path.write_bytes(in_zip(payload))
    with pytest.raises(FormatError, match="lone surrogate"):
        migrator.open_file(path)
    odd = migrator.from_numpy("w\ud800", np.zeros(2, np.float32))
    for fmt in ("burnpack", "safetensors", "pytorch"):
        with pytest.raises(MigratorError, match=r"Unicode|UTF-8"):
            migrator.save([odd], tmp_path / f"out.{fmt}", format=fmt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd.pt"]


def test_a_file_is_what_it_holds_not_what_it_is_named(tmp_path: Path) -> None:
    """A zip bomb named .safetensors / .bpk is detected by magic and refused as PyTorch."""
    for name in ("bomb.safetensors", "bomb.bpk"):
        path = tmp_path / name
        path.write_bytes(deflate_bomb())
        assert "compressed" in str(outcome(path))


def test_crc_is_checked_before_unpickling(tmp_path: Path) -> None:
    """A data.pkl patched after zipping (CRC stale) is refused before a single opcode runs."""
    raw = in_zip(P2 + b"cos\nsystem\n" + u("true") + b"\x85R.")
    tampered = raw.replace(b"true", b"echo")
    path = tmp_path / "t.pt"
    path.write_bytes(tampered)
    assert "CRC-32" in str(outcome(path))


# ----------------------------------------------------------------------------------------------
# the limits are what SECURITY.md says, and can be moved the way it says


def test_documented_limit_values() -> None:
    from migrator.recipe import loader as recipe_loader

    documented = {
        "max_file_bytes": 100 << 30, "max_metadata_bytes": 100 * MiB, "max_tensors": 100_000,
        "max_tensor_bytes": 10 << 30, "max_header_bytes": 100_000_000, "header_object_bytes": 14,
        "header_object_base": 56 * MiB, "max_pickle_bytes": 1 << 30, "max_zip_entries": 1_000_000,
        "max_zip_directory_bytes": 256 * MiB, "max_small_record_bytes": MiB, "max_tar_members": 100_000,
        "max_nodes": 1_000_000, "max_nesting": 1_000, "max_expanded_bytes": 1 << 30, "max_memo": 5_000_000,
        "max_stack": 5_000_000, "max_marks": 1_000, "max_objects": 10_000_000, "max_long_bytes": 4096,
        "max_key_depth": 32, "max_dims": 64, "max_same_hash": 64, "max_object_bytes": 80,
        "pickle_object_base": MiB, "max_index_bytes": 64 * MiB, "max_shards": 100_000, "max_name_chars": 65_536,
    }
    assert {f: getattr(DEFAULT_LIMITS, f) for f in limits_mod.NAMES} == documented
    # Burn's reader refuses what its defaults refuse: the writer's bounds are those
    burn = (burnpack.BURN_MAX_METADATA_SIZE, burnpack.BURN_MAX_TENSOR_COUNT, burnpack.BURN_MAX_TENSOR_SIZE)
    assert burn == (DEFAULT_LIMITS.max_metadata_bytes, DEFAULT_LIMITS.max_tensors, DEFAULT_LIMITS.max_tensor_bytes)
    assert cbor.MAX_DEPTH == 128
    assert DEFAULT_LIMITS.max_header_bytes == safetensors.MAX_HEADER_SIZE
    assert 10 * MiB == recipe_loader.MAX_RECIPE_BYTES
    assert recipe_loader.MAX_YAML_NODES == 100_000
    security = (REPO / "SECURITY.md").read_text()
    for name in documented:
        assert f"`{name}`" in security, name


def test_limits_move_as_documented(tmp_path: Path) -> None:
    """A `Limits` value given to `open_file` (or `--limit` on the command line) moves each bound for
    that reader only; the defaults stay as they were."""
    blob = migrator.to_bytes([migrator.from_numpy(f"t{i}", np.zeros(1, np.float32)) for i in range(3)], "burnpack")
    with pytest.raises(LimitExceededError, match="limit of 2"):
        migrator.open_file(blob, limits=Limits(max_tensors=2))
    assert len(migrator.open_file(blob)) == 3
    st = migrator.to_bytes([migrator.from_numpy("t", np.zeros(1, np.float32))], "safetensors")
    with pytest.raises(LimitExceededError, match="at most 16"):
        migrator.open_file(st, limits=DEFAULT_LIMITS.replace(max_header_bytes=16))
    pt = in_zip(with_tensor(b"N"))
    assert len(migrator.open_file(pt)) == 1
    with pytest.raises(LimitExceededError, match="values in one pickle"):
        migrator.open_file(pt, limits=Limits(max_objects=5))
    with pytest.raises(LimitExceededError, match=r"dimensions \(limit 0\)"):
        migrator.open_file(pt, limits=Limits(max_dims=0))
    assert len(migrator.open_file(pt)) == 1


def test_limit_settings_parse_sizes_and_suggest_names() -> None:
    limits = DEFAULT_LIMITS.with_settings(["max_tensor_bytes=20GiB", "max_metadata_bytes=5MB", "max_nodes=2_000"])
    assert (limits.max_tensor_bytes, limits.max_metadata_bytes, limits.max_nodes) == (20 << 30, 5_000_000, 2000)
    assert DEFAULT_LIMITS.max_nodes == 1_000_000  # a new value; the defaults stay
    with pytest.raises(limits_mod.LimitSettingError, match="did you mean 'max_tensor_bytes'"):
        DEFAULT_LIMITS.with_settings(["max_tensor_byte=1"])
    for bad in ("max_nodes=5GiB", "max_nodes=", "max_nodes=-1", "max_tensor_bytes=5gb", "max_nodes", "=5"):
        with pytest.raises(limits_mod.LimitSettingError):
            DEFAULT_LIMITS.with_settings([bad])
    with pytest.raises(ValueError, match="max_dims"):
        Limits(max_dims=-1)


def test_limit_flag_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from migrator.cli import main

    path = tmp_path / "m.bpk"
    migrator.save([migrator.from_numpy(f"t{i}", np.zeros(1, np.float32)) for i in range(3)], path)
    assert main(["inspect", str(path), "--limit", "max_tensors=2"]) == 1
    assert "limit of 2 (max_tensors)" in capsys.readouterr().err
    assert main(["inspect", str(path), "--limit", "1", "--limit", "max_tensors=3"]) == 0  # N: rows shown
    assert "... and 2 more tensors" in capsys.readouterr().out
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource: {{path: {path}}}\ntarget: {{path: {tmp_path / 'o.safetensors'}}}\n")
    for command in (["plan", str(recipe)], ["validate", str(recipe)], ["run", str(recipe), "--no-progress"],
                    ["convert", str(path), str(tmp_path / "c.safetensors")]):
        assert main([*command, "--limit", "max_metadata_bytes=10B"]) == 1, command
        assert "exceeds the 10 byte limit" in capsys.readouterr().err, command
    assert not (tmp_path / "o.safetensors").exists() and not (tmp_path / "c.safetensors").exists()
    with pytest.raises(SystemExit) as exit_:
        main(["plan", str(recipe), "--limit", "max_tensor=2"])
    assert exit_.value.code == 2
    assert "unknown limit 'max_tensor': did you mean 'max_tensors'?" in capsys.readouterr().err


def test_file_truncated_under_a_reader(tmp_path: Path) -> None:
    """What SECURITY.md says about files changed while read, shown in a subprocess each.

    Writers read through pread / copy_file_range and fail typed; a numpy view taken before the
    truncation dies with SIGBUS on access (no Python code can catch that).
    """
    script = textwrap.dedent("""
        import os, sys
        import numpy as np
        from migrator import from_numpy, open_file, save
        from migrator.core import casts, dtypes
        save([from_numpy("a", np.ones(1 << 18, np.float32))], "m.safetensors", overwrite=True)
        r = open_file("m.safetensors")
        mode = sys.argv[1]
        if mode == "view-then-truncate":
            v = r["a"].numpy()
            os.truncate("m.safetensors", 4096)
            print(float(v.sum()))
        else:
            os.truncate("m.safetensors", 4096)
            tensors = r.tensors if mode == "copy" else [casts.cast(t, dtypes.F16) for t in r.tensors]
            try:
                save(tensors, "out.bpk", overwrite=True)
            except Exception as e:
                print(type(e).__name__, e)
    """)
    runs = {mode: subprocess.run([sys.executable, "-c", script, mode], cwd=tmp_path, capture_output=True, text=True,
                                 timeout=60) for mode in ("view-then-truncate", "copy", "cast")}
    assert runs["view-then-truncate"].returncode == -signal.SIGBUS
    for mode in ("copy", "cast"):
        assert runs[mode].returncode == 0, runs[mode].stderr
        assert runs[mode].stdout.startswith("TensorBytesSizeMismatchError"), runs[mode].stdout
    assert not (tmp_path / "out.bpk").exists()
