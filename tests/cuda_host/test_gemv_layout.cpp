/*
 * The decode kernel (csrc/cuda/linear_gemv.cuh), checked on the host with its
 * own layout functions (gemv_map in csrc/cuda/linear_layout.cuh).
 *
 * 1. Its shared-memory stage, for one, two and four n8 tiles of x:
 *
 *  - the lanes' 16-byte copies (two strip rows each, x for lanes < x_copy_lanes(NT), two pieces a lane for NT = 4) write
 *    every byte of the stage exactly once, each byte where the layout puts it;
 *  - every lane's fragment loads (four 8-byte pieces of qweight rows, two
 *    4-byte B registers per tile of x) read exactly the bytes of its fragment
 *    (PTX ISA: A rows k = 2i, 2i+1, 2i+8, 2i+9 at the lane's two words; B
 *    elements k = 2i, 2i+1 and 2i+8, 2i+9 of x row 8t + g);
 *  - the bank conflicts of every copy and load, counted: 32 banks of 4
 *    bytes; an 8-byte load is served by half-warps, a 16-byte access by
 *    quarter-warps, a 4-byte one by the warp; a phase has one extra wavefront
 *    for each further 4-byte word in its busiest bank.
 *
 * With --flat the same checks run on the plain layout (strip row r at 64 r,
 * read at its own offsets): the placement checks still hold, and the row slots
 * must show fewer conflicts than it.
 *
 * 2. Its warps, lane by lane: the fragment words each lane takes, the byte
 * permute and nibble masks that pair rows k and k + 1, the zero and scale of
 * each nibble, the A registers, the B registers of each tile, the K slices,
 * and where each accumulator goes -- through the emulation of mma.m16n8k16
 * in isa_mma.h (PTX ISA tables).  Every value is exact in double, so y must
 * equal x @ W from the AWQ contract exactly (skipped with --flat).
 *
 * One line per case; exit status 1 when a placement, read or emulation check
 * fails.
 */
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "cuda/linear_layout.cuh"
#include "isa_mma.h"

using namespace awq_cu::gemv_map;
namespace mm = awq_cu::mma_map;

