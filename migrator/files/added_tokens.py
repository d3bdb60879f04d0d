"""New tokens added to a Hugging Face fast tokenizer's files, as transformers writes them after
`tokenizer.add_tokens([...])` and `save_pretrained`: each token appended to tokenizer.json's
`added_tokens` with the next id (not special, normalized, no stripping: `AddedToken`'s defaults for a
normal token), and, when tokenizer_config.json lists `added_tokens_decoder` (transformers 4 writes it),
there too. The JSON is edited here (the `tokenizers` library is not a runtime dependency); every other
key is kept as it was.

A tokens file is a JSON list of strings when its first non-blank character is `[` (a token that starts
or ends with a space, or holds a newline, needs it), else one token per line, as written (only the line
ending is removed; blank lines are skipped).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.errors import FormatError, PlanError
from .model_config import MAX_CONFIG_BYTES

MAX_TOKENIZER_BYTES = 256 << 20
"""A tokenizer.json of a 256k vocabulary with its merges is tens of MiB; far beyond that is not one."""


def read_tokens(path: Path) -> list[str]:
    """The tokens a file lists (see the module's docstring); PlanError naming the file."""
    from ..core.bytesource import read_regular

    try:
        raw = read_regular(path, MAX_CONFIG_BYTES)
        if len(raw) > MAX_CONFIG_BYTES:
            # read_regular reads one byte past the limit so that a longer file is seen, not cut: a
            # cut list would add its last token half-written.
            raise PlanError(f"add_tokens: {path} is over {MAX_CONFIG_BYTES} bytes; a list of new tokens is far smaller")
        text = raw.decode("utf-8")
    except OSError as e:
        raise PlanError(f"add_tokens: cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise PlanError(f"add_tokens: {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if text.lstrip().startswith("["):
        try:
            tokens = json.loads(text)
        except ValueError as e:
            raise PlanError(f"add_tokens: {path} starts like a JSON list but is not one ({e})") from None
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise PlanError(f"add_tokens: {path} is a JSON value but not a list of strings")
        return tokens
    return [line for line in text.splitlines() if line.strip()]


def check_tokens(tokens: Sequence[str], where: str) -> None:
    if not tokens:
        raise PlanError(f"add_tokens: {where} lists no token")
    seen: set[str] = set()
    for t in tokens:
        if t == "":
            raise PlanError(f"add_tokens: {where} lists an empty token")
        if t in seen:
            raise PlanError(f"add_tokens: {where} lists {t!r} twice")
        seen.add(t)


def _load(path: Path) -> dict[str, Any]:
    """A tokenizer file's JSON object, read by the one bounded reader of small untrusted JSON files
    (size, nesting and cost checked before and while parsing)."""
    from ..formats.bounded_json import read_json_object

    try:
        return read_json_object(path, MAX_TOKENIZER_BYTES, path.name)
    except FormatError as e:
        raise PlanError(f"add_tokens: {e}") from None


def _vocabulary(data: dict[str, Any], path: Path) -> dict[str, int]:
    """Every token of the tokenizer and its id: the model's vocabulary and the added tokens."""
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    out: dict[str, int] = {}
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel
        out.update({k: v for k, v in vocab.items() if isinstance(v, int)})
    elif isinstance(vocab, list):  # Unigram: [piece, score] by id
        out.update({p[0]: i for i, p in enumerate(vocab) if isinstance(p, list) and p and isinstance(p[0], str)})
    else:
        raise PlanError(f"add_tokens: {path} has no model vocabulary (model.vocab) to add tokens to")
    added = data.get("added_tokens", [])
    if not isinstance(added, list):
        raise PlanError(f"add_tokens: {path}'s added_tokens is not a list")
    for a in added:
        if isinstance(a, dict) and isinstance(a.get("content"), str) and isinstance(a.get("id"), int):
            out[a["content"]] = a["id"]
    return out


def with_added_tokens(folder: Path, tokens: Sequence[str]) -> tuple[list[tuple[str, bytes]], int]:
    """tokenizer.json (and tokenizer_config.json when it lists added_tokens_decoder) of `folder` with
    `tokens` added, as (name, bytes) files, and the first new id. PlanError, naming the token and its
    id, when one is a token already."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise PlanError(f"add_tokens edits a fast tokenizer's tokenizer.json, and {folder} has none")
    data = _load(path)
    vocab = _vocabulary(data, path)
    for t in tokens:
        if t in vocab:
            raise PlanError(f"add_tokens: {t!r} is already token {vocab[t]} of {path}; nothing written")
    first = max(vocab.values(), default=-1) + 1
    entries = [{"id": first + k, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": True, "special": False} for k, t in enumerate(tokens)]
    data["added_tokens"] = [*data.get("added_tokens", []), *entries]
    files = [("tokenizer.json", (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode())]
    config_path = folder / "tokenizer_config.json"
    if config_path.is_file():
        config = _load(config_path)
        decoder = config.get("added_tokens_decoder")
        if isinstance(decoder, dict):
            for e in entries:
                decoder[str(e["id"])] = {k: e[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                            "single_word", "special")}
            files.append(("tokenizer_config.json", (json.dumps(config, indent=2, ensure_ascii=False)
                                                    + "\n").encode()))
    return files, first
