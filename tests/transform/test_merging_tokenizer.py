"""mergekit's `tokenizer_source` and `tokenizer:` section merged by migrator, against mergekit 0.1.5's own
`mergekit-yaml` on the same configs over tiny Llamas whose vocabularies differ (WordLevel tokenizers
edited here: other tokens, other ids, added special tokens; and BPE tokenizers trained here on two
texts).

Every tensor is compared with mergekit's within 1e-6: the embedding and `lm_head` row by row by token
(mergekit's `union` gives new tokens ids in a hash map's order, which changes from run to run), the
padding rows by position; config.json's vocab_size is mergekit's; and the tokenizer files written beside
the model, loaded by transformers, encode a set of texts into the same tokens as mergekit's (the same
ids too, but for `union`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("mergekit")

from migrator.files.io import open_file  # noqa: E402
from tests.support.cli import migrate_in_process  # noqa: E402

TEXTS = ["w1 w2 w35 <sep> x1 w39 zz", "<eot> w0 w20 [PAD] w3 w5", "<new> w31 x2 w12 <sep><eot>",
         "the cat sat on the mat", "a dog and a cat ran", "matted hats; cats sat"]
SPECIALS = ["[PAD]", "[UNK]"]

CONFIGS: dict[str, str] = {
    "union_linear": """
merge_method: linear
base_model: m0
models:
  - {model: m0, parameters: {weight: 0.5}}
  - {model: m1, parameters: {weight: 0.3}}
  - {model: m2, parameters: {weight: 0.2}}
tokenizer_source: union
dtype: float32
""",
    "union_ties": """
merge_method: ties
base_model: m0
models:
  - {model: m1, parameters: {weight: 0.6, density: 0.5}}
  - {model: m2, parameters: {weight: 0.4, density: 0.7}}
tokenizer_source: union
dtype: float32
""",
    "source_model": """
merge_method: linear
models:
  - {model: m0, parameters: {weight: 0.5}}
  - {model: m1, parameters: {weight: 0.3}}
  - {model: m2, parameters: {weight: 0.2}}
base_model: m0
tokenizer_source: m1
dtype: float32
""",
    "source_base": """
merge_method: linear
base_model: m0
models:
  - {model: m0, parameters: {weight: 0.5}}
  - {model: m2, parameters: {weight: 0.5}}
tokenizer_source: base
dtype: float32
""",
    "tokens": """
merge_method: linear
base_model: m0
models:
  - {model: m0, parameters: {weight: 0.5}}
  - {model: m1, parameters: {weight: 0.25}}
  - {model: m2, parameters: {weight: 0.25}}
tokenizer:
  source: m0
  tokens:
    w35: {source: m1}
    "<new>": {source: {kind: zero}}
    w3: {source: {kind: model_token, model: m1, token: w20}, force: true}
    w5: {source: {kind: model_token, model: m2, token_id: 7}, force: true}
    x1: {source: {kind: model_token, model: m2, token: x2}}
  pad_to_multiple_of: 16
dtype: float32
""",
    "padded_rows": """
merge_method: linear
base_model: p0
models:
  - {model: p0, parameters: {weight: 0.5}}
  - {model: m1, parameters: {weight: 0.5}}
tokenizer_source: union
dtype: float32
""",
    "no_tokenizer_json": """
merge_method: linear
models:
  - {model: q0, parameters: {weight: 0.3}}
  - {model: q1, parameters: {weight: 0.7}}
dtype: float32
""",
    "bpe_union": """
merge_method: linear
base_model: b0
models:
  - {model: b0, parameters: {weight: 0.6}}
  - {model: b1, parameters: {weight: 0.4}}
tokenizer_source: union
dtype: float32
""",
}

DOC = Path(__file__).resolve().parents[2] / "docs" / "merging.md"


def doc_blocks() -> tuple[str, str]:
    """docs/merging.md's worked example: the config (YAML) and the command (sh) after it."""
    import re

    found = re.search(r"<!-- tested: tokenizer-union -->\n```yaml\n(.*?)```\n\n```sh\n(.*?)```",
                      DOC.read_text(encoding="utf-8"), re.S)
    assert found is not None, "docs/merging.md lost its tested tokenizer example"
    return found[1], found[2]


CONFIGS["docs"] = doc_blocks()[0]  # compared with mergekit as every config is

RUN_ALL = """
import sys
from mergekit.scripts.run_yaml import main
for cfg, out in zip(sys.argv[1::2], sys.argv[2::2]):
    main([cfg, out, "--quiet", "--no-write-model-card"], standalone_mode=False)
"""