namespace {

bool g_flat = false;

int q_at(int r, int b) { return g_flat ? r * kRowBytes + b : row_byte(r, b); }
int x_at(int m, int b) { return g_flat ? kRowsBytes + 32 * m + b : x_byte(m, b); }

struct Tag {
    int kind = 0; /* 0 unwritten, 1 qweight, 2 x */
    int row = 0;  /* strip row, or x row */
    int byte = 0; /* byte of that row */
};

/* The largest number of different 4-byte words of one phase in one bank. */
int ways(const std::vector<int> &starts, int bytes)
{
    std::set<int> words[32];
    for (int a : starts)
        for (int w = a / 4; w < (a + bytes) / 4; ++w) words[w % 32].insert(w);
    size_t most = 0;
    for (const auto &s : words) most = s.size() > most ? s.size() : most;
    return (int)most;
}

/* Conflicts (ways - 1 summed over phases) of one access by every lane. */
int conflicts(const std::vector<int> &lane_addr, int bytes, const std::vector<bool> &active)
{
    const int phase = bytes == 16 ? 8 : bytes == 8 ? 16 : 32;
    int extra = 0;
    for (int p0 = 0; p0 < 32; p0 += phase) {
        std::vector<int> starts;
        for (int l = p0; l < p0 + phase; ++l)
            if (active[l]) starts.push_back(lane_addr[l]);
        if (!starts.empty()) extra += ways(starts, bytes) - 1;
    }
    return extra;
}

struct Result {
    int misplaced = 0, twice = 0, unwritten = 0, misread = 0, bank_conflicts = 0;
};

Result check(int nt)
{
    Result res;
    const int stage = kRowsBytes + nt * kXTileBytes;
    std::vector<Tag> st(stage);
    const std::vector<bool> all(32, true);
    std::vector<bool> x_lanes(32);
    for (int l = 0; l < 32; ++l) x_lanes[l] = l < x_copy_lanes(nt);

    auto put = [&](int off, int kind, int row, int byte) {
        if (off < 0 || off >= stage) {
            ++res.misplaced;
            return;
        }
        if (st[off].kind != 0) ++res.twice;
        st[off] = Tag{kind, row, byte};
    };
    /* the copies: the kernel writes 16 bytes from the chunk's first offset */
    std::vector<int> q_dst(32), x_dst(32), x_dst2(32);
    for (int l = 0; l < 32; ++l) {
        const int r0 = copy_row(l), c = copy_chunk(l);
        q_dst[l] = q_at(r0, 16 * c);
        for (int half = 0; half < 2; ++half)
            for (int b = 0; b < 16; ++b) {
                const int off = q_dst[l] + half * (kRowsBytes / 2) + b;
                if (off != q_at(r0 + 8 * half, 16 * c + b)) ++res.misplaced;
                put(off, 1, r0 + 8 * half, 16 * c + b);
            }
        if (!x_lanes[l]) continue;
        const int m = x_copy_row(l) & (nt * kTileM - 1), h = x_copy_half(l);
        x_dst[l] = x_at(m, 16 * h);
        x_dst2[l] = x_dst[l] + kXPieceRows * kXRowBytes; /* the kernel's second piece, NT = 4 */
        for (int piece = 0; piece < x_pieces(nt); ++piece) {
            const int dst = piece ? x_dst2[l] : x_dst[l], row = m + kXPieceRows * piece;
            for (int b = 0; b < 16; ++b) {
                if (dst + b != x_at(row, 16 * h + b)) ++res.misplaced;
                put(dst + b, 2, row, 16 * h + b);
            }
        }
    }
    for (const Tag &t : st) res.unwritten += t.kind == 0;
    res.bank_conflicts += conflicts(q_dst, 16, all);
    std::vector<int> q_dst8(32);
    for (int l = 0; l < 32; ++l) q_dst8[l] = q_dst[l] + kRowsBytes / 2;
    res.bank_conflicts += conflicts(q_dst8, 16, all);
    res.bank_conflicts += conflicts(x_dst, 16, x_lanes);
    if (x_pieces(nt) == 2) res.bank_conflicts += conflicts(x_dst2, 16, x_lanes);

    /* the reads, at the offsets the kernel computes */
    std::vector<int> rd[4], rx[2 * 4];
    for (auto &v : rd) v.resize(32);
    for (auto &v : rx) v.resize(32);
    for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, i = l & 3;
        const int r0 = q_at(frag_row(i, 0), 8 * g), r1 = q_at(frag_row(i, 1), 8 * g);
        const int at[4] = {r0, r1, r0 + kRowsBytes / 2, r1 + kRowsBytes / 2};
        const int want_row[4] = {2 * i, 2 * i + 1, 2 * i + 8, 2 * i + 9}; /* the ISA's A fragment */
        for (int r = 0; r < 4; ++r) {
            rd[r][l] = at[r];
            for (int b = 0; b < 8; ++b) {
                const Tag &t = st[at[r] + b];
                if (t.kind != 1 || t.row != want_row[r] || t.byte != 8 * g + b) ++res.misread;
            }
        }
        const int x0 = x_at(g, 4 * i);
        for (int t = 0; t < nt; ++t)
            for (int h = 0; h < 2; ++h) {
                /* the kernel's offsets; the flat layout's own ones */
                const int off = g_flat ? x_at(t * kTileM + g, 16 * h + 4 * i) : x0 + t * kXTileBytes + h * kXHalfBytes;
                rx[2 * t + h][l] = off;
                for (int b = 0; b < 4; ++b) {
                    const Tag &tag = st[off + b];
                    if (tag.kind != 2 || tag.row != t * kTileM + g || tag.byte != 16 * h + 4 * i + b) ++res.misread;
                }
            }
    }
    for (auto &v : rd) res.bank_conflicts += conflicts(v, 8, all);
    for (int k = 0; k < 2 * nt; ++k) res.bank_conflicts += conflicts(rx[k], 4, all);
    return res;
}


/* ---- the warps, emulated --------------------------------------------------- */

struct Problem {
    int M, K, N, G;
    isa::Dtype dt;
    int W; /* word columns */
    std::vector<uint32_t> qw, qz;
    std::vector<uint16_t> sc, x;
};

int nibble_of(uint32_t word, int p) { return (int)((word >> (4 * p)) & 0xF); }

