/* The hot loops of casts.py: float -> half conversions and 2-D
 * transposes. numpy's float32 -> float16 cast is scalar code (~1 GB/s on the benchmark machine),
 * which made every F16 migration CPU-bound; the F16C instructions do it at memory speed.
 *
 * Every function gives the same bits as the numpy path in casts.py, which follows torch's CPU
 * kernels (tests/test_casts.py checks both paths against torch):
 *   f32 -> f16:  round to nearest even; NaN keeps its sign, gets the quiet bit and the top 10
 *                payload bits (exactly what vcvtps2ph does, and torch uses that instruction);
 *   f16 -> f32:  exact; NaN keeps sign and payload and gets the quiet bit (vcvtph2ps);
 *   f32 -> bf16: round to nearest even on the bit pattern; every NaN becomes `nan_bits`.
 * The F16C paths are chosen at run time, with a portable scalar version of the same rules.
 * Loops run without the GIL, so casts.py's worker threads use both cores.
 */
#include "kernels.h"

/* ---- F16C versions ----------------------------------------------------------------------------- */

#if HAVE_X86_F16C
__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(const byte *restrict src, byte *restrict dst, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i_u *)(src + 4 * i)));
        _mm_storeu_si128((__m128i_u *)(dst + 2 * i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++)
        st16(dst, i, f32_to_f16_bits(ld32(src, i)));
}

__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(const byte *restrict src, byte *restrict dst, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i_u *)(src + 2 * i));
        _mm256_storeu_si256((__m256i_u *)(dst + 4 * i), _mm256_castps_si256(_mm256_cvtph_ps(h)));
    }
    for (; i < n; i++)
        st32(dst, i, f16_to_f32_bits(ld16(src, i)));
}

static int has_f16c(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
    }
    return known;
}
#endif

int allow_f16c = 1; /* tests turn it off to check the portable loops against torch too */

/* The portable loops are not inlined into their dispatchers: each then starts at an aligned
 * function entry, and its speed does not depend on where the dispatcher's code happens to fall. */
static __attribute__((noinline)) void f32_to_f16_portable(const byte *restrict src, byte *restrict dst, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        st16(dst, i, f32_to_f16_bits(ld32(src, i)));
}

static void f32_to_f16_any(const byte *restrict src, byte *restrict dst, Py_ssize_t n)
{
#if HAVE_X86_F16C
    if (allow_f16c && has_f16c()) {
        f32_to_f16_f16c(src, dst, n);
        return;
    }
#endif
    f32_to_f16_portable(src, dst, n);
}

static __attribute__((noinline)) void f16_to_f32_portable(const byte *restrict src, byte *restrict dst, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        st32(dst, i, f16_to_f32_bits(ld16(src, i)));
}

static void f16_to_f32_any(const byte *restrict src, byte *restrict dst, Py_ssize_t n)
{
#if HAVE_X86_F16C
    if (allow_f16c && has_f16c()) {
        f16_to_f32_f16c(src, dst, n);
        return;
    }
#endif
    f16_to_f32_portable(src, dst, n);
}

static __attribute__((noinline)) void f32_to_bf16_any(const byte *restrict src, byte *restrict dst, Py_ssize_t n, uint16_t nan_bits)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t u = ld32(src, i);
        uint16_t r = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
        st16(dst, i, (u & 0x7FFFFFFFu) > 0x7F800000u ? nan_bits : r);
    }
}

/* ---- tiled transpose ---------------------------------------------------------------------------- */

/* Blocks of TILE x TILE elements keep both the rows read and the rows written in cache; inside a
 * block, 2- and 4-byte elements move as 8x8 / 4x4 register transposes (SSE2, baseline on x86-64). */
#define TILE 32

#define DEFINE_SCALAR_BLOCK(NAME, BITS)                                                              \
    static void NAME(const byte *restrict src, byte *restrict dst, Py_ssize_t rows, Py_ssize_t cols,  \
                     Py_ssize_t i0, Py_ssize_t i1, Py_ssize_t j0, Py_ssize_t j1)                     \
    {                                                                                                \
        for (Py_ssize_t i = i0; i < i1; i++)                                                         \
            for (Py_ssize_t j = j0; j < j1; j++)                                                     \
                st##BITS(dst, j * rows + i, ld##BITS(src, i * cols + j));                            \
    }

