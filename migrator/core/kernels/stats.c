#include "kernels.h"

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

PyObject *py_float_stats(PyObject *self, PyObject *args)
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
PyObject *py_same_bytes(PyObject *self, PyObject *args)
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