/* W[k][n] straight from the contract: (q - z) * s, q and z at nibble AWQ_NIBBLE(n % 8). */
double w_ref(const Problem &p, int k, int n)
{
    const int j = AWQ_NIBBLE(n % 8), grp = k / p.G;
    const int q = nibble_of(p.qw[(size_t)k * p.W + n / 8], j), z = nibble_of(p.qz[(size_t)grp * p.W + n / 8], j);
    return (q - z) * isa::value(p.dt, p.sc[(size_t)grp * p.N + n]);
}

Problem make_problem(std::mt19937 &rng, int M, int K, int N, int G, isa::Dtype dt)
{
    Problem p{M, K, N, G, dt, N / 8, {}, {}, {}, {}};
    std::uniform_int_distribution<uint32_t> word;
    std::uniform_int_distribution<int> small(-3, 3), expo(-3, 1);
    p.qw.resize((size_t)K * p.W);
    p.qz.resize((size_t)(K / G) * p.W);
    for (auto &w : p.qw) w = word(rng);
    for (auto &w : p.qz) w = word(rng);
    p.sc.resize((size_t)(K / G) * N);
    for (auto &v : p.sc) v = isa::bits_of(dt, std::ldexp(1.0, expo(rng))); /* powers of two: exact products */
    p.x.resize((size_t)M * K);
    for (auto &v : p.x) v = isa::bits_of(dt, small(rng));
    return p;
}

uint32_t pair_bits(isa::Dtype dt, double lo, double hi)
{
    return (uint32_t)isa::bits_of(dt, lo) | ((uint32_t)isa::bits_of(dt, hi) << 16);
}

/* The launch: every strip, cluster rank and warp (K slice), y accumulated in
 * double; touched counts the slices that wrote each output. */
void emulate(const Problem &p, int warps, int split, std::vector<double> &y, std::vector<int> &touched)
{
    const int nt = p.M > 2 * kTileM ? 4 : p.M > kTileM ? 2 : 1, nsteps = p.K / kStepK, spg = p.G / kStepK;
    const int strips = (p.W + 15) / 16, nslices = warps * split;
    for (int strip = 0; strip < strips; ++strip) {
        const int w0 = 16 * strip;
        for (int slice = 0; slice < nslices; ++slice) {
            const int s_begin = (int)mm::slice_begin(nsteps, nslices, slice);
            const int s_end = (int)mm::slice_begin(nsteps, nslices, slice + 1);
            static double acc[32][4][2][4][4]; /* lane, tile, word, byte, accumulator */
            std::memset(acc, 0, sizeof acc);
            for (int s = s_begin; s < s_end; ++s) {
                const int k0 = kStepK * s, grp = s / spg;
                for (int v = 0; v < 2; ++v)
                    for (int b = 0; b < 4; ++b)
                        for (int t = 0; t < nt; ++t) {
                            isa::Warp wp;
                            for (int lane = 0; lane < 32; ++lane) {
                                const int g = lane >> 2, i = lane & 3;
                                const int cw = std::min(w0 + 2 * g, p.W - 2) + v; /* the kernel's clamp */
                                const uint32_t zword = p.qz[(size_t)grp * p.W + cw];
                                for (int pr = 0; pr < 2; ++pr) {
                                    const int k = k0 + frag_row(i, 2 * pr);
                                    const uint32_t lo = p.qw[(size_t)k * p.W + cw];
                                    const uint32_t hi = p.qw[(size_t)(k0 + frag_row(i, 2 * pr + 1)) * p.W + cw];
                                    const uint32_t r = mm::byte_perm(lo, hi, pair_select(b));
                                    for (int odd = 0; odd < 2; ++odd) {
                                        const uint32_t q = odd ? (r & kOddNibbles) >> 4 : r & kEvenNibbles;
                                        const int nib = 2 * b + odd;
                                        const int z = (int)(mm::zero_pair(zword, nib) & 0xF);
                                        const double sv = isa::value(
                                            p.dt, p.sc[(size_t)grp * p.N + 8 * cw + nibble_col(nib)]);
                                        wp.a[lane][a_reg(pr, odd)] =
                                            pair_bits(p.dt, ((int)(q & 0xF) - z) * sv, ((int)(q >> 16) - z) * sv);
                                    }
                                }
                                const int m = kTileM * t + g;
                                for (int h = 0; h < 2; ++h) {
                                    const int k = k0 + 2 * i + 8 * h;
                                    wp.b[lane][h] = m < p.M ? (uint32_t)p.x[(size_t)m * p.K + k] |
                                                                  ((uint32_t)p.x[(size_t)m * p.K + k + 1] << 16)
                                                            : 0u;
                                }
                            }
                            double d[32][4] = {};
                            isa::isa_mma(wp, p.dt, d);
                            for (int lane = 0; lane < 32; ++lane)
                                for (int e = 0; e < 4; ++e) acc[lane][t][v][b][e] += d[lane][e];
                        }
            }
            for (int lane = 0; lane < 32; ++lane) {
                const int g = lane >> 2, i = lane & 3;
                for (int t = 0; t < nt; ++t)
                    for (int v = 0; v < 2; ++v)
                        for (int b = 0; b < 4; ++b)
                            for (int e = 0; e < 4; ++e) {
                                const int m = acc_x_row(t, i, e), wc = w0 + 2 * g + v;
                                if (m >= p.M || wc >= p.W) continue; /* never stored */
                                const size_t o = (size_t)m * p.N + 8 * wc + nibble_col(acc_nibble(b, e));
                                y[o] += acc[lane][t][v][b][e];
                                touched[o]++;
                            }
            }
        }
    }
}

