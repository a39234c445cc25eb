/*
 * test_autotune.c -- standalone test of csrc/autotune/ (table, file, tuner) and csrc/cpu/tune.c.
 *
 * Build and run from the repository root (or `make -C tests/c`):
 *   gcc -std=c11 -Wall -Wextra -O1 -fsanitize=address,undefined -pthread -Icsrc \
 *       tests/c/test_autotune.c csrc/autotune/{table,file,tune}.c csrc/cpu/tune.c \
 *       tests/c/stubs.c -o build/test_autotune \
 *   && build/test_autotune
 * Exit status 0 when every check passed.  Files go to a fresh folder under
 * $TMPDIR (or /tmp), removed at the end.
 */
#define _XOPEN_SOURCE 700

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "autotune/autotune.h"
#include "cpu/cpu.h"

extern awq_status stub_status; /* stubs.c */

#include "check.h"

#define CHECK_WARN(warn, needle)                                                                  \
    do {                                                                                          \
        checks++;                                                                                 \
        if (!strstr((warn), (needle))) {                                                          \
            failures++;                                                                           \
            fprintf(stderr, "%s:%d: warning \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, (warn),   \
                    (needle));                                                                    \
        }                                                                                         \
    } while (0)

static char root[256]; /* the test's temp folder */

/* ---- helpers ------------------------------------------------------------ */

static const char *devices[] = {"NVIDIA H200 sm_90", "cpu x86_64 16t", "NVIDIA A100-SXM4-80GB sm_80"};

/* Key i: distinct for every i (K differs); generations 1 and 2 alternate. */
static awq_tune_key key_of(int i)
{
    awq_tune_key k;
    int rc = awq_tune_key_init(&k, devices[i % 3], 1 + i % 2, 128 * (int64_t)(i + 1),
                               8 * (int64_t)(i % 5 + 1), 128, (awq_dtype)(i % 3),
                               (awq_dtype)(i / 3 % 3));
    if (rc != 0) {
        fprintf(stderr, "key_of(%d) invalid\n", i);
        exit(2);
    }
    return k;
}

static awq_tune_value val_of(int i)
{
    awq_tune_value v;
    memset(&v, 0, sizeof v);
    v.config.kernel = 1 + i % 5;
    v.config.block_size = 32 * (1 + i % 32);
    v.config.rows = i % 8 ? 1 << (i % 7) : 0; /* 0, or 1..64 */
    v.config.threads = i % 17;
    v.config.chunk = (int64_t)i * 3;
    v.us = 0.1f + (float)i * 0.37f;
    return v;
}

static int val_eq(const awq_tune_value *a, const awq_tune_value *b)
{
    return a->config.kernel == b->config.kernel && a->config.block_size == b->config.block_size &&
           a->config.rows == b->config.rows && a->config.split == b->config.split &&
           a->config.threads == b->config.threads &&
           a->config.chunk == b->config.chunk && a->us == b->us;
}

static int has_val(awq_table *t, int i, int j) /* key i holds val_of(j) */
{
    awq_tune_key k = key_of(i);
    awq_tune_value v, want = val_of(j);
    return awq_table_get(t, &k, &v) == 1 && val_eq(&v, &want);
}

static void path_in(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", root, name);
}

static void write_bytes(const char *path, const void *data, size_t len)
{
    unlink(path); /* a fresh file: ext4 flushes a truncated one on close */
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
}

static void write_text(const char *path, const char *s) { write_bytes(path, s, strlen(s)); }

/* Whole file into a malloc'd buffer (NUL-terminated); *len its size. */
static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf)
        buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    chmod(p, 0700);
    return remove(p);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the table ---------------------------------------------------------- */

static void test_basic(void)
{
    awq_table *t = awq_table_new();
    CHECK(t != NULL);
    awq_tune_key k = key_of(1);
    awq_tune_value v = val_of(1), got;
    CHECK(awq_table_size(t) == 0);
    CHECK(awq_table_get(t, &k, &got) == 0);
    CHECK(awq_table_put(t, &k, &v) == 0);
    CHECK(awq_table_size(t) == 1);
    CHECK(awq_table_get(t, &k, &got) == 1 && val_eq(&got, &v));
    CHECK(awq_table_get(t, &k, NULL) == 1);

    /* update: same key, new value, same size */
    awq_tune_value v2 = val_of(2);
    CHECK(awq_table_put(t, &k, &v2) == 0);
    CHECK(awq_table_size(t) == 1);
    CHECK(awq_table_get(t, &k, &got) == 1 && val_eq(&got, &v2));

    /* each key field matters */
    awq_tune_key a = k;
    a.K += 128;
    CHECK(awq_table_get(t, &a, NULL) == 0);
    a = k;
    a.N += 8;
    CHECK(awq_table_get(t, &a, NULL) == 0);
    a = k;
    a.G = 64;
    CHECK(awq_table_get(t, &a, NULL) == 0);
    a = k;
    a.scale_dtype = (awq_dtype)((a.scale_dtype + 1) % 3);
    CHECK(awq_table_get(t, &a, NULL) == 0);
    a = k;
    a.out_dtype = (awq_dtype)((a.out_dtype + 1) % 3);
    CHECK(awq_table_get(t, &a, NULL) == 0);
    a = k;
    strcpy(a.device, "cpu x86_64 15t");
    CHECK(awq_table_get(t, &a, NULL) == 0);

    /* bytes after the device's NUL are not part of the key */
    a = k;
    memset(a.device + strlen(a.device) + 1, 'x', AWQ_TUNE_DEVICE_LEN - strlen(a.device) - 1);
    CHECK(awq_table_get(t, &a, NULL) == 1);
    awq_tune_key snap;
    CHECK(awq_table_snapshot(t, &snap, NULL, 1) == 1);
    CHECK(snap.device[AWQ_TUNE_DEVICE_LEN - 1] == '\0');

    /* invalid keys and values are refused, and never found */
    awq_tune_key bad = k;
    strcpy(bad.device, "tab\there");
    CHECK(awq_table_put(t, &bad, &v) == -2);
    strcpy(bad.device, "#comment");
    CHECK(awq_table_put(t, &bad, &v) == -2);
    strcpy(bad.device, "line\nbreak");
    CHECK(awq_table_put(t, &bad, &v) == -2);
    bad.device[0] = '\0';
    CHECK(awq_table_put(t, &bad, &v) == -2);
    memset(bad.device, 'd', sizeof bad.device); /* not terminated */
    CHECK(awq_table_put(t, &bad, &v) == -2);
    CHECK(awq_table_get(t, &bad, NULL) == 0);
    bad = k;
    bad.G = 0;
    CHECK(awq_table_put(t, &bad, &v) == -2);
    bad = k;
    bad.K = 100; /* G = 128 does not divide it */
    CHECK(awq_table_put(t, &bad, &v) == -2);
    bad = k;
    bad.N = 12;
    CHECK(awq_table_put(t, &bad, &v) == -2);
    bad = k;
    bad.out_dtype = (awq_dtype)7;
    CHECK(awq_table_put(t, &bad, &v) == -2);
    awq_tune_value bv = v;
    bv.config.kernel = AWQ_KERNEL_AUTO;
    CHECK(awq_table_put(t, &k, &bv) == -2);
    bv = v;
    bv.config.block_size = 48;
    CHECK(awq_table_put(t, &k, &bv) == -2);
    bv = v;
    bv.config.rows = 3;
    CHECK(awq_table_put(t, &k, &bv) == -2);
    bv.config.rows = 128;
    CHECK(awq_table_put(t, &k, &bv) == -2);
    bv = v;
    bv.us = -1.0f;
    CHECK(awq_table_put(t, &k, &bv) == -2);
    bv = v;
    bv.us = NAN;
    CHECK(awq_table_put(t, &k, &bv) == -2);
    CHECK(awq_table_size(t) == 1);

    /* key_init */
    char longdev[200];
    memset(longdev, 'a', sizeof longdev - 1);
    longdev[sizeof longdev - 1] = '\0';
    CHECK(awq_tune_key_init(&a, longdev, 1, 128, 8, 128, AWQ_F16, AWQ_F16) == -1);
    longdev[AWQ_TUNE_DEVICE_LEN - 1] = '\0'; /* 95 chars: fits */
    CHECK(awq_tune_key_init(&a, longdev, 1, 128, 8, 128, AWQ_F16, AWQ_F16) == 0);
    CHECK(awq_tune_key_init(&a, "cpu", 1, 0, 0, 7, AWQ_F16, AWQ_F32) == 0); /* empty matrix */
    CHECK(awq_tune_key_init(&a, "cpu", 0, 128, 8, 128, AWQ_F16, AWQ_F16) == -1); /* gen 0 */
    CHECK(awq_tune_key_init(&a, "cpu", -1, 128, 8, 128, AWQ_F16, AWQ_F16) == -1);

    /* the generation is part of the key: one shape, two generations, two entries */
    awq_tune_key g1, g2;
    awq_tune_value gv1 = v, gv2 = v;
    gv1.config.block_size = 64;
    gv2.config.block_size = 512;
    CHECK(awq_tune_key_init(&g1, "gen test", 1, 256, 16, 128, AWQ_F16, AWQ_F16) == 0);
    CHECK(awq_tune_key_init(&g2, "gen test", 2, 256, 16, 128, AWQ_F16, AWQ_F16) == 0);
    size_t before = awq_table_size(t);
    CHECK(awq_table_put(t, &g1, &gv1) == 0 && awq_table_put(t, &g2, &gv2) == 0);
    CHECK(awq_table_size(t) == before + 2);
    CHECK(awq_table_get(t, &g1, &got) && got.config.block_size == 64);
    CHECK(awq_table_get(t, &g2, &got) && got.config.block_size == 512);
    g2.gen = 3;
    CHECK(!awq_table_get(t, &g2, &got));

    /* names */
    awq_dtype dt;
    awq_kernel kn;
    CHECK(strcmp(awq_dtype_name(AWQ_BF16), "bfloat16") == 0);
    CHECK(awq_dtype_name(3) == NULL && awq_kernel_name(-1) == NULL);
    CHECK(awq_dtype_parse("float32", &dt) == 0 && dt == AWQ_F32);
    CHECK(awq_dtype_parse("float64", &dt) == -1);
    CHECK(awq_kernel_parse("cpu", &kn) == 0 && kn == AWQ_KERNEL_CPU);
    CHECK(awq_kernel_parse("V4", &kn) == -1);

    awq_table_clear(t);
    CHECK(awq_table_size(t) == 0);
    CHECK(awq_table_get(t, &k, NULL) == 0);
    CHECK(awq_table_put(t, &k, &v) == 0 && awq_table_size(t) == 1);
    awq_table_free(t);
    awq_table_free(NULL);
}

static void test_growth(void)
{
    enum { N = 20000 };
    awq_table *t = awq_table_new();
    for (int i = 0; i < N; i++) {
        awq_tune_key k = key_of(i);
        awq_tune_value v = val_of(i);
        if (awq_table_put(t, &k, &v) != 0) {
            CHECK(!"put failed");
            break;
        }
    }
    CHECK(awq_table_size(t) == N);
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += !has_val(t, i, i);
    CHECK(bad == 0);
    int found = 0; /* absent keys: beyond the range, and other devices */
    for (int i = N; i < 2 * N; i++) {
        awq_tune_key k = key_of(i);
        found += awq_table_get(t, &k, NULL);
        k = key_of(i - N);
        strcpy(k.device, "absent device");
        found += awq_table_get(t, &k, NULL);
    }
    CHECK(found == 0);

    /* update everything after growth */
    for (int i = 0; i < N; i += 2) {
        awq_tune_key k = key_of(i);
        awq_tune_value v = val_of(i + 1);
        awq_table_put(t, &k, &v);
    }
    CHECK(awq_table_size(t) == N);
    bad = 0;
    for (int i = 0; i < N; i++)
        bad += !has_val(t, i, i % 2 ? i : i + 1);
    CHECK(bad == 0);

    /* snapshot */
    awq_tune_key *keys = malloc(N * sizeof *keys);
    awq_tune_value *vals = malloc(N * sizeof *vals);
    CHECK(awq_table_snapshot(t, keys, vals, N) == N);
    CHECK(awq_table_snapshot(t, keys, vals, 10) == 10);
    CHECK(awq_table_snapshot(t, NULL, NULL, 0) == 0);
    size_t n = awq_table_snapshot(t, keys, vals, N);
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        awq_tune_value v;
        bad += !(awq_table_get(t, &keys[i], &v) && val_eq(&v, &vals[i]));
    }
    CHECK(bad == 0);
    free(keys);
    free(vals);

    /* lookup cost of a hit */
    awq_tune_key k = key_of(777);
    awq_tune_value v;
    const int reps = 1000000;
    double t0 = now_s();
    int hits = 0;
    for (int i = 0; i < reps; i++)
        hits += awq_table_get(t, &k, &v);
    double ns = (now_s() - t0) / reps * 1e9;
    CHECK(hits == reps);
#ifndef __SANITIZE_THREAD__ /* ThreadSanitizer makes every lock many times slower */
    CHECK(ns < 1000.0);
#endif
    printf("  cache-hit lookup: %.1f ns (table of %d entries, this build)\n", ns, N);

    awq_table_clear(t);
    CHECK(awq_table_size(t) == 0 && !has_val(t, 5, 5));
    awq_table_free(t);
}

typedef struct {
    awq_table *t;
    int id;
    int errors;
} shared_arg;

static void *shared_worker(void *p)
{
    shared_arg *a = p;
    for (int i = 0; i < 2000; i++) {
        int j = a->id * 2000 + i;
        awq_tune_key k = key_of(j);
        awq_tune_value v = val_of(j);
        if (awq_table_put(a->t, &k, &v) != 0)
            a->errors++;
        if (!has_val(a->t, j, j))
            a->errors++;
        int m = (j * 7919) % 16000; /* another thread's key: present or not yet */
        awq_tune_key other = key_of(m);
        awq_tune_value ov, want = val_of(m);
        if (awq_table_get(a->t, &other, &ov) && !val_eq(&ov, &want))
            a->errors++;
    }
    return NULL;
}

static void test_threads_shared_table(void)
{
    awq_table *t = awq_table_new();
    pthread_t th[8];
    shared_arg args[8];
    for (int i = 0; i < 8; i++) {
        args[i] = (shared_arg){t, i, 0};
        pthread_create(&th[i], NULL, shared_worker, &args[i]);
    }
    int errors = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        errors += args[i].errors;
    }
    CHECK(errors == 0);
    CHECK(awq_table_size(t) == 16000);
    int bad = 0;
    for (int i = 0; i < 16000; i++)
        bad += !has_val(t, i, i);
    CHECK(bad == 0);
    awq_table_free(t);
}

