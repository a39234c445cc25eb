/*
 * dequant_cpu.c -- the host backend.
 *
 * Work is split into chunks of consecutive rows (OpenMP when the compiler
 * has it).  Each thread expands the zero points and scales of the group it
 * is in once into float32 / int32 rows (that costs 1/G of the work), then
 * streams the packed rows through a vector path (AVX2 + F16C, chosen at
 * run time) or the portable scalar path.  Both compute, per element,
 *     round_to_out( float32(q - z) * float32(scale) )
 * with one round-to-nearest-even at the end, exactly as DESIGN.md section 1.
 *
 * Pure C: no Python object is touched, so callers release the GIL.
 */
#include "awq.h"

#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define AWQ_X86_DISPATCH 1
#include <immintrin.h>
#endif

/* Column 8c + j of a packed word lives in nibble REVERSE[j] (awq.h). */
static const int kReverse[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/* ---- scalar conversions (bit exact, IEEE 754 round-to-nearest-even) ---- */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float16 bits -> float32 (exact: every half is a float). */
static inline float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    if (exp == 0x1F) /* Inf / NaN: keep the payload, keep NaN-ness */
        return bits_f32(sign | 0x7F800000u | (man << 13));
    if (exp != 0)
        return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24, exact in float32 */
    float f = (float)man * 5.9604644775390625e-8f;
    return sign ? -f : f;
}

/* float32 -> float16 bits, round to nearest even. */
static inline uint16_t float_to_half(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) /* Inf or NaN (NaN stays a quiet NaN) */
        return sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u | ((ax >> 13) & 0x3FFu) : 0u);
    if (ax >= 0x477FF000u) /* >= 65520 rounds to Inf */
        return sign | 0x7C00u;
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (ax < 0x33000000u) /* < 2^-25: rounds to zero (2^-25 ties to even zero) */
            return sign;
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return sign | (uint16_t)r;
    }
    /* normal: rebias the exponent, round the 13 dropped bits to even */
    uint32_t r = ax - 0x38000000u; /* exponent 127 -> 15 */
    r += 0x0FFFu + ((r >> 13) & 1u);
    return sign | (uint16_t)(r >> 13);
}

/* float32 -> bfloat16 bits, round to nearest even; NaN stays quiet NaN. */
static inline uint16_t float_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float load_scale(const void *s, int64_t i, awq_dtype t)
{
    switch (t) {
    case AWQ_F16: return half_to_float(((const uint16_t *)s)[i]);
    case AWQ_BF16: return bits_f32((uint32_t)((const uint16_t *)s)[i] << 16);
    default: return ((const float *)s)[i];
    }
}

/* ---- one group's parameters, expanded to column order ---- */

typedef struct {
    int32_t *zero; /* [N] zero point of each column */
    float *scale;  /* [N] scale of each column, as float32 */
    int64_t group; /* which group is loaded, -1 none */
} group_buf;

static void load_group(const awq_problem *p, group_buf *b, int64_t g)
{
    if (b->group == g)
        return;
    const int64_t words = p->N / 8;
    const uint32_t *zrow = p->qzeros + g * words;
    for (int64_t c = 0; c < words; c++) {
        uint32_t zw = zrow[c];
        for (int j = 0; j < 8; j++)
            b->zero[8 * c + j] = (int32_t)((zw >> (4 * kReverse[j])) & 0xFu);
    }
    for (int64_t n = 0; n < p->N; n++)
        b->scale[n] = load_scale(p->scales, g * p->N + n, p->scale_dtype);
    b->group = g;
}

/* ---- row kernels ---- */

static void rows_scalar(const awq_problem *p, const group_buf *b, int64_t k0, int64_t k1)
{
    const int64_t N = p->N, words = N / 8;
    for (int64_t k = k0; k < k1; k++) {
        const uint32_t *qrow = p->qweight + k * words;
        for (int64_t c = 0; c < words; c++) {
            uint32_t w = qrow[c];
            for (int j = 0; j < 8; j++) {
                int64_t n = 8 * c + j;
                int32_t q = (int32_t)((w >> (4 * kReverse[j])) & 0xFu);
                float v = (float)(q - b->zero[n]) * b->scale[n];
                int64_t o = k * N + n;
                switch (p->out_dtype) {
                case AWQ_F16: ((uint16_t *)p->out)[o] = float_to_half(v); break;
                case AWQ_BF16: ((uint16_t *)p->out)[o] = float_to_bf16(v); break;
                default: ((float *)p->out)[o] = v; break;
                }
            }
        }
    }
}

#ifdef AWQ_X86_DISPATCH
/* AVX2 + F16C: one packed word -> 8 lanes in column order per step.
 * Lane j shifts the broadcast word by 4 * REVERSE[j]. */
