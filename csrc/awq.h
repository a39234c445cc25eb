/*
 * awq.h -- the one contract shared by every backend (CPU, CUDA, autotune).
 *
 * No Python here: this header is included from C and from CUDA C++.
 *
 * The AWQ "GEMM" format (DESIGN.md section 1):
 *   qweight : uint32 [K, N/8]      qzeros : uint32 [K/G, N/8]
 *   scales  : f16|bf16|f32 [K/G, N]
 *   out     : f16|bf16|f32 [K, N]
 *   out[k, n] = round_to_out( float32(q - z) * float32(scale) )
 * with q - z formed as an integer and one round-to-nearest-even at the end.
 *
 * All arrays are C-contiguous; every index is 64-bit.
 */
#ifndef AWQ_H
#define AWQ_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the nibble order -------------------------------------------------
 * Nibble i (bits 4i..4i+3) of a packed word holds column 8c + ORDER[i],
 * ORDER = {0, 2, 4, 6, 1, 3, 5, 7}; so column 8c + j lives in nibble
 *     REVERSE[j] = {0, 4, 1, 5, 2, 6, 3, 7}[j] = j/2 + 4 (j % 2).
 * AWQ_NIBBLE is that closed form, the one definition every backend uses
 * (the CPU tables and the CUDA kernels are built from it); the assertions
 * pin it to the table of the contract. */
#define AWQ_NIBBLE(j) (((j) >> 1) + 4 * ((j) & 1))
#define AWQ_COLS_PER_WORD 8

#if defined(__cplusplus)
static_assert(AWQ_NIBBLE(0) == 0 && AWQ_NIBBLE(1) == 4 && AWQ_NIBBLE(2) == 1 && AWQ_NIBBLE(3) == 5 &&
                  AWQ_NIBBLE(4) == 2 && AWQ_NIBBLE(5) == 6 && AWQ_NIBBLE(6) == 3 && AWQ_NIBBLE(7) == 7,
              "REVERSE = {0, 4, 1, 5, 2, 6, 3, 7}");
#else
_Static_assert(AWQ_NIBBLE(0) == 0 && AWQ_NIBBLE(1) == 4 && AWQ_NIBBLE(2) == 1 && AWQ_NIBBLE(3) == 5 &&
                   AWQ_NIBBLE(4) == 2 && AWQ_NIBBLE(5) == 6 && AWQ_NIBBLE(6) == 3 && AWQ_NIBBLE(7) == 7,
               "REVERSE = {0, 4, 1, 5, 2, 6, 3, 7}");
#endif

/* ---- element types ----------------------------------------------------
 * The numbering is part of the C ABI between files only (never persisted:
 * the cache file spells names, from awq_dtype_name). */
typedef enum {
    AWQ_F16 = 0,
    AWQ_BF16 = 1,
    AWQ_F32 = 2,
} awq_dtype;

#define AWQ_NUM_DTYPES 3

/* The one table of dtype names; NULL for an id out of range. */
static inline const char *awq_dtype_name(int t)
{
    static const char *const names[AWQ_NUM_DTYPES] = {"float16", "bfloat16", "float32"};
    return t >= 0 && t < AWQ_NUM_DTYPES ? names[t] : NULL;
}

/* Exact name -> id: 0 and *out set, or -1. */
static inline int awq_dtype_parse(const char *name, awq_dtype *out)
{
    for (int i = 0; name != NULL && i < AWQ_NUM_DTYPES; i++)
        if (strcmp(name, awq_dtype_name(i)) == 0) {
            *out = (awq_dtype)i;
            return 0;
        }
    return -1;
}

static inline size_t awq_dtype_size(awq_dtype t) { return t == AWQ_F32 ? 4u : 2u; }

/* ---- kernels ------------------------------------------------------------
 * dequantize: AUTO resolves to V4 on CUDA and CPU on the host.
 * linear: CPU and AMX (the host's fused kernels), SIMT (CUDA cores), MMA,
 * GEMV and WGMMA (tensor cores), DEQUANT (dequantize into a buffer + the
 * framework's matmul). */
typedef enum {
    AWQ_KERNEL_AUTO = 0,
    AWQ_KERNEL_V1 = 1,      /* one thread per output element */
    AWQ_KERNEL_V2 = 2,      /* one thread per packed word, fixed block size */
    AWQ_KERNEL_V3 = 3,      /* v2 with a runtime block size */
    AWQ_KERNEL_V4 = 4,      /* production kernel: row tiles inside a group, 16-byte accesses */
    AWQ_KERNEL_CPU = 5,     /* host backend */
    AWQ_KERNEL_SIMT = 6,    /* linear: fused, CUDA cores */
    AWQ_KERNEL_MMA = 7,     /* linear: fused, tensor cores (mma.sync, sm_80+) */
    AWQ_KERNEL_DEQUANT = 8, /* linear: dequantize + the framework's matmul */
    AWQ_KERNEL_GEMV = 9,    /* linear: fused, tensor cores, decode (M <= 32, sm_80+) */
    AWQ_KERNEL_WGMMA = 10,  /* linear: fused, warpgroup tensor cores (wgmma, sm_90a) */
    AWQ_KERNEL_AMX = 11,    /* linear: fused, host, half types on AMX tiles */
} awq_kernel;

