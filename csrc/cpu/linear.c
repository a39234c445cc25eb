/*
 * cpu/linear.c -- the fused W4A16 linear on the host (DESIGN.md section 7):
 *
 *     y[m, n] = round( sum_k x[m, k] * W[k, n]  +  bias[n] )
 *
 * W[k, n] is dequantize's value in x's dtype, widened to float32:
 * round_to_dtype( float32(q - z) * float32(s) ), s the scale of k's group
 * g.  It is computed from the packed words in registers and never stored.
 *
 * The order of the sums is fixed by the problem alone.  K is cut into
 * blocks: each group into runs of LINEAR_KB rows (the last one shorter).
 * Each block adds its terms in row order to a partial sum that starts at
 * +0; the partials are added in block order to a total that starts at +0;
 * the bias is added to the total; one rounding.  A block's contribution
 * to y[m, n] takes one of two forms:
 *
 *   exact       partial = sum_k x[m, k] * W[k, n],      total += partial
 *   regrouped   partial = sum_k (q - z) * x[m, k],      total += s * partial
 *
 * DESIGN.md allows the regrouping (s times a group's sum of (q - z) x)
 * because it stays inside the tolerance 2^-9 (|x| @ |W|) + 1 ulp: it
 * leaves out W's rounding to the dtype, at most 2^-11 of |W| in float16
 * (an 11-bit significand; a W in float16's subnormal range is exact, every
 * float16 being a multiple of 2^-24) and 2^-24 in float32, and adds one
 * float32 rounding per block.  Its terms (q - z) x are exact in float32
 * for float16 x, and rounded once for float32, as x W is.  It saves the
 * product with s and the rounding of W to the dtype in every term: half
 * the vector operations per weight for float16.
 *
 * The exact form stays where the regrouped one would differ in kind
 * ("where the sum is regrouped" below): a (group, column) whose scale is
 * NaN, Inf or so large that some W overflows the dtype, so that NaN and
 * Inf reach y exactly as through dequantize and a matmul; a (row, group)
 * of x holding a NaN, an Inf or a value beyond 2^54, where the regrouped
 * sums could overflow where x W would not; and all of bfloat16, whose W
 * rounds by up to 2^-8 of |W|, more than the tolerance's 2^-9.  Both
 * forms meet in one sum only as block contributions to a total, and which
 * one a block takes depends on the problem alone.
 *
 * Every term of a partial is rounded to float32 before it is added, in
 * the vector paths and the scalar path alike (see "fused" below for the
 * form that differs without changing a bit), so all of them
 * give the same bits for every chunk size and thread count, in the default
 * floating-point environment that each thread sets for the call
 * (awq_cpu_fp_enter).  Blocking the sum also keeps its error near
 * (LINEAR_KB + K / LINEAR_KB) float32 roundings instead of K.
 *
 * Work: the output columns are cut into chunks (c->chunk columns) and the
 * rows of x into blocks of up to LINEAR_MB rows; one work item is one
 * (chunk, row block) and sweeps all of K, so each thread owns its output
 * elements and no sum is ever split between threads.  Inside an item:
 *   for each group:  expand the group's zero points and scales for the
 *                    chunk once, as float32, and note which columns
 *                    regroup
 *     for each block of rows k:
 *       for each tile of 64 or 128 columns (8 or 16 packed words per row):
 *         sum the block into registers, then add it to the chunk's totals
 * Each packed word is read from memory once per item; a block of one
 * tile (LINEAR_KB x 32 or 64 bytes) stays in L1 while the register passes
 * below re-read it.
 *
 * Pure C: no Python object is touched, so callers release the GIL.
 */
#include "cpu/convert.h"
#include "cpu/cpu.h"

#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef AWQ_X86_DISPATCH
#include <immintrin.h>
#ifndef AWQ_LINEAR_NO_AVX512 /* the test builds a copy without the AVX-512 tiles */
#define AWQ_LINEAR_AVX512 1
#endif
#endif

enum {
    LINEAR_KB = 64,        /* rows of K per block of the sum */
    LINEAR_MB = 4,         /* rows of x per work item: their accumulators fit in registers */
    LINEAR_LANES_MAX = 16, /* packed words per vector tile: 8 (AVX2) or 16 (AVX-512) */
    LINEAR_ALIGN = 64,     /* scratch alignment: one cache line */
};

/* The default chunk: LINEAR_ITEMS_PER_THREAD items of equal width per
 * thread, in whole tiles of the widest kind (LINEAR_CHUNK_MIN columns at
 * least).  Few wide items: each item reads every row of K, rows are N / 2
 * bytes apart, and where qweight lies on 4 KiB pages (as much of a NumPy
 * array does) each row of each item costs a TLB miss.  More than one item
 * per thread lets a thread whose core is busy with other work take fewer. */
#define LINEAR_CHUNK_MIN 64
#define LINEAR_ITEMS_PER_THREAD 2

/* ---- one call's plan and one thread's scratch ---- */

typedef struct {
    const awq_linear_problem *p;
    const float *x;            /* [M, K] float32: x itself, or its exact conversion */
    const unsigned char *xok;  /* [M][K / G]: row m of x allows regrouping in group g */
    int64_t chunk;             /* output columns per item, a multiple of 8 */
    int64_t width;             /* scratch columns: chunk rounded up to the widest tile */
    int64_t chunks;            /* items along N */
    int lanes; /* packed words per vector tile: 8 (AVX2), 16 (AVX-512); 0: scalar path */
} plan;

typedef struct {
    float *zero;    /* [width] the group's zero points (vector path: offset, see below) */
    float *scale;   /* [width] the group's scales */
    float *escale;  /* [width] vector path, tiles of both forms: the scales of the exact
                     * columns, 0 elsewhere */
    float *rscale;  /* [width] the same for the regrouped columns */
    float *total;   /* [LINEAR_MB][width] the sums so far */
    float *part;    /* [LINEAR_MB][width] scalar path: the current block's sums */
    uint32_t *tail; /* [LINEAR_KB][lanes] vector path: a partial tile's words, zero-padded */
    unsigned char *mode; /* [width] scalar path: column n regroups (1) or not (0); vector
                          * path: entry i, tile i's MODE_EXACT | MODE_REGROUP */
} scratch;

static size_t scratch_floats(int64_t width) { return (size_t)width * (4 + 2 * LINEAR_MB); }

static size_t scratch_bytes(int64_t width)
{
    size_t b = scratch_floats(width) * sizeof(float) +
               LINEAR_KB * LINEAR_LANES_MAX * sizeof(uint32_t) + (size_t)width;
    return (b + LINEAR_ALIGN - 1) / LINEAR_ALIGN * LINEAR_ALIGN;
}

static scratch scratch_at(char *base, int64_t width)
{
    float *f = (float *)base;
    scratch s;
    s.zero = f;
    s.scale = f + width;
    s.escale = f + 2 * width;
    s.rscale = f + 3 * width;
    s.total = f + 4 * width;
    s.part = f + (4 + LINEAR_MB) * width;
    s.tail = (uint32_t *)(f + scratch_floats(width));
    s.mode = (unsigned char *)(s.tail + LINEAR_KB * LINEAR_LANES_MAX);
    return s;
}

