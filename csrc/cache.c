/*
 * cache.c -- smart_dequantize's lookup-or-tune and the Python face of the
 * autotune cache (cache.h; autotune/ holds the table, the file and the
 * tuning loop).
 *
 * Hot path on a hit: one hash lookup under the table's mutex, then the
 * launch.  No Python object and no file access.  The file is read lazily
 * on first use and written after each new tuning, with the GIL released.
 */
#include "cache.h"

#include "cpu/cpu.h"
#include "cuda/cuda.h"
#include "run.h"
#include "args.h"

#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#define CACHE_FILE_NAME "autotune.txt"

/* ---- where the file lives ---- */

static int resolve_path(char *buf, size_t n)
{
    const char *dir = getenv("AWQ_FAST_DEQUANT_CACHE_DIR");
    int r;
    if (dir != NULL && *dir) {
        r = snprintf(buf, n, "%s/%s", dir, CACHE_FILE_NAME);
    } else if ((dir = getenv("XDG_CACHE_HOME")) != NULL && *dir) {
        r = snprintf(buf, n, "%s/awq_fast_dequant/%s", dir, CACHE_FILE_NAME);
    } else {
        const char *home = getenv("HOME");
        r = snprintf(buf, n, "%s/.cache/awq_fast_dequant/%s", home && *home ? home : ".",
                     CACHE_FILE_NAME);
    }
    return r > 0 && (size_t)r < n ? 0 : -1;
}

/* Warnings go through Python's warnings module, each kind once per module
 * (state->warned).  A warning filter that turns them into errors is
 * ignored: the cache must never fail a call. */
static void warn_once(awq_state *st, int kind, int status, const char *msg)
{
    if (status == 0 || msg[0] == '\0' || st->warned[kind])
        return;
    st->warned[kind] = 1;
    if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "awq_fast_dequant autotune cache: %s", msg) < 0)
        PyErr_Clear();
}

/* AWQ_FAST_DEQUANT_AUTOTUNE=0 (or false, off), read once per load of the table. */
static int autotune_disabled(awq_state *st)
{
    if (st->autotune == 0) {
        const char *v = getenv("AWQ_FAST_DEQUANT_AUTOTUNE");
        int off = v != NULL &&
                  (strcmp(v, "0") == 0 || strcmp(v, "false") == 0 || strcmp(v, "off") == 0);
        st->autotune = off ? 2 : 1;
    }
    return st->autotune == 2;
}

/* Load the file once (first use after import or reload). */
static void ensure_loaded(awq_state *st)
{
    if (st->table_loaded)
        return;
    char warn[1024] = "";
    int status = 0;
    st->table_loaded = 1;
    if (resolve_path(st->cache_file, sizeof st->cache_file) < 0) {
        st->cache_file[0] = '\0';
        warn_once(st, AWQ_WARN_LOAD, 1, "cache path too long; keeping the cache in memory only");
        return;
    }
    Py_BEGIN_ALLOW_THREADS
    status = awq_table_load(st->table, st->cache_file, warn, sizeof warn);
    Py_END_ALLOW_THREADS
    warn_once(st, AWQ_WARN_LOAD, status, warn);
}

/* ---- keys ---- */

/* Device part of the key, built once per device (state->device_keys): the
 * hot path of a cache hit only copies it.  Called with the GIL held, which
 * guards the array.  Devices past it get theirs built in `scratch` on every
 * call. */