DEFINE_SCALAR_BLOCK(block_1, 8)
DEFINE_SCALAR_BLOCK(block_2_scalar, 16)
DEFINE_SCALAR_BLOCK(block_4_scalar, 32)
DEFINE_SCALAR_BLOCK(block_8, 64)

#if defined(__SSE2__)
#include <emmintrin.h>

/* Rows a0..a7 of eight 16-bit items each -> stored as the 8x8 transpose at d, one row every `stride` items. */
static inline void store_8x8_u16(__m128i a0, __m128i a1, __m128i a2, __m128i a3, __m128i a4, __m128i a5,
                                 __m128i a6, __m128i a7, byte *d, Py_ssize_t stride)
{
    __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);
    __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);
    __m128i b4 = _mm_unpacklo_epi16(a4, a5), b5 = _mm_unpackhi_epi16(a4, a5);
    __m128i b6 = _mm_unpacklo_epi16(a6, a7), b7 = _mm_unpackhi_epi16(a6, a7);
    __m128i c0 = _mm_unpacklo_epi32(b0, b2), c1 = _mm_unpackhi_epi32(b0, b2);
    __m128i c2 = _mm_unpacklo_epi32(b1, b3), c3 = _mm_unpackhi_epi32(b1, b3);
    __m128i c4 = _mm_unpacklo_epi32(b4, b6), c5 = _mm_unpackhi_epi32(b4, b6);
    __m128i c6 = _mm_unpacklo_epi32(b5, b7), c7 = _mm_unpackhi_epi32(b5, b7);
    _mm_storeu_si128((__m128i_u *)(d + 0 * 2 * stride), _mm_unpacklo_epi64(c0, c4));
    _mm_storeu_si128((__m128i_u *)(d + 1 * 2 * stride), _mm_unpackhi_epi64(c0, c4));
    _mm_storeu_si128((__m128i_u *)(d + 2 * 2 * stride), _mm_unpacklo_epi64(c1, c5));
    _mm_storeu_si128((__m128i_u *)(d + 3 * 2 * stride), _mm_unpackhi_epi64(c1, c5));
    _mm_storeu_si128((__m128i_u *)(d + 4 * 2 * stride), _mm_unpacklo_epi64(c2, c6));
    _mm_storeu_si128((__m128i_u *)(d + 5 * 2 * stride), _mm_unpackhi_epi64(c2, c6));
    _mm_storeu_si128((__m128i_u *)(d + 6 * 2 * stride), _mm_unpacklo_epi64(c3, c7));
    _mm_storeu_si128((__m128i_u *)(d + 7 * 2 * stride), _mm_unpackhi_epi64(c3, c7));
}

static void block_2(const byte *restrict src, byte *restrict dst, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t i0,
                    Py_ssize_t i1, Py_ssize_t j0, Py_ssize_t j1)
{
    Py_ssize_t i8 = i0 + (i1 - i0) / 8 * 8, j8 = j0 + (j1 - j0) / 8 * 8;
    for (Py_ssize_t i = i0; i < i8; i += 8) {
        for (Py_ssize_t j = j0; j < j8; j += 8) {
            const byte *s = src + 2 * (i * cols + j);
            __m128i a0 = _mm_loadu_si128((const __m128i_u *)(s + 0 * 2 * cols));
            __m128i a1 = _mm_loadu_si128((const __m128i_u *)(s + 1 * 2 * cols));
            __m128i a2 = _mm_loadu_si128((const __m128i_u *)(s + 2 * 2 * cols));
            __m128i a3 = _mm_loadu_si128((const __m128i_u *)(s + 3 * 2 * cols));
            __m128i a4 = _mm_loadu_si128((const __m128i_u *)(s + 4 * 2 * cols));
            __m128i a5 = _mm_loadu_si128((const __m128i_u *)(s + 5 * 2 * cols));
            __m128i a6 = _mm_loadu_si128((const __m128i_u *)(s + 6 * 2 * cols));
            __m128i a7 = _mm_loadu_si128((const __m128i_u *)(s + 7 * 2 * cols));
            store_8x8_u16(a0, a1, a2, a3, a4, a5, a6, a7, dst + 2 * (j * rows + i), rows);
        }
    }
    /* the ragged right and bottom edges */
    block_2_scalar(src, dst, rows, cols, i0, i8, j8, j1);
    block_2_scalar(src, dst, rows, cols, i8, i1, j0, j1);
}

