/*
 * validate.c -- the views of a call -> a problem, or a clear exception
 * (args.h).  Each step checks one thing, in the order a user fixes them:
 * dtypes, memory layout, devices, shapes, the output, the launch arguments,
 * the backend.
 */
#include "args.h"

#include "cuda/cuda.h"

#include <string.h>

const char *const awq_arg_names[AWQ_NUM_ARGS] = {"qweight", "qzeros", "scales", "out"};

static int is_packed_int(DLDataType t)
{
    return t.lanes == 1 && t.bits == 32 && (t.code == kDLInt || t.code == kDLUInt);
}

static int same_device(DLDevice a, DLDevice b)
{
    return a.device_type == b.device_type && a.device_id == b.device_id;
}

/* ---- steps shared by every entry point ---- */

static int check_packed(const awq_view *v, const char *name)
{
    char b[64];
    if (!is_packed_int(v->dtype)) {
        PyErr_Format(PyExc_TypeError,
                     "%s must be int32 or uint32 (8 packed 4-bit values per element), got %s",
                     name, awq_view_dtype_name(v, b, sizeof b));
        return -1;
    }
    return 0;
}

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

static int check_device(const awq_view *first, const char *first_name, const awq_view *v,
                        const char *name)
{
    char b1[32], b2[32];
    if (!same_device(first->device, v->device)) {
        PyErr_Format(PyExc_ValueError, "all tensors must be on one device: %s is on %s but %s is on %s",
                     first_name, awq_device_str(first->device, b1, sizeof b1), name,
                     awq_device_str(v->device, b2, sizeof b2));
        return -1;
    }
    return 0;
}

/* Every view given is C-contiguous and aligned, and on the device of the
 * first (views[0], which every call has). */
static int check_views(const awq_view *views, const int *have, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (have[i] && check_layout(&views[i], names[i]) < 0)
            return -1;
    for (int i = 1; i < n; i++)
        if (have[i] && check_device(&views[0], names[0], &views[i], names[i]) < 0)
            return -1;
    return 0;
}

/* The packed weights of a layer: qweight [K, N/8], qzeros and scales
 * [K/G, N]; fills *K_out, *N_out and *G. */
static int check_weights(const awq_view *qw, const awq_view *qz, const awq_view *sc,
                         PyObject *group_size, int64_t *K_out, int64_t *N_out, int64_t *G)
{
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
    if (awq_resolve_group(K, sc->shape[0], group_size, G) < 0)
        return -1;
    *K_out = K;
    *N_out = N;
    return 0;
}

int awq_resolve_group(int64_t K, int64_t groups, PyObject *group_size, int64_t *G)
{
    if (group_size != Py_None) {
        long long g;
        if (awq_parse_int(group_size, "group_size", &g) < 0)
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
        *G = g;
        return 0;
    }
    if (groups == 0) {
        if (K != 0) {
            PyErr_Format(PyExc_ValueError,
                         "scales and qzeros have 0 rows but qweight has K = %lld rows", (long long)K);
            return -1;
        }
        *G = 1;
        return 0;
    }
    if (K % groups != 0) {
        PyErr_Format(PyExc_ValueError,
                     "scales and qzeros have %lld rows, which does not divide K = %lld; each must "
                     "have K/group_size rows",
                     (long long)groups, (long long)K);
        return -1;
    }
    if (K / groups == 0) { /* more groups than rows */
        PyErr_Format(PyExc_ValueError, "scales and qzeros have %lld rows, more than K = %lld",
                     (long long)groups, (long long)K);
        return -1;
    }
    *G = K / groups;
    return 0;
}