/* ---- the file ----------------------------------------------------------- */

static void test_round_trip(void)
{
    char path[512], warn[512];
    path_in(path, sizeof path, "new/sub/dir/autotune.txt"); /* folders made by save */
    awq_table *t = awq_table_new();
    for (int i = 0; i < 1000; i++) {
        awq_tune_key k = key_of(i);
        awq_tune_value v = val_of(i);
        awq_table_put(t, &k, &v);
    }
    /* awkward but legal values */
    awq_tune_key k;
    awq_tune_value v = {{.kernel = AWQ_KERNEL_CPU}, 0.0f};
    awq_tune_key_init(&k, " spaced  device ", 7, 0, 0, 1, AWQ_F32, AWQ_BF16);
    awq_table_put(t, &k, &v);
    v.us = 3.4e38f;
    awq_tune_key_init(&k, "x", INT_MAX, 1, 8, 1, AWQ_F16, AWQ_F16);
    awq_table_put(t, &k, &v);
    v.us = 1.17549435e-38f;
    v.config.chunk = INT64_MAX;
    awq_tune_key_init(&k, "x", 1, 2, 8, 1, AWQ_F16, AWQ_F16);
    awq_table_put(t, &k, &v);

    CHECK(awq_table_save(t, path, warn, sizeof warn) == 0);
    CHECK(warn[0] == '\0');
    char lockp[600];
    snprintf(lockp, sizeof lockp, "%s.lock", path);
    CHECK(exists(path) && exists(lockp));

    size_t len;
    char *text = read_all(path, &len);
    CHECK(text && strncmp(text, "# awq_fast_dequant autotune cache v3\n", 37) == 0);
    CHECK(text && text[len - 1] == '\n');
    CHECK(text &&
          strstr(text, "NVIDIA H200 sm_90\t1\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tv1\t32\t0\t0\t0\t0\t0.1\n"));
    free(text);

    awq_table *u = awq_table_new();
    CHECK(awq_table_load(u, path, warn, sizeof warn) == 0 && warn[0] == '\0');
    CHECK(awq_table_size(u) == awq_table_size(t));
    size_t n = awq_table_size(t);
    awq_tune_key *keys = malloc(n * sizeof *keys);
    awq_tune_value *vals = malloc(n * sizeof *vals);
    n = awq_table_snapshot(t, keys, vals, n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        awq_tune_value got;
        bad += !(awq_table_get(u, &keys[i], &got) && val_eq(&got, &vals[i]));
    }
    CHECK(bad == 0);
    free(keys);
    free(vals);

    /* saving again gives the same bytes (sorted, deterministic) */
    char *first = read_all(path, NULL);
    CHECK(awq_table_save(u, path, warn, sizeof warn) == 0);
    char *second = read_all(path, NULL);
    CHECK(first && second && strcmp(first, second) == 0);
    free(first);
    free(second);

    /* a number-formatting locale does not leak into the file */
    if (setlocale(LC_NUMERIC, "de_DE.UTF-8") || setlocale(LC_NUMERIC, "fr_FR.UTF-8")) {
        awq_table *w = awq_table_new();
        CHECK(awq_table_load(w, path, warn, sizeof warn) == 0 && awq_table_size(w) == n);
        CHECK(has_val(w, 3, 3));
        CHECK(awq_table_save(w, path, warn, sizeof warn) == 0);
        char *third = read_all(path, NULL);
        CHECK(third && strstr(third, "\t0.1\n"));
        free(third);
        awq_table_free(w);
        setlocale(LC_NUMERIC, "C");
    } else {
        printf("  (no de_DE/fr_FR locale installed: locale check skipped)\n");
    }

    /* remove */
    CHECK(awq_cache_remove(path, warn, sizeof warn) == 0 && !exists(path));
    CHECK(awq_cache_remove(path, warn, sizeof warn) == 0);
    awq_table *e = awq_table_new();
    CHECK(awq_table_load(e, path, warn, sizeof warn) == 0 && warn[0] == '\0');
    CHECK(awq_table_size(e) == 0);
    awq_table_free(e);
    awq_table_free(t);
    awq_table_free(u);
}

