"""A byte-level BPE `tokenizer.json` (GPT-2, Llama 3, Qwen2 ...) as GGUF's `tokenizer.ggml.*`
key/values (llama.cpp's "gpt2" vocabulary), and a GGUF's back as a `tokenizer.json`.

Forward (`bpe_metadata`): the tokens in id order (the model's vocabulary spelled in the byte-level
alphabet, added tokens as their text; ids no token holds up to config.json's `vocab_size` become
`[PAD<id>]`, UNUSED, as llama.cpp's converter writes them), their types (NORMAL; an added token
CONTROL when special, USER_DEFINED when not), the merges as "a b" strings, BOS/EOS/UNK/PAD ids
(tokenizer_config.json's token texts, else config.json's ids), add_bos/add_eos (tokenizer_config.json's
flags, else what tokenizer.json's post-processor adds), the chat template, and `tokenizer.ggml.pre`.

llama.cpp does not read a tokenizer.json's pre-tokenizer: it splits text with the regex its own
table holds for the name in `tokenizer.ggml.pre`. The name is chosen here by recognising the split
regex (`PRE_TOKENIZERS`, the exact regex each family's tokenizer.json spells); a pre-tokenizer not
in the table is written as "default" with a note saying llama.cpp may split text differently
(`--metadata tokenizer.ggml.pre=NAME` sets it). llama.cpp's own converter picks the name by hashing
the tokenizer's output on a test text, which needs the tokenizer run; a regex match needs only JSON.

The file is untrusted: read whole only up to `MAX_JSON_BYTES` and parsed by `bounded_json` (the
objects it may build and its nesting bounded before and after parsing, as for SafeTensors headers),
every field type-checked, token ids bounded before the token table is allocated.

Back (`hf_tokenizer_files`): a GGUF's gpt2 vocabulary as `tokenizer.json` + `tokenizer_config.json`
that transformers' `AutoTokenizer` loads, when its `tokenizer.ggml.pre` is one of the table's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...core.errors import FormatError
from ..base import utf8_ok
from .constants import ValueType
from .header import Value, check_utf8

MAX_JSON_BYTES = 64 << 20
MAX_TOKENS = 1 << 22
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_TAIL = r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_CASED = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+{c}"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*{c}")
GPT2_NAME = "gpt-2"
# llama.cpp's pre-tokenizer name -> (the Split regex of that family's tokenizer.json, whether llama.cpp
# then ignores merges for a word that is itself a token, as the family's tokenizer.json says)
PRE_TOKENIZERS: dict[str, tuple[str, bool]] = {
    "llama-bpe": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|" + _TAIL, True),  # Llama 3
    "qwen2": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|" + _TAIL, False),
    "gpt-4o": (_CASED.replace("{c}", _CONTRACTIONS + "?") + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+", False),
    "tekken": (_CASED.replace("{c}", "") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+", True),
}
_PRE_OF_REGEX = {regex: name for name, (regex, _) in PRE_TOKENIZERS.items()}
_SPECIALS = (("bos", "bos_token", "bos_token_id"), ("eos", "eos_token", "eos_token_id"),
             ("unknown", "unk_token", "unk_token_id"), ("padding", "pad_token", "pad_token_id"))


def read_json(path: Path, what: str = "tokenizer") -> dict[str, Any]:
    """A JSON object read bounded (size, nesting); FormatError naming the file otherwise."""
    from ..bounded_json import read_json_object

    return read_json_object(path, MAX_JSON_BYTES, what)


def _optional_json(path: Path) -> dict[str, Any]:
    """A companion file (config.json, tokenizer_config.json): {} when absent or unreadable."""
    if not path.is_file():
        return {}
    try:
        return read_json(path, path.name)
    except FormatError:
        return {}


def byte_level_problem(tok: Mapping[str, Any]) -> str | None:
    """Why a parsed tokenizer.json is not a byte-level BPE this module converts, or None when it is."""
    model = tok.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else None
        return f"its model is {kind or 'not given'}, not BPE"
    if model.get("byte_fallback") or not _has_byte_level(tok.get("pre_tokenizer")):
        return "it is not byte-level BPE (a SentencePiece-style BPE needs its tokenizer.model)"
    return None


def _has_byte_level(pre: Any) -> bool:
    if not isinstance(pre, dict):
        return False
    if pre.get("type") == "ByteLevel":
        return True
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    return isinstance(steps, list) and any(isinstance(s, dict) and s.get("type") == "ByteLevel" for s in steps)


def pre_tokenizer_name(pre: Any) -> str | None:
    """llama.cpp's name for a tokenizer.json pre-tokenizer, when it is one the table knows."""
    if not isinstance(pre, dict):
        return None
    if pre.get("type") == "ByteLevel":
        return GPT2_NAME if pre.get("use_regex", True) and not pre.get("add_prefix_space") else None
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not isinstance(steps, list) or len(steps) != 2 or not all(isinstance(s, dict) for s in steps):
        return None
    split, byte_level = steps
    pattern = split.get("pattern")
    if (split.get("type") != "Split" or not isinstance(pattern, dict) or split.get("invert")
            or str(split.get("behavior", "")).lower() != "isolated" or byte_level.get("type") != "ByteLevel"
            or byte_level.get("use_regex", True) or byte_level.get("add_prefix_space")):
        return None
    return _PRE_OF_REGEX.get(pattern.get("Regex"))  # type: ignore[arg-type]


