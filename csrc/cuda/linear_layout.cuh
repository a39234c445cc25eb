/*
 * cuda/linear_layout.cuh -- how the fused tensor-core linear (cuda/linear.cu)
 * maps AWQ's packed words, x and its accumulators onto the operands of
 * mma.m16n8k16, as plain index and bit functions.
 *
 * Everything here compiles for the device and for the host (no CUDA types),
 * so that tests/cuda_host/test_mma_layout.cpp can run these very functions
 * against an emulation of the instruction written from the PTX ISA.
 *
 * ---- the mapping (no repacking of qweight) ----------------------------------
 *
 * A warp owns 64 output columns: the 8 word columns cb .. cb+7 of qweight, and
 * 8 n8 tiles j = 0..7.  Column "g" of n8 tile j is output column 8(cb+g) + j,
 * i.e. nibble AWQ_NIBBLE(j) of word column cb + g.  Lane t has groupID
 * g = t / 4 and threadID_in_group i = t % 4.
 *
 *              word column cb+0    cb+1   ...   cb+7        (one per lane group g)
 *   nibble  0 -> tile 0: col 8cb+0   8cb+8  ...  8cb+56
 *   nibble  4 -> tile 1: col 8cb+1   8cb+9  ...  8cb+57
 *   nibble  1 -> tile 2: col 8cb+2   ...
 *     ...          ...
 *   nibble  7 -> tile 7: col 8cb+7   8cb+15 ...  8cb+63
 *
 * Inside a k16 step the order of k is permuted (any permutation shared by A
 * and B leaves the product unchanged):
 *
 *   logical k (ISA):   2i  2i+1  2i+8  2i+9
 *   physical row:      4i  4i+1  4i+2  4i+3    (row k0 + 4i + r is word r of the lane)
 *
 * so a lane reads the 4 consecutive rows 4i..4i+3 of its word column (B) and
 * the 4 consecutive elements x[m][k0+4i .. k0+4i+3] of each of its rows (A):
 * B register 0 = rows (4i, 4i+1), register 1 = (4i+2, 4i+3); A registers
 * {0, 2} come from row g, {1, 3} from row g+8, elements (4i, 4i+1) in
 * {0, 1} and (4i+2, 4i+3) in {2, 3} -- each register one 4-byte load.
 *
 * Accumulator e of tile j (ISA: row g + 8(e/2), column 2i + e%2 of the tile)
 * is output row g + 8(e/2), column 8(cb + 2i + e%2) + j: each lane ends with
 * the 16 consecutive columns 8(cb+2i) .. 8(cb+2i)+15 of two rows.
 */
#ifndef AWQ_CUDA_LINEAR_LAYOUT_CUH
#define AWQ_CUDA_LINEAR_LAYOUT_CUH

#include <stdint.h>

#include "awq.h"

#if defined(__CUDACC__)
#define AWQ_HD __host__ __device__ __forceinline__
#else
#define AWQ_HD inline
#endif

