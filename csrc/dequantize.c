/*
 * dequantize.c -- the Python entry points dequantize / smart_dequantize:
 * parse, validate everything, build the problem, allocate the output in
 * the caller's framework, run a backend, map its status to an exception.
 *
 * Validation is complete before a byte of `out` is written, so a rejected
 * call leaves the caller's data untouched.
 */
#include "buffers.h"

#include <string.h>

enum { ARG_QWEIGHT, ARG_QZEROS, ARG_SCALES, ARG_OUT, NUM_ARGS };
static const char *const kArgNames[NUM_ARGS] = {"qweight", "qzeros", "scales", "out"};

static const char *const kDtypeNames[AWQ_NUM_DTYPES] = {"float16", "bfloat16", "float32"};

typedef struct {
    awq_view v[NUM_ARGS];
    int have[NUM_ARGS];
} views;

static void views_release(views *vs)
{
    for (int i = 0; i < NUM_ARGS; i++)
        if (vs->have[i])
            awq_view_release(&vs->v[i]);
}

/* ---- small parsers ---- */

static int dtype_from_dl(DLDataType t, awq_dtype *out)
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

static int dtype_from_name(const char *s, awq_dtype *out)
{
    static const struct {
        const char *name;
        awq_dtype t;
    } names[] = {{"float16", AWQ_F16}, {"half", AWQ_F16},    {"fp16", AWQ_F16},
                 {"f16", AWQ_F16},     {"bfloat16", AWQ_BF16}, {"bf16", AWQ_BF16},
                 {"float32", AWQ_F32}, {"float", AWQ_F32},   {"fp32", AWQ_F32},
                 {"f32", AWQ_F32}};
    if (strncmp(s, "torch.", 6) == 0)
        s += 6;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].t;
            return 0;
        }
    return -1;
}

/* out_dtype: None, a name, a NumPy dtype or scalar type, a torch dtype. */
static int parse_out_dtype(PyObject *o, awq_dtype *out)
{
    const char *s = NULL;
    PyObject *str = NULL;
    int r = -1;

    if (PyUnicode_Check(o)) {
        s = PyUnicode_AsUTF8(o);
    } else {
        PyArray_Descr *d = NULL;
        if (PyArray_DescrCheck(o) || PyType_Check(o)) {
            if (PyArray_DescrConverter2(o, &d) && d != NULL) {
                str = PyObject_Str((PyObject *)d);
                Py_DECREF(d);
            }
            PyErr_Clear();
        }
        if (str == NULL)
            str = PyObject_Str(o); /* torch.float16 prints as "torch.float16" */
        if (str == NULL)
            return -1;
        s = PyUnicode_AsUTF8(str);
    }
    if (s == NULL)
        goto done;
    if (dtype_from_name(s, out) == 0)
        r = 0;
    else
        PyErr_Format(PyExc_TypeError,
                     "out_dtype must be float16, bfloat16 or float32 (a name, NumPy or torch "
                     "dtype), got %R",
                     o);
done:
    Py_XDECREF(str);
    return r;
}

static int parse_kernel(PyObject *o, int *kernel)
{
    static const char *const names[AWQ_NUM_KERNELS] = {"auto", "v1", "v2", "v3", "v4", "cpu"};
    if (PyUnicode_Check(o)) {
        const char *s = PyUnicode_AsUTF8(o);
        if (s == NULL)
            return -1;
        for (int i = 0; i < AWQ_NUM_KERNELS; i++)
            if (strcmp(s, names[i]) == 0) {
                *kernel = i;
                return 0;
            }
    }
    PyErr_Format(PyExc_ValueError,
                 "kernel must be one of 'auto', 'v1', 'v2', 'v3', 'v4' (CUDA) or 'cpu', got %R", o);
    return -1;
}

