/* Optional compiled kernels for the hot loops of casts.py: float -> half conversions and 2-D
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
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && defined(__SSE2__)
#include <immintrin.h>
#define HAVE_X86_F16C 1
#else
#define HAVE_X86_F16C 0
#endif

/* Buffers arrive at any byte address (a tensor in a mapped SafeTensors file starts right after a
 * header of any length), so an item is never read or written through a typed pointer: every access
 * goes through memcpy on byte pointers, which is defined for any alignment and compiles to one plain
 * load or store. The SIMD loads and stores are the unaligned (`loadu`/`storeu`) forms. */
typedef unsigned char byte;

#define DEFINE_ITEM(BITS)                                                                            \
    static inline uint##BITS##_t ld##BITS(const byte *p, Py_ssize_t i)                              \
    {                                                                                                \
        uint##BITS##_t v;                                                                            \
        memcpy(&v, p + i * (Py_ssize_t)sizeof v, sizeof v);                                          \
        return v;                                                                                    \
    }                                                                                                \
    static inline void st##BITS(byte *p, Py_ssize_t i, uint##BITS##_t v)                            \
    {                                                                                                \
        memcpy(p + i * (Py_ssize_t)sizeof v, &v, sizeof v);                                          \
    }

DEFINE_ITEM(8)
DEFINE_ITEM(16)
DEFINE_ITEM(32)
DEFINE_ITEM(64)

/* ---- scalar reference rules ------------------------------------------------------------------ */

static uint16_t f32_to_f16_bits(uint32_t u)
{
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7FFFFFFFu;
    /* the common case first, as one unsigned compare: [2^-14, 65520) rounds to a normal f16 */
    if (__builtin_expect(a - 0x38800000u < 0x477FF000u - 0x38800000u, 1)) {
        uint32_t r = a + 0xFFFu + ((a >> 13) & 1u); /* rebias, round the 13 dropped bits to even */
        return (uint16_t)(sign | ((r >> 13) - (112u << 10)));
    }
    if (a > 0x7F800000u) /* NaN: quiet bit + top 10 payload bits */
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) /* rounds to 65536 or more, or is inf */
        return (uint16_t)(sign | 0x7C00u);
    /* what is left below 2^-14: an f16 subnormal or zero */
    if (a < 0x33000000u) /* below 2^-25, half the smallest subnormal: rounds to zero */
        return (uint16_t)sign;
    uint32_t exp = a >> 23;
    uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - exp; /* value = mant * 2^(exp-150); f16 units are 2^-24 */
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u)))
        q += 1u;
    return (uint16_t)(sign | q);
}

static uint32_t f16_to_f32_bits(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    if (__builtin_expect(exp - 1u < 0x1Eu, 1)) /* normal: exp in [1, 30] */
        return sign | ((exp + 112u) << 23) | (mant << 13);
    if (exp == 0x1Fu) /* inf, or NaN with the quiet bit set */
        return sign | 0x7F800000u | (mant << 13) | (mant ? 0x400000u : 0u);
    if (mant == 0)
        return sign;
    exp = 113u; /* subnormal: normalise */
    while (!(mant & 0x400u)) {
        mant <<= 1;
        exp -= 1u;
    }
    return sign | (exp << 23) | ((mant & 0x3FFu) << 13);
}

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

static int allow_f16c = 1; /* tests turn it off to check the portable loops against torch too */

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

/* ---- Python glue -------------------------------------------------------------------------------- */

/* Get a read buffer of src and a writable buffer of dst (both or neither). The loops take their
 * pointers as `restrict` (no store can change a later load, so they vectorise), which holds only
 * for buffers that do not overlap: overlapping ones are refused. */
static int acquire(PyObject *src, PyObject *dst, Py_buffer *in, Py_buffer *out)
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

static PyObject *py_f32_to_f16(PyObject *self, PyObject *args)
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

static PyObject *py_f16_to_f32(PyObject *self, PyObject *args)
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

static PyObject *py_f32_to_bf16(PyObject *self, PyObject *args)
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

static PyObject *py_transpose(PyObject *self, PyObject *args)
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

static PyObject *py_transpose_f32_to_f16(PyObject *self, PyObject *args)
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

static PyObject *py_has_f16c(PyObject *self, PyObject *args)
{
#if HAVE_X86_F16C
    return PyBool_FromLong(allow_f16c && has_f16c());
#else
    Py_RETURN_FALSE;
#endif
}

static PyObject *py_use_f16c(PyObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    allow_f16c = on;
    Py_RETURN_NONE;
}

/* ---- value statistics (stats.py) ------------------------------------------------------------- */

/* One pass over a block of floats: over the finite elements their count, min, max, sum and sum of
 * squares of (x - shift) and sum of |x|, all in double; and the zero, NaN and infinity counts.
 * Four independent accumulator lanes keep the double additions from waiting on each other (the
 * order of additions differs from numpy's pairwise sums by rounding only). `kind`: 0 F32, 1 F64,
 * 2 F16, 3 BF16. */
typedef struct {
    Py_ssize_t finite, zeros, nans, infs;
    double lo, hi, s1, s2, sa;
} float_stats_t;