#define AWQ_NUM_KERNELS 12

/* The one table of kernel names; NULL for an id out of range. */
static inline const char *awq_kernel_name(int k)
{
    static const char *const names[AWQ_NUM_KERNELS] = {"auto", "v1",   "v2",  "v3",     "v4",
                                                       "cpu",  "simt", "mma", "dequant", "gemv", "wgmma",
                                                       "amx"};
    return k >= 0 && k < AWQ_NUM_KERNELS ? names[k] : NULL;
}

static inline int awq_kernel_parse(const char *name, awq_kernel *out)
{
    for (int i = 0; name != NULL && i < AWQ_NUM_KERNELS; i++)
        if (strcmp(name, awq_kernel_name(i)) == 0) {
            *out = (awq_kernel)i;
            return 0;
        }
    return -1;
}

/* Generation of each backend's kernels.  Bump one whenever a change to its
 * kernels, their defaults or the meaning of a launch parameter could change
 * which configuration is fastest: autotune entries are keyed by it
 * (autotune/autotune.h), so picks tuned for other kernels are never used. */
#define AWQ_CUDA_KERNELS_GEN 10
#define AWQ_CPU_KERNELS_GEN 6

/* CUDA device ordinals the package keeps per-device facts for (device
 * properties, autotune device keys); devices past it work, uncached. */
#define AWQ_MAX_DEVICES 64

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

/* One fused linear problem, y = x @ W + bias with W = dequantize(qweight,
 * qzeros, scales) in x's dtype ([K, N]): validated views, nothing owned.
 * Products and sums in float32, bias added in float32, one rounding to the
 * dtype (DESIGN.md section 7). */
typedef struct {
    const void *x;           /* [M, K], dtype */
    const uint32_t *qweight; /* [K, N/8] */
    const uint32_t *qzeros;  /* [K/G, N/8] */
    const void *scales;      /* [K/G, N], dtype */
    const void *bias;        /* [N], dtype; NULL: no bias */
    void *y;                 /* [M, N], dtype */
    int64_t M;               /* rows of x and y (the product of x's leading dimensions) */
    int64_t K;               /* in_features */
    int64_t N;               /* out_features, a multiple of 8 */
    int64_t G;               /* group size, divides K */
    awq_dtype dtype;         /* of x, scales, bias and y */
    int device;              /* -1: host memory; >= 0: CUDA device ordinal */
    void *stream;            /* cudaStream_t on that device; NULL is the legacy default stream */
} awq_linear_problem;

/* A launch configuration.  Zero in any field means "the kernel's default".
 * What a field means depends on the kernel (its backend documents it). */
typedef struct {
    int kernel;     /* awq_kernel */
    int block_size; /* CUDA threads per block; a multiple of 32 in [32, 1024] */
    int rows;       /* v4: rows of one group per thread; mma: m16 tiles per warp; gemv: ring stages;
                       a power of two up to 64 */
    int split;      /* linear: slices of K reduced in a fixed order (CUDA: blocks of a cluster) */
    int threads;    /* CPU: worker threads */
    int64_t chunk;  /* CPU: rows (dequantize) or columns (linear) per work item */
} awq_config;

/* Splits of K a configuration may ask for. */
#define AWQ_MAX_SPLIT 64

/* The M bucket of a linear problem: the smallest power of two >= M, with
 * every M above 4096 in one bucket (8192).  The fused/dequantize choice and
 * the launch configuration are tuned per bucket. */
#define AWQ_M_BUCKET_MAX 8192
static inline int64_t awq_m_bucket(int64_t M)
{
    int64_t b = 1;
    while (b < M && b < AWQ_M_BUCKET_MAX)
        b <<= 1;
    return b;
}

/* Output elements the problem writes: K * N. */
static inline int64_t awq_numel(const awq_problem *p) { return p->K * p->N; }

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

/* Whether the switch `name` (an environment variable) is on: set to anything
 * but "" or "0". The rule of every AWQ_FAST_DEQUANT_* on/off switch but
 * AWQ_FAST_DEQUANT_AUTOTUNE, which is on unless it is turned off. */
static inline int awq_env_switch(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

#ifdef __cplusplus
}
#endif

#endif /* AWQ_H */
