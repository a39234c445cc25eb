/*
 * dequantize.c -- the entry points dequantize / smart_dequantize
 * (dequantize.h has the path of a call).
 */
#include "dequantize.h"

#include <string.h>

#include "alloc.h"
#include "cache.h"
#include "run.h"

static const int kDequantizeKws[] = {AWQ_KW_QWEIGHT,   AWQ_KW_QZEROS, AWQ_KW_SCALES,
                                     AWQ_KW_GROUP_SIZE, AWQ_KW_OUT,    AWQ_KW_OUT_DTYPE,
                                     AWQ_KW_KERNEL,     AWQ_KW_BLOCK_SIZE, AWQ_KW_STREAM};
static const awq_signature kDequantize = {"dequantize", kDequantizeKws, 9, 3, 3};

static const int kSmartKws[] = {AWQ_KW_QWEIGHT, AWQ_KW_QZEROS,    AWQ_KW_SCALES, AWQ_KW_GROUP_SIZE,
                                AWQ_KW_OUT,     AWQ_KW_OUT_DTYPE, AWQ_KW_STREAM};
static const awq_signature kSmart = {"smart_dequantize", kSmartKws, 7, 3, 3};

int awq_dequantize_job_prepare(PyObject *module, PyObject *const *slots, int smart,
                               awq_dequantize_job *job)
{
    awq_state *st = awq_get_state(module);
    awq_dequantize_call *c = &job->call;
    awq_view_opts opts;
    memset(job, 0, sizeof *job);
    c->group_size = slots[AWQ_KW_GROUP_SIZE];
    c->out_dtype = slots[AWQ_KW_OUT_DTYPE];
    c->kernel = smart ? Py_None : slots[AWQ_KW_KERNEL];
    c->block_size = smart ? Py_None : slots[AWQ_KW_BLOCK_SIZE];

    if (awq_stream_begin(st, slots[AWQ_KW_STREAM], slots[AWQ_KW_QWEIGHT], &opts) < 0)
        return -1;
    c->explicit_stream = opts.explicit_stream;
    static const int kArgKw[AWQ_NUM_ARGS] = {AWQ_KW_QWEIGHT, AWQ_KW_QZEROS, AWQ_KW_SCALES,
                                             AWQ_KW_OUT};
    for (int i = 0; i < AWQ_NUM_ARGS; i++) {
        PyObject *o = slots[kArgKw[i]];
        if (i == AWQ_ARG_OUT && o == Py_None)
            continue;
        if (awq_view_from_object(st, o, awq_arg_names[i], AWQ_NDIM_2D, &opts, &c->v[i]) < 0)
            return -1;
        c->have[i] = 1;
    }
    if (awq_validate_dequantize(c, &job->p, &job->cfg) < 0)
        return -1;
    if (awq_stream_of(&opts, &c->v[AWQ_ARG_QWEIGHT], job->p.device, &job->p.stream) < 0)
        return -1;

    if (c->have[AWQ_ARG_OUT]) {
        job->result = Py_NewRef(slots[AWQ_KW_OUT]);
        return 0;
    }
    const int64_t shape[2] = {job->p.K, job->p.N};
    job->result = awq_alloc_like(st, slots[AWQ_KW_QWEIGHT], &c->v[AWQ_ARG_QWEIGHT], 2, shape,
                                 job->p.out_dtype, &job->outv);
    if (job->result == NULL)
        return -1;
    job->have_outv = 1;
    job->p.out = job->outv.data;
    return 0;
}

PyObject *awq_dequantize_job_release(awq_dequantize_job *job, int keep)
{
    return awq_call_end(job->call.v, job->call.have, AWQ_NUM_ARGS,
                        job->have_outv ? &job->outv : NULL, &job->result, keep);
}

PyObject *awq_py_dequantize(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    PyObject *slots[AWQ_KW_COUNT];
    awq_dequantize_job job;
    if (awq_parse_call(awq_get_state(module), &kDequantize, args, nargs, kwnames, slots) < 0)
        return NULL;
    int ok = awq_dequantize_job_prepare(module, slots, 0, &job) == 0 &&
             awq_run_dequantize(&job.p, &job.cfg) == 0;
    return awq_dequantize_job_release(&job, ok);
}

PyObject *awq_py_smart_dequantize(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    PyObject *slots[AWQ_KW_COUNT];
    awq_dequantize_job job;
    if (awq_parse_call(awq_get_state(module), &kSmart, args, nargs, kwnames, slots) < 0)
        return NULL;
    int ok = awq_dequantize_job_prepare(module, slots, 1, &job) == 0;
    if (ok && awq_numel(&job.p) > 0) {
        int done = 0;
        ok = awq_cache_dequantize(module, &job.p, &job.cfg, &done) == 0 &&
             (done || awq_run_dequantize(&job.p, &job.cfg) == 0);
    }
    return awq_dequantize_job_release(&job, ok);
}
