/*
 * buffers.h -- a Python object turned into a validated 2-D view.
 *
 * NumPy arrays are read through the NumPy C API (read-only arrays are
 * fine as inputs); every other object through DLPack: the producer's C
 * exchange API when its type has one, else __dlpack_device__ and
 * __dlpack__.  A view holds whatever keeps the memory alive until
 * awq_view_release().
 */
#ifndef AWQ_BUFFERS_H
#define AWQ_BUFFERS_H

#include "pyawq.h"

typedef struct {
    char *data;         /* first element (byte_offset applied) */
    int ndim;
    int64_t shape[2];
    int c_contiguous;   /* strides agree with a C-contiguous layout */
    int aligned;        /* data aligned to the element size */
    DLDataType dtype;
    DLDevice device;    /* CPU memory is reported as kDLCPU */
    int readonly;
    int is_numpy;
    const DLPackExchangeAPI *api; /* producer's exchange API, if any */
    /* ownership: exactly one of these is set (or none for exchange views) */
    PyObject *ref;                 /* a NumPy array or a renamed capsule */
    DLManagedTensorVersioned *mv;
    DLManagedTensor *m;
} awq_view;

/* How a view should be taken. */
typedef struct {
    int have_stream;    /* the caller gave `stream` explicitly */
    intptr_t stream;    /* DLPack stream value for __dlpack__ (1 = legacy default) */
} awq_view_opts;

/* A `stream` argument -- None, an int handle, or an object with .cuda_stream
 * or .ptr -- into *opts, and its handle as given (0 for None); 0, or -1 with
 * an exception set. */
int awq_parse_stream(awq_state *st, PyObject *o, awq_view_opts *opts, intptr_t *handle);

/* Look up (and cache) the DLPack C exchange API of an object's type. */
const DLPackExchangeAPI *awq_exchange_api(awq_state *st, PyObject *obj);

/* Fill *v from obj.  `name` is the argument's name for error messages.
 * Returns 0, or -1 with a Python exception set (v then holds nothing). */
int awq_view_from_object(awq_state *st, PyObject *obj, const char *name,
                         const awq_view_opts *opts, awq_view *v);

void awq_view_release(awq_view *v);

/* Bytes spanned by a C-contiguous view. */
int64_t awq_view_nbytes(const awq_view *v);

/* "float16", "int32", ... for messages. */
const char *awq_dl_dtype_name(DLDataType t, char *buf, size_t n);

#endif /* AWQ_BUFFERS_H */