/* ---- where the sum is regrouped ----
 *
 * A regrouped (group, column) needs a finite scale small enough that no W
 * overflows: float16, 15 |s| <= 65504 (15 |s| is exact in float32);
 * float32, |s| <= 2^60.  A regrouped (row, group) needs every |x| <= 2^54
 * (which every finite float16 is): then a block's sum of (q - z) x stays
 * below LINEAR_KB * 15 * 2^54 < 2^64 and s times it below 2^124, so nothing
 * overflows where the exact form would not, and NaN and Inf in x or in
 * the scales always take the exact form.  bfloat16 never regroups: its W
 * rounds by up to 2^-8 of |W| (float16's by at most 2^-11, float32's by
 * 2^-24), which a regrouped sum would carry into y beyond the tolerance's
 * 2^-9 (tests/c/test_linear_cpu.c builds such a sum).  Both tests depend
 * on the problem alone, never on the chunk, the thread or the path. */
#define REGROUP_X_MAX 0x1p54f
#define REGROUP_S_MAX 0x1p60f
enum { MODE_EXACT = 1, MODE_REGROUP = 2 }; /* the forms a vector tile's columns take */
_Static_assert(LINEAR_KB * 15 < 1024, "a regrouped block's sum must stay below 2^64");

static inline int scale_regroups(float s, awq_dtype t)
{
    float a = bits_f32(f32_bits(s) & 0x7FFFFFFFu);
    switch (t) {
    case AWQ_F16: return a * 15.0f <= 65504.0f;
    case AWQ_F32: return a <= REGROUP_S_MAX;
    default: return 0;
    }
}

/* xok[m][g] for every row and group, once per call. */
static void rows_regroup(const plan *pl, unsigned char *xok)
{
    const awq_linear_problem *p = pl->p;
    const int64_t G = p->G, groups = p->K / G;
    const uint32_t max = f32_bits(REGROUP_X_MAX); /* |x| as bits: NaN and Inf compare above */
    for (int64_t m = 0; m < p->M; m++)
        for (int64_t g = 0; g < groups; g++) {
            const float *x = pl->x + m * p->K + g * G;
            uint32_t big = 0;
            for (int64_t k = 0; k < G; k++)
                big |= (f32_bits(x[k]) & 0x7FFFFFFFu) > max;
            xok[m * groups + g] = !big;
        }
}

/* W's value in the dtype, widened back to float32. */
static inline float round_to(float v, awq_dtype t)
{
    switch (t) {
    case AWQ_F16: return half_to_float(float_to_half(v));
    case AWQ_BF16: return bits_f32((uint32_t)float_to_bf16(v) << 16);
    default: return v;
    }
}

/* Column j (0..7) of a tile's word c sits at lane c of vector
 * AWQ_NIBBLE(j) in the vector path's scratch (see "tiles" below); the
 * scalar path keeps column order. */
static inline int64_t tile_pos(int64_t col, int lanes)
{
    const int64_t T = 8 * lanes; /* columns of a tile */
    return col / T * T + lanes * AWQ_NIBBLE(col % 8) + col % T / 8;
}

/* The column (0..7) that a word's nibble i holds: the inverse of AWQ_NIBBLE. */
#define NIBBLE_COLUMN(i) (2 * ((i) % 4) + (i) / 4)
_Static_assert(AWQ_NIBBLE(NIBBLE_COLUMN(0)) == 0 && AWQ_NIBBLE(NIBBLE_COLUMN(1)) == 1 &&
                   AWQ_NIBBLE(NIBBLE_COLUMN(2)) == 2 && AWQ_NIBBLE(NIBBLE_COLUMN(3)) == 3 &&
                   AWQ_NIBBLE(NIBBLE_COLUMN(4)) == 4 && AWQ_NIBBLE(NIBBLE_COLUMN(5)) == 5 &&
                   AWQ_NIBBLE(NIBBLE_COLUMN(6)) == 6 && AWQ_NIBBLE(NIBBLE_COLUMN(7)) == 7,
               "NIBBLE_COLUMN inverts AWQ_NIBBLE");

/* y[row + n] = round(v + bias[n0 + n]). */
static inline void finish_one(const awq_linear_problem *p, int64_t row, int64_t n0, int64_t n,
                              float v)
{
    if (p->bias)
        v += load_scale(p->bias, n0 + n, p->dtype);
    store_value(p->y, row + n, v, p->dtype);
}

/* y[m0 .. m0 + mb, n0 .. n0 + cols) = round(total + bias).  The vector
 * path's totals are walked in tile order: float lanes i + c of tile t0 is
 * column t0 + 8c + NIBBLE_COLUMN(i). */
static void finish(const plan *pl, const scratch *s, int64_t n0, int64_t cols, int64_t m0, int mb)
{
    const awq_linear_problem *p = pl->p;
    const int lanes = pl->lanes;
    for (int m = 0; m < mb; m++) {
        const float *total = s->total + m * pl->width;
        int64_t row = (m0 + m) * p->N + n0;
        if (lanes == 0) {
            for (int64_t n = 0; n < cols; n++)
                finish_one(p, row, n0, n, total[n]);
            continue;
        }
        for (int64_t t0 = 0; t0 < cols; t0 += 8 * lanes)
            for (int i = 0; i < 8; i++)
                for (int64_t c = 0, n = t0 + NIBBLE_COLUMN(i); c < lanes && n < cols; c++, n += 8)
                    finish_one(p, row, n0, n, total[t0 + lanes * i + c]);
    }
}

/* ---- the scalar path ---- */

static void item_scalar(const plan *pl, const scratch *s, int64_t n0, int64_t cols, int64_t m0,
                        int mb)
{
    const awq_linear_problem *p = pl->p;
    const int64_t K = p->K, N = p->N, G = p->G, groups = K / G, words = N / 8, w0 = n0 / 8;
    for (int64_t i = 0; i < mb * pl->width; i++)
        s->total[i] = 0.0f;
    for (int64_t g = 0; g < groups; g++) {
        const uint32_t *zrow = p->qzeros + g * words + w0;
        int xok[LINEAR_MB];
        for (int m = 0; m < mb; m++)
            xok[m] = pl->xok[(m0 + m) * groups + g];
        for (int64_t n = 0; n < cols; n++) {
            s->zero[n] = (float)((zrow[n / 8] >> (4 * AWQ_NIBBLE(n % 8))) & 0xFu);
            s->scale[n] = load_scale(p->scales, g * N + n0 + n, p->dtype);
            s->mode[n] = (unsigned char)scale_regroups(s->scale[n], p->dtype);
        }
        for (int64_t b0 = g * G; b0 < (g + 1) * G; b0 += LINEAR_KB) {
            int64_t b1 = b0 + LINEAR_KB < (g + 1) * G ? b0 + LINEAR_KB : (g + 1) * G;
            for (int64_t i = 0; i < mb * pl->width; i++)
                s->part[i] = 0.0f;
            for (int64_t k = b0; k < b1; k++) {
                const uint32_t *qrow = p->qweight + k * words + w0;
                for (int64_t n = 0; n < cols; n++) {
                    float q = (float)((qrow[n / 8] >> (4 * AWQ_NIBBLE(n % 8))) & 0xFu);
                    /* q - z is exact in float32, as the integer difference is */
                    float d = q - s->zero[n];
                    float w = round_to(d * s->scale[n], p->dtype);
                    for (int m = 0; m < mb; m++)
                        s->part[m * pl->width + n] +=
                            pl->x[(m0 + m) * K + k] * (xok[m] && s->mode[n] ? d : w);
                }
            }
            for (int m = 0; m < mb; m++)
                for (int64_t n = 0; n < cols; n++) {
                    float v = s->part[m * pl->width + n];
                    if (xok[m] && s->mode[n])
                        v = s->scale[n] * v;
                    s->total[m * pl->width + n] += v;
                }
        }
    }
    finish(pl, s, n0, cols, m0, mb);
}

