/*
 * test_linear_cpu.c -- standalone test of the host's fused linear (csrc/cpu/linear.c).
 *
 * Build and run from the repository root with `make -C tests/c linear`, or
 * by hand (without the second, AVX2-only copy described below):
 *   gcc -std=c11 -ffp-contract=off -Wall -Wextra -O1 -fopenmp -fsanitize=address,undefined \
 *       -Icsrc tests/c/test_linear_cpu.c csrc/cpu/linear.c csrc/cpu/platform.c \
 *       -lm -o build/test_linear_cpu && build/test_linear_cpu
 * Exit status 0 when every check passed.
 *
 * Every result is checked against a float64 reference computed here from
 * this file's own dequantization (its own float16 / bfloat16 decoding and
 * rounding, none of the kernel's helpers):
 *   |y - y64| <= 2^-9 (|x| @ |W|) + 1 ulp of the dtype at y64,
 * NaN where y64 is NaN, the same Inf where y64 is Inf.  The kernel sums
 * some parts of K as s * sum (q - z) x ("regrouped") and others as sum x W
 * ("exact", cpu/linear.c says where); the sweep mixes both in one problem,
 * and worked examples tell them apart bit for bit.
 *
 * The scalar path is checked in a child process started before anything
 * else (AWQ_FAST_DEQUANT_CPU_SCALAR=1 is read once per process): it runs
 * the same checks, and its outputs must equal the vector path's bit for
 * bit.  With -DLINEAR_NARROW (as the Makefile builds it), csrc/cpu/linear.c
 * is linked a second time, compiled without its AVX-512 tiles and renamed
 * awq_cpu_linear_narrow, so that on an AVX-512 machine the AVX2 tiles are
 * checked too, against the reference and bit for bit against the others.
 *
 * `test_linear_cpu --bench [reps]` only times the M = 1 layer 4096 x 14336
 * (G = 128, float16) and a large memcpy; build it without sanitizers
 * (`make -C tests/c linear-bench`) for figures worth reading.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cpu/cpu.h"

#ifdef LINEAR_NARROW
awq_status awq_cpu_linear_narrow(const awq_linear_problem *p, const awq_config *c);
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_MXCSR 1
#endif

#include "check.h"

/* ---- random numbers (splitmix64) ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15u;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

static int64_t rnd_below(int64_t n) { return (int64_t)(rnd() % (uint64_t)n); }
static double rnd_unit(void) { return (double)(rnd() >> 11) * 0x1p-53; } /* [0, 1) */

/* ---- the dtypes, decoded and rounded in float64 (independent of the kernel) ---- */

static const int mant_bits[3] = {10, 7, 23}; /* stored significand bits: f16, bf16, f32 */
static const int min_exp[3] = {-14, -126, -126}; /* exponent of the smallest normal */
static const int max_exp[3] = {15, 127, 127};

static size_t dsize(awq_dtype t) { return t == AWQ_F32 ? 4 : 2; }

/* The value of element i of an array of dtype t. */
static double decode(const void *a, int64_t i, awq_dtype t)
{
    if (t == AWQ_F32)
        return ((const float *)a)[i];
    unsigned bits = ((const uint16_t *)a)[i];
    int eb = t == AWQ_F16 ? 5 : 8, mb = mant_bits[t];
    int bias = (1 << (eb - 1)) - 1;
    unsigned sign = bits >> 15, e = (bits >> mb) & ((1u << eb) - 1), m = bits & ((1u << mb) - 1);
    double v;
    if (e == (1u << eb) - 1)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, 1 - bias - mb);
    else
        v = ldexp((double)(m | (1u << mb)), (int)e - bias - mb);
    return sign ? -v : v;
}

/* v rounded to the nearest value of dtype t (ties to even), in float64. */
static double round_dtype(double v, awq_dtype t)
{
    if (isnan(v) || isinf(v) || v == 0.0)
        return v;
    int e;
    frexp(fabs(v), &e); /* |v| in [2^(e-1), 2^e) */
    int lsb = (e - 1 > min_exp[t] ? e - 1 : min_exp[t]) - mant_bits[t];
    double r = ldexp(nearbyint(ldexp(v, -lsb)), lsb); /* nearbyint: ties to even */
    double maxv = ldexp(2.0 - ldexp(1.0, -mant_bits[t]), max_exp[t]);
    if (fabs(r) > maxv)
        return v > 0 ? INFINITY : -INFINITY;
    return r;
}

/* One unit in the last place of dtype t at |v|. */
static double ulp_dtype(double v, awq_dtype t)
{
    int e;
    frexp(fabs(v), &e);
    if (v == 0.0 || e - 1 < min_exp[t])
        e = min_exp[t] + 1;
    return ldexp(1.0, e - 1 - mant_bits[t]);
}

/* Bits of a value of dtype t (v already representable in t). */
static void encode(void *a, int64_t i, double v, awq_dtype t)
{
    if (t == AWQ_F32) {
        ((float *)a)[i] = (float)v;
        return;
    }
    unsigned sign = signbit(v) ? 0x8000u : 0u, bits;
    int eb = t == AWQ_F16 ? 5 : 8, mb = mant_bits[t], bias = (1 << (eb - 1)) - 1;
    if (isnan(v)) {
        bits = (((1u << eb) - 1) << mb) | (1u << (mb - 1));
    } else if (isinf(v)) {
        bits = ((1u << eb) - 1) << mb;
    } else if (v == 0.0) {
        bits = 0;
    } else {
        int e;
        frexp(fabs(v), &e);
        if (e - 1 < min_exp[t]) { /* subnormal */
            bits = (unsigned)ldexp(fabs(v), bias - 1 + mb);
        } else {
            double m = ldexp(fabs(v), mb - (e - 1)); /* in [2^mb, 2^(mb+1)) */
            bits = ((unsigned)(e - 1 + bias) << mb) | ((unsigned)m & ((1u << mb) - 1));
        }
    }
    ((uint16_t *)a)[i] = (uint16_t)(sign | bits);
}

/* ---- one problem ---- */

typedef struct {
    int64_t M, K, N, G;
    awq_dtype t;
    int has_bias;
    uint32_t *qw, *qz;
    void *sc, *x, *bias, *y;
} problem;

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/* A random value of dtype t with |v| in [2^lo, 2^hi) or 0, either sign. */
static double rnd_value(awq_dtype t, int lo, int hi)
{
    if (rnd_below(16) == 0)
        return rnd_below(2) ? 0.0 : -0.0;
    double v = ldexp(1.0 + rnd_unit(), lo + (int)rnd_below(hi - lo));
    v = round_dtype(v, t);
    return rnd_below(2) ? -v : v;
}

/* specials: 0 none; else a few scales become NaN, +-Inf or large enough
 * for (q - z) * s to overflow the dtype. */
