/*
 * module.c -- awq_fast_dequant._C: multi-phase module initialisation,
 * module state and the method table.  The entry points live in
 * dequantize.c and cache.c, the development ones in dev.c.
 */
#define AWQ_MODULE_C
#include "pyawq.h"

#include "cache.h"
#include "cpu/cpu.h"
#include "cuda/cuda.h"
#include "dequantize.h"
#include "dev.h"
#include "linear.h"
#include "module_call.h"
#include "prepared.h"

#ifndef AWQ_VERSION
#define AWQ_VERSION "0+unknown"
#endif

static PyObject *py_cuda_available(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    int detail = 0;
    return PyBool_FromLong(awq_cuda_compiled() && awq_cuda_device_count(&detail) > 0);
}

static PyObject *py_cuda_device_count(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    int detail = 0;
    return PyLong_FromLong(awq_cuda_compiled() ? awq_cuda_device_count(&detail) : 0);
}

static PyObject *py_build_info(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    PyObject *archs = NULL, *res = NULL;
    const char *a = awq_cuda_archs();
    archs = PyList_New(0);
    if (archs == NULL)
        return NULL;
    /* "80;90" -> [80, 90] */
    while (a != NULL && *a) {
        char *end = NULL;
        long v = strtol(a, &end, 10);
        if (end == a)
            break;
        PyObject *n = PyLong_FromLong(v);
        if (n == NULL || PyList_Append(archs, n) < 0) {
            Py_XDECREF(n);
            goto done;
        }
        Py_DECREF(n);
        a = *end == ';' ? end + 1 : end;
    }
    res = Py_BuildValue(
        "{s:s,s:s,s:O,s:i,s:O,s:O,s:i,s:s,s:O,s:s,s:{s:i,s:i}}", "version", AWQ_VERSION, "compiler",
#if defined(__clang__)
        "clang " __clang_version__,
#elif defined(__GNUC__)
        "gcc " __VERSION__,
#else
        "unknown",
#endif
        "openmp", awq_cpu_has_openmp() ? Py_True : Py_False, "cpu_max_threads",
        awq_cpu_max_threads(), "cuda", awq_cuda_compiled() ? Py_True : Py_False, "cuda_archs",
        archs, "cuda_runtime_version", awq_cuda_runtime_version(), "cpu_simd", awq_cpu_simd(),
        "cpu_amx", awq_cpu_amx_ready() ? Py_True : Py_False, "numpy_api",
        NPY_FEATURE_VERSION_STRING, "kernel_generations", "cuda", AWQ_CUDA_KERNELS_GEN, "cpu",
        AWQ_CPU_KERNELS_GEN);
done:
    Py_DECREF(archs);
    return res;
}

/* The package registers its framework glue (awq_fast_dequant/_frameworks.py):
 * the callable that allocates outputs for frameworks without the DLPack C
 * exchange API, the one that names the current stream of those frameworks
 * (CuPy), and the framework's matmul for linear's dequantize path (plain and
 * timed). */
static PyObject *py_set_hooks(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    awq_state *st = awq_get_state(module);
    int ok = nargs == 4;
    for (Py_ssize_t i = 0; ok && i < nargs; i++)
        ok = PyCallable_Check(args[i]);
    if (!ok) {
        PyErr_SetString(PyExc_TypeError,
                        "_set_hooks(allocator, stream_hook, matmul, time_matmul) takes four "
                        "callables");
        return NULL;
    }
    Py_XSETREF(st->allocator, Py_NewRef(args[0]));
    Py_XSETREF(st->stream_hook, Py_NewRef(args[1]));
    Py_XSETREF(st->matmul_hook, Py_NewRef(args[2]));
    Py_XSETREF(st->time_matmul_hook, Py_NewRef(args[3]));
    Py_RETURN_NONE;
}

#define DEQUANTIZE_DOC \
    "dequantize(qweight, qzeros, scales, *, group_size=None, out=None, out_dtype=None,\n" \
    "           kernel='auto', block_size=None, stream=None)\n--\n\n" \
    "Dequantize AWQ weights: out[k, n] = (q - z) * scale, rounded once.\n\n" \
    "qweight: int32/uint32 [K, N/8], eight 4-bit weights per element.\n" \
    "qzeros: int32/uint32 [K/G, N/8], packed like qweight.\n" \
    "scales: float16/bfloat16/float32 [K/G, N].\n" \
    "group_size: G; default K / scales.shape[0]; -1 means G = K.\n" \
    "out: optional [K, N] destination (same device, the output dtype).\n" \
    "out_dtype: float16/bfloat16/float32 (name, NumPy or torch dtype); default: scales' dtype.\n" \
    "kernel: 'auto' (v4 on CUDA, the CPU backend on the host), 'v1' (one thread per\n" \
    "    output element), 'v2' (one thread per packed word, fixed 256-thread blocks),\n" \
    "    'v3' (v2 with a runtime block size), 'v4' (the production kernel: row tiles\n" \
    "    inside a group, 16-byte accesses) or 'cpu'; all give the same bits.\n" \
    "block_size: threads per block for v3/v4 (a multiple of 32, at most 1024).\n" \
    "stream: CUDA stream (int handle, torch.cuda.Stream, cupy Stream); default: the\n" \
    "    framework's current stream of the tensors' device, else the legacy default.\n\n" \
    "Returns out, or a new [K, N] array in the framework of qweight."