static void test_merge_two_tables(void)
{
    char path[512], warn[512];
    path_in(path, sizeof path, "merge.txt");
    awq_table *a = awq_table_new(), *b = awq_table_new();
    for (int i = 0; i < 3; i++) {
        awq_tune_key k = key_of(i);
        awq_tune_value v = val_of(i);
        awq_table_put(a, &k, &v);
    }
    for (int i = 3; i < 5; i++) {
        awq_tune_key k = key_of(i);
        awq_tune_value v = val_of(i);
        awq_table_put(b, &k, &v);
    }
    awq_tune_key shared = key_of(100);
    awq_tune_value va = val_of(200), vb = val_of(300);
    awq_table_put(a, &shared, &va);
    awq_table_put(b, &shared, &vb);

    CHECK(awq_table_save(a, path, warn, sizeof warn) == 0);
    CHECK(awq_table_save(b, path, warn, sizeof warn) == 0);
    CHECK(awq_table_size(a) == 4);
    CHECK(awq_table_size(b) == 6); /* b learned a's keys, kept its own value */
    CHECK(has_val(b, 0, 0) && has_val(b, 100, 300));

    awq_table *c = awq_table_new();
    CHECK(awq_table_load(c, path, warn, sizeof warn) == 0);
    CHECK(awq_table_size(c) == 6 && has_val(c, 100, 300) && has_val(c, 4, 4));

    CHECK(awq_table_save(a, path, warn, sizeof warn) == 0); /* ours win again */
    awq_table_clear(c);
    CHECK(awq_table_load(c, path, warn, sizeof warn) == 0);
    CHECK(awq_table_size(c) == 6 && has_val(c, 100, 200) && has_val(c, 3, 3));

    /* load keeps what memory already holds */
    awq_table *d = awq_table_new();
    awq_tune_value vd = val_of(400);
    awq_table_put(d, &shared, &vd);
    CHECK(awq_table_load(d, path, warn, sizeof warn) == 0);
    CHECK(awq_table_size(d) == 6 && has_val(d, 100, 400));

    awq_table_free(a);
    awq_table_free(b);
    awq_table_free(c);
    awq_table_free(d);
}

