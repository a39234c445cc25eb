/*
 * cache.h -- the autotune cache as the entry points see it: the lookup (or
 * tuning) behind smart_dequantize, and its Python face (path, entries,
 * stats, clear).  The table, the file and the tuning loop are autotune/.
 */
#ifndef AWQ_CACHE_H
#define AWQ_CACHE_H

#include "pyawq.h"

/* For a validated, non-empty problem: on a cache hit *cfg becomes the
 * tuned configuration; on a miss the candidates are timed (writing the
 * result into p->out) and *done is set; during CUDA graph capture, or with
 * AWQ_FAST_DEQUANT_AUTOTUNE=0, *cfg stays the default.  0, or -1 with an
 * exception set. */
int awq_cache_dequantize(PyObject *module, const awq_problem *p, awq_config *cfg, int *done);

/* Times linear's dequantize path once for tuning (the GIL held): 0 with *us,
 * or -1 with an exception set. */
typedef int (*awq_linear_timer)(void *ctx, float *us);

/* The configuration a linear call runs, for path (awq_path): "dequant"
 * gives AWQ_KERNEL_DEQUANT; "fused" the tuned fused configuration or the
 * backend's default; "auto" the tuned choice for the problem's M bucket --
 * on a miss the fused candidates and the dequantize path (through
 * dequant_timer) are timed, and the fastest is remembered; with
 * AWQ_FAST_DEQUANT_AUTOTUNE=0 or during CUDA graph capture, the measured
 * defaults.  The call's output may hold a timed run's result: the caller
 * runs the returned configuration.  0, or -1 with an exception set. */
int awq_cache_linear(PyObject *module, const awq_linear_problem *p, int path,
                     awq_linear_timer dequant_timer, void *timer_ctx, awq_config *cfg);

/* Forget the table in memory and what was read from the environment: the
 * next use reads the file again (the development entry _dev.cache_reload). */
void awq_cache_reset(awq_state *st);

PyObject *awq_py_cache_path(PyObject *module, PyObject *unused);
PyObject *awq_py_cache_entries(PyObject *module, PyObject *unused);
PyObject *awq_py_cache_stats(PyObject *module, PyObject *unused);
PyObject *awq_py_clear_cache(PyObject *module, PyObject *unused);

#endif /* AWQ_CACHE_H */