#define LINEAR_DOC \
    "linear(x, qweight, qzeros, scales, bias=None, *, group_size=None, out=None,\n" \
    "       stream=None, path='auto')\n--\n\n" \
    "The W4A16 linear layer: y = x @ W + bias, W = dequantize(qweight, qzeros, scales,\n" \
    "out_dtype=x.dtype) ([K, N]); products and sums in float32, one rounding.\n\n" \
    "x: [..., K] float16/bfloat16/float32; scales and bias ([N] or None) of x's dtype.\n" \
    "out: optional [..., N] destination of x's dtype and leading dimensions.\n" \
    "path: 'auto' (tuned per layer and M bucket), 'fused' (read the 4-bit weights once,\n" \
    "    never materialize W) or 'dequant' (dequantize into a buffer of x's framework,\n" \
    "    then its matmul; that path's accumulation is the framework's).\n" \
    "stream: as for dequantize.\n\n" \
    "Returns out, or a new [..., N] array in x's framework, on x's device and stream."

#define SMART_DOC \
    "smart_dequantize(qweight, qzeros, scales, *, group_size=None, out=None, out_dtype=None,\n" \
    "                 stream=None)\n--\n\n" \
    "Like dequantize, with the launch tuned once per layer shape.\n\n" \
    "The first call for a (device, K, N, G, dtypes) key times every candidate\n" \
    "configuration and stores the fastest in a C hash table persisted to cache_path();\n" \
    "later calls cost one lookup.  AWQ_FAST_DEQUANT_AUTOTUNE=0 disables tuning."

static PyMethodDef awq_methods[] = {
    {"dequantize", (PyCFunction)(void (*)(void))awq_py_dequantize,
     METH_FASTCALL | METH_KEYWORDS, DEQUANTIZE_DOC},
    {"smart_dequantize", (PyCFunction)(void (*)(void))awq_py_smart_dequantize,
     METH_FASTCALL | METH_KEYWORDS, SMART_DOC},
    {"linear", (PyCFunction)(void (*)(void))awq_py_linear, METH_FASTCALL | METH_KEYWORDS,
     LINEAR_DOC},
    {"cuda_available", py_cuda_available, METH_NOARGS,
     "True when the CUDA backend is compiled in and a CUDA device is usable."},
    {"cuda_device_count", py_cuda_device_count, METH_NOARGS, "Usable CUDA devices (0 if none)."},
    {"build_info", py_build_info, METH_NOARGS, "What was compiled in."},
    {"_set_hooks", (PyCFunction)(void (*)(void))py_set_hooks, METH_FASTCALL,
     "Register the framework glue (allocator, stream hook, matmul, timed matmul)."},
    {"_set_module_glue", (PyCFunction)(void (*)(void))awq_py_set_module_glue, METH_FASTCALL,
     "Register what AWQLinear's call in C checks (awq_fast_dequant.torch)."},
    {"_module_call", (PyCFunction)(void (*)(void))awq_py_module_call, METH_FASTCALL,
     "_module_call(layer, args, kwargs): AWQLinear's eager call, or NotImplemented."},
    {"_linear_prepared", (PyCFunction)(void (*)(void))awq_py_linear_prepared, METH_FASTCALL,
     "_linear_prepared(x, words, operands, bias, group_size, out): y = x @ W + bias on the\n"
     "prepared layout (awq_fast_dequant.torch.prepare_prefill), compute capability 9.0."},
    {"_prepared_supported", awq_py_prepared_supported, METH_O,
     "_prepared_supported(device): whether this build runs the prepared layout there."},
    {"cache_path", awq_py_cache_path, METH_NOARGS, "Path of the autotune cache file."},
    {"cache_entries", awq_py_cache_entries, METH_NOARGS, "Entries of the autotune cache."},
    {"cache_stats", awq_py_cache_stats, METH_NOARGS, "Hits, misses and tunings so far."},
    {"clear_cache", awq_py_clear_cache, METH_NOARGS, "Empty the autotune cache and its file."},
    {NULL, NULL, 0, NULL},
};

