"""A checkpoint spread over several files read as one: a model folder, an index, or a glob.

Hugging Face ships every large model as a folder of shards (`model-00001-of-00004.safetensors`, ...)
with an index (`model.safetensors.index.json`) whose `weight_map` names each tensor's shard.
`ShardedReader` lists the tensors of every shard as one logical source. Opening parses each shard's
header and closes the shard again: a tensor's bytes are read by opening its shard when they are
asked for, and only a few shards stay open (`OPEN_SHARDS`, least recently used closed first), so a
1,000-shard model never holds 1,000 descriptors.

The descriptor table and a shard tensor's `span` (a view whose `fd` opens its shard on demand, so
unchanged bytes are still copied in the kernel) are `core.reopening`'s, shared with the rank-set
readers. A loader that reads ranges of its file itself (a GGUF's quantized tensor: `over(source)`)
is given the shard as a `ReopenedBytes` source, so its reads take the same descriptors and a GGUF
writer still sees its blocks.

What holds after opening, each checked with an error naming the files: no tensor is in two shards;
with an index, every `weight_map` entry names a shard inside the folder that holds that tensor, and
every shard tensor is listed; all shards are in one format.
"""

from __future__ import annotations

import contextlib
import glob as globlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.bytesource import FileSet, FileSource, not_regular
from ..core.errors import FormatError, LimitExceededError, MigratorError, UnknownFormatError
from ..core.limits import DEFAULT_LIMITS, Limits
from ..core.reopening import OPEN_FILES, Descriptors, ReopenedBytes, ReopenedFile, ReopenedView, reopened_view
from ..core.scalars import Scalar
from ..core.tensor import Buffer, LazyTensor
from ..formats.base import Reader
from ..formats.bounded_json import load_bounded_json
from ..formats.registry import default_sharded, is_format
from ..storage.paths import hf_blobs, require_inside, resolves_inside  # noqa: F401 - hf_blobs: its old home

OPEN_SHARDS = OPEN_FILES
"""Shard descriptors kept open between reads (least recently used closed first)."""

# The weights a Hugging Face model folder may hold, by kind, in the order transformers looks.
WEIGHT_STEMS = ("model", "diffusion_pytorch_model", "adapter_model")
SAFETENSORS_SINGLE = tuple(f"{s}.safetensors" for s in WEIGHT_STEMS)
PYTORCH_SINGLE = ("pytorch_model.bin", "diffusion_pytorch_model.bin", "adapter_model.bin")
GLOB_CHARS = frozenset("*?[")
INDEX_SUFFIX = ".index.json"
SHARD_FILE_RE = re.compile(r"^(?:model|pytorch_model|diffusion_pytorch_model|adapter_model)-\d{5}-of-\d{5}"
                           r"\.(?:safetensors|bin)$")
"""A numbered shard as `save_pretrained` (and migrator) names it."""
DCP_FILE_RE = re.compile(r"^(?:\.metadata|__\d+_\d+\.distcp)$")
"""A DCP checkpoint's files, as torch's `FileSystemWriter` (and migrator) names them."""


def is_model_part(name: str) -> bool:
    """Whether a file name at the top of a folder is one a Hugging Face model's weights are made of:
    an index, the single weights file, a numbered shard, or a DCP checkpoint's `.metadata` and `.distcp` files
    (what `--overwrite` of a folder replaces)."""
    return (name.endswith((".safetensors" + INDEX_SUFFIX, ".bin" + INDEX_SUFFIX)) or name in SAFETENSORS_SINGLE
            or name in PYTORCH_SINGLE or SHARD_FILE_RE.match(name) is not None or GGUF_SPLIT.match(name) is not None
            or DCP_FILE_RE.match(name) is not None)


def model_parts(folder: Path) -> set[str]:
    """The names at `folder`'s top that belong to the model there: `is_model_part` names and the flat
    `.safetensors`/`.bin` shards its indexes name (what `--overwrite` of a folder may replace; the
    `owned` of `storage.atomic_folder`)."""
    try:
        top = os.listdir(folder)
    except OSError:
        return set()
    parts = {n for n in top if is_model_part(n)}
    for n in top:
        if n.endswith(INDEX_SUFFIX) and is_model_part(n):
            with contextlib.suppress(MigratorError, OSError):
                weight_map, _ = read_index(folder / n)
                parts |= {v for v in weight_map.values() if "/" not in v and v.endswith((".safetensors", ".bin"))}
    return parts


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".bpk", ".gguf", INDEX_SUFFIX)
"""Files that hold (or index) a model's weights: never companion files, whatever a glob matches."""