static inline double item_value(const byte *p, Py_ssize_t i, int kind, int *cls)
{
    /* cls: 0 finite non-zero, 1 zero, 2 NaN, 3 infinity */
    if (kind == 0) {
        uint32_t u = ld32(p, i);
        float f;
        memcpy(&f, &u, 4);
        *cls = ((u & 0x7f800000u) == 0x7f800000u) ? ((u & 0x007fffffu) ? 2 : 3) : ((u << 1) == 0);
        return (double)f;
    }
    if (kind == 1) {
        uint64_t u = ld64(p, i);
        double d;
        memcpy(&d, &u, 8);
        *cls = ((u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull) ? ((u & 0x000fffffffffffffull) ? 2 : 3)
                                                                       : ((u << 1) == 0);
        return d;
    }
    uint32_t u = kind == 2 ? f16_to_f32_bits(ld16(p, i)) : (uint32_t)ld16(p, i) << 16;
    float f;
    memcpy(&f, &u, 4);
    *cls = ((u & 0x7f800000u) == 0x7f800000u) ? ((u & 0x007fffffu) ? 2 : 3) : ((u << 1) == 0);
    return (double)f;
}

/* The slow path: every element classified (a sub-block holding a NaN or an infinity). */
static void stats_classified(const byte *p, Py_ssize_t from, Py_ssize_t to, int kind, double shift,
                             float_stats_t *r)
{
    for (Py_ssize_t i = from; i < to; i++) {
        int cls;
        double x = item_value(p, i, kind, &cls);
        if (cls == 2) {
            r->nans++;
            continue;
        }
        if (cls == 3) {
            r->infs++;
            continue;
        }
        double d = x - shift;
        r->finite++;
        r->zeros += cls;
        r->lo = x < r->lo ? x : r->lo;
        r->hi = x > r->hi ? x : r->hi;
        r->s1 += d;
        r->s2 += d * d;
        r->sa += fabs(x);
    }
}

#define SUB_BLOCK 8192

/* The fast path over one sub-block, assuming every element is finite: no branch per element, four
 * lanes. Returns 0 (and leaves `r` alone) if some element was not finite after all. */
#define DEFINE_FAST(NAME, LOAD)                                                                       \
    static int NAME(const byte *p, Py_ssize_t from, Py_ssize_t to, double shift, float_stats_t *r)   \
    {                                                                                                 \
        double lo0 = r->lo, lo1 = r->lo, lo2 = r->lo, lo3 = r->lo;                                    \
        double hi0 = r->hi, hi1 = r->hi, hi2 = r->hi, hi3 = r->hi;                                    \
        double a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0, c0 = 0, c1 = 0, c2 = 0, c3 = 0; \
        Py_ssize_t zeros = 0;                                                                         \
        int bad = 0, cls;                                                                             \
        Py_ssize_t i = from;                                                                          \
        for (; i + 4 <= to; i += 4) {                                                                 \
            double x0 = LOAD(p, i), x1 = LOAD(p, i + 1), x2 = LOAD(p, i + 2), x3 = LOAD(p, i + 3);    \
            bad |= !isfinite(x0) | !isfinite(x1) | !isfinite(x2) | !isfinite(x3);                     \
            zeros += (x0 == 0) + (x1 == 0) + (x2 == 0) + (x3 == 0);                                   \
            lo0 = x0 < lo0 ? x0 : lo0; lo1 = x1 < lo1 ? x1 : lo1;                                     \
            lo2 = x2 < lo2 ? x2 : lo2; lo3 = x3 < lo3 ? x3 : lo3;                                     \
            hi0 = x0 > hi0 ? x0 : hi0; hi1 = x1 > hi1 ? x1 : hi1;                                     \
            hi2 = x2 > hi2 ? x2 : hi2; hi3 = x3 > hi3 ? x3 : hi3;                                     \
            double d0 = x0 - shift, d1 = x1 - shift, d2 = x2 - shift, d3 = x3 - shift;                \
            a0 += d0; a1 += d1; a2 += d2; a3 += d3;                                                   \
            b0 += d0 * d0; b1 += d1 * d1; b2 += d2 * d2; b3 += d3 * d3;                               \
            c0 += fabs(x0); c1 += fabs(x1); c2 += fabs(x2); c3 += fabs(x3);                           \
        }                                                                                             \
        for (; i < to; i++) {                                                                         \
            double x = LOAD(p, i);                                                                    \
            bad |= !isfinite(x);                                                                      \
            zeros += x == 0;                                                                          \
            lo0 = x < lo0 ? x : lo0;                                                                  \
            hi0 = x > hi0 ? x : hi0;                                                                  \
            double d = x - shift;                                                                     \
            a0 += d; b0 += d * d; c0 += fabs(x);                                                      \
        }                                                                                             \
        (void)cls;                                                                                    \
        if (bad)                                                                                      \
            return 0;                                                                                 \
        lo0 = lo0 < lo1 ? lo0 : lo1; lo2 = lo2 < lo3 ? lo2 : lo3; r->lo = lo0 < lo2 ? lo0 : lo2;      \
        hi0 = hi0 > hi1 ? hi0 : hi1; hi2 = hi2 > hi3 ? hi2 : hi3; r->hi = hi0 > hi2 ? hi0 : hi2;      \
        r->s1 += (a0 + a1) + (a2 + a3);                                                               \
        r->s2 += (b0 + b1) + (b2 + b3);                                                               \
        r->sa += (c0 + c1) + (c2 + c3);                                                               \
        r->finite += to - from;                                                                       \
        r->zeros += zeros;                                                                            \
        return 1;                                                                                     \
    }

static inline double load_f32(const byte *p, Py_ssize_t i)
{
    uint32_t u = ld32(p, i);
    float f;
    memcpy(&f, &u, 4);
    return (double)f;
}
static inline double load_f64(const byte *p, Py_ssize_t i)
{
    uint64_t u = ld64(p, i);
    double d;
    memcpy(&d, &u, 8);
    return d;
}
static inline double load_f16(const byte *p, Py_ssize_t i)
{
    uint32_t u = f16_to_f32_bits(ld16(p, i));
    float f;
    memcpy(&f, &u, 4);
    return (double)f;
}
static inline double load_bf16(const byte *p, Py_ssize_t i)
{
    uint32_t u = (uint32_t)ld16(p, i) << 16;
    float f;
    memcpy(&f, &u, 4);
    return (double)f;
}
DEFINE_FAST(fast_f32, load_f32)
DEFINE_FAST(fast_f64, load_f64)
DEFINE_FAST(fast_f16, load_f16)
DEFINE_FAST(fast_bf16, load_bf16)

#if HAVE_X86_F16C
/* The same fast path with AVX2/FMA/F16C, chosen at run time: min and max in the elements' own
 * precision (exact), sums in two double lanes of four. Returns 0 if some element was not finite. */
#define AVX_TARGET __attribute__((target("avx2,fma,f16c")))

static inline AVX_TARGET double avx_hsum(__m256d a, __m256d b)
{
    double t[4];
    _mm256_storeu_pd(t, _mm256_add_pd(a, b));
    return (t[0] + t[1]) + (t[2] + t[3]);
}

/* How far ahead avx_fast asks for its bytes: the hardware prefetchers stop at every 4 KiB page and
 * the pages of a mapped file lie anywhere in memory, so without it each page starts with a cache
 * miss the loop waits for (it then runs at about half the speed of memcmp over the same bytes). */
#define STATS_PREFETCH 2048

/* Elements [from, to) as float32 lanes (F32, F16 or BF16; F64 goes through the scalar path). */
static AVX_TARGET int avx_fast(const byte *p, Py_ssize_t from, Py_ssize_t to, int kind, double shift,
                               float_stats_t *r)
{
    /* No per-element finiteness test: a NaN or an infinity makes the sums NaN or infinite, which
     * finite float32 values (squares below 2^257, at most SUB_BLOCK of them) never do. */
    const __m256d vshift = _mm256_set1_pd(shift), sign = _mm256_set1_pd(-0.0);
    __m256 lo = _mm256_set1_ps(HUGE_VALF), hi = _mm256_set1_ps(-HUGE_VALF);
    __m256d s1a = _mm256_setzero_pd(), s1b = s1a, s2a = s1a, s2b = s1a, saa = s1a, sab = s1a;
    __m256i zero_lanes = _mm256_setzero_si256(); /* minus the zeros seen per lane */
    Py_ssize_t i = from;
    const Py_ssize_t item = kind == 0 ? 4 : 2;
    const byte *end = p + to * item;
    for (; i + 8 <= to; i += 8) {
        __m256 v;
        const byte *q = p + i * item;
        if (q + STATS_PREFETCH < end)
            _mm_prefetch((const char *)(q + STATS_PREFETCH), _MM_HINT_T0);
        if (kind == 0)
            v = _mm256_loadu_ps((const float *)(const void *)(p + i * 4));
        else if (kind == 2)
            v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + i * 2)));
        else
            v = _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + i * 2))), 16));
        zero_lanes = _mm256_add_epi32(zero_lanes, _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_EQ_OQ)));
        lo = _mm256_min_ps(lo, v);
        hi = _mm256_max_ps(hi, v);
        __m256d x0 = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), x1 = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        __m256d d0 = _mm256_sub_pd(x0, vshift), d1 = _mm256_sub_pd(x1, vshift);
        s1a = _mm256_add_pd(s1a, d0);
        s1b = _mm256_add_pd(s1b, d1);
        s2a = _mm256_fmadd_pd(d0, d0, s2a);
        s2b = _mm256_fmadd_pd(d1, d1, s2b);
        saa = _mm256_add_pd(saa, _mm256_andnot_pd(sign, x0));
        sab = _mm256_add_pd(sab, _mm256_andnot_pd(sign, x1));
    }
    int32_t lanes[8];
    _mm256_storeu_si256((__m256i *)(void *)lanes, zero_lanes);
    Py_ssize_t zeros = 0;
    for (int k = 0; k < 8; k++)
        zeros -= lanes[k];
    double sum1 = avx_hsum(s1a, s1b), sum2 = avx_hsum(s2a, s2b), suma = avx_hsum(saa, sab);
    if (!isfinite(sum1) || !isfinite(sum2) || !isfinite(suma))
        return 0;
    float los[8], his[8];
    _mm256_storeu_ps(los, lo);
    _mm256_storeu_ps(his, hi);
    float_stats_t t;
    memset(&t, 0, sizeof t);
    t.lo = HUGE_VAL;
    t.hi = -HUGE_VAL;
    stats_classified(p, i, to, kind, shift, &t); /* the last < 8 elements */
    if (t.nans || t.infs)
        return 0;
    for (int k = 0; k < 8; k++) {
        t.lo = los[k] < t.lo ? los[k] : t.lo;
        t.hi = his[k] > t.hi ? his[k] : t.hi;
    }
    r->lo = t.lo < r->lo ? t.lo : r->lo;
    r->hi = t.hi > r->hi ? t.hi : r->hi;
    r->s1 += sum1 + t.s1;
    r->s2 += sum2 + t.s2;
    r->sa += suma + t.sa;
    r->finite += to - from;
    r->zeros += zeros + t.zeros;
    return 1;
}

