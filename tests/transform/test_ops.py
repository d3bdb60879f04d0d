"""Recipe ops against torch: split, cat, stack, unbind, reshape, permute, slicing and the RoPE permutation
of Hugging Face's Llama conversion script, on seeded random tensors of every dtype, read from SafeTensors
files and from .pt files holding non-contiguous views; outputs read back with safetensors' own loader."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

from migrator.ops import streams  # noqa: E402
from migrator.ops.concat import concat  # noqa: E402
from migrator.ops.reshape import reshape  # noqa: E402
from migrator.ops.rope_permute import rope_permute  # noqa: E402
from migrator.ops.slice import slice_  # noqa: E402
from migrator.plan.build import RecipeFile, build_plan  # noqa: E402
from migrator.recipe.loader import RecipeError, load_recipe  # noqa: E402
from migrator.run.execute import run_plan  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool]


def hf_permute(w: torch.Tensor, n_heads: int, dim1: int, dim2: int) -> torch.Tensor:
    """The permutation as Hugging Face's Llama conversion script writes it (Meta -> HF)."""
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


def hf_unpermute(w: torch.Tensor, n_heads: int, dim1: int, dim2: int) -> torch.Tensor:
    """Its inverse (HF -> Meta)."""
    return w.view(n_heads, 2, dim1 // n_heads // 2, dim2).transpose(1, 2).reshape(dim1, dim2)


def rand(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000) + 1, shape, generator=g, dtype=torch.int64).to(dtype)


def sources(dtype: torch.dtype, strided: bool) -> dict[str, torch.Tensor]:
    """The inputs; with `strided`, several are non-contiguous views (transposed, stepped, permuted)."""
    g = torch.Generator().manual_seed(1234)

    def r(*shape: int) -> torch.Tensor:
        return rand(shape, dtype, g)

    t = {
        "w": r(12, 6).t() if strided else r(6, 12),
        "b": r(12),
        "x": r(4, 6, 5),
        "c.a": r(3, 5), "c.b": r(2, 5),
        "d.a": r(4, 2, 3), "d.b": r(4, 5, 3),
        "u": r(3, 2, 4),
        "r": r(2, 3, 4),
        "p2": r(5, 7),
        "p3": r(3, 4, 2).permute(2, 0, 1) if strided else r(2, 3, 4),
        "sl": r(20, 3)[::2] if strided else r(10, 3),
        "sl2": r(4, 10),
        "q": r(16, 6), "k": r(8, 6),
        "cc.a": r(5, 7), "cc.b": r(2, 5),
        "big": r(40, 33),
        "m.a": r(3, 5), "m.b": r(4, 5),
    }
    for i in range(4):
        t[f"e.{i}"] = r(4, 3).t() if strided and i == 1 else r(3, 4)
    for i in range(3):
        t[f"s.{i}"] = r(2, 3)
    return t


RECIPE = r"""
version: 1
source: {path: SRC}
ops:
  - split: {from: 'w', dim: 1, sizes: [3, 4, 5], to: ['w.0', 'w.1', 'w.2']}
  - permute: {from: 'w\.1', dims: [1, 0], to: 'w.1t'}
  - split: {from: 'b', parts: 3, to: 'b.$i'}
  - split: {from: 'x', dim: -2, parts: 2, to: 'x.$i'}
  - concat: {from: ['c\.a', 'c.b'], dim: 0, to: 'c'}
  - concat: {from: ['d\.a', 'd.b'], dim: 1, to: 'd'}
  - stack: {from: 'e\.(\d+)', over: 1, to: 'e'}
  - stack: {from: 's\.(?P<n>\d+)', over: n, dim: 1, to: 's'}
  - unstack: {from: 'u', dim: 1, to: 'u.${i}'}
  - reshape: {from: 'r', shape: [-1, 4]}
  - permute: {from: 'p2', dims: [1, 0]}
  - permute: {from: 'p3', dims: [2, 0, 1]}
  - slice: {from: 'sl', dim: 0, start: 2, stop: 7}
  - slice: {from: 'sl2', dim: 1, start: -6, stop: -1}
  - rope_permute: {from: 'q', heads: 2}
  - rope_permute: {from: 'k', heads: 2, inverse: true}
  - permute: {from: 'cc\.a', dims: [1, 0], to: 'cc.at'}
  - concat: {from: ['cc\.at', 'cc.b'], dim: 0, to: 'cc'}
  - slice: {from: 'big', dim: 1, start: 5, stop: 30, to: 'big.cols'}
  - split: {from: 'big\.cols', dim: 0, sizes: [1, 39], to: ['big.top', 'big.rest']}
  - concat: {from: ['big\.rest', 'big.top'], dim: 0, to: 'big.rolled'}
  - concat: {from: ['m\.a', 'm.b'], dim: 0, to: 'm'}
  - permute: {from: 'm', dims: [1, 0]}
  - reshape: {from: 'nothing', shape: [1], optional: true}
target: {path: out.safetensors}
"""


