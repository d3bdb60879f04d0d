"""llama.cpp itself as the oracle of the GGUF files migrator writes from a Hugging Face Llama folder:
the file loads, llama.cpp tokenizes text as SentencePiece does, its F32 logits are within 1e-2 of
transformers', and on Q8_0/Q4_0 files its logits are as close to transformers' as on the file
gguf-py writes from the same weights with its own quantizer. Also: byte-level BPE tokenizers
(llama-bpe, qwen2, gpt-2) tokenized as the original, Llama 3.1 RoPE scaling, Qwen2, Phi-3 and Gemma 1-3
logits within 1e-2 of transformers', split files loaded from the first, and our GGUF LoRA adapter applied
to the base giving the merged model's logits.

K-quants: our Q2_K..Q6_K blocks are byte-equal to ggml's reference quantizers (called through
ctypes in the library llama-cpp-python built), and a `--quantize Q4_K_M` (Q4_K_S, Q5_K_M, Q5_K_S,
Q6_K) file has the types and bytes of every tensor that llama-quantize (`llama_model_quantize`)
gives from our F32 file, so llama.cpp's logits on both are the same.

Optional and slow to set up: llama-cpp-python compiles llama.cpp from source, so `make test-llamacpp`
builds it once into its own folder and runs only this file (marker `llamacpp`). Everywhere else
(`make test`, CI) llama_cpp is not importable and the module skips.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.cli import migrate_in_process
from tests.support.gguf_models import TEXT, sentencepiece_model
from tests.support.models import tiny_llama, tiny_llama_rope

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
    save_with_test_weights(tiny_llama_rope(vocab_size=300), folder)
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


def save_with_test_weights(model: Any, folder: Path) -> None:
    redrawn(model).save_pretrained(folder)


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


# -- K-quants ---------------------------------------------------------------------------------------

K_TYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
K_SIZES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
MIX_FTYPES = {"Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16,
              "Q5_K_M": 17, "Q6_K": 18}  # llama_ftype


def ggml_reference(name: str, x: np.ndarray) -> bytes:
    """ggml's `quantize_row_<type>_ref` (what llama-quantize runs without an importance matrix)."""
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    fn = getattr(lib, f"quantize_row_{name[0].lower()}{name[1]}_K_ref")
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(x.size // 256 * K_SIZES[name], np.uint8)
    fn(x.ctypes.data, out.ctypes.data, x.size)
    return out.tobytes()


def hostile_rows() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    normal = rng.standard_normal((256, 1024)).astype(np.float32)
    outlier = normal[:32].copy()
    outlier[:, 100] = 1e3
    ties = (rng.integers(-8, 8, (32, 1024)) * np.float32(0.5)).astype(np.float32)
    odd = normal[:8].copy()
    odd[0, 5], odd[1, 700], odd[2, 9], odd[3], odd[4] = np.nan, np.inf, -np.inf, np.nan, np.inf
    return {"normal": normal * np.float32(0.02), "zeros": np.zeros((8, 1024), np.float32),
            "tiny": normal[:32] * np.float32(1e-30), "subnormal": normal[:32] * np.float32(1e-41),
            "huge": normal[:32] * np.float32(1e30), "f16-range": normal[:32] * np.float32(3e3),
            "one outlier": outlier, "negative only": -np.abs(normal[:32]), "positive only": np.abs(normal[:32]),
            "constant": np.full((8, 1024), 0.37, np.float32), "half steps": ties,
            "sparse": np.where(rng.random((32, 1024)) < 0.9, 0, normal[:32]).astype(np.float32),
            "non-finite": odd,
            "split over threads": rng.standard_normal((1100, 1024)).astype(np.float32)}  # > quants.SPLIT_VALUES


@pytest.mark.parametrize("name", K_TYPES)
def test_k_quants_bytes_equal_ggml_reference(name: str) -> None:
    from migrator.formats.gguf import quants
    from migrator.formats.gguf.constants import BY_NAME

    for label, x in hostile_rows().items():
        with np.errstate(all="ignore"):
            assert quants.quantize(x, BY_NAME[name]).tobytes() == ggml_reference(name, x), f"{name}: {label}"


def llama_quantize(src: Path, out: Path, mix: str) -> Path:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = MIX_FTYPES[mix], 1
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params)) == 0
    return out


