"""The row ops (gather, add_rows, repeat, clone) run by `migrate run` on random tensors, each output
compared with torch's own operation on the source (index_select, cat with zeros / the float mean / a
row, repeat, repeat_interleave, clone); the moments of a training checkpoint gathered as torch gathers
the parameter, and the added rows' moments zeros; every refused entry a one-line error at its recipe
line with nothing written."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")


@pytest.fixture
def src(tmp_path: Path) -> Path:
    g = torch.Generator().manual_seed(5)
    st.save_file({"emb": torch.randn(11, 6, generator=g), "w3": torch.randn(4, 5, 3, generator=g),
                  "half": torch.randn(7, 4, generator=g).to(torch.bfloat16),
                  "ids": torch.arange(10, dtype=torch.int64).reshape(5, 2)}, tmp_path / "in.safetensors")
    return tmp_path / "in.safetensors"


def _run(tmp_path: Path, ops: str) -> dict:
    (tmp_path / "r.yaml").write_text("version: 1\nsource: {path: in.safetensors}\ntarget: {path: out.safetensors}\n"
                                     "ops:\n" + textwrap.indent(textwrap.dedent(ops), "  "), encoding="utf-8")
    p = migrate_in_process("run", str(tmp_path / "r.yaml"), "--no-progress")
    assert p.returncode == 0, p.stderr
    return st.load_file(tmp_path / "out.safetensors")


def _refused(tmp_path: Path, entry: str, *words: str, code: int = 2) -> str:
    (tmp_path / "r.yaml").write_text("version: 1\nsource: {path: in.safetensors}\ntarget: {path: out.safetensors}\n"
                                     f"ops:\n  - {entry}\n", encoding="utf-8")
    p = migrate_in_process("run", str(tmp_path / "r.yaml"), "--no-progress")
    assert p.returncode == code, p.stderr
    assert "Traceback" not in p.stderr
    # one problem, one line: placed at its recipe line (a recipe's problems follow "migrate: invalid recipe:")
    lines = [ln for ln in p.stderr.strip().splitlines() if ln != "migrate: invalid recipe:"]
    assert len(lines) == 1, p.stderr
    line = lines[0].removeprefix("migrate: error: ")
    assert line.startswith(f"{tmp_path / 'r.yaml'}:5:"), p.stderr
    for w in words:
        assert w in line, line
    assert not (tmp_path / "out.safetensors").exists()
    return line


@pytest.mark.parametrize(("entry", "dim", "index"), [
    ("keep: [3, 0, 10, 4]", 0, [3, 0, 10, 4]),
    ("keep: [-1, 1]", 0, [10, 1]),
    ("drop: [2, 5, 6]", 0, [0, 1, 3, 4, 7, 8, 9, 10]),
    ("range: [1, 9, 3]", 0, [1, 4, 7]),
    ("range: [-2, 0, -1]", 0, [9, 8, 7, 6, 5, 4, 3, 2, 1]),
    ("map: {4: 0, 0: 1, 9: 2}", 0, [4, 0, 9]),
    ("keep: [5, 1, 2]", 1, [5, 1, 2]),
])
def test_gather_is_index_select(tmp_path: Path, src: Path, entry: str, dim: int, index: list[int]) -> None:
    out = _run(tmp_path, f"- gather: {{from: 'emb', dim: {dim}, {entry}}}\n")
    ref = st.load_file(src)
    assert torch.equal(out["emb"], ref["emb"].index_select(dim, torch.tensor(index)))
    assert torch.equal(out["w3"], ref["w3"])


def test_gather_along_a_middle_dim_and_of_integers(tmp_path: Path, src: Path) -> None:
    out = _run(tmp_path, """\
        - gather: {from: 'w3', dim: 1, keep: [4, 0, 1]}
        - gather: {from: 'ids', dim: 0, drop: [1], to: 'ids_kept'}
    """)
    ref = st.load_file(src)
    assert torch.equal(out["w3"], ref["w3"].index_select(1, torch.tensor([4, 0, 1])))
    assert torch.equal(out["ids_kept"], ref["ids"][[0, 2, 3, 4]])


def test_add_rows_zeros_mean_and_a_copied_row(tmp_path: Path, src: Path) -> None:
    out = _run(tmp_path, """\
        - add_rows: {from: 'emb', count: 3, fill: mean}
        - add_rows: {from: 'w3', dim: 1, size: 7, fill: zeros}
        - add_rows: {from: 'half', count: 2, fill: row, row: -2}
        - add_rows: {from: 'ids', dim: 1, count: 1, fill: zeros}
    """)
    ref = st.load_file(src)
    emb = ref["emb"]
    assert out["emb"].shape == (14, 6)
    assert torch.equal(out["emb"][:11], emb)
    mean = emb.mean(dim=0)  # torch's float32 mean: the oracle of the new rows
    for k in range(11, 14):
        torch.testing.assert_close(out["emb"][k], mean, rtol=0, atol=1e-6)
    w3 = ref["w3"]
    assert torch.equal(out["w3"], torch.cat([w3, torch.zeros(4, 2, 3)], dim=1))
    assert out["half"].dtype == torch.bfloat16
    assert torch.equal(out["half"], torch.cat([ref["half"], ref["half"][5:6], ref["half"][5:6]]))
    assert torch.equal(out["ids"], torch.cat([ref["ids"], torch.zeros(5, 1, dtype=torch.int64)], dim=1))


def test_the_mean_of_a_middle_dim_and_of_bf16_rows(tmp_path: Path, src: Path) -> None:
    out = _run(tmp_path, """\
        - add_rows: {from: 'w3', dim: 1, count: 2, fill: mean}
        - add_rows: {from: 'half', count: 1}
    """)
    ref = st.load_file(src)
    w3 = ref["w3"]
    want = torch.cat([w3, w3.mean(dim=1, keepdim=True).expand(4, 2, 3)], dim=1)
    torch.testing.assert_close(out["w3"], want, rtol=0, atol=1e-6)
    half = ref["half"]
    # the mean of the rows in float32, rounded once to bf16: as transformers' mean of a bf16 embedding
    torch.testing.assert_close(out["half"], torch.cat([half, half.float().mean(0, keepdim=True).to(torch.bfloat16)]),
                               rtol=0, atol=0)


@pytest.mark.parametrize("interleave", [False, True])
def test_repeat_is_torch_repeat_or_repeat_interleave(tmp_path: Path, src: Path, interleave: bool) -> None:
    flag = str(interleave).lower()
    out = _run(tmp_path, f"""\
        - repeat: {{from: 'emb', dim: 0, times: 3, interleave: {flag}}}
        - repeat: {{from: 'w3', dim: -2, times: 2, interleave: {flag}}}
    """)
    ref = st.load_file(src)
    if interleave:
        assert torch.equal(out["emb"], ref["emb"].repeat_interleave(3, dim=0))
        assert torch.equal(out["w3"], ref["w3"].repeat_interleave(2, dim=1))
    else:
        assert torch.equal(out["emb"], ref["emb"].repeat(3, 1))
        assert torch.equal(out["w3"], ref["w3"].repeat(1, 2, 1))


def test_clone_unties_and_makes_numbered_copies(tmp_path: Path, src: Path) -> None:
    out = _run(tmp_path, """\
        - clone: {from: 'emb', to: 'lm_head'}
        - clone: {from: 'w3', to: 'experts.$i.w', count: 3, keep: false}
    """)
    ref = st.load_file(src)
    assert sorted(out) == ["emb", "experts.0.w", "experts.1.w", "experts.2.w", "half", "ids", "lm_head"]
    assert torch.equal(out["lm_head"], ref["emb"]) and torch.equal(out["emb"], ref["emb"])
    for i in range(3):
        assert torch.equal(out[f"experts.{i}.w"], ref["w3"])
    with open(tmp_path / "out.safetensors", "rb") as f:  # two tensors, two spans: not stored once
        import json
        import struct

        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    assert header["emb"]["data_offsets"] != header["lm_head"]["data_offsets"]


@pytest.mark.parametrize(("entry", "words", "code"), [
    ("{gather: {from: 'emb', keep: [0, 11]}}", ["ops[0].gather.keep: row 11 is outside dim 0 of 'emb' (size 11"], 2),
    ("{gather: {from: 'emb', keep: [1, 1]}}", ["ops[0].gather.keep: keep lists row 1 twice"], 2),
    ("{gather: {from: 'emb', keep: [1, -10]}}", ["keep names one row twice"], 2),
    ("{gather: {from: 'emb', drop: [3, 3]}}", ["drop lists row 3 twice"], 2),
    ("{gather: {from: 'emb', map: {0: 1, 1: 1}}}", ["map's output rows must be 0..1, each once: row 0 is missing"],
     2),
    ("{gather: {from: 'emb', keep: [0], drop: [1]}}", ["give exactly one of keep, drop, range, map (got keep, drop)"],
     2),
    ("{gather: {from: 'emb', range: [5, 5]}}", ["range [5, 5] picks no row"], 2),
    ("{add_rows: {from: 'emb', size: 4}}", ["size 4 is smaller than dim 0 of 'emb' (size 11"], 2),
    ("{add_rows: {from: 'ids', count: 1}}", ["'ids' is I64: fill: mean takes F64, F32, F16 or BF16 tensors"], 2),
    ("{add_rows: {from: 'emb', count: 1, fill: row, row: 11}}", ["row 11 is outside dim 0 of 'emb'"], 2),
    ("{add_rows: {from: 'emb', count: 1, fill: row}}", ["fill: row needs row"], 2),
    ("{repeat: {from: 'emb', times: 0}}", ["times 0 is out of range"], 2),
    ("{clone: {from: 'emb', to: 'half'}}", ["output 'half' (from 'emb') is already a tensor name"], 2),
    ("{clone: {from: 'emb', to: 'e', count: 2}}", ["with count, to must use $i"], 2),
])
def test_bad_row_ops_are_one_line_errors(tmp_path: Path, src: Path, entry: str, words: list[str], code: int) -> None:
    _refused(tmp_path, entry, *words, code=code)


def test_training_state_is_gathered_and_new_rows_get_zero_moments(tmp_path: Path) -> None:
    """A whole checkpoint (model + Adam): the moments of the gathered embedding are torch's moments
    gathered the same way; those of the added rows are zeros, and the run says so."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(9, 4), torch.nn.Linear(4, 3))
    opt = torch.optim.Adam([{"params": list(model.named_parameters())}], lr=1e-2)
    model(torch.tensor([0, 3, 5, 8])).square().sum().backward()
    opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "ckpt.pt")
    (tmp_path / "r.yaml").write_text(textwrap.dedent("""\
        version: 1
        source: {path: ckpt.pt, top_level_key: model}
        training_state: keep
        ops:
          - gather: {from: '0\\.weight', keep: [8, 0, 3, 5]}
          - add_rows: {from: '0\\.weight', count: 2, fill: mean}
        target: {path: out.pt}
    """), encoding="utf-8")
    p = migrate_in_process("run", str(tmp_path / "r.yaml"), "--no-progress")
    assert p.returncode == 0, p.stderr
    assert ("the values the recipe makes in '0.weight' (added rows, or a new tensor) start with zero exp_avg, "
            "exp_avg_sq") in p.stdout + p.stderr
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    index = torch.tensor([8, 0, 3, 5])
    w = model[0].weight.detach()
    new = out["model"]["0.weight"]
    assert torch.equal(new[:4], w.index_select(0, index))
    torch.testing.assert_close(new[4:], w.index_select(0, index).mean(0, keepdim=True).expand(2, 4), rtol=0,
                               atol=1e-6)
    state = out["optimizer"]["state"]
    names = out["optimizer"]["param_groups"][0]["param_names"]
    emb_state = state[names.index("0.weight")]
    for key in ("exp_avg", "exp_avg_sq"):
        old = opt.state[model[0].weight][key]
        assert torch.equal(emb_state[key], torch.cat([old.index_select(0, index), torch.zeros(2, 4)])), key
    lin_state = state[names.index("1.weight")]
    assert torch.equal(lin_state["exp_avg"], opt.state[model[1].weight]["exp_avg"])


