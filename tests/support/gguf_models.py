"""Shared test helpers (gguf_models); moved from the test files that first needed them."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.models import tiny_llama_rope

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")
tokenizers = pytest.importorskip("tokenizers")


TEXT = "the quick brown fox jumps over the lazy dog while a cat naps on the warm mat by the door"


def sentencepiece_model(folder: Path, vocab_size: int = 300, **options: object) -> Path:
    """A BPE tokenizer.model trained in `folder` (byte fallback, a user-defined `<sep>`); `options` go to the
    trainer (e.g. Llama's normalizer: normalization_rule_name='identity', remove_extra_whitespaces=False)."""
    rng = random.Random(0)
    words = TEXT.split() + ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 7))) for _ in range(300)]
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(2000)))
    prefix = folder / "tokenizer"
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(prefix), vocab_size=vocab_size,
                                   model_type="bpe", byte_fallback=True, character_coverage=1.0,
                                   user_defined_symbols=["<sep>"], minloglevel=2, **options)
    corpus.unlink()
    (folder / "tokenizer.vocab").unlink()
    return prefix.with_suffix(".model")


SPLITS = {  # each family's pre-tokenizer regex as its tokenizer.json spells it
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}


BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


TEXTS = ["the quick brown fox jumps over the lazy dog", "It's 2024: 12345 cats, 7 dogs!",
         "  leading spaces\nand\r\nnew lines\t\ttabs", "caf\u00e9 na\u00efve \u00fcber \u4e2d\u6587 \U0001F600",
         "why<think>now</think> hmm", f"{BOS}already special{EOS} text", "you'll we've THEY'RE"]


def bpe_tokenizer(family: str, vocab_size: int = 420) -> Any:
    """A byte-level BPE trained on a small seeded corpus, shaped like `family`'s tokenizer.json
    (llama-bpe, qwen2 or gpt-2), with BOS/EOS special tokens added last (as Llama 3 has them) and a
    non-special added token `<think>`; the post-processor adds BOS."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(ignore_merges=family == "llama-bpe"))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=family == "gpt-2")
    tok.pre_tokenizer = byte_level if family == "gpt-2" else pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(SPLITS[family]), behavior="isolated"), byte_level])
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(0)
    words = [*TEXTS[0].split(), "while", "a", "cat", "naps", "on", "warm", "mat", "by", "door", "it's",
             "you'll", "2024", "1999", "12", "7", ":", ",", "!", "?", "\n", "caf\u00e9", "\u00fcber"]
    words += ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 7))) for _ in range(200)]
    corpus = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(2000)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens([BOS, EOS])
    tok.add_tokens([tokenizers.AddedToken("<think>", normalized=False), tokenizers.AddedToken("</think>",
                                                                                              normalized=False)])
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, bos)])
    return tok


def bpe_folder(folder: Path, family: str, padding: int = 3, model_of: Callable[[int], Any] | None = None) -> Path:
    """A tiny model folder (`model_of(vocab_size)`, by default a LlamaForCausalLM) with `family`'s tokenizer
    (tokenizer.json, tokenizer_config.json), its embedding `padding` rows larger than the tokenizer (ids
    no token holds, as many models have)."""
    tok = bpe_tokenizer(family)
    n = tok.get_vocab_size()
    model = (model_of or tiny_llama_rope)(n + padding)
    model.config.bos_token_id, model.config.eos_token_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    model.save_pretrained(folder)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS)
    fast.save_pretrained(folder)
    return folder


SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 32}


def tiny_llama31(scaling: dict[str, object] | None = SCALING, seed: int = 0, vocab_size: int = 96) -> Any:
    """A 2-layer Llama with head_dim 16 and llama3 RoPE scaling whose bands cover the rotary pairs: with
    original_max_position_embeddings 32 the first pair keeps its speed, one is blended, the rest slowed 8x."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   rope_theta=10000.0, bos_token_id=1, eos_token_id=2,
                                   rope_scaling=dict(scaling) if scaling else None)  # transformers adds to it
    return transformers.LlamaForCausalLM(cfg).eval()


def tiny_qwen2(vocab_size: int = 96, tied: bool = False) -> Any:
    """A 2-layer Qwen2ForCausalLM (q/k/v biases, grouped-query attention), seeded; biases drawn non-zero."""
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   rope_theta=50000.0, rms_norm_eps=1e-5, tie_word_embeddings=tied,
                                   bos_token_id=1, eos_token_id=2)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape) * 0.5)
    return model


def tiny_phi3(vocab_size: int = 32064) -> Any:
    """A 2-layer Phi3ForCausalLM (fused qkv and gate_up projections), seeded. Phi-3's vocabulary size: a
    config.json without pad_token_id (ours or transformers' from a GGUF) gets Phi3Config's 32000."""
    torch.manual_seed(0)
    cfg = transformers.Phi3Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                  original_max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-5,
                                  sliding_window=None, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.Phi3ForCausalLM(cfg).eval()


def tiny_gemma2(dtype: Any = None, vocab_size: int = 96) -> Any:
    """A 2-layer Gemma2ForCausalLM (four norms a layer, tied embeddings, a sliding window), seeded. Its norm
    weights are drawn on a grid of 1/64 in [-0.5, 0.5], where (w + 1) - 1 is w again in F32: transformers'
    loader subtracts the 1 llama.cpp's convention adds, so only such weights can read back equal."""
    torch.manual_seed(0)
    cfg = transformers.Gemma2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                                    max_position_embeddings=128, sliding_window=32, rms_norm_eps=1e-6,
                                    bos_token_id=2, eos_token_id=1, pad_token_id=0)
    model = transformers.Gemma2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.randint(-32, 33, p.shape).float() / 64)
    return model if dtype is None else model.to(dtype)


def tiny_gemma(vocab_size: int = 96) -> Any:
    """A 2-layer GemmaForCausalLM (head_dim 32 with hidden 64 and 4 heads, tied embeddings), seeded; norm
    weights on tiny_gemma2's grid."""
    torch.manual_seed(0)
    cfg = transformers.GemmaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                                   max_position_embeddings=128, rms_norm_eps=1e-6, bos_token_id=2, eos_token_id=1,
                                   pad_token_id=0)
    model = transformers.GemmaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.randint(-32, 33, p.shape).float() / 64)
    return model


def tiny_gemma3(vocab_size: int = 96) -> Any:
    """A 7-layer Gemma3ForCausalLM (q/k norms; five sliding layers, then a global one with linear RoPE
    scaling), seeded; norm weights on tiny_gemma2's grid."""
    torch.manual_seed(0)
    rope = {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}
    cfg = transformers.Gemma3TextConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=96,
                                        num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                        query_pre_attn_scalar=16, max_position_embeddings=128, sliding_window=16,
                                        rope_parameters=rope, rms_norm_eps=1e-6, bos_token_id=2, eos_token_id=1,
                                        pad_token_id=0)
    cfg.architectures = ["Gemma3ForCausalLM"]
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.randint(-32, 33, p.shape).float() / 64)
    return model
