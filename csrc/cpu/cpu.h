/*
 * cpu/cpu.h -- the host backend's entry points.
 *
 * Pure C: nothing here touches a Python object, so callers release the GIL
 * around every call.
 */
#ifndef AWQ_CPU_H
#define AWQ_CPU_H

#include "awq.h"
#include "autotune/autotune.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The x86 vector paths, chosen at run time, need GCC's or Clang's target
 * attributes and __builtin_cpu_supports. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define AWQ_X86_DISPATCH 1
#include <xmmintrin.h> /* MXCSR */
#endif

/* The floating-point environment the fused kernels' sums are defined in,
 * per thread: round to nearest even, subnormals neither flushed nor read as
 * zero (MXCSR's default).  A caller may have changed its own (PyTorch's
 * set_flush_denormal does, and threads inherit it), which would change the
 * bits of sums that pass through the subnormals.  Returns the caller's, for
 * awq_cpu_fp_leave. */
static inline unsigned awq_cpu_fp_enter(void)
{
#ifdef AWQ_X86_DISPATCH
    unsigned old = _mm_getcsr();
    _mm_setcsr(0x1F80u); /* all exceptions masked, round to nearest, no FTZ / DAZ */
    return old;
#else
    return 0;
#endif
}

static inline void awq_cpu_fp_leave(unsigned old)
{
#ifdef AWQ_X86_DISPATCH
    _mm_setcsr(old);
#else
    (void)old;
#endif
}

/* ---- kernels ---- */

awq_status awq_cpu_dequantize(const awq_problem *p, const awq_config *c);

/* The fused linear on the host (cpu/linear.c): y = x @ W + bias, W computed
 * from the packed words on the fly (exactly dequantize's values), float32
 * products and sums, one rounding.  c->threads: worker threads (0 = all);
 * c->chunk: output columns per work item, a multiple of 8 (0 = the
 * default).  Deterministic: the order of every sum is fixed by the problem
 * and the configuration, never by the threads' timing. */
awq_status awq_cpu_linear(const awq_linear_problem *p, const awq_config *c);
/* The fused linear on AMX tiles (cpu/amx.c), the same contract.  c->chunk:
 * output columns per work item, a multiple of 64 up to 1024 (0 = the
 * default).  Sets *ran to 1 when it computed y; 0 when the call is not one
 * the tiles can take (an odd G; float16 or float32 with G neither a
 * multiple of 32 nor K; no AMX on this host or build; or a value of x or
 * the scales outside what cpu/amx.c takes), for awq_cpu_linear's kernel
 * to run.
 * Every configuration gives the same bits. */
awq_status awq_cpu_linear_amx(const awq_linear_problem *p, const awq_config *c, int *ran);
/* Rows of x per work item of the AMX kernel. */
#define AWQ_CPU_AMX_ROWS 256
/* 1 when this host and build run AMX tiles (and this process was granted
 * their state); 0 with AWQ_FAST_DEQUANT_CPU_SCALAR or AWQ_FAST_DEQUANT_NO_AMX
 * set (read once). */
int awq_cpu_amx_ready(void);
/* 1 when the AMX kernel may take problems of p's kind: K > 0, G even (for
 * float16 and float32 also a multiple of 32, or K), and awq_cpu_amx_ready().  (Its
 * values may still send a call to awq_cpu_linear's kernel.) */
int awq_cpu_amx_fits(const awq_linear_problem *p);
/* The vector path the fused linear takes on this CPU: "avx512f+f16c",
 * "avx2+f16c+fma" or "scalar" (AWQ_FAST_DEQUANT_CPU_SCALAR set to anything
 * but "" or "0" forces it).
 * Every path gives the same bits. */
const char *awq_cpu_linear_simd(void);

/* ---- the platform (cpu/platform.c) ---- */

int awq_cpu_has_openmp(void);
/* OpenMP's thread count; 1 in a child forked after a parallel region. */
int awq_cpu_max_threads(void);
/* Threads for a parallel region: `requested` (0 = all) clamped to the
 * maximum.  Call right before the region: the first call registers the
 * at-fork handler that makes a forked child run on one thread.  A result
 * of 1 means: run serially, outside any parallel region. */
