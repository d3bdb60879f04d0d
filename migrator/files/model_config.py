"""A model folder's config (`config.json`, Meta's `params.json`): where it is, read as bounded JSON.

A recipe takes values from it (`recipe/config.py`), and a written folder's copy is rewritten to say
the dtype its tensors have (`sharded_writer.config_with_dtype`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..storage.remote.options import StorageOptions

MAX_CONFIG_BYTES = 16 * 2**20
"""A model's config.json is a few KiB; a tokenizer-sized one is still far below this."""

CONFIG_NAMES = ("config.json", "params.json")
"""Looked for, in order, beside the source when the recipe names no `config:`."""


class ConfigError(ValueError):
    """A reference that cannot be resolved, or a config that cannot be read (the message says which)."""


def find_config(named: str | None, first_source: str | os.PathLike[str] | None, base_dir: Path) -> Path | None:
    """The config file a recipe's values come from: `named` (relative to `base_dir`), else one of
    CONFIG_NAMES beside `first_source` (its folder, or the folder it is in). None when there is none;
    a URL source has no local config beside it."""
    if named is not None:
        p = Path(os.path.expanduser(named))
        return p if p.is_absolute() else base_dir / p
    folder = config_folder(first_source, base_dir)
    if folder is None:
        return None
    for name in CONFIG_NAMES:
        if (folder / name).is_file():
            return folder / name
    from ..formats.nemo.layout import CONTEXT, MODEL_YAML, nemo_folder

    nemo = nemo_folder(folder)  # NeMo 2: its model configuration (`formats.nemo.config`)
    if nemo is not None:
        return nemo / CONTEXT / MODEL_YAML
    from ..formats.torch_dist.layout import COMMON_FILE, torch_dist_folder

    megatron = torch_dist_folder(folder)  # its training arguments (`formats.megatron.args`)
    if megatron is not None and (megatron / COMMON_FILE).is_file():
        return megatron / COMMON_FILE
    return None


def config_folder(first_source: str | os.PathLike[str] | None, base_dir: Path) -> Path | None:
    """The folder a source's config is looked for in: the source itself when it is a folder, else the
    folder it is in (relative paths from `base_dir`); None for no source or a URL."""
    written = os.fspath(first_source) if first_source is not None else ""
    if not written or "://" in written:
        return None
    src = Path(os.path.expanduser(written))
    src = src if src.is_absolute() else base_dir / src
    return src if src.is_dir() or written.endswith(("/", os.sep)) else src.parent


def load_config(path: Path) -> dict[str, Any]:
    """The config as a dict; ConfigError for a missing, oversized, non-JSON or non-object file. A
    Megatron checkpoint's `common.pt` gives its training arguments (`args`)."""
    from ..core.bytesource import read_regular
    from ..formats.torch_dist.layout import COMMON_FILE

    if path.name == COMMON_FILE:
        return _megatron_args(path)
    if path.suffix in (".yaml", ".yml"):
        return _nemo_config(path)

    try:
        raw = read_regular(path, MAX_CONFIG_BYTES)  # a FIFO would block, a device never end
    except OSError as e:
        raise ConfigError(f"cannot read the config {path}: {e.strerror or e}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"the config {path} is larger than {MAX_CONFIG_BYTES // 2**20} MiB")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"the config {path} is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"the config {path} is not a JSON object")
    return data


def _megatron_args(path: Path) -> dict[str, Any]:
    """A Megatron checkpoint's training arguments, read by the restricted interpreter (no code runs)."""
    from ..core.bytesource import open_source
    from ..core.errors import MigratorError
    from ..core.limits import DEFAULT_LIMITS
    from ..formats.megatron.args import megatron_config
    from ..formats.torch_dist.common import read_common

    try:
        source = open_source(path)
    except OSError as e:
        raise ConfigError(f"cannot read the config {path}: {e.strerror or e}") from None
    try:
        args = read_common(source, DEFAULT_LIMITS).get("args")
    except MigratorError as e:
        raise ConfigError(f"the config {path} cannot be read: {e.detail}") from None
    finally:
        source.close()
    if not isinstance(args, dict):
        raise ConfigError(f"{path} holds no training arguments (args) to take values from")
    return megatron_config(args)


def _nemo_config(path: Path) -> dict[str, Any]:
    """A NeMo 2 checkpoint's model configuration (`context/model.yaml`, checked against `io.json`) in
    Megatron-LM's argument names; read as bounded data, nothing of NeMo's or fiddle's runs."""
    from ..core.errors import MigratorError
    from ..core.limits import DEFAULT_LIMITS
    from ..formats.megatron.args import megatron_config
    from ..formats.nemo.config import read_context

    if not path.is_file():
        raise ConfigError(f"the config {path} does not exist (a NeMo 2 checkpoint's io.json alone records only the "
                          "arguments given to its classes, not their defaults)")
    try:
        found = read_context(path.parent.parent, DEFAULT_LIMITS) if path.parent.name == "context" else None
    except MigratorError as e:
        raise ConfigError(f"the config {path} cannot be read: {e.detail}") from None
    if found is None:
        raise ConfigError(f"the config {path} is YAML: only a NeMo 2 checkpoint's context/model.yaml is read as one")
    return megatron_config(found[0])


def remote_config(url: Path, storage: StorageOptions | None) -> dict[str, Any] | None:
    """The JSON object at `url` on an object store; None when there is no such object, or it is not a
    JSON object of at most MAX_CONFIG_BYTES (it declares nothing, as a local one)."""
    from ..storage.remote import url_of
    from ..storage.remote.fs import StorageError
    from ..storage.remote.source import RemoteSource

    try:
        src = RemoteSource(url_of(url), storage=storage)
    except StorageError as e:
        if e.detail.endswith("no such object"):
            return None
        raise
    try:
        if src.size > MAX_CONFIG_BYTES:
            return None
        raw = src.read(0, src.size, "config")
    finally:
        src.close()
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