static int has_avx2(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    }
    return known;
}
#endif

static void float_stats(const byte *p, Py_ssize_t n, int kind, double shift, float_stats_t *r)
{
    static int (*const fast[4])(const byte *, Py_ssize_t, Py_ssize_t, double, float_stats_t *) = {
        fast_f32, fast_f64, fast_f16, fast_bf16};
    memset(r, 0, sizeof *r);
    r->lo = HUGE_VAL;
    r->hi = -HUGE_VAL;
    for (Py_ssize_t from = 0; from < n; from += SUB_BLOCK) {
        Py_ssize_t to = from + SUB_BLOCK < n ? from + SUB_BLOCK : n;
#if HAVE_X86_F16C
        if (kind != 1 && allow_f16c && has_avx2()) {
            if (!avx_fast(p, from, to, kind, shift, r))
                stats_classified(p, from, to, kind, shift, r);
            continue;
        }
#endif
        if (!fast[kind](p, from, to, shift, r))
            stats_classified(p, from, to, kind, shift, r);
    }
}

static PyObject *py_float_stats(PyObject *self, PyObject *args)
{
    PyObject *src;
    int kind;
    double shift;
    Py_buffer in;
    if (!PyArg_ParseTuple(args, "Oid", &src, &kind, &shift))
        return NULL;
    if (kind < 0 || kind > 3) {
        PyErr_SetString(PyExc_ValueError, "kind must be 0 (F32), 1 (F64), 2 (F16) or 3 (BF16)");
        return NULL;
    }
    if (PyObject_GetBuffer(src, &in, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t item = kind == 0 ? 4 : kind == 1 ? 8 : 2;
    if (in.len % item != 0) {
        PyErr_Format(PyExc_ValueError, "buffer of %zd bytes is not whole %zd-byte elements", in.len, item);
        PyBuffer_Release(&in);
        return NULL;
    }
    float_stats_t r;
    Py_BEGIN_ALLOW_THREADS float_stats((const byte *)in.buf, in.len / item, kind, shift, &r);
    Py_END_ALLOW_THREADS PyBuffer_Release(&in);
    return Py_BuildValue("(ndddddnnn)", r.finite, r.lo, r.hi, r.s1, r.s2, r.sa, r.zeros, r.nans, r.infs);
}

/* ---- byte comparison (diff.py) ----------------------------------------------------------------- */

/* Whether two buffers hold the same bytes: memcmp without the GIL, for any buffer (a memoryview of
 * a mapped window included, which Python itself compares element by element). */
static PyObject *py_same_bytes(PyObject *self, PyObject *args)
{
    PyObject *a, *b;
    Py_buffer x, y;
    if (!PyArg_ParseTuple(args, "OO", &a, &b))
        return NULL;
    if (PyObject_GetBuffer(a, &x, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(b, &y, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    int same = x.len == y.len;
    if (same && x.len > 0) {
        Py_BEGIN_ALLOW_THREADS same = memcmp(x.buf, y.buf, (size_t)x.len) == 0;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    return PyBool_FromLong(same);
}

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

/* the K-quant quantizers, in their own section at the end of the file */
static void q2_k_quantize(const byte *src, byte *dst, Py_ssize_t nblocks);
static void q3_k_quantize(const byte *src, byte *dst, Py_ssize_t nblocks);
static void q4_k_quantize(const byte *src, byte *dst, Py_ssize_t nblocks);
static void q5_k_quantize(const byte *src, byte *dst, Py_ssize_t nblocks);
static void q6_k_quantize(const byte *src, byte *dst, Py_ssize_t nblocks);

static PyObject *py_gguf_blocks(PyObject *self, PyObject *args)
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

/* ==== merge kernels (transform/merging/arithmetic.py, issue 27) ===================================
 * float32 loops of the merges, without the GIL so a merge's bands are computed on every core.
 * merge_task_band gives the bits of the numpy code it replaces (the same float32 operations in the
 * same order); merge_dot3 and merge_abs_hist sum in float64, in another order than numpy's pairwise
 * sums (the sums feed a SLERP angle and an L1 ratio, which the tests compare to mergekit within 1e-6). */

static inline float ldf32(const byte *p, Py_ssize_t i) { float f; memcpy(&f, p + i * 4, 4); return f; }
static inline void stf32(byte *p, Py_ssize_t i, float f) { memcpy(p + i * 4, &f, 4); }

static int float32_buffers(PyObject *a, PyObject *b, Py_buffer *x, Py_buffer *y)
{
    if (PyObject_GetBuffer(a, x, PyBUF_SIMPLE) < 0)
        return -1;
    if (PyObject_GetBuffer(b, y, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(x);
        return -1;
    }
    if (x->len != y->len || x->len % 4 != 0) {
        PyErr_Format(PyExc_ValueError, "buffers of %zd and %zd bytes are not the same whole float32 elements",
                     x->len, y->len);
        PyBuffer_Release(x);
        PyBuffer_Release(y);
        return -1;
    }
    return 0;
}

/* (a.a, b.b, a.b) of two float32 vectors, each summed in float64 over four interleaved partial sums. */
static void dot3(const byte *a, const byte *b, Py_ssize_t n, double out[3])
{
    double aa[4] = {0, 0, 0, 0}, bb[4] = {0, 0, 0, 0}, ab[4] = {0, 0, 0, 0};
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4) {
        for (int k = 0; k < 4; k++) {
            double x = ldf32(a, i + k), y = ldf32(b, i + k);
            aa[k] += x * x;
            bb[k] += y * y;
            ab[k] += x * y;
        }
    }
    for (; i < n; i++) {
        double x = ldf32(a, i), y = ldf32(b, i);
        aa[0] += x * x;
        bb[0] += y * y;
        ab[0] += x * y;
    }
    out[0] = (aa[0] + aa[1]) + (aa[2] + aa[3]);
    out[1] = (bb[0] + bb[1]) + (bb[2] + bb[3]);
    out[2] = (ab[0] + ab[1]) + (ab[2] + ab[3]);
}

static PyObject *py_merge_dot3(PyObject *self, PyObject *args)
{
    PyObject *a, *b;
    Py_buffer x, y;
    double r[3];
    if (!PyArg_ParseTuple(args, "OO", &a, &b) || float32_buffers(a, b, &x, &y) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS dot3((const byte *)x.buf, (const byte *)y.buf, x.len / 4, r);
    Py_END_ALLOW_THREADS PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    return Py_BuildValue("(ddd)", r[0], r[1], r[2]);
}

/* The histogram steps of an exact k-th largest |x - base| (TIES's magnitude trim): a non-negative
 * float32 orders as its bit pattern, so the k-th largest is found 16 bits at a time. prefix < 0:
 * count each element in the bin of the top 16 bits of |x - base| and add |x - base| to that bin's
 * float64 sum; prefix >= 0: only the elements whose top 16 bits are `prefix`, binned by the low 16.
 * The float32 difference is the one numpy computes; NaN sorts above infinity, as numpy's partition, and
 * is counted in sums[65536] instead of summed. */
#define MERGE_BINS 65536

static void abs_hist(const byte *x, const byte *base, Py_ssize_t n, long prefix, uint64_t *counts, double *sums)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        float d = ldf32(x, i) - ldf32(base, i);
        uint32_t u;
        memcpy(&u, &d, 4);
        u &= 0x7FFFFFFFu;
        uint32_t bin = u >> 16;
        if (prefix >= 0) {
            if ((long)bin != prefix)
                continue;
            bin = u & 0xFFFFu;
        }
        counts[bin] += 1;
        if (sums == NULL)
            continue;
        if (u > 0x7F800000u) { /* NaN: counted where it sorts, summed apart (numpy's sum where >= t skips it) */
            sums[MERGE_BINS] += 1;
            continue;
        }
        float m;
        memcpy(&m, &u, 4);
        sums[bin] += (double)m;
    }
}

static PyObject *py_merge_abs_hist(PyObject *self, PyObject *args)
{
    PyObject *a, *b, *c, *s, *result = NULL;
    long prefix;
    Py_buffer x, y, cb, sb;
    if (!PyArg_ParseTuple(args, "OOOOl", &a, &b, &c, &s, &prefix) || float32_buffers(a, b, &x, &y) < 0)
        return NULL;
    int with_sums = s != Py_None, have_c = 0, have_s = 0;
    uint64_t *counts = NULL;
    double *sums = NULL;
    if (PyObject_GetBuffer(c, &cb, PyBUF_WRITABLE) < 0)
        goto done;
    have_c = 1;
    if (with_sums) {
        if (PyObject_GetBuffer(s, &sb, PyBUF_WRITABLE) < 0)
            goto done;
        have_s = 1;
    }
    if (cb.len != MERGE_BINS * 8 || (with_sums && sb.len != (MERGE_BINS + 1) * 8) || prefix >= MERGE_BINS) {
        PyErr_SetString(PyExc_ValueError, "counts hold 65536 uint64 bins, sums 65536 + 1 float64; prefix < 65536");
        goto done;
    }
    counts = PyMem_RawCalloc(MERGE_BINS, sizeof(uint64_t));
    sums = with_sums ? PyMem_RawCalloc(MERGE_BINS + 1, sizeof(double)) : NULL;
    if (counts == NULL || (with_sums && sums == NULL)) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS abs_hist((const byte *)x.buf, (const byte *)y.buf, x.len / 4, prefix, counts, sums);
    for (Py_ssize_t i = 0; i <= MERGE_BINS; i++) { /* added into the caller's bins */
        if (with_sums) {
            double total;
            memcpy(&total, (const byte *)sb.buf + i * 8, 8);
            total += sums[i];
            memcpy((byte *)sb.buf + i * 8, &total, 8);
        }
        if (i < MERGE_BINS)
            st64((byte *)cb.buf, i, ld64((const byte *)cb.buf, i) + counts[i]);
    }
    Py_END_ALLOW_THREADS result = Py_None;
    Py_INCREF(result);
done:
    PyMem_RawFree(counts);
    PyMem_RawFree(sums);
    if (have_s)
        PyBuffer_Release(&sb);
    if (have_c)
        PyBuffer_Release(&cb);
    PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    return result;
}

/* One band of task arithmetic (task_arithmetic, TIES; DARE draws its masks in numpy), fused: per
 * element, d_i = x_i - base, zeroed where |d_i| < threshold_i (NaN: no trim), times factor_i, times
 * weight_i (a factor of 1 where numpy skips the step: x * 1 is x); then consensus 0: mixed = d_0 + d_1 + ..., over `divisor`; 1 (sum) or 2
 * (count): the sign of sum d_i (or of sum sign(d_i)) elects +1 (>= 0) or -1, mixed and the divisor
 * add the d_i and w_i whose sign is the elected one (a zero divisor is 1); mixed / divisor when
 * `normalize`, times lambda (1: none), out = base + mixed. arithmetic._TaskArithmetic.band's
 * numpy code, operation for operation. */
#define MERGE_MAX_MODELS 64

typedef struct {
    Py_ssize_t n;
    int models, consensus, normalize;
    float threshold[MERGE_MAX_MODELS], factor[MERGE_MAX_MODELS], weight[MERGE_MAX_MODELS];
    float divisor, lambda;
    const byte *base;
    const byte *x[MERGE_MAX_MODELS];
    byte *out;
} task_band_t;

static inline float sign_of(float d) { return d > 0 ? 1.0f : d < 0 ? -1.0f : d == 0 ? 0.0f : d; }

/* Blocks of TASK_BLOCK elements, each step a loop over the block with no branch on the data (selects),
 * so that the compiler vectorizes it; `scratch` holds (models + 3) x TASK_BLOCK floats. */
#define TASK_BLOCK 256

static void task_band(const task_band_t *t, float *scratch)
{
    float *b = scratch, *mixed = b + TASK_BLOCK, *div = mixed + TASK_BLOCK, *d = div + TASK_BLOCK;
    for (Py_ssize_t j0 = 0; j0 < t->n; j0 += TASK_BLOCK) {
        int nb = (int)(t->n - j0 < TASK_BLOCK ? t->n - j0 : TASK_BLOCK);
        memcpy(b, t->base + j0 * 4, (size_t)nb * 4);
        for (int i = 0; i < t->models; i++) {
            float *di = d + i * TASK_BLOCK;
            const float thr = t->threshold[i], f = t->factor[i], w = t->weight[i];
            memcpy(di, t->x[i] + j0 * 4, (size_t)nb * 4);
            for (int j = 0; j < nb; j++) {
                float v = di[j] - b[j];
                di[j] = fabsf(v) < thr ? 0.0f : v;
            }
            for (int j = 0; j < nb; j++)
                di[j] *= f;
            for (int j = 0; j < nb; j++)
                di[j] *= w;
        }
        if (t->consensus == 0) {
            memcpy(mixed, d, (size_t)nb * 4);
            for (int i = 1; i < t->models; i++)
                for (int j = 0; j < nb; j++)
                    mixed[j] += d[i * TASK_BLOCK + j];
            for (int j = 0; j < nb; j++)
                div[j] = t->divisor;
        } else {
            float *vote = mixed; /* the vote, then the elected sign, live in `mixed` until the sums start */
            if (t->consensus == 1)
                memcpy(vote, d, (size_t)nb * 4);
            else
                for (int j = 0; j < nb; j++)
                    vote[j] = sign_of(d[j]);
            for (int i = 1; i < t->models; i++)
                for (int j = 0; j < nb; j++)
                    vote[j] += t->consensus == 1 ? d[i * TASK_BLOCK + j] : sign_of(d[i * TASK_BLOCK + j]);
            /* elected +1 where vote >= 0 (NaN: -1); a term agrees when its sign is the elected one: d > 0
             * or d < 0 (0 and NaN never agree). Terms are masked by bits (v & mask), not by a branch: a
             * term that does not agree adds +0, as numpy's where(agrees, d, 0). */
            uint32_t *up = (uint32_t *)(void *)(d + t->models * TASK_BLOCK);
            for (int j = 0; j < nb; j++) {
                up[j] = vote[j] >= 0 ? 0xFFFFFFFFu : 0u;
                mixed[j] = 0.0f;
                div[j] = 0.0f;
            }
            for (int i = 0; i < t->models; i++) {
                const float *di = d + i * TASK_BLOCK;
                uint32_t wbits;
                memcpy(&wbits, &t->weight[i], 4);
                for (int j = 0; j < nb; j++) {
                    uint32_t pos = di[j] > 0 ? 0xFFFFFFFFu : 0u, neg = di[j] < 0 ? 0xFFFFFFFFu : 0u;
                    uint32_t agree = (pos & up[j]) | (neg & ~up[j]), vbits, tb;
                    float term, weight;
                    memcpy(&vbits, &di[j], 4);
                    tb = vbits & agree;
                    memcpy(&term, &tb, 4);
                    tb = wbits & agree;
                    memcpy(&weight, &tb, 4);
                    mixed[j] += term;
                    div[j] += weight;
                }
            }
            for (int j = 0; j < nb; j++)
                div[j] = div[j] == 0 ? 1.0f : div[j];
        }
        if (t->normalize)
            for (int j = 0; j < nb; j++)
                mixed[j] /= div[j];
        for (int j = 0; j < nb; j++)
            mixed[j] *= t->lambda;
        for (int j = 0; j < nb; j++)
            mixed[j] = b[j] + mixed[j];
        memcpy(t->out + j0 * 4, mixed, (size_t)nb * 4);
    }
}

static PyObject *py_merge_task_band(PyObject *self, PyObject *args)
{
    PyObject *base, *models, *params, *out;
    int consensus, normalize;
    double divisor, lambda;
    if (!PyArg_ParseTuple(args, "OOOiiddO", &base, &models, &params, &consensus, &normalize, &divisor, &lambda,
                          &out))
        return NULL;
    task_band_t t;
    memset(&t, 0, sizeof t);
    Py_ssize_t m = PySequence_Size(models);
    if (m < 1 || m > MERGE_MAX_MODELS || PySequence_Size(params) != m || consensus < 0 || consensus > 2) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "1 to %d models, one (threshold, factor, weight) each, consensus 0-2",
                         MERGE_MAX_MODELS);
        return NULL;
    }
    Py_buffer bufs[MERGE_MAX_MODELS + 2];
    int held = 0, ok = 1;
    if (PyObject_GetBuffer(base, &bufs[held], PyBUF_SIMPLE) < 0)
        return NULL;
    held++;
    if (PyObject_GetBuffer(out, &bufs[held], PyBUF_WRITABLE) < 0)
        ok = 0;
    else
        held++;
    for (Py_ssize_t i = 0; ok && i < m; i++) {
        PyObject *item = PySequence_GetItem(models, i);
        if (item == NULL || PyObject_GetBuffer(item, &bufs[held], PyBUF_SIMPLE) < 0)
            ok = 0;
        else
            held++;
        Py_XDECREF(item);
        PyObject *p = ok ? PySequence_GetItem(params, i) : NULL;
        double thr, fac, w;
        if (ok && (p == NULL || !PyArg_ParseTuple(p, "ddd", &thr, &fac, &w)))
            ok = 0;
        Py_XDECREF(p);
        if (ok) {
            t.threshold[i] = (float)thr;
            t.factor[i] = (float)fac;
            t.weight[i] = (float)w;
        }
    }
    if (ok) {
        Py_ssize_t len = bufs[0].len;
        for (int i = 1; i < held; i++)
            ok &= bufs[i].len == len;
        if (!ok || len % 4 != 0)
            PyErr_SetString(PyExc_ValueError, "base, models and out must be the same whole float32 elements");
        ok = ok && len % 4 == 0;
    }
    if (ok) {
        t.n = bufs[0].len / 4;
        t.models = (int)m;
        t.consensus = consensus;
        t.normalize = normalize;
        t.divisor = (float)divisor;
        t.lambda = (float)lambda;
        t.base = (const byte *)bufs[0].buf;
        t.out = (byte *)bufs[1].buf;
        for (int i = 0; i < t.models; i++)
            t.x[i] = (const byte *)bufs[2 + i].buf;
        float *scratch = PyMem_RawMalloc((size_t)(t.models + 4) * TASK_BLOCK * sizeof(float));
        if (scratch == NULL) {
            PyErr_NoMemory();
            ok = 0;
        } else {
            Py_BEGIN_ALLOW_THREADS task_band(&t, scratch);
            Py_END_ALLOW_THREADS PyMem_RawFree(scratch);
        }
    }
    for (int i = 0; i < held; i++)
        PyBuffer_Release(&bufs[i]);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* One band of a weighted sum: out = ((x_0 w_0 + x_1 w_1) + ...) / divisor (if `divide`), float32,
 * in the order of arithmetic._Linear.band's numpy code (and SLERP's c_a a + c_b b): the same bits. */
static void linear_band(const byte *const *x, const float *w, int m, float divisor, int divide, byte *out,
                        Py_ssize_t n)
{
    for (Py_ssize_t j = 0; j < n; j++) {
        float acc = ldf32(x[0], j) * w[0];
        for (int i = 1; i < m; i++) {
            float term = ldf32(x[i], j) * w[i];
            acc += term;
        }
        if (divide)
            acc /= divisor;
        stf32(out, j, acc);
    }
}

static PyObject *py_merge_linear_band(PyObject *self, PyObject *args)
{
    PyObject *inputs, *weights, *out;
    double divisor;
    int divide;
    if (!PyArg_ParseTuple(args, "OOidO", &inputs, &weights, &divide, &divisor, &out))
        return NULL;
    Py_ssize_t m = PySequence_Size(inputs);
    if (m < 1 || m > MERGE_MAX_MODELS || PySequence_Size(weights) != m) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "1 to %d inputs, one weight each", MERGE_MAX_MODELS);
        return NULL;
    }
    Py_buffer bufs[MERGE_MAX_MODELS + 1];
    const byte *x[MERGE_MAX_MODELS];
    float w[MERGE_MAX_MODELS];
    int held = 0, ok = 1;
    if (PyObject_GetBuffer(out, &bufs[held], PyBUF_WRITABLE) < 0)
        return NULL;
    held++;
    for (Py_ssize_t i = 0; ok && i < m; i++) {
        PyObject *item = PySequence_GetItem(inputs, i);
        if (item == NULL || PyObject_GetBuffer(item, &bufs[held], PyBUF_SIMPLE) < 0)
            ok = 0;
        else
            held++;
        Py_XDECREF(item);
        PyObject *wi = ok ? PySequence_GetItem(weights, i) : NULL;
        double v = wi == NULL ? 0 : PyFloat_AsDouble(wi);
        Py_XDECREF(wi);
        if (ok && (wi == NULL || (v == -1.0 && PyErr_Occurred())))
            ok = 0;
        w[i] = (float)v;
    }
    if (ok) {
        for (int i = 1; i < held; i++) {
            x[i - 1] = (const byte *)bufs[i].buf;
            ok &= bufs[i].len == bufs[0].len;
        }
        if (!ok || bufs[0].len % 4 != 0) {
            PyErr_SetString(PyExc_ValueError, "inputs and out must be the same whole float32 elements");
            ok = 0;
        }
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS linear_band(x, w, (int)m, (float)divisor, divide, (byte *)bufs[0].buf,
                                           bufs[0].len / 4);
        Py_END_ALLOW_THREADS
    }
    for (int i = 0; i < held; i++)
        PyBuffer_Release(&bufs[i]);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* ==== end of the merge kernels ================================================================== */

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
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "migrator._kernels", "Compiled cast and transpose loops (optional).", -1, methods,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }

/* ---- GGUF K-quants: quantizing (formats/gguf/quants.py) -----------------------------------------
 * The K-quant block formats made from float32 values, bit-equal to ggml's reference quantizers (what
 * llama-quantize runs without an importance matrix). Each type stores a 256-value super-block as
 * sub-blocks of 16 or 32 values, each with its own small integer scale (and, for Q2_K/Q4_K/Q5_K, a
 * minimum) relative to one or two f16 factors per super-block.
 *
 * The fit is a search: for each sub-block a few candidate scales are tried and the one with the
 * smallest weighted error (or the best least-squares score) kept. Every float operation happens in
 * the order ggml's reference code does it (sums accumulated element by element, products left to
 * right, no fused multiply-adds), since a one-ulp difference in a score can pick another candidate
 * and change whole bytes. Rounding uses the same trick as ggml (add 1.5 * 2^23 and read the low
 * mantissa bits), which is round-half-to-even in range and gives the same bits out of range. */

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define KQ_EPS 1e-15f /* a sub-block whose largest |x| is below this is all zero */

static inline int kq_round(float v)
{
    float t = v + 12582912.0f; /* 1.5 * 2^23: the sum's mantissa holds v rounded to an integer */
    int32_t bits;
    memcpy(&bits, &t, 4);
    return (bits & 0x007FFFFF) - 0x00400000;
}

static inline int kq_clamp(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static inline uint16_t kq_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return f32_to_f16_bits(u);
}

static inline float kq_from_f16(uint16_t h)
{
    uint32_t u = f16_to_f32_bits(h);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* x ~ scale * q - m with integers q in [0, nmax] and m >= 0: the weighted fit of Q2_K/Q4_K/Q5_K.
 * Starts from the min/max grid, then tries nstep + 1 grids of (nmax + rmin + rdelta * s) steps over
 * the range, each refined by least squares; the lowest weighted error (squared, or absolute when
 * use_abs) wins. The range's low end moves to each accepted fit's minimum, as in ggml. */
static float kq_fit_offset(const float *x, const float *w, int n, int nmax, float rmin, float rdelta, int nstep,
                           int use_abs, uint8_t *q, float *m_out)
{
    float lo = x[0], hi = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {
        memset(q, 0, (size_t)n);
        *m_out = -lo;
        return 0.0f;
    }
    float iscale = nmax / (hi - lo), scale = 1 / iscale, best = 0;
    for (int i = 0; i < n; i++) {
        q[i] = (uint8_t)kq_clamp(kq_round(iscale * (x[i] - lo)), 0, nmax);
        float e = scale * q[i] + lo - x[i];
        best += w[i] * (use_abs ? fabsf(e) : e * e);
    }
    uint8_t trial[32];
    for (int s = 0; s <= nstep; s++) {
        iscale = (rmin + rdelta * s + nmax) / (hi - lo);
        float sum_q = 0, sum_q2 = 0, sum_xq = 0;
        for (int i = 0; i < n; i++) {
            int l = kq_clamp(kq_round(iscale * (x[i] - lo)), 0, nmax);
            trial[i] = (uint8_t)l;
            float wl = w[i] * l;
            sum_q += wl;
            sum_q2 += wl * l;
            sum_xq += wl * x[i];
        }
        float det = sum_w * sum_q2 - sum_q * sum_q;
        if (!(det > 0))
            continue;
        float this_scale = (sum_w * sum_xq - sum_x * sum_q) / det;
        float this_lo = (sum_q2 * sum_x - sum_q * sum_xq) / det;
        if (this_lo > 0) {
            this_lo = 0;
            this_scale = sum_xq / sum_q2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            float e = this_scale * trial[i] + this_lo - x[i];
            err += w[i] * (use_abs ? fabsf(e) : e * e);
        }
        if (err < best) {
            memcpy(q, trial, (size_t)n);
            best = err;
            scale = this_scale;
            lo = this_lo;
        }
    }
    *m_out = -lo;
    return scale;
}

/* The value of largest magnitude among x[0..n) (the first of equal ones), with its sign; 0 when all are 0. */
static float kq_signed_max(const float *x, int n)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) {
            amax = a;
            max = x[i];
        }
    }
    return max;
}

