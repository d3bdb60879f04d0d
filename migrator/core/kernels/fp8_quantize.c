#include "kernels.h"

/* ---- F32/BF16 weights -> F8_E4M3 with scales (core/fp8_quantize.py) ------------------------------
 * compressed-tensors' quantization, step for step as fp8_quantize.py's numpy code does it, bit for
 * bit: a row's (or a 128-column block's) max |x|, then per value x / scale in float32, rounded to
 * BF16 for a BF16 weight (torch divides reduced floats in float32 and rounds once), + 0.0 (the
 * symmetric zero point: -0.0 becomes +0.0), clamped to [-448, 448], rounded to the nearest F8_E4M3
 * (e4m3fn: bias 7, 3 mantissa bits, subnormals in steps of 2^-9), ties to even. NaN never reaches
 * the rounding: the caller refuses a band whose maximum is not finite. */

enum { KIND_F32 = 0, KIND_BF16 = 1 };

/* the bit pattern of |x| (a float32's): an integer max orders finite values, and NaN above inf */
static inline uint32_t abs_bits(const byte *src, Py_ssize_t i, int kind)
{
    return kind == KIND_F32 ? ld32(src, i) & 0x7FFFFFFFu : ((uint32_t)ld16(src, i) & 0x7FFFu) << 16;
}

static inline float bf16_round(float q)
{
    uint32_t u;
    memcpy(&u, &q, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u; /* finite: nearest, ties to even */
    memcpy(&q, &u, 4);
    return q;
}

/* Branch-free (both roundings made, one kept), so that a run of values vectorises. */
static inline byte e4m3_of(float q)
{
    uint32_t u;
    memcpy(&u, &q, 4);
    uint32_t sign = (u >> 24) & 0x80u;
    uint32_t a = u & 0x7FFFFFFFu;
    a = a > 0x43E00000u ? 0x43E00000u : a; /* clamped to [-448, 448] (as integers: no NaN comes here) */
    /* >= 2^-6, a normal: round 23 mantissa bits to 3, rebias 127 -> 7 */
    uint32_t normal = ((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
    /* below: in units of the smallest subnormal, 2^-9 (exact), to the nearest integer, ties to even
     * (the magic number works below 2^22; a normal's value here is at most 448 * 512); 8 is 2^-6, the
     * smallest normal, whose code is 8 too */
    float m;
    memcpy(&m, &a, 4);
    m = (m * 512.0f + 8388608.0f) - 8388608.0f;
    uint32_t sub = (uint32_t)(int32_t)m;
    return (byte)(sign | (a >= 0x3C800000u ? normal : sub));
}

static inline float zero_point(float q)
{
    return q + 0.0f; /* the symmetric zero point: -0.0 becomes +0.0 */
}

#if HAVE_X86_F16C /* SSE2, baseline x86-64: four values per step, the scalar rules above as vector ops */
static inline __m128i e4m3_x4(__m128 q)
{
    const __m128i seven_ff = _mm_set1_epi32(0x7FFFFFFF);
    q = _mm_add_ps(q, _mm_setzero_ps()); /* the zero point: -0.0 becomes +0.0 */
    __m128i u = _mm_castps_si128(q);
    __m128i sign = _mm_and_si128(_mm_srli_epi32(u, 24), _mm_set1_epi32(0x80));
    __m128i a = _mm_and_si128(u, seven_ff);
    __m128i big = _mm_cmpgt_epi32(a, _mm_set1_epi32(0x43E00000)); /* a < 2^31: a signed compare holds */
    a = _mm_or_si128(_mm_and_si128(big, _mm_set1_epi32(0x43E00000)), _mm_andnot_si128(big, a));
    __m128i odd = _mm_and_si128(_mm_srli_epi32(a, 20), _mm_set1_epi32(1));
    __m128i normal = _mm_sub_epi32(_mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(a, _mm_set1_epi32(0x7FFFF)), odd), 20),
                                   _mm_set1_epi32(120 << 3));
    __m128 m = _mm_mul_ps(_mm_castsi128_ps(a), _mm_set1_ps(512.0f));
    m = _mm_sub_ps(_mm_add_ps(m, _mm_set1_ps(8388608.0f)), _mm_set1_ps(8388608.0f));
    __m128i sub = _mm_cvttps_epi32(m);
    __m128i is_normal = _mm_cmpgt_epi32(a, _mm_set1_epi32(0x3C7FFFFF));
    __m128i code = _mm_or_si128(_mm_and_si128(is_normal, normal), _mm_andnot_si128(is_normal, sub));
    return _mm_or_si128(code, sign);
}

static inline __m128 load4(const byte *row, Py_ssize_t c, int kind)
{
    if (kind == KIND_F32)
        return _mm_loadu_ps((const float *)(const void *)(row + c * 4));
    __m128i h = _mm_loadl_epi64((const __m128i *)(const void *)(row + c * 2));
    return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h)); /* bf16 bits << 16 */
}

static inline __m128 div4(__m128 x, __m128 scale, int kind)
{
    __m128 q = _mm_div_ps(x, scale);
    if (kind == KIND_BF16) {
        __m128i u = _mm_castps_si128(q);
        __m128i odd = _mm_and_si128(_mm_srli_epi32(u, 16), _mm_set1_epi32(1));
        u = _mm_add_epi32(_mm_add_epi32(u, _mm_set1_epi32(0x7FFF)), odd);
        q = _mm_castsi128_ps(_mm_and_si128(u, _mm_set1_epi32((int)0xFFFF0000u)));
    }
    return q;
}
#endif