static problem make_problem(int64_t M, int64_t K, int64_t N, int64_t G, awq_dtype t, int has_bias,
                            int specials)
{
    problem P = {M, K, N, G, t, has_bias, 0, 0, 0, 0, 0, 0};
    int64_t groups = K ? K / G : 0;
    P.qw = xmalloc((size_t)(K * N / 8) * 4);
    P.qz = xmalloc((size_t)(groups * N / 8) * 4);
    P.sc = xmalloc((size_t)(groups * N) * dsize(t));
    P.x = xmalloc((size_t)(M * K) * dsize(t));
    P.bias = has_bias ? xmalloc((size_t)N * dsize(t)) : NULL;
    P.y = xmalloc((size_t)(M * N) * dsize(t));
    for (int64_t i = 0; i < K * N / 8; i++)
        P.qw[i] = (uint32_t)rnd();
    for (int64_t i = 0; i < groups * N / 8; i++)
        P.qz[i] = (uint32_t)rnd();
    for (int64_t i = 0; i < groups * N; i++)
        encode(P.sc, i, rnd_value(t, -8, -3), t);
    for (int64_t i = 0; i < M * K; i++)
        encode(P.x, i, rnd_value(t, -3, 1), t);
    for (int64_t i = 0; has_bias && i < N; i++)
        encode(P.bias, i, rnd_value(t, -4, 2), t);
    /* NaN, +Inf, -Inf; for float16 also a scale of 8192, for which
     * |q - z| >= 8 gives a W that rounds to Inf (for the wider types the
     * float32 sums themselves would overflow first, where float64 does not) */
    static const double kinds[] = {NAN, INFINITY, -INFINITY, 8192.0};
    for (int s = 0; specials && groups && s < (t == AWQ_F16 ? 4 : 3); s++)
        encode(P.sc, rnd_below(groups * N), rnd_below(2) ? kinds[s] : -kinds[s], t);
    memset(P.y, 0xA5, (size_t)(M * N) * dsize(t));
    return P;
}

static void free_problem(problem *P)
{
    free(P->qw);
    free(P->qz);
    free(P->sc);
    free(P->x);
    free(P->bias);
    free(P->y);
}

static awq_linear_problem view(const problem *P)
{
    awq_linear_problem p = {P->x, P->qw, P->qz, P->sc, P->bias, P->y, P->M, P->K, P->N, P->G,
                            P->t, -1, NULL};
    return p;
}

static awq_status run(const problem *P, int threads, int64_t chunk)
{
    awq_linear_problem p = view(P);
    awq_config c = {.kernel = AWQ_KERNEL_CPU, .threads = threads, .chunk = chunk};
    return awq_cpu_linear(&p, &c);
}

/* Nibble n % 8 of a packed row, in the order of the contract (DESIGN.md
 * section 1): column 8c + j lives in nibble REVERSE[j]. */