/* x ~ scale * (q - nmax) with q in [0, 2 nmax), weights x^2: Q6_K's sub-block fit (n <= 16). The step that maps
 * the value of largest magnitude to -nmax, then 18 nearby steps, kept when their least-squares score
 * sum(w x l)^2 / sum(w l^2) is higher. */
static float kq_fit_signed(const float *x, int n, int nmax, uint8_t *q)
{
    float max = kq_signed_max(x, n);
    if (fabsf(max) < KQ_EPS) {
        memset(q, 0, (size_t)n);
        return 0.0f;
    }
    float w[16], wx[16]; /* the weights x^2 and x^3 (w * x, the same product each candidate takes) */
    for (int i = 0; i < n; i++) {
        w[i] = x[i] * x[i];
        wx[i] = w[i] * x[i];
    }
    float iscale = -nmax / max, sum_xl = 0, sum_l2 = 0;
    for (int i = 0; i < n; i++) {
        int l = kq_clamp(kq_round(iscale * x[i]), -nmax, nmax - 1);
        q[i] = (uint8_t)(l + nmax);
        sum_xl += wx[i] * l;
        sum_l2 += w[i] * l * l;
    }
    float scale = sum_l2 != 0 ? sum_xl / sum_l2 : 0.0f, best = scale * sum_xl;
    for (int s = -9; s <= 9; s++) {
        if (s == 0)
            continue;
        iscale = -(nmax + 0.1f * s) / max;
        float xl = 0, l2 = 0;
        for (int i = 0; i < n; i++) {
            int l = kq_clamp(kq_round(iscale * x[i]), -nmax, nmax - 1);
            xl += wx[i] * l;
            l2 += w[i] * l * l;
        }
        if (l2 > 0 && xl * xl > best * l2) {
            for (int i = 0; i < n; i++)
                q[i] = (uint8_t)(kq_clamp(kq_round(iscale * x[i]), -nmax, nmax - 1) + nmax);
            scale = xl / l2;
            best = scale * xl;
        }
    }
    return scale;
}

