/*
 * linear.c -- the entry point linear(): y = x @ W + bias (linear.h).
 *
 * A call goes: arguments (args.c) -> views and stream (views.c) ->
 * validation (validate.c) -> y in the caller's framework (alloc.c) -> the
 * path and configuration from the autotune cache (cache.c) -> the fused
 * kernel (run.c), or dequantize into a buffer of x's framework and the
 * framework's matmul (the package's hook).
 */
#include "linear.h"

#include <string.h>

#include "alloc.h"
#include "args.h"
#include "cache.h"
#include "cpu/cpu.h"
#include "cuda/cuda.h"
#include "run.h"

static const int kLinearKws[] = {AWQ_KW_X,      AWQ_KW_QWEIGHT, AWQ_KW_QZEROS,
                                 AWQ_KW_SCALES, AWQ_KW_BIAS,    AWQ_KW_GROUP_SIZE,
                                 AWQ_KW_OUT,    AWQ_KW_STREAM,  AWQ_KW_PATH};
static const awq_signature kLinear = {"linear", kLinearKws, 9, 5, 4};

int awq_linear_job_prepare(PyObject *module, PyObject *const *slots, awq_linear_job *job)
{
    awq_state *st = awq_get_state(module);
    awq_linear_call *c = &job->call;
    memset(job, 0, sizeof *job);
    job->module = module;
    job->x = slots[AWQ_KW_X];
    job->bias = slots[AWQ_KW_BIAS];
    c->group_size = slots[AWQ_KW_GROUP_SIZE];
    c->path = slots[AWQ_KW_PATH];

    if (awq_stream_begin(st, slots[AWQ_KW_STREAM], job->x, &job->opts) < 0)
        return -1;
    c->explicit_stream = job->opts.explicit_stream;
    static const int kArgKw[AWQ_LIN_NUM_ARGS] = {AWQ_KW_X,      AWQ_KW_QWEIGHT, AWQ_KW_QZEROS,
                                                 AWQ_KW_SCALES, AWQ_KW_BIAS,    AWQ_KW_OUT};
    for (int i = 0; i < AWQ_LIN_NUM_ARGS; i++) {
        PyObject *o = slots[kArgKw[i]];
        if (o == Py_None && (i == AWQ_LIN_BIAS || i == AWQ_LIN_OUT))
            continue;
        awq_ndim want = AWQ_NDIM_2D;
        if (i == AWQ_LIN_X || i == AWQ_LIN_OUT)
            want = (awq_ndim){1, AWQ_VIEW_MAX_NDIM};
        else if (i == AWQ_LIN_BIAS)
            want = (awq_ndim){1, 1};
        if (awq_view_from_object(st, o, awq_lin_arg_names[i], want, &job->opts, &c->v[i]) < 0)
            return -1;
        c->have[i] = 1;
    }
    if (awq_validate_linear(c, &job->p, &job->path) < 0)
        return -1;
    if (awq_stream_of(&job->opts, &c->v[AWQ_LIN_X], job->p.device, &job->p.stream) < 0)
        return -1;

    if (c->have[AWQ_LIN_OUT]) {
        job->result = Py_NewRef(slots[AWQ_KW_OUT]);
        return 0;
    }
    const awq_view *x = &c->v[AWQ_LIN_X];
    int64_t shape[AWQ_VIEW_MAX_NDIM];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = job->p.N;
    job->result = awq_alloc_like(st, job->x, x, x->ndim, shape, job->p.dtype, &job->yv);
    if (job->result == NULL)
        return -1;
    job->have_yv = 1;
    job->p.y = job->yv.data;
    return 0;
}

PyObject *awq_linear_job_release(awq_linear_job *job, int keep)
{
    return awq_call_end(job->call.v, job->call.have, AWQ_LIN_NUM_ARGS,
                        job->have_yv ? &job->yv : NULL, &job->result, keep);
}

/* ---- the dequantize path ---- */

/* The dequantize problem that writes W (x's dtype) into out, and its
 * default configuration. */
static awq_problem weight_problem(const awq_linear_problem *lp, void *out, awq_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->kernel = lp->device >= 0 ? AWQ_KERNEL_V4 : AWQ_KERNEL_CPU;
    return (awq_problem){.qweight = lp->qweight,
                         .qzeros = lp->qzeros,
                         .scales = lp->scales,
                         .out = out,
                         .K = lp->K,
                         .N = lp->N,
                         .G = lp->G,
                         .scale_dtype = lp->dtype,
                         .out_dtype = lp->dtype,
                         .device = lp->device,
                         .stream = lp->stream};
}

/* W = dequantize(qweight, qzeros, scales) in x's dtype, in a new [K, N]
 * array of x's framework on the call's stream; a new reference or NULL.
 * With run == 0 the array is only allocated; *wv (when given) keeps its
 * view for the caller to release. */