namespace awq_cu {
namespace mma_map {

constexpr int kLanes = 32;
constexpr int kStepK = 16;    /* k of one mma.m16n8k16 */
constexpr int kTileM = 16;    /* rows of one m16 tile */
constexpr int kWarpWords = 8; /* word columns of a warp: one per lane group g */
constexpr int kTiles = 8;     /* n8 tiles of a warp: one per nibble of a word */
constexpr int kWarpCols = kWarpWords * AWQ_COLS_PER_WORD; /* 64 output columns */
constexpr int kWordsPerLane = 4; /* rows of its word column a lane reads per k16 step */
static_assert(kWordsPerLane * 4 == kStepK, "the 4 lanes of a group cover the k16 step");
static_assert(kTiles == AWQ_COLS_PER_WORD, "one n8 tile per nibble");

/* groupID and threadID_in_group of a lane (PTX ISA names). */
AWQ_HD int lane_group(int lane) { return lane >> 2; }
AWQ_HD int lane_quad(int lane) { return lane & 3; }

/* Physical row, inside the k16 step, of the r-th word a lane with threadID_in_group i reads. */
AWQ_HD int word_row(int i, int r) { return 4 * i + r; }

/* Word column, inside the warp's 8, a lane reads: its groupID. */
AWQ_HD int word_col(int g) { return g; }

/* First of the 4 consecutive elements of an x row a lane loads for its A fragment. */
AWQ_HD int x_col(int i) { return 4 * i; }

/* ---- B: nibble pairs ----------------------------------------------------
 * The words of rows 4i and 4i+1 give B register 0, those of 4i+2 and 4i+3
 * register 1: b_word(reg, h) is the word (0..3) in half h of register reg. */
AWQ_HD int b_word(int reg, int h) { return 2 * reg + h; }

/* __byte_perm selectors: {bytes 0,1 of x ; bytes 0,1 of y} and {bytes 2,3 of x ; bytes 2,3 of y}. */
constexpr uint32_t kPermLowNibbles = 0x5410u;  /* nibbles 0..3 of both words */
constexpr uint32_t kPermHighNibbles = 0x7632u; /* nibbles 4..7 of both words */

/* Why: PRMT on the device; the same selection, byte by byte, on the host. */
AWQ_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s)
{
#if defined(__CUDA_ARCH__)
    return __byte_perm(x, y, s);
#else
    const uint64_t v = ((uint64_t)y << 32) | x;
    uint32_t r = 0;
    for (int b = 0; b < 4; ++b) r |= (uint32_t)((v >> (8 * ((s >> (4 * b)) & 7u))) & 0xFFu) << (8 * b);
    return r;
#endif
}

/* Why: nibbles 0..3 of word lo in the low half and of word hi in the high
 * half, so that one shift and mask yields a pair for nibbles 0..3. */
AWQ_HD uint32_t low_nibbles(uint32_t lo, uint32_t hi) { return byte_perm(lo, hi, kPermLowNibbles); }
/* Why: the same for nibbles 4..7. */
AWQ_HD uint32_t high_nibbles(uint32_t lo, uint32_t hi) { return byte_perm(lo, hi, kPermHighNibbles); }

/* (word >> 4p) & kPairMask after the permutation: nibble p of word lo in bits 0..3, of word hi in 16..19. */
constexpr uint32_t kNibblePairMask = 0x000F000Fu;

/* Why: the B element pair of nibble p: q of the low row in the low half, of the high row in the high half. */
AWQ_HD uint32_t nibble_pair(uint32_t low, uint32_t high, int p)
{
    return ((p < 4 ? low : high) >> (4 * (p & 3))) & kNibblePairMask;
}

/* Why: the zero of nibble p, the same in both halves (both rows share the group). */
AWQ_HD uint32_t zero_pair(uint32_t zword, int p) { return ((zword >> (4 * p)) & 0xFu) * 0x00010001u; }

/* Why: scale j of 8 stored 16-bit scales (4 words, column 2p in the low half
 * of word p), duplicated into both halves (both rows share the column). */
AWQ_HD uint32_t scale_pair(uint32_t word, int j) { return byte_perm(word, 0u, (j & 1) ? 0x3232u : 0x1010u); }

/* OR-ed into a nibble pair, each half becomes the exact value base + q:
 * float16 1024 (0x6400, spacing 1 in [1024, 2048)) and bfloat16 128
 * (0x4300, spacing 1 in [128, 256)).  (base + q) - (base + z) is then the
 * exact integer q - z, +0 when q == z. */
constexpr uint32_t kF16PairMagic = 0x64006400u;
constexpr uint32_t kBF16PairMagic = 0x43004300u;

/* Why: rows past K in the last k16 step weigh 0 (not (0 - z) * s: 0 * Inf would be NaN). */
AWQ_HD uint32_t tail_mask(bool lo_row_valid, bool hi_row_valid)
{
    return (lo_row_valid ? 0x0000FFFFu : 0u) | (hi_row_valid ? 0xFFFF0000u : 0u);
}

/* ---- A ------------------------------------------------------------------
 * A register reg holds two consecutive elements of x: row g + 8 a_row_half(reg),
 * elements x_col(i) + a_pair_col(reg) and the next one (the first in the low half). */
AWQ_HD int a_row_half(int reg) { return reg & 1; }      /* 0: row g, 1: row g+8 */
AWQ_HD int a_pair_col(int reg) { return 2 * (reg >> 1); } /* 0: elements 4i, 4i+1; 2: 4i+2, 4i+3 */

/* ---- accumulators ---------------------------------------------------------
 * Accumulator e of any n8 tile: row offset inside the m16 tile, and the word
 * offset (inside the warp's 8) of its output column; the tile j gives the
 * column inside the word. */
AWQ_HD int acc_row(int g, int e) { return g + 8 * (e >> 1); }
AWQ_HD int acc_word(int i, int e) { return 2 * i + (e & 1); }
AWQ_HD int acc_col(int i, int e, int j) { return AWQ_COLS_PER_WORD * acc_word(i, e) + j; }

/* ---- partial sums in shared memory -----------------------------------------
 * A warp's partial tile is [rows][64] floats, stored in 16-byte chunks of 4
 * columns (chunk c = columns 4c .. 4c+3).  Writers are the lanes (g, i), each
 * with the chunks 4i .. 4i+3 of rows g and g+8; readers take one word offset
 * o (chunks 2o, 2o+1) of one row each.  Chunk c of row r lives at chunk
 * slot part_chunk(r, c): the XOR with c/8 separates lanes i and i+2, the XOR
 * with 2(r % 2) separates rows g and g+1, so that the 8 lanes of each
 * 16-byte phase hit 8 different groups of 4 banks, writing and reading. */
AWQ_HD int part_chunk(int row, int c) { return c ^ (c >> 3) ^ ((row & 1) << 1); }

/* ---- groups along K ------------------------------------------------------------
 * With spg k16 steps per group (G / 16; all steps when the one group is K),
 * step s lies in group s / spg, which starts at step group_start(s / spg). */
AWQ_HD int group_of_step(int s, int spg) { return s / spg; }
AWQ_HD int group_start(int group, int spg) { return group * spg; }

/* ---- split-K ----------------------------------------------------------------
 * Slice s of `parts` covers steps [slice_begin(n, parts, s), slice_begin(n, parts, s + 1)):
 * contiguous, in order, sizes differing by at most one. */
AWQ_HD int64_t slice_begin(int64_t n, int64_t parts, int64_t s) { return s * n / parts; }

} // namespace mma_map