static const char *device_key(awq_state *st, int device, char *scratch, int *detail)
{
    int slot = device + 1;
    char *key = slot >= 0 && slot <= AWQ_MAX_DEVICES ? st->device_keys[slot] : scratch;
    if (key == scratch)
        key[0] = '\0';
    if (key[0] != '\0')
        return key;
    if (device < 0) {
        struct utsname u;
        const char *m = uname(&u) == 0 ? u.machine : "unknown";
        /* "+amx" where linear runs on the tiles: picks tuned with
         * them are another host's */
        snprintf(key, AWQ_TUNE_DEVICE_LEN, "cpu %s %s%s %dt", m, awq_cpu_simd(),
                 awq_cpu_amx_ready() ? "+amx" : "", awq_cpu_max_threads());
        return key;
    }
    char name[80];
    int major = 0, minor = 0;
    awq_status s = awq_cuda_device_identity(device, name, sizeof name, &major, &minor, detail);
    if (s != AWQ_OK) {
        awq_raise_status(s, *detail, device);
        return NULL;
    }
    /* tabs would break the file format; names never have them, but be sure */
    for (char *c = name; *c; c++)
        if ((unsigned char)*c < 0x20)
            *c = ' ';
    snprintf(key, AWQ_TUNE_DEVICE_LEN, "%s sm_%d%d", name, major, minor);
    return key;
}

/* The start of every lookup: the file loaded, the device part of the key
 * (NULL with an exception set when the device cannot be asked) and the
 * generation of that backend's kernels. */
static const char *lookup_begin(awq_state *st, int device, char *scratch, int *gen, int *detail)
{
    ensure_loaded(st);
    *gen = device >= 0 ? AWQ_CUDA_KERNELS_GEN : AWQ_CPU_KERNELS_GEN;
    return device_key(st, device, scratch, detail);
}

/* ---- tuning ---- */

/* The tuner's clocks on CUDA: one warm-up launch, then a handful of timed
 * ones, each after the cold-L2 flush; the median counts. */
typedef struct {
    const awq_problem *p;
    const awq_linear_problem *lp;
    const awq_cuda_flush *flush;
} cuda_timing;

static awq_status cuda_time_us(const awq_config *c, float *us, int *detail, void *ctx)
{
    const cuda_timing *t = ctx;
    float ms = 0.0f;
    awq_status s = t->p != NULL ? awq_cuda_time(t->p, c, t->flush, 1, 5, &ms, detail)
                                : awq_cuda_linear_time(t->lp, c, t->flush, 1, 5, &ms, detail);
    *us = ms * 1000.0f;
    return s;
}

/* Times candidates with the GIL released: CUDA with a cold-L2 flush, the
 * host with its clock.  Exactly one of p and lp is given. */
static awq_status tune_backend(const awq_problem *p, const awq_linear_problem *lp, int device,
                               const awq_config *cands, int n, awq_tune_value *best, int *detail)
{
    awq_status s = AWQ_OK;
    Py_BEGIN_ALLOW_THREADS
    if (device >= 0) {
        awq_cuda_flush flush;
        s = awq_cuda_flush_create(device, &flush, detail);
        if (s == AWQ_OK) {
            cuda_timing t = {p, lp, &flush};
            s = awq_tune(cands, n, cuda_time_us, &t, best, detail);
            awq_cuda_flush_destroy(&flush);
        }
    } else {
        awq_cpu_timing t = {p, lp, 0, 0, 0.0};
        s = awq_tune(cands, n, awq_cpu_time, &t, best, detail);
    }
    Py_END_ALLOW_THREADS
    return s;
}

/* 1 when the stream is capturing a CUDA graph (never time there), 0 when
 * not, -1 with an exception set. */
static int capturing(int device, void *stream)
{
    if (device < 0)
        return 0;
    int cap = 0, detail = 0;
    awq_status s = awq_cuda_stream_capturing(device, stream, &cap, &detail);
    if (s != AWQ_OK)
        return awq_raise_status(s, detail, device);
    return cap;
}

/* The new entry into the table, and the table into its file. */
static void remember(awq_state *st, const awq_tune_key *key, const awq_tune_value *val)
{
    st->tunings++;
    if (awq_table_put(st->table, key, val) == -1)
        return; /* out of memory for the entry: the call is still right */
    if (st->cache_file[0] != '\0') {
        char warn[1024] = "";
        int status;
        Py_BEGIN_ALLOW_THREADS
        status = awq_table_save(st->table, st->cache_file, warn, sizeof warn);
        Py_END_ALLOW_THREADS
        warn_once(st, AWQ_WARN_SAVE, status, warn);
    }
}

