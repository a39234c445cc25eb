/*
 * prepared.h -- the entry point of the prepared-layout kernel:
 *
 *     _linear_prepared(x, words, operands, bias, group_size, out) -> y
 *
 * y = x @ W + bias on CUDA (compute capability 9.0), W given in the layout
 * cuda/linear_prepared.cuh describes (made by awq_fast_dequant.torch's
 * prepare_prefill from qweight, qzeros and scales); bias and out may be
 * None.  Every argument is checked (dtypes, devices, layout, shapes,
 * alignment, overlap) before anything runs, with a clear exception.
 */
#ifndef AWQ_PREPARED_H
#define AWQ_PREPARED_H

#include "pyawq.h"

PyObject *awq_py_linear_prepared(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* _prepared_supported(device) -> bool: whether this build runs it on that CUDA device. */
PyObject *awq_py_prepared_supported(PyObject *module, PyObject *arg);

#endif /* AWQ_PREPARED_H */
