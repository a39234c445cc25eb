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

/* On the host, for torch tensors, W is dequantized in slabs of whole groups
 * of rows, each at most DEQUANT_SLAB_BYTES (one group where a group is
 * larger), and each slab's product is added to y (torch.addmm) before the
 * next slab is written.  A new array of all of W would be new pages on
 * every call, since the C library maps blocks above 32 MiB afresh and
 * unmaps them when freed, and their first touch costs more than the
 * dequantization: for 4096 x 4096 float32 (64 MiB), M = 64, on a 2-core
 * VM, about 15 ms of page faults against 2 ms to dequantize and 9 ms for
 * the matmul.  A slab's buffer stays below that size, so the allocator
 * reuses its pages from call to call; each slab adds a pass over y, which
 * 16 MiB slabs keep few (4 MiB ones took up to 12% longer at M = 1024).
 * W stays whole:
 * - for float16 and bfloat16: y holds the sum between slabs, in y's dtype,
 *   and would round it once a slab where DESIGN.md section 7 allows one
 *   rounding;
 * - for NumPy arrays: NumPy adds through a temporary, and its BLAS's idle
 *   threads spin for a while after each product (OpenBLAS: 2^28 cycles by
 *   default) and take the cores from the next slab's dequantize threads;
 * - on a GPU, where the framework's caching allocator reuses W's memory.
 * The slabs depend on the problem and x's framework alone: the same call
 * always sums the same way. */
enum { DEQUANT_SLAB_BYTES = 16 << 20 };

/* Rows of W per slab: K (one slab), or a multiple of G below K. */
static int64_t slab_rows(const awq_linear_job *job)
{
    const awq_linear_problem *lp = &job->p;
    if (lp->device >= 0 || lp->dtype != AWQ_F32 || job->call.v[AWQ_LIN_X].is_numpy)
        return lp->K;
    int64_t groups = DEQUANT_SLAB_BYTES / ((int64_t)sizeof(float) * lp->N * lp->G);
    int64_t rows = (groups > 1 ? groups : 1) * lp->G;
    return rows < lp->K ? rows : lp->K;
}

/* The dequantize problem that writes rows [k0, k0 + rows) of W (x's
 * dtype) into out, and its default configuration. */
static awq_problem weight_problem(const awq_linear_problem *lp, int64_t k0, int64_t rows,
                                  void *out, awq_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->kernel = lp->device >= 0 ? AWQ_KERNEL_V4 : AWQ_KERNEL_CPU;
    const int64_t words = lp->N / 8, g0 = k0 / lp->G; /* G >= 1, and k0 a multiple of it */
    return (awq_problem){.qweight = lp->qweight + k0 * words,
                         .qzeros = lp->qzeros + g0 * words,
                         .scales = (const char *)lp->scales +
                                   g0 * lp->N * (int64_t)awq_dtype_size(lp->dtype),
                         .out = out,
                         .K = rows,
                         .N = lp->N,
                         .G = lp->G,
                         .scale_dtype = lp->dtype,
                         .out_dtype = lp->dtype,
                         .device = lp->device,
                         .stream = lp->stream};
}

/* A new [rows, N] array of x's framework and dtype on the call's device,
 * its view in *wv (for the caller to release); NULL with an exception. */
static PyObject *weight_array(const awq_linear_job *job, int64_t rows, awq_view *wv)
{
    awq_state *st = awq_get_state(job->module);
    const int64_t shape[2] = {rows, job->p.N};
    return awq_alloc_like(st, job->x, &job->call.v[AWQ_LIN_X], 2, shape, job->p.dtype, wv);
}

/* The stream argument of the matmul hook: the caller's, or None for the
 * framework's current one. */
static PyObject *hook_stream(const awq_linear_job *job)
{
    if (job->p.device >= 0 && job->opts.have_stream)
        return PyLong_FromSsize_t((Py_ssize_t)job->opts.handle);
    return Py_NewRef(Py_None);
}

/* Calls hook(x, w, bias, y, stream): y = x @ w + bias, w all of W; or, for
 * a slab, hook(x, w, bias, y, stream, k0, rows): W's rows [k0, k0 + rows)
 * are w[:rows], and y = x[..., k0:k0 + rows] @ w[:rows] + bias for the
 * first slab (k0 = 0), y += x[..., k0:k0 + rows] @ w[:rows] for the
 * others.  Returns the hook's result or NULL. */
