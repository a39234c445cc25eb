/*
 * dev.c -- development entry points, kept apart from the public surface in
 * the namespace awq_fast_dequant._C._dev (a module object built in the
 * module's exec function).  Tests, benchmarks and sweeps use them; the hot
 * path never passes through here.
 *
 *   launch_config(qweight, qzeros, scales, out, kernel, block_size, rows)
 *       dequantize with v4's rows per thread chosen (not a public knob)
 *   empty_launch(device, stream)   an empty kernel, launched the way
 *       dequantize launches: the benchmark's host-overhead floor
 *   linear_config(x, qweight, qzeros, scales, bias, out, config)
 *       linear with one given configuration (a dict like the cache's
 *       entries: kernel, block_size, rows, split, threads, chunk)
 *   linear_candidates(x, qweight, qzeros, scales)
 *       the configurations the tuner would time for that call, as dicts
 *   launch_path()                  "driver", "runtime" or "none"
 *   cache_reload()                 forget the autotune table; re-read the file
 *   table_test(ops)                operations on a fresh C hash table
 */
#include "dev.h"

#include <string.h>

#include "args.h"
#include "cache.h"
#include "cuda/cuda.h"
#include "cpu/cpu.h"
#include "dequantize.h"
#include "linear.h"
#include "run.h"

static PyObject *dev_launch_config(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "launch_config(qweight, qzeros, scales, out, kernel, block_size, rows)");
        return NULL;
    }
    long long rows;
    if (awq_parse_int(args[6], "rows", &rows) < 0)
        return NULL;
    if (!awq_rows_valid(rows)) {
        PyErr_Format(PyExc_ValueError, "rows must be a power of two in [1, %d]", AWQ_MAX_ROWS);
        return NULL;
    }
    PyObject *slots[AWQ_KW_COUNT];
    for (int i = 0; i < AWQ_KW_COUNT; i++)
        slots[i] = Py_None;
    slots[AWQ_KW_QWEIGHT] = args[0];
    slots[AWQ_KW_QZEROS] = args[1];
    slots[AWQ_KW_SCALES] = args[2];
    slots[AWQ_KW_OUT] = args[3];
    slots[AWQ_KW_KERNEL] = args[4];
    slots[AWQ_KW_BLOCK_SIZE] = args[5];
    awq_dequantize_job job;
    int ok = awq_dequantize_job_prepare(module, slots, 0, &job) == 0;
    if (ok) {
        job.cfg.rows = (int)rows;
        ok = awq_run_dequantize(&job.p, &job.cfg) == 0;
    }
    return awq_dequantize_job_release(&job, ok);
}

/* slots for a linear call of the development entries (no stream, path auto) */
static void linear_slots(PyObject *const *args, int with_outputs, PyObject **slots)
{
    for (int i = 0; i < AWQ_KW_COUNT; i++)
        slots[i] = Py_None;
    slots[AWQ_KW_X] = args[0];
    slots[AWQ_KW_QWEIGHT] = args[1];
    slots[AWQ_KW_QZEROS] = args[2];
    slots[AWQ_KW_SCALES] = args[3];
    if (with_outputs) {
        slots[AWQ_KW_BIAS] = args[4];
        slots[AWQ_KW_OUT] = args[5];
    }
}

/* One integer field of a configuration dict (0 when absent). */
static int config_field(PyObject *d, const char *key, long long *v)
{
    *v = 0;
    PyObject *o = PyDict_GetItemString(d, key); /* borrowed */
    return o == NULL ? 0 : awq_parse_int(o, key, v);
}