/* Q3_K's sub-block fit: x ~ scale * l with l in [-nmax, nmax), weights x^2; from the largest-magnitude
 * step, up to 5 sweeps that move single values to the level their least-squares residual asks for
 * when that raises the score. q holds l + nmax (all 0 for an all-zero sub-block). */
static float kq_fit_signed_sweep(const float *x, int n, int nmax, uint8_t *q)
{
    float max = kq_signed_max(x, n);
    if (fabsf(max) < KQ_EPS) {
        memset(q, 0, (size_t)n);
        return 0.0f;
    }
    int l[32];
    float iscale = -nmax / max, sum_xl = 0, sum_l2 = 0;
    for (int i = 0; i < n; i++) {
        l[i] = kq_clamp(kq_round(iscale * x[i]), -nmax, nmax - 1);
        float w = x[i] * x[i];
        sum_xl += w * x[i] * l[i];
        sum_l2 += w * l[i] * l[i];
    }
    for (int sweep = 0; sweep < 5; sweep++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float xl = sum_xl - w * x[i] * l[i];
            if (!(xl > 0))
                continue;
            float l2 = sum_l2 - w * l[i] * l[i];
            int moved = kq_clamp(kq_round(x[i] * l2 / xl), -nmax, nmax - 1);
            if (moved == l[i])
                continue;
            xl += w * x[i] * moved;
            l2 += w * moved * moved;
            if (l2 > 0 && xl * xl * sum_l2 > sum_xl * sum_xl * l2) {
                l[i] = moved;
                sum_xl = xl;
                sum_l2 = l2;
                changed++;
            }
        }
        if (!changed)
            break;
    }
    for (int i = 0; i < n; i++)
        q[i] = (uint8_t)(l[i] + nmax);
    return sum_l2 > 0 ? sum_xl / sum_l2 : 0.0f;
}

