/*
 * cpu/tune.c -- what the autotuner tries on the host, and its clock there.
 */
#define _POSIX_C_SOURCE 200809L

#include "autotune/autotune.h"
#include "cpu/cpu.h"

#include <time.h>

int awq_cpu_candidates(const awq_problem *p, awq_config *configs, int cap)
{
    static const int64_t chunks[] = {8, 32, 128, 512};
    return awq_cpu_grid_candidates(AWQ_KERNEL_CPU, chunks, (int)(sizeof chunks / sizeof chunks[0]),
                                   p ? p->K : 0, 1, configs, cap);
}

double awq_cpu_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* One run of the timed problem. */
static awq_status run_once(const awq_cpu_timing *o, const awq_config *c)
{
    return o->p != NULL ? awq_cpu_dequantize(o->p, c) : awq_cpu_linear(o->lp, c);
}

awq_status awq_cpu_time(const awq_config *c, float *us, int *detail, void *ctx)
{
    const awq_cpu_timing *o = ctx;
    if (detail)
        *detail = 0;
    if (o == NULL || (o->p == NULL) == (o->lp == NULL))
        return AWQ_ERR_CONFIG;
    int warmup = o->warmup > 0 ? o->warmup : 1;
    int runs = o->runs > 0 ? o->runs : 3;
    double budget = o->budget_us > 0.0 ? o->budget_us : o->budget_us < 0.0 ? 0.0 : 20000.0;
    for (int i = 0; i < warmup; i++) {
        awq_status s = run_once(o, c);
        if (s != AWQ_OK)
            return s;
    }
    double best = 0.0, spent = 0.0;
    for (int i = 0; i < runs; i++) {
        double t0 = awq_cpu_now_us();
        awq_status s = run_once(o, c);
        double dt = awq_cpu_now_us() - t0;
        if (s != AWQ_OK)
            return s;
        if (i == 0 || dt < best)
            best = dt;
        spent += dt;
        if (budget > 0.0 && spent >= budget)
            break;
    }
    *us = (float)best;
    return AWQ_OK;
}