__attribute__((target("avx2,f16c"))) static void rows_avx2(const awq_problem *p,
                                                           const group_buf *b, int64_t k0,
                                                           int64_t k1)
{
    const int64_t N = p->N, words = N / 8;
    const __m256i shifts = _mm256_setr_epi32(0, 16, 4, 20, 8, 24, 12, 28);
    const __m256i nib = _mm256_set1_epi32(0xF);
    for (int64_t k = k0; k < k1; k++) {
        const uint32_t *qrow = p->qweight + k * words;
        for (int64_t c = 0; c < words; c++) {
            __m256i w = _mm256_set1_epi32((int)qrow[c]);
            __m256i q = _mm256_and_si256(_mm256_srlv_epi32(w, shifts), nib);
            __m256i z = _mm256_loadu_si256((const __m256i *)(b->zero + 8 * c));
            __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, z)),
                                     _mm256_loadu_ps(b->scale + 8 * c));
            int64_t o = k * N + 8 * c;
            if (p->out_dtype == AWQ_F16) {
                __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                _mm_storeu_si128((__m128i *)((uint16_t *)p->out + o), h);
            } else if (p->out_dtype == AWQ_BF16) {
                /* round to nearest even on the bit pattern; NaN -> quiet NaN */
                __m256i x = _mm256_castps_si256(v);
                __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
                __m256i r = _mm256_srli_epi32(
                    _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb), 16);
                __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
                __m256i isnan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
                r = _mm256_blendv_epi8(r, qnan, isnan);
                /* 8 x u32 (each < 2^16) -> 8 x u16: pack within lanes, then gather halves */
                __m256i packed = _mm256_packus_epi32(r, r);
                packed = _mm256_permute4x64_epi64(packed, 0x08);
                _mm_storeu_si128((__m128i *)((uint16_t *)p->out + o),
                                 _mm256_castsi256_si128(packed));
            } else {
                _mm256_storeu_ps((float *)p->out + o, v);
            }
        }
    }
}

static int have_avx2_f16c(void)
{
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    }
    return cached;
}
#endif

typedef void (*rows_fn)(const awq_problem *, const group_buf *, int64_t, int64_t);

static rows_fn pick_rows(void)
{
#ifdef AWQ_X86_DISPATCH
    if (have_avx2_f16c() && getenv("AWQ_FAST_DEQUANT_CPU_SCALAR") == NULL)
        return rows_avx2;
#endif
    return rows_scalar;
}

const char *awq_cpu_simd(void) { return pick_rows() == rows_scalar ? "scalar" : "avx2+f16c"; }

int awq_cpu_has_openmp(void)
{
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

int awq_cpu_max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Rows [k0, k1) of the problem, group by group. */
static void run_rows(const awq_problem *p, group_buf *b, rows_fn fn, int64_t k0, int64_t k1)
{
    while (k0 < k1) {
        int64_t g = k0 / p->G;
        int64_t end = (g + 1) * p->G;
        if (end > k1)
            end = k1;
        load_group(p, b, g);
        fn(p, b, k0, end);
        k0 = end;
    }
}

awq_status awq_cpu_dequantize(const awq_problem *p, const awq_config *c)
{
    if (p->K == 0 || p->N == 0)
        return AWQ_OK;
    if (c->threads < 0 || c->chunk < 0)
        return AWQ_ERR_CONFIG;

    /* The tuner never asks for more threads than OpenMP offers, nor for
     * chunks longer than K; an autotune file edited by hand may: clamp, so
     * that no count overflows and no thread is created in vain. */
    const int max_threads = awq_cpu_max_threads();
    int threads = c->threads > 0 && c->threads < max_threads ? c->threads : max_threads;
    int64_t chunk = c->chunk > 0 ? (c->chunk < p->K ? c->chunk : p->K) : 16;
    int64_t items = (p->K + chunk - 1) / chunk;
    if (threads > items)
        threads = (int)items;
    if (threads < 1)
        threads = 1;

    /* One zero row and one scale row per thread, allocated up front so that
     * no allocation can fail inside the parallel region. */
    size_t per = (size_t)p->N * (sizeof(int32_t) + sizeof(float));
    char *mem = malloc(per * (size_t)threads);
    if (mem == NULL)
        return AWQ_ERR_NOMEM;
    rows_fn fn = pick_rows();

#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num();
        group_buf b = {(int32_t *)(mem + per * (size_t)t),
                       (float *)(mem + per * (size_t)t + (size_t)p->N * sizeof(int32_t)), -1};
#pragma omp for schedule(static)
        for (int64_t i = 0; i < items; i++) {
            int64_t k0 = i * chunk, k1 = k0 + chunk < p->K ? k0 + chunk : p->K;
            run_rows(p, &b, fn, k0, k1);
        }
    }
#else
    {
        group_buf b = {(int32_t *)mem, (float *)(mem + (size_t)p->N * sizeof(int32_t)), -1};
        run_rows(p, &b, fn, 0, p->K);
    }
#endif
    free(mem);
    return AWQ_OK;
}
