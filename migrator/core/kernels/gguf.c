#include "kernels.h"

/* ---- GGUF blocks (formats/gguf/quants.py) ------------------------------------------------------
 * ggml's block formats, with the float32 operations of ggml's reference code in the same order
 * (products are not fused: the build targets baseline x86-64, which has no FMA), so results are
 * bit-equal to quants.py's numpy code and to gguf-py's for every input without NaN. */

static inline float ld_f16(const byte *p) { uint32_t u = f16_to_f32_bits(ld16(p, 0)); float f; memcpy(&f, &u, 4); return f; }

static void q8_0_quantize(const byte *src, byte *dst, Py_ssize_t nblocks)
{
    for (Py_ssize_t b = 0; b < nblocks; b++) {
        float x[32], amax = 0.0f;
        memcpy(x, src + b * 128, sizeof x);
        uint32_t bits[32], top = 0; /* max |x| on the bit patterns: an integer max, which vectorises */
        memcpy(bits, x, sizeof bits);
        for (int j = 0; j < 32; j++) {
            uint32_t a = bits[j] & 0x7FFFFFFFu;
            top = a > top ? a : top;
        }
        memcpy(&amax, &top, 4);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint32_t dbits;
        memcpy(&dbits, &d, 4);
        byte *out = dst + b * 34;
        st16(out, 0, f32_to_f16_bits(dbits));
        for (int j = 0; j < 32; j++) {
            float v = x[j] * id;
            int32_t q = INT32_MIN; /* NaN, or 1/d overflowed (a block of values below ~4e-36): numpy's cast */
            if (fabsf(v) < 2147483648.0f) { /* (x86's cvttss2si) gives INT32_MIN, whose low byte is 0 */
                q = (int32_t)v; /* roundf (half away from zero, as ggml) without a libm call: truncate, */
                float r = v - (float)q; /* then the exact remainder decides */
                q += (r >= 0.5f) - (r <= -0.5f);
            }
            out[2 + j] = (byte)(uint32_t)q; /* the low byte, as numpy's float -> int8 cast keeps it */
        }
    }
}

static void q8_0_dequantize(const byte *src, byte *dst, Py_ssize_t nblocks)
{
    for (Py_ssize_t b = 0; b < nblocks; b++) {
        const byte *in = src + b * 34;
        float d = ld_f16(in), y[32];
        for (int j = 0; j < 32; j++)
            y[j] = (float)(int8_t)in[2 + j] * d;
        memcpy(dst + b * 128, y, sizeof y);
    }
}

static void q4_0_dequantize(const byte *src, byte *dst, Py_ssize_t nblocks)
{
    for (Py_ssize_t b = 0; b < nblocks; b++) {
        const byte *in = src + b * 18;
        float d = ld_f16(in), y[32];
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((int)(in[2 + j] & 0x0F) - 8);
            y[j + 16] = d * (float)((int)(in[2 + j] >> 4) - 8);
        }
        memcpy(dst + b * 128, y, sizeof y);
    }
}

static void q4_k_dequantize(const byte *src, byte *dst, Py_ssize_t nblocks)
{
    for (Py_ssize_t b = 0; b < nblocks; b++) {
        const byte *in = src + b * 144, *s = in + 4, *qs = in + 16;
        float d = ld_f16(in), dmin = ld_f16(in + 2), y[256];
        for (int j = 0; j < 8; j++) { /* the 6-bit scale and min of sub-block j */
            int sc = j < 4 ? s[j] & 0x3F : (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
            int m = j < 4 ? s[j + 4] & 0x3F : (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            const byte *q = qs + (j / 2) * 32; /* chunk j/2: low nibbles, then high nibbles */
            int shift = (j & 1) * 4;
            for (int l = 0; l < 32; l++)
                y[j * 32 + l] = d1 * (float)((q[l] >> shift) & 0x0F) - m1;
        }
        memcpy(dst + b * 1024, y, sizeof y);
    }
}

static void q6_k_dequantize(const byte *src, byte *dst, Py_ssize_t nblocks)
{
    for (Py_ssize_t b = 0; b < nblocks; b++) {
        const byte *in = src + b * 210, *ql = in, *qh = in + 128;
        const int8_t *sc = (const int8_t *)(in + 192);
        float d = ld_f16(in + 208), y[256];
        for (int e = 0; e < 256; e++) {
            int h = e / 128, r = e % 128;
            int low = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0x0F;
            int high = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 0x03;
            y[e] = (d * (float)sc[e / 16]) * (float)((low | (high << 4)) - 32);
        }
        memcpy(dst + b * 1024, y, sizeof y);
    }
}

typedef void (*block_fn)(const byte *, byte *, Py_ssize_t);

/* the K-quant quantizers (q2_k_quantize ... q6_k_quantize) are in kquants.c */

PyObject *py_gguf_blocks(PyObject *self, PyObject *args)
{
    const char *kind;
    PyObject *src, *dst;
    Py_buffer in, out;
    if (!PyArg_ParseTuple(args, "sOO", &kind, &src, &dst))
        return NULL;
    block_fn fn;
    Py_ssize_t in_block, out_block;
    if (!strcmp(kind, "quantize Q8_0")) { fn = q8_0_quantize; in_block = 128; out_block = 34; }
    else if (!strcmp(kind, "dequantize Q8_0")) { fn = q8_0_dequantize; in_block = 34; out_block = 128; }
    else if (!strcmp(kind, "dequantize Q4_0")) { fn = q4_0_dequantize; in_block = 18; out_block = 128; }
    else if (!strcmp(kind, "dequantize Q4_K")) { fn = q4_k_dequantize; in_block = 144; out_block = 1024; }
    else if (!strcmp(kind, "dequantize Q6_K")) { fn = q6_k_dequantize; in_block = 210; out_block = 1024; }
    else if (!strcmp(kind, "quantize Q2_K")) { fn = q2_k_quantize; in_block = 1024; out_block = 84; }
    else if (!strcmp(kind, "quantize Q3_K")) { fn = q3_k_quantize; in_block = 1024; out_block = 110; }
    else if (!strcmp(kind, "quantize Q4_K")) { fn = q4_k_quantize; in_block = 1024; out_block = 144; }
    else if (!strcmp(kind, "quantize Q5_K")) { fn = q5_k_quantize; in_block = 1024; out_block = 176; }
    else if (!strcmp(kind, "quantize Q6_K")) { fn = q6_k_quantize; in_block = 1024; out_block = 210; }
    else
        Py_RETURN_FALSE;
    if (acquire(src, dst, &in, &out) < 0)
        return NULL;
    Py_ssize_t n = in.len / in_block;
    if (in.len % in_block != 0 || out.len != n * out_block) {
        PyErr_Format(PyExc_ValueError, "%s: %zd source bytes, %zd target bytes do not match", kind, in.len, out.len);
        PyBuffer_Release(&in);
        PyBuffer_Release(&out);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS fn((const byte *)in.buf, (byte *)out.buf, n);
    Py_END_ALLOW_THREADS PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    Py_RETURN_TRUE;
}
