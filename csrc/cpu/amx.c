/*
 * cpu/amx.c -- the fused W4A16 linear for bfloat16, float16 and float32
 * on Intel AMX tiles (DESIGN.md section 7):
 *
 *     y[m, n] = round( sum_k x[m, k] * W[k, n]  +  bias[n] )
 *
 * W[k, n] is dequantize's value in x's dtype, round( float32(q - z) *
 * float32(s) ), written by AVX-512 code into a small panel in the layout
 * the tiles read (pairs of rows interleaved, "VNNI"), one block of K and a
 * chunk of columns at a time; it stays in the core's caches and is never
 * written to memory as a matrix.  TDPBF16PS multiplies 16 rows of x by 16
 * columns of the panel over 32 rows of K: bfloat16 products, exact in
 * float32, added in float32.
 *
 * float16 and float32 have no tiles of their own on these cores, and
 * their values have more significant bits than bfloat16's 8, so they take
 * the sum as DESIGN.md's regrouping, s * sum_k (q - z) x per group: the
 * panel holds q - z, small integers that bfloat16 holds exactly, and each
 * x is split into bfloat16 parts that add up to it exactly.  float16 (11
 * significant bits): two, hi, x with its low 16 bits (as float32) cleared,
 * and lo = x - hi.  float32 (24): three, x1 its top 16 bits, x2 the top 16
 * bits of x - x1 and x3 = x - x1 - x2.  Per 32 rows of K the tiles add the
 * parts' products with q - z in that order, every one exact; each stretch
 * of a group inside a block of K (below) is summed apart, multiplied by
 * its scales in one FMA per output and added to the total.  This differs
 * from the sum over dequantize's W by W's rounding, at most 2^-11 |W| for
 * float16 and 2^-24 |W| for float32, inside the tolerance's 2^-9 (not
 * bfloat16's 2^-8, which is why bfloat16 multiplies W itself).
 *
 * The order of the sums is fixed by the problem alone, as in cpu/linear.c:
 * K is cut into blocks of AMX_KB rows; each block's partial sum starts at
 * +0 in a tile and takes its rows 32 at a time in TDPBF16PS's order; the
 * partials are added in block order to a float32 total that starts at +0;
 * the bias is added to the total; one rounding.  Which thread computes an
 * output, how wide its chunk of columns is and how many threads run change
 * no bit.  Blocking keeps the sum's error near (AMX_KB + K / AMX_KB)
 * float32 roundings, far inside the tolerance's 2^-9.
 *
 * The tiles read subnormal inputs as zero and flush subnormal results,
 * whatever MXCSR says, so this kernel takes a call only where no subnormal
 * can arise.  With ex and es the least binary exponents of a nonzero x
 * and a nonzero scale, and Ex, Es the largest (a NaN or Inf counts as 128,
 * so that no bound below holds):
 *   bfloat16: x is a multiple of 2^(ex - 7); W, at least |s| where it is
 *   not zero, of 2^(es - 7); so every product and every sum of them is a
 *   multiple of 2^(ex + es - 14), which ex + es >= -112 keeps zero or
 *   normal (with ex, es >= -126: no subnormal input).  |W| < 2^(Es + 5),
 *   so Ex + Es + 6 + log2 K <= 127 and Es <= 122 keep every W and sum
 *   finite.
 *   float16: every x finite, every scale finite and below 2^12 in
 *   magnitude (so that no W overflows, as the regrouped sum would not);
 *   every part of x is then zero or a multiple of 2^-24, and so is every
 *   product and sum of the tiles, and every scaled sum of 2^-48.
 *   float32: every part of x is a multiple of 2^(ex - 23), and so is every
 *   product and sum of the tiles, which ex >= -103 keeps zero or normal;
 *   ex + es >= -103 keeps every scaled sum normal, and Ex + Es + 6 + log2 K
 *   <= 127 (with Es at least 0) every sum finite.
 * A call with any
 * other value runs cpu/linear.c's kernel instead (which depends on the
 * inputs alone, so a call stays deterministic).  The bias is added, and y
 * rounded, in AVX-512 code under the default MXCSR.
 *
 * Needs AMX-TILE, AMX-BF16, AVX512-BF16, AVX512BW, AVX512VL and F16C, Linux (the tiles'
 * state is granted per process by arch_prctl), and GCC 11 or Clang 12 for
 * the intrinsics; elsewhere awq_cpu_amx_ready() is 0 and nothing here runs.
 *
 * Pure C: no Python object is touched, so callers release the GIL.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* syscall() under -std=c11 */
#endif
#include "cpu/convert.h"
#include "cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

/* Columns per work item at most. */
#define AMX_NW_MAX 1024

