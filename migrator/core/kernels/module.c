/* The module Python imports as migrator.core._kernels: its table of functions (each defined in the
 * file of its job, see kernels.h) and the buffer check the casts and the GGUF blocks share. */
#include "kernels.h"

/* Get a read buffer of src and a writable buffer of dst (both or neither). The loops take their
 * pointers as `restrict` (no store can change a later load, so they vectorise), which holds only
 * for buffers that do not overlap: overlapping ones are refused. */
int acquire(PyObject *src, PyObject *dst, Py_buffer *in, Py_buffer *out)
{
    if (PyObject_GetBuffer(src, in, PyBUF_SIMPLE) < 0)
        return -1;
    if (PyObject_GetBuffer(dst, out, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(in);
        return -1;
    }
    uintptr_t a = (uintptr_t)in->buf, b = (uintptr_t)out->buf;
    if (in->len > 0 && out->len > 0 && a < b + (uintptr_t)out->len && b < a + (uintptr_t)in->len) {
        PyErr_SetString(PyExc_ValueError, "source and target buffers overlap");
        PyBuffer_Release(in);
        PyBuffer_Release(out);
        return -1;
    }
    return 0;
}

static PyMethodDef methods[] = {
    {"f32_to_f16", py_f32_to_f16, METH_VARARGS, "f32_to_f16(src, dst): float32 bits -> float16 bits (torch's rules)"},
    {"f16_to_f32", py_f16_to_f32, METH_VARARGS, "f16_to_f32(src, dst): float16 bits -> float32 bits (torch's rules)"},
    {"f32_to_bf16", py_f32_to_bf16, METH_VARARGS, "f32_to_bf16(src, dst, nan_bits): float32 -> bfloat16 bits"},
    {"transpose", py_transpose, METH_VARARGS, "transpose(src, dst, rows, cols, itemsize, first, width): columns [first, first+width) of a "
     "[rows, cols] matrix -> [width, rows]"},
    {"transpose_f32_to_f16", py_transpose_f32_to_f16, METH_VARARGS,
     "transpose_f32_to_f16(src, dst, rows, cols, first, width): columns [first, first+width) of a [rows, cols] "
     "float32 matrix -> [width, rows] float16 bits (torch's rounding and NaN rules)"},
    {"same_bytes", py_same_bytes, METH_VARARGS, "same_bytes(a, b): whether two buffers hold the same bytes"},
    {"float_stats", py_float_stats, METH_VARARGS, "float_stats(buf, kind, shift): (finite, min, max, sum(x-shift), "
     "sum((x-shift)**2), sum|x|, zeros, nans, infs) of F32/F64/F16/BF16 elements (kind 0-3)"},
    {"gguf_blocks", py_gguf_blocks, METH_VARARGS, "gguf_blocks(kind, src, dst): 'quantize Q8_0|Q2_K|Q3_K|Q4_K|Q5_K|Q6_K' or "
     "'dequantize Q8_0|Q4_0|Q4_K|Q6_K' whole ggml blocks from src into dst; False for a kind without a loop here"},
    {"has_f16c", py_has_f16c, METH_NOARGS, "whether the F16C instructions are used"},
    {"use_f16c", py_use_f16c, METH_O, "use_f16c(flag): allow the F16C loops (default) or force the portable ones"},
    /* merge kernels (issue 27) */
    {"merge_dot3", py_merge_dot3, METH_VARARGS, "merge_dot3(a, b): (a.a, b.b, a.b) of two float32 buffers, in float64"},
    {"merge_abs_hist", py_merge_abs_hist, METH_VARARGS, "merge_abs_hist(x, base, counts, sums, prefix): add the "
     "16-bit histogram of |x - base| (float32) into counts (65536 uint64) and sums (65536 + 1 float64: NaNs; "
     "None: not summed)"},
    {"merge_linear_band", py_merge_linear_band, METH_VARARGS, "merge_linear_band(inputs, weights, divide, divisor, "
     "out): one float32 band of sum_i w_i x_i (/ divisor if divide)"},
    {"merge_task_band", py_merge_task_band, METH_VARARGS, "merge_task_band(base, models, params, consensus, "
     "normalize, divisor, lambda, out): one float32 band of task arithmetic / TIES"},
    /* FP8 quantization with scales (core/fp8_quantize.py) */
    {"fp8_absmax", py_fp8_absmax, METH_VARARGS, "fp8_absmax(src, kind, rows, cols, block, out): max |x| per row "
     "(block 0) or per column block, float32 (kind 0 F32, 1 BF16)"},
    {"fp8_quantize", py_fp8_quantize, METH_VARARGS, "fp8_quantize(src, kind, rows, cols, scales, block, dst): "
     "F8_E4M3 of src / scale as compressed-tensors rounds it"},
    /* LoRA fold (transform/merging/lora.py) */
    {"lora_band", py_lora_band, METH_VARARGS, "lora_band(b, a, out, rank, mode, block, scaling): rows of scaling * (b @ a) "
     "in float32, in the order of torch's CPU matmul; mode 0: fused (fmaf chains over blocks of `block` products, "
     "the block sums added in order), 1: plain (each product and sum rounded), 2: product only (rank 1)"},
    {"lora_use_fma", py_lora_use_fma, METH_O, "lora_use_fma(flag): allow lora_band's AVX2+FMA loops (default) or "
     "force the portable ones (fmaf from the C library)"},
    /* quantized checkpoints (issue 43, core/dequant.py) */
    {"dequant_band", py_dequant_band, METH_VARARGS, "dequant_band(src, dst, kind, bits, offset, rows, row_bytes, col0, "
     "cols, row0, block_rows, block_cols, scales, scale_kind, scale_cols, zeros, biases, mid, out): a band of rows of "
     "bit-packed codes (int, E4M3, E5M2, E2M1) times block scales (+ biases) -> F32/BF16/F16 bits; -1, or the index "
     "of the first NaN/inf/zero/E8M0-255 scale"},
    {"e8m0_to_f32", py_e8m0_to_f32, METH_VARARGS, "e8m0_to_f32(src, dst): E8M0 bytes -> float32 2^(e-127); -1, or "
     "the index of the first 255"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "migrator._kernels", "Compiled cast and transpose loops (optional).", -1, methods,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