def word_tokenizer(folder: Path, words: list[str], added: tuple[str, ...] = ()) -> int:
    """A WordLevel tokenizer of `words` (ids in that order) with `added` special tokens; its size."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
    fast.add_tokens([transformers.AddedToken(a, special=True) for a in added], special_tokens=True)
    fast.save_pretrained(folder)
    return len(fast)


def bpe_tokenizer(folder: Path, corpus: list[str], size: int) -> int:
    """A byte-level BPE trained on `corpus` by the tokenizers library."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=size, special_tokens=["<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)
    return len(fast)


def llama(folder: Path, vocab: int, seed: int) -> None:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                   tie_word_embeddings=False)
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The models (m0..m2 WordLevel, p0 with padding rows, b0/b1 BPE), the configs and mergekit's outputs
    (`mk-NAME`)."""
    root = tmp_path_factory.mktemp("vocab")
    sizes = {
        "m0": word_tokenizer(root / "m0", SPECIALS + [f"w{i}" for i in range(30)]),
        # other ids for the shared tokens, ten tokens of its own, an added special token
        "m1": word_tokenizer(root / "m1", SPECIALS + [f"w{i}" for i in range(39, 9, -1)], ("<sep>",)),
        "m2": word_tokenizer(root / "m2", SPECIALS + [f"w{i}" for i in range(30)] + ["x1", "x2"], ("<sep>", "<eot>")),
        "b0": bpe_tokenizer(root / "b0", ["the cat sat on the mat", "the hat"] * 20, 300),
        "b1": bpe_tokenizer(root / "b1", ["a dog and a cat ran", "dogs ran far"] * 20, 290),
    }
    for i, (name, size) in enumerate(sizes.items()):
        llama(root / name, size, i)
    # m0's tokenizer over an embedding of 40 rows (8 past its tokens, as padded vocabularies have)
    word_tokenizer(root / "p0", SPECIALS + [f"w{i}" for i in range(30)])
    llama(root / "p0", 40, 7)
    for i, name in enumerate(("q0", "q1")):  # no tokenizer.json: a SentencePiece file (not read) instead
        llama(root / name, 32, 8 + i)
        (root / name / "tokenizer.model").write_bytes(f"sentencepiece {name}".encode())
    args: list[str] = []
    for name, text in CONFIGS.items():
        (root / f"{name}.yml").write_text(text)
        args += [str(root / f"{name}.yml"), str(root / f"mk-{name}")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", RUN_ALL, *args], check=True, cwd=root, capture_output=True, env=env)
    return root


def tensors(folder: Path) -> dict[str, np.ndarray]:
    with open_file(folder) as r:
        return {k: t.numpy().copy() for k, t in r.items()}


def tokenizer(folder: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("name", [n for n in CONFIGS if n != "no_tokenizer_json"])
def test_matches_mergekit(root: Path, tmp_path: Path, name: str) -> None:
    out = tmp_path / "out"
    done = migrate_in_process("merge", str(root / f"{name}.yml"), str(out))
    assert done.returncode == 0, done.stderr
    theirs_dir = root / f"mk-{name}"
    ours_tok, theirs_tok = tokenizer(out), tokenizer(theirs_dir)
    ours_vocab, theirs_vocab = ours_tok.get_vocab(), theirs_tok.get_vocab()
    assert sorted(ours_vocab) == sorted(theirs_vocab)
    if "union" not in CONFIGS[name]:  # union's new tokens: mergekit's ids follow a hash map's order
        assert ours_vocab == theirs_vocab
    ours, theirs = tensors(out), tensors(theirs_dir)
    assert sorted(ours) == sorted(theirs)
    for key, want in theirs.items():
        got = ours[key]
        assert got.shape == want.shape, key
        if "embed_tokens" in key or "lm_head" in key:
            for token, i in theirs_vocab.items():
                np.testing.assert_allclose(got[ours_vocab[token]], want[i], rtol=0, atol=1e-6,
                                           err_msg=f"{key} {token!r}")
            np.testing.assert_allclose(got[len(theirs_vocab):], want[len(theirs_vocab):], rtol=0, atol=1e-6,
                                       err_msg=f"{key} padding")
        else:
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6, err_msg=key)
    vocab_size = json.loads((theirs_dir / "config.json").read_text())["vocab_size"]
    assert json.loads((out / "config.json").read_text())["vocab_size"] == vocab_size
    assert ours["model.embed_tokens.weight"].shape[0] == vocab_size
    for text in TEXTS:
        for special in (True, False):
            a = ours_tok(text, add_special_tokens=special)["input_ids"]
            b = theirs_tok(text, add_special_tokens=special)["input_ids"]
            assert ours_tok.convert_ids_to_tokens(a) == theirs_tok.convert_ids_to_tokens(b), text
            assert ours_tok.decode(a) == theirs_tok.decode(b), text


def test_new_tokens_and_source_base_are_refused_as_mergekit_fails(root: Path, tmp_path: Path) -> None:
    """`source: base` with tokens the base lacks: mergekit 0.1.5 adds them to the base's own tokenizer and
    then fails (KeyError); migrator refuses in one line, nothing written, and says to name the folder."""
    config = tmp_path / "cfg.yml"
    config.write_text(CONFIGS["tokens"].replace("source: m0", "source: base").replace("m0", str(root / "m0"))
                      .replace("m1", str(root / "m1")).replace("m2", str(root / "m2")))
    done = migrate_in_process("merge", str(config), str(tmp_path / "out"))
    assert done.returncode == 1, done.stderr
    message = done.stderr.strip()
    assert "\n" not in message and "KeyError" in message and "vocab_size 32" in message, message
    assert "name the base model's folder as the source instead" in message, message
    assert not (tmp_path / "out").exists()


def test_docs_example_runs_as_written(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command shown after the config, run as written beside m0/ and m1/: what its comment says."""
    import re
    import shlex

    config, command = doc_blocks()
    for name in ("m0", "m1"):
        (tmp_path / name).symlink_to(root / name)
    (tmp_path / "union.yml").write_text(config)
    monkeypatch.chdir(tmp_path)
    line = command.strip()
    words = shlex.split(line.split("#")[0])
    assert words[:2] == ["migrate", "merge"]
    done = migrate_in_process(*words[1:])
    assert done.returncode == 0, done.stderr
    said = re.search(r"vocab_size (\d+)", line)
    assert said is not None
    assert json.loads(Path("merged/config.json").read_text())["vocab_size"] == int(said[1])
    vocab = tokenizer(Path("merged")).get_vocab()
    assert "<tool>" in vocab and "w35" in vocab