/* The configurations the kernel takes, on every build: chunk a multiple
 * of 64 up to AMX_NW_MAX, or 0. */
static int config_ok(const awq_config *c)
{
    return c->threads >= 0 && c->chunk >= 0 && c->chunk % 64 == 0 && c->chunk <= AMX_NW_MAX;
}

#if defined(AWQ_X86_DISPATCH) && defined(__linux__) &&                                        \
    ((defined(__clang__) && __clang_major__ >= 12) ||                                          \
     (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define AWQ_CPU_AMX 1
#endif

#ifdef AWQ_CPU_AMX

#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

enum {
    AMX_KB = 256,      /* rows of K per block of the sum (a multiple of 32) */
    AMX_MB = AWQ_CPU_AMX_ROWS, /* rows of x per work item (a multiple of 16) */
    AMX_NW_DEFAULT = 512,
    AMX_ALIGN = 64,
};

/* float32 -> float16 rounding: to nearest even (an immediate operand) */
#define AMX_NEAREST (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* ---- the host: may this process run tiles? ---- */

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void)
{
    unsigned a, b, c, d;
    /* also AWQ_FAST_DEQUANT_CPU_SCALAR set; AWQ_FAST_DEQUANT_NO_AMX keeps the
     * process from asking for the tiles' state (which grows every signal
     * frame, so that a signal stack set up later must be larger) */
    if (!awq_cpu_use_avx2() || awq_env_switch("AWQ_FAST_DEQUANT_NO_AMX") ||
        __get_cpuid_max(0, NULL) < 7)
        return;
    __cpuid(1, a, b, c, d);
    if (!(c >> 27 & 1u)) /* OSXSAVE: XGETBV may run */
        return;
    __cpuid_count(7, 0, a, b, c, d);
    const int avx512 = (b >> 16 & 1u) && (b >> 30 & 1u) && (b >> 31 & 1u); /* F, BW, VL */
    const int tiles = (d >> 22 & 1u) && (d >> 24 & 1u);  /* AMX-BF16, AMX-TILE */
    __cpuid_count(7, 1, a, b, c, d);
    const int bf16 = a >> 5 & 1u; /* AVX512_BF16 */
    if (!avx512 || !tiles || !bf16)
        return;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    /* the OS saves the SSE, AVX, AVX-512 and tile states */
    const unsigned want = 0x2u | 0x4u | 0xE0u | 0x60000u;
    if ((lo & want) != want)
        return;
    /* The tile data state is granted per process; Linux refuses it where a
     * thread's signal stack is too small to hold it. */
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
        return;
    amx_ok = 1;
}

int awq_cpu_amx_ready(void)
{
    pthread_once(&amx_once, amx_probe);
    return amx_ok;
}

/* ---- the inputs a tile may read ---- */

typedef enum {
    AMX_BF16, /* x and W as they are */
    AMX_HALF, /* float16: two parts of x, the panel q - z, the scales after */
    AMX_F32,  /* float32: three parts of x, the panel q - z, the scales after */
} amx_mode;

/* float16 bits: finite, with a magnitude below lim (bits of the magnitude) */
static int f16_below(uint16_t h, unsigned lim) { return (h & 0x7FFFu) < lim; }

#define F16_INF 0x7C00u   /* the magnitude bits of float16's Inf */
#define F16_SCALE 0x6C00u /* 2^12: 15 times a scale below it stays finite */

/* 1 when every one of the n float16 values at src is below lim. */
__attribute__((target("avx512f,avx512bw"))) static int all_below(const uint16_t *src, int64_t n,
                                                                  unsigned lim)
{
    const __m512i mag = _mm512_set1_epi16(0x7FFF), top = _mm512_set1_epi16((short)lim);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        if (_mm512_cmpge_epu16_mask(_mm512_and_si512(_mm512_loadu_si512(src + i), mag), top))
            return 0;
    for (; i < n; i++)
        if (!f16_below(src[i], lim))
            return 0;
    return 1;
}

/* The least exponent field of a nonzero value and the largest field of
 * any among n float32 or (bf16 set) bfloat16 values, which share them (a
 * NaN or Inf: 255; a subnormal: 0), taken into *lo and *hi. */
__attribute__((target("avx512f"))) static void exponent_range(const void *src, int64_t n, int bf16,
                                                               unsigned *lo, unsigned *hi)
{
    const float *f = src;
    const uint16_t *h16 = src;
    const __m512i mag = _mm512_set1_epi32(0x7FFFFFFF);
    __m512i vlo = _mm512_set1_epi32((int)*lo), vhi = _mm512_set1_epi32((int)*hi);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        /* a bfloat16 value is the top half of a float32 */
        __m512i v = bf16 ? _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                                 (const __m256i *)(h16 + i))),
                                             16)
                         : _mm512_loadu_si512(f + i);
        __m512i a = _mm512_and_si512(v, mag);
        __m512i e = _mm512_srli_epi32(a, 23);
        __mmask16 nz = _mm512_test_epi32_mask(a, a);
        vlo = _mm512_mask_min_epu32(vlo, nz, vlo, e);
        vhi = _mm512_max_epu32(vhi, e);
    }
    unsigned l = (unsigned)_mm512_reduce_min_epu32(vlo), h = (unsigned)_mm512_reduce_max_epu32(vhi);
    for (; i < n; i++) {
        uint32_t a = (bf16 ? (uint32_t)h16[i] << 16 : f32_bits(f[i])) & 0x7FFFFFFFu, e = a >> 23;
        if (a != 0 && e < l)
            l = e;
        if (e > h)
            h = e;
    }
    *lo = l;
    *hi = h;
}