static void block_4(const byte *restrict src, byte *restrict dst, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t i0,
                    Py_ssize_t i1, Py_ssize_t j0, Py_ssize_t j1)
{
    Py_ssize_t i4 = i0 + (i1 - i0) / 4 * 4, j4 = j0 + (j1 - j0) / 4 * 4;
    for (Py_ssize_t i = i0; i < i4; i += 4) {
        for (Py_ssize_t j = j0; j < j4; j += 4) {
            const byte *s = src + 4 * (i * cols + j);
            __m128i a0 = _mm_loadu_si128((const __m128i_u *)(s + 0 * 4 * cols));
            __m128i a1 = _mm_loadu_si128((const __m128i_u *)(s + 1 * 4 * cols));
            __m128i a2 = _mm_loadu_si128((const __m128i_u *)(s + 2 * 4 * cols));
            __m128i a3 = _mm_loadu_si128((const __m128i_u *)(s + 3 * 4 * cols));
            __m128i b0 = _mm_unpacklo_epi32(a0, a1), b1 = _mm_unpackhi_epi32(a0, a1);
            __m128i b2 = _mm_unpacklo_epi32(a2, a3), b3 = _mm_unpackhi_epi32(a2, a3);
            byte *d = dst + 4 * (j * rows + i);
            _mm_storeu_si128((__m128i_u *)(d + 0 * 4 * rows), _mm_unpacklo_epi64(b0, b2));
            _mm_storeu_si128((__m128i_u *)(d + 1 * 4 * rows), _mm_unpackhi_epi64(b0, b2));
            _mm_storeu_si128((__m128i_u *)(d + 2 * 4 * rows), _mm_unpacklo_epi64(b1, b3));
            _mm_storeu_si128((__m128i_u *)(d + 3 * 4 * rows), _mm_unpackhi_epi64(b1, b3));
        }
    }
    block_4_scalar(src, dst, rows, cols, i0, i4, j4, j1);
    block_4_scalar(src, dst, rows, cols, i4, i1, j0, j1);
}
#else
#define block_2 block_2_scalar
#define block_4 block_4_scalar
#endif

/* ---- fused transpose + f32 -> f16 --------------------------------------------------------------- */

/* dst[j][i] = half(src[i][j]) over a block: a Linear weight cast to F16 is read once, converted in
 * registers and written transposed, with no intermediate F16 copy of the whole tensor. */
static void tcast_block_scalar(const byte *restrict src, byte *restrict dst, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t i0,
                               Py_ssize_t i1, Py_ssize_t j0, Py_ssize_t j1)
{
    for (Py_ssize_t i = i0; i < i1; i++)
        for (Py_ssize_t j = j0; j < j1; j++)
            st16(dst, j * rows + i, f32_to_f16_bits(ld32(src, i * cols + j)));
}

#if HAVE_X86_F16C
__attribute__((target("avx,f16c"))) static void tcast_block_f16c(const byte *restrict src, byte *restrict dst, Py_ssize_t rows,
                                                                Py_ssize_t cols, Py_ssize_t i0, Py_ssize_t i1,
                                                                Py_ssize_t j0, Py_ssize_t j1)
{
    Py_ssize_t i8 = i0 + (i1 - i0) / 8 * 8, j8 = j0 + (j1 - j0) / 8 * 8;
    for (Py_ssize_t i = i0; i < i8; i += 8) {
        for (Py_ssize_t j = j0; j < j8; j += 8) {
            const byte *s = src + 4 * (i * cols + j);
#define ROW(k) _mm256_cvtps_ph(_mm256_castsi256_ps(_mm256_loadu_si256((const __m256i_u *)(s + 4 * (k) * cols))), \
                               _MM_FROUND_TO_NEAREST_INT)
            __m128i a0 = ROW(0), a1 = ROW(1), a2 = ROW(2), a3 = ROW(3);
            __m128i a4 = ROW(4), a5 = ROW(5), a6 = ROW(6), a7 = ROW(7);
#undef ROW
            store_8x8_u16(a0, a1, a2, a3, a4, a5, a6, a7, dst + 2 * (j * rows + i), rows);
        }
    }
    tcast_block_scalar(src, dst, rows, cols, i0, i8, j8, j1);
    tcast_block_scalar(src, dst, rows, cols, i8, i1, j0, j1);
}
#endif

