"""A model folder whose `config.json` declares a quantization scheme, read stored or dequantized.

`quantized_source(reader, path, dequantize=)` looks for the config beside the weights (a model folder,
its index or a glob of its shards, or its single `model.safetensors`); when it declares a scheme
(`formats.quantized.scheme_of`), the scheme checks the stored tensors against the declaration from
their headers, and the source is read one of two ways:

- `dequantize=None`: the stored tensors as they are (F8 codes and their scales), with a note saying so;
- `dequantize=DTYPE` (convert's `--dtype`, a recipe's `dtype: {cast: ...}`): each quantized weight is
  one lazy tensor of DTYPE under its logical name, computed a band of rows at a time when written (peak
  memory: a few bands and the weight's scales, never a shard); the scales and other parts it consumes
  leave the source (the notes and `inspect` say which), and a config.json copied into a folder target
  is written without `quantization_config`, saying DTYPE.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.dtypes import DType
from ..core.errors import TensorBytesSizeMismatchError
from ..core.tensor import LazyTensor
from ..formats.base import Reader

if TYPE_CHECKING:
    import numpy as np

    from ..formats.quantized import QuantizedWeight, Scheme
    from ..storage.remote.options import StorageOptions

BAND_BYTES = 4 << 20
"""Output bytes of one band (about): a few of these are alive at once whatever the tensor's size."""
MAX_NAMED = 5
CONFIG_DTYPE_KEYS = ("dtype", "torch_dtype")


def declared_config(reader: Reader, path: str | os.PathLike[str] | None) -> Path | None:
    """The config.json that declares how `reader`'s tensors are stored: the model folder's (a folder,
    index or glob read as shards), or the one beside a single `model.safetensors`; None elsewhere.
    On an object store, the URL of where it would be (`model_config.remote_config` reads it)."""
    from ..storage.remote import as_path, is_url, url_of

    folder = reader.folder
    if folder is None and path is not None:
        from .sharded import SAFETENSORS_SINGLE

        if is_url(path):
            url = url_of(path)
            if url.rpartition("/")[2] in SAFETENSORS_SINGLE:
                folder = as_path(url.rpartition("/")[0])
        else:
            p = Path(os.fspath(path))
            if p.name in SAFETENSORS_SINGLE:
                folder = p.parent
    if folder is None:
        return None
    if is_url(folder):  # the schemes are safetensors layouts: no lookup on a store for other formats
        from ..formats.registry import is_format

        holds = is_format(reader.format, quantized_layouts=True)
        return as_path(url_of(folder).rstrip("/") + "/config.json") if holds else None
    config = Path(folder) / "config.json"
    return config if config.is_file() else None


def quantized_source(reader: Reader, path: str | os.PathLike[str] | None, *,
                     dequantize: DType | str | None = None, storage: StorageOptions | None = None) -> Reader:
    """`reader`, or a `QuantizedReader` over it when its model's config declares a scheme (see the
    module docstring); `dequantize`: a float dtype (or its name); `storage`: the options an object
    store's config.json is read with. On an error `reader` is closed."""
    if isinstance(dequantize, str):
        from ..core import dtypes

        dequantize = dtypes.parse(dequantize)
    if dequantize is not None:
        from ..core.casts import CASTABLE
        from ..core.errors import UnsupportedDTypeError

        if dequantize.name not in CASTABLE:
            reader.close()
            raise UnsupportedDTypeError(f"cannot dequantize to {dequantize.display}: F64, F32, F16 or BF16 expected")
    try:
        config_path = declared_config(reader, path)
        if config_path is None:
            return reader
        from ..storage.remote import is_url
        from .model_config import ConfigError, load_config

        if is_url(config_path):
            from .model_config import remote_config

            remote = remote_config(config_path, storage)
            if remote is None:
                return reader
            config = remote
        else:
            try:
                config = load_config(config_path)
            except ConfigError:
                return reader  # an unreadable config declares nothing; a plan that needs it says so itself
        from ..formats.quantized import scheme_of

        scheme = scheme_of(config, shown(config_path))
        if scheme is None:
            return reader
        return QuantizedReader(reader, scheme, config_path, config, dequantize)
    except BaseException:
        reader.close()
        raise