/* A float32 value with its low 16 bits cleared: its top bfloat16 part. */
__attribute__((target("avx512f"))) static inline __m512 hi_part(__m512 v)
{
    const __m512i top = _mm512_set1_epi32((int)0xFFFF0000u);
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), top));
}

/* n float32 values -> three bfloat16 parts each, x = x1 + x2 + x3 exactly
 * (values whose parts are normal; the caller checks). */
__attribute__((target("avx512f,avx512bf16"))) static void
split_f32(const float *src, int64_t n, uint16_t *x1, uint16_t *x2, uint16_t *x3)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(src + i);
        __m512 h = hi_part(v), r = _mm512_sub_ps(v, h), m = hi_part(r);
        _mm256_storeu_si256((__m256i *)(x1 + i), (__m256i)_mm512_cvtneps_pbh(h));
        _mm256_storeu_si256((__m256i *)(x2 + i), (__m256i)_mm512_cvtneps_pbh(m));
        _mm256_storeu_si256((__m256i *)(x3 + i), (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(r, m)));
    }
    for (; i < n; i++) {
        uint32_t h = f32_bits(src[i]) & 0xFFFF0000u;
        float r = src[i] - bits_f32(h);
        uint32_t m = f32_bits(r) & 0xFFFF0000u;
        x1[i] = (uint16_t)(h >> 16);
        x2[i] = (uint16_t)(m >> 16);
        x3[i] = float_to_bf16(r - bits_f32(m));
    }
}

/* 1 when x with exponent fields [xlo, xhi] and scales with [slo, shi]
 * (the least of a nonzero value, the largest; bfloat16 and float32 share
 * them) keep every product and sum of the tiles zero or normal, and
 * finite (the header). */
static int range_ok(amx_mode mode, unsigned xlo, unsigned xhi, unsigned slo, unsigned shi,
                    int64_t K)
{
    int lg = 0;
    while (lg < 63 && ((int64_t)1 << lg) < K)
        lg++;
    const int ex = (int)xlo - 127, es = (int)slo - 127, Ex = (int)xhi - 127, Es = (int)shi - 127;
    if (mode == AMX_F32)
        return ex >= -103 && ex + es >= -103 && Ex + (Es > 0 ? Es : 0) + 6 + lg <= 127;
    return ex >= -126 && es >= -126 && ex + es >= -112 && Ex + Es + 6 + lg <= 127 && Es <= 122;
}

/* n float16 values -> their hi and lo parts as bfloat16 (finite values;
 * the caller checks). */
__attribute__((target("avx512f,avx512bw,avx512bf16,f16c"))) static void
split_half(const uint16_t *src, int64_t n, uint16_t *hi, uint16_t *lo)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i)));
        __m512 h = hi_part(v);
        _mm256_storeu_si256((__m256i *)(hi + i), (__m256i)_mm512_cvtneps_pbh(h));
        _mm256_storeu_si256((__m256i *)(lo + i), (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, h)));
    }
    for (; i < n; i++) {
        float v = half_to_float(src[i]);
        uint32_t h = f32_bits(v) & 0xFFFF0000u;
        hi[i] = (uint16_t)(h >> 16);
        lo[i] = float_to_bf16(v - bits_f32(h));
    }
}

/* ---- one call's plan ---- */

typedef struct {
    const awq_linear_problem *p;
    /* [Mp][Kp] x's parts, zero-padded to whole tiles: bfloat16 x itself,
     * float16 its hi and lo parts, float32 x1, x2, x3 */
    const uint16_t *xp[3];
    amx_mode mode;
    int64_t Mp, Kp;     /* M rounded up to 16, K to 32 */
    int64_t nw;         /* columns per work item, a multiple of 64 */
    int64_t chunks;     /* work items along N */
} plan;