/* ---- the decode kernel's shared-memory stage (cuda/linear_gemv.cuh) -----------
 * A stage holds one k16 step of a warp's strip of 16 word columns: 16 rows of
 * 64 bytes, then x (16 k of 8 NT rows, 32 bytes a row).  Lanes copy 16-byte
 * chunks and read 8-byte (qweight) and 4-byte (x) pieces, each lane those of
 * its fragments:
 *
 * - k16 row r sits in row slot r ^ ((r >> 1) & 1), so that the four rows
 *   2i + d (i = 0..3) of one fragment load alternate between the two 64-byte
 *   halves of the 128 bytes of banks.
 * - x: row m at kRowsBytes + 32 m, element k at 2 k.
 * - copies: lane l copies chunk l % 4 (16 bytes) of rows l / 4 and l / 4 + 8;
 *   lanes l < 16 NT (all 32 for NT = 4) copy k half l % 2 of x row l / 2 and,
 *   for NT = 4, of row l / 2 + 16.
 *
 * Banks (32 of 4 bytes; an 8-byte load served by half-warps, a 16-byte access
 * by quarter-warps): this layout leaves two-way conflicts in the half-warps of
 * the fragment loads, the B register loads and the x copies, which
 * tests/cuda_host/test_gemv_layout.cpp counts. */