static void transpose_f32_to_f16(const byte *restrict src, byte *restrict dst, Py_ssize_t rows, Py_ssize_t cols,
                                 Py_ssize_t first, Py_ssize_t width)
{
    int vector = 0;
#if HAVE_X86_F16C
    vector = allow_f16c && has_f16c();
#endif
    src += 4 * first;
    for (Py_ssize_t i0 = 0; i0 < rows; i0 += TILE) {
        Py_ssize_t i1 = i0 + TILE < rows ? i0 + TILE : rows;
        for (Py_ssize_t j0 = 0; j0 < width; j0 += TILE) {
            Py_ssize_t j1 = j0 + TILE < width ? j0 + TILE : width;
#if HAVE_X86_F16C
            if (vector) {
                tcast_block_f16c(src, dst, rows, cols, i0, i1, j0, j1);
                continue;
            }
#endif
            (void)vector;
            tcast_block_scalar(src, dst, rows, cols, i0, i1, j0, j1);
        }
    }
}

/* dst[j][i] = src[i][first + j] for j < width: a band of `width` source columns, `cols` wide rows */
#define DEFINE_TRANSPOSE(NAME, ITEM, BLOCK)                                                          \
    static void NAME(const byte *restrict src, byte *restrict dst, Py_ssize_t rows, Py_ssize_t cols,  \
                     Py_ssize_t first, Py_ssize_t width)                                             \
    {                                                                                                \
        src += (ITEM) * first;                                                                       \
        for (Py_ssize_t i0 = 0; i0 < rows; i0 += TILE) {                                             \
            Py_ssize_t i1 = i0 + TILE < rows ? i0 + TILE : rows;                                     \
            for (Py_ssize_t j0 = 0; j0 < width; j0 += TILE)                                          \
                BLOCK(src, dst, rows, cols, i0, i1, j0, j0 + TILE < width ? j0 + TILE : width);      \
        }                                                                                            \
    }

DEFINE_TRANSPOSE(transpose_1, 1, block_1)
DEFINE_TRANSPOSE(transpose_2, 2, block_2)
DEFINE_TRANSPOSE(transpose_4, 4, block_4)
DEFINE_TRANSPOSE(transpose_8, 8, block_8)

/* ---- Python glue (acquire is in module.c, shared with gguf.c) ------------------------------------ */


/* Get a read buffer and a writable buffer of exactly the expected byte lengths. */
static int get_buffers(PyObject *src, PyObject *dst, Py_buffer *in, Py_buffer *out, Py_ssize_t in_item,
                       Py_ssize_t out_item, Py_ssize_t *n)
{
    if (acquire(src, dst, in, out) < 0)
        return -1;
    if (in->len % in_item != 0 || out->len != in->len / in_item * out_item) {
        PyErr_Format(PyExc_ValueError, "buffer sizes do not match: %zd source bytes, %zd target bytes", in->len,
                     out->len);
        PyBuffer_Release(in);
        PyBuffer_Release(out);
        return -1;
    }
    *n = in->len / in_item;
    return 0;
}