/* A positive integer argument that is not a bool. */
static int parse_int_arg(PyObject *o, const char *name, long long *value)
{
    if (PyBool_Check(o) || !PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %.200s", name,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    *value = PyLong_AsLongLong(o);
    if (*value == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s is out of range: %R", name, o);
        return -1;
    }
    return 0;
}

/* stream: None, an int handle, or an object with .cuda_stream / .ptr. */
int awq_parse_stream(awq_state *st, PyObject *o, awq_view_opts *opts, intptr_t *handle)
{
    PyObject *val = NULL;
    opts->have_stream = 0;
    opts->stream = 1;
    *handle = 0;
    if (o == Py_None)
        return 0;
    if (PyLong_Check(o) && !PyBool_Check(o)) {
        val = Py_NewRef(o);
    } else {
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
        if (!PyLong_Check(val)) {
            PyErr_Format(PyExc_TypeError, "stream handle must be an int, got %.200s",
                         Py_TYPE(val)->tp_name);
            Py_DECREF(val);
            return -1;
        }
    }
    long long h = PyLong_AsLongLong(val);
    Py_DECREF(val);
    if ((h == -1 && PyErr_Occurred()) || h < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "stream must be a non-negative handle, got %R", o);
        return -1;
    }
    opts->have_stream = 1;
    /* DLPack spells the legacy default stream 1 (0 is not a valid value);
     * frameworks hand out 0 for it.  CUDA accepts both 0 and 1 for it. */
    opts->stream = h == 0 ? 1 : (intptr_t)h;
    *handle = (intptr_t)h;
    return 0;
}

static const char *device_str(DLDevice d, char *buf, size_t n)
{
    if (d.device_type == kDLCPU)
        snprintf(buf, n, "cpu");
    else
        snprintf(buf, n, "cuda:%d", (int)d.device_id);
    return buf;
}

/* Name of a view's dtype for messages, in NumPy's words when it is NumPy. */
static const char *view_dtype_name(const awq_view *v, char *buf, size_t n)
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
    return awq_dl_dtype_name(t, buf, n);
}

static int is_packed_int(DLDataType t)
{
    return t.lanes == 1 && t.bits == 32 && (t.code == kDLInt || t.code == kDLUInt);
}

/* ---- validation: everything about the call, before any write ---- */

typedef struct {
    PyObject *group_size, *out_dtype, *kernel, *block_size;
    int smart;
} call_args;

static int check_layout(const awq_view *v, const char *name)
{
    if (!v->c_contiguous) {
        PyErr_Format(PyExc_ValueError,
                     "%s is not C-contiguous; pass %s.contiguous() (torch/CuPy) or "
                     "numpy.ascontiguousarray(%s)",
                     name, name, name);
        return -1;
    }
    if (!v->aligned) {
        PyErr_Format(PyExc_ValueError,
                     "%s's data pointer is not aligned to its element size; pass a copy "
                     "(%s.copy())",
                     name, name);
        return -1;
    }
    return 0;
}

static int overlaps(const awq_view *a, const awq_view *b)
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