/* Each writer puts its own keys one at a time and saves after each. */
static int writer(const char *path, int id, int count)
{
    awq_table *t = awq_table_new();
    char warn[512];
    int errors = 0;
    for (int i = 0; i < count; i++) {
        int j = 10000 + id * 1000 + i;
        awq_tune_key k = key_of(j);
        awq_tune_value v = val_of(j);
        awq_table_put(t, &k, &v);
        if (awq_table_save(t, path, warn, sizeof warn) != 0) {
            fprintf(stderr, "writer %d: %s\n", id, warn);
            errors++;
        }
    }
    awq_table_free(t);
    return errors;
}

typedef struct {
    const char *path;
    int id, errors;
} writer_arg;

static void *writer_thread(void *p)
{
    writer_arg *a = p;
    a->errors = writer(a->path, a->id, 25);
    return NULL;
}

static void test_concurrent_savers(void)
{
    char path[512], warn[512];
    path_in(path, sizeof path, "race/autotune.txt");

    /* 4 processes */
    pid_t pids[4];
    for (int i = 0; i < 4; i++) {
        pids[i] = fork();
        if (pids[i] == 0)
            _exit(writer(path, i, 40) ? 1 : 0);
    }
    int child_errors = 0;
    for (int i = 0; i < 4; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        child_errors += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    CHECK(child_errors == 0);
    awq_table *t = awq_table_new();
    CHECK(awq_table_load(t, path, warn, sizeof warn) == 0);
    CHECK(awq_table_size(t) == 160);
    int bad = 0;
    for (int p = 0; p < 4; p++)
        for (int i = 0; i < 40; i++)
            bad += !has_val(t, 10000 + p * 1000 + i, 10000 + p * 1000 + i);
    CHECK(bad == 0);

    /* 8 threads of one process, each with its own table */
    pthread_t th[8];
    writer_arg args[8];
    for (int i = 0; i < 8; i++) {
        args[i] = (writer_arg){path, 4 + i, 0};
        pthread_create(&th[i], NULL, writer_thread, &args[i]);
    }
    int errors = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        errors += args[i].errors;
    }
    CHECK(errors == 0);
    awq_table_clear(t);
    CHECK(awq_table_load(t, path, warn, sizeof warn) == 0);
    CHECK(awq_table_size(t) == 160 + 200);

    /* no temp file left behind */
    char tmpglob[600];
    snprintf(tmpglob, sizeof tmpglob, "ls %s/race | grep -c tmp > /dev/null", root);
    CHECK(system(tmpglob) != 0);
    awq_table_free(t);
}

static const char header[] = "# awq_fast_dequant autotune cache v3\n";

