"""streaming.Ahead: computed tensors are produced on a thread ahead of the writer, bounded, in order,
with errors surfacing at their own tensor and no thread or source left behind on any exit."""

from __future__ import annotations

import errno
import io
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from migrator.core import casts, dtypes
from migrator.core.errors import TensorBytesSizeMismatchError
from migrator.core.streaming import AHEAD_BYTES, SMALL_READ, Ahead, write_tensor
from migrator.core.tensor import LazyTensor, from_numpy
from migrator.files.io import open_file, save, to_bytes

PIECE = 1 << 20


def _no_ahead_threads() -> bool:
    return not any(t.name == "migrator-ahead" for t in threading.enumerate())


class Recorder:
    """Computed tensors made of numbered pieces; logs when each piece is produced and closed."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()

    def log(self, *event: object) -> None:
        with self.lock:
            self.events.append(event)  # type: ignore[arg-type]

    def tensor(self, name: str, pieces: int, fail_at: int | None = None) -> LazyTensor:
        def chunks() -> Iterator[bytes]:
            try:
                for i in range(pieces):
                    if i == fail_at:
                        raise TensorBytesSizeMismatchError("broken on purpose", tensor=name)
                    self.log("made", name, i)
                    yield bytes([i % 251]) * PIECE
            finally:
                self.log("closed", name, -1)

        def whole() -> bytes:
            return b"".join(chunks())

        return LazyTensor(name, dtypes.BY_NAME["U8"], (pieces * PIECE,), pieces * PIECE, whole, None, None,
                          "recorder", chunks)


class LoggingSink(io.BytesIO):
    """An in-memory sink that logs how many bytes it had when each write arrived, and can fail."""

    def __init__(self, rec: Recorder, fail_after: int | None = None) -> None:
        super().__init__()
        self.rec, self.fail_after = rec, fail_after

    def write(self, b: object) -> int:
        view = memoryview(b).cast("B")  # type: ignore[arg-type]
        if self.fail_after is not None and self.tell() + len(view) > self.fail_after:
            raise OSError(errno.ENOSPC, "No space left on device (test)")
        self.rec.log("wrote", "", self.tell() + len(view))
        return super().write(view)


def test_real_writers_give_the_same_bytes_as_the_oracle(tmp_path: Path) -> None:
    """Transposes and casts of file-backed tensors, mixed with pass-through and small tensors."""
    rng = np.random.default_rng(7)
    arrays = {f"layer{i}.{kind}": rng.standard_normal(shape).astype(np.float32)
              for i in range(4) for kind, shape in (("weight", (384, 1280)), ("bias", (1280,)),
                                                    ("small", (7, 9)), ("tall", (3000, 129)))}
    src = tmp_path / "src.safetensors"
    save_file(arrays, str(src))
    reader = open_file(src)
    planned = []
    for t in reader.tensors:
        if t.name.endswith((".weight", ".small")):
            t = casts.transpose2d(t)
        if t.name.endswith(".tall"):
            t = casts.cast(casts.transpose2d(t), dtypes.BY_NAME["F16"])
        planned.append(t)
    assert sum(t.span is None and t.nbytes > SMALL_READ for t in planned) >= 8  # Ahead is really used
    for fmt in ("safetensors", "burnpack"):
        out = tmp_path / f"out.{fmt}"
        save(planned, out, format=fmt)
        got = {t.name: t.numpy() for t in open_file(out).tensors}
        for name, a in arrays.items():
            want = a.T.astype(np.float16) if name.endswith(".tall") else a.T if name.endswith(
                (".weight", ".small")) else a
            np.testing.assert_array_equal(got[name], want)
            assert got[name].dtype == want.dtype
    st = load_file(str(tmp_path / "out.safetensors"))  # and the safetensors library agrees
    np.testing.assert_array_equal(st["layer2.weight"], arrays["layer2.weight"].T)
    reader.close()
    assert _no_ahead_threads()


def test_the_next_tensor_is_computed_while_the_previous_is_written() -> None:
    rec = Recorder()
    tensors = [rec.tensor(f"t{i}", 3) for i in range(4)]
    sink = LoggingSink(rec)
    with Ahead(tensors) as ahead:
        for t in tensors:
            write_tensor(sink, t, ahead)
    # bytes and order are exactly the pieces in write order
    expected = b"".join(bytes([i % 251]) * PIECE for _ in range(4) for i in range(3))
    assert sink.getvalue() == expected
    # the thread made a piece of t1 before the writer had finished writing t0 (3 MiB)
    made_t1 = rec.events.index(("made", "t1", 0))
    t0_done = next(i for i, e in enumerate(rec.events) if e[0] == "wrote" and e[2] >= 3 * PIECE)
    assert made_t1 < t0_done
    assert _no_ahead_threads()


def test_the_thread_never_holds_more_than_its_budget() -> None:
    rec = Recorder()
    tensors = [rec.tensor(f"t{i}", 6) for i in range(5)]
    budget = 3 * PIECE
    sink = LoggingSink(rec)
    with Ahead(tensors, budget=budget) as ahead:
        for t in tensors:
            write_tensor(sink, t, ahead)
    made = written = 0
    worst = 0
    for kind, _, value in rec.events:
        if kind == "made":
            made += PIECE
        elif kind == "wrote":
            written = value
        worst = max(worst, made - written)
    # queued (budget) + the piece being written + the one being made when the budget is full
    assert worst <= budget + 2 * PIECE
    assert made == written == 30 * PIECE
    assert AHEAD_BYTES < 48 << 20  # the default stays inside this machine class's L3


def test_an_error_in_a_computed_tensor_surfaces_at_that_tensor(tmp_path: Path) -> None:
    rec = Recorder()
    tensors = [rec.tensor("good0", 2), rec.tensor("good1", 2), rec.tensor("bad", 3, fail_at=1),
               rec.tensor("never", 2)]
    target = tmp_path / "out.safetensors"
    target.write_bytes(b"old contents")
    with pytest.raises(TensorBytesSizeMismatchError) as err:
        save(tensors, target, overwrite=True)
    assert err.value.tensor == "bad"
    assert target.read_bytes() == b"old contents"  # the existing target survives
    assert ("made", "never", 0) not in rec.events  # nothing is computed past the failure
    assert _no_ahead_threads()


def test_a_write_error_stops_the_thread_and_closes_its_source() -> None:
    rec = Recorder()
    tensors = [rec.tensor(f"t{i}", 4) for i in range(6)]
    sink = LoggingSink(rec, fail_after=5 * PIECE)

    with pytest.raises(OSError) as err, Ahead(tensors) as ahead:
        for t in tensors:
            write_tensor(sink, t, ahead)
    assert err.value.errno == errno.ENOSPC
    assert _no_ahead_threads()
    made = {name for kind, name, _ in rec.events if kind == "made"}
    closed = {name for kind, name, _ in rec.events if kind == "closed"}
    assert made <= closed  # every started generator ran its finally (a source map is dropped)
    assert "t5" not in made  # the thread stopped instead of computing the rest of the model


def test_tensors_the_writer_keeps_are_not_taken() -> None:
    small = from_numpy("small", np.ones((4, 4), np.float32))
    rec = Recorder()
    big = [rec.tensor("a", 1), rec.tensor("b", 1)]
    with Ahead([small, *big]) as ahead:
        assert ahead.take(small) is None  # no chunks: the writer reads it itself
        assert ahead.take(big[1]) is None  # out of order: not this thread's next tensor
        pieces = ahead.take(big[0])
        assert pieces is not None and b"".join(pieces) == bytes(PIECE)


def test_one_large_computed_tensor_starts_no_thread() -> None:
    rec = Recorder()
    only = rec.tensor("only", 3)
    with Ahead([only]) as ahead:
        assert ahead.take(only) is None
        assert _no_ahead_threads()


def test_in_memory_writes_match_file_writes(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    base = [from_numpy(f"w{i}", rng.standard_normal((600, 700)).astype(np.float32)) for i in range(3)]
    planned = [casts.transpose2d(t) for t in base]
    out = tmp_path / "w.safetensors"
    save(planned, out)
    assert to_bytes(planned, format="safetensors") == out.read_bytes()