static int validate(views *vs, const call_args *ca, awq_problem *p, awq_config *cfg)
{
    char b1[64], b2[64];
    awq_view *qw = &vs->v[ARG_QWEIGHT], *qz = &vs->v[ARG_QZEROS], *sc = &vs->v[ARG_SCALES];
    awq_view *out = vs->have[ARG_OUT] ? &vs->v[ARG_OUT] : NULL;

    /* dtypes */
    if (!is_packed_int(qw->dtype)) {
        PyErr_Format(PyExc_TypeError, "qweight must be int32 or uint32 (8 packed 4-bit values "
                     "per element), got %s", view_dtype_name(qw, b1, sizeof b1));
        return -1;
    }
    if (!is_packed_int(qz->dtype)) {
        PyErr_Format(PyExc_TypeError, "qzeros must be int32 or uint32 (8 packed 4-bit values "
                     "per element), got %s", view_dtype_name(qz, b1, sizeof b1));
        return -1;
    }
    if (dtype_from_dl(sc->dtype, &p->scale_dtype) < 0) {
        PyErr_Format(PyExc_TypeError, "scales must be float16, bfloat16 or float32, got %s",
                     view_dtype_name(sc, b1, sizeof b1));
        return -1;
    }
    p->out_dtype = p->scale_dtype;
    if (ca->out_dtype != Py_None && parse_out_dtype(ca->out_dtype, &p->out_dtype) < 0)
        return -1;
    if (out != NULL) {
        awq_dtype got;
        if (dtype_from_dl(out->dtype, &got) < 0 || got != p->out_dtype) {
            PyErr_Format(PyExc_TypeError,
                         "out must have dtype %s (%s), got %s", kDtypeNames[p->out_dtype],
                         ca->out_dtype != Py_None ? "out_dtype" : "the dtype of scales; pass "
                         "out_dtype= for another", view_dtype_name(out, b2, sizeof b2));
            return -1;
        }
    }

    /* layout */
    for (int i = 0; i < NUM_ARGS; i++)
        if (vs->have[i] && check_layout(&vs->v[i], kArgNames[i]) < 0)
            return -1;

    /* devices */
    for (int i = 1; i < NUM_ARGS; i++) {
        if (!vs->have[i])
            continue;
        if (vs->v[i].device.device_type != qw->device.device_type ||
            vs->v[i].device.device_id != qw->device.device_id) {
            PyErr_Format(PyExc_ValueError,
                         "all tensors must be on one device: qweight is on %s but %s is on %s",
                         device_str(qw->device, b1, sizeof b1), kArgNames[i],
                         device_str(vs->v[i].device, b2, sizeof b2));
            return -1;
        }
    }

    /* shapes */
    int64_t K = qw->shape[0], W = qw->shape[1], N = 8 * W;
    if (qz->shape[1] != W) {
        PyErr_Format(PyExc_ValueError,
                     "qzeros must have %lld columns like qweight (N/8 packed words), got %lld",
                     (long long)W, (long long)qz->shape[1]);
        return -1;
    }
    if (sc->shape[1] != N) {
        PyErr_Format(PyExc_ValueError,
                     "scales must have %lld columns (8 x qweight's %lld packed columns), got %lld",
                     (long long)N, (long long)W, (long long)sc->shape[1]);
        return -1;
    }
    if (qz->shape[0] != sc->shape[0]) {
        PyErr_Format(PyExc_ValueError,
                     "qzeros and scales must have the same number of rows (K/group_size), got "
                     "qzeros %lld and scales %lld",
                     (long long)qz->shape[0], (long long)sc->shape[0]);
        return -1;
    }
    int64_t groups = sc->shape[0], G;
    if (ca->group_size != Py_None) {
        long long g;
        if (parse_int_arg(ca->group_size, "group_size", &g) < 0)
            return -1;
        if (g == -1)
            g = K > 0 ? K : 1; /* AWQ's spelling of per-channel */
        if (g <= 0) {
            PyErr_Format(PyExc_ValueError, "group_size must be positive (or -1 for G = K), got %lld",
                         g);
            return -1;
        }
        if (K % g != 0) {
            PyErr_Format(PyExc_ValueError, "group_size %lld does not divide K = %lld (qweight rows)",
                         g, (long long)K);
            return -1;
        }
        if (K / g != groups) {
            PyErr_Format(PyExc_ValueError,
                         "group_size %lld gives K/group_size = %lld groups, but scales and qzeros "
                         "have %lld rows",
                         g, (long long)(K / g), (long long)groups);
            return -1;
        }
        G = g;
    } else if (groups == 0) {
        if (K != 0) {
            PyErr_Format(PyExc_ValueError,
                         "scales and qzeros have 0 rows but qweight has K = %lld rows", (long long)K);
            return -1;
        }
        G = 1;
    } else {
        if (K % groups != 0) {
            PyErr_Format(PyExc_ValueError,
                         "scales and qzeros have %lld rows, which does not divide K = %lld; each "
                         "must have K/group_size rows",
                         (long long)groups, (long long)K);
            return -1;
        }
        G = K / groups;
        if (G == 0) { /* more groups than rows */
            PyErr_Format(PyExc_ValueError,
                         "scales and qzeros have %lld rows, more than K = %lld", (long long)groups,
                         (long long)K);
            return -1;
        }
    }
    if (out != NULL) {
        if (out->shape[0] != K || out->shape[1] != N) {
            PyErr_Format(PyExc_ValueError, "out must have shape (%lld, %lld), got (%lld, %lld)",
                         (long long)K, (long long)N, (long long)out->shape[0],
                         (long long)out->shape[1]);
            return -1;
        }
        if (out->readonly) {
            PyErr_SetString(PyExc_ValueError, "out is read-only; pass a writable array");
            return -1;
        }
        for (int i = 0; i < ARG_OUT; i++)
            if (overlaps(out, &vs->v[i])) {
                PyErr_Format(PyExc_ValueError, "out overlaps %s in memory; pass a separate array",
                             kArgNames[i]);
                return -1;
            }
    }

    /* kernel and launch parameters */
    int on_cuda = qw->device.device_type == kDLCUDA;
    int kernel = AWQ_KERNEL_AUTO;
    if (!ca->smart && parse_kernel(ca->kernel, &kernel) < 0)
        return -1;
    if (on_cuda && kernel == AWQ_KERNEL_CPU) {
        PyErr_Format(PyExc_ValueError,
                     "kernel 'cpu' needs host arrays, but the inputs are on %s; use 'auto' or "
                     "'v1'..'v4'",
                     device_str(qw->device, b1, sizeof b1));
        return -1;
    }
    if (!on_cuda && kernel >= AWQ_KERNEL_V1 && kernel <= AWQ_KERNEL_V4) {
        PyErr_Format(PyExc_ValueError,
                     "kernel 'v%d' runs on CUDA tensors, but the inputs are on the CPU; use "
                     "kernel='cpu' or 'auto'",
                     kernel);
        return -1;
    }
    long long bs = 0;
    if (!ca->smart && ca->block_size != Py_None) {
        if (parse_int_arg(ca->block_size, "block_size", &bs) < 0)
            return -1;
        if (!on_cuda || kernel == AWQ_KERNEL_V1 || kernel == AWQ_KERNEL_V2) {
            PyErr_Format(PyExc_ValueError,
                         "block_size applies to the CUDA kernels v3 and v4 ('auto' on CUDA) only; "
                         "got block_size=%lld with kernel %R on %s",
                         bs, ca->kernel, device_str(qw->device, b1, sizeof b1));
            return -1;
        }
        if (!awq_block_size_valid(bs)) {
            PyErr_Format(PyExc_ValueError,
                         "block_size must be a multiple of 32 between 32 and %d, got %lld",
                         AWQ_MAX_BLOCK, bs);
            return -1;
        }
    }
    if (on_cuda && !awq_cuda_compiled()) {
        PyErr_Format(PyExc_RuntimeError,
                     "qweight is a CUDA tensor (%s) but awq_fast_dequant was built without CUDA. "
                     "Rebuild it with nvcc available (on PATH, or CUDA_HOME set) and "
                     "AWQ_FAST_DEQUANT_NO_CUDA unset, from the source folder: "
                     "pip install --force-reinstall --no-build-isolation --no-deps .",
                     device_str(qw->device, b1, sizeof b1));
        return -1;
    }

    p->qweight = (const uint32_t *)qw->data;
    p->qzeros = (const uint32_t *)qz->data;
    p->scales = sc->data;
    p->out = out != NULL ? out->data : NULL;
    p->K = K;
    p->N = N;
    p->G = G;
    p->device = on_cuda ? (int)qw->device.device_id : -1;
    p->stream = NULL;

    /* Launch parameters left 0 are the backend's defaults (filled there). */
    memset(cfg, 0, sizeof(*cfg));
    if (on_cuda) {
        cfg->kernel = kernel == AWQ_KERNEL_AUTO ? AWQ_KERNEL_V4 : kernel;
        if (bs != 0)
            cfg->block_size = (int)bs;
    } else {
        cfg->kernel = AWQ_KERNEL_CPU;
    }
    return 0;
}

