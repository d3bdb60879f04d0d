"""Small real models built with transformers, shared by the tests that need the same one."""

from __future__ import annotations


def tiny_bert() -> object:
    """A 2-layer BERT with odd sizes (intermediate 37), seeded: the same weights in every test."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=37, max_position_embeddings=64)
    return transformers.BertModel(cfg).eval()


def tiny_bert_folder(folder: object, max_shard_size: str = "20KB") -> object:
    """`tiny_bert()` saved as a Hugging Face folder of shards (save_pretrained); returns the folder."""
    tiny_bert().save_pretrained(folder, max_shard_size=max_shard_size)  # type: ignore[attr-defined]
    return folder


def tiny_llama_rope(vocab_size: int = 320) -> object:
    """A 2-layer LlamaForCausalLM with grouped-query attention (4 heads, 2 KV heads) and a RoPE base other
    than the default, seeded."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   rms_norm_eps=1e-5, rope_theta=50000.0, bos_token_id=1, eos_token_id=2)
    return transformers.LlamaForCausalLM(cfg).eval()


def tiny_llama(layers: int = 2, hidden: int = 32, seed: int = 0, vocab: int = 96) -> object:
    """A seeded LlamaForCausalLM with `layers` layers (4 heads, 2 KV heads, untied lm_head)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                   num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(cfg).eval()


def tiny_gpt2(seed: int = 0) -> object:
    """A seeded 2-layer GPT-2 (Conv1D projections, tied lm_head)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    return transformers.GPT2LMHeadModel(cfg).eval()