#define MAX_CANDIDATES 64

int awq_cache_dequantize(PyObject *module, const awq_problem *p, awq_config *cfg, int *done)
{
    awq_state *st = awq_get_state(module);
    awq_tune_key key;
    awq_tune_value val;
    int detail = 0;

    *done = 0;
    if (autotune_disabled(st))
        return 0;
    char dev_scratch[AWQ_TUNE_DEVICE_LEN];
    int gen;
    const char *dev = lookup_begin(st, p->device, dev_scratch, &gen, &detail);
    if (dev == NULL)
        return -1;
    if (awq_tune_key_init(&key, dev, gen, p->K, p->N, p->G, p->scale_dtype, p->out_dtype) < 0)
        return 0; /* a key the file cannot hold: just run */
    /* An entry for the other backend (a file edited by hand) is a miss:
     * tuning replaces it. */
    if (awq_table_get(st->table, &key, &val) &&
        (val.config.kernel == AWQ_KERNEL_CPU) == (p->device < 0)) {
        st->hits++;
        *cfg = val.config;
        return 0;
    }
    st->misses++;
    int cap = capturing(p->device, p->stream);
    if (cap != 0)
        return cap < 0 ? -1 : 0;

    /* Each backend lists its default first: the tuner keeps it unless
     * another candidate is clearly faster. */
    awq_config cands[MAX_CANDIDATES];
    const int n = p->device >= 0 ? awq_cuda_candidates(p, cands, MAX_CANDIDATES)
                                 : awq_cpu_candidates(p, cands, MAX_CANDIDATES);
    awq_status s = tune_backend(p, NULL, p->device, cands, n, &val, &detail);
    if (s != AWQ_OK)
        return awq_raise_status(s, detail, p->device);
    *done = 1; /* the last timed run wrote the result */
    remember(st, &key, &val);
    return 0;
}

/* ---- linear ---- */

/* Up to this M the fused kernel is the untuned choice; above it,
 * dequantize + the framework's matmul (whose GEMM the fused kernels do not
 * try to beat at large M).  Where the fused default is the warpgroup kernel
 * (compute capability 9.0), up to CUDA_WGMMA_FUSED_MAX_M: in its default
 * configuration it took 0.41-1.02x the time of dequantize + matmul at
 * M = 64, and 0.41-0.98x at M = 48, on the nine layers of the H200
 * benchmark (docs/BENCHMARKS.md).  Measured on an H200 and a 2-core x86
 * host. */
#define CUDA_FUSED_MAX_M 32
#define CUDA_WGMMA_FUSED_MAX_M 64
#define CPU_FUSED_MAX_M 8

/* The fused configuration when nothing is tuned.  On the host, calls
 * above CPU_FUSED_MAX_M take the AMX tiles where they run, which beat
 * dequantize + matmul there (docs/BENCHMARKS.md); at and below it, the
 * vector kernel, which needs no dequantized panel. */
static int fused_default(const awq_linear_problem *p, awq_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    if (p->device < 0) {
        const int amx = p->M > CPU_FUSED_MAX_M && awq_cpu_amx_fits(p);
        cfg->kernel = amx ? AWQ_KERNEL_AMX : AWQ_KERNEL_CPU;
        return 0;
    }
    int detail = 0;
    awq_status s = awq_cuda_linear_default(p, cfg, &detail);
    return s == AWQ_OK ? 0 : awq_raise_status(s, detail, p->device);
}

/* The largest M at which a fused default of this kernel stays the untuned
 * choice of "auto". */
static int64_t fused_max_m(int device, int kernel)
{
    if (device < 0)
        return kernel == AWQ_KERNEL_AMX ? INT64_MAX : CPU_FUSED_MAX_M;
    return kernel == AWQ_KERNEL_WGMMA ? CUDA_WGMMA_FUSED_MAX_M : CUDA_FUSED_MAX_M;
}

