/*
 * views.c -- Python object -> awq_view, and the call's stream (views.h).
 */
#include "views.h"

#include <string.h>

/* ---- small facts about views ---- */

static const char *dl_dtype_name(DLDataType t, char *buf, size_t n)
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

const char *awq_view_dtype_name(const awq_view *v, char *buf, size_t n)
{
    if (v->is_numpy) {
        PyObject *s = PyObject_Str((PyObject *)PyArray_DESCR((PyArrayObject *)v->ref));
        if (s != NULL) {
            const char *c = PyUnicode_AsUTF8(s);
            snprintf(buf, n, "%s", c ? c : "?");
            Py_DECREF(s);
            PyErr_Clear();
            return buf;
        }
        PyErr_Clear();
    }
    DLDataType t = v->dtype;
    if (t.lanes == 1 && t.code == kDLBfloat && t.bits == 16)
        return "bfloat16";
    return dl_dtype_name(t, buf, n);
}

const char *awq_device_str(DLDevice d, char *buf, size_t n)
{
    if (d.device_type == kDLCPU)
        snprintf(buf, n, "cpu");
    else
        snprintf(buf, n, "cuda:%d", (int)d.device_id);
    return buf;
}

int awq_dtype_from_dl(DLDataType t, awq_dtype *out)
{
    if (t.lanes != 1)
        return -1;
    if (t.code == kDLFloat && t.bits == 16)
        *out = AWQ_F16;
    else if (t.code == kDLBfloat && t.bits == 16)
        *out = AWQ_BF16;
    else if (t.code == kDLFloat && t.bits == 32)
        *out = AWQ_F32;
    else
        return -1;
    return 0;
}

DLDataType awq_dl_of(awq_dtype t)
{
    static const DLDataType kDl[AWQ_NUM_DTYPES] = {
        {kDLFloat, 16, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 32, 1}};
    return kDl[t];
}

int64_t awq_view_numel(const awq_view *v)
{
    int64_t n = 1;
    for (int i = 0; i < v->ndim; i++)
        n *= v->shape[i];
    return n;
}

int64_t awq_view_nbytes(const awq_view *v) { return awq_view_numel(v) * (v->dtype.bits / 8); }

int awq_views_overlap(const awq_view *a, const awq_view *b)
{
    if (a->device.device_type != b->device.device_type ||
        a->device.device_id != b->device.device_id)
        return 0;
    int64_t na = awq_view_nbytes(a), nb = awq_view_nbytes(b);
    if (na == 0 || nb == 0)
        return 0;
    uintptr_t a0 = (uintptr_t)a->data, b0 = (uintptr_t)b->data;
    return a0 < b0 + (uintptr_t)nb && b0 < a0 + (uintptr_t)na;
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

PyObject *awq_call_end(awq_view *views, const int *have, int n, awq_view *result_view,
                       PyObject **result, int keep)
{
    if (result_view != NULL)
        awq_view_release(result_view);
    for (int i = 0; i < n; i++)
        if (have[i])
            awq_view_release(&views[i]);
    PyObject *r = *result;
    *result = NULL;
    if (keep)
        return r;
    Py_XDECREF(r);
    return NULL;
}

/* ---- geometry ---- */

/* Shape, strides (elements, NULL = C order) -> the view's geometry. */
static int take_geometry(awq_view *v, const char *name, awq_ndim want, int32_t ndim,
                         const int64_t *shape, const int64_t *strides)
{
    if (ndim < want.min_ndim || ndim > want.max_ndim) {
        if (want.min_ndim == want.max_ndim)
            PyErr_Format(PyExc_ValueError, "%s must be a %d-D array, got %d dimension%s", name,
                         want.min_ndim, (int)ndim, ndim == 1 ? "" : "s");
        else
            PyErr_Format(PyExc_ValueError,
                         "%s must have %d to %d dimensions, got %d dimension%s", name,
                         want.min_ndim, want.max_ndim, (int)ndim, ndim == 1 ? "" : "s");
        return -1;
    }
    v->ndim = ndim;
    int empty = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            PyErr_Format(PyExc_ValueError, "%s has a negative extent in its shape", name);
            return -1;
        }
        v->shape[i] = shape[i];
        empty |= shape[i] == 0;
    }
    /* C order: each stride is the product of the later extents.  A
     * dimension of extent 1 (or an empty array) may carry any stride. */
    v->c_contiguous = 1;
    if (strides != NULL && !empty) {
        int64_t expect = 1;
        for (int i = ndim - 1; i >= 0; i--) {
            if (shape[i] != 1 && strides[i] != expect)
                v->c_contiguous = 0;
            expect *= shape[i];
        }
    }
    return 0;
}