static int nibble(const uint32_t *row, int64_t n)
{
    static const int reverse[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    return (int)((row[n / 8] >> (4 * reverse[n % 8])) & 0xFu);
}

/* W of the contract, in float64: round_dtype((q - z) * s).  For float32
 * scales the float64 product is exact, so rounding it once to float32 is
 * float32's correctly rounded product, as the contract asks. */
static double weight(const problem *P, int64_t k, int64_t n)
{
    int64_t g = k / P->G;
    int q = nibble(P->qw + k * (P->N / 8), n), z = nibble(P->qz + g * (P->N / 8), n);
    return round_dtype((double)(q - z) * decode(P->sc, g * P->N + n, P->t), P->t);
}

/* Checks y against the float64 reference; returns the number of bad elements. */
static int64_t check_reference(const problem *P, const char *what)
{
    double *w = xmalloc((size_t)(P->K * P->N) * sizeof(double));
    for (int64_t k = 0; k < P->K; k++)
        for (int64_t n = 0; n < P->N; n++)
            w[k * P->N + n] = weight(P, k, n);
    int64_t bad = 0;
    for (int64_t m = 0; m < P->M; m++) {
        for (int64_t n = 0; n < P->N; n++) {
            double s = 0.0, a = 0.0;
            for (int64_t k = 0; k < P->K; k++) {
                double xv = decode(P->x, m * P->K + k, P->t), wv = w[k * P->N + n];
                s += xv * wv;
                a += fabs(xv) * fabs(wv);
            }
            if (P->has_bias)
                s += decode(P->bias, n, P->t);
            double y = decode(P->y, m * P->N + n, P->t);
            double tol = 0x1p-9 * a + ulp_dtype(s, P->t);
            int ok;
            if (isnan(s))
                ok = isnan(y);
            else if (isinf(s))
                ok = y == s;
            else if (isinf(y)) /* only where the tolerance reaches past the dtype's range */
                ok = round_dtype(s + copysign(tol, y), P->t) == y;
            else
                ok = !isnan(y) && fabs(y - s) <= tol;
            if (!ok && bad++ < 3)
                fprintf(stderr,
                        "%s: M=%lld K=%lld N=%lld G=%lld %s bias=%d: y[%lld, %lld] = %.9g, "
                        "reference %.9g (|x|@|W| %.6g)\n",
                        what, (long long)P->M, (long long)P->K, (long long)P->N, (long long)P->G,
                        awq_dtype_name(P->t), P->has_bias, (long long)m, (long long)n, y, s, a);
        }
    }
    free(w);
    return bad;
}

/* Same bits, except that any two NaNs are equal (payloads may differ). */
static int same_bits(const void *a, const void *b, int64_t n, awq_dtype t)
{
    for (int64_t i = 0; i < n; i++) {
        double u = decode(a, i, t), v = decode(b, i, t);
        if (isnan(u) || isnan(v)) {
            if (!(isnan(u) && isnan(v)))
                return 0;
        } else if (memcmp((const char *)a + i * dsize(t), (const char *)b + i * dsize(t),
                          dsize(t))) {
            return 0;
        }
    }
    return 1;
}

/* ---- the random sweep ---- */

/* K, G pairs: tails of the 64-row blocks, G = K, G = 1, one group. */
static const int64_t KG[][2] = {{1, 1},     {7, 7},     {64, 64},  {96, 32}, {100, 50},
                                {128, 128}, {200, 8},   {256, 64}, {300, 3}, {384, 128},
                                {129, 129}, {512, 512}, {260, 65}};
/* N: one word, tails of the 64- and 128-column tiles and of the chunks */
static const int64_t NS[] = {8, 16, 56, 64, 72, 120, 136, 200, 256, 328};

#define SWEEP_RANDOM 90
#define SWEEP 126

/* Problem i >= SWEEP_RANDOM of the sweep: the regrouped and the exact form
 * side by side.  Several groups get a run of columns whose scales are NaN,
 * +-Inf or too large to regroup (float16: 15 |s| > 65504; float32: |s| >
 * 2^60), and other groups a row of x too large to regroup (|x| > 2^54;
 * float16: an Inf): those (group, column) and (row, group) take the exact
 * form, the rest the regrouped one.  (bfloat16 takes the exact form
 * throughout; its problems are built alike.)  Large x and large scales
 * never meet in one group (a problem of one group gets one or the other),
 * so that every float32 sum stays finite where the float64 reference
 * does. */
static problem mixed_problem(int i)
{
    rng_state = 0xC0FFEEu + (uint64_t)i * 104729u;
    int64_t M = 1 + rnd_below(9);
    const int64_t *kg = KG[rnd_below(sizeof KG / sizeof KG[0])];
    int64_t K = kg[0], G = kg[1], N = NS[rnd_below(sizeof NS / sizeof NS[0])];
    awq_dtype t = (awq_dtype)(i % 3);
    problem P = make_problem(M, K, N, G, t, (int)rnd_below(2), 0);
    int64_t groups = K / G;
    /* one group: either its scales or its x */
    int scales_too = groups > 1 || rnd_below(2), xs_too = groups > 1 || !scales_too;
    static const double kinds[] = {NAN, INFINITY, -INFINITY, 0.0 /* large, below */};
    for (int64_t g = 0; scales_too && g < groups; g += 2) { /* even groups: scales */
        if (rnd_below(3) == 0)
            continue;
        int64_t n0 = rnd_below(N), n1 = n0 + 1 + rnd_below(N - n0);
        double v = kinds[rnd_below(4)];
        if (v == 0.0) /* the smallest scale that no longer regroups, and beyond */
            v = (t == AWQ_F16 ? 4368.0 : 0x1p61) * (double)(1 + rnd_below(3));
        if (t == AWQ_F16 && v > 65504.0)
            v = 65504.0;
        for (int64_t n = n0; n < n1; n++)
            encode(P.sc, g * N + n, rnd_below(2) ? v : -v, t);
    }
    for (int64_t g = groups > 1 ? 1 : 0; xs_too && g < groups; g += 2) { /* odd groups: x */
        if (rnd_below(3) == 0)
            continue;
        int64_t m = rnd_below(M), k = g * G + rnd_below(G);
        double v = t == AWQ_F16 ? INFINITY : ldexp(1.0, 55 + (int)rnd_below(4));
        encode(P.x, m * K + k, rnd_below(2) ? v : -v, t);
    }
    return P;
}

/* Problem i of the sweep: the same sequence in every process. */
static problem sweep_problem(int i)
{
    if (i >= SWEEP_RANDOM)
        return mixed_problem(i);
    rng_state = 0x1234567u + (uint64_t)i * 7919u;
    int64_t M = 1 + rnd_below(17);
    if (i % 3 == 0)
        M = 1 + rnd_below(4); /* the sizes the fused path is for */
    const int64_t *kg = KG[rnd_below(sizeof KG / sizeof KG[0])];
    int64_t N = NS[rnd_below(sizeof NS / sizeof NS[0])];
    awq_dtype t = (awq_dtype)(i % 3);
    return make_problem(M, kg[0], N, kg[1], t, (int)rnd_below(2), i % 4 == 1);
}

/* Runs the sweep: reference checks, determinism (repeat, thread counts,
 * chunks); writes every output to fd (when >= 0), in order. */
static void sweep(const char *what, int fd)
{
    static const int64_t chunks[] = {0, 8, 24, 64, 72, 136, 1024};
    for (int i = 0; i < SWEEP; i++) {
        problem P = sweep_problem(i);
        size_t bytes = (size_t)(P.M * P.N) * dsize(P.t);
        CHECK(run(&P, 0, 0) == AWQ_OK);
        CHECK(check_reference(&P, what) == 0);
        void *first = xmalloc(bytes);
        memcpy(first, P.y, bytes);
        CHECK(run(&P, 0, 0) == AWQ_OK);
        CHECK(memcmp(first, P.y, bytes) == 0); /* the same call twice: the same bits */
        for (int threads = 1; threads <= 3; threads++) {
            int64_t chunk = chunks[(i + threads) % (sizeof chunks / sizeof chunks[0])];
            memset(P.y, 0x5A, bytes);
            CHECK(run(&P, threads, chunk) == AWQ_OK);
            if (memcmp(first, P.y, bytes) != 0) {
                fprintf(stderr, "%s: problem %d: threads %d chunk %lld changed the bits\n", what,
                        i, threads, (long long)chunk);
                CHECK(0);
            }
        }
        if (fd >= 0 && write(fd, first, bytes) != (ssize_t)bytes) {
            fprintf(stderr, "write: %s\n", strerror(errno));
            CHECK(0);
        }
        free(first);
        free_problem(&P);
    }
}

/* ---- fixed cases ---- */

/* A worked example by hand: K = 2, N = 8, G = 2, float32, M = 1.
 * Word 0x76543210: nibble i holds the value i, so column j reads nibble
 * REVERSE[j] = {0, 4, 1, 5, 2, 6, 3, 7}[j].  Zero points all 3, scales
 * 0.5: W[0, j] = (REVERSE[j] - 3) * 0.5.  Row 1 is 0xFFFFFFFF: W[1, j] =
 * (15 - 3) * 0.5 = 6.  x = [2, 1], bias[j] = j:
 *   y[j] = 2 (REVERSE[j] - 3) 0.5 + 6 + j = REVERSE[j] + 3 + j. */
static void test_worked_example(void)
{
    uint32_t qw[2] = {0x76543210u, 0xFFFFFFFFu}, qz[1] = {0x33333333u};
    float sc[8], x[2] = {2.0f, 1.0f}, bias[8], y[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = 0.5f;
        bias[j] = (float)j;
    }
    awq_linear_problem p = {x, qw, qz, sc, bias, y, 1, 2, 8, 2, AWQ_F32, -1, NULL};
    awq_config c = {.kernel = AWQ_KERNEL_CPU};
    CHECK(awq_cpu_linear(&p, &c) == AWQ_OK);
    static const int reverse[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    for (int j = 0; j < 8; j++)
        CHECK(y[j] == (float)(reverse[j] + 3 + j));
}

/* Which form each part of a sum takes, worked out by hand; each expected
 * value is the one form's and not the other's.
 *
 * float16, K = G = 256, x = 1, z = 0, one row.  Column 0: q = 5 in every
 * row, s = 1 + 2^-10, which regroups.  Its W is 5.0048828125 rounded to
 * float16, 5.00390625; the exact form would sum 64 of them per block,
 * 320.25, and 4 blocks, 1281; the regrouped form takes s * 320 = 320.3125
 * per block, 1281.25.  With bias 0.375: 1281.625 rounds to 1282 (the exact
 * form's 1281.375 would give 1281).  Column 1: q = 5 in row 0 only, s =
 * 4372, and 15 * 4372 > 65504 keeps the exact form: W = 21860 rounded to
 * float16 = 21856; with bias 6, 21862 rounds to 21856 (the regrouped
 * 21866 would give 21872).
 *
 * float32, K = G = 4, z = 0, q = 3 in rows 0..2 and 0 in row 3, s = 1 +
 * 2^-23; x row 0 = (1, 1, 1, 2^55), row 1 = (1, 1, 1, 1).  Row 0's 2^55
 * keeps the exact form for the row: W = 3 + 3 2^-23 rounds (a tie) to 3 +
 * 2^-21, and W + W + W = 9 + 1.5 2^-20 rounds (a tie) to 9 + 2^-19.  Row 1
 * regroups: s * 9 = 9 + 9 2^-23 rounds to 9 + 2^-20. */
static void test_regrouped_and_exact_forms(awq_status (*linear)(const awq_linear_problem *,
                                                                const awq_config *),
                                           const char *what)
{
    for (int threads = 1; threads <= 2; threads++) {
        rng_state = 3;
        problem P = make_problem(1, 256, 8, 256, AWQ_F16, 1, 0);
        for (int64_t k = 0; k < 256; k++)
            P.qw[k] = k == 0 ? 0x00050005u : 0x00000005u; /* columns 0 and 1: nibbles 0, 4 */
        P.qz[0] = 0u;
        for (int64_t n = 0; n < 8; n++) {
            encode(P.sc, n, n == 0 ? 1.0 + 0x1p-10 : n == 1 ? 4372.0 : 1.0, AWQ_F16);
            encode(P.bias, n, n == 0 ? 0.375 : n == 1 ? 6.0 : 0.0, AWQ_F16);
        }
        for (int64_t k = 0; k < 256; k++)
            encode(P.x, k, 1.0, AWQ_F16);
        awq_linear_problem p = view(&P);
        awq_config c = {.kernel = AWQ_KERNEL_CPU, .threads = threads};
        CHECK(linear(&p, &c) == AWQ_OK);
        CHECK(decode(P.y, 0, AWQ_F16) == 1282.0);
        CHECK(decode(P.y, 1, AWQ_F16) == 21856.0);
        for (int64_t n = 2; n < 8; n++)
            CHECK(decode(P.y, n, AWQ_F16) == 0.0);
        CHECK(check_reference(&P, what) == 0);
        free_problem(&P);

        P = make_problem(2, 4, 8, 4, AWQ_F32, 0, 0);
        for (int64_t k = 0; k < 4; k++)
            P.qw[k] = k < 3 ? 0x33333333u : 0u;
        P.qz[0] = 0u;
        for (int64_t n = 0; n < 8; n++)
            encode(P.sc, n, 1.0 + 0x1p-23, AWQ_F32);
        for (int64_t k = 0; k < 8; k++)
            encode(P.x, k, k == 3 ? 0x1p55 : 1.0, AWQ_F32);
        p = view(&P);
        CHECK(linear(&p, &c) == AWQ_OK);
        for (int64_t n = 0; n < 8; n++) {
            CHECK(((float *)P.y)[n] == 9.0f + 0x1p-19f);
            CHECK(((float *)P.y)[8 + n] == 9.0f + 0x1p-20f);
        }
        CHECK(check_reference(&P, what) == 0);
        free_problem(&P);
    }
}

/* bfloat16 keeps the exact form: W's rounding error, up to 2^-8 of |W|,
 * would take a regrouped sum outside the tolerance.  s = 1.15625; q - z =
 * 7 gives W = 8.09375 rounded (a tie) to 8.125, q - z = 9 gives 10.40625
 * rounded to 10.375.  Rows
 * alternate x = 1, q - z = 7 and x = -0.78125, q - z = 9: the float64
 * reference is 32 (8.125 - 8.10546875) = 0.625 with |x| @ |W| = 519.375,
 * a tolerance of 1.0144 + 1 ulp; the regrouped form would give s * 32 (7 -
 * 7.03125) = -1.15625, 1.78 away. */
static void test_bf16_rounded_w_stays_exact(void)
{
    rng_state = 4;
    problem P = make_problem(1, 64, 8, 64, AWQ_BF16, 0, 0);
    for (int64_t k = 0; k < 64; k++) {
        P.qw[k] = k % 2 ? 0x99999999u : 0x77777777u;
        encode(P.x, k, k % 2 ? -0.78125 : 1.0, AWQ_BF16);
    }
    P.qz[0] = 0u;
    for (int64_t n = 0; n < 8; n++)
        encode(P.sc, n, 1.15625, AWQ_BF16);
    CHECK(run(&P, 0, 0) == AWQ_OK);
    for (int64_t n = 0; n < 8; n++)
        CHECK(decode(P.y, n, AWQ_BF16) == 0.625);
    CHECK(check_reference(&P, "bfloat16, W rounded") == 0);
    free_problem(&P);
}

#ifdef HAVE_MXCSR
/* The caller's floating-point environment changes no bit: flush-to-zero,
 * denormals-are-zero and rounding toward zero, set in this thread and in
 * OpenMP's pooled threads, give the bits of the default environment, and
 * each thread's own environment is back afterwards. */
static void test_float_environment(void)
{
    const unsigned odd = 0x1F80u | 0x8040u | 0x6000u; /* masked, FTZ + DAZ, toward zero */
    for (int t = AWQ_F16; t <= AWQ_F32; t++) {
        rng_state = 21 + (uint64_t)t;
        problem P = make_problem(3, 384, 136, 128, (awq_dtype)t, 1, 1);
        size_t bytes = (size_t)(P.M * P.N) * dsize(P.t);
        CHECK(run(&P, 1, 0) == AWQ_OK);
        void *want = xmalloc(bytes);
        memcpy(want, P.y, bytes);
        for (int threads = 1; threads <= 2; threads++) {
            unsigned mine = _mm_getcsr(), seen = 0;
#pragma omp parallel num_threads(threads)
            _mm_setcsr(odd);
            memset(P.y, 0x5A, bytes);
            CHECK(run(&P, threads, 64) == AWQ_OK);
            CHECK(same_bits(want, P.y, P.M * P.N, P.t));
#pragma omp parallel num_threads(threads) reduction(| : seen)
            {
                seen |= _mm_getcsr() ^ odd;
                _mm_setcsr(mine);
            }
            CHECK(seen == 0);
            _mm_setcsr(mine);
        }
        free(want);
        free_problem(&P);
    }
}
#endif

static void test_edges(void)
{
    /* K = 0: y = bias (or zeros) */
    rng_state = 42;
    problem P = make_problem(3, 0, 16, 1, AWQ_BF16, 1, 0);
    CHECK(run(&P, 0, 0) == AWQ_OK);
    for (int64_t i = 0; i < 3 * 16; i++)
        CHECK(((uint16_t *)P.y)[i] == ((uint16_t *)P.bias)[i % 16]);
    free_problem(&P);
    P = make_problem(2, 0, 8, 1, AWQ_F32, 0, 0);
    CHECK(run(&P, 0, 0) == AWQ_OK);
    for (int64_t i = 0; i < 2 * 8; i++)
        CHECK(((float *)P.y)[i] == 0.0f);
    free_problem(&P);

    /* M = 0 and N = 0 write nothing */
    P = make_problem(0, 64, 8, 64, AWQ_F16, 0, 0);
    CHECK(run(&P, 0, 0) == AWQ_OK);
    free_problem(&P);
    P = make_problem(3, 64, 0, 64, AWQ_F16, 1, 0);
    CHECK(run(&P, 0, 0) == AWQ_OK);
    free_problem(&P);

    /* configurations the kernel refuses, before touching y */
    P = make_problem(2, 64, 16, 32, AWQ_F16, 1, 0);
    awq_linear_problem p = view(&P);
    const awq_config bad[] = {
        {.kernel = AWQ_KERNEL_CPU, .chunk = 12},
        {.kernel = AWQ_KERNEL_CPU, .chunk = -8},
        {.kernel = AWQ_KERNEL_CPU, .threads = -1},
        {.kernel = AWQ_KERNEL_V4},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(awq_cpu_linear(&p, &bad[i]) == AWQ_ERR_CONFIG);
        for (int64_t j = 0; j < 2 * 16; j++)
            CHECK(((uint16_t *)P.y)[j] == 0xA5A5u);
    }
    /* kernel "auto" is the CPU kernel; a chunk past N is clamped */
    awq_config autoc = {.kernel = AWQ_KERNEL_AUTO, .chunk = 1 << 20};
    CHECK(awq_cpu_linear(&p, &autoc) == AWQ_OK);
    CHECK(check_reference(&P, "auto, huge chunk") == 0);
    free_problem(&P);

    /* every scale NaN, or every scale +Inf with q == z somewhere: NaN out */
    rng_state = 7;
    P = make_problem(2, 128, 64, 64, AWQ_F16, 0, 0);
    for (int64_t i = 0; i < 2 * 64; i++)
        encode(P.sc, i, NAN, AWQ_F16);
    CHECK(run(&P, 0, 0) == AWQ_OK);
    for (int64_t i = 0; i < 2 * 64; i++)
        CHECK(isnan(decode(P.y, i, AWQ_F16)));
    free_problem(&P);

    /* an Inf scale with q != z everywhere and positive x: +-Inf out, not NaN */
    P = make_problem(1, 32, 8, 32, AWQ_BF16, 1, 0);
    for (int64_t k = 0; k < 32; k++)
        P.qw[k] = 0x99999999u; /* q = 9 */
    P.qz[0] = 0x11111111u;     /* z = 1: q - z = 8 */
    for (int64_t n = 0; n < 8; n++)
        encode(P.sc, n, n % 2 ? -INFINITY : INFINITY, AWQ_BF16);
    for (int64_t k = 0; k < 32; k++)
        encode(P.x, k, 1.0 + (double)k / 64, AWQ_BF16);
    CHECK(run(&P, 0, 0) == AWQ_OK);
    for (int64_t n = 0; n < 8; n++)
        CHECK(decode(P.y, n, AWQ_BF16) == (n % 2 ? -INFINITY : INFINITY));
    CHECK(check_reference(&P, "inf scales") == 0);
    free_problem(&P);

    /* float16 W that overflows to Inf through rounding alone: 15 * 4368 = 65520 */
    P = make_problem(1, 8, 8, 8, AWQ_F16, 0, 0);
    for (int64_t k = 0; k < 8; k++)
        P.qw[k] = k == 3 ? 0xFFFFFFFFu : 0u;
    P.qz[0] = 0u;
    for (int64_t n = 0; n < 8; n++)
        encode(P.sc, n, 4368.0, AWQ_F16);
    for (int64_t k = 0; k < 8; k++)
        encode(P.x, k, 0.25, AWQ_F16);
    CHECK(run(&P, 0, 0) == AWQ_OK);
    for (int64_t n = 0; n < 8; n++)
        CHECK(decode(P.y, n, AWQ_F16) == INFINITY); /* float32 math alone would give 16380 */
    free_problem(&P);
}

/* Products are rounded to float32 before they are added (DESIGN.md section
 * 7): for bfloat16 and float32, x * W may overflow float32 where a fused
 * multiply-add would still see a finite sum.  Rows 0 and 1 share a group
 * (scale 2^120, zero point 0): x0 W0 = -2^7 * 2^120 = -2^127, then x1 W1 =
 * 2^7 * 2^121 = 2^128, which is +Inf in float32, so y = +Inf (float64 and
 * a fused form would give 2^127). */
static void test_products_round_first(void)
{
    for (int t = AWQ_BF16; t <= AWQ_F32; t++) {
        rng_state = 11;
        problem P = make_problem(1, 2, 8, 2, (awq_dtype)t, 0, 0);
        P.qw[0] = 0x11111111u; /* q = 1 */
        P.qw[1] = 0x22222222u; /* q = 2 */
        P.qz[0] = 0u;
        for (int64_t n = 0; n < 8; n++)
            encode(P.sc, n, 0x1p120, (awq_dtype)t);
        encode(P.x, 0, -0x1p7, (awq_dtype)t);
        encode(P.x, 1, 0x1p7, (awq_dtype)t);
        CHECK(run(&P, 0, 0) == AWQ_OK);
        for (int64_t n = 0; n < 8; n++)
            CHECK(decode(P.y, n, (awq_dtype)t) == INFINITY);
        free_problem(&P);
    }
}

static void test_candidates(void)
{
    rng_state = 99;
    /* the vector kernel's candidates, first (test_amx has the AMX kernel's,
     * which come after them) */
    problem P = make_problem(3, 256, 200, 128, AWQ_F32, 1, 0);
    awq_linear_problem p = view(&P);
    awq_config cands[64];
    int n = awq_cpu_linear_candidates(&p, cands, 64);
    CHECK(n >= 1);
    CHECK(cands[0].kernel == AWQ_KERNEL_CPU && cands[0].threads == 0 && cands[0].chunk == 0);
    CHECK(awq_cpu_linear_candidates(&p, cands, 1) == 1);
    CHECK(awq_cpu_linear_candidates(&p, cands, 0) == 0);
    n = awq_cpu_linear_candidates(&p, cands, 64);
    while (n > 0 && cands[n - 1].kernel == AWQ_KERNEL_AMX)
        n--;
    size_t bytes = (size_t)(P.M * P.N) * dsize(P.t);
    CHECK(awq_cpu_linear(&p, &cands[0]) == AWQ_OK);
    void *first = xmalloc(bytes);
    memcpy(first, P.y, bytes);
    for (int i = 1; i < n; i++) {
        CHECK(cands[i].kernel == AWQ_KERNEL_CPU);
        CHECK(cands[i].chunk > 0 && cands[i].chunk % 8 == 0);
        CHECK(cands[i].chunk < 2 * 256); /* nothing past the chunk that covers N = 200 */
        CHECK(cands[i].threads >= 1 && cands[i].threads <= awq_cpu_max_threads());
        memset(P.y, 0, bytes);
        CHECK(awq_cpu_linear(&p, &cands[i]) == AWQ_OK);
        CHECK(memcmp(first, P.y, bytes) == 0); /* every candidate: the same bits */
    }
    free(first);
    free_problem(&P);
}

/* The fixed cases, on the path this process takes; forms names its
 * worked examples of the two forms in messages. */
static void fixed_cases(const char *forms)
{
    test_worked_example();
    test_regrouped_and_exact_forms(awq_cpu_linear, forms);
    test_bf16_rounded_w_stays_exact();
#ifdef HAVE_MXCSR
    test_float_environment();
#endif
    test_edges();
    test_products_round_first();
}

/* ---- timing (printed, never asserted) ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Large buffers on huge pages where the kernel allows, as NumPy's are. */
static void *big_alloc(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 1 << 21, n) != 0) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(2);
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(p, n, MADV_HUGEPAGE);
#endif
    memset(p, 0, n);
    return p;
}