/* ---- the vector paths (AVX2 + F16C; AVX-512F where the CPU has it) ----
 *
 * Tiles.  A tile is `lanes` consecutive packed words of one row (8 for
 * AVX2, 16 for AVX-512: 64 or 128 columns), loaded as one vector: lane c
 * holds word c.  Nibble i of every lane is column 8c + ORDER[i] of the
 * tile, so "nibble i of all the words" is one vector of columns and needs
 * no per-lane shift.  The scratch keeps each tile's zero points, scales
 * and totals in that order: vector i (floats lanes * i .. lanes * (i + 1)
 * - 1 of the tile) holds columns 8c + ORDER[i], c = 0 .. lanes - 1.
 *
 *     word c:   | n7 | n6 | n5 | n4 | n3 | n2 | n1 | n0 |   (nibble i = bits 4i..4i+3)
 *     vector i of the tile = nibble i of words 0, 1, ... = columns ORDER[i], 8 + ORDER[i], ...
 *
 * q - z without a conversion.  Nibble i, masked in place at bit 4p (p its
 * position after an optional shift), ORed into the float32 2^(23 - 4p),
 * is the float 2^(23 - 4p) + q exactly (the nibble lands in the mantissa
 * at weight 1).  The scratch holds 2^(23 - 4p) + z, so one subtraction
 * gives q - z, exactly (both are integers below 2^24).  A register pass
 * handles np consecutive nibbles i0 .. i0 + np - 1 of the word, each at
 * position p = i % 4 of the word shifted right by 4 (i - p), so that the
 * pass needs at most 4 masks and 4 offsets, kept in registers.
 *
 * Both widths run the same float32 operations in the same order as the
 * scalar path (AVX-512 only does twice the columns per instruction, and
 * merges the mask and the OR into one ternary-logic instruction), so every
 * path gives the same bits.  One exception in form, not in value ("fused"):
 * for float16, x * W + acc is one fused multiply-add.  The product of two
 * float16 values has at most 22 significant bits and lies within float32's
 * normal range, so float32 holds it exactly, and rounding it first (the
 * scalar path's separate multiply) changes nothing: the fused and the
 * separate forms give the same bits, Inf and NaN included.  For bfloat16
 * (whose products can leave float32's range) and float32 the multiply and
 * the addition stay separate.
 *
 * No subnormals.  q - z could come from the masked nibble alone, read as
 * the float32 subnormal q 2^(4p - 149), one instruction fewer than the OR
 * with the offset; with x taken times 2^64 and the scale times 2^(85 - 4p)
 * it gives the same bits.  But Intel cores take a microcode assist for
 * every multiply with a subnormal operand: float16 at M = 1 on 4096 x
 * 14336 took 76.5 ms that way on a Xeon (Sapphire Rapids, AVX-512)
 * against 1.55 ms with the offset, 49 times as long. */

#ifdef AWQ_X86_DISPATCH

/* Whether x * e + acc may be one fused multiply-add: where the product is
 * exact in float32, rounding it first changes nothing.  That is float16
 * alone: x times W (see "fused" above) or times q - z (5 bits).  A
 * float32 x times anything is rounded, so it stays a separate multiply,
 * and a bfloat16 x times W may leave float32's range. */
static inline int fused_product(awq_dtype t) { return t == AWQ_F16; }

/* The offset 2^(23 - 4p) of a nibble at position p (0..4). */
static inline float nibble_offset(int p) { return (float)(1 << (23 - 4 * p)); }

/* Nibble positions: a register pass reads nibble i at position p = i % 4
 * of the word shifted right by 4 (i - p), in both tile widths and for any
 * rows of x, so that one expansion of the zero points serves a row block
 * and each of its rows. */
enum { NIBBLE_POSITIONS = 4 };

/* Nibbles per register pass for mb rows of x: the mb x np accumulators,
 * the masks and offsets of the positions, the words, x's broadcasts and
 * (exact form) the zero points and scales fit in the 16 vector registers
 * of AVX2, or the 32 of AVX-512, or nearly. */
static inline int pass_nibbles(int mb, int lanes, int rg)
{
    if (lanes == 16)
        return rg && mb == 1 ? 8 : 4;
    return mb == 1 ? 4 : 2;
}

#ifdef AWQ_LINEAR_AVX512
/* One full AVX-512 tile's zero points and 16-bit scales in tile order (as
 * expand_avx2 below, with fewer instructions), and its mode where one form
 * serves all its columns (classify_avx2 below), else 0.  The scales are put in
 * order as 16-bit words, then widened: vector i takes column 8c + ORDER[i]
 * of words c = 0..15.  permutex2var_epi16 gathers words c = 0..7 (columns
 * 0..63) of four vectors from the first two registers and words 8..15 from
 * the last two (tile16_order: vectors 0..3, then 4..7, eight words each),
 * and permutex2var_epi64 joins each vector's two halves. */
static const uint16_t tile16_order[2][32] = {
    {0, 8, 16, 24, 32, 40, 48, 56, 2, 10, 18, 26, 34, 42, 50, 58, /* ORDER 0, 2 */
     4, 12, 20, 28, 36, 44, 52, 60, 6, 14, 22, 30, 38, 46, 54, 62}, /* ORDER 4, 6 */
    {1, 9, 17, 25, 33, 41, 49, 57, 3, 11, 19, 27, 35, 43, 51, 59,  /* ORDER 1, 3 */
     5, 13, 21, 29, 37, 45, 53, 61, 7, 15, 23, 31, 39, 47, 55, 63}, /* ORDER 5, 7 */
};

