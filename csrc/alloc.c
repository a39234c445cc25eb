/*
 * alloc.c -- a new array in the caller's framework (alloc.h).
 */
#include "alloc.h"

#include <string.h>

typedef struct {
    char kind[64];
    char message[512];
    int set;
} alloc_error;

static void alloc_set_error(void *ctx, const char *kind, const char *message)
{
    alloc_error *e = (alloc_error *)ctx;
    snprintf(e->kind, sizeof e->kind, "%s", kind ? kind : "RuntimeError");
    snprintf(e->message, sizeof e->message, "%s", message ? message : "allocation failed");
    e->set = 1;
}

static PyObject *through_exchange_api(const awq_view *likev, int ndim, const int64_t *shape,
                                      awq_dtype dtype, awq_view *outv)
{
    int64_t shp[AWQ_VIEW_MAX_NDIM];
    memcpy(shp, shape, (size_t)ndim * sizeof *shp);
    DLTensor proto;
    memset(&proto, 0, sizeof proto);
    proto.device = likev->device;
    proto.ndim = ndim;
    proto.dtype = awq_dl_of(dtype);
    proto.shape = shp;
    DLManagedTensorVersioned *mt = NULL;
    alloc_error err = {{0}, {0}, 0};
    if (likev->api->managed_tensor_allocator(&proto, &mt, &err, alloc_set_error) != 0 ||
        mt == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(strcmp(err.kind, "MemoryError") == 0 ? PyExc_MemoryError
                                                                : PyExc_RuntimeError,
                         "could not allocate the result (%s): %s", awq_dtype_name(dtype),
                         err.set ? err.message : "allocator failed");
        return NULL;
    }
    outv->data = (char *)mt->dl_tensor.data + mt->dl_tensor.byte_offset;
    outv->ndim = ndim;
    memcpy(outv->shape, shape, (size_t)ndim * sizeof *shape);
    outv->dtype = proto.dtype;
    outv->device = likev->device;
    outv->c_contiguous = outv->aligned = 1;
    void *obj = NULL;
    if (likev->api->managed_tensor_to_py_object_no_sync(mt, &obj) != 0)
        return NULL; /* the producer took ownership of mt either way */
    return (PyObject *)obj;
}

PyObject *awq_alloc_like(awq_state *st, PyObject *like, const awq_view *likev, int ndim,
                         const int64_t *shape, awq_dtype dtype, awq_view *outv)
{
    memset(outv, 0, sizeof(*outv));
    if (likev->is_numpy && dtype != AWQ_BF16) {
        npy_intp dims[AWQ_VIEW_MAX_NDIM];
        for (int i = 0; i < ndim; i++)
            dims[i] = (npy_intp)shape[i];
        PyObject *res = PyArray_SimpleNew(ndim, dims, dtype == AWQ_F16 ? NPY_HALF : NPY_FLOAT32);
        if (res != NULL)
            outv->data = PyArray_BYTES((PyArrayObject *)res);
        return res;
    }
    if (likev->api != NULL)
        return through_exchange_api(likev, ndim, shape, dtype, outv);
    if (st->allocator == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "awq_fast_dequant: no output allocator registered");
        return NULL;
    }
    PyObject *shp = PyTuple_New(ndim);
    if (shp == NULL)
        return NULL;
    for (int i = 0; i < ndim; i++) {
        PyObject *d = PyLong_FromLongLong((long long)shape[i]);
        if (d == NULL) {
            Py_DECREF(shp);
            return NULL;
        }
        PyTuple_SET_ITEM(shp, i, d);
    }
    PyObject *res = PyObject_CallFunction(st->allocator, "OiiOs", like, (int)likev->device.device_type,
                                          (int)likev->device.device_id, shp, awq_dtype_name(dtype));
    Py_DECREF(shp);
    if (res == NULL)
        return NULL;
    awq_view_opts opts = {0, 1, 0, 0};
    awq_ndim want = {ndim, ndim};
    if (awq_view_from_object(st, res, "out", want, &opts, outv) < 0) {
        Py_DECREF(res);
        return NULL;
    }
    return res;
}