/* Q4_K (nmax 15) and Q5_K (nmax 31): d f16 | dmin f16 | 8 six-bit scales and mins in 12 bytes |
 * (Q5_K: qh[32], bit 2c/2c+1 of byte j the fifth bit of value j of sub-block 2c/2c+1) | nibbles, 32 bytes
 * per pair of sub-blocks (low nibbles the first, high nibbles the second). */
static void kq_q45_k(const float *x, byte *out, int nmax)
{
    uint8_t q[256], ls[8], lm[8];
    float scales[8], mins[8], w[32], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++)
            sum_x2 += xs[l] * xs[l];
        float av = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++)
            w[l] = av + fabsf(xs[l]);
        scales[j] = nmax == 15 ? kq_fit_offset(xs, w, 32, 15, -1.0f, 0.1f, 20, 0, q + 32 * j, &mins[j])
                               : kq_fit_offset(xs, w, 32, 31, -0.5f, 0.1f, 15, 0, q + 32 * j, &mins[j]);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    byte *s = out + 4;
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)kq_round(inv_scale * scales[j]);
        lm[j] = (uint8_t)kq_round(inv_min * mins[j]);
        if (ls[j] > 63) ls[j] = 63;
        if (lm[j] > 63) lm[j] = 63;
    }
    for (int j = 0; j < 4; j++) { /* the low 6 bits of 0-3; 4-7 split into a nibble and 2 top bits */
        s[j] = (byte)(ls[j] | ((ls[j + 4] >> 4) << 6));
        s[j + 4] = (byte)(lm[j] | ((lm[j + 4] >> 4) << 6));
        s[j + 8] = (byte)((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
    }
    uint16_t d = kq_to_f16(max_scale / 63.f), dmin = kq_to_f16(max_min / 63.f);
    st16(out, 0, d);
    st16(out, 1, dmin);
    float df = kq_from_f16(d), dmf = kq_from_f16(dmin);
    for (int j = 0; j < 8; j++) { /* requantize against the stored (rounded) scales */
        float dj = df * ls[j];
        if (dj == 0)
            continue;
        float mj = dmf * lm[j];
        for (int l = 0; l < 32; l++)
            q[32 * j + l] = (uint8_t)kq_clamp(kq_round((x[32 * j + l] + mj) / dj), 0, nmax);
    }
    if (nmax == 15) {
        byte *qs = out + 16;
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                qs[32 * c + l] = (byte)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
        return;
    }
    byte *qh = out + 16, *qs = out + 48;
    memset(qh, 0, 32);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int a = q[64 * c + l], b = q[64 * c + 32 + l];
            qh[l] |= (byte)(((a >> 4) << (2 * c)) | ((b >> 4) << (2 * c + 1)));
            qs[32 * c + l] = (byte)((a & 0xF) | ((b & 0xF) << 4));
        }
}