__attribute__((target("avx512f,avx512bw,avx2,f16c"))) static int
expand_tile16(const uint32_t *zw, const uint16_t *sc, float *zero, float *scale, awq_dtype t)
{
    unsigned all = 0xFFFFu, any = 0; /* float16: which columns regroup (scale_regroups) */
    enum { P = NIBBLE_POSITIONS };
    __m512i z0 = _mm512_loadu_si512(zw), z[2] = {z0, _mm512_srli_epi32(z0, 4 * P)};
    for (int i = 0; i < 8; i++) { /* as the tiles read q: 2^(23 - 4p) + z */
        __m512i mask = _mm512_set1_epi32(0xF << (4 * (i % P)));
        __m512i offset = _mm512_castps_si512(_mm512_set1_ps(nibble_offset(i % P)));
        _mm512_storeu_si512(zero + 16 * i, _mm512_ternarylogic_epi32(z[i / P], mask, offset, 0xEA));
    }
    __m512i a = _mm512_loadu_si512(sc), b = _mm512_loadu_si512(sc + 32);
    __m512i c = _mm512_loadu_si512(sc + 64), d = _mm512_loadu_si512(sc + 96);
    const __m512i join[2] = {_mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11),
                             _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15)};
    for (int k = 0; k < 2; k++) {
        __m512i order = _mm512_loadu_si512(tile16_order[k]);
        __m512i lo = _mm512_permutex2var_epi16(a, order, b);
        __m512i hi = _mm512_permutex2var_epi16(c, order, d);
        for (int r = 0; r < 2; r++) { /* vectors 4k + 2r and 4k + 2r + 1 */
            __m512i v = _mm512_permutex2var_epi64(lo, join[r], hi);
            __m256i h[2] = {_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)};
            for (int e = 0; e < 2; e++) {
                __m512 f = t == AWQ_F16 ? _mm512_cvtph_ps(h[e])
                                        : _mm512_castsi512_ps(
                                              _mm512_slli_epi32(_mm512_cvtepu16_epi32(h[e]), 16));
                _mm512_storeu_ps(scale + 16 * (4 * k + 2 * r + e), f);
                __m512 a15 = _mm512_mul_ps(_mm512_abs_ps(f), _mm512_set1_ps(15.0f));
                unsigned ok = _mm512_cmp_ps_mask(a15, _mm512_set1_ps(65504.0f), _CMP_LE_OQ);
                all &= ok;
                any |= ok;
            }
        }
    }
    if (t == AWQ_BF16)
        return MODE_EXACT;
    int mode = (all != 0xFFFFu ? MODE_EXACT : 0) | (any != 0 ? MODE_REGROUP : 0);
    return mode == (MODE_EXACT | MODE_REGROUP) ? 0 : mode; /* 0: classify_avx2 splits it */
}
#endif

/* The group's zero points and scales of columns [n0, n0 + cols) in tile
 * order; the lanes past cols get zero point 0 and scale 0, so that their
 * (zero-padded) words give W = 0 and never a NaN.  Eight words at a time,
 * so the same code serves both tile widths. */
__attribute__((target("avx2,f16c"))) static void expand_avx2(const plan *pl, const scratch *s,
                                                             int64_t g, int64_t n0, int64_t cols)
{
    enum { P = NIBBLE_POSITIONS };
    const awq_linear_problem *p = pl->p;
    const int64_t N = p->N, words = N / 8, T = 8 * pl->lanes;
    const int lanes = pl->lanes;
    const uint32_t *zrow = p->qzeros + g * words + n0 / 8;
    if ((g + 1) * p->G < p->K) { /* the next group's scales and zero points, into L2 */
        const char *next = (const char *)p->scales + ((g + 1) * N + n0) * awq_dtype_size(p->dtype);
        for (int64_t b = 0; b < cols * (int64_t)awq_dtype_size(p->dtype); b += 64)
            _mm_prefetch(next + b, _MM_HINT_T1);
        for (int64_t b = 0; b < cols / 2; b += 64)
            _mm_prefetch((const char *)(zrow + words) + b, _MM_HINT_T1);
    }
    for (int64_t t0 = 0; t0 < cols; t0 += T) {
        float *zero = s->zero + t0, *scale = s->scale + t0;
        s->mode[t0 / T] = 0; /* classify_avx2 decides */
#ifdef AWQ_LINEAR_AVX512
        if (lanes == 16 && t0 + T <= cols && p->dtype != AWQ_F32) {
            const uint16_t *sc = (const uint16_t *)p->scales + g * N + n0 + t0;
            s->mode[t0 / T] =
                (unsigned char)expand_tile16(zrow + t0 / 8, sc, zero, scale, p->dtype);
            continue;
        }
#endif
        if (t0 + T > cols) {
            for (int i = 0; i < 8; i++)
                for (int c = 0; c < lanes; c++) {
                    zero[lanes * i + c] = nibble_offset(i % P);
                    scale[lanes * i + c] = 0.0f;
                }
            for (int64_t col = t0; col < cols; col++) {
                int64_t at = tile_pos(col, lanes) - t0;
                int i = AWQ_NIBBLE(col % 8);
                zero[at] = nibble_offset(i % P) + (float)((zrow[col / 8] >> (4 * i)) & 0xFu);
                scale[at] = load_scale(p->scales, g * N + n0 + col, p->dtype);
            }
            continue;
        }
        for (int h = 0; h < lanes; h += 8) { /* words t0/8 + h .. + 7 */
            /* zero points: nibble i of the 8 words is vector i already,
             * and the tiles' trick makes it the float 2^(23 - 4p) + z */
            __m256i zw = _mm256_loadu_si256((const __m256i *)(zrow + t0 / 8 + h));
            for (int i = 0; i < 8; i++) {
                const int pos = i % P;
                __m256i z = _mm256_and_si256(_mm256_srli_epi32(zw, 4 * (i - pos)),
                                             _mm256_set1_epi32(0xF << (4 * pos)));
                __m256 offset = _mm256_set1_ps(nibble_offset(pos));
                _mm256_storeu_ps(zero + lanes * i + h,
                                 _mm256_or_ps(_mm256_castsi256_ps(z), offset));
            }
            /* scales: 8 rows (words) of 8 columns, transposed so that
             * column j of every word lands in vector AWQ_NIBBLE(j) */
            __m256 r[8];
            for (int c = 0; c < 8; c++) {
                int64_t at = g * N + n0 + t0 + 8 * (h + c);
                if (p->dtype == AWQ_F16)
                    r[c] = _mm256_cvtph_ps(
                        _mm_loadu_si128((const __m128i *)((const uint16_t *)p->scales + at)));
                else if (p->dtype == AWQ_BF16)
                    r[c] = _mm256_castsi256_ps(_mm256_slli_epi32(
                        _mm256_cvtepu16_epi32(
                            _mm_loadu_si128((const __m128i *)((const uint16_t *)p->scales + at))),
                        16));
                else
                    r[c] = _mm256_loadu_ps((const float *)p->scales + at);
            }
            __m256 a[8], b[8];
            for (int c = 0; c < 8; c += 2) {
                a[c] = _mm256_unpacklo_ps(r[c], r[c + 1]);
                a[c + 1] = _mm256_unpackhi_ps(r[c], r[c + 1]);
            }
            for (int c = 0; c < 8; c += 4) {
                b[c] = _mm256_shuffle_ps(a[c], a[c + 2], 0x44);
                b[c + 1] = _mm256_shuffle_ps(a[c], a[c + 2], 0xEE);
                b[c + 2] = _mm256_shuffle_ps(a[c + 1], a[c + 3], 0x44);
                b[c + 3] = _mm256_shuffle_ps(a[c + 1], a[c + 3], 0xEE);
            }
            /* b[j] (j < 4) holds column j of words 0..3 in its low half and
             * column j + 4 in its high half; b[j + 4] the same for words 4..7 */
            for (int j = 0; j < 4; j++) {
                _mm256_storeu_ps(scale + lanes * AWQ_NIBBLE(j) + h,
                                 _mm256_permute2f128_ps(b[j], b[j + 4], 0x20));
                _mm256_storeu_ps(scale + lanes * AWQ_NIBBLE(j + 4) + h,
                                 _mm256_permute2f128_ps(b[j], b[j + 4], 0x31));
            }
        }
    }
}

