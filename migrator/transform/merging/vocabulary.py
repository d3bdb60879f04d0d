"""A mergekit merge's output vocabulary (`tokenizer_source: base | union | MODEL`, the `tokenizer:`
section), and each model's embedding and `lm_head` rows rebuilt in its order, as mergekit 0.1.5 builds
them (`mergekit/tokenizer/build.py`, `embed.py`).

The output tokenizer is the base model's (`base_model`, else the first model: mergekit takes an
arbitrary one of its set there), a named model's, or for `union` the base's plus every token of the
other models it lacks (their vocabularies' tokens first, then their added tokens, with the settings
of the first model adding each); then each `tokenizer.tokens` key it lacks, as a non-special added
token. A model's row for each output token is its own row of that token, or, where it lacks the
token or the token's entry says `force`, the token's default: the entry's source (a model's row of
the token, one model's row of another token or id, zeros), else the row of the only model holding
it, else the base model's, else the mean of the models holding it (summed in their dtype in the
models' order, then divided), and zeros for a token none holds. `pad_to_multiple_of` pads with the
mean of each model's rows. The merge method then merges these rows as any tensor.

mergekit's `union` gives new tokens ids in the order of a hash map (they differ from run to run);
migrator's order is the one above (each model's tokens by id), so the same tokens have the same rows,
under other ids. Refused where mergekit 0.1.5 fails (a token id beyond a model's `vocab_size`, the
source `base` with new tokens beyond the base's rows: a KeyError there) or where the files cannot be
read: every vocabulary is read from `tokenizer.json`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...core.errors import MergeInputError
from ...core.tensor import LazyTensor
from ...formats.bounded_json import read_capped, read_json_object
from ...recipe.mergekit import ModelTokenEmbedding, TokenEmbedding, TokenizerSpec, ZeroEmbedding

if TYPE_CHECKING:
    import numpy as np

    from ...core.dtypes import DType

TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "vocab.*", "merges.txt", "added_tokens.json",
                   "chat_template.jinja")
"""A model folder's tokenizer files (the names `migrate merge` copies)."""
MAX_TOKENIZER_BYTES = 256 << 20
"""The largest tokenizer file read (tokenizer.json of a 256k vocabulary is ~20 MB)."""
EMBEDDINGS = re.compile(r"embed|wte|word_embeddings|tok_embeddings|lm_head")
"""The tensors with one row per token (mergekit's architecture definitions mark them)."""


@dataclass
class Tokenizer:
    """A folder's tokenizer.json: token -> id (the model's vocabulary and the added tokens), the added
    tokens' entries by content, and the document (to write back with tokens added)."""

    folder: str
    vocab: dict[str, int]
    added: dict[str, dict[str, Any]]
    document: dict[str, Any]


def read_tokenizer(folder: str) -> Tokenizer | None:
    """The folder's tokenizer.json (None when it has none); MergeInputError for one migrator cannot read."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        data = read_json_object(path, MAX_TOKENIZER_BYTES, "tokenizer.json")
        raw = data["model"]["vocab"]
        if isinstance(raw, dict):
            vocab = {str(k): int(v) for k, v in raw.items()}
        else:  # Unigram: [[piece, score], ...] in id order
            vocab = {str(entry[0]): i for i, entry in enumerate(raw)}
        added = {}
        for entry in data.get("added_tokens") or []:
            vocab[str(entry["content"])] = int(entry["id"])
            added[str(entry["content"])] = dict(entry)
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise MergeInputError(f"not a tokenizer.json migrator can read the vocabulary of ({type(e).__name__}: {e})",
                              file=str(path)) from None
    return Tokenizer(folder, vocab, added, data)


def _vocab_size(folder: str, default: int) -> int:
    """config.json's vocab_size (the rows mergekit counts a token id against), else `default`."""
    from ...files.model_config import ConfigError, load_config

    path = Path(folder) / "config.json"
    if not path.is_file():
        return default
    try:
        value = load_config(path).get("vocab_size")
    except ConfigError as e:
        raise MergeInputError(str(e)) from None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


@dataclass
class Vocabulary:
    """The output vocabulary (token -> id, `size` rows with padding), each model's row per output id (-1:
    it lacks the token), each model's own vocabulary, and the output's tokenizer files."""

    tokens: dict[str, int]
    size: int
    rows: dict[str, list[int]]
    vocabs: dict[str, dict[str, int]]
    spec: TokenizerSpec
    files: list[tuple[str, bytes]] = field(default_factory=list)
    added: list[str] = field(default_factory=list)


