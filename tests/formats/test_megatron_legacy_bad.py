"""Broken and hostile legacy Megatron-LM checkpoints through the command line: exit 1 in one line naming
the file (and the tensor where there is one), no traceback, nothing written, an existing target kept,
no code run (`tests.support.hostile.refused`).

Each case starts from a TP=2 x PP=2 checkpoint written as Megatron's legacy checkpointer lays it out
(`tests/support/megatron_legacy.py`) and breaks one thing: a missing or extra rank, a replicated tensor whose
shape differs between ranks, a tensor no split rule knows, args contradicting the files or each other,
a stage holding the wrong layers, a virtual pipeline, an old checkpoint_version, a tracker naming no
iteration, a truncated rank file, a pickle calling `os.system`.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.hostile import refused

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import tests.support.megatron_legacy as mls  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))  # tests.support.pickles imports tools/fuzz.py
from tests.support.pickles import P2, P4, in_zip, u  # noqa: E402

ITER = "iter_0000010"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sd = mls.llama_to_mcore(mls.tiny_llama())
    return mls.write_legacy(tmp_path_factory.mktemp("mgl") / "ckpt", sd, 2, 2)


@pytest.fixture
def ckpt(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "ckpt"))


def rank(ckpt: Path, tp: int, pp: int) -> Path:
    return ckpt / ITER / f"mp_rank_{tp:02d}_{pp:03d}" / "model_optim_rng.pt"


def edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite one rank file with `change` applied to its checkpoint dict (torch is the writer)."""
    checkpoint = torch.load(path, weights_only=False)
    change(checkpoint)
    torch.save(checkpoint, path)


def convert_refused(ckpt: Path, tmp_path: Path, *words: str) -> str:
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"the previous output")  # kept byte for byte, even with --overwrite
    done = refused(["convert", str(ckpt), str(out), "--overwrite"], tmp_path, codes=(1,))
    line = done.stderr.strip()
    for w in words:
        assert w in line, line
    return line


def test_a_missing_rank_file_is_named(ckpt: Path, tmp_path: Path) -> None:
    rank(ckpt, 1, 1).unlink()
    convert_refused(ckpt, tmp_path, "mp_rank_01_001/model_optim_rng.pt is missing", "tensor_model_parallel_size 2")


def test_a_missing_rank_folder_is_named(ckpt: Path, tmp_path: Path) -> None:
    shutil.rmtree(rank(ckpt, 0, 1).parent)
    convert_refused(ckpt, tmp_path, "mp_rank_00_001/model_optim_rng.pt is missing")


def test_a_rank_beyond_the_args_is_named(ckpt: Path, tmp_path: Path) -> None:
    shutil.copytree(rank(ckpt, 1, 1).parent, ckpt / ITER / "mp_rank_02_001")
    convert_refused(ckpt, tmp_path, "mp_rank_02_001", "beyond the tensor_model_parallel_size 2")


def test_a_replicated_tensor_whose_shape_differs_between_ranks_is_reported(ckpt: Path, tmp_path: Path) -> None:
    name = "decoder.layers.1.mlp.linear_fc1.layer_norm_weight"
    edit(rank(ckpt, 1, 0), lambda c: c["model"].update({name: torch.ones(mls.HIDDEN + 2)}))
    line = convert_refused(ckpt, tmp_path, name, "mp_rank_01_000", "replicated", "[66]", "[64]")
    assert "mp_rank_00_000" in line


def test_a_split_tensor_whose_dtype_differs_between_ranks_is_reported(ckpt: Path, tmp_path: Path) -> None:
    name = "decoder.layers.0.self_attention.linear_proj.weight"
    edit(rank(ckpt, 1, 1), lambda c: c["model"].update({name: c["model"][name].half()}))
    convert_refused(ckpt, tmp_path, name, "mp_rank_01_001", "F16")


def test_a_tensor_no_split_rule_knows_is_refused(ckpt: Path, tmp_path: Path) -> None:
    name = "decoder.layers.0.self_attention.mystery.weight"
    for tp in (0, 1):
        edit(rank(ckpt, tp, 0), lambda c: c["model"].update({name: torch.ones(4, 4)}))
    convert_refused(ckpt, tmp_path, name, "no split rule", "mp_rank_00_000")