PyObject *py_f32_to_f16(PyObject *self, PyObject *args)
{
    PyObject *src, *dst;
    Py_buffer in, out;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OO", &src, &dst) || get_buffers(src, dst, &in, &out, 4, 2, &n) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS f32_to_f16_any((const byte *)in.buf, (byte *)out.buf, n);
    Py_END_ALLOW_THREADS PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

PyObject *py_f16_to_f32(PyObject *self, PyObject *args)
{
    PyObject *src, *dst;
    Py_buffer in, out;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OO", &src, &dst) || get_buffers(src, dst, &in, &out, 2, 4, &n) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS f16_to_f32_any((const byte *)in.buf, (byte *)out.buf, n);
    Py_END_ALLOW_THREADS PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

PyObject *py_f32_to_bf16(PyObject *self, PyObject *args)
{
    PyObject *src, *dst;
    unsigned int nan_bits;
    Py_buffer in, out;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOI", &src, &dst, &nan_bits) || get_buffers(src, dst, &in, &out, 4, 2, &n) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS f32_to_bf16_any((const byte *)in.buf, (byte *)out.buf, n, (uint16_t)nan_bits);
    Py_END_ALLOW_THREADS PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* Check that (rows, cols, first, width) is a band of columns, that src holds [rows, cols] items of
 * `in_item` bytes and dst [width, rows] items of `out_item` bytes; get both buffers. */
static int get_band(PyObject *src, PyObject *dst, Py_ssize_t in_item, Py_ssize_t out_item, Py_buffer *in,
                    Py_buffer *out, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t first, Py_ssize_t width)
{
    if (rows < 0 || cols < 0 || first < 0 || width < 0 || first > cols || width > cols - first) {
        PyErr_SetString(PyExc_ValueError, "bad transpose shape or band");
        return -1;
    }
    if (acquire(src, dst, in, out) < 0)
        return -1;
    /* rows * cols * in_item == in->len, checked by division so that nothing can overflow */
    int fits = (rows == 0 || cols == 0) ? in->len == 0
                                        : (in->len % in_item == 0 && in->len / in_item % cols == 0 &&
                                           in->len / in_item / cols == rows);
    if (!fits || out->len % out_item != 0 || out->len / out_item != rows * width) {
        PyErr_Format(PyExc_ValueError,
                     "transpose of columns [%zd, %zd) of [%zd, %zd] does not match buffers of %zd and %zd bytes",
                     first, first + width, rows, cols, in->len, out->len);
        PyBuffer_Release(in);
        PyBuffer_Release(out);
        return -1;
    }
    return 0;
}

PyObject *py_transpose(PyObject *self, PyObject *args)
{
    PyObject *src, *dst;
    Py_ssize_t rows, cols, itemsize, first, width;
    Py_buffer in, out;
    if (!PyArg_ParseTuple(args, "OOnnnnn:transpose", &src, &dst, &rows, &cols, &itemsize, &first, &width))
        return NULL;
    if (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "bad transpose item size");
        return NULL;
    }
    if (get_band(src, dst, itemsize, itemsize, &in, &out, rows, cols, first, width) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS switch (itemsize)
    {
    case 1: transpose_1((const byte *)in.buf, (byte *)out.buf, rows, cols, first, width); break;
    case 2: transpose_2((const byte *)in.buf, (byte *)out.buf, rows, cols, first, width); break;
    case 4: transpose_4((const byte *)in.buf, (byte *)out.buf, rows, cols, first, width); break;
    default: transpose_8((const byte *)in.buf, (byte *)out.buf, rows, cols, first, width); break;
    }
    Py_END_ALLOW_THREADS PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

PyObject *py_transpose_f32_to_f16(PyObject *self, PyObject *args)
{
    PyObject *src, *dst;
    Py_ssize_t rows, cols, first, width;
    Py_buffer in, out;
    if (!PyArg_ParseTuple(args, "OOnnnn:transpose_f32_to_f16", &src, &dst, &rows, &cols, &first, &width) ||
        get_band(src, dst, 4, 2, &in, &out, rows, cols, first, width) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS transpose_f32_to_f16((const byte *)in.buf, (byte *)out.buf, rows, cols, first, width);
    Py_END_ALLOW_THREADS PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

PyObject *py_has_f16c(PyObject *self, PyObject *args)
{
#if HAVE_X86_F16C
    return PyBool_FromLong(allow_f16c && has_f16c());
#else
    Py_RETURN_FALSE;
#endif
}

PyObject *py_use_f16c(PyObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    allow_f16c = on;
    Py_RETURN_NONE;
}
