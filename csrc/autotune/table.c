/*
 * autotune/table.c -- the in-memory autotune table (autotune.h has the API).
 *
 * Open addressing with linear probing over a power-of-two array of hashes
 * (0 = empty) beside an array of entries, so that a probe walks 8-byte
 * hashes and compares a full key only on a match.  One mutex guards it:
 * every function may be called without the GIL.
 */
#define _POSIX_C_SOURCE 200809L

#include "autotune/autotune.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Upper bound for threads: far above any real value, low enough
 * that a corrupted number is caught. */
#define TUNE_MAX_PARAM 65536

/* ======================================================================
 * Keys and values
 * ====================================================================== */

/* A device string that the file can hold verbatim: it must end inside the
 * field (a longer one would be cut, and two devices could then collide),
 * hold no tab or line break (field and line separators), and not start
 * with '#' (the line would read back as a comment). */
static int device_valid(const char *d)
{
    size_t n = strnlen(d, AWQ_TUNE_DEVICE_LEN);
    if (n == 0 || n == AWQ_TUNE_DEVICE_LEN || d[0] == '#')
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)d[i];
        if (c < 0x20 || c == 0x7f)
            return 0;
    }
    return 1;
}

const char *awq_tune_op_name(int op)
{
    static const char *const names[AWQ_NUM_OPS] = {"dequantize", "linear"};
    return op >= 0 && op < AWQ_NUM_OPS ? names[op] : NULL;
}

int awq_tune_op_parse(const char *name, int *op)
{
    for (int i = 0; name && i < AWQ_NUM_OPS; i++)
        if (strcmp(name, awq_tune_op_name(i)) == 0) {
            *op = i;
            return 0;
        }
    return -1;
}

/* An M bucket as awq_m_bucket gives them. */
static int bucket_valid(int64_t m) { return m >= 1 && m <= AWQ_M_BUCKET_MAX && (m & (m - 1)) == 0; }

int awq_tune_key_valid(const awq_tune_key *k)
{
    if (!k || !device_valid(k->device) || k->gen < 1)
        return 0;
    if (k->K < 0 || k->N < 0 || k->N % 8 != 0 || k->G < 1)
        return 0;
    if (k->K != 0 && k->K % k->G != 0)
        return 0;
    if ((unsigned)k->scale_dtype >= AWQ_NUM_DTYPES || (unsigned)k->out_dtype >= AWQ_NUM_DTYPES)
        return 0;
    switch (k->op) {
    case AWQ_OP_DEQUANTIZE: return k->m == 0;
    case AWQ_OP_LINEAR: return bucket_valid(k->m) && k->scale_dtype == k->out_dtype;
    default: return 0;
    }
}

int awq_tune_value_valid(const awq_tune_value *v)
{
    if (!v)
        return 0;
    const awq_config *c = &v->config;
    if (c->kernel < AWQ_KERNEL_V1 || c->kernel >= AWQ_NUM_KERNELS)
        return 0;
    if ((c->block_size != 0 && !awq_block_size_valid(c->block_size)) ||
        (c->rows != 0 && !awq_rows_valid(c->rows)))
        return 0;
    if (c->split < 0 || c->split > AWQ_MAX_SPLIT)
        return 0;
    if (c->threads < 0 || c->threads > TUNE_MAX_PARAM || c->chunk < 0)
        return 0;
    return isfinite(v->us) && v->us >= 0.0f;
}

int awq_tune_entry_valid(const awq_tune_key *k, const awq_tune_value *v)
{
    if (!awq_tune_key_valid(k) || !awq_tune_value_valid(v))
        return 0;
    const int kernel = v->config.kernel;
    if (k->op == AWQ_OP_DEQUANTIZE)
        return kernel <= AWQ_KERNEL_CPU && v->config.split == 0;
    return kernel == AWQ_KERNEL_CPU || kernel >= AWQ_KERNEL_SIMT;
}

/* Zero-fills *k and sets its fields; 0, or -1 (and *k zeroed) when the
 * device string does not fit or the key is not valid. */
static int key_init(awq_tune_key *k, const char *device, int gen, int op, int64_t K, int64_t N,
                    int64_t G, awq_dtype scale_dtype, awq_dtype out_dtype, int64_t m)
{
    if (!k)
        return -1;
    memset(k, 0, sizeof *k);
    if (!device)
        return -1;
    size_t n = strnlen(device, AWQ_TUNE_DEVICE_LEN);
    if (n == AWQ_TUNE_DEVICE_LEN)
        return -1;
    memcpy(k->device, device, n);
    k->gen = gen;
    k->op = op;
    k->K = K;
    k->N = N;
    k->G = G;
    k->m = m;
    k->scale_dtype = scale_dtype;
    k->out_dtype = out_dtype;
    if (!awq_tune_key_valid(k)) {
        memset(k, 0, sizeof *k);
        return -1;
    }
    return 0;
}

