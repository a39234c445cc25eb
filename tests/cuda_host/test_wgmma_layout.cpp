/*
 * The warpgroup kernel's shared-memory stage (csrc/cuda/linear_wgmma.cuh),
 * checked on the host with its own layout functions (wgmma_map in
 * csrc/cuda/linear_layout.cuh):
 *
 *  - qweight: the 128 threads' 16-byte copies (thread t: chunk t % 4 of rows
 *    t / 4 and t / 4 + 32) write every byte of the 64 x 64-byte tile once;
 *    every quarter-warp of copies and every half-warp of the lanes' 8-byte
 *    fragment loads (lane (g, i): words 2g, 2g + 1 of the rows 2i, 2i + 1,
 *    2i + 8, 2i + 9 of each k16 step) touches each bank at most once;
 *  - x: the copies of a block of H warpgroups (thread t of 128 H: chunk t % 8
 *    of rows t / 8 + 16 H j) write every byte of the NT x 128-byte tile once,
 *    each quarter-warp without a bank conflict, and each element (row n, k) lies where wgmma reads it through
 *    the kernel's descriptor: the start address moved 32 bytes a k16 step,
 *    8-row groups 1024 bytes apart, rows 128 bytes apart inside a group, and
 *    the 128-byte swizzle (address bits 4..6 XOR-ed with bits 7..9, PTX ISA,
 *    shared-memory matrix layout).
 *
 * One line per check; exit status 1 when one fails.
 */
#include <cstdio>
#include <set>
#include <vector>

#include "cuda/linear_layout.cuh"

using namespace awq_cu::wgmma_map;
namespace gm = awq_cu::gemv_map;

namespace {

int g_failed = 0;

void report(const char *what, long bad)
{
    std::printf("%s: %ld bad\n", what, bad);
    if (bad != 0) {
        std::printf("FAILED: %s\n", what);
        ++g_failed;
    }
}

/* The largest number of different 4-byte words of one phase in one bank. */
int ways(const std::vector<int> &starts, int bytes)
{
    std::vector<std::set<int>> bank(32);
    for (int s : starts)
        for (int b = 0; b < bytes; b += 4) bank[((s + b) / 4) % 32].insert((s + b) / 4);
    size_t w = 0;
    for (const auto &b : bank) w = std::max(w, b.size());
    return (int)w;
}

/* Every byte of [0, size) written exactly once by the 16-byte chunks at starts. */
long placement(const std::vector<int> &starts, int size)
{
    std::vector<int> hits(size, 0);
    long bad = 0;
    for (int s : starts) {
        if (s < 0 || s + 16 > size) {
            ++bad;
            continue;
        }
        for (int b = 0; b < 16; ++b) ++hits[s + b];
    }
    for (int h : hits) bad += h != 1;
    return bad;
}

void check_qweight()
{
    constexpr int kThreads = 128, kBytes = kStageK * kBlockWords * 4;
    std::vector<int> all;
    long conflicts = 0;
    for (int t0 = 0; t0 < kThreads; t0 += 8) { /* quarter-warps of copies */
        for (int half = 0; half < 2; ++half) {
            std::vector<int> phase;
            for (int t = t0; t < t0 + 8; ++t) phase.push_back(w_chunk(t / 4 + 32 * half, t % 4));
            conflicts += ways(phase, 16) - 1;
            all.insert(all.end(), phase.begin(), phase.end());
        }
    }
    report("qweight copies place every byte once", placement(all, kBytes));
    report("qweight copies: extra wavefronts", conflicts);

    long misread = 0, read_conflicts = 0;
    for (int kk = 0; kk < kStageK / 16; ++kk)
        for (int r = 0; r < 4; ++r)
            for (int half = 0; half < 2; ++half) {
                std::vector<int> phase;
                for (int lane = 16 * half; lane < 16 * half + 16; ++lane) {
                    const int g = lane >> 2, i = lane & 3, cw = 2 * g;
                    const int row = 16 * kk + gm::frag_row(i, r);
                    const int at = w_chunk(row, cw >> 2) + 4 * (cw & 3);
                    phase.push_back(at);
                    /* one 8-byte load holds word cw + 1 right after word cw */
                    misread += at + 4 != w_chunk(row, (cw + 1) / 4) + 4 * ((cw + 1) % 4);
                }
                read_conflicts += ways(phase, 8) - 1;
            }
    report("qweight fragment loads hold words cw, cw + 1", misread);
    report("qweight fragment loads: extra wavefronts", read_conflicts);
}

/* Where wgmma reads element (n, k) of a k16 step kk through the kernel's
 * descriptor (x_desc in linear_wgmma.cuh): start = stage + 32 kk, 8-row
 * groups 1024 bytes apart, then the 128-byte swizzle of the address. */
int descriptor_byte(int n, int k, int kk)
{
    const int linear = 32 * kk + (n / 8) * 1024 + (n % 8) * 128 + 2 * k;
    return linear ^ (((linear >> 7) & 7) << 4);
}

void check_x_copies(int nt, int h)
{
    char what[96];
    std::vector<int> all;
    long conflicts = 0;
    for (int t0 = 0; t0 < 128 * h; t0 += 8)
        for (int j = 0; j < nt / (16 * h); ++j) {
            std::vector<int> phase;
            for (int t = t0; t < t0 + 8; ++t) phase.push_back(x_chunk(t / 8 + 16 * h * j, t % 8));
            conflicts += ways(phase, 16) - 1;
            all.insert(all.end(), phase.begin(), phase.end());
        }
    std::snprintf(what, sizeof what, "NT=%d H=%d x copies place every byte once", nt, h);
    report(what, placement(all, nt * kXRowBytes));
    std::snprintf(what, sizeof what, "NT=%d H=%d x copies: extra wavefronts", nt, h);
    report(what, conflicts);
}

void check_x(int nt)
{
    char what[96];
    for (int h = 1; h <= 2; ++h) check_x_copies(nt, h);

    long wrong = 0;
    for (int kk = 0; kk < kStageK / 16; ++kk)
        for (int n = 0; n < nt; ++n)
            for (int k = 0; k < 16; ++k) {
                const int kc = 16 * kk + k; /* k inside the stage */
                wrong += descriptor_byte(n, k, kk) != x_chunk(n, kc / 8) + 2 * (kc % 8);
            }
    std::snprintf(what, sizeof what, "NT=%d x elements where the descriptor reads them", nt);
    report(what, wrong);
}

} // namespace

int main()
{
    check_qweight();
    for (int nt : {32, 64, 128}) check_x(nt);
    std::printf(g_failed ? "FAILED: %d checks\n" : "OK\n", g_failed);
    return g_failed ? 1 : 0;
}
