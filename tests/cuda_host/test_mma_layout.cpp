/*
 * tests/cuda_host/test_mma_layout.cpp -- the tensor-core linear's fragment
 * mapping, checked on the host (no GPU).
 *
 * It runs the warps of awq_mma_kernel (csrc/cuda/linear.cu) lane by lane with
 * the kernel's own index and bit functions (csrc/cuda/linear_layout.cuh): the
 * words each lane loads (clamped column, K-tail rows), the nibble pairs of the
 * B registers, the zero and scale pairs, the A registers, the group walk, the
 * split-K slices and the fixed-order sums through the swizzled partial tiles.
 * The fragments go through an emulation of mma.sync.aligned.m16n8k16.row.col
 * written from the PTX ISA's fragment tables (below), independently of the
 * kernel.  Every input is chosen so that every product and every sum is exact
 * in double, so y must equal x @ W (+ bias), computed directly from the AWQ
 * contract, exactly -- whatever the order of the sums.
 *
 * Build and run: c++ -std=c++17 -O1 -I csrc tests/cuda_host/test_mma_layout.cpp && ./a.out
 * Exit status 0 when every case matches.
 */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/linear_layout.cuh"
#include "isa_mma.h"

namespace mm = awq_cu::mma_map;

namespace {

using namespace isa;

/* ======================================================================
 * A problem, its direct reference, and bounds-checked reads
 * ====================================================================== */
struct Problem {
    int M, K, N, G;
    Dtype dt;
    bool has_bias;
    std::vector<uint16_t> x;  /* [M, K] */
    std::vector<uint32_t> qw; /* [K, N/8] */
    std::vector<uint32_t> qz; /* [K/G, N/8] */
    std::vector<uint16_t> sc; /* [K/G, N] */
    std::vector<uint16_t> bias;
    int W() const { return N / 8; }
};

long g_oob = 0; /* reads outside an array: the kernel would fault or read garbage */

uint32_t read_qw(const Problem &p, int64_t k, int64_t c)
{
    if (k < 0 || k >= p.K || c < 0 || c >= p.W()) return ++g_oob, 0u;
    return p.qw[k * p.W() + c];
}
uint32_t read_qz(const Problem &p, int64_t grp, int64_t c)
{
    if (grp < 0 || grp >= p.K / p.G || c < 0 || c >= p.W()) return ++g_oob, 0u;
    return p.qz[grp * p.W() + c];
}
/* Word h (0..3) of the 16 bytes of scales of word column c: scales 8c + 2h, 8c + 2h + 1. */
uint32_t read_sc_word(const Problem &p, int64_t grp, int64_t c, int h)
{
    if (grp < 0 || grp >= p.K / p.G || c < 0 || c >= p.W()) return ++g_oob, 0u;
    const int64_t at = grp * p.N + 8 * c + 2 * h;
    return p.sc[at] | ((uint32_t)p.sc[at + 1] << 16);
}
/* The 32-bit word of x elements (k, k+1) of row m. */
uint32_t read_x_pair(const Problem &p, int64_t m, int64_t k)
{
    if (m < 0 || m >= p.M || k < 0 || k + 1 >= p.K) return ++g_oob, 0u;
    return p.x[m * p.K + k] | ((uint32_t)p.x[m * p.K + k + 1] << 16);
}

/* Column 8c + j of a packed word lives in nibble kReverse[j] (DESIGN.md section 1). */
const int kReverse[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/* W[k][n] from the contract: (q - z) * s, exact here by construction. */
double w_ref(const Problem &p, int k, int n)
{
    const int sh = 4 * kReverse[n % 8];
    const int q = (int)((p.qw[(int64_t)k * p.W() + n / 8] >> sh) & 0xF);
    const int z = (int)((p.qz[(int64_t)(k / p.G) * p.W() + n / 8] >> sh) & 0xF);
    return (double)(q - z) * value(p.dt, p.sc[(int64_t)(k / p.G) * p.N + n]);
}

Problem make_problem(std::mt19937 &rng, int M, int K, int N, int G, Dtype dt, bool bias)
{
    Problem p{M, K, N, G, dt, bias, {}, {}, {}, {}, {}};
    std::uniform_int_distribution<uint32_t> word;
    std::uniform_int_distribution<int> xi(-4, 4), mant(1, 15), ex(-8, -2), sign(0, 1);
    p.x.resize((size_t)M * K);
    for (auto &v : p.x) v = bits_of(dt, xi(rng));
    p.qw.resize((size_t)K * p.W());
    for (auto &v : p.qw) v = word(rng);
    p.qz.resize((size_t)(K / G) * p.W());
    for (auto &v : p.qz) v = word(rng);
    /* scales m 2^e, m < 16: (q - z) s has at most 8 significant bits (exact in
     * bfloat16 and float16), and every product with x and every sum is exact in double */
    p.sc.resize((size_t)(K / G) * N);
    for (auto &v : p.sc) v = bits_of(dt, (sign(rng) ? -1 : 1) * std::ldexp((double)mant(rng), ex(rng)));
    if (bias) {
        p.bias.resize(N);
        for (auto &v : p.bias) v = bits_of(dt, std::ldexp((double)xi(rng), -3));
    }
    return p;
}

/* ======================================================================
 * The kernel, emulated: one launch of awq_mma_kernel<T, ROWS, K % 16 != 0>
 * with block_size = 32 S and split blocks per cluster.
 * ====================================================================== */
struct Config {
    int S, split, rows;
};

struct Output {
    std::vector<double> y; /* [M, N] */
    std::vector<int> writes;
};

void store_word(const Problem &p, Output &out, int64_t row, int64_t wc, const double v[8])
{
    if (row < 0 || row >= p.M || wc < 0 || wc >= p.W()) {
        ++g_oob;
        return;
    }
    for (int j = 0; j < 8; ++j) {
        const int64_t at = row * p.N + 8 * wc + j;
        out.y[at] = v[j] + (p.has_bias ? value(p.dt, p.bias[8 * wc + j]) : 0.0);
        out.writes[at]++;
    }
}

/* The B register pair of n8 tile j from a lane's 4 words and its group pairs,
 * as the kernel forms it: nibble pair | magic, (base+q) - (base+z), times s. */
uint32_t b_register(const Problem &p, uint32_t lo, uint32_t hi, int j, uint32_t zp, uint32_t sp, uint32_t mask)
{
    const uint32_t magic = p.dt == F16 ? mm::kF16PairMagic : mm::kBF16PairMagic;
    const uint32_t qb = mm::nibble_pair(lo, hi, AWQ_NIBBLE(j)) | magic;
    uint32_t r = 0;
    for (int h = 0; h < 2; ++h) {
        const uint16_t q = h ? hi16(qb) : lo16(qb), z = h ? hi16(zp) : lo16(zp), s = h ? hi16(sp) : lo16(sp);
        const double d = value(p.dt, q) - value(p.dt, z); /* hsub2: exact integers */
        CHECK(d == std::floor(d) && std::fabs(d) <= 15, "q - z = %g", d);
        r |= (uint32_t)bits_of(p.dt, d * value(p.dt, s)) << (16 * h); /* hmul2: exact here */
    }
    return r & mask;
}

/* Logical k of the ISA (0..15) -> physical row offset inside the k16 step, as
 * the design states it: {2i, 2i+1, 2i+8, 2i+9} <-> {4i, 4i+1, 4i+2, 4i+3}. */
int physical_row(int kl) { return 4 * ((kl % 8) / 2) + 2 * (kl / 8) + (kl % 2); }

struct Stats {
    long steps = 0, mmas = 0, checked_b = 0;
};

/* One warp's k16 steps [s_begin, s_end): acc[lane][t][j][e]. */
void run_warp(const Problem &p, const Config &c, int64_t cb, int64_t m0, int s_begin, int s_end,
              std::vector<double> &acc, Stats &st)
{
    const int W = p.W(), K = p.K;
    const int nsteps = (K + 15) / 16;
    const int spg = p.G % 16 == 0 ? p.G / 16 : (nsteps > 0 ? nsteps : 1);
    const bool ktail = K % 16 != 0;
    const int tiles = (int)std::min<int64_t>(c.rows, (p.M - m0 + 15) / 16);
    auto A = [&](int lane, int t, int j, int e) -> double & {
        return acc[(((size_t)lane * c.rows + t) * 8 + j) * 4 + e];
    };

    /* group walk: as mma_mainloop */
    const int group = mm::group_of_step(s_begin, spg);
    int next_start = mm::group_start(group + 1, spg);
    int zrow = group; /* the row of qzeros / scales the kernel's zp / sp point at */
    uint32_t zraw[32], sraw[32][4], znext[32] = {}, snext[32][4] = {};
    uint32_t gz[32][8], gsc[32][8];
    auto colc = [&](int lane) { return std::min<int64_t>(cb + mm::word_col(mm::lane_group(lane)), W - 1); };
    auto load_group = [&](uint32_t *z, uint32_t (*s)[4], int row) {
        for (int lane = 0; lane < 32; ++lane) {
            z[lane] = read_qz(p, row, colc(lane));
            for (int h = 0; h < 4; ++h) s[lane][h] = read_sc_word(p, row, colc(lane), h);
        }
    };
    auto decode = [&](const uint32_t *z, const uint32_t (*s)[4]) {
        const uint32_t magic = p.dt == F16 ? mm::kF16PairMagic : mm::kBF16PairMagic;
        for (int lane = 0; lane < 32; ++lane)
            for (int j = 0; j < 8; ++j) {
                gz[lane][j] = mm::zero_pair(z[lane], AWQ_NIBBLE(j)) | magic;
                gsc[lane][j] = mm::scale_pair(s[lane][j >> 1], j);
            }
    };
    load_group(zraw, sraw, zrow);
    if (next_start < s_end) load_group(znext, snext, zrow + 1);
    decode(zraw, sraw);

    for (int s = s_begin; s < s_end; ++s) {
        if (s == next_start) {
            decode(znext, snext);
            next_start += spg;
            ++zrow;
            if (next_start < s_end) load_group(znext, snext, zrow + 1);
        }
        const int k0 = 16 * s;
        const bool tail_issue = k0 + 16 > K; /* mma_issue<ROWS, true> */
        const bool tail_compute = ktail && s == nsteps - 1;
        CHECK(tail_issue == tail_compute, "step %d: tail issue %d, tail compute %d", s, tail_issue, tail_compute);
        Warp w[4][8]; /* [m16 tile][n8 tile] */
        for (int lane = 0; lane < 32; ++lane) {
            const int g = mm::lane_group(lane), i = mm::lane_quad(lane);
            /* mma_issue: the 4 words (rows past K read row K-1 in the tail step) */
            uint32_t words[4];
            for (int r = 0; r < mm::kWordsPerLane; ++r) {
                int64_t k = k0 + mm::word_row(i, r);
                if (tail_issue && k >= K) k = K - 1;
                words[r] = read_qw(p, k, colc(lane));
            }
            /* the A registers */
            uint32_t areg[4][4] = {};
            for (int reg = 0; reg < 4; ++reg) {
                const int kx = k0 + mm::x_col(i) + mm::a_pair_col(reg);
                const bool k_ok = !tail_issue || kx < K;
                for (int t = 0; t < c.rows; ++t) {
                    const int64_t row = m0 + 16 * t + g + 8 * mm::a_row_half(reg);
                    areg[t][reg] = k_ok && row < p.M ? read_x_pair(p, row, kx) : 0u;
                }
            }
            /* mma_compute: the B registers of each n8 tile */
            const uint32_t lo0 = mm::low_nibbles(words[mm::b_word(0, 0)], words[mm::b_word(0, 1)]);
            const uint32_t hi0 = mm::high_nibbles(words[mm::b_word(0, 0)], words[mm::b_word(0, 1)]);
            const uint32_t lo1 = mm::low_nibbles(words[mm::b_word(1, 0)], words[mm::b_word(1, 1)]);
            const uint32_t hi1 = mm::high_nibbles(words[mm::b_word(1, 0)], words[mm::b_word(1, 1)]);
            uint32_t mask0 = ~0u, mask1 = ~0u;
            if (tail_compute) {
                mask0 = mm::tail_mask(k0 + mm::word_row(i, mm::b_word(0, 0)) < K, k0 + mm::word_row(i, mm::b_word(0, 1)) < K);
                mask1 = mm::tail_mask(k0 + mm::word_row(i, mm::b_word(1, 0)) < K, k0 + mm::word_row(i, mm::b_word(1, 1)) < K);
            }
            for (int j = 0; j < 8; ++j) {
                const uint32_t b0 = b_register(p, lo0, hi0, j, gz[lane][j], gsc[lane][j], mask0);
                const uint32_t b1 = b_register(p, lo1, hi1, j, gz[lane][j], gsc[lane][j], mask1);
                for (int t = 0; t < c.rows; ++t) {
                    std::memcpy(w[t][j].a[lane], areg[t], sizeof areg[t]);
                    w[t][j].b[lane][0] = b0;
                    w[t][j].b[lane][1] = b1;
                }
            }
        }
        /* the B operand, as the ISA reads it, is W at the permuted rows of the step */
        for (int j = 0; j < 8; ++j) {
            double Am[16][16], Bm[16][8];
            isa_matrices(w[0][j], p.dt, Am, Bm);
            for (int kl = 0; kl < 16; ++kl)
                for (int n = 0; n < 8; ++n) {
                    const int k = k0 + physical_row(kl);
                    const int64_t col = 8 * (cb + n) + j;
                    if (k < K && col < p.N) {
                        CHECK(Bm[kl][n] == w_ref(p, k, (int)col), "B[%d][%d] of tile %d, step %d: %g, W = %g", kl,
                              n, j, s, Bm[kl][n], w_ref(p, k, (int)col));
                        ++st.checked_b;
                    } else if (k >= K) {
                        CHECK(Bm[kl][n] == 0, "B past K not zero: %g", Bm[kl][n]);
                    }
                    if (k < K && m0 + n < p.M) /* A, row n of the tile */
                        CHECK(Am[n][kl] == value(p.dt, p.x[(m0 + n) * p.K + k]), "A[%d][%d] step %d", n, kl, s);
                }
        }
        for (int t = 0; t < tiles; ++t)
            for (int j = 0; j < 8; ++j) {
                double d[32][4];
                for (int lane = 0; lane < 32; ++lane)
                    for (int e = 0; e < 4; ++e) d[lane][e] = A(lane, t, j, e);
                isa_mma(w[t][j], p.dt, d);
                for (int lane = 0; lane < 32; ++lane)
                    for (int e = 0; e < 4; ++e) A(lane, t, j, e) = d[lane][e];
                ++st.mmas;
            }
        ++st.steps;
    }
}

/* The whole launch: every column block, M tile, cluster rank and warp, then
 * the kernel's epilogue (direct stores, or partial tiles summed in warp order
 * and then in rank order). */
Output run_kernel(const Problem &p, const Config &c, Stats &st)
{
    Output out{std::vector<double>((size_t)p.M * p.N, NAN), std::vector<int>((size_t)p.M * p.N, 0)};
    const int W = p.W();
    const int nsteps = (p.K + 15) / 16;
    const int64_t colblocks = (W + 7) / 8;
    const int64_t mtiles = (p.M + 16 * c.rows - 1) / (16 * c.rows);
    const int mrows = std::min(16 * c.rows, p.M);
    const int nslices = c.split * c.S;
    for (int64_t cblock = 0; cblock < colblocks; ++cblock) {
        const int64_t cb = cblock * mm::kWarpWords;
        for (int64_t mt = 0; mt < mtiles; ++mt) {
            const int64_t m0 = mt * 16 * c.rows;
            const int tiles = (int)std::min<int64_t>(c.rows, (p.M - m0 + 15) / 16);
            const int mv = (int)std::min<int64_t>(16 * c.rows, p.M - m0);
            /* shared memory of each block: S partial tiles of mrows x 64 (NaN: never written) */
            std::vector<std::vector<double>> part(c.split, std::vector<double>((size_t)c.S * mrows * 64, NAN));
            for (int rank = 0; rank < c.split; ++rank) {
                for (int warp = 0; warp < c.S; ++warp) {
                    const int slice = rank * c.S + warp;
                    const int s_begin = (int)mm::slice_begin(nsteps, nslices, slice);
                    const int s_end = (int)mm::slice_begin(nsteps, nslices, slice + 1);
                    std::vector<double> acc((size_t)32 * c.rows * 8 * 4, 0.0);
                    if (s_begin < s_end) run_warp(p, c, cb, m0, s_begin, s_end, acc, st);
                    auto A = [&](int lane, int t, int j, int e) {
                        return acc[(((size_t)lane * c.rows + t) * 8 + j) * 4 + e];
                    };
                    for (int lane = 0; lane < 32; ++lane) {
                        const int g = mm::lane_group(lane), i = mm::lane_quad(lane);
                        for (int t = 0; t < tiles; ++t)
                            for (int h = 0; h < 2; ++h) {
                                const int r = 16 * t + mm::acc_row(g, 2 * h);
                                if (m0 + r >= p.M) continue;
                                for (int u = 0; u < 2; ++u) {
                                    if (c.S == 1 && c.split == 1) { /* straight from registers */
                                        double v[8];
                                        for (int j = 0; j < 8; ++j) v[j] = A(lane, t, j, 2 * h + u);
                                        const int64_t wc = cb + mm::acc_word(i, u);
                                        if (wc < W) store_word(p, out, m0 + r, wc, v);
                                        continue;
                                    }
                                    for (int v = 0; v < 2; ++v) {
                                        const int ch = 2 * mm::acc_word(i, u) + v;
                                        const int slot = mm::part_chunk(r, ch);
                                        for (int q = 0; q < 4; ++q)
                                            part[rank][((size_t)warp * mrows + r) * 64 + 4 * slot + q] =
                                                A(lane, t, 4 * v + q, 2 * h + u);
                                    }
                                }
                            }
                    }
                }
                if (c.S == 1 && c.split == 1) continue;
                /* the block's sum: warp 0, 1, ..., S-1 */
                for (int unit = 0; unit < mv * 8; ++unit) {
                    const int r = unit / 8, o = unit % 8;
                    double v[8];
                    for (int w = 0; w < c.S; ++w)
                        for (int h = 0; h < 2; ++h) {
                            const int slot = mm::part_chunk(r, 2 * o + h);
                            for (int q = 0; q < 4; ++q) {
                                const double x = part[rank][((size_t)w * mrows + r) * 64 + 4 * slot + q];
                                CHECK(!std::isnan(x), "partial (warp %d, row %d, chunk %d) never written", w, r, 2 * o + h);
                                v[4 * h + q] = w == 0 ? x : v[4 * h + q] + x;
                            }
                        }
                    if (c.split == 1) {
                        if (cb + o < W) store_word(p, out, m0 + r, cb + o, v);
                    } else {
                        for (int h = 0; h < 2; ++h)
                            for (int q = 0; q < 4; ++q)
                                part[rank][(size_t)r * 64 + 4 * mm::part_chunk(r, 2 * o + h) + q] = v[4 * h + q];
                    }
                }
            }
            if (c.split == 1) continue;
            /* the cluster's sum: rank 0, 1, ..., split-1, each rank finishing its share of the units */
            for (int rank = 0; rank < c.split; ++rank)
                for (int unit = rank; unit < mv * 8; unit += c.split) {
                    const int r = unit / 8, o = unit % 8;
                    if (cb + o >= W) continue;
                    double v[8] = {};
                    for (int q = 0; q < c.split; ++q)
                        for (int h = 0; h < 2; ++h)
                            for (int e = 0; e < 4; ++e)
                                v[4 * h + e] += part[q][(size_t)r * 64 + 4 * mm::part_chunk(r, 2 * o + h) + e];
                    store_word(p, out, m0 + r, cb + o, v);
                }
        }
    }
    return out;
}

/* One case: the emulated launch against x @ W (+ bias) computed directly. */
void run_case(std::mt19937 &rng, int M, int K, int N, int G, Dtype dt, bool bias, Config c)
{
    const int failures = g_failures;
    const long oob = g_oob;
    const Problem p = make_problem(rng, M, K, N, G, dt, bias);
    Stats st;
    const Output out = run_kernel(p, c, st);
    long mismatches = 0, unwritten = 0;
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            double y = bias ? value(dt, p.bias[n]) : 0.0;
            for (int k = 0; k < K; ++k) y += value(dt, p.x[(size_t)m * K + k]) * w_ref(p, k, n);
            const size_t at = (size_t)m * N + n;
            if (out.writes[at] != 1) {
                ++unwritten;
                CHECK(false, "y[%d][%d] written %d times", m, n, out.writes[at]);
            } else if (out.y[at] != y) {
                ++mismatches;
                CHECK(false, "y[%d][%d] = %.17g, expected %.17g", m, n, out.y[at], y);
            }
        }
    CHECK(g_oob == oob, "%ld reads or writes outside the arrays", g_oob - oob);
    std::printf("%-4s M=%-4d K=%-4d N=%-4d G=%-4d bias=%d S=%d split=%d rows=%d: %ld steps, %ld mma, %ld B "
                "elements checked, mismatches %ld, unwritten %ld, out-of-bounds %ld%s\n",
                dt == F16 ? "f16" : "bf16", M, K, N, G, (int)bias, c.S, c.split, c.rows, st.steps, st.mmas,
                st.checked_b, mismatches, unwritten, g_oob - oob, g_failures == failures ? "" : "  FAILED");
}

/* The partial-tile swizzle: a bijection of the 16 chunks of every row, and
 * the 8 accesses of each 16-byte phase (writers: lanes 8p .. 8p+7 with one
 * chunk each; readers: 8 consecutive word offsets of one row) on 8 distinct
 * groups of 4 banks. */
void check_swizzle()
{
    const int failures = g_failures;
    for (int r = 0; r < 64; ++r) {
        int seen[16] = {};
        for (int c = 0; c < 16; ++c) {
            const int slot = mm::part_chunk(r, c);
            CHECK(slot >= 0 && slot < 16, "slot %d", slot);
            if (slot >= 0 && slot < 16) seen[slot]++;
        }
        for (int c = 0; c < 16; ++c) CHECK(seen[c] == 1, "row %d: slot %d used %d times", r, c, seen[c]);
    }
    for (int t = 0; t < 4; ++t)
        for (int h = 0; h < 2; ++h)
            for (int q = 0; q < 4; ++q) /* the lane's q-th chunk: word offset 2i + q/2, half q%2 */
                for (int phase = 0; phase < 4; ++phase) {
                    int groups = 0;
                    for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane) {
                        const int g = mm::lane_group(lane), i = mm::lane_quad(lane);
                        const int r = 16 * t + mm::acc_row(g, 2 * h);
                        const int c = 2 * mm::acc_word(i, q / 2) + q % 2;
                        groups |= 1 << ((r * 16 + mm::part_chunk(r, c)) % 8);
                    }
                    CHECK(groups == 0xFF, "writers: tile %d half %d chunk %d phase %d share banks", t, h, q, phase);
                }
    for (int r = 0; r < 64; ++r)
        for (int h = 0; h < 2; ++h) {
            int groups = 0;
            for (int o = 0; o < 8; ++o) groups |= 1 << ((r * 16 + mm::part_chunk(r, 2 * o + h)) % 8);
            CHECK(groups == 0xFF, "readers: row %d half %d share banks", r, h);
        }
    std::printf("partial-tile swizzle: bijective, conflict-free%s\n", g_failures == failures ? "" : "  FAILED");
}