/* ---- output allocation in the caller's framework ---- */

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

static PyObject *allocate_out(awq_state *st, PyObject *like, const awq_view *qw,
                              const awq_problem *p, awq_view *outv)
{
    static const DLDataType kDl[AWQ_NUM_DTYPES] = {
        {kDLFloat, 16, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 32, 1}};
    PyObject *res = NULL;
    memset(outv, 0, sizeof(*outv));

    if (qw->is_numpy && p->out_dtype != AWQ_BF16) {
        npy_intp dims[2] = {(npy_intp)p->K, (npy_intp)p->N};
        res = PyArray_SimpleNew(2, dims, p->out_dtype == AWQ_F16 ? NPY_HALF : NPY_FLOAT32);
        if (res != NULL)
            outv->data = PyArray_BYTES((PyArrayObject *)res);
        return res;
    }
    if (qw->api != NULL) {
        int64_t shape[2] = {p->K, p->N};
        DLTensor proto;
        memset(&proto, 0, sizeof proto);
        proto.device = qw->device;
        proto.ndim = 2;
        proto.dtype = kDl[p->out_dtype];
        proto.shape = shape;
        DLManagedTensorVersioned *mt = NULL;
        alloc_error err = {{0}, {0}, 0};
        if (qw->api->managed_tensor_allocator(&proto, &mt, &err, alloc_set_error) != 0 ||
            mt == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(strcmp(err.kind, "MemoryError") == 0 ? PyExc_MemoryError
                                                                    : PyExc_RuntimeError,
                             "could not allocate out (%lld x %lld %s): %s", (long long)p->K,
                             (long long)p->N, kDtypeNames[p->out_dtype],
                             err.set ? err.message : "allocator failed");
            return NULL;
        }
        outv->data = (char *)mt->dl_tensor.data + mt->dl_tensor.byte_offset;
        void *obj = NULL;
        if (qw->api->managed_tensor_to_py_object_no_sync(mt, &obj) != 0)
            return NULL; /* the producer took ownership of mt either way */
        return (PyObject *)obj;
    }
    if (st->allocator == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "awq_fast_dequant: no output allocator registered");
        return NULL;
    }
    res = PyObject_CallFunction(st->allocator, "OiiLLs", like, (int)qw->device.device_type,
                                (int)qw->device.device_id, (long long)p->K, (long long)p->N,
                                kDtypeNames[p->out_dtype]);
    if (res == NULL)
        return NULL;
    awq_view_opts opts = {0, 1};
    if (awq_view_from_object(st, res, "out", &opts, outv) < 0) {
        Py_DECREF(res);
        return NULL;
    }
    return res;
}

