"""Single-threaded speed of migrator's Q8_0 quantize and Q4_K dequantize against gguf-py's, on a
64 MiB F32 tensor (best of 5; gguf-py best of 3). MB/s of F32 bytes (input to quantize, output of
dequantize). Run with OMP_NUM_THREADS=1; docs/gguf.md has the figures.

gguf-py cannot quantize the K-quants: with llama-cpp-python on PYTHONPATH (`make test-llamacpp`
builds it) migrator's Q2_K..Q6_K quantizers (one thread: the split over CPUs is switched off) are
timed against ggml's own reference quantizers, called through ctypes, on 16 MiB (best of 3).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD:.venv/llamacpp-0.3.36 .venv/bin/python tools/bench_gguf_quants.py
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

from migrator.core import native
from migrator.formats.gguf import quants
from migrator.formats.gguf.constants import BY_NAME

VALUES = 16 << 20  # 64 MiB of float32


def best(fn: Callable[[], object], reps: int) -> float:
    b = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        b = min(b, time.perf_counter() - t)
    return VALUES * 4 / b / 1e6


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(VALUES).astype(np.float32)
    blocks = rng.integers(0, 256, (VALUES // 256, 144), dtype=np.uint8)
    blocks[:, :4] = rng.standard_normal((VALUES // 256, 2)).astype(np.float16).view(np.uint8)  # finite scales
    raw = blocks.tobytes()
    q8, q4k = BY_NAME["Q8_0"], BY_NAME["Q4_K"]
    gq = gguf.GGMLQuantizationType
    rows = {
        "Q8_0 quantize": (lambda: quants.quantize(x, q8), lambda: gguf.quants.quantize(x.reshape(-1, 4096), gq.Q8_0)),
        "Q4_K dequantize": (lambda: quants.dequantize(raw, q4k),
                            lambda: gguf.quants.dequantize(blocks.reshape(-1, 16 * 144), gq.Q4_K)),
    }
    compiled = quants._kernels() is not None
    for label, (ours, theirs) in rows.items():
        fast = best(ours, 5)
        saved, native.kernels = native.kernels, None
        try:
            plain = best(ours, 3)
        finally:
            native.kernels = saved
        ref = best(theirs, 3)
        print(f"{label:16s} migrator {fast:6.0f} MB/s ({'compiled' if compiled else 'numpy'}; numpy alone "
              f"{plain:.0f})   gguf-py {ref:6.0f} MB/s   x{fast / ref:.1f}")
    k_quants()


def k_quants() -> None:
    try:
        import llama_cpp
    except ImportError:
        print("K-quants: llama_cpp is not importable (make test-llamacpp builds it); skipped")
        return
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    x = (np.random.default_rng(1).standard_normal(VALUES // 4) * 0.02).astype(np.float32)
    quants.SPLIT_VALUES = 1 << 62  # one thread, as ggml's reference
    for name in quants.K_QUANTIZED:
        t = BY_NAME[name]
        fn = getattr(lib, f"quantize_row_{name[0].lower()}{name[1]}_K_ref")
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
        out = np.empty(x.size // 256 * t.type_size, np.uint8)
        ours = best(lambda t=t, out=out: quants.quantize(x, t, out), 3) / 4
        ref = best(lambda fn=fn, out=out: fn(x.ctypes.data, out.ctypes.data, x.size), 3) / 4
        print(f"{name} quantize    migrator {ours:6.0f} MB/s (compiled, 1 thread)   ggml reference {ref:6.0f} MB/s   "
              f"x{ours / ref:.2f}")


if __name__ == "__main__":
    main()
