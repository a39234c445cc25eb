/*
 * autotune.c -- the autotune cache (see autotune.h for the API and the
 * file format, DESIGN.md section 5 for the contract).
 *
 * Three parts:
 *   1. the table: open addressing with linear probing over a power-of-two
 *      array of hashes (0 = empty) beside an array of entries, so that a
 *      probe walks 8-byte hashes and compares a full key only on a match;
 *   2. the file: a bounded line reader (no line can make us allocate),
 *      strict field parsing, and a save that merges under flock and
 *      replaces the file by rename, so readers never see a partial file;
 *   3. the tuner: time each candidate, keep the fastest.
 */
#define _POSIX_C_SOURCE 200809L

#include "autotune.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

/* Upper bound for threads: far above any real value, low enough
 * that a corrupted number is caught. */
#define TUNE_MAX_PARAM 65536

/* ======================================================================
 * Names
 * ====================================================================== */

static const char *const dtype_names[AWQ_NUM_DTYPES] = {
    [AWQ_F16] = "float16",
    [AWQ_BF16] = "bfloat16",
    [AWQ_F32] = "float32",
};

static const char *const kernel_names[AWQ_NUM_KERNELS] = {
    [AWQ_KERNEL_AUTO] = "auto", [AWQ_KERNEL_V1] = "v1", [AWQ_KERNEL_V2] = "v2",
    [AWQ_KERNEL_V3] = "v3",     [AWQ_KERNEL_V4] = "v4", [AWQ_KERNEL_CPU] = "cpu",
};

const char *awq_tune_dtype_name(int dtype)
{
    return dtype >= 0 && dtype < AWQ_NUM_DTYPES ? dtype_names[dtype] : NULL;
}

const char *awq_tune_kernel_name(int kernel)
{
    return kernel >= 0 && kernel < AWQ_NUM_KERNELS ? kernel_names[kernel] : NULL;
}

int awq_tune_parse_dtype(const char *name, awq_dtype *out)
{
    for (int i = 0; name && i < AWQ_NUM_DTYPES; i++) {
        if (strcmp(name, dtype_names[i]) == 0) {
            *out = (awq_dtype)i;
            return 0;
        }
    }
    return -1;
}

int awq_tune_parse_kernel(const char *name, awq_kernel *out)
{
    for (int i = 0; name && i < AWQ_NUM_KERNELS; i++) {
        if (strcmp(name, kernel_names[i]) == 0) {
            *out = (awq_kernel)i;
            return 0;
        }
    }
    return -1;
}

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

int awq_tune_key_valid(const awq_tune_key *k)
{
    if (!k || !device_valid(k->device) || k->gen < 1)
        return 0;
    if (k->K < 0 || k->N < 0 || k->N % 8 != 0 || k->G < 1)
        return 0;
    if (k->K != 0 && k->K % k->G != 0)
        return 0;
    return (unsigned)k->scale_dtype < AWQ_NUM_DTYPES && (unsigned)k->out_dtype < AWQ_NUM_DTYPES;
}

int awq_tune_value_valid(const awq_tune_value *v)
{
    if (!v)
        return 0;
    const awq_config *c = &v->config;
    if (c->kernel < AWQ_KERNEL_V1 || c->kernel > AWQ_KERNEL_CPU)
        return 0;
    if ((c->block_size != 0 && !awq_block_size_valid(c->block_size)) ||
        (c->rows != 0 && !awq_rows_valid(c->rows)))
        return 0;
    if (c->threads < 0 || c->threads > TUNE_MAX_PARAM || c->chunk < 0)
        return 0;
    return isfinite(v->us) && v->us >= 0.0f;
}

int awq_tune_key_init(awq_tune_key *k, const char *device, int gen, int64_t K, int64_t N,
                      int64_t G, awq_dtype scale_dtype, awq_dtype out_dtype)
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
    k->K = K;
    k->N = N;
    k->G = G;
    k->scale_dtype = scale_dtype;
    k->out_dtype = out_dtype;
    if (!awq_tune_key_valid(k)) {
        memset(k, 0, sizeof *k);
        return -1;
    }
    return 0;
}

/* splitmix64's finalizer: a cheap bijection that spreads every input bit
 * over the whole word, so that consecutive K or N land far apart. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    x ^= x >> 31;
    return x;
}

/* FNV-1a over the device string, then each integer field mixed in.
 * Never 0: the table uses 0 to mark an empty slot. */
