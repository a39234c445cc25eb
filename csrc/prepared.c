/*
 * prepared.c -- the entry point of the prepared-layout kernel (prepared.h).
 */
#include "prepared.h"

#include <string.h>

#include "alloc.h"
#include "cuda/cuda.h"
#include "run.h"
#include "views.h"

enum { P_X, P_WORDS, P_OPERANDS, P_BIAS, P_OUT, P_NUM };
static const char *const kNames[P_NUM] = {"x", "words", "operands", "bias", "out"};

static int is_int32(DLDataType t) { return t.code == kDLInt && t.bits == 32 && t.lanes == 1; }

/* The checks, in the order a user fixes them; 0, or -1 with an exception. */
static int check(const awq_view *v, const int *have, PyObject *group_size, awq_prepared_problem *p)
{
    char a[64], b[64];
    awq_dtype dt;
    if (awq_dtype_from_dl(v[P_X].dtype, &dt) < 0 || dt == AWQ_F32) {
        PyErr_Format(PyExc_TypeError, "x must be float16 or bfloat16 for the prepared layout, got %s",
                     awq_view_dtype_name(&v[P_X], a, sizeof a));
        return -1;
    }
    for (int i = P_WORDS; i <= P_OPERANDS; i++)
        if (!is_int32(v[i].dtype)) {
            PyErr_Format(PyExc_TypeError, "%s must be int32 (from prepare_prefill), got %s", kNames[i],
                         awq_view_dtype_name(&v[i], a, sizeof a));
            return -1;
        }
    for (int i = P_BIAS; i <= P_OUT; i++)
        if (have[i] && (v[i].dtype.code != v[P_X].dtype.code || v[i].dtype.bits != v[P_X].dtype.bits ||
                        v[i].dtype.lanes != 1)) {
            PyErr_Format(PyExc_TypeError, "%s must have x's dtype %s, got %s", kNames[i],
                         awq_view_dtype_name(&v[P_X], a, sizeof a), awq_view_dtype_name(&v[i], b, sizeof b));
            return -1;
        }
    for (int i = 0; i < P_NUM; i++)
        if (have[i] && (!v[i].c_contiguous || !v[i].aligned)) {
            PyErr_Format(PyExc_ValueError, "%s must be C-contiguous and aligned; pass %s.contiguous()",
                         kNames[i], kNames[i]);
            return -1;
        }
    if (v[P_X].device.device_type != kDLCUDA) {
        PyErr_Format(PyExc_ValueError, "the prepared layout runs on CUDA only; x is on %s",
                     awq_device_str(v[P_X].device, a, sizeof a));
        return -1;
    }
    for (int i = 1; i < P_NUM; i++)
        if (have[i] && (v[i].device.device_type != v[P_X].device.device_type ||
                        v[i].device.device_id != v[P_X].device.device_id)) {
            PyErr_Format(PyExc_ValueError, "%s is on %s but x is on %s", kNames[i],
                         awq_device_str(v[i].device, a, sizeof a), awq_device_str(v[P_X].device, b, sizeof b));
            return -1;
        }

    const awq_view *x = &v[P_X];
    const int64_t K = x->shape[x->ndim - 1];
    const int64_t M = K > 0 ? awq_view_numel(x) / K : 0;
    long long G = PyLong_AsLongLong(group_size);
    if (G == -1 && PyErr_Occurred())
        return -1;
    const int64_t words = awq_view_numel(&v[P_WORDS]);
    if (K < 128 || K % 128 != 0 || K >= ((int64_t)1 << 30)) {
        PyErr_Format(PyExc_ValueError, "the prepared layout needs in_features a multiple of 128, got %lld",
                     (long long)K);
        return -1;
    }
    if (G < 64 || G % 64 != 0 || K % G != 0 || ((G / 64) & (G / 64 - 1)) != 0) {
        PyErr_Format(PyExc_ValueError,
                     "the prepared layout needs group_size 64 x 2^j dividing in_features %lld, got %lld",
                     (long long)K, G);
        return -1;
    }
    const int64_t N = words * 8 / K;
    if (words * 8 != N * K || N < 128 || N % 128 != 0) {
        PyErr_Format(PyExc_ValueError,
                     "words has %lld elements: in_features (%lld) x out_features / 8 with out_features a "
                     "multiple of 128 expected",
                     (long long)words, (long long)K);
        return -1;
    }
    if (awq_view_numel(&v[P_OPERANDS]) != (K / G) * N * 2) {
        PyErr_Format(PyExc_ValueError, "operands has %lld elements; %lld expected ((in_features / G) x out_features x 2)",
                     (long long)awq_view_numel(&v[P_OPERANDS]), (long long)((K / G) * N * 2));
        return -1;
    }
    if (have[P_BIAS] && (v[P_BIAS].ndim != 1 || v[P_BIAS].shape[0] != N)) {
        PyErr_Format(PyExc_ValueError, "bias must have shape [%lld]", (long long)N);
        return -1;
    }
    if (have[P_OUT]) {
        int ok = v[P_OUT].ndim == x->ndim && v[P_OUT].shape[x->ndim - 1] == N;
        for (int d = 0; ok && d < x->ndim - 1; d++)
            ok = v[P_OUT].shape[d] == x->shape[d];
        if (!ok) {
            PyErr_Format(PyExc_ValueError, "out must have x's shape with out_features %lld last", (long long)N);
            return -1;
        }
        if (v[P_OUT].readonly) {
            PyErr_SetString(PyExc_ValueError, "out is read-only");
            return -1;
        }
        for (int i = 0; i < P_OUT; i++)
            if (have[i] && awq_views_overlap(&v[P_OUT], &v[i])) {
                PyErr_Format(PyExc_ValueError, "out overlaps %s", kNames[i]);
                return -1;
            }
    }
    for (int i = 0; i < P_NUM; i++)
        if (have[i] && ((uintptr_t)v[i].data % 16) != 0) {
            PyErr_Format(PyExc_ValueError, "%s's data must be 16-byte aligned", kNames[i]);
            return -1;
        }
    memset(p, 0, sizeof *p);
    p->x = x->data;
    p->words = v[P_WORDS].data;
    p->operands = v[P_OPERANDS].data;
    p->bias = have[P_BIAS] ? v[P_BIAS].data : NULL;
    p->M = M;
    p->K = K;
    p->N = N;
    p->G = G;
    p->dtype = dt;
    p->device = x->device.device_id;
    return 0;
}

