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
#include "autotune/autotune.h"
#include "dlpack.h"

/* Types whose C exchange API we looked up (hit or miss), so the lookup
 * costs one pointer compare per call.  Type objects are kept alive. */
#define AWQ_API_CACHE 8

typedef struct {
    PyTypeObject *type;
    const DLPackExchangeAPI *api; /* NULL: the type has none */
    int has_is_neg;               /* its tensors can carry torch's negative bit */
    PyCFunction is_neg;           /* is_neg's C function when it is a plain C method, else NULL */
} awq_api_entry;

/* Keyword names of the entry points, interned once (args.c compares by
 * pointer first). */
enum {
    AWQ_KW_QWEIGHT,
    AWQ_KW_QZEROS,
    AWQ_KW_SCALES,
    AWQ_KW_GROUP_SIZE,
    AWQ_KW_OUT,
    AWQ_KW_OUT_DTYPE,
    AWQ_KW_KERNEL,
    AWQ_KW_BLOCK_SIZE,
    AWQ_KW_STREAM,
    AWQ_KW_X,
    AWQ_KW_BIAS,
    AWQ_KW_PATH,
    AWQ_KW_COUNT
};

/* What AWQLinear's call in C reads (module_call.c): the objects the torch
 * integration registers with _set_module_glue, in its argument order ... */
enum {
    AWQ_MC_MODULE_TYPE,      /* torch.nn.Module */
    AWQ_MC_MODULE_CALL,      /* nn.Module.__call__ as torch defines it */
    AWQ_MC_MODULE_CALL_IMPL, /* nn.Module._call_impl as torch defines it */
    AWQ_MC_GLOBAL_HOOKS,     /* the global forward (pre) and backward (pre) hook dicts */
    AWQ_MC_TRACING_STATE,    /* torch._C._get_tracing_state */
    AWQ_MC_DISPATCH_MODES,   /* torch._C._len_torch_dispatch_stack */
    AWQ_MC_GRAD_ENABLED,     /* torch.is_grad_enabled */
    AWQ_MC_FORWARD_AD,       /* torch.autograd.forward_ad (its _current_level) */
    AWQ_MC_TENSOR,           /* torch.Tensor */
    AWQ_MC_FORWARD_FN,       /* AWQLinear.forward */
    AWQ_MC_GLUE
};
/* ... and the attribute names it looks up, interned once.  The four hook
 * dicts of a module are consecutive. */
enum {
    AWQ_MC_COMPILED,
    AWQ_MC_FORWARD_PRE,
    AWQ_MC_FORWARD_HOOKS,
    AWQ_MC_BACKWARD_PRE,
    AWQ_MC_BACKWARD_HOOKS,
    AWQ_MC_FORWARD,
    AWQ_MC_SIBLINGS,
    AWQ_MC_PREFILL,
    AWQ_MC_MIN_ROWS,
    AWQ_MC_SHAPE,
    AWQ_MC_BUFFERS,
    AWQ_MC_CALL,
    AWQ_MC_CALL_IMPL,
    AWQ_MC_REQUIRES_GRAD,
    AWQ_MC_LEVEL,
    AWQ_MC_NAMES
};

/* Warnings about the cache file, each kind given once per module. */
enum { AWQ_WARN_LOAD, AWQ_WARN_SAVE, AWQ_WARN_CLEAR, AWQ_WARN_KINDS };

typedef struct {
    awq_api_entry api_cache[AWQ_API_CACHE];
    int api_cache_len;
    awq_api_entry api_scratch; /* answer for types past the cache, valid for one call */
    PyObject *allocator;   /* package-provided callable(like, device_type, device_id, shape, dtype) */
    PyObject *stream_hook; /* package-provided callable(array) -> current stream or None */
    PyObject *matmul_hook; /* package-provided callable(x, w, bias, y, stream): y = x @ w + bias */
    PyObject *time_matmul_hook; /* the same, timed: -> microseconds of one matmul (tuning) */
    PyObject *str_dlpack;  /* interned attribute names */
    PyObject *str_dlpack_device;
    PyObject *str_exchange_api;
    PyObject *str_is_neg;
    PyObject *str_max_version;
    PyObject *str_stream;
    PyObject *str_cuda_stream;
    PyObject *str_ptr;
    PyObject *kw[AWQ_KW_COUNT]; /* interned keyword names */
    PyObject *max_version;      /* (1, 0) */
    awq_table *table;           /* autotune cache */
    int table_loaded;
    int autotune;               /* AWQ_FAST_DEQUANT_AUTOTUNE, read at first use: 0 unread, 1 on, 2 off */
    PyObject *mc_glue[AWQ_MC_GLUE];   /* NULL until registered */
    PyObject *mc_names[AWQ_MC_NAMES];
    PyObject *mc_kwnames;             /* ("group_size",) */
    int warned[AWQ_WARN_KINDS];
    char cache_file[4096];
    /* Device part of each autotune key, built once per device: a cache hit
     * only copies it.  [0] is the CPU, [1 + d] CUDA device d. */
    char device_keys[AWQ_MAX_DEVICES + 1][AWQ_TUNE_DEVICE_LEN];
    unsigned long long hits, misses, tunings;
} awq_state;

static inline awq_state *awq_get_state(PyObject *module)
{
    return (awq_state *)PyModule_GetState(module);
}

#endif /* AWQ_PYAWQ_H */
