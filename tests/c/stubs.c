/*
 * stubs.c -- stand-ins for the CPU backend so that csrc/autotune/ can be
 * tested alone (the real ones live in csrc/cpu/).
 *
 * awq_cpu_dequantize sleeps instead of working: 50 us for the one
 * configuration the test expects the tuner to pick (threads 2, chunk 32),
 * 300 us for every other one, and returns stub_status when that is set.
 */
#define _POSIX_C_SOURCE 200809L

#include <time.h>

#include "cpu/cpu.h"

awq_status stub_status = AWQ_OK;
int stub_calls = 0;

awq_status awq_cpu_dequantize(const awq_problem *p, const awq_config *c)
{
    (void)p;
    stub_calls++;
    if (stub_status != AWQ_OK)
        return stub_status;
    long ns = c->threads == 2 && c->chunk == 32 ? 50000L : 300000L;
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
    return AWQ_OK;
}

int awq_cpu_max_threads(void) { return 6; }

awq_status awq_cpu_linear(const awq_linear_problem *p, const awq_config *c)
{
    (void)p;
    (void)c;
    stub_calls++;
    return stub_status;
}