static void bench(int reps)
{
    const int64_t K = 4096, N = 14336, G = 128, M = 1;
    awq_linear_problem p = {0};
    size_t qwb = (size_t)(K * N / 2), qzb = (size_t)(K / G * N / 2), scb = (size_t)(K / G * N) * 2;
    uint32_t *qw = big_alloc(qwb), *qz = big_alloc(qzb);
    uint16_t *sc = big_alloc(scb), *x = big_alloc((size_t)(M * K) * 2),
             *y = big_alloc((size_t)(M * N) * 2);
    rng_state = 5;
    for (size_t i = 0; i < qwb / 4; i++)
        qw[i] = (uint32_t)rnd();
    for (size_t i = 0; i < qzb / 4; i++)
        qz[i] = (uint32_t)rnd();
    for (int64_t i = 0; i < K / G * N; i++)
        encode(sc, i, rnd_value(AWQ_F16, -8, -3), AWQ_F16);
    for (int64_t i = 0; i < M * K; i++)
        encode(x, i, rnd_value(AWQ_F16, -3, 1), AWQ_F16);
    p = (awq_linear_problem){x, qw, qz, sc, NULL, y, M, K, N, G, AWQ_F16, -1, NULL};
    awq_config c = {.kernel = AWQ_KERNEL_CPU};
    double best = 1e30;
    for (int r = 0; r < reps + 2; r++) {
        double t0 = now_s();
        awq_status s = awq_cpu_linear(&p, &c);
        double dt = now_s() - t0;
        CHECK(s == AWQ_OK);
        if (r >= 2 && dt < best)
            best = dt;
    }
    double packed = (double)(qwb + qzb + scb);
    printf("linear M=1 K=%lld N=%lld G=%lld float16 (%s, %d threads): best of %d %.3f ms, "
           "%.2f GB/s of packed weights+zeros+scales\n",
           (long long)K, (long long)N, (long long)G, awq_cpu_linear_simd(), awq_cpu_max_threads(),
           reps,
           best * 1e3, packed / best * 1e-9);

    /* memcpy of a large array, the same measure as np.copyto's rate */
    size_t cb = (size_t)256 << 20;
    char *a = big_alloc(cb), *b = big_alloc(cb);
    memset(a, 1, cb);
    double cbest = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        memcpy(b, a, cb);
        double dt = now_s() - t0;
        if (dt < cbest)
            cbest = dt;
    }
    printf("memcpy of %zu MiB: %.2f GB/s (bytes copied per second); linear/memcpy rate %.2f\n",
           cb >> 20, (double)cb / cbest * 1e-9, packed / best / ((double)cb / cbest));
    printf("time_ms %.4f packed_bytes %.0f\n", best * 1e3, packed);
    free(a);
    free(b);
    free(qw);
    free(qz);
    free(sc);
    free(x);
    free(y);
}

