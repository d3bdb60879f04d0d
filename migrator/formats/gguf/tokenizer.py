"""A SentencePiece `tokenizer.model` as GGUF's `tokenizer.ggml.*` key/values (llama.cpp's "llama" vocab).

The model file is a protobuf (sentencepiece_model.proto's ModelProto); this reads the three fields
llama.cpp takes from each piece -- text, score, type -- and the special token ids of its trainer
spec, with a small bounded protobuf walker rather than the sentencepiece library (a hostile file
cannot make it allocate more than the file's size in pieces). Special tokens and add_bos/add_eos
come from `tokenizer_config.json` / `config.json` beside the model when they say, as llama.cpp's
converter takes them.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from ...core.errors import FormatError
from .constants import ValueType
from .header import Value, check_utf8

MAX_MODEL_BYTES = 64 << 20
# ModelProto: 1 = repeated SentencePiece {1 piece, 2 score, 3 type}, 2 = TrainerSpec {40 unk_id,
# 41 bos_id, 42 eos_id, 43 pad_id}, 3 = NormalizerSpec {1 name, 2 precompiled_charsmap, 3 add_dummy_prefix,
# 4 remove_extra_whitespaces}
_NORMAL = 1
_TRAINER_IDS = {40: "unknown", 41: "bos", 42: "eos", 43: "padding"}
_DEFAULT_IDS = {"unknown": 0, "bos": 1, "eos": 2, "padding": -1}


def _varint(buf: bytes, pos: int, label: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise FormatError("a truncated or overlong protobuf varint", file=label)
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def _fields(buf: bytes, label: str) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of one message: ints for varints, bytes for
    length-delimited fields, raw bytes for fixed 32/64-bit ones."""
    out = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos, label)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos, label)
        elif wire == 2:
            n, pos = _varint(buf, pos, label)
            if n > len(buf) - pos:
                raise FormatError(f"a protobuf field of {n} bytes runs past its message", file=label)
            value, pos = buf[pos:pos + n], pos + n
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if width > len(buf) - pos:
                raise FormatError("a truncated protobuf field", file=label)
            value, pos = buf[pos:pos + width], pos + width
        else:
            raise FormatError(f"protobuf wire type {wire} is not a SentencePiece model's", file=label)
        out.append((number, wire, value))
    return out


def read_model(path: Path) -> tuple[list[str], list[float], list[int], dict[str, int], bool, list[str]]:
    """Pieces, scores, types, the trainer's special ids, whether a space is prefixed, and what the model's
    normalizer does that llama.cpp does not (a character map, collapsing runs of spaces)."""
    from ..bounded_json import read_capped

    label = str(path)
    buf = read_capped(path, MAX_MODEL_BYTES, "SentencePiece model")
    pieces: list[str] = []
    scores: list[float] = []
    types: list[int] = []
    ids = dict(_DEFAULT_IDS)
    space_prefix = True
    charsmap, collapses = False, True  # proto2 defaults: no map, remove_extra_whitespaces true
    for number, wire, value in _fields(buf, label):
        if number == 1 and wire == 2:
            text, score, kind = "", 0.0, _NORMAL
            for n, w, v in _fields(value, label):
                if n == 1 and w == 2:
                    text = v.decode("utf-8", "surrogateescape")
                elif n == 2 and w == 5:
                    score = struct.unpack("<f", v)[0]
                elif n == 3 and w == 0:
                    kind = v
            pieces.append(text)
            scores.append(score)
            types.append(kind)
        elif number == 2 and wire == 2:
            for n, w, v in _fields(value, label):
                if n in _TRAINER_IDS and w == 0:
                    ids[_TRAINER_IDS[n]] = v - (1 << 64) if v >= 1 << 63 else v  # int32 -1 is a 10-byte varint
        elif number == 3 and wire == 2:
            for n, w, v in _fields(value, label):
                if n == 3 and w == 0:
                    space_prefix = bool(v)
                elif n == 2 and w == 2:
                    charsmap = len(v) > 0
                elif n == 4 and w == 0:
                    collapses = bool(v)
    if not pieces:
        raise FormatError("not a SentencePiece model: it has no pieces", file=label)
    lost = [what for what, has in (("its normalization table (e.g. NFKC)", charsmap),
                                   ("its collapsing of repeated spaces", collapses)) if has]
    return pieces, scores, types, ids, space_prefix, lost