/* The tiles' modes: whether their columns take the exact form, the
 * regrouped one, or both (scale_regroups, eight columns at a time, the same
 * test to the bit).  A tile with both runs both forms, each on its own
 * copy of the scales: escale keeps the exact columns' scales and rscale
 * the regrouped columns', 0 elsewhere, so that in each form the other
 * form's columns add +0 (x is finite in a regrouped row) to totals that
 * are never -0, which changes no bit.  The padding past cols (scale 0)
 * counts as regrouped. */
static inline __attribute__((always_inline, target("avx2,f16c"))) __m256
regroups8(__m256 sc, const awq_dtype t)
{
    __m256 a = _mm256_and_ps(sc, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
    if (t == AWQ_F16)
        return _mm256_cmp_ps(_mm256_mul_ps(a, _mm256_set1_ps(15.0f)), _mm256_set1_ps(65504.0f),
                             _CMP_LE_OQ);
    return _mm256_cmp_ps(a, _mm256_set1_ps(REGROUP_S_MAX), _CMP_LE_OQ);
}

__attribute__((target("avx2,f16c"))) static void classify_avx2(const plan *pl, const scratch *s,
                                                               int64_t cols)
{
    const int64_t T = 8 * pl->lanes;
    const awq_dtype t = pl->p->dtype;
    for (int64_t t0 = 0; t0 < cols; t0 += T) {
        if (s->mode[t0 / T] != 0) /* decided by expand_tile16 */
            continue;
        if (t == AWQ_BF16) {
            s->mode[t0 / T] = MODE_EXACT;
            continue;
        }
        int all = 0xFF, any = 0;
        for (int64_t i = t0; i < t0 + T; i += 8) {
            int bits = _mm256_movemask_ps(regroups8(_mm256_loadu_ps(s->scale + i), t));
            all &= bits;
            any |= bits;
        }
        int mode = (all != 0xFF ? MODE_EXACT : 0) | (any != 0 ? MODE_REGROUP : 0);
        s->mode[t0 / T] = (unsigned char)mode;
        if (mode != (MODE_EXACT | MODE_REGROUP))
            continue;
        for (int64_t i = t0; i < t0 + T; i += 8) {
            __m256 sc = _mm256_loadu_ps(s->scale + i), ok = regroups8(sc, t);
            _mm256_storeu_ps(s->escale + i, _mm256_andnot_ps(ok, sc));
            _mm256_storeu_ps(s->rscale + i, _mm256_and_ps(ok, sc));
        }
    }
}

/* W rounded to the dtype and widened back, 8 lanes.  bfloat16: round to
 * nearest even at bit 16.  A NaN here is always a bfloat16 NaN (the
 * scale's, or the default NaN of Inf * 0), whose low 16 bits are zero: the
 * addition cannot carry out of them, and it stays a NaN. */
static inline __attribute__((always_inline, target("avx2,f16c,fma"))) __m256
round8(__m256 e, const awq_dtype t)
{
    if (t == AWQ_F16)
        return _mm256_cvtph_ps(_mm256_cvtps_ph(e, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (t == AWQ_BF16) {
        __m256i b = _mm256_castps_si256(e);
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
        b = _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), lsb);
        return _mm256_castsi256_ps(_mm256_and_si256(b, _mm256_set1_epi32((int)0xFFFF0000u)));
    }
    return e;
}

/* One register pass: nibbles [i0, i0 + np) of one tile, rows k of one
 * block (nk of them, `stride` words apart), mb rows of x.  Nibble i is
 * read at position i % P of the word shifted right by 4 (i - i % P), P =
 * NIBBLE_POSITIONS.  The partial sums live in registers and are added to
 * the totals at the end: as they are (exact form) or times the scales
 * (regrouped).  Called with constant mb, i0, np, t and rg, so that every
 * loop below unrolls and acc[][] becomes registers. */
static inline __attribute__((always_inline, target("avx2,f16c,fma"))) void
pass8(const uint32_t *qw, int64_t stride, int64_t nk, const float *x, int64_t K,
      const float *zero, const float *scale, float *total, int64_t width, const int mb,
      const int i0, const int np, const awq_dtype t, const int rg)
{
    enum { P = NIBBLE_POSITIONS };
    __m256 acc[LINEAR_MB][4];
    __m256i mask[P];
    __m256 offset[P];
#pragma GCC unroll 4
    for (int j = 0; j < P; j++) {
        mask[j] = _mm256_set1_epi32(0xF << (4 * j));
        offset[j] = _mm256_set1_ps(nibble_offset(j));
    }
#pragma GCC unroll 4
    for (int m = 0; m < mb; m++)
#pragma GCC unroll 4
        for (int j = 0; j < np; j++)
            acc[m][j] = _mm256_setzero_ps();

    for (int64_t k = 0; k < nk; k++) {
        /* the same tile row one block ahead, into L2 (where a chunk's
         * block of rows fits) while this block computes: a chunk reads
         * short runs of many rows, which the hardware prefetchers alone
         * follow poorly.  A prefetch never faults, past the end included. */
        if (i0 == 0)
            _mm_prefetch((const char *)(qw + (k + LINEAR_KB) * stride), _MM_HINT_T1);
        __m256i w0 = _mm256_loadu_si256((const __m256i *)(qw + k * stride));
        __m256i w[2]; /* the word shifted for nibbles i0 / P * P + P r on */
#pragma GCC unroll 2
        for (int r = 0; r <= (i0 + np - 1) / P - i0 / P; r++)
            w[r] = i0 / P + r > 0 ? _mm256_srli_epi32(w0, 4 * P * (i0 / P + r)) : w0;
        __m256 xm[LINEAR_MB];
#pragma GCC unroll 4
        for (int m = 0; m < mb; m++)
            xm[m] = _mm256_broadcast_ss(x + m * K + k);
#pragma GCC unroll 4
        for (int j = 0; j < np; j++) {
            const int i = i0 + j;
            __m256i bits = _mm256_and_si256(w[i / P - i0 / P], mask[i % P]);
            __m256 d = _mm256_sub_ps(_mm256_or_ps(_mm256_castsi256_ps(bits), offset[i % P]),
                                     _mm256_loadu_ps(zero + 8 * i));
            /* exact: W rounded to the dtype; regrouped: q - z itself */
            __m256 e = rg ? d : round8(_mm256_mul_ps(d, _mm256_loadu_ps(scale + 8 * i)), t);
#pragma GCC unroll 4
            for (int m = 0; m < mb; m++)
                acc[m][j] = fused_product(t)
                                ? _mm256_fmadd_ps(xm[m], e, acc[m][j])
                                : _mm256_add_ps(acc[m][j], _mm256_mul_ps(xm[m], e));
        }
    }

#pragma GCC unroll 4
    for (int m = 0; m < mb; m++)
#pragma GCC unroll 4
        for (int j = 0; j < np; j++) {
            float *at = total + m * width + 8 * (i0 + j);
            __m256 a = rg ? _mm256_mul_ps(_mm256_loadu_ps(scale + 8 * (i0 + j)), acc[m][j])
                          : acc[m][j];
            _mm256_storeu_ps(at, _mm256_add_ps(_mm256_loadu_ps(at), a));
        }
}

/* One block of one tile for mb rows: 8 / np passes of np nibbles. */
static inline __attribute__((always_inline, target("avx2,f16c,fma"))) void
tile8(const uint32_t *qw, int64_t stride, int64_t nk, const float *x, int64_t K,
      const float *zero, const float *scale, float *total, int64_t width, const int mb,
      const awq_dtype t, const int rg)
{
    const int np = pass_nibbles(mb, 8, rg);
#pragma GCC unroll 8
    for (int i0 = 0; i0 < 8; i0 += np)
        pass8(qw, stride, nk, x, K, zero, scale, total, width, mb, i0, np, t, rg);
}

typedef void (*tile_fn)(const uint32_t *, int64_t, int64_t, const float *, int64_t, const float *,
                        const float *, float *, int64_t);

/* The tile functions of one width: [regrouped][dtype][mb - 1] (bfloat16
 * never regroups). */
#define TILE_FNS(BODY, TARGET, W)                                                                 \
    TILE_MBS(BODY, TARGET, W, 0, exact, f16, AWQ_F16)                                             \
    TILE_MBS(BODY, TARGET, W, 0, exact, bf16, AWQ_BF16)                                           \
    TILE_MBS(BODY, TARGET, W, 0, exact, f32, AWQ_F32)                                             \
    TILE_MBS(BODY, TARGET, W, 1, regroup, f16, AWQ_F16)                                           \
    TILE_MBS(BODY, TARGET, W, 1, regroup, f32, AWQ_F32)                                           \
    static const tile_fn tiles##W[2][AWQ_NUM_DTYPES][LINEAR_MB] = {                               \
        {TILE_ROW(W, exact, f16), TILE_ROW(W, exact, bf16), TILE_ROW(W, exact, f32)},             \
        {TILE_ROW(W, regroup, f16), {NULL}, TILE_ROW(W, regroup, f32)},                           \
    };

