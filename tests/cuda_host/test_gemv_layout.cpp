/*
 * The decode kernel's shared-memory stage (gemv_map in csrc/cuda/linear_layout.cuh),
 * checked on the host with the kernel's own offset functions, for one and two
 * n8 tiles of x:
 *
 *  - the lanes' 16-byte copies (two strip rows each, x for lanes < 16 NT) write
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
 * must show fewer conflicts than it.  One line per case; exit status 1 when a
 * placement or read check fails.
 */
#include <cstdio>
#include <cstring>
#include <set>
#include <vector>

#include "cuda/linear_layout.cuh"

using namespace awq_cu::gemv_map;

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
    for (int l = 0; l < 32; ++l) x_lanes[l] = l < 2 * kTileM * nt;

    auto put = [&](int off, int kind, int row, int byte) {
        if (off < 0 || off >= stage) {
            ++res.misplaced;
            return;
        }
        if (st[off].kind != 0) ++res.twice;
        st[off] = Tag{kind, row, byte};
    };
    /* the copies: the kernel writes 16 bytes from the chunk's first offset */
    std::vector<int> q_dst(32), x_dst(32);
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
        for (int b = 0; b < 16; ++b) {
            if (x_dst[l] + b != x_at(m, 16 * h + b)) ++res.misplaced;
            put(x_dst[l] + b, 2, m, 16 * h + b);
        }
    }
    for (const Tag &t : st) res.unwritten += t.kind == 0;
    res.bank_conflicts += conflicts(q_dst, 16, all);
    std::vector<int> q_dst8(32);
    for (int l = 0; l < 32; ++l) q_dst8[l] = q_dst[l] + kRowsBytes / 2;
    res.bank_conflicts += conflicts(q_dst8, 16, all);
    res.bank_conflicts += conflicts(x_dst, 16, x_lanes);

    /* the reads, at the offsets the kernel computes */
    std::vector<int> rd[4], rx[2 * 2];
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

} // namespace

int main(int argc, char **argv)
{
    g_flat = argc > 1 && std::strcmp(argv[1], "--flat") == 0;
    bool ok = true;
    for (int nt = 1; nt <= 2; ++nt) {
        const Result r = check(nt);
        std::printf("NT=%d layout=%s: misplaced %d, written twice %d, unwritten %d, misread %d, bank conflicts %d\n", nt,
                    g_flat ? "flat" : "gemv_map", r.misplaced, r.twice, r.unwritten, r.misread, r.bank_conflicts);
        ok = ok && r.misplaced == 0 && r.twice == 0 && r.unwritten == 0 && r.misread == 0;
    }
    return ok ? 0 : 1;
}
