"""`tokenizer_source: PATH` of a mergekit config: that folder's tokenizer files, when they fit the merge.

Given a tokenizer source, mergekit 0.1.5 rebuilds every model's embedding rows in the order of that
tokenizer's vocabulary (each token's row looked up by the token in the model's own vocabulary) and
sizes the embeddings (and `lm_head`) to it. When every model maps each token to the id the source
gives it, and those tensors have one row per token, that is the plain merge: migrator merges as
usual and the output takes the source's tokenizer files. Otherwise it refuses, naming the first
difference, rather than write embeddings that are not mergekit's.

Vocabularies come from `tokenizer.json` (the fast tokenizer file mergekit loads): the model's vocab
(BPE, WordPiece, WordLevel: token -> id; Unigram: pieces in id order) plus `added_tokens`. A model
folder without one is taken to share the reference model's vocabulary, as mergekit takes it; the
tokenizer source and the reference model must have one.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from pathlib import Path

from ...core.errors import MergeInputError
from ...core.tensor import LazyTensor
from ...formats.bounded_json import read_capped, read_json_object

TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "vocab.*", "merges.txt", "added_tokens.json",
                   "chat_template.jinja")
"""A model folder's tokenizer files (the names `migrate merge` copies)."""
MAX_TOKENIZER_BYTES = 256 << 20
"""The largest tokenizer file read (tokenizer.json of a 256k vocabulary is ~20 MB)."""
EMBEDDINGS = re.compile(r"embed|wte|word_embeddings|tok_embeddings|lm_head")
"""The tensors with one row per token (mergekit's architecture definitions mark them)."""


def read_vocab(folder: Path) -> dict[str, int] | None:
    """token -> id of the folder's tokenizer.json (None when it has none); a malformed one is an error."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        data = read_json_object(path, MAX_TOKENIZER_BYTES, "tokenizer.json")
        model = data["model"]
        raw = model["vocab"]
        if isinstance(raw, dict):
            vocab = {str(k): int(v) for k, v in raw.items()}
        else:  # Unigram: [[piece, score], ...] in id order
            vocab = {str(entry[0]): i for i, entry in enumerate(raw)}
        for added in data.get("added_tokens") or []:
            vocab[str(added["content"])] = int(added["id"])
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise MergeInputError(f"not a tokenizer.json migrator can read the vocabulary of ({type(e).__name__}: {e})",
                              file=str(path)) from None
    return vocab


def tokenizer_files(source: str, models: Sequence[str], reference: str,
                    tensors: Sequence[LazyTensor]) -> list[tuple[str, bytes]]:
    """The tokenizer files of the folder `source`, as (name, bytes), once checked against the merge: every
    model folder's vocabulary (`models`, `reference` among them) and the rows of the output's embeddings."""
    folder = Path(source)
    vocab = read_vocab(folder)
    if vocab is None:
        raise MergeInputError("tokenizer_source has no tokenizer.json: migrator checks the vocabulary from it",
                              file=str(folder))
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise MergeInputError(f"the vocabulary's {len(vocab)} tokens do not have the ids 0 to {len(vocab) - 1}",
                              file=str(folder / "tokenizer.json"))
    for model in dict.fromkeys(models):
        theirs = read_vocab(Path(model))
        if theirs is None:
            if model == reference:
                raise MergeInputError("the reference model has no tokenizer.json to compare with the "
                                      "tokenizer_source's vocabulary", file=model)
            continue
        differs = next((t for t, i in vocab.items() if theirs.get(t) != i), None)
        if differs is not None or len(theirs) != len(vocab):
            what = (f"token {differs!r} is id {vocab[differs]} there and {theirs.get(differs)} here"
                    if differs is not None else f"{len(theirs)} tokens here, {len(vocab)} there")
            raise MergeInputError(f"this model's vocabulary is not the tokenizer_source's ({what}); mergekit would "
                                  "permute its embedding rows by token, which migrator does not do", file=model)
    rows = [t for t in tensors if EMBEDDINGS.search(t.name) and len(t.shape) == 2]
    if not rows:
        raise MergeInputError("no embedding tensor (embed_tokens, wte, lm_head...) to check the tokenizer_source's "
                              "vocabulary against", file=str(folder))
    for t in rows:
        if t.shape[0] != len(vocab):
            raise MergeInputError(f"'{t.name}' has {t.shape[0]} rows but the tokenizer_source has {len(vocab)} tokens; "
                                  "mergekit would resize the embeddings to the vocabulary, which migrator does not "
                                  "do", file=str(folder))
    out = []
    for path in sorted(folder.iterdir()):
        if path.is_file() and any(fnmatch.fnmatch(path.name, p) for p in TOKENIZER_FILES):
            out.append((path.name, read_capped(path, MAX_TOKENIZER_BYTES, "tokenizer")))
    return out

