"""Write the small models the example recipes run on (numpy + migrator only; deterministic).

    python recipes/generate_demo_data.py [OUT_DIR]      # default: demo-out/

- tiny-bert.pt / tiny-bert.safetensors: a Hugging Face BertModel-shaped state_dict (PyTorch layouts:
  Linear weights [out, in], LayerNorm weight/bias), fp32 with int64 position ids.
- mlp.pt: an `nn.Sequential(Linear, ReLU, Linear, ReLU, Linear)` state_dict under `model.`, i.e. the
  index gaps (`net.0`, `net.2`, `net.4`) that Burn's contiguous-index mapping closes.
- tiny-bert-hf/: the same tensors as a Hugging Face model folder: 40 KB shards, an index and a
  config.json (what `save_pretrained(max_shard_size="40KB")` writes), for the sharded demo recipe.
- bert-encoder-donor.safetensors, bert-head-donor.safetensors, bert-cls-init.safetensors: a BertModel and two
  BertForSequenceClassification-shaped state_dicts (3 labels), for the bert-graft recipe (several sources).
- bert-24-layers.safetensors, bert-6-layers-a.safetensors, bert-6-layers-b.safetensors: BertModels of 24 and
  6 layers, for the layer-slicing and layer-stacking recipes (index arithmetic).
- classifier-init.bpk: a freshly initialised Burn-side classifier (encoder + head) with param_ids:
  the template the encoder-surgery recipe fills.
- gpt2-tiny.safetensors, mixtral-tiny-experts.safetensors, mixtral-tiny-hf/, llama-meta-tiny/ (+
  llama-hf-tiny/config.json): the `ops:` recipes' inputs (recipes/ops_demo.py).
- llama-base/, llama-chat/, llama-code/, llama-lora/: Hugging Face Llama folders and a PEFT LoRA adapter,
  the merge recipes' inputs, and llama-vocab/ (with a tokenizer) the vocabulary-growth recipe's
  (recipes/merge_demo.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from migrator import from_numpy, save

HIDDEN, FFN, VOCAB, LAYERS, POSITIONS = 64, 128, 512, 2, 128


BERT_CONFIG = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": HIDDEN, "intermediate_size": FFN,
               "vocab_size": VOCAB, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
               "max_position_embeddings": POSITIONS, "type_vocab_size": 2}


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def tiny_bert(seed: int = 0, layers: int = LAYERS) -> dict[str, np.ndarray]:
    rng = _rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def norm(prefix: str, t: dict[str, np.ndarray]) -> None:
        t[prefix + ".weight"] = (1 + w(HIDDEN)).astype(np.float32)
        t[prefix + ".bias"] = w(HIDDEN)

    t: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": w(VOCAB, HIDDEN),
        "embeddings.position_embeddings.weight": w(POSITIONS, HIDDEN),
        "embeddings.token_type_embeddings.weight": w(2, HIDDEN),
        "embeddings.position_ids": np.arange(POSITIONS, dtype=np.int64)[None, :],
    }
    norm("embeddings.LayerNorm", t)
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for name in ("query", "key", "value"):
            t[p + f"attention.self.{name}.weight"] = w(HIDDEN, HIDDEN)
            t[p + f"attention.self.{name}.bias"] = w(HIDDEN)
        t[p + "attention.output.dense.weight"] = w(HIDDEN, HIDDEN)
        t[p + "attention.output.dense.bias"] = w(HIDDEN)
        norm(p + "attention.output.LayerNorm", t)
        t[p + "intermediate.dense.weight"] = w(FFN, HIDDEN)
        t[p + "intermediate.dense.bias"] = w(FFN)
        t[p + "output.dense.weight"] = w(HIDDEN, FFN)
        t[p + "output.dense.bias"] = w(HIDDEN)
        norm(p + "output.LayerNorm", t)
    t["pooler.dense.weight"] = w(HIDDEN, HIDDEN)
    t["pooler.dense.bias"] = w(HIDDEN)
    return t


def mlp(seed: int = 1) -> dict[str, np.ndarray]:
    rng = _rng(seed)
    sizes = [(16, 8), (16, 16), (4, 16)]
    t: dict[str, np.ndarray] = {}
    for i, (out, inp) in zip((0, 2, 4), sizes, strict=True):
        t[f"model.net.{i}.weight"] = rng.standard_normal((out, inp)).astype(np.float32)
        t[f"model.net.{i}.bias"] = rng.standard_normal(out).astype(np.float32)
    return t


def classifier_template(seed: int = 2) -> list:
    """Burn-side names and layouts (Linear [in, out], norms gamma/beta), as a Burn model would save."""
    rng = _rng(seed)
    out = []
    pid = 1000
    for i in range(LAYERS):
        for name, shape in (("query.weight", (HIDDEN, HIDDEN)), ("query.bias", (HIDDEN,)),
                            ("key.weight", (HIDDEN, HIDDEN)), ("key.bias", (HIDDEN,)),
                            ("value.weight", (HIDDEN, HIDDEN)), ("value.bias", (HIDDEN,)),
                            ("output.weight", (HIDDEN, HIDDEN)), ("output.bias", (HIDDEN,))):
            pid += 1
            out.append(from_numpy(f"encoder.layers.{i}.mha.{name}", rng.standard_normal(shape).astype(np.float32),
                                  param_id=pid))
    for name, shape in (("classifier.weight", (HIDDEN, 3)), ("classifier.bias", (3,))):
        pid += 1
        out.append(from_numpy(name, np.zeros(shape, np.float32), param_id=pid))
    return out


def bert_classifier(seed: int) -> dict[str, np.ndarray]:
    """BertForSequenceClassification's names: the BertModel under `bert.`, then a 3-label head."""
    t = {"bert." + k: v for k, v in tiny_bert(seed).items()}
    rng = _rng(seed + 100)
    t["classifier.weight"] = (rng.standard_normal((3, HIDDEN)) * 0.02).astype(np.float32)
    t["classifier.bias"] = np.zeros(3, np.float32)
    return t


