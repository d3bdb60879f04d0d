#include "kernels.h"

/* ---- dequantizing bands of quantized weights (core/dequant.py) --------------------------------
 * One loop for every scheme of issue 43: a row holds `cols` codes of `bits` bits as a little-endian
 * bit stream (FP8 bytes, E2M1 nibbles low first, compressed-tensors' int32 words and MLX's uint32
 * words all read this way on a little-endian host); a code decodes to a float32 value (an FP8 or
 * E2M1 value, or the integer code - offset - zero point); each element is multiplied by the scale
 * of its block (block_rows x block_cols: per tensor, per row, per group, per 2-D block), optionally
 * gets a bias added (MLX), and is rounded the way the reference computes it:
 *   p = v * s                 in float32 (exact for every scheme whose scale is narrower);
 *   p = mid(p)                the reference's compute dtype (torch computes BF16/F16 products in
 *                             float32 and rounds each result; a bfloat16 NaN is 0xFFFF in its vector
 *                             loops, 0x7FC0 in their scalar tails: the vector rule everywhere here,
 *                             as casts.py does);
 *   p = mid(p + b)            with a bias (MLX rounds after the product and after the sum);
 *   out = cast(p, mid -> out) torch's cast rules (F32 -> BF16: NaN 0xFFFF; F16 -> BF16: 0x7FC0).
 * Every output element is a function of (code, scale, zero, bias) only, so a block's elements are
 * looked up in a table of that function over all codes when the block is larger than the code
 * space (FP8's 256 codes per 128x128 block): the same scalar code computes both, the same bits. */

enum { KIND_INT = 0, KIND_E4M3 = 1, KIND_E5M2 = 2, KIND_E2M1 = 3 };
enum { FT_F32 = 0, FT_BF16 = 1, FT_F16 = 2, FT_E8M0 = 3 };

static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* FP8 / FP4 code -> float32 bits, as torch widens them (NaN keeps its sign, gets the quiet bit) */
static uint32_t code_bits(int kind, uint32_t c)
{
    if (kind == KIND_E5M2)
        return f16_to_f32_bits((uint16_t)(c << 8)); /* E5M2 is the top byte of an F16 */
    if (kind == KIND_E4M3) {
        uint32_t sign = (c & 0x80u) << 24, e = (c >> 3) & 0xFu, m = c & 7u;
        if (e == 15u && m == 7u)
            return sign | 0x7FF00000u;
        if (e > 0u)
            return sign | ((e + 120u) << 23) | (m << 20);
        return sign | f32_bits((float)m * 0.001953125f); /* m * 2^-9, exact */
    }
    /* E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 */
    static const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return ((c & 8u) << 28) | f32_bits(e2m1[c & 7u]);
}

static inline float load_float(const byte *p, Py_ssize_t i, int kind)
{
    switch (kind) {
    case FT_BF16: return bits_f32((uint32_t)ld16(p, i) << 16);
    case FT_F16: return bits_f32(f16_to_f32_bits(ld16(p, i)));
    case FT_E8M0: {
        uint32_t e = ld8(p, i);
        /* 2^(e-127); 0 is the float32 subnormal 2^-127; 255 (NaN) is refused by the caller */
        return bits_f32(e == 255u ? 0x7FC00000u : e == 0u ? 0x00400000u : e << 23);
    }
    default: return bits_f32(ld32(p, i));
    }
}