/* Q6_K: ql[128] (low nibbles) | qh[64] (top 2 bits) | 16 int8 scales | d f16. Values of each 128-half:
 * ql byte l holds values l and l+64 (low/high nibble), byte l+32 values l+32 and l+96; qh byte l the top
 * bits of l, l+32, l+64, l+96. */
static void kq_q6_k(const float *x, byte *out)
{
    uint8_t q[256];
    float scales[16], max_scale = 0, max_abs = 0;
    for (int j = 0; j < 16; j++) {
        scales[j] = kq_fit_signed(x + 16 * j, 16, 32, q + 16 * j);
        float a = fabsf(scales[j]);
        if (a > max_abs) {
            max_abs = a;
            max_scale = scales[j];
        }
    }
    if (max_abs < KQ_EPS) {
        memset(out, 0, 210);
        return;
    }
    float iscale = -128.f / max_scale;
    uint16_t d = kq_to_f16(1 / iscale);
    st16(out + 208, 0, d);
    float df = kq_from_f16(d);
    int8_t *sc = (int8_t *)(out + 192);
    for (int j = 0; j < 16; j++) {
        int v = kq_round(iscale * scales[j]);
        sc[j] = (int8_t)(byte)(v < 127 ? v : 127);
    }
    for (int j = 0; j < 16; j++) {
        float dj = df * sc[j];
        if (dj == 0)
            continue;
        for (int l = 0; l < 16; l++)
            q[16 * j + l] = (uint8_t)(kq_clamp(kq_round(x[16 * j + l] / dj), -32, 31) + 32);
    }
    for (int h = 0; h < 2; h++) {
        const uint8_t *v = q + 128 * h;
        byte *ql = out + 64 * h, *qh = out + 128 + 32 * h;
        for (int l = 0; l < 32; l++) {
            ql[l] = (byte)((v[l] & 0xF) | ((v[l + 64] & 0xF) << 4));
            ql[l + 32] = (byte)((v[l + 32] & 0xF) | ((v[l + 96] & 0xF) << 4));
            qh[l] = (byte)((v[l] >> 4) | ((v[l + 32] >> 4) << 2) | ((v[l + 64] >> 4) << 4) | ((v[l + 96] >> 4) << 6));
        }
    }
}

