/*
 * autotune/file.c -- the autotune table's file (format and rules in
 * autotune.h; contract in DESIGN.md section 5).
 *
 * A bounded line reader (no line can make us allocate), strict field
 * parsing, and a save that merges under flock and replaces the file by
 * rename, so that readers never see a partial file.  Nothing here is ever
 * fatal: problems become one warning text and the table in memory stays.
 */
#define _POSIX_C_SOURCE 200809L

#include "autotune/autotune.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
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

#define FIELDS_PER_LINE 16

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
    if (parse_int(f[1], &k->gen) || awq_tune_op_parse(f[2], &k->op) ||
        parse_nonneg(f[3], &k->K) || parse_nonneg(f[4], &k->N) || parse_nonneg(f[5], &k->G) ||
        parse_nonneg(f[6], &k->m) || awq_dtype_parse(f[7], &k->scale_dtype) ||
        awq_dtype_parse(f[8], &k->out_dtype) || awq_kernel_parse(f[9], &kernel) ||
        parse_int(f[10], &v->config.block_size) || parse_int(f[11], &v->config.rows) ||
        parse_int(f[12], &v->config.split) || parse_int(f[13], &v->config.threads) ||
        parse_nonneg(f[14], &v->config.chunk) || parse_us(f[15], &v->us))
        return -1;
    v->config.kernel = (int)kernel;
    return awq_tune_entry_valid(k, v) ? 0 : -1;
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
        if (awq_table_put(into, &k, &v) != 0) {
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
        if (awq_table_merge_missing(t, disk) != 0)
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

/* The file a path names, through symbolic links: a cache file that is a
 * link (to a shared or versioned file) is updated where it points, and the
 * link stays a link.  A dangling link resolves to the file it would name,
 * which a save then creates.  0 with out filled, or -1 (too long, a loop). */
static int resolve_links(const char *path, char *out, size_t out_len)
{
    char cur[PATH_MAX], target[PATH_MAX];
    if (strlen(path) >= sizeof cur)
        return -1;
    strcpy(cur, path);
    for (int hops = 0; hops < 40; hops++) {
        struct stat st;
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode)) {
            if (strlen(cur) >= out_len)
                return -1;
            strcpy(out, cur);
            return 0;
        }
        ssize_t n = readlink(cur, target, sizeof target - 1);
        if (n <= 0)
            return -1;
        target[n] = '\0';
        if (target[0] == '/') {
            strcpy(cur, target);
        } else { /* relative to the link's folder */
            char *slash = strrchr(cur, '/');
            size_t dlen = slash ? (size_t)(slash - cur) + 1 : 0;
            if (dlen + (size_t)n >= sizeof cur)
                return -1;
            memmove(cur + dlen, target, (size_t)n + 1);
        }
    }
    return -1; /* a loop of links */
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
    const awq_tune_key *a = &((const awq_tune_entry *)pa)->key;
    const awq_tune_key *b = &((const awq_tune_entry *)pb)->key;
    int c = strcmp(a->device, b->device);
    if (c)
        return c;
#define CMP_FIELD(f)                                                                              \
    if (a->f != b->f)                                                                             \
        return a->f < b->f ? -1 : 1;
    CMP_FIELD(gen)
    CMP_FIELD(op)
    CMP_FIELD(K)
    CMP_FIELD(N)
    CMP_FIELD(G)
    CMP_FIELD(m)
    CMP_FIELD(scale_dtype)
    CMP_FIELD(out_dtype)
#undef CMP_FIELD
    return 0;
}

/* Every entry, sorted so that the file reads well and diffs cleanly. */
static awq_tune_entry *sorted_entries(awq_table *t, size_t *n)
{
    awq_tune_entry *e = awq_table_entries(t, n);
    if (e)
        qsort(e, *n, sizeof *e, entry_cmp);
    return e;
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
             (unsigned long long)awq_mix64(x ^ (uint64_t)getpid() << 40));
}

/* Writes the whole file to tmp and fsyncs it.  0, or -1 with *err (tmp
 * removed).  Caller is in the C numeric locale. */
static int write_temp(const char *path, char *tmp, size_t tmp_len, const awq_tune_entry *e,
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
                     "# device\tgen\top\tK\tN\tG\tM\tscales\tout\tkernel\tblock_size\trows\tsplit"
                     "\tthreads\tchunk\tus\n"
                     "# gen: the generation of the kernels the entry was tuned for; each build "
                     "uses its own.\n"
                     "# M: the bucket of rows of x (linear), 0 for dequantize.\n"
                     "# 0 means \"the kernel's default\"; us is the measured time in "
                     "microseconds. Safe to delete.\n",
                     header_prefix, AWQ_TUNE_FORMAT_VERSION) > 0;
    for (size_t i = 0; ok && i < n; i++) {
        const awq_tune_key *k = &e[i].key;
        const awq_tune_value *v = &e[i].val;
        char us[32];
        format_us(v->us, us, sizeof us);
        ok = fprintf(f, "%s\t%d\t%s\t%lld\t%lld\t%lld\t%lld\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%lld\t%s\n",
                     k->device, k->gen, awq_tune_op_name(k->op), (long long)k->K, (long long)k->N,
                     (long long)k->G, (long long)k->m, awq_dtype_name(k->scale_dtype),
                     awq_dtype_name(k->out_dtype), awq_kernel_name(v->config.kernel),
                     v->config.block_size, v->config.rows, v->config.split, v->config.threads,
                     (long long)v->config.chunk, us) > 0;
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

int awq_table_save(awq_table *t, const char *link_path, char *warn, size_t warn_len)
{
    warn_sink w = warn_start(warn, warn_len);
    char eb[128], dir[PATH_MAX], tmp[PATH_MAX + 64], path[PATH_MAX];
    const char *base;
    int err = 0;
    if (!t || !link_path || resolve_links(link_path, path, sizeof path) != 0 ||
        split_path(path, dir, sizeof dir, &base) != 0) {
        warnf(&w, "invalid autotune cache path %s; the results stay in memory",
              link_path ? link_path : "(null)");
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
    awq_tune_entry *entries = NULL;
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
    if (awq_table_merge_missing(t, disk) != 0 || !(entries = sorted_entries(t, &n))) {
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

int awq_cache_remove(const char *link_path, char *warn, size_t warn_len)
{
    warn_sink w = warn_start(warn, warn_len);
    char eb[128], dir[PATH_MAX], path[PATH_MAX];
    const char *base;
    int err = 0;
    if (!link_path || resolve_links(link_path, path, sizeof path) != 0 ||
        split_path(path, dir, sizeof dir, &base) != 0) {
        warnf(&w, "invalid autotune cache path %s", link_path ? link_path : "(null)");
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

