"""llama.cpp itself as the oracle of the GGUF files migrator writes from a Hugging Face Llama folder:
the file loads, llama.cpp tokenizes text as SentencePiece does, its F32 logits are within 1e-2 of
transformers', and on Q8_0/Q4_0 files its logits are as close to transformers' as on the file
gguf-py writes from the same weights with its own quantizer. Also: byte-level BPE tokenizers
(llama-bpe, qwen2, gpt-2) tokenized as the original, Llama 3.1 RoPE scaling, Qwen2 and Phi-3 logits
within 1e-2 of transformers', and split files loaded from the first.

Optional and slow to set up: llama-cpp-python compiles llama.cpp from source, so `make test-llamacpp`
builds it once into its own folder and runs only this file (marker `llamacpp`). Everywhere else
(`make test`, CI) llama_cpp is not importable and the module skips.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_support import migrate_in_process
from model_support import tiny_llama_rope
from test_gguf_llama import TEXT, sentencepiece_model

pytestmark = pytest.mark.llamacpp

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is built by `make test-llamacpp` only")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
spm = pytest.importorskip("sentencepiece")

PROMPT = "the quick brown fox jumps over the lazy dog"
GGML_TYPE_F32 = 0  # ggml_type of the KV cache: F32, so the F32 comparison has no F16 rounding in it


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' tiny Llama with weights drawn at 1.5/sqrt(fan_in) (the default init's 0.02 gives
    logits of ~0.1, which a 1e-2 bound would barely test) and norm weights other than 1."""
    folder = tmp_path_factory.mktemp("llamacpp") / "hf"
    model = redrawn(tiny_llama_rope(vocab_size=300))
    model.save_pretrained(folder)
    sentencepiece_model(folder)
    return folder