def expected(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    w = torch.split(t["w"], [3, 4, 5], dim=1)
    cols = t["big"][:, 5:30]
    top, rest = torch.split(cols, [1, 39], dim=0)
    out = {
        "w.0": w[0], "w.1t": w[1].permute(1, 0), "w.2": w[2],
        **{f"b.{i}": p for i, p in enumerate(torch.split(t["b"], 4))},
        **{f"x.{i}": p for i, p in enumerate(torch.chunk(t["x"], 2, dim=-2))},
        "c": torch.cat([t["c.a"], t["c.b"]], 0),
        "d": torch.cat([t["d.a"], t["d.b"]], 1),
        "e": torch.stack([t[f"e.{i}"] for i in range(4)]),
        "s": torch.stack([t[f"s.{i}"] for i in range(3)], dim=1),
        **{f"u.{i}": p for i, p in enumerate(torch.unbind(t["u"], 1))},
        "r": t["r"].reshape(-1, 4),
        "p2": t["p2"].permute(1, 0),
        "p3": t["p3"].permute(2, 0, 1),
        "sl": t["sl"][2:7],
        "sl2": t["sl2"][:, -6:-1],
        "q": hf_permute(t["q"], 2, 16, 6),
        "k": hf_unpermute(t["k"], 2, 8, 6),
        "cc": torch.cat([t["cc.a"].permute(1, 0), t["cc.b"]], 0),
        "big.rolled": torch.cat([rest, top], 0),
        "m": torch.cat([t["m.a"], t["m.b"]], 0).permute(1, 0),
    }
    return {k: v.contiguous() for k, v in out.items()}


def run(tmp_path: Path, src: Path, text: str = RECIPE, name: str = "recipe.yaml") -> dict[str, torch.Tensor]:
    recipe = tmp_path / name
    recipe.write_text(text.replace("SRC", src.name))
    loaded = load_recipe(recipe)
    with build_plan(loaded.recipe, loaded.base_dir, file=RecipeFile(op_origins=loaded.op_origins)) as plan:
        assert plan.ok, plan.fatal
        run_plan(plan, progress=False)
    return st.load_file(tmp_path / "out.safetensors")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_ops_equal_torch(tmp_path: Path, dtype: torch.dtype, fmt: str) -> None:
    t = sources(dtype, strided=fmt == "pt")
    src = tmp_path / f"in.{fmt}"
    if fmt == "pt":
        torch.save(t, src)
        assert not t["w"].is_contiguous() and not t["sl"].is_contiguous()
    else:
        st.save_file({k: v.contiguous() for k, v in t.items()}, src)
    got = run(tmp_path, src)
    want = expected(t)
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch.equal(got[k].view(torch.uint8) if v.dtype != torch.bool else got[k],
                           v.view(torch.uint8) if v.dtype != torch.bool else v), k


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_ops_in_small_bands(tmp_path: Path, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """The band and strided-read paths, which real tensors take above a few MiB, on small ones."""
    monkeypatch.setattr(streams, "BAND", 40)
    monkeypatch.setattr(streams, "STRIDED_READ", 12)
    for fmt in ("pt", "safetensors"):
        t = sources(dtype, strided=fmt == "pt")
        src = tmp_path / f"in.{fmt}"
        if fmt == "pt":
            torch.save(t, src)
        else:
            st.save_file({k: v.contiguous() for k, v in t.items()}, src)
        got = run(tmp_path, src)
        for k, v in expected(t).items():
            assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), (fmt, k)
        (tmp_path / "out.safetensors").unlink()


def test_rope_permute_round_trip_and_llama_shapes(tmp_path: Path) -> None:
    """Forward then inverse is the identity; forward equals the script's permute for GQA-shaped k too."""
    g = torch.Generator().manual_seed(7)
    t = {"wq": torch.randn(64, 32, generator=g), "wk": torch.randn(16, 32, generator=g)}
    src = tmp_path / "in.safetensors"
    st.save_file(t, src)
    got = run(tmp_path, src, """
version: 1
source: {path: SRC}
ops:
  - rope_permute: {from: 'wq', heads: 4, to: 'q'}
  - rope_permute: {from: 'wk', heads: 1, to: 'k'}
  - rope_permute: {from: 'q', heads: 4, inverse: true, to: 'q.back'}
target: {path: out.safetensors}
""")
    assert torch.equal(got["k"], hf_permute(t["wk"], 1, 16, 32))
    assert torch.equal(got["q.back"], t["wq"])


def test_split_along_dim0_of_a_stored_tensor_is_a_file_span(tmp_path: Path) -> None:
    """A dim-0 split or slice of a stored tensor reads only its part: a span of the file (kernel-copied)."""
    st.save_file({"b": torch.arange(12, dtype=torch.float32), "m": torch.zeros(6, 4)}, tmp_path / "in.safetensors")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("""
version: 1
source: {path: in.safetensors}
ops:
  - split: {from: b, parts: 3, to: 'b.$i'}
  - slice: {from: m, start: 2, stop: 5}
target: {path: out.safetensors}
""")
    loaded = load_recipe(recipe)
    with build_plan(loaded.recipe, loaded.base_dir, file=RecipeFile(op_origins=loaded.op_origins)) as plan:
        by = {e.target: e.tensor for e in plan.entries}
        source = {t.name: t for t in plan.readers[0].tensors}
        assert by["b.1"].span is not None and by["b.1"].span.offset == source["b"].span.offset + 16
        assert by["b.1"].span.length == 16
        assert by["m"].span is not None and by["m"].span.offset == source["m"].span.offset + 2 * 16
        nodes = plan.report.to_json()["ops"]
    assert nodes[0] == {"op": "split", "index": 0, "at": f"{recipe}:5:5", "inputs": ["b"],
                        "outputs": ["b.0", "b.1", "b.2"]}


def test_consumed_inputs_are_not_unused_with_a_template(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(4, 9, generator=g)
    st.save_file({"attn.c_attn.weight": w, "other": torch.zeros(2)}, tmp_path / "in.safetensors")
    st.save_file({f"attn.{n}.weight": torch.zeros(4, 3) for n in "qkv"}, tmp_path / "tpl.safetensors")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("""
version: 1
source: {path: in.safetensors}
ops:
  - split: {from: '(.*)\\.c_attn\\.weight', dim: 1, parts: 3, to: ['$1.q.weight', '$1.k.weight', '$1.v.weight']}
target: {path: out.safetensors, template: tpl.safetensors}
""")
    loaded = load_recipe(recipe)
    with build_plan(loaded.recipe, loaded.base_dir, file=RecipeFile(op_origins=loaded.op_origins)) as plan:
        assert plan.ok, plan.fatal
        assert plan.report.unused == ["other"]
        assert plan.report.missing == []
        run_plan(plan, progress=False)
    got = st.load_file(tmp_path / "out.safetensors")
    for n, part in zip("qkv", torch.split(w, 3, dim=1), strict=True):
        assert torch.equal(got[f"attn.{n}.weight"], part.contiguous())


# ------------------------------------------------------------------------------------------------
# bad ops: recipe errors at the op's LINE:COL naming the tensors, found before anything is read

BAD_SOURCE = {"w": (6, 12), "b": (12,), "e.0": (3, 4), "e.1": (3, 5), "e.2": (3, 4), "h.0": (2, 2),
              "f16": (3, 4)}


@pytest.fixture
def bad_src(tmp_path: Path) -> Path:
    t = {k: torch.zeros(s) for k, s in BAD_SOURCE.items()}
    t["f16"] = t["f16"].half()
    st.save_file(t, tmp_path / "in.safetensors")
    return tmp_path


def plan_error(folder: Path, ops: str) -> str:
    recipe = folder / "recipe.yaml"
    recipe.write_text("version: 1\nsource: {path: in.safetensors}\nops:\n" + textwrap.dedent(ops).strip("\n")
                      + "\ntarget: {path: out.safetensors}\n")
    loaded = load_recipe(recipe)
    with pytest.raises(RecipeError) as e:
        build_plan(loaded.recipe, loaded.base_dir, file=RecipeFile(op_origins=loaded.op_origins)).close()
    assert not (folder / "out.safetensors").exists()
    return str(e.value).replace(str(recipe), "recipe.yaml")


@pytest.mark.parametrize(("ops", "message"), [
    ("  - split: {from: w, dim: 1, sizes: [4, 4, 5], to: 'w.$i'}",
     "recipe.yaml:4:28: ops[0].split.sizes: sizes [4, 4, 5] add up to 13, but 'w' has 12 along dim 1 "
     "(shape [6, 12])"),
    ("  - split: {from: w, dim: 2, parts: 2, to: 'w.$i'}",
     "recipe.yaml:4:20: ops[0].split.dim: dim 2 does not exist in 'w' (shape [6, 12], rank 2)"),
    ("  - split: {from: w, dim: 0, parts: 4, to: 'w.$i'}",
     "recipe.yaml:4:28: ops[0].split.parts: 'w' has 6 along dim 0 (shape [6, 12]): not divisible into 4 equal "
     "parts (hint: give sizes: [...] for unequal parts)"),
    ("  - stack: {from: 'e\\.(\\d+)', over: 1, to: e}",
     "recipe.yaml:4:11: ops[0].stack.from: stack needs equal shapes: 'e.0' is [3, 4], 'e.1' is [3, 5]"),
    ("  - concat: {from: ['e\\.0', 'f16'], dim: 0, to: c}",
     "recipe.yaml:4:12: ops[0].concat.from: concat inputs differ in dtype: 'e.0' is F32, 'f16' is F16"),
    ("  - concat: {from: ['e\\.(\\d)', 'h.$1'], to: c.$1}",
     "recipe.yaml:4:12: ops[0].concat.from: input 'h.1' (from[1], for 'e.1') is not a tensor name"),
    ("  - reshape: {from: w, shape: [5, -1]}",
     "recipe.yaml:4:22: ops[0].reshape.shape: shape [5, -1] cannot hold the 72 elements of 'w' (shape [6, 12])"),
    ("  - reshape: {from: w, shape: [8, 8]}",
     "recipe.yaml:4:22: ops[0].reshape.shape: shape [8, 8] has 64 elements, 'w' has 72 (shape [6, 12])"),
    ("  - permute: {from: w, dims: [2, 0, 1]}",
     "recipe.yaml:4:22: ops[0].permute.dims: dims [2, 0, 1] has 3 entries, but 'w' has rank 2 (shape [6, 12])"),
    ("  - slice: {from: b, start: 2, stop: 13}",
     "recipe.yaml:4:30: ops[0].slice.stop: [2:13] is outside dim 0 of 'b' (size 12, shape [12])"),
    ("  - rope_permute: {from: w, heads: 4}",
     "recipe.yaml:4:27: ops[0].rope_permute.heads: 'w' (shape [6, 12]) cannot be cut into 4 heads of rotary pairs: "
     "its first dim must be a multiple of 2 x heads = 8"),
    ("  - reshape: {from: 'nope\\.(\\d+)', shape: [1]}",
     "recipe.yaml:4:13: ops[0].reshape.from: 'nope\\.(\\d+)' matches no tensor name (hint: patterns match whole "
     "names after remap and filter, e.g. 'b', 'e.0', 'e.1' (of 7); set optional: true if it may match nothing)"),
    ("  - split: {from: w, dim: 0, parts: 2, to: ['b', 'w.1']}",
     "recipe.yaml:4:38: ops[0].split.to: output 'b' (from 'w') is already a tensor name that this op does not "
     "consume (hint: name the output differently, or remap or filter out the other tensor)"),
    ("  - split: {from: 'e\\.(\\d+)', dim: 0, parts: 3, to: 'x.$i'}",
     "recipe.yaml:4:47: ops[0].split.to: two outputs are named 'x.0' (from 'e.0' and 'e.1')"),
    ("  - stack: {from: 'e\\.(\\d+)', over: 1, to: e}\n  - split: {from: w, parts: 1, to: w}",
     "recipe.yaml:4:11: ops[0].stack.from: stack needs equal shapes"),
    ("  - reshape: {from: 'b', shape: [3, 4]}\n  - permute: {from: 'b', dims: [0, 2, 1]}",
     "recipe.yaml:5:24: ops[1].permute.dims: dims [0, 2, 1] has 3 entries, but 'b' has rank 2 (shape [3, 4])"),
])
def test_bad_op_is_a_recipe_error_at_its_line(bad_src: Path, ops: str, message: str) -> None:
    assert message in plan_error(bad_src, ops)


def test_stack_indices_must_be_0_to_n(bad_src: Path) -> None:
    recipe = bad_src / "in.safetensors"
    t = {f"x.{i}": torch.zeros(2) for i in (0, 1, 3)}
    st.save_file(t, recipe)
    text = plan_error(bad_src, "  - stack: {from: 'x\\.(\\d+)', over: 1, to: x}")
    assert "recipe.yaml:4:29: ops[0].stack.over: stack inputs must have indices 0..N-1 in group 1: index 2 is " \
           "missing (inputs 'x.0', 'x.1', 'x.3')" in text


def test_cli_exit_code_and_json_issue(bad_src: Path) -> None:
    import json
    import subprocess
    import sys

    (bad_src / "recipe.yaml").write_text("version: 1\nsource: {path: in.safetensors}\nops:\n"
                                         "  - split: {from: w, dim: 1, sizes: [4, 4, 5], to: 'w.$i'}\n"
                                         "target: {path: out.safetensors}\n")
    for cmd in ("plan", "run", "validate"):
        p = subprocess.run([sys.executable, "-m", "migrator.cli", cmd, str(bad_src / "recipe.yaml"), "--json"],
                           capture_output=True, text=True)
        assert p.returncode == 2, (cmd, p.stdout, p.stderr)
        doc = json.loads(p.stdout)
        err = doc["recipes"][0]["error"] if cmd == "validate" else doc["error"]
        assert err["issues"][0]["line"] == 4 and err["issues"][0]["col"] == 30, err
        assert "'w' has 12 along dim 1" in err["issues"][0]["message"]
    assert not (bad_src / "out.safetensors").exists()


def test_output_is_byte_reproducible_and_report_round_trips(tmp_path: Path) -> None:
    from migrator.plan.report import ApplyReport

    t = sources(torch.bfloat16, strided=True)
    torch.save(t, tmp_path / "in.pt")
    run(tmp_path, tmp_path / "in.pt")
    first = (tmp_path / "out.safetensors").read_bytes()
    (tmp_path / "out.safetensors").unlink()
    run(tmp_path, tmp_path / "in.pt")
    assert (tmp_path / "out.safetensors").read_bytes() == first
    loaded = load_recipe(tmp_path / "recipe.yaml")
    with build_plan(loaded.recipe, loaded.base_dir, file=RecipeFile(op_origins=loaded.op_origins)) as plan:
        doc = plan.report.to_json()
    assert ApplyReport.from_json(doc).to_json() == doc
    stack = next(n for n in doc["ops"] if n["op"] == "stack")
    assert stack["inputs"] == ["e.0", "e.1", "e.2", "e.3"] and stack["outputs"] == ["e"]
    assert {"source": "e.0, e.1, e.2, e.3", "target": "e"} in doc["tensors"]
    assert {"source": "w", "target": "w.1t"} in doc["tensors"]


def test_plan_text_lists_every_op_node(tmp_path: Path) -> None:
    import subprocess
    import sys

    st.save_file({f"x.{i}": torch.zeros(2, 2) for i in range(12)}, tmp_path / "in.safetensors")
    (tmp_path / "r.yaml").write_text("version: 1\nsource: {path: in.safetensors}\nops:\n"
                                     "  - permute: {from: 'x\\.(\\d+)', dims: [1, 0], to: 'y.$1'}\n"
                                     "target: {path: out.safetensors}\n")
    import os

    p = subprocess.run([sys.executable, "-m", "migrator.cli", "plan", str(tmp_path / "r.yaml")],
                       capture_output=True, text=True, env={**os.environ, "COLUMNS": "1000"})
    assert p.returncode == 0, p.stderr
    assert "op nodes (12)" in p.stdout and "Ops (12 nodes)" in p.stdout
    rows = [line.split() for line in p.stdout.splitlines() if line.startswith("permute ops[0]")]
    assert sorted(rows) == sorted(["permute", "ops[0]", f"{tmp_path / 'r.yaml'}:4:5", f"x.{i}", f"y.{i}"]
                                  for i in range(12))


def test_unstack_of_a_huge_empty_dim_is_refused(bad_src: Path) -> None:
    from migrator import from_numpy, save

    np = pytest.importorskip("numpy")
    save([from_numpy("z", np.zeros((1 << 20, 0), np.float32))], bad_src / "in.safetensors", overwrite=True)
    text = plan_error(bad_src, "  - unstack: {from: z, to: 'z.$i'}")
    assert "would make 1048576 tensors (at most 65536)" in text


def test_adapters_see_op_outputs(tmp_path: Path) -> None:
    """Module types resolve on the ops' output names and shapes: q/k/v split from a Conv1D become Linears
    that pytorch_to_burn lays out [in, out] again, with an F16 cast after."""
    g = torch.Generator().manual_seed(5)
    w, b = torch.randn(8, 24, generator=g), torch.randn(24, generator=g)
    st.save_file({"h.0.attn.c_attn.weight": w, "h.0.attn.c_attn.bias": b}, tmp_path / "in.safetensors")
    got = run(tmp_path, tmp_path / "in.safetensors", r"""
version: 1
source: {path: SRC}
ops:
  - split: {from: 'h\.(\d+)\.attn\.c_attn\.(weight|bias)', dim: -1, parts: 3,
            to: ['h.$1.attn.q.$2', 'h.$1.attn.k.$2', 'h.$1.attn.v.$2']}
  - permute: {from: 'h\.\d+\.attn\.[qkv]\.weight', dims: [1, 0]}
modules: {Linear: ['\.attn\.[qkv]$']}
adapters: [pytorch_to_burn]
dtype: {cast: F16}
target: {path: out.safetensors}
""")
    for n, part, bias in zip("qkv", torch.split(w, 8, dim=1), torch.split(b, 8), strict=True):
        assert torch.equal(got[f"h.0.attn.{n}.weight"], part.contiguous().half())  # [in, out] again
        assert torch.equal(got[f"h.0.attn.{n}.bias"], bias.half())


def test_one_op_failing_on_many_tensors_lists_ten(bad_src: Path) -> None:
    st.save_file({f"x.{i}": torch.zeros(3) for i in range(15)}, bad_src / "in.safetensors")
    text = plan_error(bad_src, "  - split: {from: 'x\\.(\\d+)', parts: 2, to: 'x.$1.$i'}")
    lines = text.splitlines()
    assert len(lines) == 11 and all("not divisible into 2 equal parts" in line for line in lines[:10])
    assert lines[10] == "recipe.yaml:4:29: ops[0].split.parts: ... and 5 more like these"


def test_python_api_run_recipe_reports_ops_and_op_errors_at_their_line(bad_src: Path) -> None:
    import migrator

    recipe = bad_src / "recipe.yaml"
    recipe.write_text("version: 1\nsource: {path: in.safetensors}\nops:\n"
                      "  - split: {from: w, dim: 1, parts: 5, to: 'w.$i'}\ntarget: {path: out.safetensors}\n")
    with pytest.raises(RecipeError) as e:
        migrator.run_recipe(recipe)
    assert f"{recipe}:4:30: ops[0].split.parts: 'w' has 12 along dim 1" in str(e.value)
    recipe.write_text(recipe.read_text().replace("parts: 5", "parts: 3"))
    report = migrator.run_recipe(recipe)
    assert report.ops[0]["outputs"] == ["w.0", "w.1", "w.2"]
    assert torch.equal(st.load_file(bad_src / "out.safetensors")["w.2"], torch.zeros(6, 4))


def test_streamed_ops_never_materialise_a_stored_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """concat, stack, slices along either dim (split and unstack are slices) and rope_permute of stored
    tensors read them in pieces of at most BAND bytes: a whole-tensor view (`data()`) is never asked for."""
    import os

    from migrator import open_file
    from migrator.core.tensor import LazyTensor

    g = torch.Generator().manual_seed(9)
    t = {"a": torch.randn(64, 48, generator=g), "b": torch.randn(64, 48, generator=g)}
    st.save_file(t, tmp_path / "in.safetensors")
    monkeypatch.setattr(streams, "BAND", 1000)
    with open_file(tmp_path / "in.safetensors") as r:
        a, b = r["a"], r["b"]

        def refuse(self: LazyTensor) -> memoryview:
            raise AssertionError(f"{self.name} materialised whole")

        monkeypatch.setattr(LazyTensor, "data", refuse)
        lifted = [reshape(x, x.name, (1, 64, 48)) for x in (a, b)]
        outs = {
            "cat0": (concat([a, b], "c", 0, (128, 48)), torch.cat([t["a"], t["b"]], 0)),
            "cat1": (concat([a, b], "c", 1, (64, 96)), torch.cat([t["a"], t["b"]], 1)),
            "stack": (concat(lifted, "s", 0, (2, 64, 48)), torch.stack([t["a"], t["b"]])),
            "cols": (slice_(a, "x", 1, 5, 40), t["a"][:, 5:40]),
            "rows": (slice_(b, "x", 0, 3, 60), t["b"][3:60]),
            "rope": (rope_permute(a, "q", 4, False), hf_permute(t["a"], 4, 64, 48)),
        }
        for label, (tensor, want) in outs.items():
            pieces = [bytes(p) for p in (tensor.chunks() if tensor.chunks is not None else [])]
            if tensor.chunks is None:  # a stored span: the writer copies it in the kernel
                assert tensor.span is not None, label
                pieces = [os.pread(tensor.span.fd, tensor.nbytes, tensor.span.offset)]
            else:
                limit = 64 // 4 * 48 * 4 if label == "rope" else 1000  # rope: one head's rows at least
                assert max(len(p) for p in pieces) <= limit, label
            assert b"".join(pieces) == want.contiguous().numpy().tobytes(), label


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("band", [None, 40])
def test_offset_equals_torch(tmp_path: Path, dtype: torch.dtype, band: int | None,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """x + value computed in F32 (F64 for F64), rounded once to the output dtype: torch's own x.float() + value,
    from a stored tensor and from a computed (permuted) one, in whole and in small bands."""
    if band is not None:
        monkeypatch.setattr(streams, "BAND", band)
    g = torch.Generator().manual_seed(5)
    t = {"n": rand((37,), dtype, g), "m": rand((6, 5), dtype, g)}
    src = tmp_path / "in.safetensors"
    st.save_file(t, src)
    got = run(tmp_path, src, """
version: 1
source: {path: SRC}
ops:
  - offset: {from: 'n', value: 1.0, to: 'n.plus'}
  - offset: {from: 'm', value: -0.3, dtype: F32, to: 'm.f32'}
  - permute: {from: 'm\\.f32', dims: [1, 0], to: 'mt'}
  - offset: {from: 'mt', value: 2.5, dtype: F16}
target: {path: out.safetensors}
""")
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    want = {"n.plus": (t["n"].to(wide) + 1.0).to(dtype),
            "mt": ((t["m"].to(wide) + -0.3).float().t() + 2.5).half()}
    if dtype == torch.float64:  # -0.3 added in F64 (the input's), rounded to F32 once
        want["mt"] = ((t["m"] + -0.3).float().t().float() + 2.5).half()
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v.contiguous()), k


def test_offset_of_an_integer_tensor_is_a_recipe_error(tmp_path: Path) -> None:
    st.save_file({"i": torch.arange(4)}, tmp_path / "in.safetensors")
    message = plan_error(tmp_path, "  - offset: {from: i, value: 1}")
    assert "ops[0].offset.from: 'i' is I64: offset adds to F64, F32, F16 or BF16 tensors" in message