@pytest.mark.parametrize(("tokens", "code", "words"), [
    ("    x: {source: {kind: zero}}\n    x: {source: m0}\n", 2, "duplicate key 'x'"),
    ("    x: {source: {kind: model_token, model: m0, token: nothere}}\n", 1, "'nothere' is not in the vocabulary"),
    ("    x: {source: {kind: model_token, model: m0, token_id: 99}}\n", 1, "token id 99 is out of range"),
    ("    x: {source: m1}\n", 1, "'m1', whose vocabulary lacks it"),
])
def test_bad_token_entries_are_one_line_errors(root: Path, tmp_path: Path, tokens: str, code: int,
                                               words: str) -> None:
    for name in ("m0", "m1"):
        (tmp_path / name).symlink_to(root / name)
    config = tmp_path / "cfg.yml"
    config.write_text("merge_method: linear\nmodels:\n  - {model: m0, parameters: {weight: 1}}\n"
                      "  - {model: m1, parameters: {weight: 1}}\ntokenizer:\n  source: m0\n  tokens:\n" + tokens)
    done = migrate_in_process("merge", str(config), str(tmp_path / "out"))
    message = done.stderr.strip()
    assert done.returncode == code and "\n" not in message and words in message, message
    assert not (tmp_path / "out").exists()


def test_source_base_over_models_without_tokenizer_json(root: Path, tmp_path: Path) -> None:
    """`tokenizer_source: base` where no model has a tokenizer.json: they share the base's vocabulary (as
    mergekit takes a model whose tokenizer it cannot load), so the rows are mergekit's plain merge's and
    the base's tokenizer file is copied."""
    config = tmp_path / "cfg.yml"
    config.write_text(CONFIGS["no_tokenizer_json"].replace("q0", str(root / "q0")).replace("q1", str(root / "q1"))
                      + "tokenizer_source: base\n")
    out = tmp_path / "out"
    done = migrate_in_process("merge", str(config), str(out))
    assert done.returncode == 0, done.stderr
    assert "no model has a tokenizer.json" in done.stdout
    ours, theirs = tensors(out), tensors(root / "mk-no_tokenizer_json")
    assert sorted(ours) == sorted(theirs)
    for key, want in theirs.items():
        np.testing.assert_allclose(ours[key], want, rtol=0, atol=1e-6, err_msg=key)
    assert (out / "tokenizer.model").read_bytes() == b"sentencepiece q0"