static PyObject *dense_weight(const awq_linear_job *job, int run, awq_view *wv_out)
{
    awq_state *st = awq_get_state(job->module);
    const awq_linear_problem *lp = &job->p;
    awq_view wv;
    const int64_t shape[2] = {lp->K, lp->N};
    PyObject *w = awq_alloc_like(st, job->x, &job->call.v[AWQ_LIN_X], 2, shape, lp->dtype, &wv);
    if (w == NULL)
        return NULL;
    awq_config cfg;
    awq_problem dq = weight_problem(lp, wv.data, &cfg);
    int r = run ? awq_run_dequantize(&dq, &cfg) : 0;
    if (wv_out != NULL && r == 0)
        *wv_out = wv;
    else
        awq_view_release(&wv);
    if (r < 0)
        Py_CLEAR(w);
    return w;
}

/* The stream argument of the matmul hook: the caller's, or None for the
 * framework's current one. */
static PyObject *hook_stream(const awq_linear_job *job)
{
    if (job->p.device >= 0 && job->opts.have_stream)
        return PyLong_FromSsize_t((Py_ssize_t)job->opts.handle);
    return Py_NewRef(Py_None);
}

/* Calls hook(x, w, bias, y, stream); returns its result or NULL. */
static PyObject *call_hook(const awq_linear_job *job, PyObject *hook, PyObject *w)
{
    if (hook == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "awq_fast_dequant: no matmul hook registered");
        return NULL;
    }
    PyObject *stream = hook_stream(job);
    if (stream == NULL)
        return NULL;
    PyObject *args[5] = {job->x, w, job->bias, job->result, stream};
    PyObject *r = PyObject_Vectorcall(hook, args, 5, NULL);
    Py_DECREF(stream);
    return r;
}

int awq_linear_run_dequant_path(const awq_linear_job *job)
{
    awq_state *st = awq_get_state(job->module);
    PyObject *w = dense_weight(job, 1, NULL);
    if (w == NULL)
        return -1;
    PyObject *r = call_hook(job, st->matmul_hook, w);
    Py_DECREF(w);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* awq_linear_timer for the tuner: the dequantize kernel's time (its own
 * clock: CUDA events after the cold-L2 flush the fused candidates get, or
 * the host clock) plus the matmul hook's (right after its own previous run,
 * as it runs right after the kernel that wrote the weight). */
static int time_dequant_path(void *ctx, float *us)
{
    const awq_linear_job *job = ctx;
    awq_state *st = awq_get_state(job->module);
    const awq_linear_problem *lp = &job->p;
    awq_view wv;
    PyObject *w = dense_weight(job, 0, &wv);
    if (w == NULL)
        return -1;
    awq_config cfg;
    awq_problem dq = weight_problem(lp, wv.data, &cfg);
    awq_status s;
    int detail = 0;
    float dq_us = 0.0f;
    Py_BEGIN_ALLOW_THREADS
    if (lp->device >= 0) {
        float ms = 0.0f;
        awq_cuda_flush flush;
        s = awq_cuda_flush_create(lp->device, &flush, &detail);
        if (s == AWQ_OK) {
            s = awq_cuda_time(&dq, &cfg, &flush, 1, 5, &ms, &detail);
            awq_cuda_flush_destroy(&flush);
        }
        dq_us = ms * 1000.0f;
    } else {
        awq_cpu_timing t = {&dq, NULL, 1, 3, 0.0};
        s = awq_cpu_time(&cfg, &dq_us, &detail, &t);
    }
    Py_END_ALLOW_THREADS
    awq_view_release(&wv);
    if (s != AWQ_OK) {
        Py_DECREF(w);
        return awq_raise_status(s, detail, lp->device);
    }
    PyObject *r = call_hook(job, st->time_matmul_hook, w);
    Py_DECREF(w);
    if (r == NULL)
        return -1;
    double mm_us = PyFloat_AsDouble(r);
    Py_DECREF(r);
    if (mm_us == -1.0 && PyErr_Occurred())
        return -1;
    *us = dq_us + (float)mm_us;
    return 0;
}

PyObject *awq_py_linear(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames)
{
    PyObject *slots[AWQ_KW_COUNT];
    awq_linear_job job;
    if (awq_parse_call(awq_get_state(module), &kLinear, args, nargs, kwnames, slots) < 0)
        return NULL;
    int ok = awq_linear_job_prepare(module, slots, &job) == 0;
    if (ok && job.p.M > 0 && job.p.N > 0) {
        awq_config cfg;
        /* K = 0 (an empty sum: y = bias) is the framework's to compute. */
        ok = awq_cache_linear(module, &job.p, job.p.K == 0 ? AWQ_PATH_DEQUANT : job.path,
                              time_dequant_path, &job, &cfg) == 0;
        if (ok)
            ok = (cfg.kernel == AWQ_KERNEL_DEQUANT ? awq_linear_run_dequant_path(&job)
                                                   : awq_run_linear_tuned(&job.p, &cfg)) == 0;
    }
    return awq_linear_job_release(&job, ok);
}
