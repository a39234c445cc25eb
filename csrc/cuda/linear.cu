/*
 * cuda/linear.cu -- the fused linear on CUDA (cuda/cuda.h).
 *
 * No fused CUDA kernel is built yet: every configuration answers
 * AWQ_ERR_CONFIG, so linear() on CUDA tensors takes its dequantize path.
 */
#include "cuda/cuda.h"

extern "C" {

awq_status awq_cuda_linear(const awq_linear_problem *p, const awq_config *c, int *detail)
{
    (void)p;
    (void)c;
    if (detail) *detail = 0;
    return AWQ_ERR_CONFIG;
}

awq_status awq_cuda_linear_default(const awq_linear_problem *p, awq_config *c, int *detail)
{
    (void)p;
    memset(c, 0, sizeof *c);
    c->kernel = AWQ_KERNEL_DEQUANT;
    if (detail) *detail = 0;
    return AWQ_OK;
}

int awq_cuda_linear_candidates(const awq_linear_problem *p, awq_config *configs, int cap)
{
    (void)p;
    (void)configs;
    (void)cap;
    return 0;
}

awq_status awq_cuda_linear_time(const awq_linear_problem *p, const awq_config *c, const awq_cuda_flush *flush,
                                int warmup, int iters, float *ms, int *detail)
{
    (void)p;
    (void)c;
    (void)flush;
    (void)warmup;
    (void)iters;
    if (ms) *ms = 0.0f;
    if (detail) *detail = 0;
    return AWQ_ERR_CONFIG;
}

} /* extern "C" */