/* The configuration when nothing is tuned for path (awq_path): the fused
 * default, or for "auto" above its kernel's fused M, dequantize. */
static int untuned(const awq_linear_problem *p, int path, awq_config *cfg)
{
    if (fused_default(p, cfg))
        return -1;
    if (path == AWQ_PATH_FUSED || p->M <= fused_max_m(p->device, cfg->kernel))
        return 0;
    memset(cfg, 0, sizeof *cfg);
    cfg->kernel = AWQ_KERNEL_DEQUANT;
    return 0;
}

static int is_fused(const awq_config *c, int device)
{
    return device >= 0
               ? c->kernel == AWQ_KERNEL_GEMV || c->kernel == AWQ_KERNEL_WGMMA || c->kernel == AWQ_KERNEL_MMA ||
                     c->kernel == AWQ_KERNEL_SIMT
               : c->kernel == AWQ_KERNEL_CPU || c->kernel == AWQ_KERNEL_AMX;
}

int awq_cache_linear(PyObject *module, const awq_linear_problem *p, int path,
                     awq_linear_timer dequant_timer, void *timer_ctx, awq_config *cfg)
{
    awq_state *st = awq_get_state(module);
    awq_tune_key key;
    awq_tune_value val;
    int detail = 0;

    memset(cfg, 0, sizeof *cfg);
    if (path == AWQ_PATH_DEQUANT) {
        cfg->kernel = AWQ_KERNEL_DEQUANT;
        return 0;
    }
    if (autotune_disabled(st))
        return untuned(p, path, cfg);
    char dev_scratch[AWQ_TUNE_DEVICE_LEN];
    int gen;
    const char *dev = lookup_begin(st, p->device, dev_scratch, &gen, &detail);
    if (dev == NULL)
        return -1;
    if (awq_tune_linear_key_init(&key, dev, gen, p->K, p->N, p->G, p->dtype,
                                 awq_m_bucket(p->M)) < 0)
        return untuned(p, path, cfg);
    /* An entry for the other backend (a file edited by hand) is a miss. */
    if (awq_table_get(st->table, &key, &val) &&
        (is_fused(&val.config, p->device) || val.config.kernel == AWQ_KERNEL_DEQUANT)) {
        if (path == AWQ_PATH_AUTO || is_fused(&val.config, p->device)) {
            st->hits++;
            *cfg = val.config;
            return 0;
        }
        return fused_default(p, cfg); /* fused asked for, dequantize tuned */
    }
    st->misses++;
    int cap = capturing(p->device, p->stream);
    if (cap != 0)
        return cap < 0 ? -1 : untuned(p, path, cfg);

    /* The fused configurations, the backend's default first ... */
    awq_config cands[MAX_CANDIDATES];
    int n = p->device >= 0 ? awq_cuda_linear_candidates(p, cands, MAX_CANDIDATES)
                           : awq_cpu_linear_candidates(p, cands, MAX_CANDIDATES);
    awq_status s = n > 0 ? tune_backend(NULL, p, p->device, cands, n, &val, &detail)
                         : AWQ_ERR_CONFIG;
    int have_fused = s == AWQ_OK;
    if (s != AWQ_OK && s != AWQ_ERR_CONFIG)
        return awq_raise_status(s, detail, p->device);
    /* ... then dequantize + the framework's matmul, which needs the GIL. */
    float dq_us = 0.0f;
    if (dequant_timer(timer_ctx, &dq_us) < 0)
        return -1;
    if (!have_fused || dq_us < val.us) {
        memset(&val.config, 0, sizeof val.config);
        val.config.kernel = AWQ_KERNEL_DEQUANT;
        val.us = dq_us;
    }
    remember(st, &key, &val);
    if (path == AWQ_PATH_FUSED && !is_fused(&val.config, p->device))
        return fused_default(p, cfg);
    *cfg = val.config;
    return 0;
}