/* 2-bit fields of a 128-value half: byte l of the 32 holds values l, l+32, l+64, l+96 (Q2_K, Q3_K). */
static void kq_pack_2bit(const uint8_t *q, byte *qs)
{
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *v = q + 128 * h + l;
            qs[32 * h + l] = (byte)(v[0] | (v[32] << 2) | (v[64] << 4) | (v[96] << 6));
        }
}

/* Q3_K: hmask[32] (bit j/32 of byte j%32: value j's third bit) | qs[64] (low 2 bits) | 16 six-bit
 * scales in 12 bytes (low nibbles in bytes 0-7, top 2 bits in bytes 8-11) | d f16. */
static void kq_q3_k(const float *x, byte *out)
{
    uint8_t q[256], lv[16];
    float scales[16];
    for (int j = 0; j < 16; j++)
        scales[j] = kq_fit_signed_sweep(x + 16 * j, 16, 4, q + 16 * j);
    float max_scale = kq_signed_max(scales, 16);
    byte *s = out + 96;
    memset(s, 0, 12);
    uint16_t d = 0;
    if (max_scale != 0) {
        float iscale = -32.f / max_scale;
        for (int j = 0; j < 16; j++) {
            int v = (int8_t)(byte)kq_round(iscale * scales[j]); /* ggml keeps the low byte, signed */
            lv[j] = (uint8_t)(kq_clamp(v, -32, 31) + 32);
            s[j % 8] |= (byte)((lv[j] & 0xF) << (4 * (j / 8)));
            s[8 + j % 4] |= (byte)((lv[j] >> 4) << (2 * (j / 4)));
        }
        d = kq_to_f16(1 / iscale);
    } else {
        memset(lv, 0, sizeof lv);
    }
    st16(out + 108, 0, d);
    float df = kq_from_f16(d);
    for (int j = 0; j < 16; j++) {
        float dj = df * (lv[j] - 32);
        if (dj == 0)
            continue;
        for (int l = 0; l < 16; l++)
            q[16 * j + l] = (uint8_t)(kq_clamp(kq_round(x[16 * j + l] / dj), -4, 3) + 4);
    }
    byte *hmask = out;
    memset(hmask, 0, 32);
    for (int j = 0; j < 256; j++)
        if (q[j] > 3) {
            hmask[j % 32] |= (byte)(1u << (j / 32));
            q[j] -= 4;
        }
    kq_pack_2bit(q, out + 32);
}

/* Q2_K: 16 scale bytes (low nibble: scale, high nibble: min) | qs[64] | d f16 | dmin f16. */
static void kq_q2_k(const float *x, byte *out)
{
    uint8_t q[256];
    float scales[16], mins[16], w[16], max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; j++) {
        for (int l = 0; l < 16; l++)
            w[l] = fabsf(x[16 * j + l]);
        scales[j] = kq_fit_offset(x + 16 * j, w, 16, 3, -0.5f, 0.1f, 15, 1, q + 16 * j, &mins[j]);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    byte *s = out;
    uint16_t d = 0, dmin = 0;
    memset(s, 0, 16);
    if (max_scale > 0) {
        float iscale = 15.f / max_scale;
        for (int j = 0; j < 16; j++)
            s[j] = (byte)kq_round(iscale * scales[j]);
        d = kq_to_f16(max_scale / 15.f);
    }
    if (max_min > 0) {
        float iscale = 15.f / max_min;
        for (int j = 0; j < 16; j++)
            s[j] |= (byte)((unsigned)kq_round(iscale * mins[j]) << 4);
        dmin = kq_to_f16(max_min / 15.f);
    }
    st16(out + 80, 0, d);
    st16(out + 82, 0, dmin);
    float df = kq_from_f16(d), dmf = kq_from_f16(dmin);
    for (int j = 0; j < 16; j++) {
        float dj = df * (s[j] & 0xF);
        if (dj == 0)
            continue;
        float mj = dmf * (s[j] >> 4);
        for (int l = 0; l < 16; l++)
            q[16 * j + l] = (uint8_t)kq_clamp(kq_round((x[16 * j + l] + mj) / dj), 0, 3);
    }
    kq_pack_2bit(q, out + 16);
}

#define KQ_LOOP(NAME, SIZE, BODY)                                                                 \
    static void NAME(const byte *src, byte *dst, Py_ssize_t nblocks)                              \
    {                                                                                             \
        float x[256];                                                                             \
        for (Py_ssize_t b = 0; b < nblocks; b++) {                                                \
            memcpy(x, src + b * 1024, sizeof x); /* the source may sit at any byte address */    \
            byte *out = dst + b * (SIZE);                                                         \
            BODY;                                                                                 \
        }                                                                                         \
    }

KQ_LOOP(q2_k_quantize, 84, kq_q2_k(x, out))
KQ_LOOP(q3_k_quantize, 110, kq_q3_k(x, out))
KQ_LOOP(q4_k_quantize, 144, kq_q45_k(x, out, 15))
KQ_LOOP(q5_k_quantize, 176, kq_q45_k(x, out, 31))
KQ_LOOP(q6_k_quantize, 210, kq_q6_k(x, out))
