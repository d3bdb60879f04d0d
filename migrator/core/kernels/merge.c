#include "kernels.h"

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

PyObject *py_merge_dot3(PyObject *self, PyObject *args)
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

PyObject *py_merge_abs_hist(PyObject *self, PyObject *args)
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

PyObject *py_merge_task_band(PyObject *self, PyObject *args)
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

PyObject *py_merge_linear_band(PyObject *self, PyObject *args)
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
