/*
 * dequantize.h -- the entry points dequantize and smart_dequantize.
 *
 * A call goes: arguments (args.c) -> views and stream (views.c) ->
 * validation (validate.c) -> the result array in the caller's framework
 * (alloc.c) -> the autotune cache for smart_dequantize (cache.c) -> the
 * backend (run.c).
 */
#ifndef AWQ_DEQUANTIZE_H
#define AWQ_DEQUANTIZE_H

#include "args.h"

/* One prepared call: validated problem, configuration, and the result
 * (the caller's out, or a new array), ready to run. */
typedef struct {
    awq_dequantize_call call;
    awq_problem p;
    awq_config cfg;
    PyObject *result;
    awq_view outv;
    int have_outv;
} awq_dequantize_job;

/* Views, validation, stream and result for the arguments in slots
 * (indexed by AWQ_KW_*).  0, or -1 with an exception set; either way
 * awq_dequantize_job_release must follow. */
int awq_dequantize_job_prepare(PyObject *module, PyObject *const *slots, int smart,
                               awq_dequantize_job *job);

/* Releases the views; returns the result (a new reference) when keep is
 * set and the job holds one, else NULL. */
PyObject *awq_dequantize_job_release(awq_dequantize_job *job, int keep);

PyObject *awq_py_dequantize(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames);
PyObject *awq_py_smart_dequantize(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames);

#endif /* AWQ_DEQUANTIZE_H */
