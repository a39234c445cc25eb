/*
 * cpu/linear.c -- the fused linear on the host (cpu/cpu.h).
 *
 * Portable form: each work item owns a run of output columns for all rows
 * of x and walks k in order, so every sum has a fixed order whatever the
 * threads do.  W is computed from the packed words exactly as dequantize
 * computes it (rounded to x's dtype), then widened to float32.
 */
#include "cpu/convert.h"
#include "cpu/cpu.h"

#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

static inline float load_value(const void *a, int64_t i, awq_dtype t)
{
    return load_scale(a, i, t);
}

/* The value dequantize writes, widened back to float32. */
static inline float weight(float qz, float s, awq_dtype t)
{
    float v = qz * s;
    switch (t) {
    case AWQ_F16: return half_to_float(float_to_half(v));
    case AWQ_BF16: return bits_f32((uint32_t)float_to_bf16(v) << 16);
    default: return v;
    }
}

static inline void store_value(void *a, int64_t i, float v, awq_dtype t)
{
    switch (t) {
    case AWQ_F16: ((uint16_t *)a)[i] = float_to_half(v); break;
    case AWQ_BF16: ((uint16_t *)a)[i] = float_to_bf16(v); break;
    default: ((float *)a)[i] = v; break;
    }
}

/* Columns [n0, n1) of every row; acc holds M * (n1 - n0) floats. */
static void columns(const awq_linear_problem *p, int64_t n0, int64_t n1, float *acc)
{
    const int64_t W = p->N / 8, width = n1 - n0;
    for (int64_t i = 0; i < p->M * width; i++)
        acc[i] = 0.0f;
    for (int64_t k = 0; k < p->K; k++) {
        const int64_t g = k / p->G;
        for (int64_t n = n0; n < n1; n++) {
            const int64_t c = n / 8;
            const int sh = 4 * AWQ_NIBBLE((int)(n % 8));
            const int q = (int)((p->qweight[k * W + c] >> sh) & 0xFu);
            const int z = (int)((p->qzeros[g * W + c] >> sh) & 0xFu);
            const float w = weight((float)(q - z), load_value(p->scales, g * p->N + n, p->dtype),
                                   p->dtype);
            for (int64_t m = 0; m < p->M; m++)
                acc[m * width + (n - n0)] += load_value(p->x, m * p->K + k, p->dtype) * w;
        }
    }
    for (int64_t m = 0; m < p->M; m++)
        for (int64_t n = n0; n < n1; n++) {
            float v = acc[m * width + (n - n0)];
            if (p->bias != NULL)
                v += load_value(p->bias, n, p->dtype);
            store_value(p->y, m * p->N + n, v, p->dtype);
        }
}

awq_status awq_cpu_linear(const awq_linear_problem *p, const awq_config *c)
{
    if (p->M == 0 || p->N == 0)
        return AWQ_OK;
    if (c->threads < 0 || c->chunk < 0 || c->chunk % 8 != 0)
        return AWQ_ERR_CONFIG;
    const int64_t chunk = c->chunk > 0 ? c->chunk : 64;
    const int64_t items = (p->N + chunk - 1) / chunk;
    int threads = awq_cpu_threads(c->threads);
    if (threads > items)
        threads = (int)items;
    float *acc = malloc((size_t)threads * (size_t)p->M * (size_t)chunk * sizeof(float));
    if (acc == NULL)
        return AWQ_ERR_NOMEM;
    if (threads <= 1) {
        for (int64_t i = 0; i < items; i++)
            columns(p, i * chunk, i * chunk + chunk < p->N ? i * chunk + chunk : p->N, acc);
    }
#ifdef _OPENMP
    else {
#pragma omp parallel num_threads(threads)
        {
            float *mine = acc + (size_t)omp_get_thread_num() * (size_t)p->M * (size_t)chunk;
#pragma omp for schedule(static)
            for (int64_t i = 0; i < items; i++)
                columns(p, i * chunk, i * chunk + chunk < p->N ? i * chunk + chunk : p->N, mine);
        }
    }
#endif
    free(acc);
    return AWQ_OK;
}

int awq_cpu_linear_candidates(const awq_linear_problem *p, awq_config *configs, int cap)
{
    static const int64_t chunks[] = {32, 64, 128, 256};
    if (!configs || cap <= 0)
        return 0;
    int n = 0;
    configs[n++] = (awq_config){.kernel = AWQ_KERNEL_CPU};
    const int max = awq_cpu_max_threads();
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0] && n < cap; i++) {
        if (p != NULL && i > 0 && chunks[i - 1] >= p->N)
            break;
        configs[n++] = (awq_config){.kernel = AWQ_KERNEL_CPU, .threads = max, .chunk = chunks[i]};
    }
    return n;
}