static void test_damaged_files(void)
{
    char path[512], warn[1024], expect[1200];
    awq_table *t = awq_table_new();

    /* missing: the normal first run */
    path_in(path, sizeof path, "missing.txt");
    CHECK(awq_table_load(t, path, warn, sizeof warn) == 0 && warn[0] == '\0');
    CHECK(awq_table_load(t, path, NULL, 0) == 0);

    /* empty */
    path_in(path, sizeof path, "empty.txt");
    write_text(path, "");
    CHECK(awq_table_load(t, path, warn, sizeof warn) == 1);
    CHECK_WARN(warn, "is empty");
    CHECK(awq_table_size(t) == 0);

    /* header only, and comments / blank lines */
    path_in(path, sizeof path, "header.txt");
    write_text(path, "# awq_fast_dequant autotune cache v3\n# a comment\n\n#\n");
    CHECK(awq_table_load(t, path, warn, sizeof warn) == 0 && warn[0] == '\0');
    CHECK(awq_table_size(t) == 0);

    /* malformed lines among valid ones */
    path_in(path, sizeof path, "malformed.txt");
    char *big = malloc(200000);
    char *body = malloc(400000);
    if (!big || !body) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    memset(big, 'z', 199998);
    big[199998] = '\n';
    big[199999] = '\0';
    char dev96[AWQ_TUNE_DEVICE_LEN + 1];
    memset(dev96, 'd', AWQ_TUNE_DEVICE_LEN);
    dev96[AWQ_TUNE_DEVICE_LEN] = '\0';
    int nb = sprintf(body,
                     "%s"
                     "dev\t1\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t10.5\n"  /* valid */
                     "# comment\n"
                     "\n"
                     "dev\t1\t128\t8\t128\tfloat16\tfloat16\tv4\t256\t2\t0\n"        /* 11 fields */
                     "dev\t1\t128\t8\t128\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t1\t9\n" /* 14 */
                     "dev\t1\tdequantize\t12a\t8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t1\n"  /* K text */
                     "dev\t1\tdequantize\t128\t8\t128\t0\tfloat64\tfloat16\tv4\t256\t2\t0\t0\t0\t1\n"  /* dtype */
                     "dev\t1\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tv9\t256\t2\t0\t0\t0\t1\n"  /* kernel */
                     "dev\t1\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tauto\t256\t2\t0\t0\t0\t1\n" /* auto */
                     "dev\t1\tdequantize\t128\t8\t0\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t1\n"    /* G = 0 */
                     "dev\t1\tdequantize\t128\t-8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t1\n" /* N < 0 */
                     "%s\t1\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t1\n"   /* device */
                     "dev\t1\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\tnan\n"
                     "dev\t1\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tv4\t48\t2\t0\t0\t0\t1\n"   /* block */
                     "dev\t1\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tv4\t64\t3\t0\t0\t0\t1\n"   /* rows */
                     "dev\t1\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tv4\t64\t128\t0\t0\t0\t1\n" /* rows */
                     "dev\t1\tdequantize\t100\t8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t1\n"  /* K % G */
                     "dev\t1\tdequantize\t128\t12\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t1\n" /* N % 8 */
                     "dev\t1\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t1e999\n"
                     "dev\t0\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t1\n"  /* gen 0 */
                     "dev\tg\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t1\n"  /* gen text */
                     "dev\t128\t8\t128\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t1\n"     /* v1 line */
                     "\t1\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t1\n"     /* no device */
                     "dev\t1\tdequantize\t 128\t8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t1\n" /* space */
                     "dev\t1\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t1\r\n" /* CRLF */
                     "dev\t1\tdequantize\t99999999999999999999\t8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t1\n"
                     "dev\t1\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t0x10\n"
                     "%s" /* a 200 kB line */
                     "dev\t1\tdequantize\t256\t8\t128\t0\tbfloat16\tfloat32\tcpu\t0\t0\t0\t4\t32\t7\n"  /* valid */
                     "dev\t1\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tv3\t128\t0\t0\t0\t0\t9.25\n" /* dup: wins */
                     "dev\t1\tdequantize\t512\t8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t1", /* cut short */
                     header, dev96, big);
    /* and one line holding a NUL byte, before the cut one */
    static const char nul_line[] = "dev\t1\tdequantize\t1024\t8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\0\t0\t1\n";
    char *cut = strrchr(body, '\n') + 1;
    size_t cut_len = strlen(cut);
    memmove(cut + sizeof nul_line - 1, cut, cut_len + 1);
    memcpy(cut, nul_line, sizeof nul_line - 1);
    nb += (int)sizeof nul_line - 1;
    write_bytes(path, body, (size_t)nb);
    awq_table_clear(t);
    CHECK(awq_table_load(t, path, warn, sizeof warn) == 1);
    snprintf(expect, sizeof expect, "ignored 27 malformed lines in %s", path);
    CHECK(strcmp(warn, expect) == 0);
    if (strcmp(warn, expect) != 0)
        fprintf(stderr, "  got: %s\n", warn);
    CHECK(awq_table_size(t) == 2);
    awq_tune_key k;
    awq_tune_value v;
    awq_tune_key_init(&k, "dev", 1, 128, 8, 128, AWQ_F16, AWQ_F16);
    CHECK(awq_table_get(t, &k, &v) && v.config.kernel == AWQ_KERNEL_V3 && v.us == 9.25f);
    awq_tune_key_init(&k, "dev", 1, 256, 8, 128, AWQ_BF16, AWQ_F32);
    CHECK(awq_table_get(t, &k, &v) && v.config.threads == 4 && v.config.chunk == 32);
    /* save repairs the file: the bad lines are gone, the good ones stay */
    CHECK(awq_table_save(t, path, warn, sizeof warn) == 0);
    awq_table_clear(t);
    CHECK(awq_table_load(t, path, warn, sizeof warn) == 0 && awq_table_size(t) == 2);
    free(big);
    free(body);

    /* a real file cut at every byte: never more than the valid lines */
    path_in(path, sizeof path, "full.txt");
    awq_table *full = awq_table_new();
    for (int i = 0; i < 20; i++) {
        awq_tune_key fk = key_of(i);
        awq_tune_value fv = val_of(i);
        awq_table_put(full, &fk, &fv);
    }
    CHECK(awq_table_save(full, path, warn, sizeof warn) == 0);
    size_t flen;
    char *ftext = read_all(path, &flen);
    char cutp[512];
    path_in(cutp, sizeof cutp, "cut.txt");
    int bad = 0;
    for (size_t c = 0; c <= flen; c++) {
        write_bytes(cutp, ftext, c);
        awq_table_clear(t);
        int rc = awq_table_load(t, cutp, warn, sizeof warn);
        size_t lines = 0; /* complete entry lines in the prefix */
        for (size_t i = 0; i < c; i++)
            lines += ftext[i] == '\n';
        lines = lines > 6 ? lines - 6 : 0; /* header + 5 comment lines */
        int partial = c > 0 && ftext[c - 1] != '\n';
        if (awq_table_size(t) != lines)
            bad++;
        if (c == 0 && !(rc == 1 && strstr(warn, "empty")))
            bad++;
        if (c > 0 && c < sizeof header - 1 && !(rc == 1 && strstr(warn, "not an awq_fast")))
            bad++;
        if (lines > 0 && partial && !(rc == 1 && strstr(warn, "ignored 1 malformed line in")))
            bad++;
        if (c == flen && rc != 0)
            bad++;
        size_t got = awq_table_size(t);
        awq_tune_key *ks = malloc((got + 1) * sizeof *ks);
        awq_tune_value *vs = malloc((got + 1) * sizeof *vs);
        got = awq_table_snapshot(t, ks, vs, got);
        for (size_t i = 0; i < got; i++) {
            awq_tune_value want;
            bad += !(awq_table_get(full, &ks[i], &want) && val_eq(&want, &vs[i]));
        }
        free(ks);
        free(vs);
    }
    CHECK(bad == 0);

    /* random byte damage: no crash, every entry loaded is a valid one */
    srand(12345);
    bad = 0;
    for (int round = 0; round < 2000; round++) {
        char *m = malloc(flen + 1);
        memcpy(m, ftext, flen + 1);
        int flips = 1 + rand() % 8;
        for (int f = 0; f < flips; f++)
            m[rand() % flen] = (char)(rand() % 256);
        write_bytes(cutp, m, flen);
        awq_table_clear(t);
        awq_table_load(t, cutp, warn, sizeof warn);
        size_t got = awq_table_size(t);
        awq_tune_key *ks = malloc((got + 1) * sizeof *ks);
        awq_tune_value *vs = malloc((got + 1) * sizeof *vs);
        got = awq_table_snapshot(t, ks, vs, got);
        for (size_t i = 0; i < got; i++)
            bad += !(awq_tune_key_valid(&ks[i]) && awq_tune_value_valid(&vs[i]));
        free(ks);
        free(vs);
        free(m);
    }
    CHECK(bad == 0);

    /* binary garbage */
    path_in(path, sizeof path, "garbage.bin");
    unsigned char junk[4096];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)(rand() % 256);
    junk[10] = 0;
    write_bytes(path, junk, sizeof junk);
    awq_table_clear(t);
    CHECK(awq_table_load(t, path, warn, sizeof warn) == 1);
    CHECK_WARN(warn, "is not an awq_fast_dequant autotune cache");
    CHECK(awq_table_size(t) == 0);
    /* garbage is replaced by save */
    awq_tune_key gk = key_of(1);
    awq_tune_value gv = val_of(1);
    awq_table_put(t, &gk, &gv);
    CHECK(awq_table_save(t, path, warn, sizeof warn) == 0);
    awq_table_clear(t);
    CHECK(awq_table_load(t, path, warn, sizeof warn) == 0 && has_val(t, 1, 1));

    /* other first lines: version 0, no version, cut header, CRLF */
    const char *bad_headers[] = {
        "# awq_fast_dequant autotune cache v0\n", "# awq_fast_dequant autotune cache v\n",
        "# awq_fast_dequant autotune cache v3",   "# awq_fast_dequant autotune cache v3\r\n",
        "# awq_fast_dequant autotune cache v3x\n", "hello\n",
    };
    for (size_t i = 0; i < sizeof bad_headers / sizeof *bad_headers; i++) {
        char buf[512];
        snprintf(buf, sizeof buf, "%sdev\t1\tdequantize\t128\t8\t128\t0\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t0\t1\n",
                 bad_headers[i]);
        write_text(path, buf);
        awq_table_clear(t);
        CHECK(awq_table_load(t, path, warn, sizeof warn) == 1 && awq_table_size(t) == 0);
        CHECK_WARN(warn, "unrecognised first line");
    }

    /* an older version (v2: no op, M and split fields) is ignored the same way */
    path_in(path, sizeof path, "v2.txt");
    write_text(path, "# awq_fast_dequant autotune cache v2\n"
                     "dev\t1\t128\t8\t128\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t1\n");
    awq_table_clear(t);
    CHECK(awq_table_load(t, path, warn, sizeof warn) == 1 && awq_table_size(t) == 0);
    CHECK_WARN(warn, "has format v2, written by an older awq_fast_dequant");

    /* an older version (v1: no generation, tuned for older kernels): ignored
     * with a warning, and replaced by the next save */
    path_in(path, sizeof path, "old.txt");
    write_text(path, "# awq_fast_dequant autotune cache v1\n"
                     "NVIDIA H200 sm_90\t128\t8\t128\tfloat16\tfloat16\tv4\t256\t2\t0\t0\t1\n");
    awq_table_clear(t);
    CHECK(awq_table_load(t, path, warn, sizeof warn) == 1);
    CHECK_WARN(warn, "has format v1, written by an older awq_fast_dequant");
    CHECK(awq_table_size(t) == 0);
    awq_table_put(t, &gk, &gv);
    CHECK(awq_table_save(t, path, warn, sizeof warn) == 0 && warn[0] == '\0');
    char *replaced = read_all(path, NULL);
    CHECK(replaced && strncmp(replaced, header, sizeof header - 1) == 0);
    free(replaced);
    awq_table_clear(t);
    CHECK(awq_table_load(t, path, warn, sizeof warn) == 0 && awq_table_size(t) == 1 &&
          has_val(t, 1, 1));

    /* a future version: ignored, and never overwritten */
    path_in(path, sizeof path, "future.txt");
    const char future[] = "# awq_fast_dequant autotune cache v4\n"
                          "NVIDIA H200 sm_90\t128\tdequantize\t8\t128\tfloat16\t0\tfloat16\tv7\t1\t2\t3\t0\t4\t5\tnew\n";
    write_text(path, future);
    awq_table_clear(t);
    CHECK(awq_table_load(t, path, warn, sizeof warn) == 1);
    CHECK_WARN(warn, "has format v4, newer than this build's v3");
    CHECK(awq_table_size(t) == 0);
    awq_table_put(t, &gk, &gv);
    CHECK(awq_table_save(t, path, warn, sizeof warn) == 1);
    CHECK_WARN(warn, "left it unchanged");
    char *after = read_all(path, NULL);
    CHECK(after && strcmp(after, future) == 0);
    free(after);
    CHECK(awq_table_size(t) == 1 && has_val(t, 1, 1)); /* kept in memory */

    /* the path is a folder */
    path_in(path, sizeof path, "a_folder");
    mkdir(path, 0755);
    CHECK(awq_table_load(t, path, warn, sizeof warn) == 1);
    CHECK_WARN(warn, "not a regular file");
    CHECK(awq_table_save(t, path, warn, sizeof warn) == 1);
    CHECK_WARN(warn, "not a regular file");
    CHECK(awq_table_size(t) == 1);

    /* the path is a FIFO: no hang */
    path_in(path, sizeof path, "a_fifo");
    if (mkfifo(path, 0644) == 0) {
        CHECK(awq_table_load(t, path, warn, sizeof warn) == 1);
        CHECK_WARN(warn, "not a regular file");
    }

    /* the folder cannot be made: a file stands where a folder should be */
    char blocker[512];
    path_in(blocker, sizeof blocker, "blocker");
    write_text(blocker, "x");
    path_in(path, sizeof path, "blocker/sub/autotune.txt");
    CHECK(awq_table_save(t, path, warn, sizeof warn) == 1);
    CHECK_WARN(warn, "cannot create the autotune cache folder");
    CHECK(awq_table_size(t) == 1 && has_val(t, 1, 1));
    CHECK(awq_table_load(t, path, warn, sizeof warn) == 1); /* ENOTDIR: warn */
    CHECK_WARN(warn, "cannot read");

    /* invalid paths */
    CHECK(awq_table_save(t, "", warn, sizeof warn) == 1);
    CHECK(awq_table_save(t, "/tmp/", warn, sizeof warn) == 1);
    CHECK(awq_table_load(t, NULL, warn, sizeof warn) == 1);

    /* a crashed writer's temp file is cleaned up under the lock */
    path_in(path, sizeof path, "stale.txt");
    char stale[600];
    snprintf(stale, sizeof stale, "%s.tmp.99999.deadbeef", path);
    write_text(stale, "partial");
    CHECK(awq_table_save(t, path, warn, sizeof warn) == 0);
    CHECK(!exists(stale) && exists(path));

    /* a short warning buffer stays terminated */
    path_in(path, sizeof path, "empty.txt");
    char tiny[8];
    memset(tiny, 'q', sizeof tiny);
    CHECK(awq_table_load(t, path, tiny, sizeof tiny) == 1 && tiny[7] == '\0');

    /* permissions (root reads and writes everything: skipped there) */
    if (geteuid() != 0) {
        path_in(path, sizeof path, "unreadable.txt");
        awq_table_save(t, path, warn, sizeof warn);
        chmod(path, 0);
        awq_table_clear(t);
        CHECK(awq_table_load(t, path, warn, sizeof warn) == 1);
        CHECK_WARN(warn, "cannot read");
        awq_table_put(t, &gk, &gv);
        CHECK(awq_table_save(t, path, warn, sizeof warn) == 1); /* not overwritten */
        chmod(path, 0644);

        char ro[512];
        path_in(ro, sizeof ro, "readonly");
        mkdir(ro, 0755);
        path_in(path, sizeof path, "readonly/autotune.txt");
        CHECK(awq_table_save(t, path, warn, sizeof warn) == 0);
        chmod(ro, 0555);
        awq_tune_key nk = key_of(2);
        awq_tune_value nv = val_of(2);
        awq_table_put(t, &nk, &nv);
        CHECK(awq_table_save(t, path, warn, sizeof warn) == 1);
        CHECK(awq_table_size(t) == 2 && has_val(t, 2, 2));
        CHECK(awq_table_load(t, path, warn, sizeof warn) == 0); /* still readable */
        chmod(ro, 0755);
    } else {
        printf("  (running as root: unreadable-file and read-only-folder checks skipped)\n");
    }

    free(ftext);
    awq_table_free(full);
    awq_table_free(t);
}