static uint64_t key_hash(const awq_tune_key *k)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325); /* FNV-1a offset basis */
    for (size_t i = 0; i < AWQ_TUNE_DEVICE_LEN && k->device[i]; i++) {
        h ^= (unsigned char)k->device[i];
        h *= UINT64_C(0x100000001b3); /* FNV-1a 64-bit prime */
    }
    h = mix64(h ^ (uint64_t)(unsigned)k->gen);
    h = mix64(h ^ (uint64_t)k->K);
    h = mix64(h ^ (uint64_t)k->N);
    h = mix64(h ^ (uint64_t)k->G);
    h = mix64(h ^ ((uint64_t)(unsigned)k->scale_dtype << 8 | (uint64_t)(unsigned)k->out_dtype));
    return h ? h : 1;
}

static int key_equal(const awq_tune_key *a, const awq_tune_key *b)
{
    return a->gen == b->gen && a->K == b->K && a->N == b->N && a->G == b->G &&
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
    dst->K = src->K;
    dst->N = src->N;
    dst->G = src->G;
    dst->scale_dtype = src->scale_dtype;
    dst->out_dtype = src->out_dtype;
}

/* ======================================================================
 * The table
 * ====================================================================== */

typedef struct {
    awq_tune_key key;
    awq_tune_value val;
} table_entry;

struct awq_table {
    pthread_mutex_t mu;
    uint64_t *hashes;     /* cap slots; 0 = empty */
    table_entry *entries; /* cap slots; meaningful where hashes[i] != 0 */
    size_t cap;           /* a power of two */
    size_t size;
};

#define TABLE_MIN_CAP 16

/* Grow before the table is 70 % full: linear probing stays short and an
 * empty slot always exists, so every probe loop ends. */
static int over_load(size_t size, size_t cap) { return size * 10 > cap * 7; }

static int alloc_slots(size_t cap, uint64_t **hashes, table_entry **entries)
{
    if (cap > SIZE_MAX / sizeof(table_entry))
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
    table_entry *ne;
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
    if (!t || !awq_tune_key_valid(k) || !awq_tune_value_valid(v))
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
    table_entry *ne = NULL;
    /* Allocate outside the lock; if that fails, empty the big arrays. */
    int fresh = alloc_slots(TABLE_MIN_CAP, &nh, &ne) == 0;
    pthread_mutex_lock(&t->mu);
    if (fresh) {
        uint64_t *oh = t->hashes;
        table_entry *oe = t->entries;
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

/* Copies every entry of src into dst where dst lacks the key. */
static int merge_missing(awq_table *dst, awq_table *src)
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

/* ======================================================================
 * Warnings
 * ====================================================================== */

typedef struct {
    char *buf;
    size_t len;
} warn_sink;

static warn_sink warn_start(char *buf, size_t len)
{
    if (buf && len)
        buf[0] = '\0';
    return (warn_sink){buf, buf ? len : 0};
}

/* Appends one message ("; " between messages).  Cut at the buffer's end. */
static void warnf(warn_sink *w, const char *fmt, ...)
{
    if (!w->len)
        return;
    size_t used = strnlen(w->buf, w->len);
    if (used + 1 >= w->len)
        return;
    if (used) {
        int n = snprintf(w->buf + used, w->len - used, "; ");
        if (n < 0 || (size_t)n >= w->len - used)
            return;
        used += (size_t)n;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->buf + used, w->len - used, fmt, ap);
    va_end(ap);
}

/* strerror is not thread-safe; this is (the XSI strerror_r). */
static const char *errstr(int err, char *buf, size_t len)
{
    if (strerror_r(err, buf, len) != 0)
        snprintf(buf, len, "error %d", err);
    return buf;
}

/* ======================================================================
 * Numbers in the C locale
 *
 * The file must read the same in every process, whatever LC_NUMERIC a
 * program chose, so the number conversions run under a thread-local "C"
 * locale (uselocale is per thread: other threads are not affected).
 * ====================================================================== */

typedef struct {
    locale_t c, old;
} c_numeric;

static void c_numeric_enter(c_numeric *s)
{
    s->c = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    s->old = s->c ? uselocale(s->c) : (locale_t)0;
}

static void c_numeric_leave(c_numeric *s)
{
    if (s->c) {
        uselocale(s->old);
        freelocale(s->c);
    }
}

/* Shortest "%g" text that reads back as the same float (at most 9
 * significant digits always suffice for a float). */
static void format_us(float us, char *buf, size_t len)
{
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, len, "%.*g", prec, (double)us);
        if (strtof(buf, NULL) == us)
            return;
    }
}