def _json(path: Path) -> dict[str, Any]:
    """A companion file (config.json, tokenizer_config.json): {} when absent or unreadable. Read
    bounded (size, nesting; json.loads raised RecursionError on deep nesting) and never from a FIFO."""
    from ..bounded_json import read_json_object

    if not path.is_file():
        return {}
    try:
        return read_json_object(path, MAX_MODEL_BYTES, path.name)
    except FormatError:
        return {}


def tokenizer_key_values(path: Path) -> tuple[dict[str, str], list[str]]:
    """A recipe's `target.tokenizer` as `tokenizer.ggml.*` key/values, and the notes a plan shows: a
    `.json` file is a byte-level BPE tokenizer.json (`bpe.py`), anything else a SentencePiece model."""
    if path.suffix == ".json":
        from .bpe import bpe_metadata

        return bpe_metadata(path)
    return sentencepiece_metadata(path)


def tokenizer_metadata(model: Path) -> dict[str, str]:
    """The `tokenizer.ggml.*` key/values of a SentencePiece model (as Values: typed, and str for display)."""
    return sentencepiece_metadata(model)[0]


def sentencepiece_metadata(model: Path) -> tuple[dict[str, str], list[str]]:
    """`tokenizer_metadata`, and a note when the model normalizes text in a way llama.cpp does not (llama.cpp
    applies no normalizer; its converter drops it too)."""
    pieces, scores, types, ids, space_prefix, lost = read_model(model)
    folder = model.parent
    config, tok_config = _json(folder / "config.json"), _json(folder / "tokenizer_config.json")
    rows = config.get("vocab_size")
    if isinstance(rows, int) and not isinstance(rows, bool) and len(pieces) > rows:
        # llama.cpp takes its vocabulary size from the tokens: more pieces than embedding rows is a
        # model it refuses to load (the BPE reader refuses the same)
        raise FormatError(f"the tokenizer has {len(pieces)} pieces, more than the model's vocab_size of {rows}",
                          file=str(model))
    notes = [f"{model.name}: llama.cpp does not apply {' or '.join(lost)}; it tokenizes some text (e.g. "
             "full-width letters, runs of spaces) otherwise than this SentencePiece model"] if lost else []
    for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("padding", "pad_token_id")):
        if isinstance(config.get(key), int):
            ids[name] = config[key]
    import numpy as np

    out: dict[str, str] = {
        "tokenizer.ggml.model": Value(ValueType.STRING, "llama"),
        "tokenizer.ggml.pre": Value(ValueType.STRING, "default"),
        "tokenizer.ggml.tokens": Value(ValueType.ARRAY, pieces, ValueType.STRING),
        "tokenizer.ggml.scores": Value(ValueType.ARRAY, np.array(scores, dtype=np.float32), ValueType.FLOAT32),
        "tokenizer.ggml.token_type": Value(ValueType.ARRAY, np.array(types, dtype=np.int32), ValueType.INT32),
    }
    for name in ("bos", "eos", "unknown", "padding"):
        if 0 <= ids[name] < len(pieces):
            out[f"tokenizer.ggml.{name}_token_id"] = Value(ValueType.UINT32, ids[name])
    for flag, default in (("add_bos_token", True), ("add_eos_token", False)):
        value = tok_config.get(flag, default)
        out[f"tokenizer.ggml.{flag}"] = Value(ValueType.BOOL, bool(value))
    out["tokenizer.ggml.add_space_prefix"] = Value(ValueType.BOOL, space_prefix)
    check_utf8(out, str(model))
    return out, notes