/* ---- tuning ------------------------------------------------------------- */

typedef struct {
    float us[8];
    awq_status st[8];
    int calls;
} fake_timing;

/* Candidate i is told apart by its block_size field (= i). */
static awq_status fake_time(const awq_config *c, float *us, int *detail, void *ctx)
{
    fake_timing *f = ctx;
    f->calls++;
    *us = f->us[c->block_size];
    *detail = 1000 + c->block_size;
    return f->st[c->block_size];
}

/* Linear keys: op and M bucket are part of the key, the kernel must belong
 * to the key's operation, and both survive the file. */
static void test_linear_keys(void)
{
    char path[512], warn[1024];
    awq_table *t = awq_table_new();
    awq_tune_key d, l1, l8;
    CHECK(awq_tune_key_init(&d, "dev", 1, 4096, 14336, 128, AWQ_F16, AWQ_F16) == 0);
    CHECK(awq_tune_linear_key_init(&l1, "dev", 1, 4096, 14336, 128, AWQ_F16, 1) == 0);
    CHECK(awq_tune_linear_key_init(&l8, "dev", 1, 4096, 14336, 128, AWQ_F16, 8) == 0);
    awq_tune_key bad;
    CHECK(awq_tune_linear_key_init(&bad, "dev", 1, 4096, 14336, 128, AWQ_F16, 3) == -1); /* not a bucket */
    CHECK(awq_tune_linear_key_init(&bad, "dev", 1, 4096, 14336, 128, AWQ_F16, 0) == -1);
    CHECK(awq_tune_linear_key_init(&bad, "dev", 1, 4096, 14336, 128, AWQ_F16,
                                   2 * AWQ_M_BUCKET_MAX) == -1);
    CHECK(awq_m_bucket(0) == 1 && awq_m_bucket(1) == 1 && awq_m_bucket(3) == 4 &&
          awq_m_bucket(4096) == 4096 && awq_m_bucket(4097) == AWQ_M_BUCKET_MAX &&
          awq_m_bucket(1 << 30) == AWQ_M_BUCKET_MAX);

    awq_tune_value mma = {{.kernel = AWQ_KERNEL_MMA, .block_size = 128, .rows = 1, .split = 4}, 7.5f};
    awq_tune_value deq = {{.kernel = AWQ_KERNEL_DEQUANT}, 90.0f};
    awq_tune_value v4 = {{.kernel = AWQ_KERNEL_V4, .block_size = 64, .rows = 2}, 40.0f};
    CHECK(awq_table_put(t, &d, &mma) == -2); /* a linear kernel for a dequantize key */
    CHECK(awq_table_put(t, &l1, &v4) == -2); /* and the other way round */
    awq_tune_value split_v4 = v4;
    split_v4.config.split = 2;
    CHECK(awq_table_put(t, &d, &split_v4) == -2);
    awq_tune_value too_split = mma;
    too_split.config.split = AWQ_MAX_SPLIT + 1;
    CHECK(awq_table_put(t, &l1, &too_split) == -2);
    CHECK(awq_table_put(t, &d, &v4) == 0 && awq_table_put(t, &l1, &mma) == 0 &&
          awq_table_put(t, &l8, &deq) == 0);
    CHECK(awq_table_size(t) == 3);

    path_in(path, sizeof path, "linear.txt");
    CHECK(awq_table_save(t, path, warn, sizeof warn) == 0);
    char *text = read_all(path, NULL);
    CHECK(text && strstr(text, "dev\t1\tlinear\t4096\t14336\t128\t1\tfloat16\tfloat16\tmma\t128\t1\t4\t0"
                               "\t0\t7.5\n"));
    CHECK(text && strstr(text, "dev\t1\tlinear\t4096\t14336\t128\t8\tfloat16\tfloat16\tdequant\t"));
    free(text);
    awq_table *u = awq_table_new();
    CHECK(awq_table_load(u, path, warn, sizeof warn) == 0 && awq_table_size(u) == 3);
    awq_tune_value got;
    CHECK(awq_table_get(u, &l1, &got) && got.config.kernel == AWQ_KERNEL_MMA && got.config.split == 4);
    CHECK(awq_table_get(u, &l8, &got) && got.config.kernel == AWQ_KERNEL_DEQUANT);
    CHECK(awq_table_get(u, &d, &got) && got.config.kernel == AWQ_KERNEL_V4);

    /* lines a v3 reader refuses: a linear line with mixed dtypes, with M 0,
     * with a v4 kernel; a dequantize line with M 5 */
    write_text(path, "# awq_fast_dequant autotune cache v3\n"
                     "dev\t1\tlinear\t128\t8\t128\t1\tfloat16\tfloat32\tmma\t0\t0\t0\t0\t0\t1\n"
                     "dev\t1\tlinear\t128\t8\t128\t0\tfloat16\tfloat16\tmma\t0\t0\t0\t0\t0\t1\n"
                     "dev\t1\tlinear\t128\t8\t128\t2\tfloat16\tfloat16\tv4\t0\t0\t0\t0\t0\t1\n"
                     "dev\t1\tdequantize\t128\t8\t128\t5\tfloat16\tfloat16\tv4\t0\t0\t0\t0\t0\t1\n"
                     "dev\t1\tgemm\t128\t8\t128\t0\tfloat16\tfloat16\tv4\t0\t0\t0\t0\t0\t1\n"
                     "dev\t1\tlinear\t128\t8\t128\t2\tbfloat16\tbfloat16\tsimt\t256\t0\t2\t0\t0\t1\n");
    awq_table_clear(u);
    CHECK(awq_table_load(u, path, warn, sizeof warn) == 1 && awq_table_size(u) == 1);
    CHECK_WARN(warn, "ignored 5 malformed lines");
    awq_table_free(u);
    awq_table_free(t);
}

