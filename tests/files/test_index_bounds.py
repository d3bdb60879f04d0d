"""Index files (`model.safetensors.index.json`) are untrusted JSON like any header: bounded by what
parsing them can build (objects, arrays, pairs, strings) and by nesting, before they are parsed; and
the shards they name are files, said to be what they are when they are not (a FIFO, a folder, a link
to a FIFO), never opened for a blocking read.

Oracles: the `safetensors` library's loader for the folders that open; for those refused, the typed
error and what it names. Memory is measured with tracemalloc around the open.
"""

from __future__ import annotations

import json
import os
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import migrator
from migrator.core.errors import FormatError, LimitExceededError, MigratorError
from tests.support.alarm import alarm
from tests.support.cli import migrate_in_process

st_numpy = pytest.importorskip("safetensors.numpy")


def folder(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A two-shard SafeTensors folder and its index, written with the library."""
    rng = np.random.default_rng(11)
    a = {"a.weight": rng.standard_normal((4, 3), dtype=np.float32)}
    b = {"b.weight": rng.standard_normal(5, dtype=np.float32)}
    d = tmp_path / "model"
    d.mkdir()
    st_numpy.save_file(a, str(d / "model-00001-of-00002.safetensors"))
    st_numpy.save_file(b, str(d / "model-00002-of-00002.safetensors"))
    index = {"metadata": {"total_size": 68}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                                                            "b.weight": "model-00002-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d, {**a, **b}


def test_a_good_folder_reads_as_the_library_does(tmp_path: Path) -> None:
    d, want = folder(tmp_path)
    with migrator.open_file(d) as r:
        got = {t.name: np.frombuffer(bytes(t.data()), np.float32).reshape(t.shape) for t in r.tensors}
    assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)


def index_with_metadata(d: Path, extra: str) -> None:
    """The folder's index with `extra` (raw JSON text) as its metadata's "x" value."""
    text = (d / "model.safetensors.index.json").read_text()
    (d / "model.safetensors.index.json").write_text(text.replace('"metadata": {', '"metadata": {"x": ' + extra + ", "))


@pytest.mark.parametrize("extra", [
    "[" * 100_000 + "]" * 100_000,  # arrays: RecursionError before
    '{"a":' * 50_000 + "1" + "}" * 50_000,  # objects
    "[" * 2_000 + "]" * 2_000,  # within the recursion limit: still far deeper than any index
])
def test_deep_nesting_is_a_format_error(tmp_path: Path, extra: str) -> None:
    d, _ = folder(tmp_path)
    index_with_metadata(d, extra)
    with pytest.raises(FormatError, match="nested") as e:
        migrator.open_file(d)
    assert "model.safetensors.index.json" in str(e.value)
    p = migrate_in_process("inspect", str(d))
    assert p.returncode == 1 and "nested" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("unit", ["[],", "{},", '"",', "[[],{}],"])
def test_many_small_objects_are_refused_before_parsing(tmp_path: Path, unit: str) -> None:
    d, _ = folder(tmp_path)
    n = (24 << 20) // len(unit)  # 24 MiB of tiny containers: under max_index_bytes (64 MiB)
    index_with_metadata(d, "[" + unit * n + "0]")
    tracemalloc.start()
    try:
        with pytest.raises(LimitExceededError, match="header_object_bytes"):
            migrator.open_file(d)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 << 20, peak  # the index's bytes and little more: nothing was parsed


def test_the_budget_moves_with_the_limits(tmp_path: Path) -> None:
    from migrator.core.limits import DEFAULT_LIMITS

    d, _ = folder(tmp_path)
    index_with_metadata(d, "[" + "[]," * 100_000 + "0]")  # 300 KB: fine by default
    with migrator.open_file(d) as r:
        assert len(r.tensors) == 2
    tight = DEFAULT_LIMITS.replace(header_object_bytes=1, header_object_base=0)
    with pytest.raises(LimitExceededError):
        migrator.open_file(d, limits=tight)


# ------------------------------------------------------------------------------- shards that are not files


def _fifo(path: Path) -> None:
    os.mkfifo(path)


@pytest.mark.parametrize(("make", "kind"), [
    (_fifo, "FIFO"),
    (lambda p: p.mkdir(), "folder"),
    (lambda p: (_fifo(p.with_name("pipe")), p.symlink_to("pipe")), "FIFO"),
])
def test_a_shard_that_is_not_a_file_is_said_to_be_what_it_is(tmp_path: Path, make: object, kind: str) -> None:
    d, _ = folder(tmp_path)
    shard = d / "model-00002-of-00002.safetensors"
    shard.unlink()
    make(shard)  # type: ignore[operator]
    done = threading.Event()
    with alarm(30, "a FIFO shard blocked the reader"):
        with pytest.raises(MigratorError) as e:
            migrator.open_file(d)
        done.set()
    text = str(e.value)
    assert kind in text and "missing" not in text and "model-00002-of-00002.safetensors" in text, text
    p = migrate_in_process("convert", str(d), str(tmp_path / "o.safetensors"))
    assert p.returncode == 1 and kind in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "o.safetensors").exists()


@pytest.mark.parametrize("make", [_fifo, lambda p: p.mkdir()])
def test_an_index_that_is_not_a_file_is_refused_without_blocking(tmp_path: Path, make: object) -> None:
    d, _ = folder(tmp_path)
    index = d / "model.safetensors.index.json"
    index.unlink()
    make(index)  # type: ignore[operator]
    with alarm(30, "a FIFO index blocked the reader"):
        p = migrate_in_process("inspect", str(index))
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert "not a regular file" in p.stderr or "folder" in p.stderr, p.stderr
