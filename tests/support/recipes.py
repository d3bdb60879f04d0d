"""The example recipes of recipes/, in an order in which each one's inputs exist (`make demo`'s)."""

ORDER = ["mlp-to-burn", "burn-to-safetensors-f16", "encoder-surgery", "bert-to-burn", "burn-to-bert",
         "hf-folder-reshard", "gpt2-split-qkv", "gpt2-merge-qkv", "mixtral-stack-experts", "mixtral-unstack-experts",
         "llama-meta-to-hf", "llama-hf-to-meta", "hf-llama-to-megatron", "hf-qwen2-to-megatron",
         "hf-qwen3-to-megatron", "hf-mixtral-to-megatron", "hf-qwen3-moe-to-megatron", "megatron-llama-to-hf",
         "megatron-qwen2-to-hf", "megatron-qwen3-to-hf", "megatron-mixtral-to-hf", "megatron-qwen3-moe-to-hf",
         "bert-graft", "bert-cut-layers", "bert-stack-layers", "lora-fold", "merge-slerp", "merge-ties",
         "depth-upscale", "llama-to-burn", "mixtral-prune-experts", "llama-add-tokens"]

WITHOUT_DEMO: list[str] = []
"""Recipes not in `make demo` (none: the Megatron -> HF recipes read what the HF -> Megatron ones wrote, and
`tests/cli/test_megatron_recipes.py` also runs each on a checkpoint megatron-core writes)."""