static int intern(PyObject **slot, const char *s)
{
    *slot = PyUnicode_InternFromString(s);
    return *slot == NULL ? -1 : 0;
}

static int awq_exec(PyObject *module)
{
    awq_state *st = awq_get_state(module);
    if (PyArray_ImportNumPyAPI() < 0)
        return -1;
    static const char *const kKwNames[AWQ_KW_COUNT] = {
        [AWQ_KW_QWEIGHT] = "qweight",       [AWQ_KW_QZEROS] = "qzeros",
        [AWQ_KW_SCALES] = "scales",         [AWQ_KW_GROUP_SIZE] = "group_size",
        [AWQ_KW_OUT] = "out",               [AWQ_KW_OUT_DTYPE] = "out_dtype",
        [AWQ_KW_KERNEL] = "kernel",         [AWQ_KW_BLOCK_SIZE] = "block_size",
        [AWQ_KW_STREAM] = "stream",         [AWQ_KW_X] = "x",
        [AWQ_KW_BIAS] = "bias",             [AWQ_KW_PATH] = "path"};
    if (intern(&st->str_dlpack, "__dlpack__") < 0 ||
        intern(&st->str_dlpack_device, "__dlpack_device__") < 0 ||
        intern(&st->str_exchange_api, "__dlpack_c_exchange_api__") < 0 ||
        intern(&st->str_is_neg, "is_neg") < 0 ||
        intern(&st->str_max_version, "max_version") < 0 || intern(&st->str_stream, "stream") < 0 ||
        intern(&st->str_cuda_stream, "cuda_stream") < 0 || intern(&st->str_ptr, "ptr") < 0)
        return -1;
    for (int i = 0; i < AWQ_KW_COUNT; i++)
        if (intern(&st->kw[i], kKwNames[i]) < 0)
            return -1;
    if (awq_module_call_init(st) < 0)
        return -1;
    st->max_version = Py_BuildValue("(ii)", AWQ_DLPACK_MAJOR, AWQ_DLPACK_MINOR);
    if (st->max_version == NULL)
        return -1;
    st->table = awq_table_new();
    if (st->table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (PyModule_AddStringConstant(module, "__version__", AWQ_VERSION) < 0)
        return -1;
    return awq_dev_add(module);
}

static int awq_traverse(PyObject *module, visitproc visit, void *arg)
{
    awq_state *st = awq_get_state(module);
    if (st == NULL)
        return 0;
    Py_VISIT(st->allocator);
    Py_VISIT(st->stream_hook);
    Py_VISIT(st->matmul_hook);
    Py_VISIT(st->time_matmul_hook);
    for (int i = 0; i < st->api_cache_len; i++)
        Py_VISIT(st->api_cache[i].type);
    return awq_module_call_traverse(st, visit, arg);
}

static int awq_clear(PyObject *module)
{
    awq_state *st = awq_get_state(module);
    if (st == NULL)
        return 0;
    Py_CLEAR(st->allocator);
    Py_CLEAR(st->stream_hook);
    Py_CLEAR(st->matmul_hook);
    Py_CLEAR(st->time_matmul_hook);
    for (int i = 0; i < st->api_cache_len; i++)
        Py_CLEAR(st->api_cache[i].type);
    st->api_cache_len = 0;
    awq_module_call_clear(st);
    Py_CLEAR(st->str_dlpack);
    Py_CLEAR(st->str_dlpack_device);
    Py_CLEAR(st->str_exchange_api);
    Py_CLEAR(st->str_is_neg);
    for (int i = 0; i < AWQ_KW_COUNT; i++)
        Py_CLEAR(st->kw[i]);
    Py_CLEAR(st->str_max_version);
    Py_CLEAR(st->str_stream);
    Py_CLEAR(st->str_cuda_stream);
    Py_CLEAR(st->str_ptr);
    Py_CLEAR(st->max_version);
    return 0;
}

static void awq_free(void *module)
{
    awq_state *st = awq_get_state((PyObject *)module);
    awq_clear((PyObject *)module);
    if (st != NULL && st->table != NULL) {
        awq_table_free(st->table);
        st->table = NULL;
    }
}

static PyModuleDef_Slot awq_slots[] = {
    {Py_mod_exec, (void *)awq_exec},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef awq_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "awq_fast_dequant._C",
    .m_doc = "C core of awq_fast_dequant: AWQ 4-bit dequantization on CPU and CUDA.",
    .m_size = sizeof(awq_state),
    .m_methods = awq_methods,
    .m_slots = awq_slots,
    .m_traverse = awq_traverse,
    .m_clear = awq_clear,
    .m_free = awq_free,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&awq_module); }