#define TILE_ROW(W, MODE, NAME)                                                                   \
    {tile##W##_##MODE##_##NAME##_1, tile##W##_##MODE##_##NAME##_2,                                \
     tile##W##_##MODE##_##NAME##_3, tile##W##_##MODE##_##NAME##_4}

#define TILE_MBS(BODY, TARGET, W, RG, MODE, NAME, T)                                              \
    TILE_FN(BODY, TARGET, W, RG, MODE, NAME, 1, T) TILE_FN(BODY, TARGET, W, RG, MODE, NAME, 2, T) \
    TILE_FN(BODY, TARGET, W, RG, MODE, NAME, 3, T) TILE_FN(BODY, TARGET, W, RG, MODE, NAME, 4, T)

#define TILE_FN(BODY, TARGET, W, RG, MODE, NAME, MB, T)                                           \
    __attribute__((target(TARGET))) static void tile##W##_##MODE##_##NAME##_##MB(                 \
        const uint32_t *qw, int64_t stride, int64_t nk, const float *x, int64_t K,               \
        const float *zero, const float *scale, float *total, int64_t width)                      \
    {                                                                                             \
        BODY(qw, stride, nk, x, K, zero, scale, total, width, MB, T, RG);                         \
    }

TILE_FNS(tile8, "avx2,f16c,fma", 8)

#ifdef AWQ_LINEAR_AVX512

/* The AVX-512 tile: 16 words.  round8 on 16 lanes. */
static inline __attribute__((always_inline, target("avx512f,avx2,f16c"))) __m512
round16(__m512 e, const awq_dtype t)
{
    if (t == AWQ_F16)
        return _mm512_cvtph_ps(_mm512_cvtps_ph(e, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (t == AWQ_BF16) { /* as round8 */
        __m512i b = _mm512_castps_si512(e);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
        b = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), lsb);
        return _mm512_castsi512_ps(_mm512_and_si512(b, _mm512_set1_epi32((int)0xFFFF0000u)));
    }
    return e;
}

/* The pass of pass8 on 16 lanes. */
static inline __attribute__((always_inline, target("avx512f,avx2,f16c"))) void
pass16(const uint32_t *qw, int64_t stride, int64_t nk, const float *x, int64_t K,
       const float *zero, const float *scale, float *total, int64_t width, const int mb,
       const int i0, const int np, const awq_dtype t, const int rg)
{
    enum { P = NIBBLE_POSITIONS };
    __m512 acc[LINEAR_MB][8];
    __m512i mask[P], offset[P];
#pragma GCC unroll 4
    for (int j = 0; j < P; j++) {
        mask[j] = _mm512_set1_epi32(0xF << (4 * j));
        offset[j] = _mm512_castps_si512(_mm512_set1_ps(nibble_offset(j)));
    }
#pragma GCC unroll 4
    for (int m = 0; m < mb; m++)
#pragma GCC unroll 8
        for (int j = 0; j < np; j++)
            acc[m][j] = _mm512_setzero_ps();

    for (int64_t k = 0; k < nk; k++) {
        if (i0 == 0) /* as in pass8 */
            _mm_prefetch((const char *)(qw + (k + LINEAR_KB) * stride), _MM_HINT_T1);
        __m512i w0 = _mm512_loadu_si512((const void *)(qw + k * stride));
        __m512i w[2];
#pragma GCC unroll 2
        for (int r = 0; r <= (i0 + np - 1) / P - i0 / P; r++)
            w[r] = i0 / P + r > 0 ? _mm512_srli_epi32(w0, 4 * P * (i0 / P + r)) : w0;
        __m512 xm[LINEAR_MB];
#pragma GCC unroll 4
        for (int m = 0; m < mb; m++)
            xm[m] = _mm512_set1_ps(x[m * K + k]);
#pragma GCC unroll 8
        for (int j = 0; j < np; j++) {
            const int i = i0 + j;
            /* (w & mask) | offset in one instruction: 0xEA is the truth
             * table of (a & b) | c */
            __m512i q = _mm512_ternarylogic_epi32(w[i / P - i0 / P], mask[i % P], offset[i % P],
                                                  0xEA);
            __m512 d = _mm512_sub_ps(_mm512_castsi512_ps(q), _mm512_loadu_ps(zero + 16 * i));
            __m512 e = rg ? d : round16(_mm512_mul_ps(d, _mm512_loadu_ps(scale + 16 * i)), t);
#pragma GCC unroll 4
            for (int m = 0; m < mb; m++)
                acc[m][j] = fused_product(t)
                                ? _mm512_fmadd_ps(xm[m], e, acc[m][j])
                                : _mm512_add_ps(acc[m][j], _mm512_mul_ps(xm[m], e));
        }
    }

#pragma GCC unroll 4
    for (int m = 0; m < mb; m++)
#pragma GCC unroll 8
        for (int j = 0; j < np; j++) {
            float *at = total + m * width + 16 * (i0 + j);
            __m512 a = rg ? _mm512_mul_ps(_mm512_loadu_ps(scale + 16 * (i0 + j)), acc[m][j])
                          : acc[m][j];
            _mm512_storeu_ps(at, _mm512_add_ps(_mm512_loadu_ps(at), a));
        }
}