/* ---- the AMX kernel for bfloat16 and float16 (csrc/cpu/amx.c) ---- */

static awq_status run_amx(const problem *P, int threads, int64_t chunk, int *ran)
{
    awq_linear_problem p = view(P);
    awq_config c = {.kernel = AWQ_KERNEL_AMX, .threads = threads, .chunk = chunk};
    return awq_cpu_linear_amx(&p, &c, ran);
}

/* The problem amx_value and amx_exponents look at, the same every call. */
static problem amx_problem(awq_dtype t)
{
    rng_state = 4242;
    return make_problem(5, 128, 72, 32, t, 1, 0);
}

/* The least binary exponent of a nonzero value and the largest of any
 * among amx_problem's x (where 0) or scales (1). */
static void amx_exponents(awq_dtype t, int where, int *lo, int *hi)
{
    problem P = amx_problem(t);
    const int64_t n = where ? P.K / P.G * P.N : P.M * P.K;
    *lo = INT_MAX;
    *hi = INT_MIN;
    for (int64_t i = 0; i < n; i++) {
        int e;
        double v = decode(where ? P.sc : P.x, i, t);
        if (v == 0)
            continue;
        frexp(v, &e); /* v = f 2^e, 0.5 <= |f| < 1 */
        *lo = e - 1 < *lo ? e - 1 : *lo;
        *hi = e - 1 > *hi ? e - 1 : *hi;
    }
    free_problem(&P);
}

