/*
 * pyawq.h -- the one header every Python-facing C file includes first.
 *
 * Defines PY_SSIZE_T_CLEAN before <Python.h>, pins the NumPy C API to the
 * oldest release the wheel supports (built against NumPy 2, runs on 1.25+),
 * and declares the module state.  module.c defines AWQ_MODULE_C so that it
 * alone owns the NumPy API table; every other file sees NO_IMPORT_ARRAY.
 */
#ifndef AWQ_PYAWQ_H
#define AWQ_PYAWQ_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define NPY_NO_DEPRECATED_API NPY_1_25_API_VERSION
#define NPY_TARGET_VERSION NPY_1_25_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL awq_ARRAY_API
#ifndef AWQ_MODULE_C
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include "awq.h"
#include "autotune.h"
#include "dlpack.h"

/* Types whose C exchange API we looked up (hit or miss), so the lookup
 * costs one pointer compare per call.  Type objects are kept alive. */
#define AWQ_API_CACHE 8

typedef struct {
    PyTypeObject *type;
    const DLPackExchangeAPI *api; /* NULL: the type has none */
} awq_api_entry;

typedef struct {
    awq_api_entry api_cache[AWQ_API_CACHE];
    int api_cache_len;
    PyObject *allocator;   /* package-provided callable(like, device_type, device_id, K, N, dtype) */
    PyObject *stream_hook; /* package-provided callable(array) -> current stream or None */
    PyObject *str_auto;    /* "auto", the default kernel */
    PyObject *str_dlpack; /* interned attribute names */
    PyObject *str_dlpack_device;
    PyObject *str_max_version;
    PyObject *str_stream;
    PyObject *str_cuda_stream;
    PyObject *str_ptr;
    PyObject *max_version; /* (1, 0) */
    awq_table *table;      /* autotune cache */
    int table_loaded;
    int autotune;          /* AWQ_FAST_DEQUANT_AUTOTUNE, read at first use: 0 unread, 1 on, 2 off */
    char cache_file[4096];
    unsigned long long hits, misses, tunings;
} awq_state;

static inline awq_state *awq_get_state(PyObject *module)
{
    return (awq_state *)PyModule_GetState(module);
}

/* dequantize.c */
PyObject *awq_py_dequantize(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames);
PyObject *awq_py_smart_dequantize(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames);
PyObject *awq_py_launch_config(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* Run a validated problem on its backend (GIL released on the CPU);
 * 0, or -1 with an exception set. */
int awq_run(const awq_problem *p, const awq_config *c);
int awq_raise_status(awq_status s, int detail, const awq_problem *p);

/* cache.c */
PyObject *awq_py_cache_path(PyObject *module, PyObject *unused);
PyObject *awq_py_cache_entries(PyObject *module, PyObject *unused);
PyObject *awq_py_cache_stats(PyObject *module, PyObject *unused);
PyObject *awq_py_clear_cache(PyObject *module, PyObject *unused);
PyObject *awq_py_cache_reload(PyObject *module, PyObject *unused);
PyObject *awq_py_table_test(PyObject *module, PyObject *args);
int awq_cache_lookup_or_tune(PyObject *module, awq_problem *p, awq_config *c, int *detail);

#endif /* AWQ_PYAWQ_H */
