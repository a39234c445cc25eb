/*
 * cpu/platform.c -- what the host offers the CPU kernels: the vector path
 * (AVX2 + F16C, chosen at run time), OpenMP's threads, and fork safety.
 *
 * GNU OpenMP's thread pool does not survive fork(): a child whose parent
 * has run a parallel region waits forever for pool threads that were not
 * copied into it.  The first parallel use registers an at-fork handler that
 * marks every child from then on; a marked process runs the CPU kernels on
 * its one thread, without entering a parallel region (PyTorch does the
 * same).  The parent is untouched: the check is one load of a flag.
 * A child started with spawn or forkserver is a fresh process and gets the
 * full pool.
 */
#define _POSIX_C_SOURCE 200809L

#include "cpu/cpu.h"

#include <pthread.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

int awq_cpu_has_openmp(void)
{
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* Set in the child of a fork that followed a parallel region: process-wide
 * by nature (it describes this process), written only by the at-fork
 * handler, which runs single-threaded in the child. */
static volatile int forked_child;

static void mark_child(void) { forked_child = 1; }

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void register_atfork(void) { (void)pthread_atfork(NULL, NULL, mark_child); }

int awq_cpu_max_threads(void)
{
#ifdef _OPENMP
    return forked_child ? 1 : omp_get_max_threads();
#else
    return 1;
#endif
}

int awq_cpu_threads(int requested)
{
    (void)pthread_once(&atfork_once, register_atfork);
    const int max = awq_cpu_max_threads();
    return requested > 0 && requested < max ? requested : max;
}

int awq_cpu_use_avx2(void)
{
#ifdef AWQ_X86_DISPATCH
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
                 !awq_env_switch("AWQ_FAST_DEQUANT_CPU_SCALAR");
    }
    return cached;
#else
    return 0;
#endif
}

const char *awq_cpu_simd(void) { return awq_cpu_use_avx2() ? "avx2+f16c" : "scalar"; }