/* A problem whose x or scale (where: 0 x, 1 scales) at index i is v: the
 * tiles take it (ran) or leave it to awq_cpu_linear's kernel, whose bits
 * the AMX configuration then gives. */
static void amx_value(awq_dtype t, double v, int where, int expect_ran)
{
    problem P = amx_problem(t);
    encode(where ? P.sc : P.x, where ? 70 : 200, v, t);
    size_t bytes = (size_t)(P.M * P.N) * dsize(t);
    int ran = -1;
    CHECK(run_amx(&P, 0, 0, &ran) == AWQ_OK);
    if (ran != expect_ran) {
        fprintf(stderr, "amx: %s %s = %g: ran %d, expected %d\n", awq_dtype_name(t),
                where ? "scale" : "x", v, ran, expect_ran);
        CHECK(0);
    }
    awq_linear_problem p = view(&P);
    awq_config amx = {.kernel = AWQ_KERNEL_AMX};
    memset(P.y, 0x5A, bytes);
    CHECK(awq_cpu_linear(&p, &amx) == AWQ_OK);
    CHECK(check_reference(&P, "amx, edge values") == 0);
    if (!expect_ran) {
        void *got = xmalloc(bytes);
        memcpy(got, P.y, bytes);
        CHECK(run(&P, 0, 0) == AWQ_OK);
        CHECK(same_bits(got, P.y, P.M * P.N, t));
        free(got);
    }
    free_problem(&P);
}