def main(out_dir: str = "demo-out") -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bert = [from_numpy(k, v) for k, v in tiny_bert().items()]
    save(bert, out / "tiny-bert.pt", overwrite=True)
    save(bert, out / "tiny-bert.safetensors", metadata={"format": "pt"}, overwrite=True)
    save(bert, out / "tiny-bert-hf", metadata={"format": "pt"}, overwrite=True, max_shard_size="40KB")
    (out / "tiny-bert-hf" / "config.json").write_text(json.dumps(BERT_CONFIG, indent=2) + "\n")
    save([from_numpy(k, v) for k, v in mlp().items()], out / "mlp.pt", overwrite=True)
    save([from_numpy(k, v) for k, v in tiny_bert(10).items()], out / "bert-encoder-donor.safetensors", overwrite=True)
    for name, seed, layers in (("bert-24-layers", 20, 24), ("bert-6-layers-a", 21, 6), ("bert-6-layers-b", 22, 6)):
        save([from_numpy(k, v) for k, v in tiny_bert(seed, layers).items()], out / f"{name}.safetensors",
             overwrite=True)
    for name, seed in (("bert-head-donor", 11), ("bert-cls-init", 12)):
        save([from_numpy(k, v) for k, v in bert_classifier(seed).items()], out / f"{name}.safetensors", overwrite=True)
    save(classifier_template(), out / "classifier-init.bpk", overwrite=True,
         metadata={"format": "burnpack", "producer": "burn", "version": "0.22.0-pre.2"})
    import ops_demo  # beside this script: the checkpoints of the ops: recipes

    ops_demo.write(out)
    import merge_demo  # beside this script: the models and adapter of the merge recipes

    merge_demo.write(out)
    print(f"generated tiny-bert.pt, tiny-bert.safetensors, tiny-bert-hf/, mlp.pt, classifier-init.bpk, "
          f"gpt2-tiny.safetensors, mixtral-tiny-experts.safetensors, mixtral-tiny-hf/, llama-meta-tiny/, "
          f"bert-*-donor.safetensors, "
          f"bert-cls-init.safetensors, bert-24-layers.safetensors, bert-6-layers-*.safetensors, "
          f"llama-{{base,chat,code,lora,vocab}}/ in {out}/")


if __name__ == "__main__":
    main(*sys.argv[1:2])