/* A non-empty view must point at memory: a NULL data pointer (a lazy
 * zero tensor such as torch._efficientzerotensor, or a producer's bug)
 * would be dereferenced by the kernels. */
static int check_data(const awq_view *v, const char *name)
{
    if (v->data == NULL && awq_view_numel(v) != 0) {
        PyErr_Format(PyExc_ValueError,
                     "%s has no memory behind it (its data pointer is NULL; a lazy zero tensor "
                     "such as torch._efficientzerotensor must be materialized first, e.g. with "
                     "%s.clone())",
                     name, name);
        return -1;
    }
    return 0;
}

static int view_from_numpy(PyArrayObject *arr, const char *name, awq_ndim want, awq_view *v)
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

    int64_t shape[AWQ_VIEW_MAX_NDIM] = {0}, strides[AWQ_VIEW_MAX_NDIM] = {0};
    int nd = PyArray_NDIM(arr);
    if (nd <= AWQ_VIEW_MAX_NDIM) {
        for (int i = 0; i < nd; i++) {
            shape[i] = PyArray_DIM(arr, i);
            npy_intp s = PyArray_STRIDE(arr, i);
            strides[i] = (s % itemsize == 0) ? s / itemsize : INT64_MAX;
        }
    }
    if (take_geometry(v, name, want, nd, shape, strides) < 0)
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

static int view_from_dltensor(const DLTensor *t, const char *name, awq_ndim want, awq_view *v)
{
    if (take_geometry(v, name, want, t->ndim, t->shape, t->strides) < 0)
        return -1;
    v->dtype = t->dtype;
    v->data = t->data == NULL ? NULL : (char *)t->data + t->byte_offset;
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
    if (check_data(v, name) < 0)
        return -1;
    size_t align = t->dtype.bits >= 8 ? t->dtype.bits / 8 : 1;
    v->aligned = ((uintptr_t)v->data % align) == 0;
    return 0;
}

/* ---- the DLPack C exchange API ---- */

/* The exchange API of a type, and whether its tensors can carry a negative
 * bit (torch): such a bit means "the values are the negation of the memory",
 * which no DLPack view expresses, so those tensors are asked (is_neg). */
static const awq_api_entry *api_entry(awq_state *st, PyObject *obj)
{
    PyTypeObject *tp = Py_TYPE(obj);
    for (int i = 0; i < st->api_cache_len; i++)
        if (st->api_cache[i].type == tp)
            return &st->api_cache[i];

    awq_api_entry e = {tp, NULL, 0, NULL};
    /* Only what the DLPack specification defines: a capsule of that name on
     * the type, holding a table of the major version we were written
     * against.  Anything else (an int, None, another capsule) is ignored and
     * the object goes through __dlpack__. */
    PyObject *cap = PyObject_GetAttr((PyObject *)tp, st->str_exchange_api);
    if (cap == NULL) {
        PyErr_Clear();
    } else {
        if (PyCapsule_IsValid(cap, AWQ_DLPACK_EXCHANGE_API_NAME)) {
            const DLPackExchangeAPI *api =
                PyCapsule_GetPointer(cap, AWQ_DLPACK_EXCHANGE_API_NAME);
            if (api != NULL && api->header.version.major == 1 &&
                api->dltensor_from_py_object_no_sync != NULL && api->current_work_stream != NULL &&
                api->managed_tensor_allocator != NULL &&
                api->managed_tensor_to_py_object_no_sync != NULL)
                e.api = api;
        }
        PyErr_Clear();
        Py_DECREF(cap); /* the table lives for the process (DLPack spec) */
    }
    PyObject *isneg = PyObject_GetAttr((PyObject *)tp, st->str_is_neg);
    if (isneg == NULL)
        PyErr_Clear();
    e.has_is_neg = isneg != NULL;
    /* torch's is_neg is a C method (METH_NOARGS) of the base class: calling
     * its function directly skips the attribute lookup and the call
     * machinery (about half of its cost), and does what the method call
     * does -- a subclass that redefines is_neg in Python gets the ordinary
     * call.  The type is kept alive by the cache, and with it the method. */
    if (isneg != NULL && Py_IS_TYPE(isneg, &PyMethodDescr_Type)) {
        PyMethodDef *def = ((PyMethodDescrObject *)isneg)->d_method;
        if (def != NULL && (def->ml_flags & (METH_VARARGS | METH_KEYWORDS | METH_O | METH_NOARGS |
                                             METH_FASTCALL | METH_METHOD)) == METH_NOARGS &&
            PyObject_TypeCheck(obj, PyDescr_TYPE(isneg)))
            e.is_neg = def->ml_meth;
    }
    Py_XDECREF(isneg);

    if (st->api_cache_len < AWQ_API_CACHE) {
        Py_INCREF(tp);
        st->api_cache[st->api_cache_len] = e;
        return &st->api_cache[st->api_cache_len++];
    }
    /* Past the cache: answer from a per-call scratch entry (the type stays
     * referenced by the object for the call's length). */
    st->api_scratch = e;
    return &st->api_scratch;
}

