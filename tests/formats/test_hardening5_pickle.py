"""Issue 41, class 7 (the unpickler's allow-list): a global of a private module of the standard library
(`_operator`, `_functools`, ...: the C halves of code-running modules) is refused as soon as it is
called, as its public name is (SECURITY.md), never turned into a placeholder; `__main__`'s classes (a
script's own) still are placeholders. The oracle for "would run code" is `pickle.loads` itself: each
payload, unpickled by Python, creates the sentinel file."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import pytest

from migrator.core.errors import UnsafePickleError
from migrator.formats.safepickle import load


def _u(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _payloads(sentinel: Path) -> dict[str, bytes]:
    cmd = f"touch {sentinel}"
    system = b"cos\nsystem\n"
    return {
        # _functools.partial(os.system, cmd)()
        "_functools.partial": b"\x80\x02c_functools\npartial\n" + system + _u(cmd) + b"\x86R)R.",
        # _operator.methodcaller("system", cmd)(os module)
        "_operator.methodcaller": (b"\x80\x02c_operator\nmethodcaller\n" + _u("system") + _u(cmd) + b"\x86R"
                                   + b"cbuiltins\n__import__\n" + _u("os") + b"\x85R\x85R."),
    }


@pytest.mark.parametrize("name", ["_functools.partial", "_operator.methodcaller"])
def test_a_private_module_global_is_refused_at_once(name: str, tmp_path: Path) -> None:
    sentinel = tmp_path / "ran"
    payload = _payloads(sentinel)[name]
    pickle.loads(payload)  # the oracle: Python runs it
    assert sentinel.exists()
    sentinel.unlink()
    with pytest.raises(UnsafePickleError, match=f"refusing to call '{name}'"):
        load(payload, label="p.pkl")
    assert not sentinel.exists()


@pytest.mark.parametrize("module", ["_thread", "_posixsubprocess", "_io", "_ctypes", "_socket"])
def test_any_private_module_is_a_gadget(module: str) -> None:
    with pytest.raises(UnsafePickleError, match="refusing to call"):
        load(b"\x80\x02c" + module.encode() + b"\nanything\n)R.", label="p.pkl")


def test_a_scripts_own_class_is_still_a_placeholder() -> None:
    value = load(b"\x80\x02c__main__\nNet\n)R.", label="p.pkl")
    assert "Net" in repr(value)