static void test_tune(void)
{
    awq_problem p;
    memset(&p, 0, sizeof p);
    p.K = 4096;
    p.N = 4096;
    p.G = 128;
    p.device = -1;
    awq_config cands[8];
    for (int i = 0; i < 8; i++)
        cands[i] = (awq_config){.kernel = AWQ_KERNEL_V4, .block_size = i};
    awq_tune_value best;
    int detail = -1;

    fake_timing f = {{9, 5, 3, 3, 7, 2, 8, 1}, {0}, 0};
    f.st[5] = AWQ_ERR_CONFIG;    /* skipped */
    f.us[7] = NAN;               /* skipped */
    CHECK(awq_tune(cands, 8, fake_time, &f, &best, &detail) == AWQ_OK);
    CHECK(best.config.block_size == 2 && best.us == 3.0f && detail == 0); /* first of ties */
    CHECK(f.calls == 8);

    fake_timing g = {{1, 1, 1, 1, 1, 1, 1, 1}, {0}, 0};
    g.st[3] = AWQ_ERR_CUDA;
    CHECK(awq_tune(cands, 8, fake_time, &g, &best, &detail) == AWQ_ERR_CUDA);
    CHECK(detail == 1003 && g.calls == 4);

    fake_timing h = {{1}, {AWQ_ERR_CONFIG, AWQ_ERR_CONFIG}, 0};
    CHECK(awq_tune(cands, 2, fake_time, &h, &best, &detail) == AWQ_ERR_CONFIG);
    CHECK(awq_tune(cands, 0, fake_time, &h, &best, &detail) == AWQ_ERR_CONFIG);

    /* CPU candidates (the stub says 6 threads) */
    awq_config cc[64];
    int n = awq_cpu_candidates(&p, cc, 64);
    CHECK(n == 1 + 4 * 4); /* default + {1,2,4,6} x {8,32,128,512} */
    CHECK(cc[0].kernel == AWQ_KERNEL_CPU && cc[0].threads == 0 && cc[0].chunk == 0);
    int ok = 1;
    for (int i = 1; i < n; i++) {
        ok &= cc[i].kernel == AWQ_KERNEL_CPU && cc[i].threads >= 1 && cc[i].threads <= 6;
        for (int j = 0; j < i; j++)
            ok &= !(cc[i].threads == cc[j].threads && cc[i].chunk == cc[j].chunk);
    }
    CHECK(ok);
    CHECK(awq_cpu_candidates(&p, cc, 5) == 5);
    CHECK(awq_cpu_candidates(&p, cc, 0) == 0);
    p.K = 16; /* chunks 8 (2 items: 1 or 2 threads) and 32 (1 item: 1 thread) */
    CHECK(awq_cpu_candidates(&p, cc, 64) == 4);
    p.K = 0;
    CHECK(awq_cpu_candidates(&p, cc, 64) == 1);
    p.K = 4096;

    /* the tuner with the CPU timer picks the stub's fast configuration */
    n = awq_cpu_candidates(&p, cc, 64);
    awq_cpu_timing timing = {&p, NULL, 1, 2, -1.0};
    CHECK(awq_tune(cc, n, awq_cpu_time, &timing, &best, &detail) == AWQ_OK);
    CHECK(best.config.threads == 2 && best.config.chunk == 32);
    CHECK(best.us >= 50.0f && best.us < 300.0f);
    float us = 0;
    awq_cpu_timing dflt = {&p, NULL, 0, 0, 0.0};
    CHECK(awq_cpu_time(&cc[0], &us, &detail, &dflt) == AWQ_OK && us >= 300.0f);
    CHECK(awq_cpu_time(&cc[0], &us, &detail, NULL) == AWQ_ERR_CONFIG);
    stub_status = AWQ_ERR_NOMEM;
    CHECK(awq_tune(cc, n, awq_cpu_time, &timing, &best, &detail) == AWQ_ERR_NOMEM);
    stub_status = AWQ_OK;
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/awq_autotune_test.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 2;
    }
    struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"basic", test_basic},
        {"growth", test_growth},
        {"threads_shared_table", test_threads_shared_table},
        {"round_trip", test_round_trip},
        {"merge_two_tables", test_merge_two_tables},
        {"concurrent_savers", test_concurrent_savers},
        {"damaged_files", test_damaged_files},
        {"linear_keys", test_linear_keys},
        {"tune", test_tune},
    };
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++) {
        int before = failures;
        double t0 = now_s();
        tests[i].fn();
        printf("%-22s %s (%.2f s)\n", tests[i].name, failures == before ? "ok" : "FAILED",
               now_s() - t0);
    }
    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