/* The split-K slices cover [0, n) in order, without gaps or overlaps. */
void check_slices()
{
    const int failures = g_failures;
    for (int64_t n = 0; n < 300; n += 7)
        for (int64_t parts = 1; parts <= 64; parts *= 2) {
            int64_t prev = 0;
            for (int64_t s = 0; s < parts; ++s) {
                const int64_t b = mm::slice_begin(n, parts, s), e = mm::slice_begin(n, parts, s + 1);
                CHECK(b == prev && e >= b && e - b <= n / parts + 1, "slices of %lld in %lld", (long long)n,
                      (long long)parts);
                prev = e;
            }
            CHECK(prev == n, "slices of %lld end at %lld", (long long)n, (long long)prev);
        }
    std::printf("split-K slices: contiguous, complete%s\n", g_failures == failures ? "" : "  FAILED");
}

} // namespace

int main()
{
    std::mt19937 rng(20240611);
    check_swizzle();
    check_slices();
    /*           M    K    N    G    dtype  bias  {S, split, rows} */
    run_case(rng, 1, 64, 64, 32, F16, false, {1, 1, 1});     /* one warp, direct stores, two groups */
    run_case(rng, 1, 64, 64, 32, BF16, true, {1, 1, 1});
    run_case(rng, 5, 128, 72, 128, F16, true, {2, 1, 1});    /* N tail: a block of 1 word column; M tail */
    run_case(rng, 16, 256, 128, 64, BF16, false, {4, 1, 1}); /* a full m16 tile, groups across slices */
    run_case(rng, 17, 200, 64, 200, F16, true, {1, 2, 2});   /* K tail (G = K = 200), a cluster of 2 */
    run_case(rng, 9, 40, 24, 40, BF16, true, {2, 4, 1});     /* K = 40: a 3-step tail, more slices than steps */
    run_case(rng, 33, 96, 136, 32, F16, false, {4, 2, 4});   /* 4 m16 tiles, 3 active; N = 136 */
    run_case(rng, 64, 256, 128, 16, BF16, true, {8, 8, 4});  /* G = 16: a group per step; empty slices */
    run_case(rng, 3, 48, 8, 48, F16, true, {2, 4, 1});       /* N = 8: one word column */
    run_case(rng, 130, 64, 80, 32, BF16, true, {1, 1, 4});   /* 3 M tiles, the last of 2 rows; direct stores */
    run_case(rng, 40, 32, 64, 32, F16, false, {2, 1, 2});    /* rows = 2, M tail inside the second tile */
    run_case(rng, 2, 208, 200, 208, BF16, false, {8, 2, 1}); /* G = K = 208 (13 steps), N = 200 */
    run_case(rng, 7, 202, 48, 202, F16, true, {2, 2, 1});    /* K % 4 == 2: the last x pair of a lane past K */
    std::printf("%s: %d failed check%s\n", g_failures ? "FAILED" : "OK", g_failures, g_failures == 1 ? "" : "s");
    return g_failures ? 1 : 0;
}