class QuantizedReader(Reader):
    """`base`'s tensors, the quantized weights stored or dequantized (see the module docstring)."""

    format = "mixed"  # set per instance: the base's format

    def __init__(self, base: Reader, scheme: Scheme, config_path: Path, config: Mapping[str, Any],
                 dequantize: DType | None) -> None:
        self.base, self.scheme, self.config_path, self.dequantize = base, scheme, config_path, dequantize
        self.config_label = shown(config_path)  # a store's URL without its secrets
        by_name = {t.name: t for t in base.tensors}
        self.weights: list[QuantizedWeight] = scheme.weights(by_name)
        self.format = base.format  # type: ignore[misc]
        self.source = base.source
        self.metadata = dict(base.metadata)
        self.scalars = dict(base.scalars)
        self.folder, self.shards, self.index_path = base.folder, base.shards, base.index_path
        self.config_update = base.config_update
        self.generated = base.generated
        taken = {name: w for w in self.weights for name in w.stored()}
        for made in self.weights:  # a logical name must not be another stored tensor's (it would be written twice)
            if made.name in by_name and made.name not in taken:
                from ..formats.quantized import QuantizationError

                raise QuantizationError(f"the dequantized weight of {', '.join(made.parts.values())} would take the "
                                        "name of this stored tensor", file=by_name[made.name].origin, tensor=made.name)
        self.parts_taken = [(name, w.name) for w in self.weights for name in w.stored()
                            if name != w.parts[_first(w)]]
        self.consumed = base.consumed
        if dequantize is None:
            self.tensors = list(base.tensors)
            self.locations = base.locations
            self.notes = [*base.notes, self._stored_note()]
            return
        tensors = []
        for t in base.tensors:
            w = taken.get(t.name)
            if w is None:
                tensors.append(t)
            elif t.name == w.parts[_first(w)]:
                tensors.append(dequantized(scheme, w, by_name, dequantize))
        self.tensors = tensors
        self.consumed = [*base.consumed, *self.parts_taken]
        said = {k: config[k] for k in CONFIG_DTYPE_KEYS if isinstance(config.get(k), str)}
        written = dequantize.torch_name or dequantize.display
        self.config_update = {**(base.config_update or {}), **dict.fromkeys(said or ["torch_dtype"], written)}
        # MLX declares itself under `quantization` (mlx-lm copies it to quantization_config too)
        self.config_drop = [*base.config_drop, *dict.fromkeys(["quantization_config", scheme.config_key])]
        self.notes = [*base.notes, self._dequantized_note()]

    def _stored_note(self) -> str:
        n, k = len(self.weights), len(self.parts_taken)
        return (f"{self.config_label} declares {self.scheme.describe()}: its {n} quantized weights and the {k} tensors "
                "they consume (scales) are read as stored; a cast (--dtype BF16, F16 or F32, or dtype: {cast: ...}) "
                "dequantizes them")

    def _dequantized_note(self) -> str:
        assert self.dequantize is not None
        names = [w.name for w in self.weights]
        shown = ", ".join(names[:MAX_NAMED]) + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")
        taken = [name for name, _ in self.parts_taken]
        consumed = ", ".join(taken[:MAX_NAMED]) + (
            f" and {len(taken) - MAX_NAMED} more" if len(taken) > MAX_NAMED else "")
        return (f"{self.config_label} declares {self.scheme.describe()}: {len(names)} weights dequantized to "
                f"{self.dequantize.display} ({shown or 'none'}); {len(taken)} stored tensors consumed by them "
                f"({consumed or 'none'})")

    def summary(self) -> dict[str, Any]:
        """The scheme and the sizes `inspect` shows: the stored bytes of the quantized weights and their
        parts, and what they take dequantized (per output dtype)."""
        by_name = {t.name: t for t in self.base.tensors}
        stored = sum(by_name[n].nbytes for w in self.weights for n in w.stored())
        elements = sum(w.rows * w.columns for w in self.weights)
        return {"scheme": self.scheme.name, "description": self.scheme.describe(), "config": self.config_label,
                "weights": len(self.weights), "consumed": len(self.parts_taken), "stored_bytes": stored,
                "dequantized_bytes": {"BF16": elements * 2, "F16": elements * 2, "F32": elements * 4},
                "skipped_modules": list(self.scheme.skipped()),
                "dequantized_to": None if self.dequantize is None else self.dequantize.display}

    def extra(self) -> dict[str, Any]:
        return {**self.base.extra(), "quantization": self.summary()}

    def ggml_type(self, tensor: LazyTensor) -> str | None:
        return self.base.ggml_type(tensor)

    def describe(self, name: str) -> str:
        return self.base.describe(name)

    def file_readers(self) -> list[Reader]:
        return self.base.file_readers()

    def close(self) -> None:
        self.base.close()


def shown(path: Path) -> str:
    """A config's path as messages show it: a store's URL redacted."""
    from ..storage.remote import is_url, redact

    return redact(str(path)) if is_url(path) else str(path)


def _first(w: QuantizedWeight) -> str:
    """The role whose stored tensor's place the dequantized weight takes (the first part)."""
    return next(iter(w.parts))


