"""A folder target's writer (`target.shard`): the plan's tensors as shards, beside the companion files
the run copies (config.json edited to match the tensors: `target.config`, the cast's dtype, `quantize:`'s
quantization_config), makes (a GGUF's config.json and tokenizer files: `target.hf_config`) or grows
(`add_tokens`' tokenizer files). A Trainer checkpoint folder is `trainer_target`; one file, `build`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..core.errors import PlanError

if TYPE_CHECKING:
    from ..core.scalars import Scalar
    from ..files.io import Reader, Writer
    from ..recipe.model import Recipe
    from ..storage.read_context import ReadContext
    from .entry import PlanEntry
    from .vocabulary import Growth


class Places(Protocol):
    """Where the plan reads (`build.Places`): the source, and a folder target's companions' folder."""

    @property
    def source(self) -> Path: ...

    @property
    def copy_from(self) -> Path | None: ...


class Compiling(Protocol):
    """What a folder target's writer is made from: a `build.Compilation` (not imported: build imports
    this module)."""

    @property
    def recipe(self) -> Recipe: ...

    @property
    def reader(self) -> Reader: ...

    @property
    def out_fmt(self) -> str: ...

    @property
    def places(self) -> Places: ...

    @property
    def read(self) -> ReadContext: ...

    @property
    def growth(self) -> Growth | None: ...

    @property
    def quantization(self) -> Any: ...

    def writer_options(self, meta: dict[str, str], notes: list[str], *, folder_target: bool = False
                       ) -> dict[str, Any]: ...


class Planned(Protocol):
    """The plan being built (a `build.Plan`): what the writer writes, and where it goes."""

    writer: Writer | None

    @property
    def entries(self) -> list[PlanEntry]: ...

    @property
    def scalars(self) -> dict[str, Scalar]: ...

    @property
    def metadata(self) -> dict[str, str]: ...

    @property
    def notes(self) -> list[str]: ...


def folder_writer(c: Compiling, plan: Planned) -> None:
    """`plan.writer`: a `ShardedWriter` of `plan`'s tensors into `c`'s folder target (a `Compilation`);
    its notes and those of the files it is given go to `plan.notes`."""
    from ..files.sharded_writer import FolderLayout, ShardedWriter, default_weights_name

    recipe, reader, out_fmt, notes = c.recipe, c.reader, c.out_fmt, plan.notes
    assert recipe.target.shard is not None
    tensors = [e.tensor for e in plan.entries]
    folder = reader.folder or c.places.source.parent
    if c.places.copy_from is not None:
        folder = c.places.copy_from
    name = recipe.target.shard.name or default_weights_name(out_fmt, reader.folder)
    made = made_files(recipe, reader, [t.name for t in tensors], notes)  # a GGUF's config.json
    grown_files = c.growth.files if c.growth is not None else []
    if c.growth is not None:
        notes += c.growth.notes
    from .config_edits import edited_config

    update = {**(reader.config_update or {}), **edited_config(
        recipe.target.config, folder, recipe.target.copies(), tensors,
        {e.target: (e.source or "").split(", ") for e in plan.entries}, notes)}
    options = c.writer_options(plan.metadata, notes, folder_target=True)
    made_tensors = options.pop("made_tensors", [])  # a GGUF's rope_freqs.weight
    config_update = dict(update)
    if c.quantization is not None:  # compressed-tensors' config, in the copied config.json
        from ..formats.compressed_tensors_schemes import quantization_config

        config_update["quantization_config"] = quantization_config(c.quantization.scheme, c.quantization.ignore)
    layout = FolderLayout(max_size=recipe.target.shard.max_size, weights_name=name, copies=recipe.target.copies(),
                          copy_from=folder, config_update=config_update or None, config_drop=reader.config_drop,
                          generated=[*reader.generated, *made.items(), *grown_files], storage=c.read.storage)
    plan.writer = ShardedWriter(out_fmt, tensors + made_tensors, scalars=plan.scalars, folder=layout, **options)
    if c.quantization is not None and not any(n == "config.json" for n, _ in plan.writer.generated):
        raise PlanError(f"quantize {c.quantization.scheme.name} writes its quantization_config into the "
                        f"folder's config.json, and none is copied from {folder} (copy: [config.json], or "
                        "--copy-from the model folder whose config.json goes with these weights)")
    notes += plan.writer.notes


def made_files(recipe: Recipe, reader: Reader, names: list[str], notes: list[str]) -> dict[str, bytes]:
    """Companion files a sharded target is given from the plan: a config.json made from a GGUF's key/values,
    and the tokenizer files of its vocabulary where they can be written (a tokenizer.json for byte-level BPE, a
    tokenizer.model for SentencePiece)."""
    if not recipe.target.hf_config:
        return {}
    import json

    own = reader.hf_config()  # a source whose own configuration makes one (Megatron's arguments)
    if own is not None:
        notes.append("config.json is made from the source's own configuration (target.hf_config)")
        return {"config.json": (json.dumps(own, indent=2) + "\n").encode()}

    from ..formats.gguf.bpe import hf_tokenizer_files
    from ..formats.gguf.llama import ROPE_FREQS, hf_config

    scaling = recipe.target.rope_scaling
    given = {"rope_scaling": scaling.model_dump()} if scaling is not None else None
    rope_freqs = reader[ROPE_FREQS].numpy() if ROPE_FREQS in reader else None
    config = hf_config(reader.metadata, names, rope_freqs=rope_freqs, given=given)
    made: dict[str, bytes] = {"config.json": (json.dumps(config, indent=2) + "\n").encode()}
    if getattr(reader.metadata.get("tokenizer.ggml.model"), "data", None) == "llama":  # SentencePiece
        from ..formats.gguf.spm import sentencepiece_files

        tokenizer, said = sentencepiece_files(reader.metadata)
    else:
        tokenizer, said = hf_tokenizer_files(reader.metadata)
    notes += said
    return {**made, **tokenizer}
