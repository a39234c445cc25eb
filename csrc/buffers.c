/*
 * buffers.c -- Python object -> awq_view (see buffers.h).
 */
#include "buffers.h"

#include <string.h>

const char *awq_dl_dtype_name(DLDataType t, char *buf, size_t n)
{
    const char *kind = "unknown";
    if (t.lanes != 1) {
        snprintf(buf, n, "vector dtype (lanes=%u)", (unsigned)t.lanes);
        return buf;
    }
    switch (t.code) {
    case kDLInt: kind = "int"; break;
    case kDLUInt: kind = "uint"; break;
    case kDLFloat: kind = "float"; break;
    case kDLBfloat: kind = "bfloat"; break;
    default: snprintf(buf, n, "dtype code %u (%u bits)", (unsigned)t.code, (unsigned)t.bits);
        return buf;
    }
    snprintf(buf, n, "%s%u", kind, (unsigned)t.bits);
    return buf;
}

int64_t awq_view_nbytes(const awq_view *v)
{
    int64_t n = v->dtype.bits / 8;
    for (int i = 0; i < v->ndim; i++)
        n *= v->shape[i];
    return n;
}

void awq_view_release(awq_view *v)
{
    if (v->mv != NULL && v->mv->deleter != NULL)
        v->mv->deleter(v->mv);
    if (v->m != NULL && v->m->deleter != NULL)
        v->m->deleter(v->m);
    v->mv = NULL;
    v->m = NULL;
    Py_CLEAR(v->ref);
}

/* Shape, strides (elements, NULL = C order) -> the view's geometry. */
static int take_geometry(awq_view *v, const char *name, int32_t ndim, const int64_t *shape,
                         const int64_t *strides)
{
    if (ndim != 2) {
        PyErr_Format(PyExc_ValueError, "%s must be a 2-D array, got %d dimension%s", name,
                     (int)ndim, ndim == 1 ? "" : "s");
        return -1;
    }
    v->ndim = 2;
    v->shape[0] = shape[0];
    v->shape[1] = shape[1];
    v->c_contiguous = 1;
    if (strides != NULL) {
        /* A dimension of extent 1 (or an empty array) may carry any stride. */
        int empty = shape[0] == 0 || shape[1] == 0;
        if (!empty && shape[1] != 1 && strides[1] != 1)
            v->c_contiguous = 0;
        if (!empty && shape[0] != 1 && strides[0] != shape[1])
            v->c_contiguous = 0;
    }
    return 0;
}

static int view_from_numpy(PyArrayObject *arr, const char *name, awq_view *v)
{
    PyArray_Descr *d = PyArray_DESCR(arr);
    int itemsize = (int)PyArray_ITEMSIZE(arr);
    char kind = d->kind;

    if (!PyArray_ISNOTSWAPPED(arr)) {
        PyErr_Format(PyExc_TypeError,
                     "%s has non-native byte order; convert it with "
                     "arr.astype(arr.dtype.newbyteorder('='))",
                     name);
        return -1;
    }
    v->dtype.lanes = 1;
    v->dtype.bits = (uint8_t)(itemsize * 8);
    if (kind == 'i' && itemsize == 4) {
        v->dtype.code = kDLInt;
    } else if (kind == 'u' && itemsize == 4) {
        v->dtype.code = kDLUInt;
    } else if (kind == 'f' && (itemsize == 2 || itemsize == 4 || itemsize == 8)) {
        v->dtype.code = kDLFloat;
    } else if (itemsize == 2 && d->typeobj != NULL &&
               (strcmp(d->typeobj->tp_name, "bfloat16") == 0 ||
                strcmp(d->typeobj->tp_name, "ml_dtypes.bfloat16") == 0)) {
        /* ml_dtypes.bfloat16: NumPy's usual bfloat16 */
        v->dtype.code = kDLBfloat;
    } else {
        /* Not a type we take; validation names it (in NumPy's words) along
         * with what that argument expects. */
        v->dtype.code = 0xFF;
    }

    int64_t shape[2] = {0, 0}, strides[2] = {0, 0};
    int nd = PyArray_NDIM(arr);
    if (nd == 2) {
        for (int i = 0; i < 2; i++) {
            shape[i] = PyArray_DIM(arr, i);
            npy_intp s = PyArray_STRIDE(arr, i);
            strides[i] = (s % itemsize == 0) ? s / itemsize : INT64_MAX;
        }
    }
    if (take_geometry(v, name, nd, shape, strides) < 0)
        return -1;
    v->data = PyArray_BYTES(arr);
    v->aligned = PyArray_ISALIGNED(arr) ? 1 : 0;
    v->device.device_type = kDLCPU;
    v->device.device_id = 0;
    v->readonly = PyArray_ISWRITEABLE(arr) ? 0 : 1;
    v->is_numpy = 1;
    Py_INCREF(arr);
    v->ref = (PyObject *)arr;
    return 0;
}