static PyObject *call_hook(const awq_linear_job *job, PyObject *hook, PyObject *w, int slab,
                           int64_t k0, int64_t rows)
{
    if (hook == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "awq_fast_dequant: no matmul hook registered");
        return NULL;
    }
    PyObject *args[7] = {job->x, w, job->bias, job->result, hook_stream(job), NULL, NULL};
    PyObject *r = NULL;
    if (args[4] == NULL)
        return NULL;
    if (slab) {
        args[5] = PyLong_FromLongLong(k0);
        args[6] = PyLong_FromLongLong(rows);
    }
    if (!slab || (args[5] != NULL && args[6] != NULL))
        r = PyObject_Vectorcall(hook, args, slab ? 7 : 5, NULL);
    for (int i = 4; i < 7; i++)
        Py_XDECREF(args[i]);
    return r;
}

int awq_linear_run_dequant_path(const awq_linear_job *job)
{
    awq_state *st = awq_get_state(job->module);
    const awq_linear_problem *lp = &job->p;
    const int64_t rows = slab_rows(job);
    const int slab = rows < lp->K;
    awq_view wv;
    PyObject *w = weight_array(job, rows, &wv);
    if (w == NULL)
        return -1;
    int r = 0;
    int64_t k0 = 0;
    do {
        const int64_t n = lp->K - k0 < rows ? lp->K - k0 : rows;
        awq_config cfg;
        awq_problem dq = weight_problem(lp, k0, n, wv.data, &cfg);
        r = awq_run_dequantize(&dq, &cfg);
        if (r == 0) {
            PyObject *res = call_hook(job, st->matmul_hook, w, slab, k0, n);
            r = res == NULL ? -1 : 0;
            Py_XDECREF(res);
        }
        k0 += rows;
    } while (r == 0 && k0 < lp->K);
    awq_view_release(&wv);
    Py_DECREF(w);
    return r;
}

/* awq_linear_timer for the tuner.  On the host: the whole path as a call
 * runs it (W's array, the dequantize kernel and the matmul hook, slab by
 * slab), best of a few runs after one, as the fused candidates are timed.
 * On a GPU: the dequantize kernel's time on CUDA events after the cold-L2
 * flush the fused candidates get, plus the matmul hook's (right after its
 * own previous run, as it runs right after the kernel that wrote W). */
static int time_dequant_path(void *ctx, float *us)
{
    const awq_linear_job *job = ctx;
    awq_state *st = awq_get_state(job->module);
    const awq_linear_problem *lp = &job->p;
    if (lp->device < 0) {
        enum { WARMUP = 1, RUNS = 3 };
        double best = 0.0;
        for (int i = 0; i < WARMUP + RUNS; i++) {
            double t0 = awq_cpu_now_us();
            if (awq_linear_run_dequant_path(job) < 0)
                return -1;
            double dt = awq_cpu_now_us() - t0;
            if (i == WARMUP || (i > WARMUP && dt < best))
                best = dt;
        }
        *us = (float)best;
        return 0;
    }
    awq_view wv;
    PyObject *w = weight_array(job, lp->K, &wv);
    if (w == NULL)
        return -1;
    awq_config cfg;
    awq_problem dq = weight_problem(lp, 0, lp->K, wv.data, &cfg);
    awq_status s;
    int detail = 0;
    float dq_us = 0.0f;
    Py_BEGIN_ALLOW_THREADS
    float ms = 0.0f;
    awq_cuda_flush flush;
    s = awq_cuda_flush_create(lp->device, &flush, &detail);
    if (s == AWQ_OK) {
        s = awq_cuda_time(&dq, &cfg, &flush, 1, 5, &ms, &detail);
        awq_cuda_flush_destroy(&flush);
    }
    dq_us = ms * 1000.0f;
    Py_END_ALLOW_THREADS
    awq_view_release(&wv);
    if (s != AWQ_OK) {
        Py_DECREF(w);
        return awq_raise_status(s, detail, lp->device);
    }
    PyObject *r = call_hook(job, st->time_matmul_hook, w, 0, 0, lp->K);
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