static inline __attribute__((always_inline, target("avx512f,avx2,f16c"))) void
tile16(const uint32_t *qw, int64_t stride, int64_t nk, const float *x, int64_t K,
       const float *zero, const float *scale, float *total, int64_t width, const int mb,
       const awq_dtype t, const int rg)
{
    const int np = pass_nibbles(mb, 16, rg);
#pragma GCC unroll 8
    for (int i0 = 0; i0 < 8; i0 += np)
        pass16(qw, stride, nk, x, K, zero, scale, total, width, mb, i0, np, t, rg);
}

TILE_FNS(tile16, "avx512f,avx2,f16c", 16)

#endif /* AWQ_LINEAR_AVX512 */

/* Packed words per vector tile on this CPU: 16 where AVX-512F and BW run,
 * else 8; 0 (the scalar path) on the rare AVX2 CPU without FMA.  The caller
 * has checked awq_cpu_use_avx2(). */
static int vector_lanes(void)
{
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = !__builtin_cpu_supports("fma") ? 0 : 8;
#ifdef AWQ_LINEAR_AVX512
        if (cached && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
            cached = 16;
#endif
    }
    return cached;
}

/* One block of one tile (its words at qw, `stride` apart) for the item's mb
 * rows; bit m of xok is set where row m may regroup in this group.  A row
 * that may not regroup takes the exact form with the group's scales,
 * whatever the tile's mode.  Rows that agree go through the tile functions
 * together, else one by one. */
static void run_tile(const plan *pl, const scratch *s, const tile_fn *exact,
                     const tile_fn *regroup, const uint32_t *qw, int64_t stride, int64_t nk,
                     const float *x, int64_t t0, int mode, int mb, unsigned xok)
{
    const int64_t K = pl->p->K, width = pl->width;
    const unsigned all = (1u << mb) - 1;
    if (xok == 0 || mode == MODE_EXACT) {
        exact[mb - 1](qw, stride, nk, x, K, s->zero + t0, s->scale + t0, s->total + t0, width);
        return;
    }
    for (int m = 0; m < mb; m++) {
        int rows = xok == all ? mb : 1; /* rows from m on, all in one call */
        float *total = s->total + m * width + t0;
        if (!(xok >> m & 1u)) {
            exact[0](qw, stride, nk, x + m * K, K, s->zero + t0, s->scale + t0, total, width);
            continue;
        }
        const int both = mode == (MODE_EXACT | MODE_REGROUP);
        if (mode & MODE_EXACT)
            exact[rows - 1](qw, stride, nk, x + m * K, K, s->zero + t0,
                            (both ? s->escale : s->scale) + t0, total, width);
        if (mode & MODE_REGROUP)
            regroup[rows - 1](qw, stride, nk, x + m * K, K, s->zero + t0,
                              (both ? s->rscale : s->scale) + t0, total, width);
        m += rows - 1;
    }
}

static void item_vector(const plan *pl, const scratch *s, int64_t n0, int64_t cols, int64_t m0,
                        int mb)
{
    const awq_linear_problem *p = pl->p;
    const int64_t K = p->K, G = p->G, groups = K / G, words = p->N / 8;
    const int lanes = pl->lanes;
    const int64_t T = 8 * lanes;
#ifdef AWQ_LINEAR_AVX512
    const tile_fn(*tiles)[AWQ_NUM_DTYPES][LINEAR_MB] = lanes == 16 ? tiles16 : tiles8;
#else
    const tile_fn(*tiles)[AWQ_NUM_DTYPES][LINEAR_MB] = tiles8;
#endif
    const tile_fn *exact = tiles[0][p->dtype], *regroup = tiles[1][p->dtype];
    const float *x = pl->x + m0 * K;
    for (int64_t i = 0; i < mb * pl->width; i++)
        s->total[i] = 0.0f;
    for (int64_t g = 0; g < groups; g++) {
        expand_avx2(pl, s, g, n0, cols);
        classify_avx2(pl, s, cols);
        unsigned xok = 0;
        for (int m = 0; m < mb; m++)
            xok |= (unsigned)pl->xok[(m0 + m) * groups + g] << m;
        for (int64_t b0 = g * G; b0 < (g + 1) * G; b0 += LINEAR_KB) {
            int64_t nk = b0 + LINEAR_KB < (g + 1) * G ? LINEAR_KB : (g + 1) * G - b0;
            const uint32_t *qw = p->qweight + b0 * words + n0 / 8;
            for (int64_t t0 = 0; t0 < cols; t0 += T) {
                int mode = s->mode[t0 / T];
                if (t0 + T <= cols) {
                    run_tile(pl, s, exact, regroup, qw + t0 / 8, words, nk, x + b0, t0,
                             mode, mb, xok);
                } else {
                    /* a partial tile: its words, padded with zeros */
                    int64_t nw = (cols - t0) / 8;
                    for (int64_t k = 0; k < nk; k++)
                        for (int64_t c = 0; c < lanes; c++)
                            s->tail[lanes * k + c] = c < nw ? qw[k * words + t0 / 8 + c] : 0u;
                    run_tile(pl, s, exact, regroup, s->tail, lanes, nk, x + b0, t0,
                             mode, mb, xok);
                }
            }
        }
    }
    finish(pl, s, n0, cols, m0, mb);
}

/* x in float32, converted with F16C (exact, as the scalar conversion). */
__attribute__((target("avx2,f16c"))) static void widen_avx2(const void *src, float *dst,
                                                            int64_t n, awq_dtype t)
{
    const uint16_t *h = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(h + i));
        __m256 f = t == AWQ_F16
                       ? _mm256_cvtph_ps(v)
                       : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
        _mm256_storeu_ps(dst + i, f);
    }
    for (; i < n; i++)
        dst[i] = load_scale(src, i, t);
}

#endif /* AWQ_X86_DISPATCH */

static void widen(const plan *pl, const void *src, float *dst, int64_t n, awq_dtype t)
{
#ifdef AWQ_X86_DISPATCH
    if (pl->lanes) {
        widen_avx2(src, dst, n, t);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++)
        dst[i] = load_scale(src, i, t);
}

/* Work item i: chunk i % chunks of the columns, row block i / chunks. */
static void run_item(const plan *pl, const scratch *s, int64_t i)
{
    const awq_linear_problem *p = pl->p;
    int64_t n0 = i % pl->chunks * pl->chunk;
    int64_t cols = n0 + pl->chunk < p->N ? pl->chunk : p->N - n0;
    int64_t m0 = i / pl->chunks * LINEAR_MB;
    int mb = (int)(m0 + LINEAR_MB < p->M ? LINEAR_MB : p->M - m0);
#ifdef AWQ_X86_DISPATCH
    if (pl->lanes) {
        item_vector(pl, s, n0, cols, m0, mb);
        return;
    }
#endif
    item_scalar(pl, s, n0, cols, m0, mb);
}

