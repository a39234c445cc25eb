/*
 * cpu/dequantize.c -- the host backend of dequantize.
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
#include "cpu/convert.h"
#include "cpu/cpu.h"

#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef AWQ_X86_DISPATCH
#include <immintrin.h>
#endif

/* ---- one group's parameters, expanded to column order ---- */

typedef struct {
    int32_t *zero; /* [N] zero point of each column */
    float *scale;  /* [N] scale of each column, as float32 */
    int64_t group; /* which group is loaded, -1 none */
} group_buf;

/* A thread's rows at mem: N zero points, then N scales; no group loaded. */
static group_buf group_buf_at(char *mem, int64_t N)
{
    group_buf b = {(int32_t *)mem, (float *)(mem + (size_t)N * sizeof(int32_t)), -1};
    return b;
}

static void load_group(const awq_problem *p, group_buf *b, int64_t g)
{
    if (b->group == g)
        return;
    const int64_t words = p->N / 8;
    const uint32_t *zrow = p->qzeros + g * words;
    for (int64_t c = 0; c < words; c++) {
        uint32_t zw = zrow[c];
        for (int j = 0; j < 8; j++)
            b->zero[8 * c + j] = (int32_t)((zw >> (4 * AWQ_NIBBLE(j))) & 0xFu);
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
                int32_t q = (int32_t)((w >> (4 * AWQ_NIBBLE(j))) & 0xFu);
                float v = (float)(q - b->zero[n]) * b->scale[n];
                store_value(p->out, k * N + n, v, p->out_dtype);
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
    const __m256i shifts = _mm256_setr_epi32(4 * AWQ_NIBBLE(0), 4 * AWQ_NIBBLE(1), 4 * AWQ_NIBBLE(2),
                                             4 * AWQ_NIBBLE(3), 4 * AWQ_NIBBLE(4), 4 * AWQ_NIBBLE(5),
                                             4 * AWQ_NIBBLE(6), 4 * AWQ_NIBBLE(7));
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

#endif

typedef void (*rows_fn)(const awq_problem *, const group_buf *, int64_t, int64_t);

static rows_fn pick_rows(void)
{
#ifdef AWQ_X86_DISPATCH
    if (awq_cpu_use_avx2())
        return rows_avx2;
#endif
    return rows_scalar;
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
    int threads = awq_cpu_threads(c->threads);
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

    if (threads == 1) { /* also every forked child (cpu/platform.c) */
        group_buf b = group_buf_at(mem, p->N);
        run_rows(p, &b, fn, 0, p->K);
    }
#ifdef _OPENMP
    else {
#pragma omp parallel num_threads(threads)
        {
            group_buf b = group_buf_at(mem + per * (size_t)omp_get_thread_num(), p->N);
#pragma omp for schedule(static)
            for (int64_t i = 0; i < items; i++) {
                int64_t k0 = i * chunk, k1 = k0 + chunk < p->K ? k0 + chunk : p->K;
                run_rows(p, &b, fn, k0, k1);
            }
        }
    }
#endif
    free(mem);
    return AWQ_OK;
}
