"""A GGUF's SentencePiece vocabulary (llama.cpp's "llama" model) written back as a Hugging Face
tokenizer: `tokenizer.model`, `tokenizer_config.json` and `special_tokens_map.json`.

`tokenizer.model` is sentencepiece_model.proto's ModelProto, encoded here by a few lines of
protobuf writing (no protobuf or sentencepiece import): every piece with its text, score and type
(llama.cpp's token types are SentencePiece's own numbers), a TrainerSpec holding what encoding reads
(model type, byte fallback, the unknown/BOS/EOS/padding ids and their texts), and a NormalizerSpec.

What the GGUF does not hold is taken as llama.cpp takes it, so the tokenizer written tokenizes as
llama.cpp does with the file:
* the model type is BPE: llama.cpp's llama vocabulary merges the best-scored pair first, which is
  SentencePiece's BPE (a Unigram model's vocabulary is llama.cpp's "t5", not handled here);
* the normalizer is Llama's: `identity` (no NFKC table; llama.cpp applies none), whitespace kept as
  it is (llama.cpp does not collapse runs of spaces), spaces escaped as U+2581, a leading space
  added as `tokenizer.ggml.add_space_prefix` says (default true);
* byte fallback when the vocabulary has all 256 `<0xXX>` byte pieces (llama.cpp's fallback).
A model trained with another normalizer (SentencePiece's default `nmt_nfkc`, or collapsing spaces)
loses it on the way to GGUF, in llama.cpp's converter too; the files written say what llama.cpp does.

A vocabulary SentencePiece cannot load is not written, with a note saying why: no scores, tokens
and types of different lengths, an empty or repeated piece, text that is not UTF-8, not exactly one
UNKNOWN piece, a BYTE piece not spelled `<0xXX>`.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping, Sequence
from typing import Any

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
BPE_MODEL = 2  # TrainerSpec.ModelType
_BYTE_PIECE = re.compile(r"^<0x[0-9A-F]{2}>$")
# TrainerSpec field numbers: the special ids and the texts SentencePiece finds them by
_ID_FIELDS = {"unknown": 40, "bos": 41, "eos": 42, "padding": 43}
_PIECE_FIELDS = {"unknown": 45, "bos": 46, "eos": 47, "padding": 48}
_CONFIG_NAMES = {"bos": "bos_token", "eos": "eos_token", "unknown": "unk_token", "padding": "pad_token"}


# -- protobuf writing (proto2 wire format: key = field number << 3 | wire type) ---------------------------------

def _varint(n: int) -> bytes:
    if n < 0:  # int32 / int64 negatives are ten-byte two's complement varints
        n += 1 << 64
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _bytes(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _float(number: int, value: float) -> bytes:
    return _varint(number << 3 | 5) + struct.pack("<f", value)


def model_proto(pieces: Sequence[str], scores: Sequence[float], types: Sequence[int], ids: Mapping[str, int],
                *, space_prefix: bool = True, byte_fallback: bool = False) -> bytes:
    """A ModelProto's bytes: `pieces` with their scores and types, BPE, Llama's identity normalizer.
    `ids`: the unknown/bos/eos/padding ids (-1: none)."""
    out = bytearray()
    for text, score, kind in zip(pieces, scores, types, strict=True):
        piece = _bytes(1, text.encode("utf-8")) + _float(2, float(score))
        if kind != NORMAL:  # the field's default
            piece += _int(3, kind)
        out += _bytes(1, piece)
    trainer = _int(3, BPE_MODEL) + _int(4, len(pieces))
    if byte_fallback:
        trainer += _int(35, 1)
    for name, number in _ID_FIELDS.items():
        trainer += _int(number, ids.get(name, -1))
    for name, number in _PIECE_FIELDS.items():
        i = ids.get(name, -1)
        if 0 <= i < len(pieces):
            trainer += _bytes(number, pieces[i].encode("utf-8"))
    out += _bytes(2, trainer)
    normalizer = (_bytes(1, b"identity") + _bytes(2, b"") + _int(3, int(space_prefix)) + _int(4, 0) + _int(5, 1))
    out += _bytes(3, normalizer)
    return bytes(out)


# -- a GGUF's key/values -> the files --------------------------------------------------------------------------------

def _data(meta: Mapping[str, str], key: str) -> Any:
    v = meta.get(key)
    return getattr(v, "data", v)


def _problem(tokens: list[str], scores: list[float] | None, types: list[int]) -> str | None:
    """Why SentencePiece could not load these pieces (None: it can)."""
    if scores is None:
        return "the GGUF has no tokenizer.ggml.scores (the BPE merge order)"
    if not tokens or not len(tokens) == len(scores) == len(types):
        return "the GGUF's tokens, scores and token types are not of one length"
    if any(not t for t in tokens):
        return "a token is empty"
    if len(set(tokens)) != len(tokens):
        return f"{len(tokens) - len(set(tokens))} of the tokens repeat another's text"
    for t in tokens:
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:
            return f"token {t!a} is not UTF-8"
    unknown = types.count(UNKNOWN)
    if unknown != 1:
        return f"SentencePiece needs one UNKNOWN token; the GGUF types {unknown}"
    bad = next((t for t, k in zip(tokens, types, strict=True) if k == BYTE and not _BYTE_PIECE.match(t)), None)
    if bad is not None:
        return f"the BYTE token {bad!a} is not spelled <0xXX>"
    unknown_kind = next((k for k in types if k not in range(1, 7)), None)
    if unknown_kind is not None:
        return f"token type {unknown_kind} is not one of SentencePiece's (1-6)"
    return None


def sentencepiece_files(meta: Mapping[str, str]) -> tuple[dict[str, bytes], list[str]]:
    """`tokenizer.model`, `tokenizer_config.json` and `special_tokens_map.json` for a GGUF's llama
    (SentencePiece) vocabulary, and notes: what was written and, when nothing is, why."""
    import numpy as np

    tokens = [str(t) for t in _data(meta, "tokenizer.ggml.tokens") or []]
    raw_scores = _data(meta, "tokenizer.ggml.scores")
    scores = None if raw_scores is None else [float(s) for s in np.asarray(raw_scores, dtype=np.float32)]
    raw_types = _data(meta, "tokenizer.ggml.token_type")
    types = [NORMAL] * len(tokens) if raw_types is None else [int(k) for k in raw_types]
    problem = _problem(tokens, scores, types)
    if problem is not None:
        return {}, [f"no tokenizer.model written: {problem}"]
    assert scores is not None
    ids = {"unknown": types.index(UNKNOWN)}
    for name in ("bos", "eos", "padding"):
        i = _data(meta, f"tokenizer.ggml.{name}_token_id")
        ids[name] = int(i) if i is not None and 0 <= int(i) < len(tokens) else -1
    space_prefix = _data(meta, "tokenizer.ggml.add_space_prefix")
    space_prefix = True if space_prefix is None else bool(space_prefix)
    byte_pieces = {t for t, k in zip(tokens, types, strict=True) if k == BYTE}
    byte_fallback = len(byte_pieces) == 256
    model = model_proto(tokens, scores, types, ids, space_prefix=space_prefix, byte_fallback=byte_fallback)
    add_bos = _data(meta, "tokenizer.ggml.add_bos_token")
    specials = {_CONFIG_NAMES[name]: tokens[i] for name, i in ids.items() if i >= 0}
    config: dict[str, Any] = {
        "tokenizer_class": "LlamaTokenizer",
        "add_bos_token": True if add_bos is None else bool(add_bos),  # llama.cpp's default for this vocabulary
        "add_eos_token": bool(_data(meta, "tokenizer.ggml.add_eos_token")),
        "add_prefix_space": space_prefix,
        "legacy": False,  # SentencePiece's own way: no space prefix after a special token in the text
        "clean_up_tokenization_spaces": False,
        "sp_model_kwargs": {},
        **specials,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                     "special": k != USER_DEFINED}
            for i, (t, k) in enumerate(zip(tokens, types, strict=True)) if k in (UNKNOWN, CONTROL, USER_DEFINED)},
    }
    template = _data(meta, "tokenizer.chat_template")
    if isinstance(template, str):
        config["chat_template"] = template
    files = {"tokenizer.model": model,
             "tokenizer_config.json": (json.dumps(config, ensure_ascii=False, indent=2) + "\n").encode("utf-8"),
             "special_tokens_map.json": (json.dumps(specials, ensure_ascii=False, indent=2) + "\n").encode("utf-8")}
    note = (f"tokenizer.model written from the GGUF's SentencePiece vocabulary ({len(tokens)} pieces): BPE, "
            f"Llama's identity normalizer{', byte fallback' if byte_fallback else ''} (what llama.cpp applies; a "
            "normalizer the original model had is not in the GGUF)")
    return files, [note]