static int view_from_dltensor(const DLTensor *t, const char *name, awq_view *v)
{
    if (take_geometry(v, name, t->ndim, t->shape, t->strides) < 0)
        return -1;
    v->dtype = t->dtype;
    v->data = (char *)t->data + t->byte_offset;
    v->device = t->device;
    if (v->device.device_type == kDLCUDAHost) /* pinned host memory is host memory */
        v->device.device_type = kDLCPU;
    if (v->device.device_type == kDLCUDAManaged)
        v->device.device_type = kDLCUDA;
    if (v->device.device_type == kDLCPU)
        v->device.device_id = 0;
    if (v->device.device_type != kDLCPU && v->device.device_type != kDLCUDA) {
        PyErr_Format(PyExc_ValueError,
                     "%s lives on DLPack device type %d; only CPU and CUDA memory are supported",
                     name, (int)t->device.device_type);
        return -1;
    }
    size_t align = t->dtype.bits >= 8 ? t->dtype.bits / 8 : 1;
    v->aligned = ((uintptr_t)v->data % align) == 0;
    return 0;
}

const DLPackExchangeAPI *awq_exchange_api(awq_state *st, PyObject *obj)
{
    PyTypeObject *tp = Py_TYPE(obj);
    for (int i = 0; i < st->api_cache_len; i++)
        if (st->api_cache[i].type == tp)
            return st->api_cache[i].api;

    const DLPackExchangeAPI *api = NULL;
    PyObject *cap = PyObject_GetAttrString((PyObject *)tp, "__dlpack_c_exchange_api__");
    if (cap == NULL) {
        PyErr_Clear();
    } else {
        if (PyCapsule_IsValid(cap, AWQ_DLPACK_EXCHANGE_API_NAME)) {
            api = (const DLPackExchangeAPI *)PyCapsule_GetPointer(cap,
                                                                 AWQ_DLPACK_EXCHANGE_API_NAME);
        } else if (PyLong_Check(cap)) {
            api = (const DLPackExchangeAPI *)PyLong_AsVoidPtr(cap);
        }
        if (PyErr_Occurred()) {
            PyErr_Clear();
            api = NULL;
        }
        /* Only a table of the major version we were written against. */
        if (api != NULL && (api->header.version.major != 1 ||
                            api->dltensor_from_py_object_no_sync == NULL ||
                            api->current_work_stream == NULL ||
                            api->managed_tensor_allocator == NULL ||
                            api->managed_tensor_to_py_object_no_sync == NULL))
            api = NULL;
        Py_DECREF(cap); /* the table lives for the process (DLPack spec) */
    }
    if (st->api_cache_len < AWQ_API_CACHE) {
        Py_INCREF(tp);
        st->api_cache[st->api_cache_len].type = tp;
        st->api_cache[st->api_cache_len].api = api;
        st->api_cache_len++;
    }
    return api;
}

/* 1 when obj has the attribute, 0 when not, -1 on another error
 * (PyObject_HasAttrWithError is 3.13+). */
static int has_attr(PyObject *obj, PyObject *name)
{
    PyObject *a = PyObject_GetAttr(obj, name);
    if (a != NULL) {
        Py_DECREF(a);
        return 1;
    }
    if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

/* obj.__dlpack__(stream=..., max_version=(1, 0)), falling back to the
 * legacy signature on TypeError.  Returns a new reference or NULL. */
static PyObject *call_dlpack(awq_state *st, PyObject *obj, int cuda, intptr_t stream)
{
    PyObject *stream_obj = NULL, *res = NULL, *kwnames = NULL;

    if (cuda) {
        stream_obj = PyLong_FromSsize_t((Py_ssize_t)stream);
        if (stream_obj == NULL)
            return NULL;
    } else {
        stream_obj = Py_NewRef(Py_None);
    }
    PyObject *args[3] = {obj, stream_obj, st->max_version};
    kwnames = PyTuple_Pack(2, st->str_stream, st->str_max_version);
    if (kwnames == NULL)
        goto done;
    res = PyObject_VectorcallMethod(st->str_dlpack, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                    kwnames);
    if (res == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
        /* A producer from before DLPack 1.0 does not know max_version. */
        PyErr_Clear();
        Py_DECREF(kwnames);
        kwnames = PyTuple_Pack(1, st->str_stream);
        if (kwnames == NULL)
            goto done;
        res = PyObject_VectorcallMethod(st->str_dlpack, args,
                                        1 | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames);
    }
done:
    Py_XDECREF(kwnames);
    Py_XDECREF(stream_obj);
    return res;
}

/* __dlpack_device__() -> (device_type, device_id) */
static int query_device(awq_state *st, PyObject *obj, const char *name, DLDevice *dev)
{
    PyObject *t = PyObject_CallMethodNoArgs(obj, st->str_dlpack_device);
    if (t == NULL)
        return -1;
    int ok = PyTuple_Check(t) && PyTuple_GET_SIZE(t) == 2;
    if (ok) {
        long ty = PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
        long id = PyLong_AsLong(PyTuple_GET_ITEM(t, 1));
        ok = !PyErr_Occurred();
        dev->device_type = (DLDeviceType)ty;
        dev->device_id = (int32_t)id;
    }
    Py_DECREF(t);
    if (!ok) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s.__dlpack_device__() did not return (type, id)", name);
        return -1;
    }
    return 0;
}