/* ======================================================================
 * Parsing one line
 * ====================================================================== */

#define FIELDS_PER_LINE 13

/* Decimal digits only: no sign, no space, no "0x"; at most INT64_MAX.
 * Every integer of the format is >= 0, so a '-' is malformed. */
static int parse_nonneg(const char *s, int64_t *out)
{
    if (!*s)
        return -1;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        unsigned d = (unsigned)(*s - '0');
        if (v > ((uint64_t)INT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = (int64_t)v;
    return 0;
}

static int parse_int(const char *s, int *out)
{
    int64_t v;
    if (parse_nonneg(s, &v) != 0 || v > INT_MAX)
        return -1;
    *out = (int)v;
    return 0;
}

/* A finite decimal >= 0 that fits a float: a digit first, then only
 * characters of a decimal number (no "inf", "nan", hex or spaces). */
static int parse_us(const char *s, float *out)
{
    if (*s < '0' || *s > '9' || strspn(s, "0123456789.eE+-") != strlen(s))
        return -1;
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (*end != '\0' || errno == ERANGE || !isfinite(d) || d < 0.0 || d > FLT_MAX)
        return -1;
    *out = (float)d;
    return 0;
}

/* Splits line (modified in place) and fills k, v.  0 ok, -1 malformed. */
static int parse_entry(char *line, awq_tune_key *k, awq_tune_value *v)
{
    char *f[FIELDS_PER_LINE];
    int n = 0;
    for (char *p = line;;) {
        if (n == FIELDS_PER_LINE)
            return -1; /* a 14th field */
        f[n++] = p;
        char *tab = strchr(p, '\t');
        if (!tab)
            break;
        *tab = '\0';
        p = tab + 1;
    }
    if (n != FIELDS_PER_LINE)
        return -1;

    memset(k, 0, sizeof *k);
    memset(v, 0, sizeof *v);
    size_t dlen = strlen(f[0]);
    if (dlen >= AWQ_TUNE_DEVICE_LEN)
        return -1; /* rejected, never truncated */
    memcpy(k->device, f[0], dlen);

    awq_kernel kernel;
    if (parse_int(f[1], &k->gen) || parse_nonneg(f[2], &k->K) || parse_nonneg(f[3], &k->N) ||
        parse_nonneg(f[4], &k->G) || awq_tune_parse_dtype(f[5], &k->scale_dtype) ||
        awq_tune_parse_dtype(f[6], &k->out_dtype) || awq_tune_parse_kernel(f[7], &kernel) ||
        parse_int(f[8], &v->config.block_size) || parse_int(f[9], &v->config.rows) ||
        parse_int(f[10], &v->config.threads) || parse_nonneg(f[11], &v->config.chunk) ||
        parse_us(f[12], &v->us))
        return -1;
    v->config.kernel = (int)kernel;
    return awq_tune_key_valid(k) && awq_tune_value_valid(v) ? 0 : -1;
}

/* ======================================================================
 * Reading a file
 * ====================================================================== */

/* Longest line kept; a valid entry needs well under 300 bytes. */
#define LINE_CAP 512

typedef struct {
    FILE *f;
    char buf[LINE_CAP];
    size_t len;
    int too_long; /* the line went past LINE_CAP - 1 bytes (the rest was skipped) */
    int has_nul;  /* a NUL byte: binary data */
    int newline;  /* the line ended with '\n' (else it ended at end of file) */
    int err;      /* errno of a read error, 0 if none */
} line_reader;

/* Reads one line into a fixed buffer, whatever its length.  Returns 0 at
 * end of file (or on a read error: see lr->err) when nothing was read. */
static int next_line(line_reader *lr)
{
    size_t n = 0;
    int any = 0, c;
    lr->too_long = lr->has_nul = lr->newline = 0;
    while ((c = getc_unlocked(lr->f)) != EOF) {
        any = 1;
        if (c == '\n') {
            lr->newline = 1;
            break;
        }
        if (c == '\0')
            lr->has_nul = 1;
        if (n < LINE_CAP - 1)
            lr->buf[n++] = (char)c;
        else
            lr->too_long = 1;
    }
    if (c == EOF && ferror(lr->f) && !lr->err)
        lr->err = errno ? errno : EIO;
    lr->buf[n] = '\0';
    lr->len = n;
    return any;
}

typedef enum {
    RS_OK,          /* a file of our version was read (see malformed, err) */
    RS_MISSING,     /* no file: a first run */
    RS_EMPTY,       /* zero bytes */
    RS_BAD_HEADER,  /* not our header: another file, garbage, cut header */
    RS_OLD,         /* our header with an older version (tuned for older kernels) */
    RS_FUTURE,      /* our header with a newer version */
    RS_ERROR,       /* could not open / read (err) */
    RS_NOT_REGULAR, /* a directory, FIFO, device... */
    RS_NOMEM,
} read_state;

typedef struct {
    read_state state;
    int err;          /* errno for RS_ERROR, or a read error after some lines of RS_OK */
    long version;     /* for RS_OLD and RS_FUTURE */
    size_t malformed; /* lines skipped (RS_OK) */
} read_report;

static const char header_prefix[] = "# awq_fast_dequant autotune cache v";

/* The version in a header line; 0 when the line is not a header. */
static long header_version(const line_reader *lr)
{
    size_t plen = sizeof header_prefix - 1;
    if (!lr->newline || lr->has_nul || lr->too_long || lr->len <= plen ||
        memcmp(lr->buf, header_prefix, plen) != 0)
        return 0;
    long v = 0;
    for (const char *p = lr->buf + plen; *p; p++) {
        if (*p < '0' || *p > '9' || v > 100000000)
            return 0;
        v = v * 10 + (*p - '0');
    }
    return v;
}

/* Reads path into `into` (later duplicate lines overwrite earlier ones).
 * Caller is in the C numeric locale. */
static void read_cache_file(const char *path, awq_table *into, read_report *r)
{
    memset(r, 0, sizeof *r);
    /* O_NONBLOCK: a FIFO at the path must not hang the open. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        r->state = errno == ENOENT ? RS_MISSING : RS_ERROR;
        r->err = errno;
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        r->state = RS_ERROR;
        r->err = errno;
        close(fd);
        return;
    }
    if (!S_ISREG(st.st_mode)) {
        r->state = RS_NOT_REGULAR;
        close(fd);
        return;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    line_reader *lr = calloc(1, sizeof *lr);
    FILE *f = lr ? fdopen(fd, "r") : NULL;
    if (!f) {
        r->state = lr ? RS_ERROR : RS_NOMEM;
        r->err = errno;
        free(lr);
        close(fd);
        return;
    }
    lr->f = f;

    if (!next_line(lr)) {
        r->state = lr->err ? RS_ERROR : RS_EMPTY;
        r->err = lr->err;
        goto done;
    }
    long version = header_version(lr);
    if (version != AWQ_TUNE_FORMAT_VERSION) {
        r->state = version > AWQ_TUNE_FORMAT_VERSION ? RS_FUTURE
                   : version >= 1                      ? RS_OLD
                                                       : RS_BAD_HEADER;
        r->version = version;
        goto done;
    }
    r->state = RS_OK;
    while (next_line(lr)) {
        if (!lr->newline) {
            r->malformed++; /* the last line was cut short: never trust it */
            continue;
        }
        if (lr->has_nul) {
            r->malformed++;
            continue;
        }
        if (lr->len == 0 || lr->buf[0] == '#')
            continue; /* blank line or comment */
        awq_tune_key k;
        awq_tune_value v;
        if (lr->too_long || parse_entry(lr->buf, &k, &v) != 0) {
            r->malformed++;
            continue;
        }
        pthread_mutex_lock(&into->mu);
        int rc = insert_locked(into, &k, &v, 1);
        pthread_mutex_unlock(&into->mu);
        if (rc != 0) {
            r->state = RS_NOMEM;
            goto done;
        }
    }
    r->err = lr->err;
done:
    fclose(f);
    free(lr);
}

