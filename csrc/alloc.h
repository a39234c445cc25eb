/*
 * alloc.h -- a new array in the caller's framework, for results.
 *
 * NumPy inputs get a NumPy array (bfloat16 through the package's hook,
 * which uses ml_dtypes); producers with the DLPack C exchange API (torch)
 * allocate through it, on their own allocator and stream; everything else
 * (CuPy) through the package's Python hook.
 */
#ifndef AWQ_ALLOC_H
#define AWQ_ALLOC_H

#include "views.h"

/* A new C-contiguous array of `shape` (ndim dimensions) and `dtype` on the
 * device of `likev`, in the framework of `like`; *outv receives its view.
 * Returns a new reference, or NULL with an exception set. */
PyObject *awq_alloc_like(awq_state *st, PyObject *like, const awq_view *likev, int ndim,
                         const int64_t *shape, awq_dtype dtype, awq_view *outv);

#endif /* AWQ_ALLOC_H */