PyObject *awq_py_linear_prepared(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    awq_state *st = awq_get_state(module);
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "_linear_prepared(x, words, operands, bias, group_size, out) takes 6 "
                                         "arguments");
        return NULL;
    }
    awq_view v[P_NUM];
    int have[P_NUM] = {0};
    awq_view yv;
    int have_yv = 0, ok = 0;
    PyObject *result = NULL;
    awq_view_opts opts;
    awq_prepared_problem p;
    const int slot[P_NUM] = {0, 1, 2, 3, 5};
    memset(v, 0, sizeof v);
    if (awq_stream_begin(st, Py_None, args[0], &opts) < 0)
        return NULL;
    for (int i = 0; i < P_NUM; i++) {
        PyObject *o = args[slot[i]];
        if (o == Py_None && (i == P_BIAS || i == P_OUT))
            continue;
        awq_ndim want = {1, AWQ_VIEW_MAX_NDIM};
        if (awq_view_from_object(st, o, kNames[i], want, &opts, &v[i]) < 0)
            goto done;
        have[i] = 1;
    }
    if (check(v, have, args[4], &p) < 0 || awq_stream_of(&opts, &v[P_X], p.device, &p.stream) < 0)
        goto done;
    if (have[P_OUT]) {
        result = Py_NewRef(args[5]);
        p.y = v[P_OUT].data;
    } else {
        int64_t shape[AWQ_VIEW_MAX_NDIM];
        memcpy(shape, v[P_X].shape, sizeof shape);
        shape[v[P_X].ndim - 1] = p.N;
        result = awq_alloc_like(st, args[0], &v[P_X], v[P_X].ndim, shape, p.dtype, &yv);
        if (result == NULL)
            goto done;
        have_yv = 1;
        p.y = yv.data;
    }
    if (p.M > 0) {
        int detail = 0;
        const awq_status s = awq_cuda_linear_prepared(&p, &detail);
        if (s == AWQ_ERR_CONFIG) { /* check() has taken every problem it refuses: the device */
            PyErr_Format(PyExc_RuntimeError,
                         "the prepared layout's kernel runs on compute capability 9.0 (H100, H200) in a "
                         "build with its sm_90a code; device %d is not one (build_info() lists the "
                         "build's architectures)",
                         p.device);
            goto done;
        }
        if (awq_raise_status(s, detail, p.device) < 0)
            goto done;
    }
    ok = 1;
done:
    return awq_call_end(v, have, P_NUM, have_yv ? &yv : NULL, &result, ok);
}

PyObject *awq_py_prepared_supported(PyObject *module, PyObject *arg)
{
    (void)module;
    const long d = PyLong_AsLong(arg);
    if (d == -1 && PyErr_Occurred())
        return NULL;
    if (d < 0 || d > 1 << 20) {
        PyErr_SetString(PyExc_ValueError, "device must be a CUDA device ordinal");
        return NULL;
    }
    int detail = 0;
    if ((int)d >= awq_cuda_device_count(&detail))
        Py_RETURN_FALSE;
    return PyBool_FromLong(awq_cuda_prepared_supported((int)d));
}