def test_training_state_of_clones_and_new_tensors(tmp_path: Path) -> None:
    """A clone's moments are its input's (two parameters, two copies of the state); a `new` tensor's are
    zeros, and the run names it; torch's optimizer state is the oracle."""
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam([{"params": list(model.named_parameters())}], lr=1e-2)
    model(torch.randn(5, 4)).square().sum().backward()
    opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "ckpt.pt")
    (tmp_path / "r.yaml").write_text(textwrap.dedent("""\
        version: 1
        source: {path: ckpt.pt, top_level_key: model}
        training_state: keep
        ops:
          - clone: {from: 'weight', to: 'weight_copy'}
          - new: {from: 'bias', to: 'router', shape: [2, 3], fill: normal, seed: 3}
        target: {path: out.pt}
    """), encoding="utf-8")
    p = migrate_in_process("run", str(tmp_path / "r.yaml"), "--no-progress")
    assert p.returncode == 0, p.stderr
    assert ("the values the recipe makes in 'router' (added rows, or a new tensor) start with zero exp_avg, "
            "exp_avg_sq") in p.stdout + p.stderr
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    names = out["optimizer"]["param_groups"][0]["param_names"]
    assert sorted(names) == ["bias", "router", "weight", "weight_copy"]
    state = out["optimizer"]["state"]
    for key in ("exp_avg", "exp_avg_sq"):
        for name in ("weight", "weight_copy"):
            assert torch.equal(state[names.index(name)][key], opt.state[model.weight][key]), (name, key)
        assert torch.equal(state[names.index("router")][key], torch.zeros(2, 3)), key
        assert torch.equal(state[names.index("bias")][key], opt.state[model.bias][key]), key
    assert torch.equal(out["model"]["weight_copy"], model.weight.detach())
