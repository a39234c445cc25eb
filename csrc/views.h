/*
 * views.h -- a Python object turned into a validated view of its memory,
 * and every decision about CUDA streams.
 *
 * NumPy arrays are read through the NumPy C API (read-only arrays are fine
 * as inputs); every other object through DLPack: the producer's C exchange
 * API when its type has one, else __dlpack_device__ and __dlpack__.  A view
 * holds whatever keeps the memory alive until awq_view_release().
 *
 * Streams: a call's `stream` argument is parsed here (awq_stream_begin),
 * handed to __dlpack__ so that the producer orders its pending work before
 * ours, and resolved to the stream the launch uses (awq_stream_of): the
 * caller's, else the producer's current stream of the device, else the
 * legacy default.  Nothing else in the package decides about streams.
 */
#ifndef AWQ_VIEWS_H
#define AWQ_VIEWS_H

#include "pyawq.h"

/* Views have at most this many dimensions (x of linear may be N-D). */
#define AWQ_VIEW_MAX_NDIM 8

typedef struct {
    char *data;         /* first element (byte_offset applied) */
    int ndim;
    int64_t shape[AWQ_VIEW_MAX_NDIM];
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

/* How views of one call are taken: the stream the caller gave (if any). */
typedef struct {
    int have_stream;    /* the caller gave `stream` explicitly (or the framework hook did) */
    intptr_t stream;    /* DLPack stream value for __dlpack__ (1 = legacy default) */
    intptr_t handle;    /* the handle as given: 0 or 1 is the legacy default stream */
    int explicit_stream; /* it came from the call's `stream` argument */
} awq_view_opts;

/* A `stream` argument -- None, an int (or any object with __index__)
 * handle, or an object with .cuda_stream or .ptr -- into *opts.  0, or -1
 * with an exception set. */
int awq_parse_stream(awq_state *st, PyObject *o, awq_view_opts *opts);

/* The stream options of a call before any view is taken: the caller's
 * `stream` when given, else the current stream of `like`'s framework for
 * producers that cannot tell it through the exchange API (CuPy, via the
 * package's hook).  0, or -1 with an exception set. */
int awq_stream_begin(awq_state *st, PyObject *stream_arg, PyObject *like, awq_view_opts *opts);

/* The stream a launch on `device` uses for views taken with *opts, `v`
 * being the view of the call's first array.  0, or -1 with an exception set. */
int awq_stream_of(const awq_view_opts *opts, const awq_view *v, int device, void **stream);

/* The DLPack C exchange API of an object's type (looked up once per type). */
const DLPackExchangeAPI *awq_exchange_api(awq_state *st, PyObject *obj);

/* Dimensions a view may have. */
typedef struct {
    int min_ndim, max_ndim;
} awq_ndim;

#define AWQ_NDIM_2D ((awq_ndim){2, 2})

/* Fill *v from obj.  `name` is the argument's name for error messages.
 * Returns 0, or -1 with a Python exception set (v then holds nothing). */
int awq_view_from_object(awq_state *st, PyObject *obj, const char *name, awq_ndim ndim,
                         const awq_view_opts *opts, awq_view *v);

void awq_view_release(awq_view *v);

/* Ends a call: releases views[i] where have[i] is set, and result_view
 * (the view of a result the call allocated; NULL when none), then returns
 * *result (moved out) when keep is set, else drops it and returns NULL. */
PyObject *awq_call_end(awq_view *views, const int *have, int n, awq_view *result_view,
                       PyObject **result, int keep);

/* Elements of a view (the product of its shape). */
int64_t awq_view_numel(const awq_view *v);

/* Bytes spanned by a C-contiguous view. */
int64_t awq_view_nbytes(const awq_view *v);

/* "float16", "int32", ... for messages: NumPy's words for NumPy arrays. */
const char *awq_view_dtype_name(const awq_view *v, char *buf, size_t n);

/* "cpu" or "cuda:N" for messages. */
const char *awq_device_str(DLDevice d, char *buf, size_t n);

/* The awq_dtype of a DLPack dtype: 0, or -1 when it is none of them. */
int awq_dtype_from_dl(DLDataType t, awq_dtype *out);

/* The DLPack dtype of an awq_dtype. */
DLDataType awq_dl_of(awq_dtype t);

/* 1 when the two views share a byte of memory on one device. */
int awq_views_overlap(const awq_view *a, const awq_view *b);

#endif /* AWQ_VIEWS_H */