int awq_tune_key_init(awq_tune_key *k, const char *device, int gen, int64_t K, int64_t N,
                      int64_t G, awq_dtype scale_dtype, awq_dtype out_dtype)
{
    return key_init(k, device, gen, AWQ_OP_DEQUANTIZE, K, N, G, scale_dtype, out_dtype, 0);
}

int awq_tune_linear_key_init(awq_tune_key *k, const char *device, int gen, int64_t K, int64_t N,
                             int64_t G, awq_dtype dtype, int64_t m)
{
    return key_init(k, device, gen, AWQ_OP_LINEAR, K, N, G, dtype, dtype, m);
}

static uint64_t key_hash(const awq_tune_key *k)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325); /* FNV-1a offset basis */
    for (size_t i = 0; i < AWQ_TUNE_DEVICE_LEN && k->device[i]; i++) {
        h ^= (unsigned char)k->device[i];
        h *= UINT64_C(0x100000001b3); /* FNV-1a 64-bit prime */
    }
    h = awq_mix64(h ^ (uint64_t)(unsigned)k->gen ^ (uint64_t)(unsigned)k->op << 32);
    h = awq_mix64(h ^ (uint64_t)k->m);
    h = awq_mix64(h ^ (uint64_t)k->K);
    h = awq_mix64(h ^ (uint64_t)k->N);
    h = awq_mix64(h ^ (uint64_t)k->G);
    h = awq_mix64(h ^ ((uint64_t)(unsigned)k->scale_dtype << 8 | (uint64_t)(unsigned)k->out_dtype));
    return h ? h : 1;
}

static int key_equal(const awq_tune_key *a, const awq_tune_key *b)
{
    return a->gen == b->gen && a->op == b->op && a->m == b->m && a->K == b->K && a->N == b->N &&
           a->G == b->G &&
           a->scale_dtype == b->scale_dtype && a->out_dtype == b->out_dtype &&
           strncmp(a->device, b->device, AWQ_TUNE_DEVICE_LEN) == 0;
}

/* Stored keys are canonical: bytes after the device's NUL are zero, so a
 * snapshot never carries whatever the caller left there. */
static void key_copy(awq_tune_key *dst, const awq_tune_key *src)
{
    memset(dst, 0, sizeof *dst);
    memcpy(dst->device, src->device, strnlen(src->device, AWQ_TUNE_DEVICE_LEN));
    dst->gen = src->gen;
    dst->op = src->op;
    dst->m = src->m;
    dst->K = src->K;
    dst->N = src->N;
    dst->G = src->G;
    dst->scale_dtype = src->scale_dtype;
    dst->out_dtype = src->out_dtype;
}

/* ======================================================================
 * The table
 * ====================================================================== */

struct awq_table {
    pthread_mutex_t mu;
    uint64_t *hashes;     /* cap slots; 0 = empty */
    awq_tune_entry *entries; /* cap slots; meaningful where hashes[i] != 0 */
    size_t cap;           /* a power of two */
    size_t size;
};

#define TABLE_MIN_CAP 16

/* Grow before the table is 70 % full: linear probing stays short and an
 * empty slot always exists, so every probe loop ends. */
static int over_load(size_t size, size_t cap) { return size * 10 > cap * 7; }

static int alloc_slots(size_t cap, uint64_t **hashes, awq_tune_entry **entries)
{
    if (cap > SIZE_MAX / sizeof(awq_tune_entry))
        return -1;
    *hashes = calloc(cap, sizeof **hashes);
    *entries = malloc(cap * sizeof **entries);
    if (!*hashes || !*entries) {
        free(*hashes);
        free(*entries);
        *hashes = NULL;
        *entries = NULL;
        return -1;
    }
    return 0;
}

awq_table *awq_table_new(void)
{
    awq_table *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    if (alloc_slots(TABLE_MIN_CAP, &t->hashes, &t->entries) != 0) {
        free(t);
        return NULL;
    }
    if (pthread_mutex_init(&t->mu, NULL) != 0) {
        free(t->hashes);
        free(t->entries);
        free(t);
        return NULL;
    }
    t->cap = TABLE_MIN_CAP;
    return t;
}

void awq_table_free(awq_table *t)
{
    if (!t)
        return;
    pthread_mutex_destroy(&t->mu);
    free(t->hashes);
    free(t->entries);
    free(t);
}

/* Slot holding k, or the empty slot where it would go.  Caller holds mu. */
static size_t probe(const awq_table *t, const awq_tune_key *k, uint64_t h, int *found)
{
    size_t mask = t->cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        if (t->hashes[i] == 0) {
            *found = 0;
            return i;
        }
        if (t->hashes[i] == h && key_equal(&t->entries[i].key, k)) {
            *found = 1;
            return i;
        }
    }
}

/* Moves every entry into arrays of new_cap slots.  On failure the table is
 * untouched. */