def is_weights_file(name: str) -> bool:
    """Whether a file name is a weights file or an index (by its suffix)."""
    return name.endswith(WEIGHT_SUFFIXES)


MAX_DECODES = 4
"""Percent-decodings undone before a name is judged (`%252e` is `%2e` is `.`)."""


def name_problem(rel: str, *, url: bool = False) -> str | None:
    """Why a relative name from an index or a copy entry may not be joined to its folder (None: it may).
    Judged after percent-decoding, as a server decodes `%2e%2e/` to `../`, whatever the scheme: an
    empty or absolute name, a `..` part, a scheme or a control character is refused; in a URL also
    `?` and `#`, which would change what is fetched."""
    from urllib.parse import unquote

    decoded = rel
    for _ in range(MAX_DECODES):
        step = unquote(decoded)
        if step == decoded:
            break
        decoded = step
    else:
        if unquote(decoded) != decoded:
            return "it is percent-encoded more times than any server decodes"
    shown = f" (decoded from '{rel}')" if decoded != rel else ""
    if decoded == "":
        return "it is empty"
    if decoded.startswith(("/", "\\")) or os.path.isabs(decoded):
        return "it is absolute" + shown
    if ".." in decoded.replace("\\", "/").split("/"):
        return "it climbs out with '..'" + shown
    if "://" in decoded:
        return "it names a scheme" + shown
    if any(ord(c) < 32 or ord(c) == 127 for c in decoded):
        return "it holds a control character"
    if url and ("?" in decoded or "#" in decoded):
        return "it holds '?' or '#'" + shown
    return None


# llama.cpp's split files: model-00001-of-00003.gguf (gguf-split, gguf-py's split_max_tensors/_size)
GGUF_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def is_sharded_path(path: str | os.PathLike[str]) -> bool:
    """Whether `path` names a folder, an index file, a glob or one of several split GGUF files rather
    than one weights file."""
    text = os.fspath(path)
    if os.path.isdir(text):
        return True
    if text.endswith(INDEX_SUFFIX):
        return True
    split = GGUF_SPLIT.match(os.path.basename(text))
    if split is not None and int(split["count"]) > 1 and os.path.isfile(text):
        return True
    return not os.path.exists(text) and bool(GLOB_CHARS.intersection(os.path.basename(text)))