static int view_from_capsule(PyObject *cap, const char *name, awq_view *v)
{
    if (PyCapsule_IsValid(cap, AWQ_DLPACK_VERSIONED_NAME)) {
        DLManagedTensorVersioned *mv = PyCapsule_GetPointer(cap, AWQ_DLPACK_VERSIONED_NAME);
        if (mv->version.major != AWQ_DLPACK_MAJOR) {
            PyErr_Format(PyExc_BufferError,
                         "%s: DLPack version %u.%u is not supported (this build reads 1.x)", name,
                         (unsigned)mv->version.major, (unsigned)mv->version.minor);
            return -1;
        }
        /* We own it from here on: rename so the capsule won't free it. */
        if (PyCapsule_SetName(cap, AWQ_DLPACK_VERSIONED_USED_NAME) < 0)
            return -1;
        v->mv = mv;
        if (view_from_dltensor(&mv->dl_tensor, name, v) < 0)
            return -1;
        v->readonly = (mv->flags & DLPACK_FLAG_BITMASK_READ_ONLY) ? 1 : 0;
        return 0;
    }
    if (PyCapsule_IsValid(cap, AWQ_DLPACK_NAME)) {
        DLManagedTensor *m = PyCapsule_GetPointer(cap, AWQ_DLPACK_NAME);
        if (PyCapsule_SetName(cap, AWQ_DLPACK_USED_NAME) < 0)
            return -1;
        v->m = m;
        if (view_from_dltensor(&m->dl_tensor, name, v) < 0)
            return -1;
        v->readonly = 0; /* the legacy ABI cannot say */
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s.__dlpack__() did not return a DLPack capsule", name);
    return -1;
}

int awq_view_from_object(awq_state *st, PyObject *obj, const char *name,
                         const awq_view_opts *opts, awq_view *v)
{
    memset(v, 0, sizeof(*v));

    if (PyArray_Check(obj)) {
        int r = view_from_numpy((PyArrayObject *)obj, name, v);
        if (r < 0)
            awq_view_release(v);
        return r;
    }

    const DLPackExchangeAPI *api = awq_exchange_api(st, obj);
    if (api != NULL) {
        DLTensor t;
        memset(&t, 0, sizeof(t));
        if (api->dltensor_from_py_object_no_sync(obj, &t) < 0)
            return -1;
        v->api = api;
        /* With an explicit stream that is not the producer's, take the
         * __dlpack__(stream=...) path below so that the producer orders
         * its pending work before ours (the DLPack stream handshake). */
        int handshake = 0;
        if (opts->have_stream && t.device.device_type == kDLCUDA) {
            void *cur = NULL;
            if (api->current_work_stream(kDLCUDA, t.device.device_id, &cur) < 0)
                return -1;
            intptr_t curv = cur == NULL ? 1 : (intptr_t)cur; /* NULL: the legacy default */
            handshake = curv != opts->stream;
        }
        if (!handshake) {
            if (view_from_dltensor(&t, name, v) < 0)
                return -1;
            v->readonly = 0;
            return 0;
        }
    } else {
        int has = has_attr(obj, st->str_dlpack);
        if (has < 0)
            return -1;
        if (has)
            goto dlpack;
        PyErr_Format(PyExc_TypeError,
                     "%s must be a NumPy array or an object with __dlpack__ (torch, CuPy, JAX), "
                     "got %.200s",
                     name, Py_TYPE(obj)->tp_name);
        return -1;
    }

dlpack:;
    DLDevice dev = {kDLCPU, 0};
    int has_dev = has_attr(obj, st->str_dlpack_device);
    if (has_dev < 0 || (has_dev && query_device(st, obj, name, &dev) < 0))
        return -1;
    int cuda = dev.device_type == kDLCUDA || dev.device_type == kDLCUDAManaged;
    PyObject *cap = call_dlpack(st, obj, cuda, opts->have_stream ? opts->stream : 1);
    if (cap == NULL)
        return -1;
    const DLPackExchangeAPI *keep_api = v->api;
    int r = view_from_capsule(cap, name, v);
    v->api = keep_api;
    v->ref = cap; /* released after the deleter (awq_view_release) */
    if (r < 0) {
        awq_view_release(v);
        return -1;
    }
    return 0;
}