typedef struct {
    uint16_t *panel; /* [AMX_KB / 2][nw][2] one block of W (float16, float32: of q - z),
                        pairs of rows interleaved */
    float *total;    /* [AMX_MB][nw] the sums so far */
    float *part;     /* [16][64] one tile row's partials */
} scratch;

static size_t round_up(size_t n) { return (n + AMX_ALIGN - 1) / AMX_ALIGN * AMX_ALIGN; }

static size_t scratch_bytes(int64_t nw)
{
    return round_up((size_t)AMX_KB * (size_t)nw * 2) + round_up((size_t)AMX_MB * nw * 4) +
           round_up(16 * 64 * 4);
}

static scratch scratch_at(char *mem, int64_t nw)
{
    scratch s;
    s.panel = (uint16_t *)mem;
    mem += round_up((size_t)AMX_KB * (size_t)nw * 2);
    s.total = (float *)mem;
    mem += round_up((size_t)AMX_MB * nw * 4);
    s.part = (float *)mem;
    return s;
}

/* ---- W: one block of rows, one chunk of columns ---- */

/* Rows [k0, k1) (k1 - k0 even, k0 even) and columns [n0, n0 + cols) of W
 * into s->panel as pairs of rows: panel[(k - k0) / 2][n][k & 1], nw
 * columns wide; columns from cols on, and rows from K on, are zero.
 *
 * A tile of 16 columns reads its row's two packed words as one 64-bit
 * broadcast: lane 2i holds column i (the first word's nibble REVERSE[i])
 * and lane 2i + 1 column 8 + i, so the group's zero points and scales are
 * laid out in that order, and the final permutation puts the columns back
 * in order, each with its pair of rows.  A lane rotates its nibble to
 * bits 16-19 and sets the exponent of 128 above it (one ternary-logic
 * operation): the float32 128 + q, without a conversion.  Then W = (128 +
 * q) s - (128 + z) s in one FMA: the product is exact inside it, (128 + z)
 * s is exact in float32 (8 by 8 significant bits), and so is the
 * difference (q - z) s, so that this is float32(q - z) * float32(s) except
 * for the sign of a zero, which no sum of the tiles keeps.  float16 and
 * float32 write (128 + q) - (128 + z) = q - z instead, exact, and leave
 * the scales to the sums. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma,f16c"))) static void
panel_block(const plan *pl, const scratch *s, int64_t k0, int64_t k1, int64_t n0, int64_t cols)
{
    const awq_linear_problem *p = pl->p;
    const int64_t words = p->N / 8, cw = cols / 8, nw = pl->nw, K = p->K;
    const uint16_t *scales = p->scales; /* bfloat16 only */
    const int ints = pl->mode != AMX_BF16; /* the panel holds q - z */
    /* lanes 2j and 2j + 1: nibble REVERSE[j] to bits 16-19 */
#define AMX_ROT(j) (16 - 4 * AWQ_NIBBLE(j)) & 31, (16 - 4 * AWQ_NIBBLE(j)) & 31
    static const int32_t ROTS[16] = {AMX_ROT(0), AMX_ROT(1), AMX_ROT(2), AMX_ROT(3),
                                     AMX_ROT(4), AMX_ROT(5), AMX_ROT(6), AMX_ROT(7)};
#undef AMX_ROT
    const __m512i rots = _mm512_loadu_si512(ROTS);
    const __m512i nib = _mm512_set1_epi32(0xF0000), f128 = _mm512_set1_epi32(0x43000000);
    /* two packed words (w: 64 bits) -> 128 + their 16 values, in lane order:
     * (rotated & nib) | f128, 0xEA being the truth table of A & B | C */
