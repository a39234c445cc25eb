/*
 * linear.h -- the entry point linear(x, qweight, qzeros, scales, bias=None,
 * *, group_size=None, out=None, stream=None, path="auto") -> y.
 *
 * y = x @ W + bias with W = dequantize(qweight, qzeros, scales,
 * out_dtype=x.dtype), DESIGN.md section 7.  linear.c has the path of a call.
 */
#ifndef AWQ_LINEAR_H
#define AWQ_LINEAR_H

#include "pyawq.h"

PyObject *awq_py_linear(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames);

#endif /* AWQ_LINEAR_H */