@pytest.fixture(scope="module")
def hf_k_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Tiny Llamas of 8 layers (rows of 256 and 512: whole K blocks; 8 layers give the _M mixes' more-bits
    layers 0, 3, 6, 7), of 3 layers with rows of 160 (K-quants fall back to 32-value types), of 2
    with rows of 80 (F16), and of 20 layers with rows of 256 (key 20: llama.cpp counts layers in
    numeric order, blk.2 before blk.10)."""
    root = tmp_path_factory.mktemp("kquants")
    folders = {}
    for hidden, layers in ((256, 8), (160, 3), (80, 2), (256, 20)):
        key = hidden if layers != 20 else layers
        folders[key] = root / f"hf{hidden}-{layers}"
        save_with_test_weights(tiny_llama(layers=layers, hidden=hidden, vocab=300), folders[key])
    sentencepiece_model(folders[256])
    return folders


@pytest.mark.parametrize(("hidden", "mix"), [
    *((256, mix) for mix in MIX_FTYPES), (160, "Q4_K_M"), (160, "Q5_K_S"), (160, "Q3_K_M"), (80, "Q6_K"),
    (20, "Q4_K_M"), (20, "Q3_K_M")])
def test_mix_file_equals_llama_quantize(hidden: int, mix: str, hf_k_folders: dict[int, Path],
                                        tmp_path: Path) -> None:
    """`hidden` picks the folder (20: the 20-layer one)."""
    folder = hf_k_folders[hidden]
    ours = convert(folder, tmp_path / "ours.gguf", "--quantize", mix)
    theirs = llama_quantize(convert(folder, tmp_path / "f32.gguf"), tmp_path / "theirs.gguf", mix)
    a, b = gguf.GGUFReader(str(ours)), gguf.GGUFReader(str(theirs))
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    assert sorted(ta) == sorted(tb)
    types = {n: t.tensor_type.name for n, t in ta.items()}
    assert types == {n: t.tensor_type.name for n, t in tb.items()}
    print(f"\n{mix}, {folder.name}: " + ", ".join(f"{k} x {v}" for k, v in sorted(
        {v: sum(1 for x in types.values() if x == v) for v in set(types.values())}.items())))
    assert [n for n in ta if np.asarray(ta[n].data).tobytes() != np.asarray(tb[n].data).tobytes()] == []
    assert int(a.fields["general.file_type"].contents()) == int(b.fields["general.file_type"].contents())
    assert int(a.fields["general.file_type"].contents()) == MIX_FTYPES[mix]


@pytest.mark.parametrize("arch", ["qwen2", "phi3", "gemma", "gemma2", "gemma3"])
def test_mixes_of_other_architectures_equal_llama_quantize(arch: str, tmp_path: Path) -> None:
    """Every mix of an 8-layer model of each architecture (rows of 256 and 512; Phi-3's fused attn_qkv and
    ffn_up, Gemma 3's q/k norms) has the types and bytes llama-quantize gives from our F32 file, and the plan
    does not warn that they may differ."""
    cls, config, extra = {
        "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", {}),
        "phi3": ("Phi3ForCausalLM", "Phi3Config", {"pad_token_id": 0}),
        "gemma": ("GemmaForCausalLM", "GemmaConfig", {"head_dim": 64}),
        "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", {"head_dim": 64, "query_pre_attn_scalar": 64}),
        "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", {"head_dim": 64, "query_pre_attn_scalar": 64})}[arch]
    torch.manual_seed(0)
    cfg = getattr(transformers, config)(vocab_size=300, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        **extra)
    cfg.architectures = [cls]
    save_with_test_weights(getattr(transformers, cls)(cfg), tmp_path / "hf")
    f32 = convert(tmp_path / "hf", tmp_path / "f32.gguf")
    for mix in MIX_FTYPES:
        res = migrate_in_process("convert", str(tmp_path / "hf"), str(tmp_path / f"{mix}.gguf"), "--quantize", mix)
        assert res.returncode == 0 and "may differ" not in res.stdout + res.stderr, res.stdout + res.stderr
        ours = {t.name: t for t in gguf.GGUFReader(str(tmp_path / f"{mix}.gguf")).tensors}
        quantized = llama_quantize(f32, tmp_path / f"{mix}-lq.gguf", mix)
        theirs = {t.name: t for t in gguf.GGUFReader(str(quantized)).tensors}
        assert sorted(ours) == sorted(theirs)
        assert [n for n in ours if ours[n].tensor_type != theirs[n].tensor_type] == [], mix
        assert [n for n in ours if np.asarray(ours[n].data).tobytes() != np.asarray(theirs[n].data).tobytes()] == [], \
            mix


def test_llama_cpp_logits_on_our_q4_k_m_equal_its_own(hf_k_folders: dict[int, Path], tmp_path: Path) -> None:
    folder = hf_k_folders[256]
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    tokens = [sp.bos_id(), *sp.encode(PROMPT)]
    ours = convert(folder, tmp_path / "ours.gguf", "--quantize", "Q4_K_M")
    theirs = llama_quantize(convert(folder, tmp_path / "f32.gguf"), tmp_path / "theirs.gguf", "Q4_K_M")
    got, expected = llama_cpp_logits(ours, tokens), llama_cpp_logits(theirs, tokens)
    model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        hf = model(torch.tensor([tokens])).logits[0].numpy()
    print(f"\nQ4_K_M: max |llama.cpp - transformers| {float(np.abs(got - hf).max()):.4g} on migrator's file, "
          f"{float(np.abs(expected - hf).max()):.4g} on llama-quantize's")
    assert np.array_equal(got, expected)


@pytest.fixture(scope="module", params=["llama-bpe", "qwen2", "gpt-2"])
def bpe_family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny Llama folder with a byte-level BPE tokenizer.json of the family, and our F32 GGUF of it."""
    from tests.support.gguf_models import bpe_folder

    folder = bpe_folder(tmp_path_factory.mktemp("bpe") / "hf", request.param)
    return folder, convert(folder, folder.parent / "m.gguf")


def test_llama_cpp_tokenizes_like_the_bpe_tokenizer(bpe_family: tuple[Path, Path]) -> None:
    """llama.cpp splits text with the regex its table holds for tokenizer.ggml.pre and applies our merges:
    the ids equal the original tokenizer's (special tokens in the text parsed, as transformers does)."""
    from tests.support.gguf_models import TEXTS

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
    from tests.support.gguf_models import BOS, EOS, bpe_tokenizer, tiny_llama31

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
    from tests.support.gguf_models import TEXTS, bpe_folder, tiny_phi3, tiny_qwen2

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


def test_llama_cpp_applies_our_lora_adapter(hf_folder: Path, f32_gguf: Path, tmp_path: Path,
                                            prompt_and_hf_logits: tuple[list[int], np.ndarray]) -> None:
    """Our GGUF LoRA adapter (`migrate convert ADAPTER_DIR adapter.gguf`) applied by llama.cpp to the base's
    GGUF gives the logits llama.cpp computes on the GGUF of PEFT's merged model (merge_and_unload), and
    not the base's (every linear module targeted, the embedding and lm_head too)."""
    import shutil

    peft = pytest.importorskip("peft")
    tokens, _ = prompt_and_hf_logits
    model = transformers.LlamaForCausalLM.from_pretrained(hf_folder).eval()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens", "lm_head"]
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.5 / min(p.shape) ** 0.5))
    wrapped.save_pretrained(tmp_path / "adapter")
    merged = tmp_path / "merged"
    wrapped.merge_and_unload().save_pretrained(merged)
    shutil.copy(hf_folder / "tokenizer.model", merged / "tokenizer.model")
    adapter = convert(tmp_path / "adapter", tmp_path / "adapter.gguf", "--base", str(hf_folder))
    expected = llama_cpp_logits(convert(merged, tmp_path / "merged.gguf"), tokens)
    llm = llama_cpp.Llama(model_path=str(f32_gguf), lora_path=str(adapter), n_ctx=64, n_batch=64, n_threads=1,
                          logits_all=True, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, verbose=False)
    try:
        llm.eval(tokens)
        got = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    finally:
        llm.close()
    base = llama_cpp_logits(f32_gguf, tokens)
    diff, moved = float(np.abs(got - expected).max()), float(np.abs(base - expected).max())
    print(f"\nLoRA adapter: max |base + adapter - merged| = {diff:.3g} (the adapter moves logits by {moved:.3g})")
    assert moved > 0.1
    assert diff < 1e-3


