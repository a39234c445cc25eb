/*
 * awq.h -- the one contract shared by every backend (CPU, CUDA, autotune).
 *
 * No Python here: this header is included from C and from CUDA C++.
 *
 * The AWQ "GEMM" format (DESIGN.md section 1):
 *   qweight : uint32 [K, N/8]      qzeros : uint32 [K/G, N/8]
 *   scales  : f16|bf16|f32 [K/G, N]
 *   out     : f16|bf16|f32 [K, N]
 * Nibble i (bits 4i..4i+3) of a packed word holds column 8c + ORDER[i],
 * ORDER = {0, 2, 4, 6, 1, 3, 5, 7}; column 8c + j lives in nibble
 * AWQ_REVERSE[j] = {0, 4, 1, 5, 2, 6, 3, 7}.
 *   out[k, n] = round_to_out( float32(q - z) * float32(scale) )
 * with q - z formed as an integer and one round-to-nearest-even at the end.
 *
 * All arrays are C-contiguous; every index is 64-bit.
 */
#ifndef AWQ_H
#define AWQ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of scales and out.  The numbering is part of the C ABI
 * between files only (never persisted: the cache file spells names). */
typedef enum {
    AWQ_F16 = 0,
    AWQ_BF16 = 1,
    AWQ_F32 = 2,
} awq_dtype;

#define AWQ_NUM_DTYPES 3

/* Kernel ids.  AUTO resolves to V4 on CUDA and CPU on the host. */
typedef enum {
    AWQ_KERNEL_AUTO = 0,
    AWQ_KERNEL_V1 = 1,  /* one thread per output element */
    AWQ_KERNEL_V2 = 2,  /* one thread per packed word, fixed block size */
    AWQ_KERNEL_V3 = 3,  /* v2 with a runtime block size */
    AWQ_KERNEL_V4 = 4,  /* production kernel */
    AWQ_KERNEL_CPU = 5, /* host backend */
} awq_kernel;

#define AWQ_NUM_KERNELS 6

/* Generation of each backend's kernels.  Bump one whenever a change to its
 * kernels, their defaults or the meaning of a launch parameter could change
 * which configuration is fastest: autotune entries are keyed by it
 * (autotune.h), so picks tuned for other kernels are never used. */
#define AWQ_CUDA_KERNELS_GEN 4
#define AWQ_CPU_KERNELS_GEN 1

/* Error codes returned by every backend entry point. */
typedef enum {
    AWQ_OK = 0,
    AWQ_ERR_CUDA = 1,    /* a CUDA runtime call failed; the cudaError_t is in *detail */
    AWQ_ERR_NO_CUDA = 2, /* built without CUDA */
    AWQ_ERR_CONFIG = 3,  /* launch configuration not valid for this kernel */
    AWQ_ERR_NOMEM = 4,   /* host allocation failed */
    AWQ_ERR_DEVICE = 5,  /* device ordinal out of range / no device */
} awq_status;

/* One dequantization problem: validated views, nothing owned. */
typedef struct {
    const uint32_t *qweight; /* [K, N/8] */
    const uint32_t *qzeros;  /* [K/G, N/8] */
    const void *scales;      /* [K/G, N], scale_dtype */
    void *out;               /* [K, N], out_dtype */
    int64_t K;               /* rows (in_features) */
    int64_t N;               /* columns (out_features), a multiple of 8 */
    int64_t G;               /* group size, divides K (K == 0 allows any G >= 1) */
    awq_dtype scale_dtype;
    awq_dtype out_dtype;
    int device;   /* -1: host memory; >= 0: CUDA device ordinal */
    void *stream; /* cudaStream_t on that device; NULL is the legacy default stream */
} awq_problem;

/* A launch configuration.  Zero in any field means "the kernel's default". */
typedef struct {
    int kernel;     /* awq_kernel */
    int block_size; /* CUDA threads per block (v3, v4); must be a multiple of 32 in [32, 1024] */
    int rows;       /* v4: rows of one group handled per thread: a power of two up to 64 */
    int threads;    /* CPU: worker threads */
    int64_t chunk;  /* CPU: rows per work item */
} awq_config;

/* Output elements the problem writes: K * N. */
static inline int64_t awq_numel(const awq_problem *p) { return p->K * p->N; }

static inline size_t awq_dtype_size(awq_dtype t) { return t == AWQ_F32 ? 4u : 2u; }

/* The one statement of what awq_config's CUDA fields may hold (besides 0):
 * block_size a multiple of 32 in [32, 1024], rows a power of two in [1, 64]. */
#define AWQ_MAX_BLOCK 1024
#define AWQ_MAX_ROWS 64
static inline int awq_block_size_valid(int64_t b)
{
    return b >= 32 && b <= AWQ_MAX_BLOCK && b % 32 == 0;
}
static inline int awq_rows_valid(int64_t r)
{
    return r >= 1 && r <= AWQ_MAX_ROWS && (r & (r - 1)) == 0;
}

/* ---- CPU backend (dequant_cpu.c) ------------------------------------- */

/* Pure C: never touches a Python object; safe to call without the GIL. */
awq_status awq_cpu_dequantize(const awq_problem *p, const awq_config *c);
int awq_cpu_max_threads(void);
int awq_cpu_has_openmp(void);
const char *awq_cpu_simd(void); /* the vector path the running CPU takes, e.g. "avx2+f16c" */

/* ---- CUDA backend (dequant_cuda.cu, or cuda_stub.c in a CPU-only build) */

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
 * problem (the autotuner's search space); returns how many. */
int awq_cuda_candidates(const awq_problem *p, awq_config *configs, int cap);


#ifdef __cplusplus
}
#endif

#endif /* AWQ_H */