static int64_t default_chunk(int64_t N, int threads)
{
    const int64_t tile = 8 * LINEAR_LANES_MAX, items = (int64_t)threads * LINEAR_ITEMS_PER_THREAD;
    int64_t chunk = (N + items - 1) / items;
    if (chunk <= LINEAR_CHUNK_MIN)
        return LINEAR_CHUNK_MIN;
    return (chunk + tile - 1) / tile * tile;
}

awq_status awq_cpu_linear(const awq_linear_problem *p, const awq_config *c)
{
    if (c->kernel == AWQ_KERNEL_AMX) {
        /* cpu/amx.c, or this kernel where the tiles cannot take the call */
        int ran = 0;
        awq_status s = awq_cpu_linear_amx(p, c, &ran);
        if (s != AWQ_OK || ran)
            return s;
        const awq_config exact = {.kernel = AWQ_KERNEL_CPU, .threads = c->threads};
        return awq_cpu_linear(p, &exact);
    }
    if (c->threads < 0 || c->chunk < 0 || c->chunk % 8 != 0 ||
        (c->kernel != AWQ_KERNEL_AUTO && c->kernel != AWQ_KERNEL_CPU))
        return AWQ_ERR_CONFIG;
    if (p->M <= 0 || p->N <= 0)
        return AWQ_OK;
    if (p->K == 0) { /* an empty sum: y = bias, or zeros */
        for (int64_t m = 0; m < p->M; m++)
            for (int64_t n = 0; n < p->N; n++)
                store_value(p->y, m * p->N + n, p->bias ? load_scale(p->bias, n, p->dtype) : 0.0f,
                            p->dtype);
        return AWQ_OK;
    }

    int threads = awq_cpu_threads(c->threads);
    plan pl = {.p = p};
#ifdef AWQ_X86_DISPATCH
    pl.lanes = awq_cpu_use_avx2() ? vector_lanes() : 0;
#endif
    /* A hand-edited autotune entry may ask for more columns than N: clamp,
     * so that the scratch stays the size of the work. */
    pl.chunk = c->chunk > 0 ? c->chunk : default_chunk(p->N, threads);
    if (pl.chunk > p->N)
        pl.chunk = p->N;
    const int64_t widest = 8 * LINEAR_LANES_MAX; /* columns of the widest tile */
    pl.width = (pl.chunk + widest - 1) / widest * widest;
    pl.chunks = (p->N + pl.chunk - 1) / pl.chunk;
    const int64_t blocks = (p->M + LINEAR_MB - 1) / LINEAR_MB; /* items along M */
    const int64_t items = pl.chunks * blocks;
    if (threads > items)
        threads = (int)items;
    if (threads < 1)
        threads = 1;

    /* Everything is allocated here, before any thread starts: x in float32
     * (unless it already is), the rows' regrouping flags and one scratch per
     * thread. */
    size_t per = scratch_bytes(pl.width);
    if ((uint64_t)p->M > SIZE_MAX / sizeof(float) / 2 / (uint64_t)p->K)
        return AWQ_ERR_NOMEM;
    size_t xbytes = 0;
    if (p->dtype != AWQ_F32) {
        xbytes = (size_t)p->M * (size_t)p->K * sizeof(float);
        xbytes = (xbytes + LINEAR_ALIGN - 1) / LINEAR_ALIGN * LINEAR_ALIGN;
    }
    /* M (K / G) <= M K: no overflow after the check above */
    size_t okbytes = (size_t)p->M * (size_t)(p->K / p->G);
    okbytes = (okbytes + LINEAR_ALIGN - 1) / LINEAR_ALIGN * LINEAR_ALIGN;
    if (xbytes > SIZE_MAX - okbytes || (size_t)threads > (SIZE_MAX - xbytes - okbytes) / per)
        return AWQ_ERR_NOMEM;
    char *mem = aligned_alloc(LINEAR_ALIGN, xbytes + okbytes + per * (size_t)threads);
    if (mem == NULL)
        return AWQ_ERR_NOMEM;
    if (p->dtype == AWQ_F32) {
        pl.x = p->x;
    } else {
        widen(&pl, p->x, (float *)mem, p->M * p->K, p->dtype);
        pl.x = (const float *)mem;
    }
    rows_regroup(&pl, (unsigned char *)(mem + xbytes));
    pl.xok = (const unsigned char *)(mem + xbytes);
    char *scratch_mem = mem + xbytes + okbytes;

    if (threads == 1) { /* also every forked child (cpu/platform.c) */
        unsigned env = awq_cpu_fp_enter();
        scratch s = scratch_at(scratch_mem, pl.width);
        for (int64_t i = 0; i < items; i++)
            run_item(&pl, &s, i);
        awq_cpu_fp_leave(env);
    }
#ifdef _OPENMP
    else {
#pragma omp parallel num_threads(threads)
        {
            unsigned env = awq_cpu_fp_enter();
            scratch s = scratch_at(scratch_mem + per * (size_t)omp_get_thread_num(), pl.width);
            /* dynamic: a core shared with other processes takes fewer
             * items.  The schedule decides only who computes an output
             * element, never the order of its sum. */
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < items; i++)
                run_item(&pl, &s, i);
            awq_cpu_fp_leave(env);
        }
    }
#endif
    free(mem);
    return AWQ_OK;
}

const char *awq_cpu_linear_simd(void)
{
#ifdef AWQ_X86_DISPATCH
    if (awq_cpu_use_avx2()) {
        int lanes = vector_lanes();
        if (lanes)
            return lanes == 16 ? "avx512f+f16c" : "avx2+f16c+fma";
    }
#endif
    return "scalar";
}

/* ---- tuning ---- */

int awq_cpu_linear_candidates(const awq_linear_problem *p, awq_config *configs, int cap)
{
    static const int64_t chunks[] = {64, 128, 256, 512, 1024, 2048, 4096, 8192};
    /* a work item is a chunk of N for one block of LINEAR_MB rows of x */
    const int64_t blocks = p && p->M > 0 ? (p->M + LINEAR_MB - 1) / LINEAR_MB : 0;
    int n = awq_cpu_grid_candidates(AWQ_KERNEL_CPU, chunks, (int)(sizeof chunks / sizeof chunks[0]),
                                    p ? p->N : 0, blocks, configs, cap);
    /* the AMX tiles (cpu/amx.c): its default, then its grid; a work item
     * is a chunk of N for one block of AWQ_CPU_AMX_ROWS rows of x */
    if (p && blocks > 0 && n < cap && awq_cpu_amx_fits(p)) {
        static const int64_t widths[] = {128, 256, 512, 1024};
        const int64_t amx_blocks = (p->M + AWQ_CPU_AMX_ROWS - 1) / AWQ_CPU_AMX_ROWS;
        n += awq_cpu_grid_candidates(AWQ_KERNEL_AMX, widths, (int)(sizeof widths / sizeof *widths),
                                     p->N, amx_blocks, configs + n, cap - n);
    }
    return n;
}