/* ---- inspection ---- */

PyObject *awq_py_cache_path(PyObject *module, PyObject *unused)
{
    (void)unused;
    awq_state *st = awq_get_state(module);
    if (st->table_loaded && st->cache_file[0])
        return PyUnicode_DecodeFSDefault(st->cache_file);
    char buf[4096];
    if (resolve_path(buf, sizeof buf) < 0) {
        PyErr_SetString(PyExc_ValueError, "cache path too long");
        return NULL;
    }
    return PyUnicode_DecodeFSDefault(buf);
}

PyObject *awq_py_cache_entries(PyObject *module, PyObject *unused)
{
    (void)unused;
    awq_state *st = awq_get_state(module);
    ensure_loaded(st);
    size_t n = awq_table_size(st->table);
    awq_tune_key *keys = PyMem_Malloc((n + 1) * sizeof *keys);
    awq_tune_value *vals = PyMem_Malloc((n + 1) * sizeof *vals);
    PyObject *list = NULL;
    if (keys == NULL || vals == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    n = awq_table_snapshot(st->table, keys, vals, n);
    list = PyList_New(0);
    if (list == NULL)
        goto done;
    for (size_t i = 0; i < n; i++) {
        const awq_config *c = &vals[i].config;
        PyObject *d = Py_BuildValue(
            "{s:s,s:i,s:s,s:L,s:L,s:L,s:L,s:s,s:s,s:s,s:i,s:i,s:i,s:i,s:L,s:d}", "device",
            keys[i].device, "gen", keys[i].gen, "op", awq_tune_op_name(keys[i].op), "K",
            (long long)keys[i].K, "N", (long long)keys[i].N, "G", (long long)keys[i].G, "M",
            (long long)keys[i].m, "scales_dtype", awq_dtype_name(keys[i].scale_dtype), "out_dtype",
            awq_dtype_name(keys[i].out_dtype), "kernel", awq_kernel_name(c->kernel), "block_size",
            c->block_size, "rows", c->rows, "split", c->split, "threads", c->threads, "chunk",
            (long long)c->chunk, "us", (double)vals[i].us);
        if (d == NULL || PyList_Append(list, d) < 0) {
            Py_XDECREF(d);
            Py_CLEAR(list);
            goto done;
        }
        Py_DECREF(d);
    }
done:
    PyMem_Free(keys);
    PyMem_Free(vals);
    return list;
}

PyObject *awq_py_cache_stats(PyObject *module, PyObject *unused)
{
    (void)unused;
    awq_state *st = awq_get_state(module);
    return Py_BuildValue("{s:K,s:K,s:K,s:n}", "hits", st->hits, "misses", st->misses, "tunings",
                         st->tunings, "entries", (Py_ssize_t)awq_table_size(st->table));
}

PyObject *awq_py_clear_cache(PyObject *module, PyObject *unused)
{
    (void)unused;
    awq_state *st = awq_get_state(module);
    char warn[1024] = "";
    int status = 0;
    if (resolve_path(st->cache_file, sizeof st->cache_file) < 0)
        st->cache_file[0] = '\0';
    awq_table_clear(st->table);
    st->table_loaded = 1; /* nothing to read back: the file is gone */
    if (st->cache_file[0]) {
        Py_BEGIN_ALLOW_THREADS
        status = awq_cache_remove(st->cache_file, warn, sizeof warn);
        Py_END_ALLOW_THREADS
        warn_once(st, AWQ_WARN_CLEAR, status, warn);
    }
    Py_RETURN_NONE;
}

void awq_cache_reset(awq_state *st)
{
    awq_table_clear(st->table);
    st->table_loaded = 0;
    st->autotune = 0;
    st->hits = st->misses = st->tunings = 0;
    memset(st->warned, 0, sizeof st->warned);
}