const DLPackExchangeAPI *awq_exchange_api(awq_state *st, PyObject *obj)
{
    return api_entry(st, obj)->api;
}

/* A tensor whose values are the negation of its memory (torch's negative
 * bit) cannot be read or written through a view of that memory. */
static int check_not_negated(awq_state *st, const awq_api_entry *entry, PyObject *obj,
                             const char *name)
{
    PyObject *r = entry->is_neg != NULL ? entry->is_neg(obj, NULL)
                                        : PyObject_CallMethodNoArgs(obj, st->str_is_neg);
    if (r == NULL) {
        PyErr_Clear(); /* not the method we know: nothing to say */
        return 0;
    }
    int neg = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (neg < 0) {
        PyErr_Clear();
        return 0;
    }
    if (neg) {
        PyErr_Format(PyExc_ValueError,
                     "%s has its negative bit set (a lazy negation, e.g. from torch._neg_view); "
                     "pass %s.resolve_neg()",
                     name, name);
        return -1;
    }
    return 0;
}

/* The producer could not export the object (a meta or sparse torch
 * tensor, a framework error): the package's own TypeError, naming the
 * argument, with the producer's exception as its cause. */
static void reraise_unreadable(const char *name, PyObject *obj)
{
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *text = value != NULL ? PyObject_Str(value) : NULL;
    const char *msg = text != NULL ? PyUnicode_AsUTF8(text) : NULL;
    if (msg == NULL) {
        PyErr_Clear();
        msg = "unknown error";
    }
    /* The producer's first line: torch appends a C++ frame dump. */
    char first[300];
    snprintf(first, sizeof first, "%.*s", (int)strcspn(msg, "\n"), msg);
    PyErr_Format(PyExc_TypeError,
                 "%s (%.200s) cannot be read as an array in CPU or CUDA memory: %s; pass a dense "
                 "tensor on the CPU or a CUDA device",
                 name, Py_TYPE(obj)->tp_name, first);
    if (value != NULL) {
        PyObject *t2 = NULL, *v2 = NULL, *tb2 = NULL;
        PyErr_Fetch(&t2, &v2, &tb2);
        PyErr_NormalizeException(&t2, &v2, &tb2);
        PyException_SetCause(v2, Py_NewRef(value));
        PyErr_Restore(t2, v2, tb2);
    }
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* ---- __dlpack__ ---- */

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
    if (t == NULL) {
        /* torch before the exchange API refuses a meta tensor here */
        reraise_unreadable(name, obj);
        return -1;
    }
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

static int view_from_capsule(PyObject *cap, const char *name, awq_ndim want, awq_view *v)
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
        if (view_from_dltensor(&mv->dl_tensor, name, want, v) < 0)
            return -1;
        v->readonly = (mv->flags & DLPACK_FLAG_BITMASK_READ_ONLY) ? 1 : 0;
        return 0;
    }
    if (PyCapsule_IsValid(cap, AWQ_DLPACK_NAME)) {
        DLManagedTensor *m = PyCapsule_GetPointer(cap, AWQ_DLPACK_NAME);
        if (PyCapsule_SetName(cap, AWQ_DLPACK_USED_NAME) < 0)
            return -1;
        v->m = m;
        if (view_from_dltensor(&m->dl_tensor, name, want, v) < 0)
            return -1;
        v->readonly = 0; /* the legacy ABI cannot say */
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s.__dlpack__() did not return a DLPack capsule", name);
    return -1;
}