def redrawn(model: Any) -> Any:
    """The model with its matrices drawn at 1.5/sqrt(fan_in) and its vectors (norms, biases) in [0.75, 1.25)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * (1.5 / p.shape[1] ** 0.5))
            else:
                p.copy_(0.75 + 0.5 * torch.rand(p.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def sp(hf_folder: Path) -> Any:
    return spm.SentencePieceProcessor(model_file=str(hf_folder / "tokenizer.model"))


@pytest.fixture(scope="module")
def prompt_and_hf_logits(hf_folder: Path, sp: Any) -> tuple[list[int], np.ndarray]:
    tokens = [sp.bos_id(), *sp.encode(PROMPT)]
    model = transformers.LlamaForCausalLM.from_pretrained(hf_folder).eval()
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].numpy()
    # logits of this size make the 1e-2 bound a real test (a wrong permute or norm moves them by ~1)
    assert logits.std() > 1.0
    return tokens, logits


def convert(hf_folder: Path, out: Path, *options: str) -> Path:
    res = migrate_in_process("convert", str(hf_folder), str(out), *options)
    assert res.returncode == 0, res.stdout + res.stderr
    return out


def load(path: Path) -> Any:
    return llama_cpp.Llama(model_path=str(path), n_ctx=64, n_batch=64, n_threads=1, logits_all=True,
                           type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, verbose=False)


def llama_cpp_logits(path: Path, tokens: list[int]) -> np.ndarray:
    llm = load(path)
    try:
        llm.eval(tokens)
        return np.array(llm.scores[: len(tokens)], dtype=np.float32)
    finally:
        llm.close()


@pytest.fixture(scope="module")
def f32_gguf(hf_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert(hf_folder, tmp_path_factory.mktemp("f32") / "m.gguf")


def test_llama_cpp_loads_our_f32_file(f32_gguf: Path, hf_folder: Path) -> None:
    llm = load(f32_gguf)
    try:
        config = transformers.AutoConfig.from_pretrained(hf_folder)
        assert llm.n_vocab() == config.vocab_size == 300
        assert llm.n_embd() == config.hidden_size
        assert llm.token_bos() == 1 and llm.token_eos() == 2
        assert llm.metadata["general.architecture"] == "llama"
        assert int(llm.metadata["llama.block_count"]) == config.num_hidden_layers
    finally:
        llm.close()


@pytest.mark.parametrize("text", [TEXT, "quick dogs jump", "zebra \u00e9t\u00e9 42"])
def test_llama_cpp_tokenizes_like_sentencepiece(f32_gguf: Path, sp: Any, text: str) -> None:
    llm = load(f32_gguf)
    try:
        assert llm.tokenize(text.encode(), add_bos=False) == sp.encode(text)
        assert llm.tokenize(text.encode(), add_bos=True) == [1, *sp.encode(text)]
    finally:
        llm.close()


def test_llama_cpp_keeps_user_defined_symbols_whole(f32_gguf: Path, sp: Any) -> None:
    """`<sep>` (a SentencePiece user-defined symbol, token type USER_DEFINED in our file) is one token
    to llama.cpp as to SentencePiece; typed NORMAL, llama.cpp would spell it out in bytes. What follows
    it differs by llama.cpp's own rule (it gives the text after the symbol a space prefix of its own:
    "cat<sep>dog" -> ... <sep> "▁d" ..., SentencePiece: <sep> "d"), which no key/value changes."""
    llm = load(f32_gguf)
    try:
        got = llm.tokenize(b"cat<sep>dog", add_bos=False)
        expected = sp.encode("cat<sep>dog")
        sep = sp.piece_to_id("<sep>")
        assert got[: got.index(sep) + 1] == expected[: expected.index(sep) + 1]
    finally:
        llm.close()


def test_llama_cpp_f32_logits_match_transformers(
        f32_gguf: Path, prompt_and_hf_logits: tuple[list[int], np.ndarray]) -> None:
    tokens, expected = prompt_and_hf_logits
    got = llama_cpp_logits(f32_gguf, tokens)
    diff = float(np.abs(got - expected).max())
    print(f"\nF32: max |llama.cpp - transformers| = {diff:.3g} over {expected.size} logits "
          f"(logit std {expected.std():.2f})")
    assert got.shape == expected.shape
    assert diff < 1e-2


def gguf_py_file(f32_path: Path, quantized_path: Path, out: Path) -> Path:
    """The file gguf-py writes of the same weights: key/values as in our quantized file, each tensor
    quantized by gguf.quants.quantize from our F32 file's values to the type our file gave it."""
    f32 = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(f32_path)).tensors}
    ours = gguf.GGUFReader(str(quantized_path))
    writer = gguf.GGUFWriter(str(out), "llama")
    for field in ours.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue  # the header's own counts, and the key the writer adds itself
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=field.types[-1])
        else:
            writer.add_key_value(field.name, field.contents(), field.types[0])
    for t in ours.tensors:
        values = f32[t.name]
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(t.name, values)
        elif t.tensor_type == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(t.name, values.astype(np.float16))
        else:
            writer.add_tensor(t.name, gguf.quants.quantize(values, t.tensor_type), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_llama_cpp_quantized_logits_as_on_gguf_py_s_file(
        qtype: str, f32_gguf: Path, hf_folder: Path, tmp_path: Path,
        prompt_and_hf_logits: tuple[list[int], np.ndarray]) -> None:
    tokens, expected = prompt_and_hf_logits
    ours = convert(hf_folder, tmp_path / "ours.gguf", "--quantize", qtype)
    reference = gguf_py_file(f32_gguf, ours, tmp_path / "gguf-py.gguf")
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(ours)).tensors}
    assert types["blk.0.attn_q.weight"] == types["output.weight"] == qtype

    ours_err = float(np.abs(llama_cpp_logits(ours, tokens) - expected).max())
    ref_err = float(np.abs(llama_cpp_logits(reference, tokens) - expected).max())
    print(f"\n{qtype}: max |llama.cpp - transformers| on migrator's file {ours_err:.4g}, "
          f"on gguf-py's file {ref_err:.4g}")
    assert ours_err <= ref_err + 1e-6
    # the same bytes in each tensor, so the two files are the same model to llama.cpp
    ref_data = {t.name: np.asarray(t.data).tobytes() for t in gguf.GGUFReader(str(reference)).tensors}
    assert [t.name for t in gguf.GGUFReader(str(ours)).tensors
            if np.asarray(t.data).tobytes() != ref_data[t.name]] == []


@pytest.fixture(scope="module", params=["llama-bpe", "qwen2", "gpt-2"])
def bpe_family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny Llama folder with a byte-level BPE tokenizer.json of the family, and our F32 GGUF of it."""
    from test_gguf_bpe import bpe_folder

    folder = bpe_folder(tmp_path_factory.mktemp("bpe") / "hf", request.param)
    return folder, convert(folder, folder.parent / "m.gguf")


def test_llama_cpp_tokenizes_like_the_bpe_tokenizer(bpe_family: tuple[Path, Path]) -> None:
    """llama.cpp splits text with the regex its table holds for tokenizer.ggml.pre and applies our merges:
    the ids equal the original tokenizer's (special tokens in the text parsed, as transformers does)."""
    from test_gguf_bpe import TEXTS

    folder, path = bpe_family
    want = transformers.AutoTokenizer.from_pretrained(folder)
    llm = load(path)
    try:
        assert llm.n_vocab() == len(want) + 3
        assert llm.token_bos() == want.bos_token_id and llm.token_eos() == want.eos_token_id
        for text in TEXTS:
            expected = want(text, add_special_tokens=False)["input_ids"]
            assert llm.tokenize(text.encode(), add_bos=False, special=True) == expected, text
            assert llm.tokenize(text.encode(), add_bos=True, special=True) == [want.bos_token_id, *expected], text
    finally:
        llm.close()


