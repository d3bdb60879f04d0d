"""The plan's speed paths give what the general code gives."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from migrator import from_numpy, save
from migrator.core import dtypes
from migrator.core.tensor import LazyTensor
from migrator.plan.build import build_plan
from migrator.recipe.model import Recipe


def _slots(t: LazyTensor) -> tuple[object, ...]:
    return tuple(getattr(t, f.name) for f in dataclasses.fields(LazyTensor))


def test_hand_written_lazy_tensor_init_matches_the_fields() -> None:
    """LazyTensor.__init__ fills the slots itself: same order, defaults, keywords and frozenness."""
    f32 = dtypes.parse("F32")
    names = [f.name for f in dataclasses.fields(LazyTensor)]
    values = ["w", f32, (2, 3), 24, lambda: b"", None, 7, "file", None]
    assert _slots(LazyTensor(*values)) == tuple(values)
    assert _slots(LazyTensor(**dict(zip(names, values, strict=True)))) == tuple(values)
    short = LazyTensor("b", f32, (3,), 12, values[4])
    assert _slots(short) == ("b", f32, (3,), 12, values[4], None, None, None, None)
    assert [f.name for f in dataclasses.fields(LazyTensor) if f.default is dataclasses.MISSING] == names[:5]
    assert _slots(dataclasses.replace(short, name="c", param_id=3)) == ("c", f32, (3,), 12, values[4], None, 3, None,
                                                                         None)
    assert _slots(short.renamed("d"))[1:] == _slots(short)[1:]
    with pytest.raises(dataclasses.FrozenInstanceError):
        short.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        LazyTensor("a", f32, (1,), 4)  # type: ignore[call-arg]


def test_plan_ops_and_names_match_a_step_by_step_account(tmp_path: Path) -> None:
    """Shared ops tuples, the name lists and the per-signature module types change no entry."""
    tensors = []
    for layer in (0, 2, 3):  # a gap: indices are renumbered
        tensors += [from_numpy(f"m.h.{layer}.fc.weight", np.ones((4, 3), np.float32)),
                    from_numpy(f"m.h.{layer}.fc.bias", np.ones(4, np.float32)),
                    from_numpy(f"m.h.{layer}.ln_1.weight", np.ones(3, np.float32)),
                    from_numpy(f"m.h.{layer}.ln_1.bias", np.ones(3, np.float32))]
    tensors.append(from_numpy("m.wte.weight", np.ones((5, 3), np.float32)))
    save(tensors, tmp_path / "src.safetensors")
    r = Recipe.model_validate({"version": 1, "source": {"path": "src.safetensors", "contiguous_indices": True},
                               "remap": [{"from": r"^m\.", "to": ""}], "adapters": ["pytorch_to_burn"],
                               "dtype": {"cast": "F16"}, "target": {"path": "out.bpk"}})
    with build_plan(r, tmp_path) as plan:
        got = {e.source: (e.target, list(e.ops), e.module.name if e.module else None) for e in plan.entries}
    new_layer = {"0": "0", "2": "1", "3": "2"}
    want = {}
    for t in tensors:
        ops, name = [], t.name[2:]
        ops.append(f"remap {t.name} -> {name}")
        parts = name.split(".")
        if parts[0] == "h" and new_layer[parts[1]] != parts[1]:
            renumbered = ".".join([parts[0], new_layer[parts[1]], *parts[2:]])
            ops.append(f"index {name} -> {renumbered}")
            name = renumbered
        module = "Linear" if ".fc." in name else "LayerNorm" if ".ln_1." in name else "Embedding"
        if module == "Linear" and name.endswith("weight"):
            ops.append("transpose [4, 3] -> [3, 4]")
        if module == "LayerNorm":
            new = name.replace(".weight", ".gamma").replace(".bias", ".beta")
            ops.append(f"rename {name.rpartition('.')[2]} -> {new.rpartition('.')[2]}")
            name = new
        ops.append("cast F32 -> F16")
        want[t.name] = (name, ops, module)
    assert got == want


def test_stored_tensors_of_a_file_are_one_view_object_per_tensor(tmp_path: Path) -> None:
    """`stored` and `stored_many` over a file: the span is the loader, and both give the file's bytes."""
    from migrator.core.bytesource import FileSource, FileSpan
    from migrator.core.tensor import stored, stored_many

    path = tmp_path / "raw.bin"
    payload = bytes(range(256)) * 40
    path.write_bytes(payload)
    f32 = dtypes.parse("F32")
    offsets, lengths = [0, 16, 1024, 4096], [16, 1000, 0, 4000]
    with FileSource(path) as src:
        pairs = enumerate(zip(offsets, lengths, strict=True))
        one = [stored(f"t{i}", f32, (n // 4,), src, o, n) for i, (o, n) in pairs]
        many = stored_many(src, [t.name for t in one], [f32] * 4, [t.shape for t in one], offsets, lengths)
        for a, b, o, n in zip(one, many, offsets, lengths, strict=True):
            assert _slots(a)[:4] == _slots(b)[:4] and a.span == b.span and a.origin == b.origin == str(path)
            assert a.loader is a.span and b.loader is b.span and isinstance(a.span, FileSpan)
            assert (a.span.fd, a.span.offset, a.span.length) == (src.fd, o, n)
            assert bytes(a.data()) == bytes(b.data()) == payload[o:o + n]
        assert one[0].span != one[1].span and one[0].span != FileSpan(src.fd, 0, 16)  # spans compare by type


@pytest.mark.parametrize("src_name", ["F64", "F32", "F16", "BF16"])
@pytest.mark.parametrize("to_name", ["F64", "F32", "F16", "BF16", "I32"])
def test_caster_matches_cast_per_tensor(monkeypatch: pytest.MonkeyPatch, src_name: str, to_name: str) -> None:
    """The per-dtype-pair caster gives what `cast` gives, for plain and transposed tensors, or declines."""
    from migrator.core import casts
    from migrator.core.casts import cast, caster, transpose2d

    monkeypatch.setattr(casts, "STREAMED_ABOVE", 0)  # these small tensors stream too, to compare chunks

    src, to = dtypes.parse(src_name), dtypes.parse(to_name)
    values = np.linspace(-3.5, 70000.0, 6 * 5).astype(np.float64).reshape(6, 5)
    with np.errstate(over="ignore"):  # 70000 overflows F16 to inf on purpose
        arr = values.astype(src.numpy()) if src.numpy_name else values.astype(np.float32)
    base = from_numpy("w", arr, dtype=src) if src.numpy_name else from_numpy("w", arr)
    one = caster(src, to)
    if src == to or not to.is_float:
        assert one is None
        return
    assert one is not None
    for t in (base, transpose2d(base)):
        got, want = one(t), cast(t, to)
        assert (got.name, got.dtype, got.shape, got.nbytes, got.span) == (want.name, want.dtype, want.shape,
                                                                           want.nbytes, want.span)
        assert bytes(got.data()) == bytes(want.data())
        assert b"".join(map(bytes, got.chunks())) == bytes(want.data())  # type: ignore[misc]


def test_plain_plan_table_matches_a_cell_by_cell_rendering(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The large-plan table (memoised cells, `%` rows) prints what formatting each cell afresh prints."""
    from migrator.cli import recipe as recipe_cli

    tensors = [from_numpy(f"h.{i}.fc.weight", np.ones((4, 3 + i % 2), np.float32)) for i in range(4)]
    tensors += [from_numpy(f"h.{i}.ln.weight", np.ones(3 + i, np.float32)) for i in range(3)]
    tensors.append(from_numpy("ids", np.arange(5, dtype=np.int64)))
    save(tensors, tmp_path / "src.safetensors")
    r = Recipe.model_validate({"version": 1, "source": {"path": "src.safetensors", "contiguous_indices": True},
                               "remap": [{"from": r"^h\.3\.", "to": "h.9."}], "adapters": ["pytorch_to_burn"],
                               "dtype": {"cast": "F16"}, "target": {"path": "out.bpk"}})
    monkeypatch.setattr(recipe_cli, "RICH_TABLE_ROWS", 0)
    monkeypatch.setenv("COLUMNS", "10000")  # wide enough that nothing wraps: the cells compared as they are
    with build_plan(r, tmp_path) as plan:
        recipe_cli._print_plan_table(plan)
        rows = []
        for e in plan.entries:
            short = [op.split(" ", 1)[0] if op.split(" ", 1)[0] in ("remap", "index") else op for op in e.ops]
            before = "" if e.source_tensor is None else f"{e.source_tensor.dtype.display} {list(e.source_tensor.shape)}"
            module = "" if e.module is None else f"{e.module.name or '?'} ({e.module.how})"
            rows.append([e.source or "-", e.target, module, "; ".join(short), before,
                         f"{e.tensor.dtype.display} {list(e.tensor.shape)}", f"{e.tensor.nbytes} B"])  # all < 1 KiB
        title = f"{plan.source_path} ({plan.source_format}) -> {plan.target_path} ({plan.target_format})"
    header = ["source", "target", "module", "ops", "before", "after", "size"]
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    want = [title] + ["  ".join([*(c.ljust(w) for c, w in zip(row[:-1], widths, strict=False)),
                                 row[-1].rjust(widths[-1])]).rstrip()
                      for row in [header, ["-" * w for w in widths], *rows]]
    assert capsys.readouterr().out == "\n".join(want) + "\n"
