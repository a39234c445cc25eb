/*
 * autotune/autotune.h -- the autotune cache: an in-memory hash table of
 * tuned launch configurations (table.c), its on-disk persistence (file.c)
 * and the tuning loop (tune.c).  Each backend lists its own candidates.
 *
 * Pure C (C11 + POSIX): no Python here.  Every function may be called
 * without the GIL; the table is guarded by its own mutex.
 *
 * On-disk format (DESIGN.md section 5), one UTF-8/ASCII text file:
 *
 *   # awq_fast_dequant autotune cache v3
 *   # One tuned launch configuration per line, fields separated by one tab:
 *   # device gen op K N G M scales out kernel block_size rows split threads chunk us
 *   # gen: the generation of the kernels the entry was tuned for; each build uses its own.
 *   # M: the bucket of rows of x (linear), 0 for dequantize.
 *   # 0 means "the kernel's default"; us is the measured time in microseconds. Safe to delete.
 *   NVIDIA H200 sm_90<TAB>5<TAB>dequantize<TAB>4096<TAB>14336<TAB>128<TAB>0<TAB>float16<TAB>float16<TAB>v4<TAB>256<TAB>2<TAB>0<TAB>0<TAB>0<TAB>41.37
 *
 * The first line names the format version; a file of another version is
 * never read (an older one is replaced on the next save, a newer one is
 * never overwritten).  Lines starting with '#' are comments, empty lines
 * are skipped, every other line is an entry of exactly 16 fields:
 *   device      1..95 bytes, no tab / control character, not starting with '#'
 *   gen         decimal >= 1: the generation of the device's kernels the
 *               entry was tuned with (AWQ_CUDA_KERNELS_GEN / AWQ_CPU_KERNELS_GEN
 *               of the build that wrote it).  Part of the key: a build looks
 *               up only its own generation, and keeps the others' entries
 *               for the builds that use them.
 *   op          dequantize | linear
 *   K, N, G     decimal, K >= 0, N >= 0 and a multiple of 8, G >= 1,
 *               G divides K (unless K == 0)
 *   M           dequantize: 0; linear: an M bucket (awq_m_bucket: a power of
 *               two up to AWQ_M_BUCKET_MAX)
 *   scales, out float16 | bfloat16 | float32 (linear: the same)
 *   kernel      dequantize: v1 | v2 | v3 | v4 | cpu;
 *               linear: cpu | simt | mma | dequant
 *   block_size  0, or a multiple of 32 in [32, 1024]
 *   rows        0, or a power of two up to 64
 *   split       0 .. AWQ_MAX_SPLIT
 *   threads, chunk   decimal >= 0
 *   us          a finite decimal >= 0 (C locale)
 * A line that breaks any rule (including a last line without its newline,
 * which may have been cut short) is skipped and counted.
 * Version 1 had no gen field; version 2 had no op, M and split fields.
 */
#ifndef AWQ_AUTOTUNE_H
#define AWQ_AUTOTUNE_H

#include <stddef.h>
#include <stdint.h>

#include "awq.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The format version written in the header line; the one place it lives. */
#define AWQ_TUNE_FORMAT_VERSION 3

/* Size of awq_tune_key.device, terminating NUL included. */
#define AWQ_TUNE_DEVICE_LEN 96

typedef struct {
    /* Device identity, e.g. "NVIDIA H200 sm_90" or "cpu x86_64 2t".
     * NUL-terminated inside the field; no tab, newline or other control
     * character; must not start with '#'.  The caller builds it. */
    char device[AWQ_TUNE_DEVICE_LEN];
    int gen; /* generation of the device's kernels, >= 1 (see above) */
    int op;  /* awq_tune_op */
    int64_t K, N, G;
    int64_t m; /* linear: the M bucket; dequantize: 0 */
    awq_dtype scale_dtype, out_dtype;
} awq_tune_key;

/* The operation an entry tunes. */
typedef enum { AWQ_OP_DEQUANTIZE = 0, AWQ_OP_LINEAR = 1 } awq_tune_op;

#define AWQ_NUM_OPS 2

/* "dequantize" / "linear"; NULL out of range. */
const char *awq_tune_op_name(int op);
int awq_tune_op_parse(const char *name, int *op);

typedef struct {
    awq_config config; /* a kernel of the key's operation, never AUTO */
    float us;          /* measured time of the chosen config, microseconds */
} awq_tune_value;

typedef struct awq_table awq_table;

/* splitmix64's finalizer: a cheap bijection that spreads every input bit
 * over the whole word, so that consecutive K or N land far apart. */
static inline uint64_t awq_mix64(uint64_t x)
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

/* ---- keys, values and names -------------------------------------------- */

/* Zero-fills *k and sets the fields of a dequantize key.  Returns 0, or -1
 * (and leaves *k zeroed) when the device string does not fit or the key is
 * not valid. */
int awq_tune_key_init(awq_tune_key *k, const char *device, int gen, int64_t K, int64_t N,
                      int64_t G, awq_dtype scale_dtype, awq_dtype out_dtype);

/* The same for a linear key: one dtype, and m, the M bucket
 * (awq_m_bucket). */
int awq_tune_linear_key_init(awq_tune_key *k, const char *device, int gen, int64_t K, int64_t N,
                             int64_t G, awq_dtype dtype, int64_t m);