/* A writable output that shares no memory with the inputs. */
static int check_writable(const awq_view *out, const awq_view *inputs, const int *have,
                          const char *const *names, int n)
{
    if (out->readonly) {
        PyErr_SetString(PyExc_ValueError, "out is read-only; pass a writable array");
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (have[i] && awq_views_overlap(out, &inputs[i])) {
            PyErr_Format(PyExc_ValueError, "out overlaps %s in memory; pass a separate array",
                         names[i]);
            return -1;
        }
    return 0;
}

/* The backend for the inputs' device is compiled in, and a stream is
 * given only where it means something.  (A CUDA build on a machine without
 * a usable device fails at the launch: awq_raise_status says so.) */
static int check_backend(const awq_view *first, const char *name, int explicit_stream)
{
    char b[32];
    if (first->device.device_type != kDLCUDA) {
        if (explicit_stream) {
            PyErr_SetString(PyExc_ValueError,
                            "stream applies to CUDA tensors, but the inputs are on the CPU; "
                            "pass stream=None");
            return -1;
        }
        return 0;
    }
    if (!awq_cuda_compiled()) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s is a CUDA tensor (%s) but awq_fast_dequant was built without CUDA. "
                     "Rebuild it with nvcc available (on PATH, or CUDA_HOME set) and "
                     "AWQ_FAST_DEQUANT_NO_CUDA unset, from the source folder: "
                     "pip install --force-reinstall --no-build-isolation --no-deps .",
                     name, awq_device_str(first->device, b, sizeof b));
        return -1;
    }
    return 0;
}

/* ---- dequantize ---- */

static int check_dtypes(const awq_dequantize_call *c, awq_problem *p)
{
    char b[64];
    const awq_view *sc = &c->v[AWQ_ARG_SCALES];
    if (check_packed(&c->v[AWQ_ARG_QWEIGHT], "qweight") < 0 ||
        check_packed(&c->v[AWQ_ARG_QZEROS], "qzeros") < 0)
        return -1;
    if (awq_dtype_from_dl(sc->dtype, &p->scale_dtype) < 0) {
        PyErr_Format(PyExc_TypeError, "scales must be float16, bfloat16 or float32, got %s",
                     awq_view_dtype_name(sc, b, sizeof b));
        return -1;
    }
    p->out_dtype = p->scale_dtype;
    if (c->out_dtype != Py_None && awq_parse_dtype(c->out_dtype, "out_dtype", &p->out_dtype) < 0)
        return -1;
    if (c->have[AWQ_ARG_OUT]) {
        awq_dtype got;
        const awq_view *out = &c->v[AWQ_ARG_OUT];
        if (awq_dtype_from_dl(out->dtype, &got) < 0 || got != p->out_dtype) {
            PyErr_Format(PyExc_TypeError, "out must have dtype %s (%s), got %s",
                         awq_dtype_name(p->out_dtype),
                         c->out_dtype != Py_None ? "out_dtype"
                                                 : "the dtype of scales; pass out_dtype= for another",
                         awq_view_dtype_name(out, b, sizeof b));
            return -1;
        }
    }
    return 0;
}

static int check_out(const awq_dequantize_call *c, const awq_problem *p)
{
    if (!c->have[AWQ_ARG_OUT])
        return 0;
    const awq_view *out = &c->v[AWQ_ARG_OUT];
    if (out->shape[0] != p->K || out->shape[1] != p->N) {
        PyErr_Format(PyExc_ValueError, "out must have shape (%lld, %lld), got (%lld, %lld)",
                     (long long)p->K, (long long)p->N, (long long)out->shape[0],
                     (long long)out->shape[1]);
        return -1;
    }
    return check_writable(out, c->v, c->have, awq_arg_names, AWQ_ARG_OUT);
}

