/*
 * run.h -- running a validated problem on its backend, and turning a
 * backend's status into a Python exception.
 *
 * The bottom of every call's path: nothing here calls back up into the
 * entry points, the cache or the argument layer.
 */
#ifndef AWQ_RUN_H
#define AWQ_RUN_H

#include "pyawq.h"

/* Raises the exception for a status (nothing for AWQ_OK); `device` is the
 * problem's device (-1 the host).  0 for AWQ_OK, else -1. */
int awq_raise_status(awq_status s, int detail, int device);

/* Runs one dequantization (the GIL released on the CPU); 0, or -1 with an
 * exception set. */
int awq_run_dequantize(const awq_problem *p, const awq_config *c);

/* Runs one fused linear (c->kernel: AWQ_KERNEL_CPU on the host, GEMV, MMA or
 * SIMT on CUDA; the GIL released on the CPU); 0, or -1 with an exception set. */
int awq_run_linear(const awq_linear_problem *p, const awq_config *c);
/* The same for a configuration from the autotune cache, which is keyed by the
 * layer and the M bucket, not by the arrays' alignment: where the tuned
 * kernel cannot take these arrays (a misaligned view of a layer tuned on
 * aligned ones), the backend's default configuration runs instead. */
int awq_run_linear_tuned(const awq_linear_problem *p, const awq_config *c);

#endif /* AWQ_RUN_H */