#define AMX_128_PLUS(w)                                                                      \
    _mm512_castsi512_ps(_mm512_ternarylogic_epi32(                                          \
        _mm512_rolv_epi32(_mm512_set1_epi64((long long)(w)), rots), nib, f128, 0xEA))
    /* column order -> lane order: lane 2i column i, lane 2i + 1 column 8 + i */
    const __m512i lanes = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    /* 16 bfloat16 of row k (lane order), then 16 of row k + 1 -> for column
     * n = 0..15: row k, row k + 1; column n < 8 is lane 2n, n >= 8 lane 2n - 15 */
    const __m512i pairs =
        _mm512_set_epi16(31, 15, 29, 13, 27, 11, 25, 9, 23, 7, 21, 5, 19, 3, 17, 1, /* n = 15..8 */
                         30, 14, 28, 12, 26, 10, 24, 8, 22, 6, 20, 4, 18, 2, 16, 0); /* n = 7..0 */
    const int64_t kend = k1 < K ? k1 : K;
    for (int64_t k = k0; k < kend;) {
        const int64_t g = k / p->G, ge = (g + 1) * p->G < kend ? (g + 1) * p->G : kend;
        for (int64_t t = 0; t < nw / 16; t++) {
            const int64_t left = cw - 2 * t; /* packed words of this tile of 16 columns */
            /* the group's scales and zero points in lane order; columns past
             * cols get a scale of 0, and so a W of 0 (q - z: their zero
             * words give 0) */
            __m512 sv = _mm512_setzero_ps();
            if (!ints) {
                const __mmask16 valid = left >= 2 ? 0xFFFF : left == 1 ? 0x00FF : 0;
                const __m256i s16 =
                    _mm256_maskz_loadu_epi16(valid, scales + g * p->N + n0 + 16 * t);
                /* bfloat16: the float32's top half */
                sv = _mm512_permutexvar_ps(lanes, _mm512_castsi512_ps(_mm512_slli_epi32(
                                                      _mm512_cvtepu16_epi32(s16), 16)));
            }
            const uint32_t *zq = p->qzeros + g * words + n0 / 8 + 2 * t;
            uint64_t zw = 0;
            if (left >= 2)
                memcpy(&zw, zq, 8);
            else if (left == 1)
                zw = zq[0];
            /* (128 + z) s: exact, 8 by 8 significant bits; or 128 + z, for
             * a panel of q - z */
            const __m512 zs = ints ? AMX_128_PLUS(zw) : _mm512_mul_ps(AMX_128_PLUS(zw), sv);
            const uint32_t *q = p->qweight + k * words + n0 / 8 + 2 * t;
            const int64_t at = (k - k0) / 2 * nw * 2 + 32 * t;
            uint16_t *o = s->panel + at;
            /* G is even (awq_cpu_linear_amx), so rows k and k + 1 share the group */
            for (int64_t kk = k; kk < ge; kk += 2, q += 2 * words, o += nw * 2) {
                uint64_t w0, w1;
                if (left >= 2) {
                    memcpy(&w0, q, 8);
                    memcpy(&w1, q + words, 8);
                } else { /* the row's last word, or none */
                    w0 = left == 1 ? q[0] : 0;
                    w1 = left == 1 ? q[words] : 0;
                }
                __m512 v0, v1;
                if (ints) { /* q - z, exact */
                    v0 = _mm512_sub_ps(AMX_128_PLUS(w0), zs);
                    v1 = _mm512_sub_ps(AMX_128_PLUS(w1), zs);
                } else {
                    v0 = _mm512_fmsub_ps(AMX_128_PLUS(w0), sv, zs);
                    v1 = _mm512_fmsub_ps(AMX_128_PLUS(w1), sv, zs);
                }
                __m512i two = (__m512i)_mm512_cvtne2ps_pbh(v1, v0);
                _mm512_store_si512(o, _mm512_permutexvar_epi16(pairs, two));
            }
        }
        k = ge;
    }
#undef AMX_128_PLUS
    if (k1 > kend) { /* K's padding to whole tiles */
        memset(s->panel + (kend - k0) / 2 * nw * 2, 0, (size_t)(k1 - kend) * (size_t)nw * 2);
    }
}

/* ---- the tiles ---- */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Eight tiles of 16 rows x 64 bytes: 0-3 sums (16 x 16 float32); bfloat16:
 * 4 x (16 rows x 32 bfloat16), 5-7 the panel (16 pairs of rows x 16
 * columns); float16 and float32: 4-6 x's parts, 7 the panel. */
static const tile_config TILES = {.palette = 1,
                                  .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
                                  .rows = {16, 16, 16, 16, 16, 16, 16, 16}};

__attribute__((target("amx-tile"))) static void tiles_on(void) { _tile_loadconfig(&TILES); }
__attribute__((target("amx-tile"))) static void tiles_off(void) { _tile_release(); }

/* Rows [r0, r0 + 16) of x times the panel's rows [k0, k1) (x's columns;
 * the panel starts at row kb), 64 columns from c0: their partial sums into
 * part[16][64].  Per 32 rows of K and tile of 16 columns, float16: xhi (q
 * - z) then xlo (q - z); float32: x1 (q - z), x2 (q - z), x3 (q - z). */