int awq_table_load(awq_table *t, const char *path, char *warn, size_t warn_len)
{
    warn_sink w = warn_start(warn, warn_len);
    char eb[128];
    if (!t || !path || !*path) {
        warnf(&w, "no autotune cache path given");
        return 1;
    }
    awq_table *disk = awq_table_new();
    if (!disk) {
        warnf(&w, "out of memory reading the autotune cache %s", path);
        return 1;
    }
    c_numeric loc;
    c_numeric_enter(&loc);
    read_report r;
    read_cache_file(path, disk, &r);
    c_numeric_leave(&loc);

    switch (r.state) {
    case RS_OK:
        if (merge_missing(t, disk) != 0)
            warnf(&w, "out of memory loading the autotune cache %s", path);
        if (r.malformed)
            warnf(&w, "ignored %zu malformed line%s in %s", r.malformed,
                  r.malformed == 1 ? "" : "s", path);
        if (r.err)
            warnf(&w, "error reading %s: %s; kept the entries read before it", path,
                  errstr(r.err, eb, sizeof eb));
        break;
    case RS_MISSING:
        break;
    case RS_EMPTY:
        warnf(&w, "the autotune cache %s is empty; starting with an empty cache", path);
        break;
    case RS_BAD_HEADER:
        warnf(&w, "%s is not an awq_fast_dequant autotune cache (unrecognised first line); "
                  "ignored it",
              path);
        break;
    case RS_OLD:
        warnf(&w, "the autotune cache %s has format v%ld, written by an older awq_fast_dequant "
                  "for other kernels; ignored it (shapes are tuned again, and the next save "
                  "replaces it)",
              path, r.version);
        break;
    case RS_FUTURE:
        warnf(&w, "the autotune cache %s has format v%ld, newer than this build's v%d; "
                  "ignored it",
              path, r.version, AWQ_TUNE_FORMAT_VERSION);
        break;
    case RS_ERROR:
        warnf(&w, "cannot read the autotune cache %s: %s; starting with an empty cache", path,
              errstr(r.err, eb, sizeof eb));
        break;
    case RS_NOT_REGULAR:
        warnf(&w, "cannot read the autotune cache %s: not a regular file; ignored it", path);
        break;
    case RS_NOMEM:
        warnf(&w, "out of memory reading the autotune cache %s", path);
        break;
    }
    awq_table_free(disk);
    return w.len && w.buf[0] ? 1 : 0;
}

