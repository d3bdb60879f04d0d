"""A recipe's `add_tokens`: the vocabulary grown in the tokenizer files and in the tensors.

The tokens are checked against the tokenizer in the companions' folder (the source's, or
`target.copy_from`): none may be a token already, and the embedding must have one row per token the
tokenizer has (the new ids are the new rows, as `resize_token_embeddings(len(tokenizer))` makes them
after `add_tokens`; a padded embedding would put them on rows that exist). The rows are `add_rows`
entries appended to the recipe's ops (the embedding's, and the head's when it is stored: a tied head
follows its embedding), so they stream, show in the plan and take a training checkpoint's moments
like any op; config.json's vocab_size follows from the rows (`plan.config_edits`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import PlanError
from ..core.tensor import LazyTensor
from .config_edits import EMBEDDING, HEAD

EMBEDDING_FROM = r"(?:.*\.)?(?:embed_tokens|wte|word_embeddings|tok_embeddings|embed_in)\.weight"
HEAD_FROM = r"(?:.*\.)?(?:lm_head|embed_out)\.weight"


@dataclass
class Growth:
    """What `add_tokens` adds: the ops giving the tensors their rows, and the tokenizer files written."""

    ops: list[Any] = field(default_factory=list)
    files: list[tuple[str, bytes]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def growth(spec: Any, base_dir: Path, folder: Path | None, tensors: list[LazyTensor], label: str) -> Growth | None:
    """The growth a recipe's `add_tokens` asks for (None without it); PlanError, in one line, when the
    tokens or the model do not allow it."""
    from ..files.added_tokens import check_tokens, read_tokens, with_added_tokens
    from ..ops.base import OPS
    from ..storage.paths import resolve_path

    if spec is None:
        return None
    if spec.file is not None:
        path = resolve_path(base_dir, spec.file)
        tokens, where = read_tokens(Path(path)), str(path)
    else:
        tokens, where = list(spec.tokens), "add_tokens.tokens"
    check_tokens(tokens, where)
    if folder is None:
        raise PlanError("add_tokens edits the tokenizer beside the source, and the source is not in a folder; set "
                        "target.copy_from to the folder holding tokenizer.json")
    files, first = with_added_tokens(folder, tokens)
    embeddings = [t for t in tensors if EMBEDDING.search(t.name) and len(t.shape) == 2]
    if not embeddings:
        raise PlanError(f"add_tokens: {label} has no input embedding (a 2-D tensor named like embed_tokens.weight, "
                        "wte.weight, word_embeddings.weight, tok_embeddings.weight or embed_in.weight)")
    for t in embeddings + [t for t in tensors if HEAD.search(t.name) and len(t.shape) == 2]:
        if t.shape[0] != first:
            raise PlanError(f"add_tokens: '{t.name}' has {t.shape[0]} rows but the tokenizer in {folder} has {first} "
                            f"tokens: the new tokens' ids ({first}, ...) would not be its new rows")
    n = len(tokens)
    add = OPS["add_rows"].entry
    ops = [add.model_validate({"add_rows": {"from": pattern, "dim": 0, "count": n, "fill": spec.fill,
                                            "optional": optional}})
           for pattern, optional in ((EMBEDDING_FROM, False), (HEAD_FROM, True))]
    note = (f"add_tokens: {n} token{'s' if n != 1 else ''} added as ids {first}..{first + n - 1} "
            f"({', '.join(repr(t) for t in tokens[:5])}{', ...' if n > 5 else ''}); the embedding's and head's new "
            f"rows: {spec.fill}")
    return Growth(ops, files, [note])