def gguf_split_files(path: Path, limits: Limits = DEFAULT_LIMITS) -> list[Path] | None:
    """Every file of the split GGUF `path` belongs to (any one of them names the set), in order; None
    when `path` is not named like a split file."""
    m = GGUF_SPLIT.match(path.name)
    if m is None:
        return None
    count = int(m["count"])
    if count > limits.max_shards:
        raise LimitExceededError(f"{count} split files, over the {limits.max_shards} limit (max_shards)",
                                 file=str(path))
    files = [path.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise FormatError(f"split GGUF of {count} files lacks {', '.join(missing[:5])}", file=str(path))
    return files


def _check_split_place(metadata: Mapping[str, str], index: int, count: int, path: Path) -> None:
    """A split GGUF part's own split.no (0-based) and split.count must be its place in the set its
    name puts it in: a part copied or renamed into another set would otherwise be read in the wrong
    place, or a set whose files say it has more parts read without them."""
    no, total = (getattr(metadata.get(k), "data", None) for k in ("split.no", "split.count"))
    if (no is not None and no != index) or (total is not None and total != count):
        raise FormatError(f"its split.no {no} / split.count {total} disagree with its name, part {index + 1} of "
                          f"{count} (split.no {index})", file=str(path))


def folder_weights(folder: Path) -> Path:
    """The index or weights file of a model folder: SafeTensors first, then PyTorch `.bin`.

    Two candidates of one kind (say an index and `model.safetensors`) are an error: which one
    transformers would load depends on its version, so the user names it.
    """
    try:
        names = set(os.listdir(folder))
    except OSError as e:
        raise FormatError(f"cannot list the folder: {e.strerror}", file=str(folder)) from None
    return pick_weights(names, folder)


def pick_weights(names: set[str], folder: Path) -> Path:
    """`folder_weights` given the folder's file names (a local folder's, or an object-store prefix's)."""
    kinds = (
        sorted(n for n in names if n.endswith(".safetensors" + INDEX_SUFFIX)) + [n for n in SAFETENSORS_SINGLE
                                                                                  if n in names],
        sorted(n for n in names if n.endswith(".bin" + INDEX_SUFFIX)) + [n for n in PYTORCH_SINGLE if n in names],
    )
    for found in kinds:
        if len(found) > 1:
            raise FormatError(f"the folder holds several weights of one kind: {', '.join(sorted(found))}; name the one "
                              "to read (e.g. " + str(folder / found[0]) + ")", file=str(folder))
        if found:
            return folder / found[0]
    splits = sorted(n for n in names if (m := GGUF_SPLIT.match(n)) is not None and int(m["no"]) == 1)
    if len(splits) > 1:
        raise FormatError(f"the folder holds several split GGUF models: {', '.join(splits)}; name one",
                          file=str(folder))
    if splits:
        return folder / splits[0]
    looked = ", ".join(["*.safetensors.index.json", *SAFETENSORS_SINGLE, "*.bin.index.json", *PYTORCH_SINGLE,
                        "*-00001-of-*.gguf"])
    raise FormatError(f"not a model folder: none of {looked} is in it; name a weights file, an index or a glob",
                      file=str(folder))


class Reopened:
    """The loader of a shard tensor that is not a plain byte range (e.g. a strided PyTorch view):
    the shard is opened again and that tensor's bytes copied out, so nothing stays open."""

    __slots__ = ("fmt", "limits", "name", "shard")

    def __init__(self, shard: ReopenedFile, fmt: str, name: str, limits: Limits) -> None:
        self.shard, self.fmt, self.name, self.limits = shard, fmt, name, limits

    def __call__(self) -> bytes:
        with self._open() as reader:
            return bytes(reader[self.name].data())

    def pieces(self, streamed: Callable[[LazyTensor], Iterator[Buffer]]) -> Iterator[Buffer]:
        """The tensor's bytes as `streamed` hands them out of the shard opened again (closed at the end)."""
        with self._open() as reader:
            yield from streamed(reader[self.name])

    def _open(self) -> Reader:
        """The shard file alone (not `open_file`, which takes one file of a split GGUF for the whole set)."""
        from .single import reader_over

        return reader_over(FileSource(self.shard.path), self.shard.path, self.fmt, self.limits, {})


ShardSet = FileSet
"""The sharded readers' source (`core.bytesource.FileSet`), under the name its importers use."""


class ShardedReader(Reader):
    """Every shard's tensors as one source (shard order, then each shard's data order)."""

    def __init__(self, path: str | os.PathLike[str], format: str = "auto", *,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        text = os.fspath(path)
        self.limits = limits
        self.given = text
        self.index_path: Path | None = None
        weight_map: dict[str, str] | None = None
        index_meta: dict[str, Any] = {}
        if os.path.isdir(text):
            self.folder = Path(text)
            found = folder_weights(self.folder)
            if found.name.endswith(INDEX_SUFFIX):
                self.index_path = found
                weight_map, index_meta = read_index(found, limits)
                files = _index_files(found, weight_map)
            else:
                files = gguf_split_files(found, limits) or [found]
        elif text.endswith(INDEX_SUFFIX) or (os.path.isfile(text) and text.endswith(".json")):
            self.index_path = Path(text)
            self.folder = self.index_path.parent
            weight_map, index_meta = read_index(self.index_path, limits)
            files = _index_files(self.index_path, weight_map)
        elif os.path.isfile(text) and GGUF_SPLIT.match(os.path.basename(text)):  # one file of a split GGUF
            files = gguf_split_files(Path(text), limits) or []
            self.folder = Path(os.path.dirname(text) or ".")
        else:
            files = [Path(p) for p in sorted(globlib.glob(text)) if os.path.isfile(p)]
            self.folder = Path(os.path.dirname(text) or ".")
            if not files:
                raise FormatError("no file matches this glob", file=text)
        if len(files) > limits.max_shards:
            raise LimitExceededError(f"{len(files)} shards, over the {limits.max_shards} limit (max_shards)", file=text)
        if weight_map is None:  # listed or matched (an index's names were judged by `_index_files`)
            for f in files:
                require_inside(f, self.folder if os.path.isdir(text) else f.parent, text, "shard")
        self.fds = Descriptors()
        self.shards: list[ReopenedFile] = []
        self.shard_of: dict[str, int] = {}  # tensor name -> index into self.shards
        self.locations: list[tuple[int, int | None]] = []  # per tensor: shard index, offset in it
        self.tensors = []
        self.scalars: dict[str, Scalar] = {}
        self._open_shards(files, format)
        if weight_map is not None:
            assert self.index_path is not None
            _check_against_index(self.index_path, weight_map, self)
        self.metadata = {k: v if isinstance(v, str) else json.dumps(v) for k, v in index_meta.items()
                         if k != "total_size"} | self._shard_metadata
        if is_format(self.format, llama_cpp=True):  # split.no/count/tensors.count: the files read, not the model
            self.metadata = {k: v for k, v in self.metadata.items() if not k.startswith("split.")}
        self.source = ShardSet(text, sum(s.size for s in self.shards), [s.identity for s in self.shards],
                               self._modes)

    def _open_shards(self, files: Sequence[Path], fmt: str) -> None:
        from ..formats.detect import detect
        from ..formats.registry import reader_class

        formats: dict[str, Path] = {}
        stored: dict[str, str] = {}
        self._modes = 0o7777
        metas: dict[str, set[str]] = {}
        scalar_from: dict[str, Path] = {}
        for i, path in enumerate(files):
            source = FileSource(path)
            try:
                shard_fmt = detect(source, path) if fmt == "auto" else fmt
                reader = reader_class(shard_fmt)(source, limits=self.limits)  # type: ignore[call-arg]
            except UnknownFormatError as e:
                source.close()
                raise FormatError(f"shard of {self.given}: {e.detail}", file=str(path)) from None
            except BaseException:
                source.close()
                raise
            with reader:
                for t in reader.tensors:  # GGUF: each tensor's stored type, for inspect
                    if (kind := reader.ggml_type(t)) is None:
                        break
                    stored[t.name] = kind
                formats.setdefault(reader.format, path)
                if len(formats) > 1:
                    (f1, p1), (f2, p2) = list(formats.items())[:2]
                    raise FormatError(f"mixed formats in one source: {p1} is {f1}, {p2} is {f2}", file=self.given)
                shard = ReopenedFile(path, source.size, source.identity, self.fds)
                self._modes &= source.mode
                self.shards.append(shard)
                fd = source.fd
                origin = str(path)
                for t in reader.tensors:
                    other = self.shard_of.get(t.name)
                    if other is not None:
                        raise FormatError(f"tensor '{t.name}' is in two shards: {self.shards[other].path} and {path}",
                                          file=self.given)
                    self.shard_of[t.name] = i
                    span = t.span
                    rebase = getattr(t.loader, "over", None)  # a loader reading its own file ranges (GGUF's)
                    chunks = None
                    if span is not None and span.fd == fd:
                        view: ReopenedView | None = reopened_view(shard, span.offset, span.length)
                        loader: Any = view
                        self.locations.append((i, span.offset))
                    elif rebase is not None:  # the same loader over this shard (a writer may copy its blocks)
                        view, loader = None, rebase(ReopenedBytes(shard))
                        chunks = getattr(loader, "pieces", None)
                        self.locations.append((i, loader.offset))
                    else:
                        view, loader = None, Reopened(shard, reader.format, t.name, self.limits)
                        self.locations.append((i, None))
                    self.tensors.append(LazyTensor(t.name, t.dtype, t.shape, t.nbytes, loader, view, t.param_id,
                                                   origin, chunks))
                if is_format(reader.format, llama_cpp=True) and len(files) > 1:
                    _check_split_place(reader.metadata, i, len(files), path)
                for k, v in reader.metadata.items():
                    metas.setdefault(k, set()).add(v)
                for k, s in reader.scalars.items():
                    if k in self.scalars and self.scalars[k] != s:
                        raise FormatError(f"scalar '{k}' differs between shards {scalar_from[k]} and {path}",
                                          file=self.given)
                    self.scalars[k], scalar_from[k] = s, Path(path)
        self.format = next(iter(formats)) if formats else default_sharded().name  # type: ignore[misc]  # the shards' format
        self._ggml_types = stored
        # each shard's own metadata where the shards agree (e.g. `format: pt`); a key they disagree on is dropped
        self._shard_metadata = {k: next(iter(v)) for k, v in metas.items() if len(v) == 1}

    def ggml_type(self, tensor: LazyTensor) -> str | None:
        """A GGUF folder's: the type each tensor is stored as in its shard."""
        return self._ggml_types.get(tensor.name, tensor.dtype.name) if self._ggml_types else None

    def file_of(self, index: int) -> str:
        """The shard file holding the `index`-th tensor."""
        return str(self.shards[self.locations[index][0]].path)

    def extra(self) -> dict[str, Any]:
        counts = [0] * len(self.shards)
        nbytes = [0] * len(self.shards)
        for (i, _), t in zip(self.locations, self.tensors, strict=True):
            counts[i] += 1
            nbytes[i] += t.nbytes
        return {"index": None if self.index_path is None else str(self.index_path),
                "shards": [{"file": str(s.path), "file_size": s.size, "tensors": counts[i], "nbytes": nbytes[i]}
                           for i, s in enumerate(self.shards)]}

    def select(self, top_level_key: str | Sequence[str]) -> None:
        keep = {id(t): loc for t, loc in zip(self.tensors, self.locations, strict=True)}
        before = self.tensors
        super().select(top_level_key)
        prefix = (top_level_key if isinstance(top_level_key, str) else ".".join(top_level_key)) + "."
        self.locations = [keep[id(t)] for t in before if t.name.startswith(prefix)]

    def close(self) -> None:
        self.fds.close()


def read_index(path: Path, limits: Limits = DEFAULT_LIMITS) -> tuple[dict[str, str], dict[str, Any]]:
    """An index's `weight_map` (tensor -> shard file) and `metadata`, checked for shape; an index over
    `limits.max_index_bytes` is refused before it is read (a 100k-tensor index is ~10 MB), and its JSON
    is bounded as every header is (`bounded_json`). A FIFO, folder or device is refused unopened for
    reading (opened non-blocking, then fstat'ed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise FormatError(f"cannot read index: {e.strerror}", file=str(path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(f"cannot read index: {not_regular(st.st_mode)}", file=str(path))
        if st.st_size > limits.max_index_bytes:
            raise LimitExceededError(f"index is {st.st_size} bytes, over the {limits.max_index_bytes} limit "
                                     "(max_index_bytes)", file=str(path))
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(limits.max_index_bytes + 1)
    except OSError as e:
        raise FormatError(f"cannot read index: {e.strerror}", file=str(path)) from None
    finally:
        os.close(fd)
    if len(raw) > limits.max_index_bytes:  # grew since the fstat
        raise LimitExceededError(f"index is over the {limits.max_index_bytes} limit (max_index_bytes)", file=str(path))
    return index_fields(load_bounded_json(raw, limits, str(path), "index"), str(path))


def index_fields(data: Any, file: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The `weight_map` and `metadata` of a parsed index (local or remote), checked for shape."""
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in weight_map.items()):
        raise FormatError('not an index: expected a JSON object with "weight_map": {tensor name: shard file}',
                          file=file)
    meta = data.get("metadata") or {}
    if not isinstance(meta, dict):
        raise FormatError('not an index: "metadata" must be an object', file=file)
    return weight_map, meta


def _index_files(index: Path, weight_map: Mapping[str, str]) -> list[Path]:
    """The distinct shard files an index names, in name order, each checked to stay in its folder."""
    folder = index.parent
    files: list[Path] = []
    seen: set[str] = set()
    for rel in sorted(set(weight_map.values())):
        if os.path.normpath(rel) in seen:  # `./a` and `a`: one file
            continue
        seen.add(os.path.normpath(rel))
        problem = name_problem(rel)
        if problem is not None:
            raise FormatError(f"shard path '{rel}' leaves the index's folder {folder}: {problem}", file=str(index))
        path = folder / rel
        # a flat name can leave the folder only as a symlink: resolve just those, and nested names
        if ("/" in rel or os.path.islink(path)) and not resolves_inside(path, folder):
            raise FormatError(f"shard path '{rel}' leaves the index's folder {folder} (it resolves to "
                              f"{os.path.realpath(path)})", file=str(index))
        try:
            mode = os.stat(path).st_mode  # follows a link; a stat never blocks, unlike an open of a FIFO
        except OSError:
            mode = None
        if mode is None or not stat.S_ISREG(mode):
            names = sorted(k for k, v in weight_map.items() if v == rel)
            what = "is missing" if mode is None else f"is {not_regular(mode)}"
            raise FormatError(f"shard {path} named by the index {what} (it should hold "
                              f"{len(names)} tensors, e.g. '{names[0]}')", file=str(index))
        files.append(path)
    return files


def _check_against_index(index: Path, weight_map: Mapping[str, str], reader: ShardedReader) -> None:
    folder = index.parent
    shard_rel = [os.path.normpath(os.path.relpath(s.path, folder)) for s in reader.shards]
    for name, i in reader.shard_of.items():
        rel = weight_map.get(name)
        shard = reader.shards[i].path
        if rel is None:
            raise FormatError(f"shard {shard} holds tensor '{name}', which the index does not list", file=str(index))
        if rel != shard_rel[i] and os.path.normpath(rel) != shard_rel[i]:
            raise FormatError(f"the index puts tensor '{name}' in {folder / rel}, but it is in {shard}",
                              file=str(index))
    for name, rel in weight_map.items():
        if name not in reader.shard_of:
            raise FormatError(f"the index puts tensor '{name}' in {folder / rel}, which does not hold it",
                              file=str(index))