def build_vocabulary(spec: TokenizerSpec, models: Mapping[str, str], order: Sequence[str]) -> Vocabulary | None:
    """The vocabulary of a merge of `models` (config reference -> folder; `order`: the references in the
    config's order) with tokenizer settings `spec`. None for `source: base` with no `tokens` over models of
    which none has a tokenizer.json (a SentencePiece tokenizer.model, say): they share the base's
    vocabulary, as mergekit takes them, so the rows stay as they are and the base's files are copied."""
    base_folder = models[spec.base]
    base = read_tokenizer(base_folder)
    if base is None and spec.source == "base" and not spec.tokens and all(
            not (Path(models[ref]) / "tokenizer.json").is_file() for ref in order):
        return None
    if base is None:
        raise MergeInputError("the base model has no tokenizer.json (a tokenizer source needs its vocabulary)",
                              file=base_folder)
    base_size = _vocab_size(base_folder, len(base.vocab))
    beyond = [t for t, i in base.vocab.items() if i >= base_size]
    if beyond:  # mergekit strips these from a BPE tokenizer's files; migrator does not rewrite a vocabulary
        raise MergeInputError(f"{len(beyond)} tokens of the base's tokenizer (e.g. {beyond[0]!r}) have ids beyond "
                              f"its config.json vocab_size {base_size}: not supported", file=base_folder)
    tokenizers: dict[str, Tokenizer] = {}
    for ref in dict.fromkeys([spec.base, *order]):
        found = base if ref == spec.base else read_tokenizer(models[ref])
        tokenizers[ref] = found if found is not None else base  # mergekit: "assuming same as" the base
    if spec.source in ("base", "union"):
        out = base
    else:
        found = read_tokenizer(spec.source)
        if found is None:
            raise MergeInputError("the tokenizer source has no tokenizer.json", file=spec.source)
        out = found
    tokens = dict(out.vocab)
    if sorted(tokens.values()) != list(range(len(tokens))):
        raise MergeInputError(f"the tokenizer's {len(tokens)} tokens do not have the ids 0 to {len(tokens) - 1}",
                              file=str(Path(out.folder) / "tokenizer.json"))
    new: list[tuple[str, dict[str, Any]]] = []  # (token, its added-token entry), in id order
    if spec.source == "union":
        new = _union_tokens(base, tokenizers, models)
    for token in spec.tokens:
        if token not in tokens and all(token != t for t, _ in new):
            new.append((token, _entry(token)))
    for token, _ in new:
        tokens[token] = len(tokens)
    size = len(tokens)
    pad = spec.pad_to_multiple_of
    if pad and size % pad:
        size += pad - size % pad
    vocabs = {ref: t.vocab for ref, t in tokenizers.items()}
    if spec.source == "base":  # mergekit adds the tokens to the base's own tokenizer object (also standing for
        vocabs.update({ref: tokens for ref, t in tokenizers.items() if t is base})  # models with none)
    rows: dict[str, list[int]] = {}
    for ref in order:
        vocab, limit = vocabs[ref], _vocab_size(models[ref], len(vocabs[ref]))
        row = []
        for token in tokens:
            i = vocab.get(token, -1)
            if i >= limit and vocab is tokens:
                raise MergeInputError(f"source 'base' with the new token {token!r}: mergekit 0.1.5 adds it to the "
                                      f"base's own tokenizer (id {i}, past its config.json vocab_size {limit}) and "
                                      "fails (KeyError); name the base model's folder as the source instead",
                                      file=models[ref])
            if i >= limit:  # mergekit 0.1.5 leaves the token out of the model's map, then fails (KeyError)
                raise MergeInputError(f"token {token!r} has id {i} in this model's tokenizer, beyond its config.json "
                                      f"vocab_size {limit} (mergekit 0.1.5 fails on it: KeyError)", file=models[ref])
            row.append(i)
        rows[ref] = row
    out_files = _files(out, new)
    return Vocabulary(tokens, size, rows, vocabs, spec, out_files, [t for t, _ in new])


def _entry(token: str) -> dict[str, Any]:
    """The added-token entry transformers' `add_tokens(token)` makes: not special, normalized."""
    return {"content": token, "single_word": False, "lstrip": False, "rstrip": False, "normalized": True,
            "special": False}