/* ======================================================================
 * Writing a file
 * ====================================================================== */

/* dir receives the folder of path ("." for a bare name).  -1 when path
 * has no file name or does not fit. */
static int split_path(const char *path, char *dir, size_t dir_len, const char **base)
{
    size_t len = strlen(path);
    if (len == 0 || len >= PATH_MAX - 64 || path[len - 1] == '/')
        return -1;
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(dir, dir_len, ".");
        *base = path;
    } else {
        size_t dlen = slash == path ? 1 : (size_t)(slash - path);
        if (dlen >= dir_len)
            return -1;
        memcpy(dir, path, dlen);
        dir[dlen] = '\0';
        *base = slash + 1;
    }
    return 0;
}

/* mkdir -p.  0, or -1 with *err. */
static int make_dirs(const char *dir, int *err)
{
    char buf[PATH_MAX];
    size_t len = strlen(dir);
    if (len >= sizeof buf) {
        *err = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, dir, len + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
            *err = errno;
            return -1;
        }
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
        *err = errno;
        return -1;
    }
    struct stat st;
    if (stat(buf, &st) != 0) {
        *err = errno;
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        *err = ENOTDIR;
        return -1;
    }
    return 0;
}

/* Opens PATH.lock and holds flock(LOCK_EX) on it; returns the fd (closing
 * it unlocks) or -1 with *err.  The lock file is never removed: removing
 * it would let two writers hold locks on two different files. */
static int lock_cache(const char *path, int *err)
{
    char lock_path[PATH_MAX];
    if ((size_t)snprintf(lock_path, sizeof lock_path, "%s.lock", path) >= sizeof lock_path) {
        *err = ENAMETOOLONG;
        return -1;
    }
    int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    while (flock(fd, LOCK_EX) != 0) {
        if (errno != EINTR) {
            *err = errno;
            close(fd);
            return -1;
        }
    }
    return fd;
}

/* Under the lock no other writer is between create and rename, so every
 * BASE.tmp.* in the folder is left over from a crash: remove it. */