/* Each bound on the exponents of x and the scales (the least, the largest)
 * met and missed by one, and values outside them all (a subnormal, NaN,
 * Inf); zero is always inside. */
static void amx_bounds(awq_dtype t, int least_x, int least_s, int most_x, int most_s)
{
    amx_value(t, ldexp(1.0, least_x), 0, 1);
    amx_value(t, -ldexp(1.0, least_x - 1), 0, 0);
    amx_value(t, ldexp(1.0, least_s), 1, 1);
    amx_value(t, ldexp(1.0, least_s - 1), 1, 0);
    amx_value(t, ldexp(1.5, most_x), 0, 1);
    amx_value(t, -ldexp(1.0, most_x + 1), 0, 0);
    amx_value(t, ldexp(1.5, most_s), 1, 1);
    amx_value(t, ldexp(1.0, most_s + 1), 1, 0);
    static const double outside[] = {0x1p-130, NAN, -INFINITY};
    for (int where = 0; where < 2; where++) {
        amx_value(t, where ? 0.0 : -0.0, where, 1);
        for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++)
            amx_value(t, outside[i], where, 0);
    }
}

static void test_amx(void)
{
    rng_state = 77;
    problem P = make_problem(3, 64, 64, 32, AWQ_BF16, 1, 0);
    awq_linear_problem p = view(&P);
    const awq_config bad[] = {{.kernel = AWQ_KERNEL_AMX, .chunk = 32},
                              {.kernel = AWQ_KERNEL_AMX, .chunk = 2048},
                              {.kernel = AWQ_KERNEL_AMX, .threads = -1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int ran = -1;
        CHECK(awq_cpu_linear_amx(&p, &bad[i], &ran) == AWQ_ERR_CONFIG && ran == 0);
        CHECK(awq_cpu_linear(&p, &bad[i]) == AWQ_ERR_CONFIG);
    }
    /* the AMX candidates: its default, then its grid, after all of the
     * vector kernel's (which a G that is not even gets alone; float16 and
     * float32 also one that is neither a multiple of 32 nor K) */
    awq_config cands[64], single[64];
    awq_linear_problem alone = p;
    alone.dtype = AWQ_F32;
    alone.G = 16;
    const int n32 = awq_cpu_linear_candidates(&alone, single, 64);
    for (int i = 0; i < n32; i++)
        CHECK(single[i].kernel == AWQ_KERNEL_CPU);
    for (int d = 0; d < 3; d++) {
        awq_linear_problem pd = p;
        pd.dtype = d == 2 ? AWQ_F32 : d ? AWQ_F16 : AWQ_BF16;
        const int n = awq_cpu_linear_candidates(&pd, cands, 64);
        for (int i = 0; i < n32; i++)
            CHECK(cands[i].kernel == AWQ_KERNEL_CPU && cands[i].chunk == single[i].chunk &&
                  cands[i].threads == single[i].threads);
        for (int i = n32; i < n; i++) {
            CHECK(cands[i].kernel == AWQ_KERNEL_AMX);
            CHECK(i == n32 ? cands[i].threads == 0 && cands[i].chunk == 0
                           : cands[i].chunk >= 128 && cands[i].chunk <= 1024 &&
                                 cands[i].threads >= 1);
        }
        CHECK(awq_cpu_amx_ready() ? n > n32 + 1 : n == n32);
    }
    free_problem(&P);
    if (!awq_cpu_amx_ready()) {
        printf("amx: no AMX tiles on this host or build; the kernel's own checks skipped\n");
        amx_value(AWQ_BF16, 1.0, 0, 0); /* its configurations still run awq_cpu_linear's kernel */
        amx_value(AWQ_F16, 1.0, 0, 0);
        amx_value(AWQ_F32, 1.0, 0, 0);
        return;
    }

    /* M, K, N, G: 16-row and 32-row tails, several 256-row blocks of the
     * sum, N tails of the 16- and 64-column tiles and of the chunks, G = 2,
     * G = K, more than one 256-row block of x; float16 and float32 run on
     * the tiles where G is a multiple of 32 or K, and the kernel declines
     * the rest */
    static const int64_t shapes[][4] = {{1, 64, 8, 64},     {5, 96, 72, 32},   {16, 256, 64, 128},
                                        {17, 200, 136, 8},  {33, 640, 520, 128}, {2, 260, 56, 130},
                                        {150, 300, 200, 2}, {290, 512, 1096, 64}};
    static const int64_t chunks[] = {64, 128, 1024};
    static const awq_dtype types[] = {AWQ_BF16, AWQ_F16, AWQ_F32};
    for (size_t i = 0; i < 3 * sizeof shapes / sizeof shapes[0]; i++) {
        const awq_dtype t = types[i % 3];
        for (int bias = 0; bias < 2; bias++) {
            rng_state = 1000 + 2 * i + (uint64_t)bias;
            const int64_t *s = shapes[i / 3];
            problem Q = make_problem(s[0], s[1], s[2], s[3], t, bias, 0);
            size_t bytes = (size_t)(Q.M * Q.N) * dsize(t);
            const int tiles = t == AWQ_BF16 || s[3] % 32 == 0 || s[3] == s[1];
            int ran = -1;
            CHECK(run_amx(&Q, 0, 0, &ran) == AWQ_OK && ran == tiles);
            if (!tiles) { /* amx_value checks what the vector kernel then gives */
                free_problem(&Q);
                continue;
            }
            CHECK(check_reference(&Q, "amx") == 0);
            void *first = xmalloc(bytes);
            memcpy(first, Q.y, bytes);
            for (int threads = 1; threads <= 3; threads++)
                for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
                    memset(Q.y, 0x5A, bytes);
                    CHECK(run_amx(&Q, threads, chunks[c], &ran) == AWQ_OK && ran == tiles);
                    if (memcmp(first, Q.y, bytes) != 0) {
                        fprintf(stderr, "amx: shape %zu: threads %d chunk %lld changed the bits\n",
                                i, threads, (long long)chunks[c]);
                        CHECK(0);
                    }
                }
            free(first);
            free_problem(&Q);
        }
    }

    /* the edges of the values the tiles take, in x and in the scales:
     * bfloat16 and float32 bound the least and largest exponents of x and
     * the scales together (cpu/amx.c); each bound met and missed by one
     * against amx_value's problem as it is */
    int xlo, xhi, slo, shi, ran;
    amx_exponents(AWQ_BF16, 0, &xlo, &xhi);
    amx_exponents(AWQ_BF16, 1, &slo, &shi);
    const int least_bx = -112 - slo > -126 ? -112 - slo : -126;
    const int least_bs = -112 - xlo > -126 ? -112 - xlo : -126;
    const int most_bx = 127 - 6 - 7 - shi;
    const int most_bs = 127 - 6 - 7 - xhi < 122 ? 127 - 6 - 7 - xhi : 122;
    amx_bounds(AWQ_BF16, least_bx, least_bs, most_bx, most_bs);
    /* float16: any finite x (subnormal and the largest included); scales
     * finite and below 2^12 */
    static const double x_inside[] = {0x1p-24, -0x1.ffcp-15, 65504.0, -0.0};
    static const double s_inside[] = {0x1p-24, 0x1.ffcp11, -0x1.ffcp11, 0.0};
    static const double s_outside[] = {4096.0, -65504.0, NAN, -INFINITY};
    for (size_t i = 0; i < 4; i++) {
        amx_value(AWQ_F16, x_inside[i], 0, 1);
        amx_value(AWQ_F16, s_inside[i], 1, 1);
        amx_value(AWQ_F16, s_outside[i], 1, 0);
    }
    amx_value(AWQ_F16, INFINITY, 0, 0);
    amx_value(AWQ_F16, NAN, 0, 0);
    /* float32 */
    amx_exponents(AWQ_F32, 0, &xlo, &xhi);
    amx_exponents(AWQ_F32, 1, &slo, &shi);
    const int least_x = -103 - (slo < 0 ? slo : 0), least_s = -103 - xlo;
    const int most_x = 127 - 6 - 7 - (shi > 0 ? shi : 0), most_s = 127 - 6 - 7 - xhi; /* K = 128 */
    amx_bounds(AWQ_F32, least_x, least_s, most_x, most_s);
    /* float16 and float32: every part of x counts.  One nonzero x a row, a
     * signed power of two times 1 + 2^-9 (float16: parts 1 and 2^-9, so
     * scaled) or 1 + 2^-9 + 2^-18 (float32: 1, 2^-9, 2^-18): x (q - z) is
     * exact in float32, so y must be x (q - z) s rounded to float32 (one
     * FMA) and then to the dtype, as float64 gives it. */
    for (int d = 0; d < 2; d++) {
        const awq_dtype t = d ? AWQ_F32 : AWQ_F16;
        rng_state = 55;
        problem E = make_problem(4, 256, 72, 128, t, 0, 0);
        static const int64_t at[4] = {3, 130, 255, 64};
        const double times[4] = {1.0, -0.5, d ? 0x1p20 : 0x1p10, d ? -0x1p-30 : -0x1p-10};
        const double v = d ? 1.0 + 0x1p-9 + 0x1p-18 : 1.0 + 0x1p-9;
        for (int64_t m = 0; m < 4; m++)
            for (int64_t k = 0; k < 256; k++)
                encode(E.x, m * 256 + k, k == at[m] ? v * times[m] : 0.0, t);
        ran = -1;
        CHECK(run_amx(&E, 0, 0, &ran) == AWQ_OK && ran == 1);
        for (int64_t m = 0; m < 4; m++)
            for (int64_t n = 0; n < 72; n++) {
                const int64_t k = at[m], g = k / 128;
                const int q = nibble(E.qw + k * 9, n), z = nibble(E.qz + g * 9, n);
                const double x = decode(E.x, m * 256 + k, t), sc = decode(E.sc, g * 72 + n, t);
                const double want = round_dtype((float)(x * (q - z) * sc), t);
                CHECK(decode(E.y, m * 72 + n, t) == want);
            }
        free_problem(&E);
    }
    /* an odd G, or float16 and float32 with G neither a multiple of 32 nor
     * K, goes to awq_cpu_linear's kernel */
    rng_state = 31;
    problem O = make_problem(3, 63, 16, 21, AWQ_BF16, 0, 0);
    ran = -1;
    CHECK(run_amx(&O, 0, 0, &ran) == AWQ_OK && ran == 0);
    free_problem(&O);
    for (int d = 0; d < 2; d++) {
        problem F = make_problem(3, 64, 16, 16, d ? AWQ_F32 : AWQ_F16, 0, 0);
        ran = -1;
        CHECK(run_amx(&F, 0, 0, &ran) == AWQ_OK && ran == 0);
        free_problem(&F);
    }
    printf("amx: checked\n");
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "--bench") == 0) {
        bench(argc >= 3 ? atoi(argv[2]) : 20);
        return failures ? 1 : 0;
    }

    /* The scalar path, in a child that starts before any kernel ran here:
     * its outputs go to a file the parent compares with its own. */
    FILE *f = tmpfile();
    if (!f) {
        perror("tmpfile");
        return 2;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 2;
    }
    if (pid == 0) {
        setenv("AWQ_FAST_DEQUANT_CPU_SCALAR", "1", 1);
        sweep("scalar path", fileno(f));
        fixed_cases("scalar path, forms");
        fprintf(stderr, "scalar path (%s): %d checks, %d failed\n", awq_cpu_linear_simd(), checks,
                failures);
        fflush(NULL);
        _exit(failures ? 1 : 0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    int vector = strcmp(awq_cpu_linear_simd(), "scalar") != 0;
    printf("path %s, %d OpenMP threads\n", awq_cpu_linear_simd(), awq_cpu_max_threads());
    sweep(vector ? "vector path" : "default path", -1);
    fixed_cases(vector ? "vector path, forms" : "forms");
#ifdef LINEAR_NARROW
    test_regrouped_and_exact_forms(awq_cpu_linear_narrow, "AVX2 tiles, forms");
#endif
    test_candidates();
    test_amx();

    /* the vector path's outputs equal the scalar path's, bit for bit (and
     * the AVX2 tiles', where they are linked in as well) */
    int mismatches = 0;
    off_t at = 0;
    for (int i = 0; i < SWEEP; i++) {
        problem P = sweep_problem(i);
        size_t bytes = (size_t)(P.M * P.N) * dsize(P.t);
        CHECK(run(&P, 0, 0) == AWQ_OK);
        void *other = xmalloc(bytes);
        ssize_t got = pread(fileno(f), other, bytes, at);
        at += (off_t)bytes;
        if (got != (ssize_t)bytes || !same_bits(other, P.y, P.M * P.N, P.t)) {
            if (mismatches++ < 3)
                fprintf(stderr, "problem %d: the scalar and vector paths differ\n", i);
            CHECK(0);
        }
#ifdef LINEAR_NARROW
        memcpy(other, P.y, bytes);
        memset(P.y, 0x5A, bytes);
        awq_linear_problem p = view(&P);
        awq_config c = {.kernel = AWQ_KERNEL_CPU, .threads = 1 + i % 3, .chunk = 8 * (i % 40)};
        CHECK(awq_cpu_linear_narrow(&p, &c) == AWQ_OK);
        CHECK(check_reference(&P, "AVX2 tiles") == 0);
        if (!same_bits(other, P.y, P.M * P.N, P.t)) {
            if (mismatches++ < 3)
                fprintf(stderr, "problem %d: the AVX2 and default vector paths differ\n", i);
            CHECK(0);
        }
#endif
        free(other);
        free_problem(&P);
    }
    fclose(f);

    bench(1);
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