static PyObject *dev_linear_config(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyDict_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "linear_config(x, qweight, qzeros, scales, bias, out, config: dict)");
        return NULL;
    }
    PyObject *name = PyDict_GetItemString(args[6], "kernel");
    const char *s = name != NULL && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
    awq_kernel kernel;
    if (s == NULL || awq_kernel_parse(s, &kernel) < 0 ||
        !(kernel == AWQ_KERNEL_CPU || kernel >= AWQ_KERNEL_SIMT)) {
        PyErr_SetString(PyExc_ValueError, "config['kernel'] must be 'cpu', 'amx', 'simt', 'mma', "
                                          "'gemv', 'wgmma' or 'dequant'");
        return NULL;
    }
    awq_config cfg = {.kernel = (int)kernel};
    long long bs, rows, split, threads, chunk;
    if (config_field(args[6], "block_size", &bs) < 0 || config_field(args[6], "rows", &rows) < 0 ||
        config_field(args[6], "split", &split) < 0 || config_field(args[6], "threads", &threads) < 0 ||
        config_field(args[6], "chunk", &chunk) < 0)
        return NULL;
    cfg.block_size = (int)bs;
    cfg.rows = (int)rows;
    cfg.split = (int)split;
    cfg.threads = (int)threads;
    cfg.chunk = chunk;
    PyObject *slots[AWQ_KW_COUNT];
    linear_slots(args, 1, slots);
    awq_linear_job job;
    int ok = awq_linear_job_prepare(module, slots, &job) == 0;
    if (ok && job.p.M > 0 && job.p.N > 0)
        ok = (kernel == AWQ_KERNEL_DEQUANT ? awq_linear_run_dequant_path(&job)
                                           : awq_run_linear(&job.p, &cfg)) == 0;
    return awq_linear_job_release(&job, ok);
}

static PyObject *dev_linear_candidates(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "linear_candidates(x, qweight, qzeros, scales)");
        return NULL;
    }
    PyObject *slots[AWQ_KW_COUNT];
    linear_slots(args, 0, slots);
    awq_linear_job job;
    PyObject *list = NULL;
    if (awq_linear_job_prepare(module, slots, &job) == 0) {
        awq_config cands[64];
        int n = job.p.device >= 0 ? awq_cuda_linear_candidates(&job.p, cands, 64)
                                  : awq_cpu_linear_candidates(&job.p, cands, 64);
        list = PyList_New(0);
        for (int i = 0; list != NULL && i < n; i++) {
            const awq_config *c = &cands[i];
            PyObject *e = Py_BuildValue("{s:s,s:i,s:i,s:i,s:i,s:L}", "kernel",
                                        awq_kernel_name(c->kernel), "block_size", c->block_size,
                                        "rows", c->rows, "split", c->split, "threads", c->threads,
                                        "chunk", (long long)c->chunk);
            if (e == NULL || PyList_Append(list, e) < 0)
                Py_CLEAR(list);
            Py_XDECREF(e);
        }
    }
    awq_linear_job_release(&job, 0);
    return list;
}

static PyObject *dev_empty_launch(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "empty_launch(device, stream) takes 2 arguments");
        return NULL;
    }
    long long device;
    if (awq_parse_int(args[0], "device", &device) < 0)
        return NULL;
    if (device < 0 || device > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "device must be a CUDA device index, got %lld", device);
        return NULL;
    }
    awq_view_opts opts;
    if (awq_parse_stream(awq_get_state(module), args[1], &opts) < 0)
        return NULL;
    int detail = 0;
    awq_status s = awq_cuda_empty_launch((int)device, (void *)opts.handle, &detail);
    if (awq_raise_status(s, detail, (int)device) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *dev_launch_path(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyUnicode_FromString(awq_cuda_launch_path());
}

static PyObject *dev_cache_reload(PyObject *module, PyObject *unused)
{
    (void)unused;
    awq_cache_reset(awq_get_state(module));
    Py_RETURN_NONE;
}

/* Test-only: run a list of operations on a fresh table.
 *   ("put", device, K, N, G, block_size) -> put's return code
 *   ("get", device, K, N, G)             -> block_size, or None on a miss
 *   ("size",)                            -> entries
 * Returns the list of results. */
static PyObject *dev_table_test(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *ops, *results = NULL;
    if (!PyArg_ParseTuple(args, "O!:table_test", &PyList_Type, &ops))
        return NULL;
    awq_table *t = awq_table_new();
    if (t == NULL)
        return PyErr_NoMemory();
    results = PyList_New(0);
    if (results == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ops); i++) {
        PyObject *op = PyList_GET_ITEM(ops, i), *r = NULL;
        const char *verb, *dev = "";
        long long K = 0, N = 0, G = 1;
        int bs = 0;
        if (!PyTuple_Check(op) || PyTuple_GET_SIZE(op) < 1) {
            PyErr_SetString(PyExc_TypeError, "each operation is a tuple");
            goto fail;
        }
        if (!PyArg_ParseTuple(op, "s|sLLLi:table_test op", &verb, &dev, &K, &N, &G, &bs))
            goto fail;
        awq_tune_key k;
        awq_tune_value v;
        memset(&v, 0, sizeof v);
        if (strcmp(verb, "size") == 0) {
            r = PyLong_FromSize_t(awq_table_size(t));
        } else if (awq_tune_key_init(&k, dev, 1, K, N, G, AWQ_F16, AWQ_F16) < 0) {
            PyErr_Format(PyExc_ValueError, "invalid key in operation %zd", i);
            goto fail;
        } else if (strcmp(verb, "put") == 0) {
            v.config.kernel = AWQ_KERNEL_V4;
            v.config.block_size = bs;
            v.us = 1.0f;
            r = PyLong_FromLong(awq_table_put(t, &k, &v));
        } else if (strcmp(verb, "get") == 0) {
            r = awq_table_get(t, &k, &v) ? PyLong_FromLong(v.config.block_size)
                                         : Py_NewRef(Py_None);
        } else {
            PyErr_Format(PyExc_ValueError, "unknown operation %s", verb);
            goto fail;
        }
        if (r == NULL || PyList_Append(results, r) < 0) {
            Py_XDECREF(r);
            goto fail;
        }
        Py_DECREF(r);
    }
    awq_table_free(t);
    return results;
fail:
    Py_XDECREF(results);
    awq_table_free(t);
    return NULL;
}