int awq_view_from_object(awq_state *st, PyObject *obj, const char *name, awq_ndim want,
                         const awq_view_opts *opts, awq_view *v)
{
    memset(v, 0, sizeof(*v));

    if (PyArray_Check(obj)) {
        int r = view_from_numpy((PyArrayObject *)obj, name, want, v);
        if (r < 0)
            awq_view_release(v);
        return r;
    }

    const awq_api_entry *entry = api_entry(st, obj);
    if (entry->has_is_neg && check_not_negated(st, entry, obj, name) < 0)
        return -1;
    const DLPackExchangeAPI *api = entry->api;
    if (api != NULL) {
        DLTensor t;
        memset(&t, 0, sizeof(t));
        if (api->dltensor_from_py_object_no_sync(obj, &t) < 0) {
            reraise_unreadable(name, obj);
            return -1;
        }
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
            if (view_from_dltensor(&t, name, want, v) < 0)
                return -1;
            v->readonly = 0;
            return 0;
        }
    } else {
        int has = has_attr(obj, st->str_dlpack);
        if (has < 0)
            return -1;
        if (!has) {
            PyErr_Format(PyExc_TypeError,
                         "%s must be a NumPy array or an object with __dlpack__ (torch, CuPy, "
                         "JAX), got %.200s",
                         name, Py_TYPE(obj)->tp_name);
            return -1;
        }
    }

    DLDevice dev = {kDLCPU, 0};
    int has_dev = has_attr(obj, st->str_dlpack_device);
    if (has_dev < 0 || (has_dev && query_device(st, obj, name, &dev) < 0))
        return -1;
    int cuda = dev.device_type == kDLCUDA || dev.device_type == kDLCUDAManaged;
    PyObject *cap = call_dlpack(st, obj, cuda, opts->have_stream ? opts->stream : 1);
    if (cap == NULL) {
        reraise_unreadable(name, obj);
        return -1;
    }
    const DLPackExchangeAPI *keep_api = v->api;
    int r = view_from_capsule(cap, name, want, v);
    v->api = keep_api;
    v->ref = cap; /* released after the deleter (awq_view_release) */
    if (r < 0) {
        awq_view_release(v);
        return -1;
    }
    return 0;
}

/* ---- streams ---- */

/* An integer argument's value through __index__ (NumPy integers too), not
 * a bool; -1 with an exception set, *ok 0, when it is not an integer. */
static long long index_value(PyObject *o, int *ok)
{
    *ok = 0;
    if (PyBool_Check(o))
        return 0;
    PyObject *i = PyNumber_Index(o);
    if (i == NULL) {
        PyErr_Clear();
        return 0;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(i, &overflow);
    Py_DECREF(i);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *ok = overflow == 0 ? 1 : -1;
    return v;
}

int awq_parse_stream(awq_state *st, PyObject *o, awq_view_opts *opts)
{
    opts->have_stream = 0;
    opts->stream = 1;
    opts->handle = 0;
    opts->explicit_stream = 0;
    if (o == Py_None)
        return 0;
    PyObject *val = NULL;
    int ok = 0;
    long long h = index_value(o, &ok);
    if (ok == 0 && !PyBool_Check(o)) {
        val = PyObject_GetAttr(o, st->str_cuda_stream);
        if (val == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            val = PyObject_GetAttr(o, st->str_ptr);
        }
        if (val == NULL) {
            if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError,
                             "stream must be an int handle or an object with .cuda_stream or "
                             ".ptr (torch.cuda.Stream, cupy.cuda.Stream), got %.200s",
                             Py_TYPE(o)->tp_name);
            }
            return -1;
        }
        h = index_value(val, &ok);
        if (ok == 0) {
            PyErr_Format(PyExc_TypeError, "stream handle must be an int, got %.200s",
                         Py_TYPE(val)->tp_name);
            Py_DECREF(val);
            return -1;
        }
        Py_DECREF(val);
    } else if (ok == 0) {
        PyErr_Format(PyExc_TypeError,
                     "stream must be an int handle or an object with .cuda_stream or .ptr, got "
                     "%.200s",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    if (ok < 0 || h < 0) {
        PyErr_Format(PyExc_ValueError, "stream must be a non-negative handle, got %R", o);
        return -1;
    }
    opts->have_stream = 1;
    /* DLPack spells the legacy default stream 1 (0 is not a valid value);
     * frameworks hand out 0 for it.  CUDA accepts both 0 and 1 for it. */
    opts->stream = h == 0 ? 1 : (intptr_t)h;
    opts->handle = (intptr_t)h;
    return 0;
}

int awq_stream_begin(awq_state *st, PyObject *stream_arg, PyObject *like, awq_view_opts *opts)
{
    if (stream_arg != Py_None) {
        if (awq_parse_stream(st, stream_arg, opts) < 0)
            return -1;
        opts->explicit_stream = 1;
        return 0;
    }
    /* Producers that cannot name their current stream through the exchange
     * API (CuPy) are asked through the package's hook. */
    if (st->stream_hook == NULL || PyArray_Check(like) || awq_exchange_api(st, like) != NULL)
        return awq_parse_stream(st, Py_None, opts);
    PyObject *cur = PyObject_CallOneArg(st->stream_hook, like);
    if (cur == NULL)
        return -1;
    int r = awq_parse_stream(st, cur, opts);
    Py_DECREF(cur);
    return r;
}

int awq_stream_of(const awq_view_opts *opts, const awq_view *v, int device, void **stream)
{
    *stream = NULL;
    if (device < 0)
        return 0;
    if (opts->have_stream) {
        *stream = (void *)opts->handle;
    } else if (v->api != NULL) {
        void *cur = NULL;
        if (v->api->current_work_stream(kDLCUDA, device, &cur) < 0)
            return -1;
        *stream = cur;
    }
    return 0;
}