/* 1 when the key / value obeys the rules of the file format above; a value
 * alone is checked against every operation's kernels, a pair (entry) also
 * against its key's operation. */
int awq_tune_key_valid(const awq_tune_key *k);
int awq_tune_value_valid(const awq_tune_value *v);
int awq_tune_entry_valid(const awq_tune_key *k, const awq_tune_value *v);

/* ---- the in-memory table ------------------------------------------------ */

awq_table *awq_table_new(void); /* NULL on OOM */
void awq_table_free(awq_table *t); /* NULL is fine */

/* 1 hit (*v filled when v is not NULL), 0 miss.  Never allocates. */
int awq_table_get(awq_table *t, const awq_tune_key *k, awq_tune_value *v);

/* Insert or update.  0 ok, -1 out of memory (the table is unchanged),
 * -2 invalid key or value (see awq_tune_entry_valid). */
int awq_table_put(awq_table *t, const awq_tune_key *k, const awq_tune_value *v);

size_t awq_table_size(awq_table *t);

/* Drops every entry and gives the memory of a grown table back. */
void awq_table_clear(awq_table *t);

/* Copies up to cap entries (in no particular order) into keys[] / vals[]
 * (either may be NULL); returns how many were copied. */
size_t awq_table_snapshot(awq_table *t, awq_tune_key *keys, awq_tune_value *vals, size_t cap);

typedef struct {
    awq_tune_key key;
    awq_tune_value val;
} awq_tune_entry;

/* Every entry, in no particular order, as one consistent snapshot in a
 * malloc'd array the caller frees; *n receives the count.  NULL (and *n 0)
 * when memory runs out or t is NULL. */
awq_tune_entry *awq_table_entries(awq_table *t, size_t *n);

/* Copies every entry of src into dst where dst lacks the key (dst's values
 * win).  0, or -1 out of memory (dst then holds part of src). */
int awq_table_merge_missing(awq_table *dst, awq_table *src);

/* ---- persistence ---------------------------------------------------------
 * Every function below returns 0 when all went fine and 1 when it wrote a
 * human-readable warning into warn (warn_len bytes, always NUL-terminated;
 * "" when there is none; warn may be NULL).  Nothing is ever fatal and the
 * in-memory table is never lost. */

/* Merges the valid entries of the file into t.  A key t already holds is
 * kept as it is (memory is at least as new as the file); among duplicate
 * lines of the file the last one wins.  A missing file is the normal first
 * run: no entries, no warning.  Warns (one message) about: an empty file,
 * an unrecognised first line, an older or newer format version, an
 * unreadable path, and "ignored N malformed lines in PATH".  Takes no lock: save replaces
 * the file atomically, so a reader sees the old or the new file. */
int awq_table_load(awq_table *t, const char *path, char *warn, size_t warn_len);

/* Creates the folder when missing, takes flock(LOCK_EX) on PATH.lock,
 * re-reads PATH and merges its entries into t for keys t lacks (ours win),
 * writes every entry to PATH.tmp.<pid>.<random> in the same folder, fsyncs,
 * renames it over PATH, fsyncs the folder, unlocks.  Leftover temp files of
 * crashed writers are removed under the lock.  A damaged file or one of an
 * older format version is replaced; one this build cannot merge (newer
 * version, unreadable, not a regular file) is left untouched.
 * On any failure the temp file is removed and a warning written. */
int awq_table_save(awq_table *t, const char *path, char *warn, size_t warn_len);

/* Removes PATH under the same lock (for clear_cache).  Missing: fine.
 * Both functions follow a PATH that is a symbolic link to the file it names
 * and work there: the link stays a link. */
int awq_cache_remove(const char *path, char *warn, size_t warn_len);

/* ---- tuning ------------------------------------------------------------- */

/* Times one configuration of the problem that ctx describes: *us receives
 * its time in microseconds.  Return AWQ_ERR_CONFIG when the configuration is
 * not valid for this problem (the tuner skips it); any other error stops
 * the tuning.  Returning AWQ_OK means the problem's output now holds the
 * complete result of this configuration. */
typedef awq_status (*awq_time_fn)(const awq_config *c, float *us, int *detail, void *ctx);

/* Times every candidate, in order, and keeps the fastest.  candidates[0] is
 * the backend's default: another candidate replaces it only when at least
 * AWQ_TUNE_DEFAULT_MARGIN times its time (2% faster) -- smaller differences
 * are within the spread of a few timed runs, and the default is the
 * configuration the benchmarks measure most; among the others the first of
 * equal times wins.  Candidates answering AWQ_ERR_CONFIG or a
 * non-finite time are skipped; any other error is returned at once with its
 * *detail.  AWQ_ERR_CONFIG when no candidate could run.  On AWQ_OK *best is
 * set and the output holds the result of the last successful run (for
 * dequantize every configuration writes the same bits; a linear caller
 * runs the winner once more). */
#define AWQ_TUNE_DEFAULT_MARGIN 0.98f

awq_status awq_tune(const awq_config *candidates, int n, awq_time_fn time_fn, void *ctx,
                    awq_tune_value *best, int *detail);

#ifdef __cplusplus
}
#endif

#endif /* AWQ_AUTOTUNE_H */