static PyMethodDef dev_methods[] = {
    {"launch_config", (PyCFunction)(void (*)(void))dev_launch_config, METH_FASTCALL,
     "launch_config(qweight, qzeros, scales, out, kernel, block_size, rows): dequantize into "
     "out with v4's rows per thread chosen."},
    {"empty_launch", (PyCFunction)(void (*)(void))dev_empty_launch, METH_FASTCALL,
     "empty_launch(device, stream): an empty kernel launched the way dequantize launches."},
    {"linear_config", (PyCFunction)(void (*)(void))dev_linear_config, METH_FASTCALL,
     "linear_config(x, qweight, qzeros, scales, bias, out, config): linear with one given "
     "configuration (kernel, block_size, rows, split, threads, chunk)."},
    {"linear_candidates", (PyCFunction)(void (*)(void))dev_linear_candidates, METH_FASTCALL,
     "linear_candidates(x, qweight, qzeros, scales): the configurations the tuner times."},
    {"launch_path", dev_launch_path, METH_NOARGS,
     "launch_path(): how kernels are launched: 'driver' (cuLaunchKernel), 'runtime' "
     "(cudaLaunchKernel) or 'none' (CPU-only build)."},
    {"cache_reload", dev_cache_reload, METH_NOARGS,
     "cache_reload(): forget the autotune table in memory; the next use reads the file."},
    {"table_test", dev_table_test, METH_VARARGS,
     "table_test(ops): run ('put'|'get'|'size', ...) operations on a fresh C hash table."},
    {NULL, NULL, 0, NULL},
};

int awq_dev_add(PyObject *module)
{
    PyObject *dev = PyModule_New("awq_fast_dequant._C._dev");
    if (dev == NULL)
        return -1;
    PyObject *modname = PyUnicode_FromString("awq_fast_dequant._C._dev");
    int r = modname == NULL ? -1 : 0;
    /* Bound to the main module: the functions read its state. */
    for (PyMethodDef *m = dev_methods; r == 0 && m->ml_name != NULL; m++) {
        PyObject *f = PyCFunction_NewEx(m, module, modname);
        r = f == NULL ? -1 : PyModule_AddObjectRef(dev, m->ml_name, f);
        Py_XDECREF(f);
    }
    if (r == 0)
        r = PyModule_AddStringConstant(dev, "__doc__",
                                       "Development entry points of awq_fast_dequant._C: "
                                       "not part of the public API.");
    if (r == 0)
        r = PyModule_AddObjectRef(module, "_dev", dev);
    Py_XDECREF(modname);
    Py_DECREF(dev);
    return r;
}