int awq_cpu_threads(int requested);
/* The thread counts the tuners try: 1, 2, 4, ... below max, then max;
 * returns how many were written (at most cap). */
static inline int awq_cpu_thread_counts(int max, int *counts, int cap)
{
    int n = 0;
    if (max < 1)
        max = 1;
    for (int t = 1; t < max && n < cap - 1; t *= 2)
        counts[n++] = t;
    if (n < cap)
        counts[n++] = max;
    return n;
}

/* The search space the CPU kernels share: kernel's default (threads =
 * chunk = 0) first, then threads in {1, 2, 4, ... < max, max} (max =
 * awq_cpu_max_threads()) times the given chunks, without chunks past the one
 * that already covers extent and without more threads than work items
 * (ceil(extent / chunk) * items_per_chunk).  An extent or items_per_chunk
 * that is not positive gives the default alone.  Returns how many were
 * written (at most cap). */
static inline int awq_cpu_grid_candidates(int kernel, const int64_t *chunks, int nchunks,
                                          int64_t extent, int64_t items_per_chunk,
                                          awq_config *configs, int cap)
{
    if (!configs || cap <= 0)
        return 0;
    int n = 0;
    configs[n++] = (awq_config){.kernel = kernel}; /* the default: ties keep it */
    if (extent <= 0 || items_per_chunk <= 0)
        return n;

    int threads[34];
    const int nt = awq_cpu_thread_counts(awq_cpu_max_threads(), threads, 34);

    for (int ti = 0; ti < nt; ti++) {
        for (int ci = 0; ci < nchunks; ci++) {
            if (ci > 0 && chunks[ci - 1] >= extent)
                break; /* the previous chunk already held all of the extent */
            int64_t items = (extent + chunks[ci] - 1) / chunks[ci] * items_per_chunk;
            if (threads[ti] > 1 && threads[ti] > items)
                continue; /* some threads would have nothing to do */
            if (n == cap)
                return n;
            configs[n++] =
                (awq_config){.kernel = kernel, .threads = threads[ti], .chunk = chunks[ci]};
        }
    }
    return n;
}

/* 1 when the AVX2 + F16C kernels run (the CPU has both, and
 * AWQ_FAST_DEQUANT_CPU_SCALAR is unset, empty or "0"; read once). */
int awq_cpu_use_avx2(void);
const char *awq_cpu_simd(void); /* the vector path the running CPU takes, e.g. "avx2+f16c" */

/* ---- tuning (cpu/tune.c) ---- */

/* dequantize's search space (awq_cpu_grid_candidates): chunk in {8, 32,
 * 128, 512} rows of K. */
int awq_cpu_candidates(const awq_problem *p, awq_config *configs, int cap);

/* The fused linear's (cpu/linear.c): chunk in {64, 128, ..., 8192} columns
 * of N, each for every block of rows of x.  Every configuration gives the
 * same bits.  Where the AMX kernel may take the problem
 * (awq_cpu_amx_fits), then its (cpu/amx.c): chunk in {128, 256, 512,
 * 1024}; its configurations give the same bits as each other. */
int awq_cpu_linear_candidates(const awq_linear_problem *p, awq_config *configs, int cap);

/* The ctx of awq_cpu_time: the problem (exactly one of p and lp) and how to
 * time it (0 fields: warmup 1, runs 3, budget_us 20000). */
typedef struct {
    const awq_problem *p;          /* a dequantize problem, or NULL */
    const awq_linear_problem *lp;  /* a linear problem, or NULL */
    int warmup;       /* untimed runs first */
    int runs;         /* timed runs; the best one is reported */
    double budget_us; /* stop timing early once the timed runs took this long (< 0: never) */
} awq_cpu_timing;

/* An awq_time_fn: runs awq_cpu_dequantize or awq_cpu_linear, timed with
 * CLOCK_MONOTONIC, best of a few runs.  *detail is set to 0. */
awq_status awq_cpu_time(const awq_config *c, float *us, int *detail, void *ctx);

/* CLOCK_MONOTONIC in microseconds: the host clock of every timing above. */
double awq_cpu_now_us(void);


#ifdef __cplusplus
}
#endif

#endif /* AWQ_CPU_H */