def test_ranks_holding_different_tensors_are_refused(ckpt: Path, tmp_path: Path) -> None:
    name = "decoder.layers.1.self_attention.linear_proj.weight"
    edit(rank(ckpt, 1, 1), lambda c: c["model"].pop(name))
    convert_refused(ckpt, tmp_path, name, "ranks 0 and 1 of stage 1 hold different tensors")


def test_a_rank_whose_args_contradict_rank_0_is_named(ckpt: Path, tmp_path: Path) -> None:
    edit(rank(ckpt, 1, 0), lambda c: setattr(c["args"], "num_layers", 8))
    convert_refused(ckpt, tmp_path, "mp_rank_01_000", "num_layers 8", "says 4")


def test_args_naming_more_ranks_than_the_folders_hold(ckpt: Path, tmp_path: Path) -> None:
    for tp in (0, 1):
        for pp in (0, 1):
            edit(rank(ckpt, tp, pp), lambda c: setattr(c["args"], "tensor_model_parallel_size", 4))
    convert_refused(ckpt, tmp_path, "mp_rank_02_000/model_optim_rng.pt is missing", "tensor_model_parallel_size 4")


def test_a_stage_holding_other_layers_than_num_layers_gives_it(ckpt: Path, tmp_path: Path) -> None:
    for tp in (0, 1):
        for pp in (0, 1):
            edit(rank(ckpt, tp, pp), lambda c: setattr(c["args"], "num_layers", 6))
    convert_refused(ckpt, tmp_path, "stage 0 holds layers 0..1 (2)", "num_layers 6", "gives it 3")


def test_virtual_pipeline_chunks_the_args_do_not_name(ckpt: Path, tmp_path: Path) -> None:
    def chunks(c: dict[str, Any]) -> None:
        c["model0"] = c.pop("model")
        c["model1"] = {}

    edit(rank(ckpt, 1, 0), chunks)
    convert_refused(ckpt, tmp_path, "mp_rank_01_000", "holds model0..model1",
                    "virtual_pipeline_model_parallel_size None makes 1 model chunks")


def test_virtual_pipeline_args_the_files_do_not_follow(ckpt: Path, tmp_path: Path) -> None:
    for tp in (0, 1):
        for pp in (0, 1):
            edit(rank(ckpt, tp, pp), lambda c: setattr(c["args"], "virtual_pipeline_model_parallel_size", 2))
    convert_refused(ckpt, tmp_path, "holds one 'model'", "virtual_pipeline_model_parallel_size 2 makes 2")


def test_a_virtual_chunk_missing_a_layer(pristine: Path, tmp_path: Path) -> None:
    sd = mls.llama_to_mcore(mls.tiny_llama())
    ckpt = mls.write_legacy(tmp_path / "vp", sd, 2, 2, vp=2)
    for tp in (0, 1):  # the chunk's one layer gone, on both ranks
        edit(rank(ckpt, tp, 1), lambda c: [c["model1"].pop(k) for k in list(c["model1"]) if "layers.0." in k])
    convert_refused(ckpt, tmp_path, "stage 1 chunk 1 holds no layer", "x 2 virtual chunks gives it 1")


def test_uneven_stages_under_a_virtual_pipeline_are_refused(ckpt: Path, tmp_path: Path) -> None:
    for tp in (0, 1):
        for pp in (0, 1):
            edit(rank(ckpt, tp, pp), lambda c: (setattr(c["args"], "virtual_pipeline_model_parallel_size", 2),
                                                setattr(c["args"], "decoder_first_pipeline_num_layers", 1),
                                                c.update(model0=c.pop("model"), model1={})))
    convert_refused(ckpt, tmp_path, "uneven first or last pipeline stages under a virtual pipeline")


def test_an_explicit_pipeline_layout_is_refused(ckpt: Path, tmp_path: Path) -> None:
    edit(rank(ckpt, 0, 0), lambda c: setattr(c["args"], "pipeline_model_parallel_layout", "Et|(tt|)*2L"))
    convert_refused(ckpt, tmp_path, "pipeline_model_parallel_layout", "explicit pipeline layout")


def test_an_old_checkpoint_version_is_refused(ckpt: Path, tmp_path: Path) -> None:
    edit(rank(ckpt, 1, 1), lambda c: c.update(checkpoint_version=1.0))
    convert_refused(ckpt, tmp_path, "checkpoint_version 1.0", "mp_rank_01_001")