namespace gemv_map {

using mma_map::kStepK;
constexpr int kTileM = 8;                     /* rows of x of one n8 tile */
constexpr int kRowBytes = 64;                 /* a strip row: 16 words */
constexpr int kRowsBytes = kStepK * kRowBytes; /* 1024 */
constexpr int kXRowBytes = kStepK * 2;        /* 16 k of a row of x */
constexpr int kXHalfBytes = 16;               /* from k 0..7 to k 8..15 of a row of x */
constexpr int kXTileBytes = kTileM * kXRowBytes; /* an n8 tile of x */

AWQ_HD int row_slot(int r) { return r ^ ((r >> 1) & 1); }

/* Offset in a stage of byte b (0..63) of k16 row r of the strip; row r + 8
 * (r < 8) is kRowsBytes / 2 further. */
AWQ_HD int row_byte(int r, int b) { return row_slot(r) * kRowBytes + b; }

/* Offset in a stage of byte b (0..31: element b / 2) of row m of x; the
 * second k half is kXHalfBytes further, tile t + 1 kXTileBytes. */
AWQ_HD int x_byte(int m, int b) { return kRowsBytes + kXRowBytes * m + b; }

/* A lane's copies: rows copy_row(l) and copy_row(l) + 8, bytes 16 copy_chunk(l) .. + 15. */
AWQ_HD int copy_row(int lane) { return lane >> 2; }
AWQ_HD int copy_chunk(int lane) { return lane & 3; }
/* Lanes below x_copy_lanes(nt) copy x: bytes 16 x_copy_half(l) .. + 15 of row
 * x_copy_row(l) and, for x_pieces(nt) = 2 (NT = 4), of row x_copy_row(l) + kXPieceRows. */
constexpr int kXPieceRows = 16;
AWQ_HD constexpr int x_copy_lanes(int nt) { return nt > 2 ? 32 : 16 * nt; }
AWQ_HD constexpr int x_pieces(int nt) { return nt > 2 ? nt / 2 : 1; }
AWQ_HD int x_copy_row(int lane) { return lane >> 1; }
AWQ_HD int x_copy_half(int lane) { return lane & 1; }

/* The rows of a lane's fragment: r = 0..3 -> k 2i, 2i + 1, 2i + 8, 2i + 9 (PTX ISA, A of m16n8k16). */
AWQ_HD int frag_row(int i, int r) { return 2 * i + (r & 1) + 8 * (r >> 1); }

/* ---- the decode kernel's fragments ----------------------------------------------
 * The dequantized weights are the A operand (16 output columns x 16 k), x is
 * B (16 k x 8 rows of x).  For byte b of the lane's word v (word column
 * cw + v, cw = strip + 2g) and row pair p (fragment rows 2p, 2p + 1: k 2i, 2i + 1
 * or 2i + 8, 2i + 9), one byte permute of the two rows' words puts byte b of
 * row k in byte 0 and of row k + 1 in byte 2; the even mask then takes
 * nibble 2b of both rows, the odd mask nibble 2b + 1 (4 bits higher).  A
 * register a_reg(p, odd) holds that pair: A row g for nibble 2b, g + 8 for
 * nibble 2b + 1 -- the output column 8 (cw + v) + nibble_col(nibble). */
AWQ_HD constexpr int nibble_col(int p) { return 2 * (p & 3) + (p >> 2); } /* the inverse of AWQ_NIBBLE */
AWQ_HD constexpr uint32_t pair_select(int b) { return b | (b << 4) | ((4 + b) << 8) | ((4 + b) << 12); }
constexpr uint32_t kEvenNibbles = 0x000F000Fu;
constexpr uint32_t kOddNibbles = 0x00F000F0u;
AWQ_HD int a_reg(int pair, int odd) { return 2 * pair + odd; }

/* Accumulator e of the mma for (tile t, word v, byte b) of lane (g, i): row
 * acc_x_row(t, i, e) of x at the column of nibble acc_nibble(b, e) of word
 * cw + v. */
AWQ_HD int acc_x_row(int t, int i, int e) { return kTileM * t + 2 * i + (e & 1); }
AWQ_HD int acc_nibble(int b, int e) { return 2 * b + (e >> 1); }

} // namespace gemv_map

/* ---- the warpgroup kernel's shared-memory stage (cuda/linear_wgmma.cuh) ------------
 * A stage holds 64 k: x [NT][128 bytes], then qweight [64][64 bytes] (the
 * block's 16 word columns), then the group's zero words and scales.
 *
 * - x: 16-byte chunk c of row n at x_chunk(n, c), the 128-byte swizzle that
 *   wgmma's shared-memory descriptor names (mode 1): within each 1024 bytes,
 *   address bits 4..6 XOR-ed with bits 7..9.  The stage starts on 1024 bytes.
 * - qweight: chunk c (words 4c .. 4c + 3) of row r at w_chunk(r, c): rows 2q
 *   and 2q + 1 share 128 bytes, row r in the half (r ^ r / 2) % 2, its chunks
 *   XOR-ed with 2 ((r / 4) % 2).  A lane (g, i) reads 8 bytes (words 2g,
 *   2g + 1) of the rows 2i, 2i + 1, 2i + 8, 2i + 9 of a k16 step: the 16 lanes
 *   of a half-warp then fill all 32 banks, and the 8 chunks a quarter-warp
 *   copies (thread t: chunk t % 4 of row t / 4) fill 128 distinct bytes.
 * tests/cuda_host/test_wgmma_layout.cpp checks both. */
namespace wgmma_map {

constexpr int kStageK = 64;     /* k of a stage */
constexpr int kXRowBytes = 128; /* 64 k of a row of x */
constexpr int kBlockWords = 16; /* word columns of a block */

AWQ_HD constexpr int x_chunk(int n, int c) { return n * kXRowBytes + 16 * (c ^ (n & 7)); }

AWQ_HD constexpr int w_chunk(int r, int c)
{
    return (r >> 1) * 128 + 64 * ((r ^ (r >> 1)) & 1) + 16 * (c ^ (2 * ((r >> 2) & 1)));
}

} // namespace wgmma_map
} // namespace awq_cu

#endif /* AWQ_CUDA_LINEAR_LAYOUT_CUH */
