"""GGUF test files written by gguf-py (the oracle's writer): every ggml type migrator reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.support.gguf_blocks import random_blocks  # noqa: F401  (re-exported for the GGUF tests)


def write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, str]], *, arch: str = "llama",
               kv: dict[str, Any] | None = None, alignment: int | None = None) -> Path:
    """A GGUF file by gguf-py: `tensors` maps name -> (values, ggml type). F32 values are quantized
    with gguf.quants.quantize for the types it can quantize; a uint8 array is taken as raw blocks
    of that type (its shape: rows x bytes per row)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, value in (kv or {}).items():
        if isinstance(value, tuple):
            w.add_key_value(key, value[0], value[1])
        elif isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_array(key, value)
    for name, (values, type_name) in tensors.items():
        qtype = gguf.GGMLQuantizationType[type_name]
        if values.dtype == np.uint8 or type_name in ("F32", "F16", "F64", "I8", "I16", "I32", "I64"):
            data = values
        else:
            data = gguf.quants.quantize(values, qtype)
        w.add_tensor(name, data, raw_dtype=None if type_name in ("F32", "F16", "F64", "I8", "I16", "I32", "I64")
                     else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gguf_reference(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """name -> (ggml type, values) as gguf-py reads and dequantizes them (PyTorch order)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        values = gguf.quants.dequantize(t.data, t.tensor_type) if t.tensor_type.name not in (
            "F64", "I8", "I16", "I32", "I64", "BF16") else np.asarray(t.data)
        if t.tensor_type.name == "BF16":
            values = np.asarray(t.data).view(np.uint16).astype(np.uint32) << 16
            values = values.view(np.float32)
        out[t.name] = (t.tensor_type.name, np.asarray(values).reshape(shape))
    return out


def split_with_gguf_py(src: Path, folder: Path, max_tensors: int) -> list[Path]:
    """`src` cut into split files by gguf-py's own split writer (`split_max_tensors`), every key/value and
    tensor (quantized blocks as stored) copied: the files gguf-split / convert_hf_to_gguf.py --split-max-tensors
    give. Returns them in order."""
    import gguf

    r = gguf.GGUFReader(str(src))
    folder.mkdir(parents=True, exist_ok=True)
    arch = r.fields["general.architecture"].contents()
    copy_gguf(r, gguf.GGUFWriter(str(folder / "model.gguf"), arch, split_max_tensors=max_tensors))
    return sorted(folder.glob("model-*-of-*.gguf"))


def copy_gguf(r: Any, w: Any, replaced: dict[str, tuple[Any, str, str | None]] | None = None) -> None:
    """Every key/value of gguf-py's reader `r` but the writer's own (and `replaced`'s keys, written instead as
    (value, GGUF type name, item type name)), then every tensor as stored, through gguf-py's writer `w`."""
    import gguf

    replaced = replaced or {}
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in replaced:
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), field.types[0], sub)
    for key, (value, vtype, item) in replaced.items():
        w.add_key_value(key, value, gguf.GGUFValueType[vtype], gguf.GGUFValueType[item] if item else None)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
