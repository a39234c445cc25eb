/*
 * linear.h -- the entry point linear(x, qweight, qzeros, scales, bias=None,
 * *, group_size=None, out=None, stream=None, path="auto") -> y.
 *
 * y = x @ W + bias with W = dequantize(qweight, qzeros, scales,
 * out_dtype=x.dtype), DESIGN.md section 7.  linear.c has the path of a call.
 */
#ifndef AWQ_LINEAR_H
#define AWQ_LINEAR_H

#include "args.h"

/* One prepared call: validated problem and path, the stream options, the
 * caller's objects, and the result (the caller's out, or a new array). */
typedef struct {
    PyObject *module;
    awq_linear_call call;
    awq_linear_problem p;
    awq_path path;
    awq_view_opts opts;
    PyObject *x, *bias; /* borrowed: the caller's objects (bias may be Py_None) */
    PyObject *result;   /* y (owned) */
    awq_view yv;
    int have_yv;
} awq_linear_job;

/* Views, validation, stream and result for the arguments in slots
 * (indexed by AWQ_KW_*).  0, or -1 with an exception set; either way
 * awq_linear_job_release must follow. */
int awq_linear_job_prepare(PyObject *module, PyObject *const *slots, awq_linear_job *job);

/* Releases the views; returns the result (a new reference) when keep is
 * set, else NULL. */
PyObject *awq_linear_job_release(awq_linear_job *job, int keep);

/* Runs the dequantize path of a prepared job; 0, or -1 with an exception. */
int awq_linear_run_dequant_path(const awq_linear_job *job);

PyObject *awq_py_linear(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames);

#endif /* AWQ_LINEAR_H */