def test_llama_cpp_llama31_rope_scaling_logits_match_transformers(tmp_path: Path) -> None:
    """A Llama 3.1-shaped tiny model (llama3 RoPE scaling, byte-level BPE tokenizer): llama.cpp, which scales
    each rotary frequency by our rope_freqs.weight, gives transformers' logits within 1e-2; without the
    scaling transformers' own logits move by far more, so the factors are what is being checked."""
    from test_gguf_bpe import BOS, EOS, bpe_tokenizer
    from test_gguf_rope import tiny_llama31

    tok = bpe_tokenizer("llama-bpe")
    folder = tmp_path / "hf"
    model = redrawn(tiny_llama31(vocab_size=tok.get_vocab_size()))
    model.config.bos_token_id, model.config.eos_token_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    model.save_pretrained(folder)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS).save_pretrained(folder)
    path = convert(folder, tmp_path / "m.gguf")

    tokens = transformers.AutoTokenizer.from_pretrained(folder)(TEXT)["input_ids"]
    assert 30 < len(tokens) <= 64  # the context load() gives
    with torch.no_grad():
        expected = model(torch.tensor([tokens])).logits[0].numpy()
        plain = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            **{**model.config.to_dict(), "rope_scaling": None, "rope_parameters": None, "rope_theta": 10000.0}))
        plain.load_state_dict(model.state_dict())
        unscaled = plain.eval()(torch.tensor([tokens])).logits[0].numpy()
    got = llama_cpp_logits(path, tokens)
    diff = float(np.abs(got - expected).max())
    moved = float(np.abs(unscaled - expected).max())
    print(f"\nllama3 RoPE scaling: max |llama.cpp - transformers| = {diff:.3g} over {expected.size} logits; "
          f"without the scaling transformers' logits move by {moved:.3g}")
    assert moved > 0.5
    assert diff < 1e-2


@pytest.mark.parametrize("arch, family", [("qwen2", "qwen2"), ("phi3", "gpt-2")])
def test_llama_cpp_qwen2_phi3_logits_match_transformers(arch: str, family: str, tmp_path: Path) -> None:
    """Qwen2 (q/k/v biases) and Phi-3 (fused qkv, gate_up) written unpermuted: llama.cpp, rotating them as
    GPT-NeoX does, gives transformers' logits within 1e-2 on a BPE-tokenized prompt."""
    from test_gguf_archs import tiny_phi3, tiny_qwen2
    from test_gguf_bpe import TEXTS, bpe_folder

    build = {"qwen2": tiny_qwen2, "phi3": tiny_phi3}[arch]
    folder = bpe_folder(tmp_path / "hf", family, model_of=lambda vocab: redrawn(build(vocab)))
    path = convert(folder, tmp_path / "m.gguf")
    tokens = transformers.AutoTokenizer.from_pretrained(folder)(TEXTS[0] + " " + TEXTS[1])["input_ids"]
    model = getattr(transformers, {"qwen2": "Qwen2ForCausalLM", "phi3": "Phi3ForCausalLM"}[arch]).from_pretrained(
        folder).eval()
    with torch.no_grad():
        expected = model(torch.tensor([tokens])).logits[0].numpy()
    assert expected.std() > 1.0
    got = llama_cpp_logits(path, tokens)
    diff = float(np.abs(got - expected).max())
    print(f"\n{arch}: max |llama.cpp - transformers| = {diff:.3g} over {expected.size} logits "
          f"(logit std {expected.std():.2f})")
    assert diff < 1e-2


def test_llama_cpp_loads_our_split_files(hf_folder: Path, f32_gguf: Path, tmp_path: Path,
                                         prompt_and_hf_logits: tuple[list[int], np.ndarray]) -> None:
    """llama.cpp, given the first of our split files, finds the others and computes the single file's logits."""
    tokens, expected = prompt_and_hf_logits
    res = migrate_in_process("convert", str(hf_folder), str(tmp_path / "split") + "/", "--to", "gguf",
                             "--max-shard-size", "40KB")
    assert res.returncode == 0, res.stdout + res.stderr
    files = sorted((tmp_path / "split").iterdir())
    assert len(files) > 2
    got = llama_cpp_logits(files[0], tokens)
    single = llama_cpp_logits(f32_gguf, tokens)
    print(f"\nsplit into {len(files)} files: max |split - single file| = {np.abs(got - single).max():.3g}, "
          f"|split - transformers| = {np.abs(got - expected).max():.3g}")
    assert np.array_equal(got, single)
    assert float(np.abs(got - expected).max()) < 1e-2
