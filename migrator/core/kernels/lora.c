#include "kernels.h"

/* ==== LoRA delta band (transform/merging/lora.py) ===================================================
 * Rows of scaling * (B @ A) in float32, computed element by element in the order torch's CPU matmul
 * (MKL's sgemm) uses for the same product, so that a LoRA fold gives the bits of PEFT's
 * merge_and_unload (docs/merging.md, "Matching PEFT", has the measurements behind each rule):
 *
 * - fused (torch's B @ A with at least 4 rows and 12 columns): acc = +0, then
 *   acc = fmaf(b[k], a[k], acc) for k in order, one rounding per step; a long sum is cut into blocks
 *   of `block` products (the caller's rule: lora_product.torch_order), each block such a chain from
 *   +0, and the block sums added in order, then to +0 (a -0 comes out +0);
 * - plain (torch's smaller products): acc = +0, then acc = acc + b[k] * a[k], the product and the
 *   sum each rounded;
 * - product (rank 1 with at least 2 rows and 2 columns): b[0] * a[0], without the +0 (only the sign
 *   of a zero differs).
 *
 * Then each value is multiplied by scaling (rounded to float32 first, as torch does with a Python
 * float), a separate rounding as in PEFT's `(B @ A) * scaling`.
 *
 * The file is built with -ffp-contract=off (setup.py): the compiler may not fuse the plain path's
 * multiply and add (a target with FMA would otherwise round the two once), and an fmaf is fused
 * because the code asks for it. With AVX2 and FMA (checked at run time; lora_use_fma(False) turns
 * it off for the tests) blocks of 4 rows by 16 columns are summed in registers with intrinsics; the
 * portable loops (the rest, and CPUs without FMA) have the column loop innermost so it vectorises,
 * with fmaf from the C library (correctly rounded, slower where the CPU has no FMA). Columns go in
 * tiles, so one tile of A's rows stays in the L1 cache while every row of the band passes over it.
 * At 4096x4096, rank 16, one thread: about as fast as OpenBLAS's sgemm into the same buffer. */

#define LORA_TILE 256 /* columns a tile: A's tile (rank x 1 KiB) stays in L1 for the ranks LoRA uses */
#define LORA_GROUP 32 /* columns whose sums are held in registers (four AVX vectors) over the k loop */

enum { LORA_FUSED = 0, LORA_PLAIN = 1, LORA_PRODUCT = 2 };

#if defined(__GNUC__) && defined(__x86_64__)
#define LORA_X86_FMA 1
#else
#define LORA_X86_FMA 0
#endif

static inline float ldf(const byte *p, Py_ssize_t i) { float f; memcpy(&f, p + i * 4, 4); return f; }
static inline void stf(byte *p, Py_ssize_t i, float f) { memcpy(p + i * 4, &f, 4); }

/* out[j] = scaling * (b . a[:, j]) for the w columns from a (row stride `cols`), in the order of the
 * mode; w is LORA_GROUP (a constant once inlined: the sums stay in registers) or the tile's rest. */
static inline __attribute__((always_inline)) void lora_columns(const byte *restrict b, const byte *restrict a,
                                                              byte *restrict out, Py_ssize_t rank, Py_ssize_t cols,
                                                              Py_ssize_t block, int mode, float scaling,
                                                              Py_ssize_t w)
{
    float total[LORA_GROUP], acc[LORA_GROUP];
    if (mode == LORA_PRODUCT) {
        const float b0 = ldf(b, 0);
        for (Py_ssize_t j = 0; j < w; j++)
            stf(out, j, b0 * ldf(a, j) * scaling);
        return;
    }
    for (Py_ssize_t k0 = 0; k0 < rank; k0 += block) {
        Py_ssize_t k1 = rank - k0 < block ? rank : k0 + block;
        for (Py_ssize_t j = 0; j < w; j++)
            acc[j] = 0.0f;
        for (Py_ssize_t k = k0; k < k1; k++) {
            const float bk = ldf(b, k);
            const byte *ak = a + k * cols * 4;
            if (mode == LORA_FUSED) {
                for (Py_ssize_t j = 0; j < w; j++)
                    acc[j] = fmaf(bk, ldf(ak, j), acc[j]);
            } else {
                for (Py_ssize_t j = 0; j < w; j++)
                    acc[j] = acc[j] + bk * ldf(ak, j); /* two roundings: -ffp-contract=off */
            }
        }
        for (Py_ssize_t j = 0; j < w; j++)
            total[j] = k0 == 0 ? acc[j] : total[j] + acc[j];
    }
    /* + 0: MKL's fused sums end added to a +0 (a chain that underflows to -0 comes out +0); the
     * plain sums start from +0 and cannot end at -0. Not an identity under IEEE rules, so kept. */
    for (Py_ssize_t j = 0; j < w; j++)
        stf(out, j, (total[j] + 0.0f) * scaling);
}

