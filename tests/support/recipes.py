"""The example recipes of recipes/, in an order in which each one's inputs exist (`make demo`'s)."""

ORDER = ["mlp-to-burn", "burn-to-safetensors-f16", "encoder-surgery", "bert-to-burn", "burn-to-bert",
         "hf-folder-reshard", "gpt2-split-qkv", "gpt2-merge-qkv", "mixtral-stack-experts", "mixtral-unstack-experts",
         "llama-meta-to-hf", "llama-hf-to-meta", "hf-llama-to-megatron", "hf-qwen2-to-megatron",
         "hf-qwen3-to-megatron", "hf-mixtral-to-megatron", "hf-qwen3-moe-to-megatron", "bert-graft", "bert-cut-layers",
         "bert-stack-layers", "lora-fold", "merge-slerp", "merge-ties", "depth-upscale", "llama-to-burn",
         "mixtral-prune-experts", "llama-add-tokens"]

WITHOUT_DEMO = ["megatron-llama-to-hf", "megatron-qwen2-to-hf", "megatron-qwen3-to-hf", "megatron-mixtral-to-hf",
                "megatron-qwen3-moe-to-hf"]
"""Recipes whose source only megatron-core (torch) can write: not in `make demo` (runtime dependencies only);
`tests/cli/test_megatron_recipes.py` runs each on the checkpoint megatron-core writes."""