/* kernel and block_size -> the configuration (0 fields: the backend's defaults). */
static int check_launch(const awq_dequantize_call *c, int on_cuda, awq_config *cfg)
{
    char b[32];
    int kernel = AWQ_KERNEL_AUTO;
    memset(cfg, 0, sizeof(*cfg));
    if (c->kernel != Py_None && awq_parse_kernel(c->kernel, &kernel) < 0)
        return -1;
    if (on_cuda && kernel == AWQ_KERNEL_CPU) {
        PyErr_Format(PyExc_ValueError,
                     "kernel 'cpu' needs host arrays, but the inputs are on %s; use 'auto' or "
                     "'v1'..'v4'",
                     awq_device_str(c->v[AWQ_ARG_QWEIGHT].device, b, sizeof b));
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
    if (c->block_size != Py_None) {
        if (awq_parse_int(c->block_size, "block_size", &bs) < 0)
            return -1;
        if (!on_cuda || kernel == AWQ_KERNEL_V1 || kernel == AWQ_KERNEL_V2) {
            PyErr_Format(PyExc_ValueError,
                         "block_size applies to the CUDA kernels v3 and v4 ('auto' on CUDA) only; "
                         "got block_size=%lld with kernel %R on %s",
                         bs, c->kernel, awq_device_str(c->v[AWQ_ARG_QWEIGHT].device, b, sizeof b));
            return -1;
        }
        if (!awq_block_size_valid(bs)) {
            PyErr_Format(PyExc_ValueError,
                         "block_size must be a multiple of 32 between 32 and %d, got %lld",
                         AWQ_MAX_BLOCK, bs);
            return -1;
        }
    }
    if (on_cuda) {
        cfg->kernel = kernel == AWQ_KERNEL_AUTO ? AWQ_KERNEL_V4 : kernel;
        cfg->block_size = (int)bs;
    } else {
        cfg->kernel = AWQ_KERNEL_CPU;
    }
    return 0;
}

int awq_validate_dequantize(const awq_dequantize_call *c, awq_problem *p, awq_config *cfg)
{
    const awq_view *qw = &c->v[AWQ_ARG_QWEIGHT];
    if (check_dtypes(c, p) < 0)
        return -1;
    if (check_views(c->v, c->have, awq_arg_names, AWQ_NUM_ARGS) < 0)
        return -1;
    if (check_weights(qw, &c->v[AWQ_ARG_QZEROS], &c->v[AWQ_ARG_SCALES], c->group_size, &p->K,
                      &p->N, &p->G) < 0 ||
        check_out(c, p) < 0)
        return -1;
    const int on_cuda = qw->device.device_type == kDLCUDA;
    if (check_launch(c, on_cuda, cfg) < 0 || check_backend(qw, "qweight", c->explicit_stream) < 0)
        return -1;

    p->qweight = (const uint32_t *)qw->data;
    p->qzeros = (const uint32_t *)c->v[AWQ_ARG_QZEROS].data;
    p->scales = c->v[AWQ_ARG_SCALES].data;
    p->out = c->have[AWQ_ARG_OUT] ? c->v[AWQ_ARG_OUT].data : NULL;
    p->device = on_cuda ? (int)qw->device.device_id : -1;
    p->stream = NULL;
    return 0;
}

/* ---- linear ---- */

const char *const awq_lin_arg_names[AWQ_LIN_NUM_ARGS] = {"x",      "qweight", "qzeros",
                                                          "scales", "bias",    "out"};

/* x, scales, bias and out share one float dtype. */
static int check_linear_dtypes(const awq_linear_call *c, awq_linear_problem *p)
{
    char b1[64], b2[64];
    const awq_view *x = &c->v[AWQ_LIN_X];
    if (awq_dtype_from_dl(x->dtype, &p->dtype) < 0) {
        PyErr_Format(PyExc_TypeError, "x must be float16, bfloat16 or float32, got %s",
                     awq_view_dtype_name(x, b1, sizeof b1));
        return -1;
    }
    if (check_packed(&c->v[AWQ_LIN_QWEIGHT], "qweight") < 0 ||
        check_packed(&c->v[AWQ_LIN_QZEROS], "qzeros") < 0)
        return -1;
    static const int same[] = {AWQ_LIN_SCALES, AWQ_LIN_BIAS, AWQ_LIN_OUT};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        const int a = same[i];
        awq_dtype got;
        if (!c->have[a])
            continue;
        if (awq_dtype_from_dl(c->v[a].dtype, &got) < 0 || got != p->dtype) {
            PyErr_Format(PyExc_TypeError, "%s must have x's dtype %s, got %s",
                         awq_lin_arg_names[a], awq_dtype_name(p->dtype),
                         awq_view_dtype_name(&c->v[a], b2, sizeof b2));
            return -1;
        }
    }
    return 0;
}