#if LORA_X86_FMA
/* 4 rows by 16 columns of a sum without blocks (block >= rank) in AVX2 registers: each load of A's
 * row serves 4 rows of the band, where the single-row loop loads A once per multiply-add. Per
 * element the same operations in the same order as lora_columns (_mm256_fmadd_ps rounds once, as
 * fmaf; the plain path multiplies, then adds), so the same bits. */
#define LORA_ROWS 4
#define LORA_WIDE 16
__attribute__((target("avx2,fma"))) static void lora_rows_fma(const byte *b, const byte *a, byte *out,
                                                              Py_ssize_t rank, Py_ssize_t cols, int fused,
                                                              float scaling)
{
    __m256 acc[LORA_ROWS][2];
    for (int r = 0; r < LORA_ROWS; r++)
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (Py_ssize_t k = 0; k < rank; k++) {
        const byte *ak = a + k * cols * 4;
        __m256 a0 = _mm256_loadu_ps((const float *)ak), a1 = _mm256_loadu_ps((const float *)(ak + 32));
        for (int r = 0; r < LORA_ROWS; r++) {
            __m256 bk = _mm256_set1_ps(ldf(b, r * rank + k));
            if (fused) {
                acc[r][0] = _mm256_fmadd_ps(bk, a0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(bk, a1, acc[r][1]);
            } else {
                acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_mul_ps(bk, a0));
                acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_mul_ps(bk, a1));
            }
        }
    }
    const __m256 zero = _mm256_setzero_ps(), s = _mm256_set1_ps(scaling);
    for (int r = 0; r < LORA_ROWS; r++) {
        byte *o = out + r * cols * 4;
        _mm256_storeu_ps((float *)o, _mm256_mul_ps(_mm256_add_ps(acc[r][0], zero), s));
        _mm256_storeu_ps((float *)(o + 32), _mm256_mul_ps(_mm256_add_ps(acc[r][1], zero), s));
    }
}
#endif

/* The band, column tile by column tile (each tile of A's rows is read once from memory for all the
 * band's rows): with `wide` (the AVX2 build) blocks of 4 rows by 16 columns where they fit, and
 * elsewhere one row by up to 32 columns. */
static inline __attribute__((always_inline)) void lora_tiles(const byte *b, const byte *a, byte *out,
                                                            Py_ssize_t rows, Py_ssize_t rank, Py_ssize_t cols,
                                                            Py_ssize_t block, int mode, float scaling, int wide)
{
    wide = wide && mode != LORA_PRODUCT && block >= rank;
    for (Py_ssize_t j0 = 0; j0 < cols; j0 += LORA_TILE) {
        Py_ssize_t j1 = cols - j0 < LORA_TILE ? cols : j0 + LORA_TILE;
        Py_ssize_t i = 0;
#if LORA_X86_FMA
        if (wide) {
            Py_ssize_t jw = j0 + (j1 - j0) / LORA_WIDE * LORA_WIDE;
            for (; i + LORA_ROWS <= rows; i += LORA_ROWS) {
                const byte *bi = b + i * rank * 4;
                byte *oi = out + i * cols * 4;
                for (Py_ssize_t j = j0; j < jw; j += LORA_WIDE)
                    lora_rows_fma(bi, a + j * 4, oi + j * 4, rank, cols, mode == LORA_FUSED, scaling);
                for (Py_ssize_t r = 0; r < LORA_ROWS && jw < j1; r++)
                    lora_columns(bi + r * rank * 4, a + jw * 4, oi + r * cols * 4 + jw * 4, rank, cols, block, mode,
                                 scaling, j1 - jw);
            }
        }
#endif
        for (; i < rows; i++) {
            const byte *bi = b + i * rank * 4;
            byte *oi = out + i * cols * 4;
            Py_ssize_t j = j0;
            for (; j + LORA_GROUP <= j1; j += LORA_GROUP)
                lora_columns(bi, a + j * 4, oi + j * 4, rank, cols, block, mode, scaling, LORA_GROUP);
            if (j < j1)
                lora_columns(bi, a + j * 4, oi + j * 4, rank, cols, block, mode, scaling, j1 - j);
        }
    }
}

