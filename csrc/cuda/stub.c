/*
 * cuda/stub.c -- the CUDA backend of a CPU-only build (no nvcc, or
 * AWQ_FAST_DEQUANT_NO_CUDA=1).  Every entry reports "not compiled".
 */
#include "cuda/cuda.h"

int awq_cuda_compiled(void) { return 0; }

const char *awq_cuda_archs(void) { return ""; }

int awq_cuda_runtime_version(void) { return 0; }

int awq_cuda_device_count(int *detail)
{
    *detail = 0;
    return 0;
}

awq_status awq_cuda_dequantize(const awq_problem *p, const awq_config *c, int *detail)
{
    (void)p;
    (void)c;
    *detail = 0;
    return AWQ_ERR_NO_CUDA;
}

awq_status awq_cuda_empty_launch(int device, void *stream, int *detail)
{
    (void)device;
    (void)stream;
    *detail = 0;
    return AWQ_ERR_NO_CUDA;
}

const char *awq_cuda_launch_path(void) { return "none"; }

const char *awq_cuda_error_string(int detail)
{
    (void)detail;
    return "CUDA support was not compiled in";
}

awq_status awq_cuda_device_identity(int device, char *name, size_t name_len, int *major,
                                    int *minor, int *detail)
{
    (void)device;
    if (name_len > 0)
        name[0] = '\0';
    *major = *minor = *detail = 0;
    return AWQ_ERR_NO_CUDA;
}

awq_status awq_cuda_stream_capturing(int device, void *stream, int *capturing, int *detail)
{
    (void)device;
    (void)stream;
    *capturing = 0;
    *detail = 0;
    return AWQ_ERR_NO_CUDA;
}

awq_status awq_cuda_flush_create(int device, awq_cuda_flush *f, int *detail)
{
    f->device = device;
    f->ptr = NULL;
    f->bytes = 0;
    *detail = 0;
    return AWQ_ERR_NO_CUDA;
}

void awq_cuda_flush_destroy(awq_cuda_flush *f) { f->ptr = NULL; }

awq_status awq_cuda_time(const awq_problem *p, const awq_config *c, const awq_cuda_flush *flush,
                         int warmup, int iters, float *ms, int *detail)
{
    (void)p;
    (void)c;
    (void)flush;
    (void)warmup;
    (void)iters;
    *ms = 0.0f;
    *detail = 0;
    return AWQ_ERR_NO_CUDA;
}

int awq_cuda_candidates(const awq_problem *p, awq_config *configs, int cap)
{
    (void)p;
    (void)configs;
    (void)cap;
    return 0;
}

awq_status awq_cuda_linear(const awq_linear_problem *p, const awq_config *c, int *detail)
{
    (void)p;
    (void)c;
    *detail = 0;
    return AWQ_ERR_NO_CUDA;
}

awq_status awq_cuda_linear_default(const awq_linear_problem *p, awq_config *c, int *detail)
{
    (void)p;
    memset(c, 0, sizeof *c);
    *detail = 0;
    return AWQ_ERR_NO_CUDA;
}

int awq_cuda_linear_candidates(const awq_linear_problem *p, awq_config *configs, int cap)
{
    (void)p;
    (void)configs;
    (void)cap;
    return 0;
}

awq_status awq_cuda_linear_time(const awq_linear_problem *p, const awq_config *c,
                                const awq_cuda_flush *flush, int warmup, int iters, float *ms,
                                int *detail)
{
    (void)p;
    (void)c;
    (void)flush;
    (void)warmup;
    (void)iters;
    *ms = 0.0f;
    *detail = 0;
    return AWQ_ERR_NO_CUDA;
}

int awq_cuda_prepared_supported(int device)
{
    (void)device;
    return 0;
}

awq_status awq_cuda_linear_prepared(const awq_prepared_problem *p, int *detail)
{
    (void)p;
    *detail = 0;
    return AWQ_ERR_NO_CUDA;
}