static int rehash(awq_table *t, size_t new_cap)
{
    uint64_t *nh;
    awq_tune_entry *ne;
    if (alloc_slots(new_cap, &nh, &ne) != 0)
        return -1;
    size_t mask = new_cap - 1;
    for (size_t i = 0; i < t->cap; i++) {
        if (t->hashes[i] == 0)
            continue;
        size_t j = (size_t)t->hashes[i] & mask;
        while (nh[j] != 0)
            j = (j + 1) & mask;
        nh[j] = t->hashes[i];
        ne[j] = t->entries[i];
    }
    free(t->hashes);
    free(t->entries);
    t->hashes = nh;
    t->entries = ne;
    t->cap = new_cap;
    return 0;
}

/* Caller holds mu; k and v are valid.  overwrite = 0 keeps an existing
 * value (used to merge the file under what we already know). */
static int insert_locked(awq_table *t, const awq_tune_key *k, const awq_tune_value *v,
                         int overwrite)
{
    uint64_t h = key_hash(k);
    int found;
    size_t i = probe(t, k, h, &found);
    if (found) {
        if (overwrite)
            t->entries[i].val = *v;
        return 0;
    }
    if (over_load(t->size + 1, t->cap)) {
        if (t->cap > SIZE_MAX / 2 || rehash(t, t->cap * 2) != 0)
            return -1;
        i = probe(t, k, h, &found);
    }
    t->hashes[i] = h;
    key_copy(&t->entries[i].key, k);
    t->entries[i].val = *v;
    t->size++;
    return 0;
}

int awq_table_get(awq_table *t, const awq_tune_key *k, awq_tune_value *v)
{
    if (!t || !k)
        return 0;
    uint64_t h = key_hash(k);
    int found;
    pthread_mutex_lock(&t->mu);
    size_t i = probe(t, k, h, &found);
    if (found && v)
        *v = t->entries[i].val;
    pthread_mutex_unlock(&t->mu);
    return found;
}

int awq_table_put(awq_table *t, const awq_tune_key *k, const awq_tune_value *v)
{
    if (!t || !awq_tune_entry_valid(k, v))
        return -2;
    pthread_mutex_lock(&t->mu);
    int rc = insert_locked(t, k, v, 1);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

size_t awq_table_size(awq_table *t)
{
    if (!t)
        return 0;
    pthread_mutex_lock(&t->mu);
    size_t n = t->size;
    pthread_mutex_unlock(&t->mu);
    return n;
}

void awq_table_clear(awq_table *t)
{
    if (!t)
        return;
    uint64_t *nh = NULL;
    awq_tune_entry *ne = NULL;
    /* Allocate outside the lock; if that fails, empty the big arrays. */
    int fresh = alloc_slots(TABLE_MIN_CAP, &nh, &ne) == 0;
    pthread_mutex_lock(&t->mu);
    if (fresh) {
        uint64_t *oh = t->hashes;
        awq_tune_entry *oe = t->entries;
        t->hashes = nh;
        t->entries = ne;
        t->cap = TABLE_MIN_CAP;
        nh = oh;
        ne = oe;
    } else {
        memset(t->hashes, 0, t->cap * sizeof *t->hashes);
    }
    t->size = 0;
    pthread_mutex_unlock(&t->mu);
    free(nh);
    free(ne);
}

size_t awq_table_snapshot(awq_table *t, awq_tune_key *keys, awq_tune_value *vals, size_t cap)
{
    if (!t)
        return 0;
    size_t n = 0;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->cap && n < cap; i++) {
        if (t->hashes[i] == 0)
            continue;
        if (keys)
            keys[n] = t->entries[i].key;
        if (vals)
            vals[n] = t->entries[i].val;
        n++;
    }
    pthread_mutex_unlock(&t->mu);
    return n;
}

int awq_table_merge_missing(awq_table *dst, awq_table *src)
{
    int rc = 0;
    pthread_mutex_lock(&src->mu);
    pthread_mutex_lock(&dst->mu);
    for (size_t i = 0; i < src->cap && rc == 0; i++) {
        if (src->hashes[i] != 0)
            rc = insert_locked(dst, &src->entries[i].key, &src->entries[i].val, 0);
    }
    pthread_mutex_unlock(&dst->mu);
    pthread_mutex_unlock(&src->mu);
    return rc;
}


awq_tune_entry *awq_table_entries(awq_table *t, size_t *n)
{
    *n = 0;
    if (!t)
        return NULL;
    for (;;) {
        size_t want = awq_table_size(t);
        awq_tune_entry *e = malloc((want ? want : 1) * sizeof *e);
        if (!e)
            return NULL;
        pthread_mutex_lock(&t->mu);
        size_t got = 0;
        const int fits = t->size <= want;
        if (fits) {
            for (size_t i = 0; i < t->cap; i++)
                if (t->hashes[i] != 0)
                    e[got++] = t->entries[i];
        }
        pthread_mutex_unlock(&t->mu);
        if (fits) {
            *n = got;
            return e;
        }
        free(e); /* another thread added entries meanwhile: try again */
    }
}

