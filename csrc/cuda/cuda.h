/*
 * cuda/cuda.h -- the CUDA backend's entry points, callable from C.
 *
 * Implemented by cuda/launch.cu and cuda/dequantize.cu, or by cuda/stub.c in a
 * CPU-only build (every entry then reports AWQ_ERR_NO_CUDA).  No entry point
 * aborts or synchronizes, except awq_cuda_time on its last event.
 */
#ifndef AWQ_CUDA_H
#define AWQ_CUDA_H

#include "awq.h"

#ifdef __cplusplus
extern "C" {
#endif

int awq_cuda_compiled(void);      /* 1 when the CUDA backend is linked in */
const char *awq_cuda_archs(void); /* e.g. "75;80;86;89;90;100;120" or "" */
int awq_cuda_runtime_version(void);
/* Number of usable devices; 0 when there is no driver or no device
 * (never an error).  *detail receives the cudaError_t of the probe. */
int awq_cuda_device_count(int *detail);

/* Launch one dequantization on p->stream of device p->device.  Sets the
 * current device for the call and restores it.  Never synchronizes. */
awq_status awq_cuda_dequantize(const awq_problem *p, const awq_config *c, int *detail);

/* Launch an empty one-block kernel on `stream` of `device`, the way
 * awq_cuda_dequantize launches (device scope, launch, error check): the
 * floor under any launch, for the benchmark's host-overhead reference. */
awq_status awq_cuda_empty_launch(int device, void *stream, int *detail);

/* How kernels are launched in this process: "driver" (cuLaunchKernel, found
 * through the runtime), "runtime" (cudaLaunchKernel: a runtime older than
 * 12.5, a driver without the entry point, AWQ_FAST_DEQUANT_RUNTIME_LAUNCH=1)
 * or "none" (a CPU-only build).  Static storage. */
const char *awq_cuda_launch_path(void);

/* Text of a cudaError_t (static storage). */
const char *awq_cuda_error_string(int detail);

/* Device identity for cache keys: name and compute capability. */
awq_status awq_cuda_device_identity(int device, char *name, size_t name_len, int *major,
                                    int *minor, int *detail);

/* 1 when `stream` on `device` is capturing a CUDA graph, 0 otherwise. */
awq_status awq_cuda_stream_capturing(int device, void *stream, int *capturing, int *detail);

/* Scratch memory written between timed launches so that each starts with
 * a cold L2, as a layer does inside a model (and as the benchmark times
 * it).  ptr is NULL when it could not be allocated: timing then runs warm. */
typedef struct {
    int device;
    void *ptr;
    size_t bytes; /* twice the device's L2 */
} awq_cuda_flush;

awq_status awq_cuda_flush_create(int device, awq_cuda_flush *f, int *detail);
void awq_cuda_flush_destroy(awq_cuda_flush *f);

/* Time a configuration: `warmup` launches, then `iters` launches, each
 * preceded by a write of `flush` (when given) and bracketed by its own CUDA
 * events on p->stream; *ms receives the median time of one launch.
 * Synchronizes on the last event only (tuning, never the hot path). */
awq_status awq_cuda_time(const awq_problem *p, const awq_config *c, const awq_cuda_flush *flush,
                         int warmup, int iters, float *ms, int *detail);

/* Fill `configs` with up to `cap` candidate configurations for this
 * problem (the autotuner's search space), the default first; returns how
 * many. */
int awq_cuda_candidates(const awq_problem *p, awq_config *configs, int cap);

/* Launch one fused linear (kernel AWQ_KERNEL_MMA or AWQ_KERNEL_SIMT;
 * cuda/linear.cu documents the other fields) on p->stream of p->device.
 * Zero fields of *c take the defaults.  AWQ_ERR_CONFIG when the
 * configuration cannot run this problem (for example MMA before sm_80). */
awq_status awq_cuda_linear(const awq_linear_problem *p, const awq_config *c, int *detail);

/* The configuration a fused linear uses when nothing is tuned: the fastest
 * fused kernel that can run the problem on its device, with its measured
 * defaults. */
awq_status awq_cuda_linear_default(const awq_linear_problem *p, awq_config *c, int *detail);

/* Fused configurations worth timing for this problem, the default first;
 * returns how many (at most cap). */
int awq_cuda_linear_candidates(const awq_linear_problem *p, awq_config *configs, int cap);

/* Like awq_cuda_time, for a fused linear configuration. */
awq_status awq_cuda_linear_time(const awq_linear_problem *p, const awq_config *c,
                                const awq_cuda_flush *flush, int warmup, int iters, float *ms,
                                int *detail);

/* One fused linear on the prepared layout (cuda/linear_prepared.cuh, which
 * describes words and operands): y = x @ W + bias, validated views,
 * nothing owned. */
typedef struct {
    const void *x;        /* [M, K], dtype, 16-byte aligned */
    const void *words;    /* int32 [K * N / 8], the prepared codes */
    const void *operands; /* int32 [(K / G) * N * 2], the prepared zeros and scales */
    const void *bias;     /* [N], dtype; NULL: no bias */
    void *y;              /* [M, N], dtype */
    int64_t M, K, N, G;   /* N % 128 == 0, K % 128 == 0, G = 64 x 2^j dividing K */
    awq_dtype dtype;      /* float16 or bfloat16 */
    int device;
    void *stream;
} awq_prepared_problem;

/* 1 when this build runs the prepared-layout kernel on `device` (compute
 * capability 9.0, sm_90a code), else 0. */
int awq_cuda_prepared_supported(int device);

/* Launch it on p->stream of p->device, its tile and split chosen for the
 * problem.  AWQ_ERR_CONFIG when the problem or the device does not fit it. */
awq_status awq_cuda_linear_prepared(const awq_prepared_problem *p, int *detail);

#ifdef __cplusplus
}
#endif

#endif /* AWQ_CUDA_H */