static void remove_stale_temps(const char *dir, const char *base)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    char prefix[PATH_MAX];
    int plen = snprintf(prefix, sizeof prefix, "%s.tmp.", base);
    if (plen > 0 && (size_t)plen < sizeof prefix) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strncmp(e->d_name, prefix, (size_t)plen) != 0)
                continue;
            char full[PATH_MAX];
            if ((size_t)snprintf(full, sizeof full, "%s/%s", dir, e->d_name) < sizeof full)
                (void)unlink(full);
        }
    }
    closedir(d);
}

static int entry_cmp(const void *pa, const void *pb)
{
    const awq_tune_key *a = &((const table_entry *)pa)->key;
    const awq_tune_key *b = &((const table_entry *)pb)->key;
    int c = strcmp(a->device, b->device);
    if (c)
        return c;
#define CMP_FIELD(f)                                                                              \
    if (a->f != b->f)                                                                             \
        return a->f < b->f ? -1 : 1;
    CMP_FIELD(gen)
    CMP_FIELD(K)
    CMP_FIELD(N)
    CMP_FIELD(G)
    CMP_FIELD(scale_dtype)
    CMP_FIELD(out_dtype)
#undef CMP_FIELD
    return 0;
}

/* Every entry, sorted so that the file reads well and diffs cleanly. */
static table_entry *sorted_entries(awq_table *t, size_t *n)
{
    for (;;) {
        size_t want = awq_table_size(t);
        table_entry *e = malloc((want ? want : 1) * sizeof *e);
        if (!e)
            return NULL;
        pthread_mutex_lock(&t->mu);
        size_t got = 0;
        if (t->size <= want) {
            for (size_t i = 0; i < t->cap; i++)
                if (t->hashes[i] != 0)
                    e[got++] = t->entries[i];
        }
        int fits = t->size <= want;
        pthread_mutex_unlock(&t->mu);
        if (fits) {
            qsort(e, got, sizeof *e, entry_cmp);
            *n = got;
            return e;
        }
        free(e); /* another thread added entries meanwhile: try again */
    }
}

/* PATH.tmp.<pid>.<64 random bits>: unique among threads and processes. */
static void temp_name(const char *path, char *buf, size_t len)
{
    static atomic_uint_fast64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                 (uint64_t)atomic_fetch_add(&counter, 1) * UINT64_C(0x9e3779b97f4a7c15) ^
                 (uint64_t)(uintptr_t)buf;
    snprintf(buf, len, "%s.tmp.%ld.%016llx", path, (long)getpid(),
             (unsigned long long)mix64(x ^ (uint64_t)getpid() << 40));
}

/* Writes the whole file to tmp and fsyncs it.  0, or -1 with *err (tmp
 * removed).  Caller is in the C numeric locale. */