/* x [..., K], bias [N], out [..., N] with x's leading dimensions. */
static int check_linear_shapes(const awq_linear_call *c, awq_linear_problem *p)
{
    const awq_view *x = &c->v[AWQ_LIN_X];
    const int64_t K = x->shape[x->ndim - 1];
    if (K != p->K) {
        PyErr_Format(PyExc_ValueError,
                     "x's last dimension must be K = %lld (qweight's rows, in_features), got %lld",
                     (long long)p->K, (long long)K);
        return -1;
    }
    p->M = 1;
    for (int i = 0; i < x->ndim - 1; i++)
        p->M *= x->shape[i];
    if (c->have[AWQ_LIN_BIAS] && c->v[AWQ_LIN_BIAS].shape[0] != p->N) {
        PyErr_Format(PyExc_ValueError, "bias must have shape (%lld,) (N, out_features), got (%lld,)",
                     (long long)p->N, (long long)c->v[AWQ_LIN_BIAS].shape[0]);
        return -1;
    }
    if (!c->have[AWQ_LIN_OUT])
        return 0;
    const awq_view *out = &c->v[AWQ_LIN_OUT];
    int ok = out->ndim == x->ndim && out->shape[out->ndim - 1] == p->N;
    for (int i = 0; ok && i < x->ndim - 1; i++)
        ok = out->shape[i] == x->shape[i];
    if (!ok) {
        char want[256], got[256];
        int w = 0, g = 0;
        for (int i = 0; i < x->ndim; i++)
            w += snprintf(want + w, sizeof want - (size_t)w, "%s%lld", i ? ", " : "",
                          (long long)(i < x->ndim - 1 ? x->shape[i] : p->N));
        for (int i = 0; i < out->ndim; i++)
            g += snprintf(got + g, sizeof got - (size_t)g, "%s%lld", i ? ", " : "",
                          (long long)out->shape[i]);
        PyErr_Format(PyExc_ValueError,
                     "out must have shape (%s%s) (x's leading dimensions, then N), got (%s%s)", want,
                     x->ndim == 1 ? "," : "", got, out->ndim == 1 ? "," : "");
        return -1;
    }
    return check_writable(out, c->v, c->have, awq_lin_arg_names, AWQ_LIN_OUT);
}

static int parse_path(PyObject *o, awq_path *path)
{
    static const char *const names[] = {"auto", "fused", "dequant"};
    *path = AWQ_PATH_AUTO;
    if (o == Py_None)
        return 0;
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "path must be a str: 'auto', 'fused' or 'dequant', got %.200s",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    const char *s = PyUnicode_AsUTF8(o);
    if (s == NULL)
        return -1;
    for (int i = 0; i < 3; i++)
        if (strcmp(s, names[i]) == 0) {
            *path = (awq_path)i;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "path must be 'auto', 'fused' or 'dequant', got %R", o);
    return -1;
}

int awq_validate_linear(const awq_linear_call *c, awq_linear_problem *p, awq_path *path)
{
    const awq_view *x = &c->v[AWQ_LIN_X];
    memset(p, 0, sizeof *p);
    if (check_linear_dtypes(c, p) < 0)
        return -1;
    if (check_views(c->v, c->have, awq_lin_arg_names, AWQ_LIN_NUM_ARGS) < 0)
        return -1;
    if (check_weights(&c->v[AWQ_LIN_QWEIGHT], &c->v[AWQ_LIN_QZEROS], &c->v[AWQ_LIN_SCALES],
                      c->group_size, &p->K, &p->N, &p->G) < 0)
        return -1;
    if (check_linear_shapes(c, p) < 0 || parse_path(c->path, path) < 0 ||
        check_backend(x, "x", c->explicit_stream) < 0)
        return -1;
    p->x = x->data;
    p->qweight = (const uint32_t *)c->v[AWQ_LIN_QWEIGHT].data;
    p->qzeros = (const uint32_t *)c->v[AWQ_LIN_QZEROS].data;
    p->scales = c->v[AWQ_LIN_SCALES].data;
    p->bias = c->have[AWQ_LIN_BIAS] ? c->v[AWQ_LIN_BIAS].data : NULL;
    p->y = c->have[AWQ_LIN_OUT] ? c->v[AWQ_LIN_OUT].data : NULL;
    p->device = x->device.device_type == kDLCUDA ? (int)x->device.device_id : -1;
    return 0;
}