static inline float round_to(float p, int ft)
{
    uint32_t u = f32_bits(p);
    if (ft == FT_BF16) {
        if ((u & 0x7FFFFFFFu) > 0x7F800000u) /* torch's vector loops; its scalar tails give 0x7FC0 */
            return bits_f32(0xFFFF0000u);
        return bits_f32(((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16);
    }
    if (ft == FT_F16)
        return bits_f32(f16_to_f32_bits(f32_to_f16_bits(u)));
    return p;
}

/* a value already representable in `mid` -> the bits of `out` */
static inline uint32_t cast_out(float p, int mid, int out)
{
    uint32_t u = f32_bits(p);
    if (out == FT_F32)
        return u;
    if (out == FT_F16)
        return f32_to_f16_bits(u);
    if (mid == FT_BF16)
        return u >> 16;
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return mid == FT_F16 ? 0x7FC0u : 0xFFFFu;
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

typedef struct {
    int kind, bits, offset, mid, out, scale_kind, has_zero, has_bias;
} spec_t;

static inline uint32_t element(const spec_t *sp, uint32_t code, float s, int zero, float b)
{
    float v = sp->kind == KIND_INT ? (float)((int)code - sp->offset - zero) : bits_f32(code_bits(sp->kind, code));
    float p = round_to(v * s, sp->mid);
    if (sp->has_bias)
        p = round_to(p + b, sp->mid);
    return cast_out(p, sp->mid, sp->out);
}

/* the code at bit position j * bits of a row of `row_bytes` bytes (no read past the row) */
static inline uint32_t code_at(const byte *row, Py_ssize_t j, int bits, Py_ssize_t row_bytes)
{
    Py_ssize_t bit = j * bits, at = bit >> 3;
    int shift = (int)(bit & 7);
    uint32_t w = row[at];
    if (shift + bits > 8 && at + 1 < row_bytes)
        w |= (uint32_t)row[at + 1] << 8;
    return (w >> shift) & ((1u << bits) - 1u);
}

static inline void store_out(byte *dst, Py_ssize_t i, uint32_t v, int out)
{
    if (out == FT_F32)
        st32(dst, i, v);
    else
        st16(dst, i, (uint16_t)v);
}

typedef struct {
    const byte *src, *scales, *zeros, *biases;
    byte *dst;
    Py_ssize_t rows, row_bytes, col0, cols, row0, block_rows, block_cols, scale_cols;
} band_t;

/* MXFP4's blocks are 32 codes with a byte of scale each: a block's 16-entry table is as costly as its
 * elements, so the tables of the band's E8M0 scales are kept, one per scale byte, as computed. */
typedef struct {
    uint32_t table[255][16];
    byte known[255];
} e8m0_cache_t;

/* Rows [r0, r1) x output columns [c0, c1) of the band share the scale (sr, sc): one block. */
static Py_ssize_t block(const spec_t *sp, const band_t *b, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t c0, Py_ssize_t c1,
                        Py_ssize_t sr, Py_ssize_t sc, e8m0_cache_t *cache)
{
    Py_ssize_t at = sr * b->scale_cols + sc;
    float s = load_float(b->scales, at, sp->scale_kind);
    float bias = sp->has_bias ? load_float(b->biases, at, sp->scale_kind) : 0.0f;
    int zero = sp->has_zero ? (int)(int8_t)ld8(b->zeros, at) : 0;
    if (!isfinite(s) || s == 0.0f || !isfinite(bias))
        return at;
    Py_ssize_t n = (r1 - r0) * (c1 - c0), codes = (Py_ssize_t)1 << sp->bits;
    int outsize = sp->out == FT_F32 ? 4 : 2;
    if (cache == NULL && n < 2 * codes) { /* a small block: each element on its own */
        for (Py_ssize_t r = r0; r < r1; r++) {
            const byte *row = b->src + r * b->row_bytes;
            for (Py_ssize_t c = c0; c < c1; c++)
                store_out(b->dst, r * b->cols + c, element(sp, code_at(row, b->col0 + c, sp->bits, b->row_bytes), s, zero, bias),
                          sp->out);
        }
        return -1;
    }
    uint32_t table32[256];
    uint16_t table16[256];
    if (cache != NULL) { /* codes == 16, no zero points, no biases */
        uint32_t e = ld8(b->scales, at);
        if (!cache->known[e]) {
            for (Py_ssize_t k = 0; k < 16; k++)
                cache->table[e][k] = element(sp, (uint32_t)k, s, 0, 0.0f);
            cache->known[e] = 1;
        }
        memcpy(table32, cache->table[e], sizeof cache->table[e]);
    } else {
        for (Py_ssize_t k = 0; k < codes; k++)
            table32[k] = element(sp, (uint32_t)k, s, zero, bias);
    }
    for (Py_ssize_t k = 0; k < codes; k++)
        table16[k] = (uint16_t)table32[k];
    for (Py_ssize_t r = r0; r < r1; r++) {
        const byte *row = b->src + r * b->row_bytes;
        byte *out = b->dst + (r * b->cols + c0) * outsize;
        Py_ssize_t j0 = b->col0 + c0, w = c1 - c0;
        if (sp->bits == 8) {
            const byte *in = row + j0;
            if (outsize == 2)
                for (Py_ssize_t j = 0; j < w; j++)
                    st16(out, j, table16[in[j]]);
            else
                for (Py_ssize_t j = 0; j < w; j++)
                    st32(out, j, table32[in[j]]);
        } else if (sp->bits == 4 && !(j0 & 1) && !(w & 1)) { /* whole bytes: two codes each, low nibble first */
            const byte *in = row + j0 / 2;
            if (outsize == 2)
                for (Py_ssize_t j = 0; j < w / 2; j++) {
                    st16(out, 2 * j, table16[in[j] & 15u]);
                    st16(out, 2 * j + 1, table16[in[j] >> 4]);
                }
            else
                for (Py_ssize_t j = 0; j < w / 2; j++) {
                    st32(out, 2 * j, table32[in[j] & 15u]);
                    st32(out, 2 * j + 1, table32[in[j] >> 4]);
                }
        } else {
            for (Py_ssize_t j = 0; j < w; j++)
                store_out(out, j, table32[code_at(row, j0 + j, sp->bits, b->row_bytes)], sp->out);
        }
    }
    return -1;
}

/* Every block of the band, block rows outer, so that one table serves a whole block. */
static Py_ssize_t band(const spec_t *sp, const band_t *b, e8m0_cache_t *cache)
{
    Py_ssize_t first_sr = b->row0 / b->block_rows;
    for (Py_ssize_t r0 = 0; r0 < b->rows;) {
        Py_ssize_t sr = (b->row0 + r0) / b->block_rows;
        Py_ssize_t r1 = (sr + 1) * b->block_rows - b->row0;
        if (r1 > b->rows)
            r1 = b->rows;
        for (Py_ssize_t c0 = 0; c0 < b->cols;) {
            Py_ssize_t sc = (b->col0 + c0) / b->block_cols;
            Py_ssize_t c1 = (sc + 1) * b->block_cols - b->col0;
            if (c1 > b->cols)
                c1 = b->cols;
            Py_ssize_t bad = block(sp, b, r0, r1, c0, c1, sr - first_sr, sc, cache);
            if (bad >= 0)
                return bad;
            c0 = c1;
        }
        r0 = r1;
    }
    return -1;
}

static int float_kind_ok(int k, int allow_e8m0) { return k == FT_F32 || k == FT_BF16 || k == FT_F16 || (allow_e8m0 && k == FT_E8M0); }
static Py_ssize_t float_size(int k) { return k == FT_F32 ? 4 : k == FT_E8M0 ? 1 : 2; }

/* dequant_band(src, dst, kind, bits, offset, rows, row_bytes, col0, cols, row0, block_rows, block_cols,
 *              scales, scale_kind, scale_cols, zeros, biases, mid, out) -> -1, or the index in `scales` of the
 * first scale (or bias) that is NaN, infinite, zero or E8M0 255: nothing past its block is written. */
PyObject *py_dequant_band(PyObject *self, PyObject *args)
{
    PyObject *src, *dst, *scales, *zeros, *biases;
    spec_t sp;
    band_t b;
    if (!PyArg_ParseTuple(args, "OOiiinnnnnnnOinOOii:dequant_band", &src, &dst, &sp.kind, &sp.bits, &sp.offset, &b.rows,
                          &b.row_bytes, &b.col0, &b.cols, &b.row0, &b.block_rows, &b.block_cols, &scales, &sp.scale_kind,
                          &b.scale_cols, &zeros, &biases, &sp.mid, &sp.out))
        return NULL;
    sp.has_zero = zeros != Py_None;
    sp.has_bias = biases != Py_None;
    int lut_bits = sp.kind == KIND_E2M1 ? 4 : 8;
    if (sp.kind < KIND_INT || sp.kind > KIND_E2M1 || sp.bits < 1 || sp.bits > 8 || (sp.kind != KIND_INT && sp.bits != lut_bits) ||
        !float_kind_ok(sp.scale_kind, 1) || !float_kind_ok(sp.mid, 0) || !float_kind_ok(sp.out, 0) ||
        (sp.has_bias && sp.scale_kind == FT_E8M0) || b.rows < 0 || b.cols < 0 || b.col0 < 0 || b.row0 < 0 ||
        b.row_bytes < 0 || b.block_rows < 1 || b.block_cols < 1 || b.scale_cols < 1 ||
        (b.col0 + b.cols) > b.row_bytes * 8 / sp.bits || (b.col0 + b.cols + b.block_cols - 1) / b.block_cols > b.scale_cols) {
        PyErr_SetString(PyExc_ValueError, "dequant_band: bad code kind, bits, dtypes or band geometry");
        return NULL;
    }
    Py_ssize_t srows = b.rows == 0 ? 0 : (b.row0 + b.rows - 1) / b.block_rows - b.row0 / b.block_rows + 1;
    Py_ssize_t outsize = sp.out == FT_F32 ? 4 : 2, ssize = float_size(sp.scale_kind);
    Py_buffer in, out, sv, zv = {0}, bv = {0};
    if (acquire(src, dst, &in, &out) < 0)
        return NULL;
    if (PyObject_GetBuffer(scales, &sv, PyBUF_SIMPLE) < 0)
        goto fail_io;
    if (sp.has_zero && PyObject_GetBuffer(zeros, &zv, PyBUF_SIMPLE) < 0)
        goto fail_s;
    if (sp.has_bias && PyObject_GetBuffer(biases, &bv, PyBUF_SIMPLE) < 0)
        goto fail_z;
    if (in.len != b.rows * b.row_bytes || out.len != b.rows * b.cols * outsize || sv.len != srows * b.scale_cols * ssize ||
        (sp.has_zero && zv.len != srows * b.scale_cols) || (sp.has_bias && bv.len != sv.len)) {
        PyErr_Format(PyExc_ValueError, "dequant_band: buffers of %zd, %zd, %zd bytes do not match the band", in.len, out.len,
                     sv.len);
        goto fail_b;
    }
    b.src = (const byte *)in.buf;
    b.dst = (byte *)out.buf;
    b.scales = (const byte *)sv.buf;
    b.zeros = sp.has_zero ? (const byte *)zv.buf : NULL;
    b.biases = sp.has_bias ? (const byte *)bv.buf : NULL;
    e8m0_cache_t *cache = NULL;
    if (sp.scale_kind == FT_E8M0 && sp.bits == 4 && !sp.has_zero && !sp.has_bias && b.block_rows * b.block_cols <= 64) {
        cache = PyMem_RawCalloc(1, sizeof *cache);
        if (cache == NULL) {
            PyErr_NoMemory();
            goto fail_b;
        }
    }
    Py_ssize_t bad;
    Py_BEGIN_ALLOW_THREADS bad = band(&sp, &b, cache);
    Py_END_ALLOW_THREADS PyMem_RawFree(cache);
    if (sp.has_bias)
        PyBuffer_Release(&bv);
    if (sp.has_zero)
        PyBuffer_Release(&zv);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return PyLong_FromSsize_t(bad);
fail_b:
    if (sp.has_bias)
        PyBuffer_Release(&bv);
fail_z:
    if (sp.has_zero)
        PyBuffer_Release(&zv);
fail_s:
    PyBuffer_Release(&sv);
fail_io:
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return NULL;
}

/* e8m0_to_f32(src, dst) -> -1, or the index of the first 255 (E8M0's NaN: refused, nothing after it
 * written): E8M0 bytes -> float32 2^(e-127) (0 -> the subnormal 2^-127). */
PyObject *py_e8m0_to_f32(PyObject *self, PyObject *args)
{
    PyObject *src, *dst;
    Py_buffer in, out;
    if (!PyArg_ParseTuple(args, "OO:e8m0_to_f32", &src, &dst) || acquire(src, dst, &in, &out) < 0)
        return NULL;
    if (out.len != 4 * in.len) {
        PyErr_Format(PyExc_ValueError, "e8m0_to_f32: %zd source bytes, %zd target bytes", in.len, out.len);
        PyBuffer_Release(&in);
        PyBuffer_Release(&out);
        return NULL;
    }
    Py_ssize_t bad = -1, n = in.len;
    const byte *s = (const byte *)in.buf;
    byte *d = (byte *)out.buf;
    Py_BEGIN_ALLOW_THREADS for (Py_ssize_t i = 0; i < n; i++)
    {
        uint32_t e = s[i];
        if (e == 255u) {
            bad = i;
            break;
        }
        st32(d, i, e == 0u ? 0x00400000u : e << 23);
    }
    Py_END_ALLOW_THREADS PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return PyLong_FromSsize_t(bad);
}