def test_a_file_of_another_iteration_is_refused(ckpt: Path, tmp_path: Path) -> None:
    edit(rank(ckpt, 0, 1), lambda c: c.update(iteration=7))
    convert_refused(ckpt, tmp_path, "iteration 7", ITER, "mp_rank_00_001")


def test_vocab_rows_contradicting_padded_vocab_size(ckpt: Path, tmp_path: Path) -> None:
    for tp in (0, 1):
        for pp in (0, 1):
            edit(rank(ckpt, tp, pp), lambda c: setattr(c["args"], "padded_vocab_size", 384))
    convert_refused(ckpt, tmp_path, "embedding.word_embeddings.weight", "256 rows", "384")


def test_a_tracker_naming_no_iteration_folder(ckpt: Path, tmp_path: Path) -> None:
    (ckpt / "latest_checkpointed_iteration.txt").write_text("20")
    convert_refused(ckpt, tmp_path, "iteration 20", "iter_0000020", ITER)


@pytest.mark.parametrize("text", ["", "twenty", "1" * 80, "../../etc"])
def test_a_tracker_holding_no_iteration(ckpt: Path, tmp_path: Path, text: str) -> None:
    (ckpt / "latest_checkpointed_iteration.txt").write_text(text)
    convert_refused(ckpt, tmp_path, "latest_checkpointed_iteration.txt", "iteration number or 'release'")


def test_expert_parallel_rank_folders_are_refused(ckpt: Path, tmp_path: Path) -> None:
    shutil.copytree(rank(ckpt, 0, 0).parent, ckpt / ITER / "mp_rank_00_000_001")
    convert_refused(ckpt, tmp_path, "expert-parallel")


@pytest.mark.parametrize("keep", [0.3, 0.9])
def test_a_truncated_rank_file_is_named(ckpt: Path, tmp_path: Path, keep: float) -> None:
    victim = rank(ckpt, 1, 0)
    os.truncate(victim, int(victim.stat().st_size * keep))
    convert_refused(ckpt, tmp_path, "mp_rank_01_000")


def test_a_rank_file_leading_out_of_the_checkpoint_is_refused(ckpt: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.pt"
    shutil.move(rank(ckpt, 1, 1), outside)
    rank(ckpt, 1, 1).symlink_to(outside)
    convert_refused(ckpt, tmp_path, "leads out of")


class _System:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("where", ["args", "model", "rng_state"])
def test_a_rank_file_calling_os_system_runs_nothing(ckpt: Path, tmp_path: Path, where: str) -> None:
    marker = tmp_path / "ran"
    edit(rank(ckpt, 1, 1), lambda c: c.update({where: _System(marker)}))
    line = convert_refused(ckpt, tmp_path, "mp_rank_01_001")
    assert "system" in line
    assert not marker.exists()


def _payloads(marker: Path) -> dict[str, bytes]:
    """A rank file's data.pkl replaced (`tests.support.pickles`): callables no checkpoint names, and
    lengths no file this size can hold."""
    cmd = f"touch {marker}"
    return {
        "eval": P2 + b"}(" + u("args") + b"cbuiltins\neval\n" + u(f"__import__('os').system('{cmd}')") + b"\x85Ru.",
        "Popen": P2 + b"}(" + u("model") + b"csubprocess\nPopen\n](" + u("touch") + u(str(marker)) + b"e\x85Ru.",
        "posix.system in the args Namespace": P2 + b"}(" + u("args") + b"cargparse\nNamespace\n)\x81}("
        + u("num_layers") + b"cposix\nsystem\n" + u(cmd) + b"\x85Rubu.",
        "BINUNICODE declaring 4 GiB": P2 + b"X\xff\xff\xff\xffabc.",
        "BINBYTES8 declaring 2**62 bytes": P4 + b"\x8e" + (1 << 62).to_bytes(8, "little") + b"abc.",
        "LONG4 of 2 GiB": P2 + b"}(" + u("iteration") + b"\x8b\xff\xff\xff\x7fu.",
    }


@pytest.mark.parametrize("name", list(_payloads(Path("x"))))
def test_a_rank_file_with_a_hostile_pickle_is_refused(ckpt: Path, tmp_path: Path, name: str) -> None:
    marker = tmp_path / "ran"
    rank(ckpt, 1, 1).write_bytes(in_zip(_payloads(marker)[name]))
    convert_refused(ckpt, tmp_path, "mp_rank_01_001")
    assert not marker.exists()