static int write_temp(const char *path, char *tmp, size_t tmp_len, const table_entry *e,
                      size_t n, int *err)
{
    int fd = -1;
    for (int attempt = 0; attempt < 16 && fd < 0; attempt++) {
        temp_name(path, tmp, tmp_len);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        *err = errno;
        close(fd);
        unlink(tmp);
        return -1;
    }
    int ok = fprintf(f,
                     "%s%d\n"
                     "# One tuned launch configuration per line, fields separated by one tab:\n"
                     "# device\tgen\tK\tN\tG\tscales\tout\tkernel\tblock_size\trows\tthreads\tchunk"
                     "\tus\n"
                     "# gen: the generation of the kernels the entry was tuned for; each build "
                     "uses its own.\n"
                     "# 0 means \"the kernel's default\"; us is the measured time in "
                     "microseconds. Safe to delete.\n",
                     header_prefix, AWQ_TUNE_FORMAT_VERSION) > 0;
    for (size_t i = 0; ok && i < n; i++) {
        const awq_tune_key *k = &e[i].key;
        const awq_tune_value *v = &e[i].val;
        char us[32];
        format_us(v->us, us, sizeof us);
        ok = fprintf(f, "%s\t%d\t%lld\t%lld\t%lld\t%s\t%s\t%s\t%d\t%d\t%d\t%lld\t%s\n", k->device,
                     k->gen, (long long)k->K, (long long)k->N, (long long)k->G,
                     dtype_names[k->scale_dtype], dtype_names[k->out_dtype],
                     kernel_names[v->config.kernel], v->config.block_size, v->config.rows,
                     v->config.threads, (long long)v->config.chunk, us) > 0;
    }
    if (!ok || fflush(f) != 0 || ferror(f)) {
        *err = errno ? errno : EIO;
        fclose(f);
        unlink(tmp);
        return -1;
    }
    if (fsync(fileno(f)) != 0) {
        *err = errno;
        fclose(f);
        unlink(tmp);
        return -1;
    }
    if (fclose(f) != 0) {
        *err = errno;
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Makes the rename durable; best effort (some file systems refuse). */
static void sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

int awq_table_save(awq_table *t, const char *path, char *warn, size_t warn_len)
{
    warn_sink w = warn_start(warn, warn_len);
    char eb[128], dir[PATH_MAX], tmp[PATH_MAX + 64];
    const char *base;
    int err = 0;
    if (!t || !path || split_path(path, dir, sizeof dir, &base) != 0) {
        warnf(&w, "invalid autotune cache path %s; the results stay in memory",
              path ? path : "(null)");
        return 1;
    }
    if (make_dirs(dir, &err) != 0) {
        warnf(&w, "cannot create the autotune cache folder %s: %s; the results stay in memory",
              dir, errstr(err, eb, sizeof eb));
        return 1;
    }
    int lock_fd = lock_cache(path, &err);
    if (lock_fd < 0) {
        warnf(&w, "cannot lock the autotune cache %s.lock: %s; the results stay in memory",
              path, errstr(err, eb, sizeof eb));
        return 1;
    }

    c_numeric loc;
    c_numeric_enter(&loc);
    table_entry *entries = NULL;
    awq_table *disk = awq_table_new();
    read_report r = {.state = RS_NOMEM};
    if (disk)
        read_cache_file(path, disk, &r);

    switch (r.state) {
    case RS_OK:
    case RS_MISSING:
    case RS_EMPTY:
    case RS_BAD_HEADER:
    case RS_OLD:
        /* Damage (or an old format) that load already reported; the rewrite
         * replaces it. */
        break;
    case RS_FUTURE:
        warnf(&w, "the autotune cache %s has format v%ld, newer than this build's v%d; "
                  "left it unchanged, the results stay in memory",
              path, r.version, AWQ_TUNE_FORMAT_VERSION);
        goto done;
    case RS_ERROR:
        warnf(&w, "cannot read the autotune cache %s (%s) to merge it; left it unchanged, "
                  "the results stay in memory",
              path, errstr(r.err, eb, sizeof eb));
        goto done;
    case RS_NOT_REGULAR:
        warnf(&w, "the autotune cache %s is not a regular file; left it unchanged, the results "
                  "stay in memory",
              path);
        goto done;
    case RS_NOMEM:
        warnf(&w, "out of memory saving the autotune cache %s", path);
        goto done;
    }
    if (r.state == RS_OK && r.err) {
        /* Part of the file could not be read: rewriting would drop it. */
        warnf(&w, "error reading the autotune cache %s (%s); left it unchanged, the results "
                  "stay in memory",
              path, errstr(r.err, eb, sizeof eb));
        goto done;
    }
    size_t n = 0;
    if (merge_missing(t, disk) != 0 || !(entries = sorted_entries(t, &n))) {
        warnf(&w, "out of memory saving the autotune cache %s", path);
        goto done;
    }
    remove_stale_temps(dir, base);
    if (write_temp(path, tmp, sizeof tmp, entries, n, &err) != 0) {
        warnf(&w, "cannot write the autotune cache %s: %s; the results stay in memory", path,
              errstr(err, eb, sizeof eb));
        goto done;
    }
    if (rename(tmp, path) != 0) {
        err = errno;
        unlink(tmp);
        warnf(&w, "cannot replace the autotune cache %s: %s; the results stay in memory", path,
              errstr(err, eb, sizeof eb));
        goto done;
    }
    sync_dir(dir);
done:
    c_numeric_leave(&loc);
    free(entries);
    awq_table_free(disk);
    close(lock_fd); /* releases the flock */
    return w.len && w.buf[0] ? 1 : 0;
}

int awq_cache_remove(const char *path, char *warn, size_t warn_len)
{
    warn_sink w = warn_start(warn, warn_len);
    char eb[128], dir[PATH_MAX];
    const char *base;
    int err = 0;
    if (!path || split_path(path, dir, sizeof dir, &base) != 0) {
        warnf(&w, "invalid autotune cache path %s", path ? path : "(null)");
        return 1;
    }
    struct stat st;
    if (stat(dir, &st) != 0 && errno == ENOENT)
        return 0; /* no folder, no file */
    int lock_fd = lock_cache(path, &err);
    if (lock_fd < 0) {
        warnf(&w, "cannot lock the autotune cache %s.lock: %s", path, errstr(err, eb, sizeof eb));
        return 1;
    }
    if (unlink(path) != 0 && errno != ENOENT)
        warnf(&w, "cannot remove the autotune cache %s: %s", path,
              errstr(errno, eb, sizeof eb));
    close(lock_fd);
    return w.len && w.buf[0] ? 1 : 0;
}

/* ======================================================================
 * Tuning
 * ====================================================================== */

awq_status awq_tune(const awq_problem *p, const awq_config *candidates, int n, awq_time_fn time_fn,
                    void *ctx, awq_tune_value *best, int *detail)
{
    if (detail)
        *detail = 0;
    if (!p || !candidates || n <= 0 || !time_fn || !best)
        return AWQ_ERR_CONFIG;
    awq_tune_value b = {{0}, 0.0f};
    float b_rank = 0.0f; /* b.us, or the default's handicapped time */
    int found = 0;
    for (int i = 0; i < n; i++) {
        float us = 0.0f;
        int d = 0;
        awq_status s = time_fn(p, &candidates[i], &us, &d, ctx);
        if (s == AWQ_ERR_CONFIG)
            continue;
        if (s != AWQ_OK) {
            if (detail)
                *detail = d;
            return s;
        }
        if (!isfinite(us) || us < 0.0f)
            continue;
        const float rank = i == 0 ? us * AWQ_TUNE_DEFAULT_MARGIN : us;
        if (!found || rank < b_rank) {
            b.config = candidates[i];
            b.us = us;
            b_rank = rank;
            found = 1;
        }
    }
    if (!found)
        return AWQ_ERR_CONFIG;
    *best = b;
    return AWQ_OK;
}

int awq_cpu_candidates(const awq_problem *p, awq_config *configs, int cap)
{
    static const int64_t chunks[] = {8, 32, 128, 512};
    if (!configs || cap <= 0)
        return 0;
    int n = 0;
    configs[n++] = (awq_config){.kernel = AWQ_KERNEL_CPU}; /* the default: ties keep it */
    if (!p || p->K <= 0)
        return n;

    int max_threads = awq_cpu_max_threads();
    if (max_threads < 1)
        max_threads = 1;
    int threads[34], nt = 0;
    for (int t = 1; t < max_threads && nt < 32; t *= 2)
        threads[nt++] = t;
    threads[nt++] = max_threads;

    for (int ti = 0; ti < nt; ti++) {
        for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
            if (ci > 0 && chunks[ci - 1] >= p->K)
                break; /* the previous chunk already held all of K */
            int64_t items = (p->K + chunks[ci] - 1) / chunks[ci];
            if (threads[ti] > 1 && threads[ti] > items)
                continue; /* some threads would have nothing to do */
            if (n == cap)
                return n;
            configs[n++] = (awq_config){
                .kernel = AWQ_KERNEL_CPU, .threads = threads[ti], .chunk = chunks[ci]};
        }
    }
    return n;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

awq_status awq_cpu_time(const awq_problem *p, const awq_config *c, float *us, int *detail,
                        void *ctx)
{
    const awq_cpu_timing *o = ctx;
    int warmup = o ? o->warmup : 1;
    int runs = o ? o->runs : 3;
    double budget = o ? o->budget_us : 20000.0;
    if (detail)
        *detail = 0;
    if (runs < 1)
        runs = 1;
    for (int i = 0; i < warmup; i++) {
        awq_status s = awq_cpu_dequantize(p, c);
        if (s != AWQ_OK)
            return s;
    }
    double best = 0.0, spent = 0.0;
    for (int i = 0; i < runs; i++) {
        double t0 = now_us();
        awq_status s = awq_cpu_dequantize(p, c);
        double dt = now_us() - t0;
        if (s != AWQ_OK)
            return s;
        if (i == 0 || dt < best)
            best = dt;
        spent += dt;
        if (budget > 0.0 && spent >= budget)
            break;
    }
    *us = (float)best;
    return AWQ_OK;
}