def _token_text(value: Any) -> str | None:
    """A tokenizer_config.json special token: a string or an AddedToken dict's content."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def bpe_metadata(path: Path, vocab_size: int | None = None) -> tuple[dict[str, str], list[str]]:
    """The `tokenizer.ggml.*` key/values of a byte-level BPE tokenizer.json (typed Values) and the notes
    a plan shows (a pre-tokenizer or normalizer llama.cpp does not reproduce). `vocab_size`: the rows of
    the embedding (config.json's, beside the file, when not given)."""
    label = str(path)
    tok = read_json(path)
    problem = byte_level_problem(tok)
    if problem:
        raise FormatError(f"not converted to GGUF: {problem}", file=label)
    folder = path.parent
    config, tok_config = _optional_json(folder / "config.json"), _optional_json(folder / "tokenizer_config.json")
    if vocab_size is None and isinstance(config.get("vocab_size"), int):
        vocab_size = config["vocab_size"]
    model = tok["model"]
    vocab, added = model.get("vocab"), tok.get("added_tokens") or []
    if not isinstance(vocab, dict) or not isinstance(added, list):
        raise FormatError("tokenizer.json's model.vocab is not a mapping (or added_tokens not a list)", file=label)
    by_id: dict[int, tuple[str, int]] = {}
    for text, i in vocab.items():
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < MAX_TOKENS:
            raise FormatError(f"token {text!a} has id {i!a}; ids are integers below {MAX_TOKENS}", file=label)
        by_id[i] = (text, NORMAL)
    for entry in added:
        i, text = (entry.get("id"), entry.get("content")) if isinstance(entry, dict) else (None, None)
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < MAX_TOKENS or not isinstance(text, str):
            raise FormatError(f"an added token without a valid id and content: {str(entry)[:80]!a}", file=label)
        by_id[i] = (text, CONTROL if entry.get("special") else USER_DEFINED)
    if not by_id:
        raise FormatError("tokenizer.json has no tokens", file=label)
    count = max(by_id) + 1
    if vocab_size is not None:
        if vocab_size < count:
            raise FormatError(f"the tokenizer has ids up to {count - 1}, past the model's vocab_size of {vocab_size}",
                              file=label)
        count = vocab_size
    tokens = [by_id.get(i, (f"[PAD{i}]", UNUSED)) for i in range(count)]
    merges = _merges(model.get("merges") or [], label)
    ids = {text: i for i, (text, _) in enumerate(tokens)}
    notes: list[str] = []
    pre = pre_tokenizer_name(tok.get("pre_tokenizer"))
    if pre is None:
        notes.append(f"{path.name}: its pre-tokenizer is not one migrator recognises (llama-bpe, qwen2, gpt-2, gpt-4o, "
                     "tekken); tokenizer.ggml.pre is written 'default', so llama.cpp may split text differently from "
                     "the original (set the right name with --metadata tokenizer.ggml.pre=NAME)")
    elif pre in PRE_TOKENIZERS and bool(model.get("ignore_merges")) != PRE_TOKENIZERS[pre][1]:
        notes.append(f"{path.name}: ignore_merges is {bool(model.get('ignore_merges'))} where llama.cpp's '{pre}' "
                     f"uses {PRE_TOKENIZERS[pre][1]}; a few words may be split differently")
    if tok.get("normalizer"):
        kind = tok["normalizer"].get("type") if isinstance(tok["normalizer"], dict) else None
        notes.append(f"{path.name}: llama.cpp does not apply its normalizer ({kind}); text that it changes is "
                     "tokenized differently")
    special = _special_ids(tok_config, config, ids)
    add = _added_by_post_processor(tok.get("post_processor"))
    for flag in ("bos", "eos"):
        given = tok_config.get(f"add_{flag}_token")
        if isinstance(given, bool):
            add[flag] = given

    out: dict[str, str] = {
        "tokenizer.ggml.model": Value(ValueType.STRING, "gpt2"),
        "tokenizer.ggml.pre": Value(ValueType.STRING, pre or "default"),
        "tokenizer.ggml.tokens": Value(ValueType.ARRAY, [t for t, _ in tokens], ValueType.STRING),
        "tokenizer.ggml.token_type": Value(ValueType.ARRAY, np.array([k for _, k in tokens], dtype=np.int32),
                                           ValueType.INT32),
        "tokenizer.ggml.merges": Value(ValueType.ARRAY, merges, ValueType.STRING),
    }
    for name, i in special.items():
        out[f"tokenizer.ggml.{name}_token_id"] = Value(ValueType.UINT32, i)
    for flag in ("bos", "eos"):
        out[f"tokenizer.ggml.add_{flag}_token"] = Value(ValueType.BOOL, add[flag])
    template = tok_config.get("chat_template")
    if isinstance(template, str):
        out["tokenizer.chat_template"] = Value(ValueType.STRING, template)
    check_utf8(out, label)  # a JSON \\ud800 escape decodes to a lone surrogate
    return out, notes


def _merges(merges: Any, label: str) -> list[str]:
    """tokenizer.json's merges ("a b" strings, or [a, b] pairs since tokenizers 0.20) as GGUF's strings."""
    if not isinstance(merges, list):
        raise FormatError("tokenizer.json's model.merges is not a list", file=label)
    out = []
    for m in merges:
        if isinstance(m, str) and m.count(" ") == 1:
            out.append(m)
        elif (isinstance(m, list) and len(m) == 2 and all(isinstance(p, str) and p and " " not in p for p in m)):
            out.append(f"{m[0]} {m[1]}")
        else:
            raise FormatError(f"merge {str(m)[:80]!a} is not two tokens GGUF can hold (a space-separated pair)",
                              file=label)
    return out


def _special_ids(tok_config: Mapping[str, Any], config: Mapping[str, Any], ids: Mapping[str, int]) -> dict[str, int]:
    """BOS/EOS/UNK/PAD ids: tokenizer_config.json's token texts, else config.json's integer ids."""
    out: dict[str, int] = {}
    for name, text_key, id_key in _SPECIALS:
        text = _token_text(tok_config.get(text_key))
        if text is not None and text in ids:
            out[name] = ids[text]
        elif isinstance(config.get(id_key), int) and 0 <= config[id_key] < len(ids):
            out[name] = config[id_key]
    return out


def _added_by_post_processor(post: Any) -> dict[str, bool]:
    """Whether tokenizer.json's post-processor puts a special token before / after a single text."""
    add = {"bos": False, "eos": False}
    steps = post.get("processors") if isinstance(post, dict) and post.get("type") == "Sequence" else [post]
    for step in steps if isinstance(steps, list) else []:
        single = step.get("single") if isinstance(step, dict) and step.get("type") == "TemplateProcessing" else None
        if isinstance(single, list) and single:
            add["bos"] = isinstance(single[0], dict) and "SpecialToken" in single[0]
            add["eos"] = len(single) > 1 and isinstance(single[-1], dict) and "SpecialToken" in single[-1]
    return add


# -- back: a GGUF's gpt2 vocabulary as a tokenizer.json ------------------------------------------


def _data(meta: Mapping[str, str], key: str) -> Any:
    v = meta.get(key)
    return getattr(v, "data", v)


def _id(value: Any) -> int | None:
    """A special token id, when the GGUF gives an integer (anything else is no id)."""
    return int(value) if isinstance(value, int | np.integer) and not isinstance(value, bool) else None


def _strings(meta: Mapping[str, str], key: str) -> list[str] | None:
    v = meta.get(key)
    if getattr(v, "type", None) is not ValueType.ARRAY or getattr(v, "item_type", None) is not ValueType.STRING:
        return None
    return list(v.data)  # type: ignore[union-attr]


def _vocabulary_problem(meta: Mapping[str, str]) -> str | None:
    """What in the GGUF's tokenizer key/values a tokenizer.json cannot be written from: each typed as
    llama.cpp reads it (token texts and merges arrays of UTF-8 strings, "a b" pairs; token types an
    integer array of llama.cpp's types); None when they can. A file is untrusted: a STRING where an
    array belongs would otherwise be split into characters, a number array into nonsense tokens."""
    tokens = _strings(meta, "tokenizer.ggml.tokens")
    if tokens is None:
        return "tokenizer.ggml.tokens is not an array of strings"
    if not all(map(utf8_ok, tokens)):
        return "tokenizer.ggml.tokens holds text that is not UTF-8"
    if meta.get("tokenizer.ggml.token_type") is not None:
        types = _data(meta, "tokenizer.ggml.token_type")
        if not (isinstance(types, np.ndarray) and types.dtype.kind in "iu"
                and all(NORMAL <= int(t) <= BYTE for t in types)):
            return f"tokenizer.ggml.token_type is not an array of token types {NORMAL}-{BYTE}"
    if meta.get("tokenizer.ggml.merges") is not None:
        merges = _strings(meta, "tokenizer.ggml.merges")
        if merges is None or not all(utf8_ok(m) and m.count(" ") == 1 and " " not in (m[0], m[-1]) for m in merges):
            return "tokenizer.ggml.merges is not an array of 'a b' pairs"
    return None


def hf_tokenizer_files(meta: Mapping[str, str]) -> tuple[dict[str, bytes], list[str]]:
    """`tokenizer.json` and `tokenizer_config.json` for a GGUF's gpt2 vocabulary, and notes (what was
    not written and why). Nothing for other vocabularies."""
    if _data(meta, "tokenizer.ggml.model") != "gpt2":
        return {}, []
    pre = _data(meta, "tokenizer.ggml.pre")
    if pre != GPT2_NAME and pre not in PRE_TOKENIZERS:
        return {}, [f"no tokenizer.json written: the GGUF's pre-tokenizer '{pre}' is not one migrator can spell as a "
                    f"tokenizer.json (llama-bpe, qwen2, gpt-2, gpt-4o, tekken)"]
    problem = _vocabulary_problem(meta)
    if problem is not None:
        return {}, [f"no tokenizer.json written: the GGUF's {problem}"]
    tokens = list(_data(meta, "tokenizer.ggml.tokens") or [])
    types = [int(t) for t in (_data(meta, "tokenizer.ggml.token_type") if meta.get("tokenizer.ggml.token_type")
                              is not None else [NORMAL] * len(tokens))]
    merges = [str(m).split(" ", 1) for m in _data(meta, "tokenizer.ggml.merges") or []]
    if not tokens or len(types) != len(tokens):
        return {}, ["no tokenizer.json written: the GGUF's tokens and token types do not match"]
    vocab: dict[str, int] = {}
    added = []
    for i, (text, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind in (CONTROL, USER_DEFINED):
            added.append({"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": kind == CONTROL})
        # every token in the model's vocabulary too: with holes in its ids, tokenizers renumbers the added ones
        vocab.setdefault(text, i)
    if len(vocab) != len(tokens):
        return {}, [f"no tokenizer.json written: {len(tokens) - len(vocab)} of the GGUF's tokens repeat another's text"]
    special = {name: _id(_data(meta, f"tokenizer.ggml.{name}_token_id")) for name, _, _ in _SPECIALS}
    add = {flag: bool(_data(meta, f"tokenizer.ggml.add_{flag}_token")) for flag in ("bos", "eos")}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if pre == GPT2_NAME:
        pre_tokenizer: dict[str, Any] = byte_level
        ignore_merges = False
    else:
        regex, ignore_merges = PRE_TOKENIZERS[pre]
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
            {**byte_level, "use_regex": False}]}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": _template(add, special, tokens),
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges},
    }
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": add["bos"],
                              "add_eos_token": add["eos"], "clean_up_tokenization_spaces": False}
    for name, text_key, _ in _SPECIALS:
        given = special[name]
        if given is not None and 0 <= given < len(tokens):
            config[text_key] = tokens[given]
    template = _data(meta, "tokenizer.chat_template")
    if isinstance(template, str) and utf8_ok(template):
        config["chat_template"] = template
    files = {"tokenizer.json": json.dumps(tokenizer, ensure_ascii=False, indent=1).encode("utf-8"),
             "tokenizer_config.json": (json.dumps(config, ensure_ascii=False, indent=2) + "\n").encode("utf-8")}
    return files, []


def _template(add: Mapping[str, bool], special: Mapping[str, Any], tokens: list[str]) -> dict[str, Any] | None:
    """A TemplateProcessing post-processor adding BOS / EOS as the GGUF's flags say (None: adds nothing)."""
    ends = [(flag, int(special[flag])) for flag in ("bos", "eos")
            if add[flag] and special[flag] is not None and 0 <= int(special[flag]) < len(tokens)]
    if not ends:
        return None

    def seq(part: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = [{"Sequence": {"id": part, "type_id": 0}}]
        for flag, i in ends:
            item = {"SpecialToken": {"id": tokens[i], "type_id": 0}}
            items = [item, *items] if flag == "bos" else [*items, item]
        return items

    return {"type": "TemplateProcessing", "single": seq("A"), "pair": seq("A") + seq("B"),
            "special_tokens": {tokens[i]: {"id": tokens[i], "ids": [i], "tokens": [tokens[i]]} for _, i in ends}}