__attribute__((target("amx-tile,amx-bf16"))) static void
tile_block(const plan *pl, const scratch *s, int64_t r0, int64_t kb, int64_t k0, int64_t k1,
           int64_t c0)
{
    const int64_t nw = pl->nw;
    const uint16_t *a = pl->xp[0] + r0 * pl->Kp + k0;
    const uint16_t *b = s->panel + (k0 - kb) * nw + c0 * 2;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    if (pl->mode != AMX_BF16) { /* x's two or three parts against q - z */
        const int three = pl->mode == AMX_F32;
        const uint16_t *a2 = pl->xp[1] + r0 * pl->Kp + k0;
        const uint16_t *a3 = three ? pl->xp[2] + r0 * pl->Kp + k0 : a2;
        for (int64_t k = k0; k < k1; k += 32, a += 32, a2 += 32, a3 += 32, b += 16 * nw * 2) {
            _tile_loadd(4, a, pl->Kp * 2);
            _tile_loadd(5, a2, pl->Kp * 2);
            if (three)
                _tile_loadd(6, a3, pl->Kp * 2);
#define AMX_PARTS_TILE(c, j)                                                                       \
    _tile_loadd(7, b + 32 * (j), nw * 4);                                                          \
    _tile_dpbf16ps(c, 4, 7);                                                                       \
    _tile_dpbf16ps(c, 5, 7);                                                                       \
    if (three)                                                                                     \
    _tile_dpbf16ps(c, 6, 7)
            AMX_PARTS_TILE(0, 0);
            AMX_PARTS_TILE(1, 1);
            AMX_PARTS_TILE(2, 2);
            AMX_PARTS_TILE(3, 3);
#undef AMX_PARTS_TILE
        }
    }
    for (int64_t k = k0; k < k1 && pl->mode == AMX_BF16; k += 32, a += 32, b += 16 * nw * 2) {
        _tile_loadd(4, a, pl->Kp * 2);
        _tile_loadd(5, b, nw * 4);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, b + 32, nw * 4);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(7, b + 64, nw * 4);
        _tile_dpbf16ps(2, 4, 7);
        _tile_loadd(5, b + 96, nw * 4);
        _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, s->part, 64 * 4);
    _tile_stored(1, s->part + 16, 64 * 4);
    _tile_stored(2, s->part + 32, 64 * 4);
    _tile_stored(3, s->part + 48, 64 * 4);
}

/* total[rows][c0 .. c0 + 64) += part (rows <= 16) */
__attribute__((target("avx512f"))) static void add_part(const scratch *s, int64_t nw, int64_t r,
                                                         int rows, int64_t c0)
{
    for (int i = 0; i < rows; i++) {
        float *t = s->total + (r + i) * nw + c0;
        for (int j = 0; j < 64; j += 16)
            _mm512_storeu_ps(t + j, _mm512_add_ps(_mm512_loadu_ps(t + j),
                                                  _mm512_loadu_ps(s->part + i * 64 + j)));
    }
}

/* A panel of q - z: total[r .. r + 16)[c0 .. c0 + 64) += part * the
 * scales of group g (as float32, exact), one FMA an output; columns from
 * cols on take a scale of 0 */
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) static void
scale_part(const plan *pl, const scratch *s, int64_t r, int64_t c0, int64_t g, int64_t n0,
           int64_t cols)
{
    const int64_t at = g * pl->p->N + n0 + c0;
    __m512 sv[4];
    for (int j = 0; j < 4; j++) {
        const int64_t left = cols - c0 - 16 * j;
        const __mmask16 m = left >= 16 ? 0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        sv[j] = pl->mode == AMX_F32
                    ? _mm512_maskz_loadu_ps(m, (const float *)pl->p->scales + at + 16 * j)
                    : _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                          m, (const uint16_t *)pl->p->scales + at + 16 * j));
    }
    for (int i = 0; i < 16; i++) {
        float *t = s->total + (r + i) * pl->nw + c0;
        const float *part = s->part + i * 64;
        for (int j = 0; j < 4; j++)
            _mm512_storeu_ps(t + 16 * j, _mm512_fmadd_ps(_mm512_loadu_ps(part + 16 * j), sv[j],
                                                         _mm512_loadu_ps(t + 16 * j)));
    }
}