/* ---- running a problem ---- */

int awq_raise_status(awq_status s, int detail, const awq_problem *p)
{
    switch (s) {
    case AWQ_OK: return 0;
    case AWQ_ERR_CUDA:
        PyErr_Format(PyExc_RuntimeError, "CUDA error on cuda:%d: %s (cudaError %d)", p->device,
                     awq_cuda_error_string(detail), detail);
        break;
    case AWQ_ERR_NO_CUDA:
        PyErr_SetString(PyExc_RuntimeError, "awq_fast_dequant was built without CUDA");
        break;
    case AWQ_ERR_CONFIG:
        PyErr_SetString(PyExc_ValueError, "launch configuration not valid for this kernel");
        break;
    case AWQ_ERR_NOMEM: PyErr_NoMemory(); break;
    case AWQ_ERR_DEVICE:
        PyErr_Format(PyExc_RuntimeError, "CUDA device %d is not available", p->device);
        break;
    }
    return -1;
}

int awq_run(const awq_problem *p, const awq_config *c)
{
    awq_status s;
    int detail = 0;
    if (awq_numel(p) == 0)
        return 0;
    if (p->device < 0) {
        Py_BEGIN_ALLOW_THREADS
        s = awq_cpu_dequantize(p, c);
        Py_END_ALLOW_THREADS
    } else {
        s = awq_cuda_dequantize(p, c, &detail);
    }
    return awq_raise_status(s, detail, p);
}

/* Argument slots of dequantize / smart_dequantize, in signature order. */
enum { A_QWEIGHT, A_QZEROS, A_SCALES, A_GROUP, A_OUT, A_OUT_DTYPE, A_KERNEL, A_BLOCK, A_STREAM,
       A_COUNT };
static const char *const kKwNames[A_COUNT] = {"qweight", "qzeros",    "scales",
                                              "group_size", "out",    "out_dtype",
                                              "kernel",     "block_size", "stream"};

/* FASTCALL + keywords by hand: interned names compare by pointer, so a call
 * with keywords costs a few compares instead of a dict. */
static int parse_call(const char *fname, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames, int smart, PyObject **slots)
{
    static PyObject *interned[A_COUNT];
    for (int i = 0; i < A_COUNT; i++) {
        slots[i] = NULL;
        if (interned[i] == NULL && (interned[i] = PyUnicode_InternFromString(kKwNames[i])) == NULL)
            return -1;
    }
    if (nargs > 3) {
        PyErr_Format(PyExc_TypeError, "%s() takes 3 positional arguments but %zd were given",
                     fname, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        slots[i] = args[i];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t j = 0; j < nkw; j++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, j);
        int idx = -1;
        for (int i = 0; i < A_COUNT && idx < 0; i++)
            if (key == interned[i])
                idx = i;
        for (int i = 0; i < A_COUNT && idx < 0; i++)
            if (PyUnicode_CompareWithASCIIString(key, kKwNames[i]) == 0)
                idx = i;
        if (idx < 0 || (smart && (idx == A_KERNEL || idx == A_BLOCK))) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname,
                         key);
            return -1;
        }
        if (slots[idx] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname,
                         kKwNames[idx]);
            return -1;
        }
        slots[idx] = args[nargs + j];
    }
    for (int i = 0; i < 3; i++)
        if (slots[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname,
                         kKwNames[i]);
            return -1;
        }
    for (int i = 3; i < A_COUNT; i++)
        if (slots[i] == NULL)
            slots[i] = Py_None;
    return 0;
}

/* The framework's current stream for producers that cannot tell us through
 * the DLPack exchange API (CuPy): asked of the package's Python hook. */
