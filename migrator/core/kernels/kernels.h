/* What the C files of the `migrator.core._kernels` extension share (setup.py builds them into one
 * module): the includes, the byte-level load and store helpers, the scalar float16 bit rules, and the
 * functions one file defines for another. Each file holds one job: casts.c (half conversions and
 * transposes, casts.py), stats.c (value statistics and byte comparison, analysis/), gguf.c and
 * kquants.c (GGUF block formats, formats/gguf/quants.py), merge.c (merge bands,
 * transform/merging/arithmetic.py), lora.c (LoRA delta bands, transform/merging/lora.py), dequant.c (quantized
 * checkpoints' row bands: FP8, MXFP4, packed integers, core/dequant.py), fp8_quantize.c (F32/BF16 weights to
 * F8_E4M3 with scales, core/fp8_quantize.py); module.c
 * lists the functions Python sees.
 *
 * Everything declared here is hidden from the shared object's symbol table: only PyInit__kernels is
 * exported, as when the module was a single file of static functions. */
#ifndef MIGRATOR_KERNELS_H
#define MIGRATOR_KERNELS_H

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

/* ---- scalar reference rules (casts.c's portable loops; stats.c, gguf.c and kquants.c read and write
 * f16 through them) ------------------------------------------------------------------------------ */

static inline uint16_t f32_to_f16_bits(uint32_t u)
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

static inline uint32_t f16_to_f32_bits(uint16_t h)
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

#pragma GCC visibility push(hidden)

/* casts.c: 0 forces the portable loops (use_f16c); stats.c's AVX2 path follows the same switch */
extern int allow_f16c;

/* module.c: a read buffer of src and a writable buffer of dst (both or neither), refused when they
 * overlap (the loops take their pointers as `restrict`) */
int acquire(PyObject *src, PyObject *dst, Py_buffer *in, Py_buffer *out);

/* kquants.c: float32 super-blocks of 256 values -> K-quant blocks, for gguf.c's dispatcher */
void q2_k_quantize(const byte *src, byte *dst, Py_ssize_t nblocks);
void q3_k_quantize(const byte *src, byte *dst, Py_ssize_t nblocks);
void q4_k_quantize(const byte *src, byte *dst, Py_ssize_t nblocks);
void q5_k_quantize(const byte *src, byte *dst, Py_ssize_t nblocks);
void q6_k_quantize(const byte *src, byte *dst, Py_ssize_t nblocks);

/* the functions module.c lists */
PyObject *py_f32_to_f16(PyObject *self, PyObject *args);
PyObject *py_f16_to_f32(PyObject *self, PyObject *args);
PyObject *py_f32_to_bf16(PyObject *self, PyObject *args);
PyObject *py_transpose(PyObject *self, PyObject *args);
PyObject *py_transpose_f32_to_f16(PyObject *self, PyObject *args);
PyObject *py_has_f16c(PyObject *self, PyObject *args);
PyObject *py_use_f16c(PyObject *self, PyObject *arg);
PyObject *py_float_stats(PyObject *self, PyObject *args);
PyObject *py_same_bytes(PyObject *self, PyObject *args);
PyObject *py_gguf_blocks(PyObject *self, PyObject *args);
PyObject *py_merge_dot3(PyObject *self, PyObject *args);
PyObject *py_merge_abs_hist(PyObject *self, PyObject *args);
PyObject *py_merge_task_band(PyObject *self, PyObject *args);
PyObject *py_merge_linear_band(PyObject *self, PyObject *args);
PyObject *py_lora_band(PyObject *self, PyObject *args);
PyObject *py_lora_use_fma(PyObject *self, PyObject *arg);
PyObject *py_dequant_band(PyObject *self, PyObject *args);
PyObject *py_e8m0_to_f32(PyObject *self, PyObject *args);
PyObject *py_fp8_absmax(PyObject *self, PyObject *args);
PyObject *py_fp8_quantize(PyObject *self, PyObject *args);

#pragma GCC visibility pop

#endif
