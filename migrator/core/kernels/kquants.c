#include "kernels.h"

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
    void NAME(const byte *src, byte *dst, Py_ssize_t nblocks)                                     \
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