/* Compiled twice: for any x86-64 (fmaf from the C library) and for AVX2 with FMA, chosen at run time;
 * the same operations in the same order, so the same bits. */
static void lora_band_generic(const byte *b, const byte *a, byte *out, Py_ssize_t rows, Py_ssize_t rank,
                              Py_ssize_t cols, Py_ssize_t block, int mode, float scaling)
{
    lora_tiles(b, a, out, rows, rank, cols, block, mode, scaling, 0);
}

#if LORA_X86_FMA
__attribute__((target("avx2,fma"))) static void lora_band_fma(const byte *b, const byte *a, byte *out,
                                                              Py_ssize_t rows, Py_ssize_t rank, Py_ssize_t cols,
                                                              Py_ssize_t block, int mode, float scaling)
{
    lora_tiles(b, a, out, rows, rank, cols, block, mode, scaling, 1);
}

static int has_fma(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return known;
}
#endif

static int allow_fma = 1; /* tests turn it off to check the portable loops against torch too */

PyObject *py_lora_use_fma(PyObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    allow_fma = on;
    Py_RETURN_NONE;
}

static void lora_band(const byte *b, const byte *a, byte *out, Py_ssize_t rows, Py_ssize_t rank, Py_ssize_t cols,
                      Py_ssize_t block, int mode, float scaling)
{
#if LORA_X86_FMA
    if (allow_fma && has_fma()) {
        lora_band_fma(b, a, out, rows, rank, cols, block, mode, scaling);
        return;
    }
#endif
    lora_band_generic(b, a, out, rows, rank, cols, block, mode, scaling);
}

static int overlaps(const Py_buffer *x, const Py_buffer *y)
{
    uintptr_t p = (uintptr_t)x->buf, q = (uintptr_t)y->buf;
    return x->len > 0 && y->len > 0 && p < q + (uintptr_t)y->len && q < p + (uintptr_t)x->len;
}

/* lora_band(b, a, out, rank, mode, block, scaling): b holds rows x rank float32, a rank x cols, out
 * rows x cols (written; it may not overlap b or a); block: the products a fused chain sums before
 * adding its sum to the block sums before it. */
PyObject *py_lora_band(PyObject *self, PyObject *args)
{
    PyObject *bo, *ao, *oo;
    Py_ssize_t rank, block;
    int mode;
    double scaling;
    Py_buffer b, a, out;
    if (!PyArg_ParseTuple(args, "OOOnind", &bo, &ao, &oo, &rank, &mode, &block, &scaling))
        return NULL;
    if (rank < 1 || block < 1 || mode < LORA_FUSED || mode > LORA_PRODUCT) {
        PyErr_SetString(PyExc_ValueError, "rank and block must be at least 1, mode 0 (fused), 1 (plain) or 2 (product)");
        return NULL;
    }
    if (PyObject_GetBuffer(bo, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(ao, &a, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&b);
        return NULL;
    }
    if (PyObject_GetBuffer(oo, &out, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&b);
        PyBuffer_Release(&a);
        return NULL;
    }
    Py_ssize_t rows = b.len / 4 / rank, cols = a.len / 4 / rank;
    const char *error = NULL;
    if (b.len != rows * rank * 4 || a.len != cols * rank * 4 || out.len != rows * cols * 4)
        error = "b, a and out must be float32 [rows, rank], [rank, cols] and [rows, cols]";
    else if (mode == LORA_PRODUCT && rank != 1)
        error = "mode 2 (product) is for rank 1";
    else if (overlaps(&out, &b) || overlaps(&out, &a))
        error = "out overlaps b or a";
    if (error == NULL) {
        Py_BEGIN_ALLOW_THREADS lora_band((const byte *)b.buf, (const byte *)a.buf, (byte *)out.buf, rows, rank,
                                         cols, block, mode, (float)scaling);
        Py_END_ALLOW_THREADS
    } else {
        PyErr_SetString(PyExc_ValueError, error);
    }
    PyBuffer_Release(&b);
    PyBuffer_Release(&a);
    PyBuffer_Release(&out);
    if (error != NULL)
        return NULL;
    Py_RETURN_NONE;
}