/* y[m0 + i][n0 + j] = round(total[i][j] + bias[n0 + j]) */
__attribute__((target("avx512f,avx512bw,f16c"))) static void
store_y(const plan *pl, const scratch *s, int64_t m0, int rows, int64_t n0, int64_t cols)
{
    const awq_linear_problem *p = pl->p;
    const uint16_t *bias = p->bias;
    uint16_t *y = p->y;
    const int half = pl->mode == AMX_HALF;
    for (int i = 0; i < rows && pl->mode == AMX_F32; i++) {
        const float *t = s->total + (int64_t)i * pl->nw, *fb = p->bias;
        float *out = (float *)p->y + (m0 + i) * p->N + n0;
        int64_t j = 0;
        for (; j + 16 <= cols; j += 16) {
            __m512 v = _mm512_loadu_ps(t + j);
            _mm512_storeu_ps(out + j, fb ? _mm512_add_ps(v, _mm512_loadu_ps(fb + n0 + j)) : v);
        }
        for (; j < cols; j++)
            out[j] = fb ? t[j] + fb[n0 + j] : t[j];
    }
    for (int i = 0; i < rows && pl->mode != AMX_F32; i++) {
        const float *t = s->total + (int64_t)i * pl->nw;
        uint16_t *out = y + (m0 + i) * p->N + n0;
        int64_t j = 0;
        for (; j + 16 <= cols && half; j += 16) {
            __m512 v = _mm512_loadu_ps(t + j);
            if (bias)
                v = _mm512_add_ps(v, _mm512_cvtph_ps(
                                         _mm256_loadu_si256((const __m256i *)(bias + n0 + j))));
            _mm256_storeu_si256((__m256i *)(out + j), _mm512_cvtps_ph(v, AMX_NEAREST));
        }
        for (; j + 16 <= cols && !half; j += 16) {
            __m512 v = _mm512_loadu_ps(t + j);
            if (bias)
                v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(
                                         _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                             (const __m256i *)(bias + n0 + j))),
                                         16)));
            /* round to nearest even on the bit pattern; NaN -> quiet NaN */
            __m512i x = _mm512_castps_si512(v);
            __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
            __m512i r = _mm512_srli_epi32(
                _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb), 16);
            __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
            _mm256_storeu_si256((__m256i *)(out + j), _mm512_cvtepi32_epi16(r));
        }
        for (; j < cols; j++) {
            float v = t[j];
            if (bias)
                v += load_scale(bias, n0 + j, p->dtype);
            out[j] = half ? float_to_half(v) : float_to_bf16(v);
        }
    }
}

/* Work item i: chunk i % chunks of the columns, block i / chunks of AMX_MB
 * rows of x. */
static void run_item(const plan *pl, const scratch *s, int64_t i)
{
    const awq_linear_problem *p = pl->p;
    const int64_t nw = pl->nw, n0 = i % pl->chunks * nw, m0 = i / pl->chunks * AMX_MB;
    const int64_t cols = p->N - n0 < nw ? p->N - n0 : nw;
    const int64_t mrows = p->M - m0 < AMX_MB ? p->M - m0 : AMX_MB;
    const int64_t tiles_m = (mrows + 15) / 16, tiles_n = (cols + 63) / 64;
    memset(s->total, 0, (size_t)(tiles_m * 16) * (size_t)nw * sizeof(float));
    for (int64_t k0 = 0; k0 < pl->Kp; k0 += AMX_KB) {
        const int64_t k1 = k0 + AMX_KB < pl->Kp ? k0 + AMX_KB : pl->Kp;
        panel_block(pl, s, k0, k1, n0, cols);
        if (pl->mode == AMX_BF16) {
            for (int64_t r = 0; r < tiles_m; r++)
                for (int64_t c = 0; c < tiles_n; c++) {
                    tile_block(pl, s, m0 + 16 * r, k0, k0, k1, 64 * c);
                    add_part(s, nw, 16 * r, 16, 64 * c);
                }
            continue;
        }
        /* q - z: each stretch of a group in the block apart, the last
         * group's running on through K's padding */
        for (int64_t a = k0, e; a < k1; a = e) {
            const int64_t g = a / p->G;
            e = (g + 1) * p->G < k1 && (g + 1) * p->G < p->K ? (g + 1) * p->G : k1;
            for (int64_t r = 0; r < tiles_m; r++)
                for (int64_t c = 0; c < tiles_n; c++) {
                    tile_block(pl, s, m0 + 16 * r, k0, a, e, 64 * c);
                    scale_part(pl, s, 16 * r, 64 * c, g, n0, cols);
                }
        }
    }
    store_y(pl, s, m0, (int)mrows, n0, cols);
}

static int64_t default_width(int64_t N, int threads)
{
    /* AMX_NW_DEFAULT, narrower where N would leave a thread without work */
    int64_t nw = AMX_NW_DEFAULT;
    while (nw > 64 && (N + nw - 1) / nw < 2 * threads)
        nw /= 2;
    return nw;
}

int awq_cpu_amx_fits(const awq_linear_problem *p)
{
    /* float16 and float32 sum each group's stretches apart, 32 rows of K
     * at a time */
    const int groups_ok = p->dtype == AWQ_BF16 || p->G % 32 == 0 || p->G == p->K;
    return p->K > 0 && p->G % 2 == 0 && groups_ok && awq_cpu_amx_ready();
}

