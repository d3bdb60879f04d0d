"""Legacy Megatron-LM checkpoints (`iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt`) read as one global state dict.

Oracles: the torch tensors the rank files were cut from (a tiny Hugging Face Llama converted to
megatron-core's layout, `tests/support/megatron_legacy.py`, split per rank as Megatron's layers divide
them), and transformers: the Hugging Face folder a recipe writes from the joined checkpoint loads in
`LlamaForCausalLM` with logits equal to the original model's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import tests.support.megatron_legacy as mls  # noqa: E402
from migrator.core.limits import DEFAULT_LIMITS  # noqa: E402
from migrator.files.io import open_file  # noqa: E402


@pytest.fixture(scope="module")
def llama() -> tuple[object, dict]:
    model = mls.tiny_llama()
    return model, mls.llama_to_mcore(model)


def _equal_to(path: Path, want: dict) -> list[str]:
    with open_file(path) as r:
        assert sorted(r.names()) == sorted(want)
        for t in r.tensors:
            got = torch.from_numpy(t.numpy().copy())
            assert torch.equal(got, want[t.name]), t.name
        return list(r.notes)


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (1, 2), (2, 2), (1, 4)])
def test_ranks_and_stages_join_into_the_global_tensors(llama: tuple, tmp_path: Path, tp: int, pp: int) -> None:
    _, sd = llama
    root = mls.write_legacy(tmp_path / "ckpt", sd, tp, pp)
    notes = _equal_to(root, sd)
    assert any("_extra_state" in n for n in notes)
    assert any("padded_vocab_size (256)" in n for n in notes)
    # the iteration folder itself is the same checkpoint
    _equal_to(root / "iter_0000010", sd)


def test_pre_megatron_core_names_are_read_as_megatron_core_names(llama: tuple, tmp_path: Path) -> None:
    model, _ = llama
    sd = mls.llama_to_mcore(model, te=False)
    root = mls.write_legacy(tmp_path / "ckpt", sd, 2, 2, old_names=True)
    notes = _equal_to(root, sd)
    assert any("query_key_value -> decoder.layers.N.self_attention.linear_qkv" in n for n in notes)


def test_uneven_first_and_last_stages_renumber_from_the_args(llama: tuple, tmp_path: Path) -> None:
    _, sd = llama
    args = mls.args_for(1, 3, decoder_first_pipeline_num_layers=1, decoder_last_pipeline_num_layers=1)
    root = mls.write_legacy(tmp_path / "ckpt", sd, 1, 3, args=args, counts=[1, 2, 1])
    _equal_to(root, sd)


@pytest.mark.parametrize("old_names", [False, True])
def test_a_virtual_pipeline_deals_its_chunks_round_robin(llama: tuple, tmp_path: Path, old_names: bool) -> None:
    """TP=2 x PP=2 x 2 virtual chunks: chunk c of stage p holds the (c x 2 + p)-th quarter of the layers."""
    model, _ = llama
    sd = mls.llama_to_mcore(model, te=not old_names)
    root = mls.write_legacy(tmp_path / "ckpt", sd, 2, 2, vp=2, old_names=old_names)
    _equal_to(root, sd)
    with open_file(root) as r:
        assert r.extra()["virtual_pipeline_chunks"] == 2
        assert r.names()[0] == "embedding.word_embeddings.weight" and r.names()[-1] == "output_layer.weight"


def test_tensors_are_byte_ranges_of_the_rank_files_until_read(llama: tuple, tmp_path: Path) -> None:
    """Lazy: the rank files are parsed for their headers; a row-split tensor streams its ranks' spans."""
    _, sd = llama
    root = mls.write_legacy(tmp_path / "ckpt", sd, 2, 1)
    with open_file(root) as r:
        qkv = r["decoder.layers.0.self_attention.linear_qkv.weight"]
        assert qkv.chunks is not None and qkv.span is None  # two ranks' rows, streamed one after the other
        norm = r["decoder.final_layernorm.weight"]
        assert norm.span is not None  # rank 0's bytes, verbatim
        info = r.extra()
        assert info["args"]["tensor_model_parallel_size"] == 2
        assert info["splits"]["decoder.layers.0.mlp.linear_fc1.weight"] == "rows (gate/up per rank)"
        assert info["splits"]["decoder.layers.0.self_attention.linear_proj.weight"] == "columns"


def test_a_recipe_makes_a_hugging_face_folder_with_the_original_logits(llama: tuple, tmp_path: Path) -> None:
    """TP=2 x PP=2 with SwiGLU and GQA, through a recipe of megatron-core names, into transformers."""
    from transformers import LlamaForCausalLM

    model, sd = llama
    root = mls.write_legacy(tmp_path / "ckpt", sd, 2, 2)
    out = tmp_path / "hf"
    recipe = tmp_path / "to-hf.yaml"
    recipe.write_text(mls.hf_recipe(root, out / "model.safetensors"))
    p = migrate_in_process("run", str(recipe))
    assert p.returncode == 0, p.stdout + p.stderr
    model.config.to_json_file(out / "config.json")
    loaded = LlamaForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, mls.VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_inspect_shows_the_layout(llama: tuple, tmp_path: Path) -> None:
    _, sd = llama
    root = mls.write_legacy(tmp_path / "ckpt", sd, 2, 2)
    p = migrate_in_process("inspect", str(root), "--json")
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["format"] == "megatron-legacy"
    assert len(info["tensors"]) == len(sd)


def test_a_save_folder_with_two_iterations_reads_the_latest(llama: tuple, tmp_path: Path) -> None:
    _, sd = llama
    root = mls.write_legacy(tmp_path / "ckpt", {k: v * 0 for k, v in sd.items()}, 2, 1, iteration=5)
    shutil.copytree(mls.write_legacy(tmp_path / "b", sd, 2, 1, iteration=20) / "iter_0000020",
                    root / "iter_0000020")
    (root / "latest_checkpointed_iteration.txt").write_text("20\n")
    _equal_to(root, sd)
    _equal_to(root / "iter_0000005", {k: v * 0 for k, v in sd.items()})


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_the_args_namespace_is_read_as_data_and_nothing_runs(tmp_path: Path, legacy: bool) -> None:
    """The oracle is argparse's own `vars(args)`: every plain field equal; the enum stays an inert object."""
    from migrator.core.bytesource import FileSource
    from migrator.formats.megatron_legacy.rankfile import RankFile

    args = mls.args_for(2, 2, tokenizer_type="GPT2BPETokenizer", data_path=["a", "b"], lr=2.5e-4, fp16=False)
    path = tmp_path / "model_optim_rng.pt"
    torch.save({"args": args, "checkpoint_version": 3.0, "iteration": 7, "model": {"w": torch.ones(2)}}, path,
               _use_new_zipfile_serialization=not legacy)
    f = RankFile(FileSource(path), DEFAULT_LIMITS)
    try:
        plain = {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool, list, type(None)))}
        assert {k: f.args[k] for k in plain} == plain
        assert set(f.args) == set(vars(args))
        assert not isinstance(f.args["attention_backend"], mls.AttnBackend)  # a placeholder, never built
        assert (f.iteration, f.version, f.names()) == (7, 3.0, ["w"])
    finally:
        f.close()