@pytest.mark.parametrize("arch", ["gemma", "gemma2", "gemma3"])
def test_llama_cpp_gemma_logits_match_transformers(arch: str, tmp_path: Path) -> None:
    """Gemma, Gemma 2 and Gemma 3 (norms stored as weight + 1, tied embeddings; Gemma 2: soft-capped
    attention and output logits, a sliding window shorter than the prompt on every other layer; Gemma 3:
    q/k norms, five sliding layers of six, linear RoPE scaling on the global ones) with a SentencePiece
    tokenizer: llama.cpp gives transformers' logits within 1e-2 once transformers computes GELU as ggml does
    (a table of F16 results at F16 inputs); with torch's own GELU within 1e-2 (Gemma 3: 3e-2)."""
    from tests.support.gguf_models import tiny_gemma, tiny_gemma2, tiny_gemma3

    folder = tmp_path / "hf"
    model = redrawn({"gemma": tiny_gemma, "gemma2": tiny_gemma2, "gemma3": tiny_gemma3}[arch](vocab_size=300))
    if arch == "gemma2":
        model.config.sliding_window = 16
    model.save_pretrained(folder)
    sentencepiece_model(folder)
    path = convert(folder, tmp_path / "m.gguf")
    sp_model = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    tokens = [sp_model.bos_id(), *sp_model.encode(PROMPT)]
    assert arch == "gemma" or len(tokens) > 2 * model.config.sliding_window
    cls = getattr(transformers, {"gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                                 "gemma3": "Gemma3ForCausalLM"}[arch])
    model = cls.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        expected = model(torch.tensor([tokens])).logits[0].numpy()
        for layer in model.model.layers:  # ggml's GELU: a table of F16 results indexed by F16 inputs
            layer.mlp.act_fn = _F16Gelu()
        table_gelu = model(torch.tensor([tokens])).logits[0].numpy()
    assert expected.std() > 1.0
    got = llama_cpp_logits(path, tokens)
    diff, diff_table = float(np.abs(got - expected).max()), float(np.abs(got - table_gelu).max())
    print(f"\n{arch}: max |llama.cpp - transformers| = {diff:.3g} over {expected.size} logits "
          f"(logit std {expected.std():.2f}); with ggml's F16 GELU in transformers {diff_table:.3g}")
    assert diff_table < 1e-2  # against the arithmetic ggml does; most of what is left below is its GELU table
    assert diff < (3e-2 if arch == "gemma3" else 1e-2)  # Gemma 3's 7 layers add up more of the table's rounding


class _F16Gelu(torch.nn.Module):
    """ggml's CPU GELU (GGML_GELU_FP16): the tanh approximation looked up at the F16 input, an F16 result;
    0 below -10, the input above 10."""

    def forward(self, x: Any) -> Any:
        y = torch.nn.functional.gelu(x.half().float(), approximate="tanh").half().float()
        return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))