/* values [c0, c1) of one row divided by one scale */
static void quantize_run(const byte *restrict row, byte *restrict o, Py_ssize_t c0, Py_ssize_t c1, float scale,
                         int kind)
{
    Py_ssize_t c = c0;
#if HAVE_X86_F16C
    __m128 vs = _mm_set1_ps(scale);
    for (; c + 16 <= c1; c += 16) {
        __m128i a = e4m3_x4(div4(load4(row, c, kind), vs, kind));
        __m128i b = e4m3_x4(div4(load4(row, c + 4, kind), vs, kind));
        __m128i d = e4m3_x4(div4(load4(row, c + 8, kind), vs, kind));
        __m128i e = e4m3_x4(div4(load4(row, c + 12, kind), vs, kind));
        __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(d, e)); /* codes are 0..255 */
        _mm_storeu_si128((__m128i *)(void *)(o + c), bytes);
    }
#endif
    for (; c < c1; c++) {
        uint32_t u = kind == KIND_F32 ? ld32(row, c) : (uint32_t)ld16(row, c) << 16;
        float x, q;
        memcpy(&x, &u, 4);
        q = x / scale;
        if (kind == KIND_BF16)
            q = bf16_round(q);
        o[c] = e4m3_of(zero_point(q));
    }
}

/* fp8_absmax(src, kind, rows, cols, block, out): max |x| as float32 per row (block 0: out[rows]) or
 * per `block`-wide column block over all the rows (out[ceil(cols / block)]); NaN when one is NaN. */
PyObject *py_fp8_absmax(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *src_obj, *out_obj;
    int kind;
    Py_ssize_t rows, cols, block;
    if (!PyArg_ParseTuple(args, "OinnnO", &src_obj, &kind, &rows, &cols, &block, &out_obj))
        return NULL;
    Py_buffer in, out;
    if (acquire(src_obj, out_obj, &in, &out) < 0)
        return NULL;
    Py_ssize_t item = kind == KIND_F32 ? 4 : 2, groups = block > 0 ? (cols + block - 1) / block : rows;
    if ((kind != KIND_F32 && kind != KIND_BF16) || rows < 0 || cols < 0 || block < 0
        || in.len != rows * cols * item || out.len != groups * 4) {
        PyBuffer_Release(&in);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "fp8_absmax: buffer sizes do not match the shape");
        return NULL;
    }
    const byte *s = in.buf;
    byte *d = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t g = 0; g < groups; g++)
        st32(d, g, 0u);
    for (Py_ssize_t r = 0; r < rows; r++) {
        const byte *row = s + r * cols * item;
        if (block == 0) {
            uint32_t top = 0;
            for (Py_ssize_t c = 0; c < cols; c++) {
                uint32_t a = abs_bits(row, c, kind);
                top = a > top ? a : top;
            }
            st32(d, r, top);
        } else {
            for (Py_ssize_t g = 0; g < groups; g++) {
                Py_ssize_t end = (g + 1) * block < cols ? (g + 1) * block : cols;
                uint32_t top = ld32(d, g);
                for (Py_ssize_t c = g * block; c < end; c++) {
                    uint32_t a = abs_bits(row, c, kind);
                    top = a > top ? a : top;
                }
                st32(d, g, top);
            }
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* fp8_quantize(src, kind, rows, cols, scales, block, dst): F8_E4M3 bytes of src / scale, the scale of
 * row r (block 0: scales[rows]) or of column block c / block (scales[ceil(cols / block)]); the scales
 * are float32 holding values of the weight's dtype. */
PyObject *py_fp8_quantize(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *src_obj, *scales_obj, *dst_obj;
    int kind;
    Py_ssize_t rows, cols, block;
    if (!PyArg_ParseTuple(args, "OinnOnO", &src_obj, &kind, &rows, &cols, &scales_obj, &block, &dst_obj))
        return NULL;
    Py_buffer in, out, sc;
    if (acquire(src_obj, dst_obj, &in, &out) < 0)
        return NULL;
    if (PyObject_GetBuffer(scales_obj, &sc, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&in);
        PyBuffer_Release(&out);
        return NULL;
    }
    Py_ssize_t item = kind == KIND_F32 ? 4 : 2, groups = block > 0 ? (cols + block - 1) / block : rows;
    if ((kind != KIND_F32 && kind != KIND_BF16) || rows < 0 || cols < 0 || block < 0
        || in.len != rows * cols * item || out.len != rows * cols || sc.len != groups * 4) {
        PyBuffer_Release(&in);
        PyBuffer_Release(&out);
        PyBuffer_Release(&sc);
        PyErr_SetString(PyExc_ValueError, "fp8_quantize: buffer sizes do not match the shape");
        return NULL;
    }
    const byte *s = in.buf, *scales = sc.buf;
    byte *d = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows; r++) {
        const byte *row = s + r * cols * item;
        byte *o = d + r * cols;
        for (Py_ssize_t g = 0; g < (block == 0 ? 1 : groups); g++) {
            uint32_t bits = ld32(scales, block == 0 ? r : g);
            float scale;
            memcpy(&scale, &bits, 4);
            Py_ssize_t c0 = block == 0 ? 0 : g * block, c1 = block == 0 || (g + 1) * block > cols ? cols : (g + 1) * block;
            quantize_run(row, o, c0, c1, scale, kind);
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    PyBuffer_Release(&sc);
    Py_RETURN_NONE;
}