static PyObject *hooked_stream(awq_state *st, PyObject *qweight)
{
    if (st->stream_hook == NULL || PyArray_Check(qweight) || awq_exchange_api(st, qweight) != NULL)
        return Py_NewRef(Py_None);
    return PyObject_CallOneArg(st->stream_hook, qweight);
}

static PyObject *dequantize_impl(PyObject *module, PyObject *const *args, int smart, int rows)
{
    awq_state *st = awq_get_state(module);
    views vs;
    awq_view outv;
    int have_outv = 0;
    PyObject *result = NULL;
    awq_problem p;
    awq_config cfg;
    awq_view_opts opts;
    intptr_t stream_handle = 0;
    call_args ca;

    memset(&vs, 0, sizeof vs);
    memset(&p, 0, sizeof p);
    ca.group_size = args[A_GROUP];
    PyObject *out_obj = args[A_OUT];
    ca.out_dtype = args[A_OUT_DTYPE];
    ca.smart = smart;
    ca.kernel = args[A_KERNEL];
    ca.block_size = args[A_BLOCK];

    PyObject *stream_obj = args[A_STREAM] != Py_None ? Py_NewRef(args[A_STREAM])
                                                     : hooked_stream(st, args[A_QWEIGHT]);
    if (stream_obj == NULL)
        return NULL;
    int r = awq_parse_stream(st, stream_obj, &opts, &stream_handle);
    Py_DECREF(stream_obj);
    if (r < 0)
        return NULL;
    for (int i = 0; i < NUM_ARGS; i++) {
        PyObject *o = i == ARG_OUT ? out_obj : args[i];
        if (o == Py_None && i == ARG_OUT)
            continue;
        if (awq_view_from_object(st, o, kArgNames[i], &opts, &vs.v[i]) < 0)
            goto done;
        vs.have[i] = 1;
    }
    if (validate(&vs, &ca, &p, &cfg) < 0)
        goto done;
    if (rows > 0)
        cfg.rows = rows;

    /* The stream: the caller's, else the producer's current one, else the
     * legacy default. */
    if (p.device >= 0) {
        if (opts.have_stream) {
            p.stream = (void *)stream_handle;
        } else if (vs.v[ARG_QWEIGHT].api != NULL) {
            void *cur = NULL;
            if (vs.v[ARG_QWEIGHT].api->current_work_stream(kDLCUDA, p.device, &cur) < 0)
                goto done;
            p.stream = cur;
        }
    }

    if (out_obj != Py_None) {
        result = Py_NewRef(out_obj);
    } else {
        result = allocate_out(st, args[0], &vs.v[ARG_QWEIGHT], &p, &outv);
        if (result == NULL)
            goto done;
        have_outv = 1;
        p.out = outv.data;
    }

    if (smart && awq_numel(&p) > 0) {
        int detail = 0;
        if (awq_cache_lookup_or_tune(module, &p, &cfg, &detail) < 0)
            Py_CLEAR(result);
        goto done; /* tuning wrote the result (or raised) */
    }
    if (awq_run(&p, &cfg) < 0)
        Py_CLEAR(result);

done:
    if (have_outv)
        awq_view_release(&outv);
    views_release(&vs);
    return result;
}

PyObject *awq_py_dequantize(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    PyObject *slots[A_COUNT];
    if (parse_call("dequantize", args, nargs, kwnames, 0, slots) < 0)
        return NULL;
    if (slots[A_KERNEL] == Py_None)
        slots[A_KERNEL] = awq_get_state(module)->str_auto;
    return dequantize_impl(module, slots, 0, 0);
}

PyObject *awq_py_smart_dequantize(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    PyObject *slots[A_COUNT];
    if (parse_call("smart_dequantize", args, nargs, kwnames, 1, slots) < 0)
        return NULL;
    return dequantize_impl(module, slots, 1, 0);
}

/* Development entry: v4's rows (not a public knob) for sweeps. */
PyObject *awq_py_launch_config(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "_launch_config(qweight, qzeros, scales, out, kernel, block_size, rows)");
        return NULL;
    }
    long rows = PyLong_AsLong(args[6]);
    if (rows == -1 && PyErr_Occurred())
        return NULL;
    if (!awq_rows_valid(rows)) {
        PyErr_Format(PyExc_ValueError, "rows must be a power of two in [1, %d]", AWQ_MAX_ROWS);
        return NULL;
    }
    PyObject *slots[A_COUNT] = {args[0], args[1], args[2], Py_None, args[3],
                                Py_None, args[4], args[5], Py_None};
    return dequantize_impl(module, slots, 0, (int)rows);
}