def dequantized(scheme: Scheme, w: QuantizedWeight, by_name: Mapping[str, LazyTensor], to: DType) -> LazyTensor:
    """`w` as a lazy tensor of `to`, streamed a band of rows at a time."""
    parts = {role: by_name[name] for role, name in w.parts.items()}
    for role in w.banded:
        t = parts[role]
        if w.rows == 0 or t.nbytes % w.rows:
            from ..formats.quantized import QuantizationError

            raise QuantizationError(f"{t.nbytes} bytes do not split into the {w.rows} rows of '{w.name}' "
                                    f"{list(w.shape)}", file=t.origin, tensor=t.name)
    chunks = _Bands(scheme, w, parts, to)
    nbytes = to.nbytes(w.shape)
    assert nbytes is not None
    first = parts[_first(w)]
    return LazyTensor(w.name, to, w.shape, nbytes, _Gathered(chunks, nbytes), None, None, first.origin, chunks)


class _Bands:
    """The `chunks` of a dequantized weight: a fresh generator of its bands' bytes per call."""

    __slots__ = ("parts", "scheme", "to", "weight")

    def __init__(self, scheme: Scheme, weight: QuantizedWeight, parts: dict[str, LazyTensor], to: DType) -> None:
        self.scheme, self.weight, self.parts, self.to = scheme, weight, parts, to

    def __call__(self) -> Iterator[memoryview]:
        w, scheme = self.weight, self.scheme
        whole = {role: _whole(t) for role, t in self.parts.items() if role not in w.banded}
        scheme.check(w, whole)
        step = scheme.row_step(w)
        per_row = max(1, w.columns * 4)  # the float32 values of a band dominate its memory
        rows = max(step, (BAND_BYTES // per_row) // step * step)
        row_bytes = {role: self.parts[role].nbytes // w.rows for role in w.banded}
        readers = {role: _InOrder(self.parts[role]) for role in w.banded}
        import numpy as np

        from ..formats.quantized import Band

        for start in range(0, w.rows, rows):
            stop = min(w.rows, start + rows)
            arrays = dict(whole)
            for role, size in row_bytes.items():
                t = self.parts[role]
                arrays[role] = _array(readers[role].read((stop - start) * size), t).reshape(stop - start, -1)
            bits = scheme.band_bits(w, Band(start, stop, arrays), self.to)
            yield memoryview(bits.reshape(-1).view(np.uint8).data)


class _Gathered:
    """The loader of a dequantized weight: its bands gathered (a writer streams them instead)."""

    __slots__ = ("chunks", "nbytes")

    def __init__(self, chunks: _Bands, nbytes: int) -> None:
        self.chunks, self.nbytes = chunks, nbytes

    def __call__(self) -> memoryview:
        buf = bytearray(self.nbytes)
        done = 0
        for piece in self.chunks():
            buf[done:done + len(piece)] = piece
            done += len(piece)
        if done != self.nbytes:
            raise TensorBytesSizeMismatchError(f"produced {done} bytes but declares {self.nbytes}",
                                               tensor=self.chunks.weight.name)
        return memoryview(buf)


class _InOrder:
    """A stored tensor's bytes front to back, a band at a time: one pread per band when it lies in a
    file, else its own pieces (an object store's ranged reads) gathered in order, never read whole."""

    __slots__ = ("left", "pieces", "pos", "tensor")

    def __init__(self, tensor: LazyTensor) -> None:
        self.tensor, self.pos, self.left = tensor, 0, memoryview(b"")
        self.pieces: Iterator[memoryview] | None = None

    def read(self, n: int) -> memoryview:
        t = self.tensor
        if t.span is not None:
            out = _read(t, self.pos, n)
            self.pos += n
            return out
        if self.pieces is None:
            from ..core.casts import source_pieces

            self.pieces = (memoryview(p).cast("B") for p in source_pieces(t, BAND_BYTES))
        buf = bytearray(n)
        done = 0
        while done < n:
            if not self.left:
                piece = next(self.pieces, None)
                if piece is None:
                    raise TensorBytesSizeMismatchError(f"ended after {self.pos + done} of {t.nbytes} bytes",
                                                       file=t.origin, tensor=t.name)
                self.left = piece
            k = min(n - done, len(self.left))
            buf[done:done + k] = self.left[:k]
            self.left = self.left[k:]
            done += k
        self.pos += n
        return memoryview(buf)


def _read(t: LazyTensor, start: int, length: int) -> memoryview:
    """`length` bytes of a stored tensor from `start`: one pread when it lies in a file."""
    if t.span is not None:
        from ..core.streaming import read_span

        return read_span(t, start, length)
    return t.data()[start:start + length]


def _array(buf: memoryview, t: LazyTensor) -> np.ndarray:
    import numpy as np

    return np.frombuffer(buf, dtype=t.dtype.numpy())


def _whole(t: LazyTensor) -> np.ndarray:
    """A small part (scales) read whole, in its stored shape."""
    return _array(_read(t, 0, t.nbytes), t).reshape(t.shape)