awq_status awq_cpu_linear_amx(const awq_linear_problem *p, const awq_config *c, int *ran)
{
    *ran = 0;
    if (!config_ok(c))
        return AWQ_ERR_CONFIG;
    if (p->M <= 0 || p->N <= 0 || !awq_cpu_amx_fits(p))
        return AWQ_OK;
    const amx_mode mode = p->dtype == AWQ_F32 ? AMX_F32 : p->dtype == AWQ_F16 ? AMX_HALF : AMX_BF16;
    const int64_t nscales = p->K / p->G * p->N;
    if (mode == AMX_HALF) {
        if (!all_below(p->scales, nscales, F16_SCALE) || !all_below(p->x, p->M * p->K, F16_INF))
            return AWQ_OK;
    } else {
        unsigned xlo = 255, xhi = 0, slo = 255, shi = 0;
        exponent_range(p->scales, nscales, mode == AMX_BF16, &slo, &shi);
        exponent_range(p->x, p->M * p->K, mode == AMX_BF16, &xlo, &xhi);
        if (!range_ok(mode, xlo, xhi, slo, shi, p->K))
            return AWQ_OK;
    }

    int threads = awq_cpu_threads(c->threads);
    plan pl = {.p = p, .mode = mode};
    pl.Mp = (p->M + 15) / 16 * 16;
    pl.Kp = (p->K + 31) / 32 * 32;
    pl.nw = c->chunk > 0 ? c->chunk : default_width(p->N, threads);
    pl.chunks = (p->N + pl.nw - 1) / pl.nw;
    const int64_t items = pl.chunks * ((p->M + AMX_MB - 1) / AMX_MB);
    if (threads > items)
        threads = (int)items;
    if (threads < 1)
        threads = 1;

    if ((uint64_t)pl.Mp > SIZE_MAX / 8 / (uint64_t)pl.Kp)
        return AWQ_ERR_NOMEM;
    const int parts = mode == AMX_F32 ? 3 : mode == AMX_HALF ? 2 : 1;
    const size_t xone = round_up((size_t)pl.Mp * (size_t)pl.Kp * 2);
    const size_t xbytes = (size_t)parts * xone, per = scratch_bytes(pl.nw);
    if ((size_t)threads > (SIZE_MAX - xbytes) / per)
        return AWQ_ERR_NOMEM;
    char *mem = aligned_alloc(AMX_ALIGN, xbytes + per * (size_t)threads);
    if (mem == NULL)
        return AWQ_ERR_NOMEM;

    /* x's parts, zero-padded to whole tiles */
    uint16_t *xp[3] = {NULL, NULL, NULL};
    for (int i = 0; i < parts; i++)
        xp[i] = (uint16_t *)(mem + (size_t)i * xone);
    for (int64_t m = 0; m < p->M; m++) {
        const int64_t at = m * pl.Kp;
        if (mode == AMX_F32) {
            split_f32((const float *)p->x + m * p->K, p->K, xp[0] + at, xp[1] + at, xp[2] + at);
        } else if (mode == AMX_HALF) {
            split_half((const uint16_t *)p->x + m * p->K, p->K, xp[0] + at, xp[1] + at);
        } else {
            memcpy(xp[0] + at, (const uint16_t *)p->x + m * p->K, (size_t)p->K * 2);
        }
        for (int i = 0; i < parts; i++)
            memset(xp[i] + at + p->K, 0, (size_t)(pl.Kp - p->K) * 2);
    }
    for (int i = 0; i < parts; i++) {
        memset(xp[i] + p->M * pl.Kp, 0, (size_t)(pl.Mp - p->M) * (size_t)pl.Kp * 2);
        pl.xp[i] = xp[i];
    }
    char *scratch_mem = mem + xbytes;

    if (threads == 1) { /* also every forked child (cpu/platform.c) */
        unsigned env = awq_cpu_fp_enter();
        tiles_on();
        scratch s = scratch_at(scratch_mem, pl.nw);
        for (int64_t i = 0; i < items; i++)
            run_item(&pl, &s, i);
        tiles_off();
        awq_cpu_fp_leave(env);
    }
#ifdef _OPENMP
    else {
#pragma omp parallel num_threads(threads)
        {
            unsigned env = awq_cpu_fp_enter();
            tiles_on();
            scratch s = scratch_at(scratch_mem + per * (size_t)omp_get_thread_num(), pl.nw);
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < items; i++)
                run_item(&pl, &s, i);
            tiles_off();
            awq_cpu_fp_leave(env);
        }
    }
#endif
    free(mem);
    *ran = 1;
    return AWQ_OK;
}

#else /* no AMX on this build */

int awq_cpu_amx_ready(void) { return 0; }

int awq_cpu_amx_fits(const awq_linear_problem *p)
{
    (void)p;
    return 0;
}

awq_status awq_cpu_linear_amx(const awq_linear_problem *p, const awq_config *c, int *ran)
{
    (void)p;
    *ran = 0;
    return config_ok(c) ? AWQ_OK : AWQ_ERR_CONFIG;
}

#endif