bool emulation_case(std::mt19937 &rng, int M, int K, int N, int G, isa::Dtype dt, int warps, int split)
{
    const Problem p = make_problem(rng, M, K, N, G, dt);
    std::vector<double> y((size_t)M * N, 0.0);
    std::vector<int> touched((size_t)M * N, 0);
    emulate(p, warps, split, y, touched);
    const int nslices = warps * split;
    int mismatches = 0, wrong_count = 0;
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            double want = 0;
            for (int k = 0; k < K; ++k) want += isa::value(dt, p.x[(size_t)m * K + k]) * w_ref(p, k, n);
            mismatches += y[(size_t)m * N + n] != want;
            /* one partial sum a slice, an empty slice's zeros included, as the kernel adds them */
            wrong_count += touched[(size_t)m * N + n] != nslices;
        }
    const bool ok = mismatches == 0 && wrong_count == 0 && isa::g_failures == 0;
    std::printf("emulation %s M=%-2d K=%-3d N=%-4d G=%-3d warps=%d split=%d: mismatches %d, wrong slice counts %d%s\n",
                dt == isa::F16 ? "f16 " : "bf16", M, K, N, G, warps, split, mismatches, wrong_count,
                ok ? "" : "  FAILED");
    return ok;
}

} // namespace

int main(int argc, char **argv)
{
    g_flat = argc > 1 && std::strcmp(argv[1], "--flat") == 0;
    bool ok = true;
    for (int nt = 1; nt <= 4; nt *= 2) {
        const Result r = check(nt);
        std::printf("NT=%d layout=%s: misplaced %d, written twice %d, unwritten %d, misread %d, bank conflicts %d\n", nt,
                    g_flat ? "flat" : "gemv_map", r.misplaced, r.twice, r.unwritten, r.misread, r.bank_conflicts);
        ok = ok && r.misplaced == 0 && r.twice == 0 && r.unwritten == 0 && r.misread == 0;
    }
    if (!g_flat) {
        std::mt19937 rng(7);
        /* M, K, N, G, dtype, warps, cluster blocks: one, two and four tiles, M tails,
         * strip tails (N = 288: 2 strips and 4 words; 96: less than one strip),
         * G = 16 (a group every step), G = K, more slices than steps */
        struct {
            int M, K, N, G;
            isa::Dtype dt;
            int warps, split;
        } cases[] = {{1, 64, 256, 32, isa::F16, 1, 1},   {3, 96, 288, 16, isa::BF16, 2, 2},
                     {8, 128, 96, 128, isa::F16, 4, 1},  {9, 64, 256, 64, isa::F16, 2, 1},
                     {16, 128, 288, 32, isa::BF16, 8, 2}, {12, 96, 544, 48, isa::F16, 4, 4},
                     {5, 32, 128, 16, isa::BF16, 8, 1},   {32, 64, 256, 32, isa::F16, 2, 2},
                     {17, 96, 288, 48, isa::BF16, 4, 1},  {27, 128, 544, 16, isa::F16, 8, 2}};
        for (const auto &c : cases) ok = emulation_case(rng, c.M, c.K, c.N, c.G, c.dt, c.warps, c.split) && ok;
    }
    std::printf("%s\n", ok ? "OK" : "FAILED");
    return ok ? 0 : 1;
}