def _union_tokens(base: Tokenizer, tokenizers: Mapping[str, Tokenizer], models: Mapping[str, str]
                  ) -> list[tuple[str, dict[str, Any]]]:
    """The tokens `union` adds to the base's: the models' vocabulary tokens the base lacks, then their added
    tokens (the first model's settings), each model's by id, models in order (the base first)."""
    plain: dict[str, None] = {}
    added: dict[str, dict[str, Any]] = {}
    for ref, tok in tokenizers.items():
        limit = _vocab_size(models[ref], len(tok.vocab))
        for token, _ in sorted(tok.vocab.items(), key=lambda kv: kv[1]):
            if tok.vocab[token] >= limit:
                continue
            if token in tok.added:
                added.setdefault(token, tok.added[token])
            else:
                plain.setdefault(token)
    out = [(t, _entry(t)) for t in plain if t not in added and t not in base.vocab]
    return out + [(t, e) for t, e in added.items() if t not in base.vocab]


def _files(out: Tokenizer, new: Sequence[tuple[str, dict[str, Any]]]) -> list[tuple[str, bytes]]:
    """The output's tokenizer files: the source folder's, with the new tokens appended to tokenizer.json's
    added_tokens (and tokenizer_config.json's added_tokens_decoder, where it has one)."""
    import fnmatch

    folder = Path(out.folder)
    files: list[tuple[str, bytes]] = []
    first = len(out.vocab)
    for path in sorted(folder.iterdir()):
        if not (path.is_file() and any(fnmatch.fnmatch(path.name, p) for p in TOKENIZER_FILES)):
            continue
        data = read_capped(path, MAX_TOKENIZER_BYTES, "tokenizer")
        if new and path.name == "tokenizer.json":
            doc = dict(out.document)
            doc["added_tokens"] = [*(doc.get("added_tokens") or []),
                                   *({"id": first + k, **entry, "content": token} for k, (token, entry)
                                     in enumerate(new))]
            data = json.dumps(doc, ensure_ascii=False, indent=2).encode()
        elif new and path.name == "tokenizer_config.json":
            config = read_json_object(path, MAX_TOKENIZER_BYTES, "tokenizer_config.json")
            if isinstance(config.get("added_tokens_decoder"), dict):
                config["added_tokens_decoder"].update({
                    str(first + k): {key: entry.get(key, False) for key in
                                     ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
                    | {"content": token} for k, (token, entry) in enumerate(new)})
                data = json.dumps(config, ensure_ascii=False, indent=2).encode()
        files.append((path.name, data))
    return files


def is_vocabulary_tensor(tensor: LazyTensor) -> bool:
    """A tensor with one row per token: the embedding and lm_head (mergekit's vocabulary_axis 0)."""
    return bool(EMBEDDINGS.search(tensor.name)) and len(tensor.shape) == 2


def permuted(vocab: Vocabulary, name: str, inputs: Sequence[tuple[str, LazyTensor]], base_model: str | None,
             dtype: DType | None) -> list[LazyTensor]:
    """Each input of the merged tensor `name` (model reference, its tensor) with its rows rebuilt in the
    output vocabulary's order: [vocab.size, hidden], in `dtype` (mergekit's config dtype, else the
    inputs' common type). The models' tensors are read whole (they are read once, for every input)."""
    import numpy as np

    from ...core import dtypes

    refs = [ref for ref, _ in inputs]
    hidden = {t.shape[1:] for _, t in inputs}
    if len(hidden) != 1:
        raise MergeInputError(f"'{name}': the models' rows differ in size ({sorted(hidden)})", tensor=name)
    for ref, t in inputs:
        top = max(vocab.rows[ref], default=-1)
        if top >= t.shape[0]:
            raise MergeInputError(f"'{name}' of model '{ref}' has {t.shape[0]} rows; its tokenizer has token id {top}",
                                  tensor=name)
    if dtype is None:
        kinds = {t.dtype for _, t in inputs}
        dtype = kinds.pop() if len(kinds) == 1 else dtypes.parse("F32")  # torch.promote_types of mixed halves
    out_dtype: DType = dtype
    defaults = _default_sources(vocab, refs, base_model, name)
    cache: dict[str, Any] = {}

    def arrays() -> tuple[dict[str, np.ndarray], dict[int, np.ndarray]]:
        if not cache:
            np_type = out_dtype.numpy()
            values = {ref: t.numpy().astype(np_type) for ref, t in inputs}
            made: dict[int, np.ndarray] = {}
            for i, how in defaults.items():
                made[i] = _default_row(how, values, vocab, np_type, name)
            cache["values"], cache["defaults"] = values, made
        return cache["values"], cache["defaults"]

    forced = {vocab.tokens[t] for t, e in vocab.spec.tokens.items() if e.force and t in vocab.tokens}
    out = []
    for ref, t in inputs:
        def load(ref: str = ref) -> memoryview:
            values, made = arrays()
            own = values[ref]
            rows = np.zeros((vocab.size, *own.shape[1:]), dtype=own.dtype)
            for i, j in enumerate(vocab.rows[ref]):
                if j >= 0 and i not in forced:
                    rows[i] = own[j]
                elif i in made:
                    rows[i] = made[i]
            count = len(vocab.tokens)
            if vocab.size > count:  # padding rows: the mean of the model's rows
                rows[count:] = rows[:count].astype(np.float32).mean(axis=0).astype(rows.dtype) \
                    if rows.dtype != np.float64 else rows[:count].mean(axis=0)
            return np.ascontiguousarray(rows).reshape(-1).view(np.uint8).data
        shape = (vocab.size, *t.shape[1:])
        out.append(LazyTensor(t.name, out_dtype, shape, out_dtype.nbytes(shape) or 0, load, origin=t.origin))
    return out


Default = tuple[str, Any]
"""How a token's default row is made: ("mean", (refs, output id)), ("row", (ref, row)), ("zero", None)."""


def _default_sources(vocab: Vocabulary, refs: Sequence[str], base_model: str | None, name: str
                     ) -> dict[int, Any]:
    """Output id -> how its default row is made, for the tokens that need one in this tensor (mergekit's
    `assign_embedding_sources` and `compute_default_embedding`)."""
    configs: dict[str, TokenEmbedding] = dict(vocab.spec.tokens)
    average: set[str] = set()
    for token, i in vocab.tokens.items():
        if token in configs:
            continue
        present = [ref for ref in refs if vocab.rows[ref][i] >= 0]
        if len(present) == 1:
            configs[token] = TokenEmbedding(source=present[0])
        elif not present:
            configs[token] = TokenEmbedding(source=ZeroEmbedding(kind="zero"))
        elif base_model is not None and base_model in refs and vocab.rows[base_model][i] >= 0:
            configs[token] = TokenEmbedding(source=base_model)
        else:
            average.add(token)
    out: dict[int, Any] = {}
    for token, i in vocab.tokens.items():
        cfg = configs.get(token)
        if not (cfg and cfg.force) and all(vocab.rows[ref][i] >= 0 for ref in refs):
            continue
        if token in average:
            out[i] = ("mean", ([ref for ref in refs if vocab.rows[ref][i] >= 0], i))
            continue
        assert cfg is not None
        src = cfg.source
        if isinstance(src, ZeroEmbedding):
            out[i] = ("zero", None)
            continue
        model = src.model if isinstance(src, ModelTokenEmbedding) else src
        if not isinstance(model, str):
            raise MergeInputError(f"token {token!r} needs a row (some model lacks it, or force) but its entry names "
                                  "no source", tensor=name)
        if model not in refs:
            raise MergeInputError(f"token {token!r} takes its row from '{model}', which is not an input of '{name}'",
                                  tensor=name)
        if isinstance(src, ModelTokenEmbedding):
            row = src.token_id
            if row is None:
                if src.token not in vocab.vocabs[model]:
                    raise MergeInputError(f"token {token!r}: {src.token!r} is not in the vocabulary of '{model}'",
                                          tensor=name)
                row = vocab.vocabs[model][str(src.token)]
            out[i] = ("row", (model, row))
        else:
            if vocab.rows[model][i] < 0:
                raise MergeInputError(f"token {token!r} takes its row from '{model}', whose vocabulary lacks it",
                                      tensor=name)
            out[i] = ("row", (model, vocab.rows[model][i]))
    return out


def _default_row(how: Default, values: Mapping[str, np.ndarray], vocab: Vocabulary, np_type: Any,
                 name: str) -> np.ndarray:
    import numpy as np

    kind, arg = how
    first = next(iter(values.values()))
    if kind == "zero":
        return np.zeros(first.shape[1:], dtype=np_type)
    if kind == "row":
        model, row = arg
        if not 0 <= row < values[model].shape[0]:
            raise MergeInputError(f"token id {row} is out of range for model '{model}' ({values[model].shape[0]} "
                                  "rows)", tensor=name)
        return values[model][row]
    refs, i = arg
    total = np.zeros(first.shape[1:], dtype=np_type)
    for ref in refs:  # as mergekit: summed in the models' order in their dtype, then divided by the count
        total = total + values[ref][vocab.rows[ref][i]]
    return (total / np.dtype(np_type).type(len(refs))).astype(np_type)
