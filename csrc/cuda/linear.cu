/*
 * cuda/linear.cu -- the fused W4A16 linear y = x @ W + bias on CUDA, with
 * W = dequantize(qweight, qzeros, scales) never written to memory: the
 * tensor-core kernel (AWQ_KERNEL_MMA, mma.sync, f16/bf16, sm_80+), the
 * CUDA-core kernel (AWQ_KERNEL_SIMT, every dtype, any G, any architecture),
 * their launchers, default configurations and the autotuner's candidates.
 *
 * The decode kernel (AWQ_KERNEL_GEMV, M <= 32) lives in cuda/linear_gemv.cuh,
 * the warpgroup kernel (AWQ_KERNEL_WGMMA, sm_90a) in cuda/linear_wgmma.cuh.
 *
 * Contract (DESIGN.md section 7): W's values are bit-equal to the dequantize
 * kernels' (round_to_dtype(float32(q - z) * float32(s))); products and sums in
 * float32; the bias added in float32; one rounding to the dtype.  The same
 * inputs and configuration give the same bits: every sum over K slices runs in
 * a fixed order.  No entry point aborts, allocates or synchronizes (except
 * awq_cuda_linear_time on its end event).  Design notes: docs/KERNELS.md,
 * "linear: the fused W4A16 kernels".
 *
 * What awq_config means here:
 *   GEMV: block_size = 32 * S, S warps on one 128-column strip, each a
 *         contiguous slice of the strip's K (S in 1, 2, 4, 8); rows = ring
 *         stages of a warp's copies (4 or 8);
 *         split = blocks of a cluster (1, 2, 4, 8; > 1 needs sm_90), each a
 *         contiguous slice of K, summed through distributed shared memory.
 *   MMA:  block_size = 32 * S, S warps on one 64-column block, each a contiguous
 *         slice of the block's K range (S in 1, 2, 4, 8);
 *         rows = m16 tiles per warp (1, 2, 4): 16 * rows rows of x share each
 *         dequantized B fragment;
 *         split = blocks of a thread-block cluster (1, 2, 4, 8; > 1 needs sm_90),
 *         each a contiguous slice of K, summed through distributed shared memory.
 *   WGMMA: block_size = 128 H (H = 1 or 2 warpgroups, each on 128 columns,
 *         sharing the tile of x); rows = 16-row
 *         groups of x a block takes (2, 4, 8: wgmma's N = 32, 64, 128 --
 *         counted in groups so that every value fits the autotune cache's
 *         rows field, at most AWQ_MAX_ROWS); split = blocks of a
 *         cluster, each a contiguous slice of K, summed through distributed
 *         shared memory.
 *   SIMT: block_size = threads of a block, blockDim.x = block_size / split word
 *         columns by blockDim.y = split slices of K;
 *         rows = rows of x per thread (1, 2, 4).
 */
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "cuda/cuda.h"
#include "cuda/launch.cuh"
#include "cuda/layout.cuh"
#include "cuda/linear_gemv.cuh"
#include "cuda/linear_layout.cuh"
#include "cuda/linear_ops.cuh"
#include "cuda/linear_prepared.cuh"
#include "cuda/linear_wgmma.cuh"

using namespace awq_cu;
namespace mm = awq_cu::mma_map;
namespace gv = awq_cu::gemv;

namespace {

/* ======================================================================
 * Shared device helpers
 * ====================================================================== */

/* Why: a stored 16-bit or 32-bit element, widened exactly to float32. */
template <class T> __device__ __forceinline__ float elem_to_float(const char *base, int64_t i)
{
    return scale_to_float<T>(load_elem<T>(base, i));
}

/* Why: 8 consecutive elements (bias) widened to float32, with 16-byte loads when aligned. */
template <class T, bool VEC> __device__ __forceinline__ void load8_float(const char *base, int64_t i, float (&v)[8])
{
    if constexpr (VEC && is_16bit<T>::value) {
        const uint4 u = __ldg(reinterpret_cast<const uint4 *>(base + i * 2));
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            v[2 * p] = scale_to_float<T>(w[p] & 0xFFFFu);
            v[2 * p + 1] = scale_to_float<T>(w[p] >> 16);
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = elem_to_float<T>(base, i + j);
    }
}

/* Why: the one rounding of 8 float32 results and their 16-byte (f16/bf16;
 * two for f32) or element-wise store. */
template <class T, bool VEC> __device__ __forceinline__ void store8(char *base, int64_t i, const float (&v)[8])
{
    if constexpr (VEC && is_16bit<T>::value) {
        uint4 u;
        u.x = pack_pair<T>(v[0], v[1]);
        u.y = pack_pair<T>(v[2], v[3]);
        u.z = pack_pair<T>(v[4], v[5]);
        u.w = pack_pair<T>(v[6], v[7]);
        *reinterpret_cast<uint4 *>(base + i * 2) = u;
    } else if constexpr (VEC) {
        float4 *p = reinterpret_cast<float4 *>(base + i * 4);
        p[0] = make_float4(v[0], v[1], v[2], v[3]);
        p[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
        using B = typename T::bits;
#pragma unroll
        for (int j = 0; j < 8; ++j) reinterpret_cast<B *>(base)[i + j] = (B)float_to_out<T>(v[j]);
    }
}

/* Why: a 64-bit min usable in device code without <algorithm>. */
__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ======================================================================
 * The tensor-core kernel (AWQ_KERNEL_MMA)
 *
 * Block = S warps on one 64-column block (8 word columns) and one M tile of
 * 16 * ROWS rows; the blocks of a cluster (split) share the same columns and
 * M tile.  Slice rank * S + warp of the split * S slices of the k16 steps
 * is the warp's; it streams its words through a software pipeline of D
 * stages in registers (the loads of step s + D leave while step s is
 * computed), so D steps of loads (D x 512 bytes of qweight per warp) are in
 * flight.  The group's zero word and 8 scales are decoded once per group
 * into the zero and scale pairs of the 8 n8 tiles; the next group's raw
 * zero word and scales are loaded as soon as a group starts, so their
 * latency hides behind the group's own steps.
 *
 * Epilogue: with one slice per column block (S == 1, split == 1) each lane
 * stores its 16 consecutive columns of two rows straight from registers
 * (bias in float32, one rounding, 16-byte stores).  Otherwise every warp
 * writes its partial tile to shared memory, and the block sums them in warp
 * order 0, 1, ..., S-1; with a cluster the block sums are then added across
 * the cluster in rank order 0, 1, ..., split-1 through distributed shared
 * memory, each block finishing a share of the outputs.  The order of every
 * sum is fixed by the configuration: the result is deterministic.
 * ====================================================================== */
constexpr int kMmaMaxWarps = 8;                    /* S <= 8 */
constexpr int kMmaMaxThreads = kMmaMaxWarps * 32;  /* __launch_bounds__ */
constexpr int kMmaMaxSplit = 8;                    /* the portable cluster size limit */
constexpr unsigned kDefaultSmemLimit = 48u * 1024; /* dynamic shared memory without an opt-in */
/* Step and row indices along K are 32-bit in the kernel (the host refuses larger K). */
constexpr int64_t kMmaMaxK = int64_t(1) << 30;

/* Pipeline depth: k16 steps of loads in flight per warp.  Four with 1 or 2
 * m16 tiles; with 4 tiles the 128 accumulators leave room for two (large M
 * keeps more warps resident anyway). */
template <int ROWS> constexpr int kMmaStages = ROWS >= 4 ? 2 : 4;

/* Blocks of 256 threads an SM must be able to hold (__launch_bounds__):
 * with one m16 tile, 2, i.e. at most 128 registers a thread -- the 16 warps
 * per SM whose loads keep ~32 KB in flight; larger tiles take what their
 * accumulators need, and so does the K-tail variant (rare: G == K only). */
template <int ROWS, bool KTAIL> constexpr int kMmaMinBlocks = ROWS == 1 && !KTAIL ? 2 : 1;

LinearOperands operands_of(const awq_linear_problem *p)
{
    return LinearOperands{static_cast<const char *>(p->x), p->qweight, p->qzeros,
                          static_cast<const char *>(p->scales), static_cast<const char *>(p->bias),
                          static_cast<char *>(p->y)};
}

struct MmaArgs : LinearOperands {
    int64_t M, N, W;         /* W = N / 8 word columns */
    int64_t mtiles;          /* M tiles of 16 * ROWS rows */
    int64_t mrows;           /* rows of a warp's partial tile in shared memory: min(16 * ROWS, M) */
    int K;                   /* < kMmaMaxK */
    int nsteps;              /* k16 steps: ceil(K / 16) */
    int spg;                 /* k16 steps per group: G / 16, or nsteps (>= 1) when the one group is K */
    int split;               /* blocks per cluster (K slices across blocks) */
};

/* One pipeline stage: what a k16 step needs from memory besides its group. */
template <int ROWS> struct MmaStage {
    uint32_t w[mm::kWordsPerLane]; /* qweight rows k0 + 4i + r of word column cb + g */
    uint32_t a[ROWS][4];           /* A fragments of the warp's m16 tiles */
};

/* Where the next step to load is. */
struct MmaCursor {
    int k0;             /* its first row */
    const uint32_t *qp; /* &qweight[k0 + 4i][col] */
    const char *xp;     /* &x[m0 + g][k0 + 4i] */
};

/* Decoded group state of the lane's word column: per n8 tile the zero pair
 * (base + z in both halves) and the scale pair (s in both halves). */
struct MmaGroup {
    uint32_t z[mm::kTiles];
    uint32_t s[mm::kTiles];
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

/* Why: the exact dequantized pair W = ((base + q) - (base + z)) * s in the
 * dtype's own x2 arithmetic, from the nibble pair q (kNibblePairMask bits):
 * the subtraction is exact, the product rounds once, to nearest even -- the
 * same bits as the dequantize kernels. */
template <class T> __device__ __forceinline__ uint32_t dequant_pair(uint32_t qb, uint32_t z, uint32_t s)
{
    return mul2<T>(sub2<T>(qb, z), s);
}

/* Why: base + q of nibble p of the two words behind (low, high): the
 * permuted word shifted to the nibble, masked, and the magic OR-ed in. */
template <class T> __device__ __forceinline__ uint32_t magic_pair(uint32_t low, uint32_t high, int p)
{
    return and_or<mm::kNibblePairMask, PairMagic<T>::kValue>((p < 4 ? low : high) >> (4 * (p & 3)));
}

/* Why: decode a group's zero word and scales once for all its steps. */
template <class T> __device__ __forceinline__ void mma_decode_group(MmaGroup &gs, uint32_t zword, uint4 s)
{
    const uint32_t sw[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
    for (int j = 0; j < mm::kTiles; ++j) {
        gs.z[j] = mm::zero_pair(zword, AWQ_NIBBLE(j)) | PairMagic<T>::kValue;
        gs.s[j] = mm::scale_pair(sw[j >> 1], j);
    }
}

/* Why: the raw zero word and 8 scales of the lane's (clamped) word column of one group. */
__device__ __forceinline__ void mma_load_group(uint32_t &z, uint4 &s, const uint32_t *zp, const char *sp)
{
    z = __ldg(zp);
    s = __ldg(reinterpret_cast<const uint4 *>(sp));
}

/* Why: a 32-bit read-only load that is not issued when ok is false (0
 * instead), as one predicated instruction: the compiler otherwise branches
 * around each conditional load, which serializes the issue of a step's loads. */
__device__ __forceinline__ uint32_t ldg_if(const void *p, bool ok)
{
    uint32_t v;
    asm("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\tmov.b32 %0, 0;\n\t@q ld.global.nc.b32 %0, [%1];\n\t}"
        : "=r"(v)
        : "l"(p), "r"((int)ok));
    return v;
}

/* Why: issue every load of one k16 step at once -- 4 qweight words and the
 * A fragments (each A register is one 4-byte load, so it lands where the
 * mma reads it); then move the cursor to the next step.  qweight is read
 * unconditionally: the cursor's column is clamped to the last word column
 * (a column past N feeds only outputs past N, which are never stored), and
 * in the TAIL step rows past K read row K-1 (mma_compute zeroes them).  x
 * elements past K and rows past M are not loaded (zeros): 0 * Inf would be
 * NaN in a stored output. */
template <int ROWS, bool TAIL>
__device__ __forceinline__ void mma_issue(MmaStage<ROWS> &st, MmaCursor &cur, const MmaArgs &a, int i,
                                          unsigned row_ok, int64_t x_tile_pitch)
{
#pragma unroll
    for (int r = 0; r < mm::kWordsPerLane; ++r) {
        const uint32_t *p = cur.qp + r * a.W;
        if constexpr (TAIL)
            if (cur.k0 + mm::word_row(i, r) >= a.K) p = cur.qp - (cur.k0 + mm::word_row(i, 0) - (a.K - 1)) * a.W;
        st.w[r] = __ldg(p);
    }
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {
        /* K is even: a pair of elements is all inside K or all past it */
        const bool k_ok = !TAIL || cur.k0 + mm::x_col(i) + mm::a_pair_col(reg) < a.K;
#pragma unroll
        for (int t = 0; t < ROWS; ++t) {
            const int rh = 2 * t + mm::a_row_half(reg); /* 8-row half of the M tile */
            st.a[t][reg] = ldg_if(cur.xp + rh * x_tile_pitch + (int64_t)mm::a_pair_col(reg) * sizeof(uint16_t),
                                  k_ok && ((row_ok >> rh) & 1u));
        }
    }
    cur.k0 += mm::kStepK;
    cur.qp += mm::kStepK * a.W;
    cur.xp += mm::kStepK * (int64_t)sizeof(uint16_t);
}

/* Why: with KTAIL (K % 16 != 0) the one step whose rows pass K takes the checked variant. */
template <int ROWS, bool KTAIL>
__device__ __forceinline__ void mma_issue_step(MmaStage<ROWS> &st, MmaCursor &cur, const MmaArgs &a, int i,
                                               unsigned row_ok, int64_t x_tile_pitch)
{
    if (KTAIL && cur.k0 + mm::kStepK > a.K)
        mma_issue<ROWS, true>(st, cur, a, i, row_ok, x_tile_pitch);
    else
        mma_issue<ROWS, false>(st, cur, a, i, row_ok, x_tile_pitch);
}

/* Why: one k16 step on the tensor cores: the 8 n8 tiles' B fragments,
 * dequantized exactly from the stage's 4 words, times the A fragments of
 * each active m16 tile.  TAIL: rows past K weigh 0. */
template <class T, int ROWS, bool TAIL>
__device__ __forceinline__ void mma_compute(float (&acc)[ROWS][mm::kTiles][4], const MmaStage<ROWS> &st,
                                            const MmaGroup &gs, int tiles, int k0, int K, int i)
{
    const uint32_t lo0 = mm::low_nibbles(st.w[mm::b_word(0, 0)], st.w[mm::b_word(0, 1)]);
    const uint32_t hi0 = mm::high_nibbles(st.w[mm::b_word(0, 0)], st.w[mm::b_word(0, 1)]);
    const uint32_t lo1 = mm::low_nibbles(st.w[mm::b_word(1, 0)], st.w[mm::b_word(1, 1)]);
    const uint32_t hi1 = mm::high_nibbles(st.w[mm::b_word(1, 0)], st.w[mm::b_word(1, 1)]);
    uint32_t mask0 = ~0u, mask1 = ~0u;
    if constexpr (TAIL) {
        mask0 = mm::tail_mask(k0 + mm::word_row(i, mm::b_word(0, 0)) < K, k0 + mm::word_row(i, mm::b_word(0, 1)) < K);
        mask1 = mm::tail_mask(k0 + mm::word_row(i, mm::b_word(1, 0)) < K, k0 + mm::word_row(i, mm::b_word(1, 1)) < K);
    }
#pragma unroll
    for (int j = 0; j < mm::kTiles; ++j) {
        const int p = AWQ_NIBBLE(j);
        /* magic_pair(...) == nibble_pair(...) | magic (linear_layout.cuh) */
        uint32_t b0 = dequant_pair<T>(magic_pair<T>(lo0, hi0, p), gs.z[j], gs.s[j]);
        uint32_t b1 = dequant_pair<T>(magic_pair<T>(lo1, hi1, p), gs.z[j], gs.s[j]);
        if constexpr (TAIL) {
            b0 &= mask0;
            b1 &= mask1;
        }
#pragma unroll
        for (int t = 0; t < ROWS; ++t)
            if (t < tiles) mma_16816<T>(acc[t][j], st.a[t], b0, b1);
    }
}

/* Why: 8 partial sums of one output word (row r, word offset o of the block) from a partial tile. */
__device__ __forceinline__ void part_load(const float *part, int r, int o, float (&v)[8])
{
    const float4 *row = reinterpret_cast<const float4 *>(part + r * mm::kWarpCols);
    const float4 x0 = row[mm::part_chunk(r, 2 * o)];
    const float4 x1 = row[mm::part_chunk(r, 2 * o + 1)];
    v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w;
    v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
}

/* Why: the next term of a fixed-order sum of partial tiles. */
__device__ __forceinline__ void part_add(const float *part, int r, int o, float (&v)[8])
{
    float u[8];
    part_load(part, r, o, u);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] += u[j];
}

/* Why: a block's sum back into its warp-0 tile, for the cluster's sum. */
__device__ __forceinline__ void part_store(float *part, int r, int o, const float (&v)[8])
{
    float4 *row = reinterpret_cast<float4 *>(part + r * mm::kWarpCols);
    row[mm::part_chunk(r, 2 * o)] = make_float4(v[0], v[1], v[2], v[3]);
    row[mm::part_chunk(r, 2 * o + 1)] = make_float4(v[4], v[5], v[6], v[7]);
}

/* Why: the end of every output word: bias in float32, one rounding, one 16-byte store. */
template <class T>
__device__ __forceinline__ void mma_finish(const MmaArgs &a, int64_t row, int64_t wc, float (&v)[8])
{
    if (a.bias != nullptr) {
        float b[8];
        load8_float<T, true>(a.bias, wc * AWQ_COLS_PER_WORD, b);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] += b[j];
    }
    store8<T, true>(a.y, row * a.N + wc * AWQ_COLS_PER_WORD, v);
}

/* Why: the k16 steps [s_begin, s_end) of one warp into acc, through the
 * D-stage pipeline. */
template <class T, int ROWS, bool KTAIL>
__device__ __forceinline__ void mma_mainloop(float (&acc)[ROWS][mm::kTiles][4], const MmaArgs &a, int s_begin,
                                             int s_end, int64_t m0, int64_t col, int g, int i, int tiles,
                                             unsigned row_ok)
{
    constexpr int D = kMmaStages<ROWS>;
    const int64_t x_tile_pitch = (int64_t)8 * a.K * (int64_t)sizeof(uint16_t); /* 8 rows of x, in bytes */
    const int group = mm::group_of_step(s_begin, a.spg);
    int next_start = mm::group_start(group + 1, a.spg); /* first step of the next group */
    const uint32_t *zp = a.qzeros + group * a.W + col;
    const char *sp = a.scales + (group * a.N + col * AWQ_COLS_PER_WORD) * (int64_t)sizeof(uint16_t);
    const int64_t sp_pitch = a.N * (int64_t)sizeof(uint16_t);

    uint32_t zraw, znext = 0u;
    uint4 sraw, snext = make_uint4(0u, 0u, 0u, 0u);
    mma_load_group(zraw, sraw, zp, sp);
    if (next_start < s_end) mma_load_group(znext, snext, zp + a.W, sp + sp_pitch);

    MmaCursor cur;
    cur.k0 = s_begin * mm::kStepK;
    cur.qp = a.qweight + (cur.k0 + mm::word_row(i, 0)) * a.W + col;
    cur.xp = a.x + ((m0 + g) * a.K + cur.k0 + mm::x_col(i)) * (int64_t)sizeof(uint16_t);
    MmaStage<ROWS> st[D];
#pragma unroll
    for (int d = 0; d < D; ++d)
        if (s_begin + d < s_end) mma_issue_step<ROWS, KTAIL>(st[d], cur, a, i, row_ok, x_tile_pitch);

    MmaGroup gs;
    mma_decode_group<T>(gs, zraw, sraw);
    for (int s0 = s_begin; s0 < s_end; s0 += D) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            const int s = s0 + d;
            if (s >= s_end) break;
            if (s == next_start) { /* a new group: decode the loaded one, fetch the one after */
                mma_decode_group<T>(gs, znext, snext);
                next_start += a.spg;
                zp += a.W;
                sp += sp_pitch;
                if (next_start < s_end) mma_load_group(znext, snext, zp + a.W, sp + sp_pitch);
            }
            if (KTAIL && s == a.nsteps - 1)
                mma_compute<T, ROWS, true>(acc, st[d], gs, tiles, s * mm::kStepK, a.K, i);
            else
                mma_compute<T, ROWS, false>(acc, st[d], gs, tiles, s * mm::kStepK, a.K, i);
            if (s + D < s_end) mma_issue_step<ROWS, KTAIL>(st[d], cur, a, i, row_ok, x_tile_pitch);
        }
    }
}

#endif /* __CUDA_ARCH__ >= 800 */

/* KTAIL: K % 16 != 0 (G == K), the last k16 step passes K. */
template <class T, int ROWS, bool KTAIL>
__global__ void __launch_bounds__(kMmaMaxThreads, kMmaMinBlocks<ROWS, KTAIL>) awq_mma_kernel(const MmaArgs a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    extern __shared__ float4 mma_shared[];
    float *part = reinterpret_cast<float *>(mma_shared);

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int S = blockDim.x >> 5;
    const int g = mm::lane_group(lane);
    const int i = mm::lane_quad(lane);
    const int64_t cblock = blockIdx.x / a.split;
    const int rank = (int)(blockIdx.x - cblock * a.split); /* == the block's rank in its cluster */
    const int64_t cb = cblock * mm::kWarpWords;              /* first word column of the block */
    /* the lane's word column, clamped: past N it feeds only outputs that are never stored */
    const int64_t colc = min64(cb + mm::word_col(g), a.W - 1);

    /* this warp's slice of the k16 steps */
    const int nslices = a.split * S;
    const int slice = rank * S + warp;
    const int s_begin = (int)mm::slice_begin(a.nsteps, nslices, slice);
    const int s_end = (int)mm::slice_begin(a.nsteps, nslices, slice + 1);
    float *const mypart = part + warp * a.mrows * mm::kWarpCols;

    for (int64_t mt = blockIdx.y; mt < a.mtiles; mt += gridDim.y) {
        const int64_t m0 = mt * (mm::kTileM * ROWS);
        const int tiles = (int)min64(ROWS, (a.M - m0 + mm::kTileM - 1) / mm::kTileM); /* active m16 tiles */
        unsigned row_ok = 0; /* bit 2t + h: row m0 + 16t + 8h + g exists */
#pragma unroll
        for (int t = 0; t < ROWS; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                if (m0 + mm::kTileM * t + mm::acc_row(g, 2 * h) < a.M) row_ok |= 1u << (2 * t + h);

        float acc[ROWS][mm::kTiles][4];
#pragma unroll
        for (int t = 0; t < ROWS; ++t)
#pragma unroll
            for (int j = 0; j < mm::kTiles; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[t][j][e] = 0.0f;
        if (s_begin < s_end) mma_mainloop<T, ROWS, KTAIL>(acc, a, s_begin, s_end, m0, colc, g, i, tiles, row_ok);

        if (S == 1 && a.split == 1) {
            /* one slice: straight from registers, 16 consecutive columns of two rows per lane */
#pragma unroll
            for (int t = 0; t < ROWS; ++t) {
                if (t >= tiles) continue;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int64_t row = m0 + mm::kTileM * t + mm::acc_row(g, 2 * h);
                    if (row >= a.M) continue;
#pragma unroll
                    for (int u = 0; u < 2; ++u) {
                        const int64_t wc = cb + mm::acc_word(i, u);
                        if (wc >= a.W) continue;
                        float v[8];
#pragma unroll
                        for (int j = 0; j < mm::kTiles; ++j) v[j] = acc[t][j][2 * h + u];
                        mma_finish<T>(a, row, wc, v);
                    }
                }
            }
            continue;
        }

        /* the warp's partial tile to shared memory (rows that exist only) */
#pragma unroll
        for (int t = 0; t < ROWS; ++t) {
            if (t >= tiles) continue;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = mm::kTileM * t + mm::acc_row(g, 2 * h);
                if (m0 + r >= a.M) continue;
                float4 *prow = reinterpret_cast<float4 *>(mypart + r * mm::kWarpCols);
#pragma unroll
                for (int u = 0; u < 2; ++u)
#pragma unroll
                    for (int v = 0; v < 2; ++v) {
                        const int c = 2 * mm::acc_word(i, u) + v; /* columns 4c .. 4c+3: tiles 4v .. 4v+3 */
                        prow[mm::part_chunk(r, c)] =
                            make_float4(acc[t][4 * v][2 * h + u], acc[t][4 * v + 1][2 * h + u],
                                        acc[t][4 * v + 2][2 * h + u], acc[t][4 * v + 3][2 * h + u]);
                    }
            }
        }
        __syncthreads();

        /* the block's sum, warp 0 first, then 1, ..., S-1 */
        const int mv = (int)min64(mm::kTileM * ROWS, a.M - m0);
        const int units = mv * mm::kWarpWords;
        const int wstride = (int)a.mrows * mm::kWarpCols;
        if (S > 1 || a.split == 1) {
            for (int u = threadIdx.x; u < units; u += blockDim.x) {
                const int r = u / mm::kWarpWords, o = u % mm::kWarpWords;
                float v[8];
                part_load(part, r, o, v);
                for (int w = 1; w < S; ++w) part_add(part + w * wstride, r, o, v);
                if (a.split == 1) {
                    if (cb + o < a.W) mma_finish<T>(a, m0 + r, cb + o, v);
                } else {
                    part_store(part, r, o, v); /* in place: only this thread reads and writes unit u */
                }
            }
        }
        if (a.split == 1) {
            __syncthreads(); /* the next M tile writes the same shared memory */
            continue;
        }
#if __CUDA_ARCH__ >= 900
        /* the cluster's sum, rank 0 first, then 1, ..., split-1; each block finishes a share */
        cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
        cluster.sync();
        for (int u = rank * blockDim.x + threadIdx.x; u < units; u += a.split * blockDim.x) {
            const int r = u / mm::kWarpWords, o = u % mm::kWarpWords;
            if (cb + o >= a.W) continue;
            float v[8];
            part_load(cluster.map_shared_rank(part, 0), r, o, v);
            for (int q = 1; q < a.split; ++q) part_add(cluster.map_shared_rank(part, q), r, o, v);
            mma_finish<T>(a, m0 + r, cb + o, v);
        }
        cluster.sync(); /* no block leaves or rewrites its partials while another reads them */
#endif
    }
#else
    (void)a; /* before sm_80: the host never launches it (kernel_arch) */
#endif
}

/* ======================================================================
 * The CUDA-core kernel (AWQ_KERNEL_SIMT)
 *
 * Thread (tx, ty) owns word column blockIdx.x * blockDim.x + tx (8 outputs)
 * for ROWS rows of x and slice ty of the blockDim.y slices of K.  It walks
 * its slice group by group: the group's zero word and 8 scales once, then
 * 4 rows of qweight at a time (4 loads in flight), each word dequantized
 * exactly (the dequantize formula, rounded to the dtype) and multiplied
 * into ROWS x 8 float32 accumulators.  The slices of a column are summed
 * through shared memory by thread ty = 0 in order 0, 1, ..., split-1.
 * Consecutive tx read consecutive words: coalesced; x is a broadcast.
 * ====================================================================== */
struct SimtArgs : LinearOperands {
    int64_t M, K, N, W, G;
    int64_t mchunks; /* ceil(M / ROWS) */
    int vec;         /* scales, bias and y 16-byte aligned: 16-byte accesses */
};

constexpr int kSimtPad = 4; /* floats after each thread's partials: keeps 16-byte phases conflict-free */
/* Floats per thread in the SIMT partials: its ROWS x 8 sums and the pad. */
__host__ __device__ constexpr int simt_pitch(int rows) { return AWQ_COLS_PER_WORD * rows + kSimtPad; }
constexpr int kSimtUnroll = 4; /* rows of qweight in flight per thread */
/* Threads per block: 512 leaves 128 registers a thread (4 rows x 8 columns of
 * accumulators, 4 words and their x values in flight) without spilling. */
constexpr int kSimtMaxBlock = 512;

/* Why: W's exact value as float32: q - z exact (magic-number path of
 * layout.cuh), the float32 product, one rounding to the dtype, widened back. */
template <class T> __device__ __forceinline__ float simt_round(float v)
{
    if constexpr (std::is_same<T, F32T>::value)
        return v;
    else
        return scale_to_float<T>(float_to_out<T>(v));
}

template <class T>
__device__ __forceinline__ void simt_decode(uint32_t w, const uint32_t (&zpair)[kPairsPerWord],
                                            const float (&s)[AWQ_COLS_PER_WORD], float (&wv)[AWQ_COLS_PER_WORD])
{
#pragma unroll
    for (int p = 0; p < kPairsPerWord; ++p) {
        const uint32_t d = (((w >> (kNibbleBits * p)) & kPairMask) | kPairBias) - zpair[p];
        const float lo = __fsub_rn(__uint_as_float(__byte_perm(d, kF32Magic, kPermLowHalf)), kF32MagicBias);
        const float hi = __fsub_rn(__uint_as_float(__byte_perm(d, kF32Magic, kPermHighHalf)), kF32MagicBias);
        wv[2 * p] = simt_round<T>(__fmul_rn(lo, s[2 * p]));
        wv[2 * p + 1] = simt_round<T>(__fmul_rn(hi, s[2 * p + 1]));
    }
}

/* Why: the 8 scales of one word column as float32, 16 bytes at a time when aligned. */
template <class T> __device__ __forceinline__ void simt_scales(const SimtArgs &a, int64_t i, float (&s)[8])
{
    if (a.vec) {
        if constexpr (is_16bit<T>::value) {
            load8_float<T, true>(a.scales, i, s);
        } else {
            const float4 *p = reinterpret_cast<const float4 *>(a.scales + i * 4);
            const float4 u = __ldg(p), v = __ldg(p + 1);
            s[0] = u.x, s[1] = u.y, s[2] = u.z, s[3] = u.w, s[4] = v.x, s[5] = v.y, s[6] = v.z, s[7] = v.w;
        }
    } else {
        load8_float<T, false>(a.scales, i, s);
    }
}

/* Why: the main loop of one thread: its K slice [kb, ke), group by group. */
template <class T, int ROWS>
__device__ __forceinline__ void simt_slice(const SimtArgs &a, int64_t c, int64_t m0, int nrows, int64_t kb,
                                           int64_t ke, float (&acc)[ROWS][AWQ_COLS_PER_WORD])
{
    int64_t k = kb;
    while (k < ke) {
        const int64_t grp = k / a.G;
        const int64_t kend = min64((grp + 1) * a.G, ke);
        const uint32_t zword = __ldg(a.qzeros + grp * a.W + c);
        float s[AWQ_COLS_PER_WORD];
        simt_scales<T>(a, grp * a.N + c * AWQ_COLS_PER_WORD, s);
        uint32_t zpair[kPairsPerWord];
#pragma unroll
        for (int p = 0; p < kPairsPerWord; ++p) zpair[p] = (zword >> (kNibbleBits * p)) & kPairMask;

        const uint32_t *qp = a.qweight + k * a.W + c;
        while (k < kend) {
            const int n = (int)min64(kSimtUnroll, kend - k);
            uint32_t w[kSimtUnroll];
            float xv[ROWS][kSimtUnroll];
#pragma unroll
            for (int u = 0; u < kSimtUnroll; ++u) w[u] = u < n ? __ldg(qp + u * a.W) : 0u;
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
#pragma unroll
                for (int u = 0; u < kSimtUnroll; ++u)
                    xv[r][u] = (r < nrows && u < n) ? elem_to_float<T>(a.x, (m0 + r) * a.K + k + u) : 0.0f;
#pragma unroll
            for (int u = 0; u < kSimtUnroll; ++u) {
                if (u >= n) break;
                float wv[AWQ_COLS_PER_WORD];
                simt_decode<T>(w[u], zpair, s, wv);
#pragma unroll
                for (int r = 0; r < ROWS; ++r)
#pragma unroll
                    for (int j = 0; j < AWQ_COLS_PER_WORD; ++j) acc[r][j] = fmaf(xv[r][u], wv[j], acc[r][j]);
            }
            /* n rows, not kSimtUnroll: the group (or the slice) may end mid-batch */
            k += n;
            qp += n * a.W;
        }
    }
}

template <class T, int ROWS> __global__ void __launch_bounds__(kSimtMaxBlock, 1) awq_simt_kernel(const SimtArgs a)
{
    extern __shared__ float4 simt_shared[];
    float *part = reinterpret_cast<float *>(simt_shared);
    constexpr int kPitch = simt_pitch(ROWS);
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int split = blockDim.y;
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + tx;
    const bool active = c < a.W;
    const int64_t kb = mm::slice_begin(a.K, split, ty);
    const int64_t ke = mm::slice_begin(a.K, split, ty + 1);

    for (int64_t mc = blockIdx.y; mc < a.mchunks; mc += gridDim.y) {
        const int64_t m0 = mc * ROWS;
        const int nrows = (int)min64(ROWS, a.M - m0);
        float acc[ROWS][AWQ_COLS_PER_WORD];
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int j = 0; j < AWQ_COLS_PER_WORD; ++j) acc[r][j] = 0.0f;
        if (active) simt_slice<T, ROWS>(a, c, m0, nrows, kb, ke, acc);

        if (split > 1) {
            if (ty > 0) {
                float4 *mine = reinterpret_cast<float4 *>(part + ((int64_t)(ty - 1) * blockDim.x + tx) * kPitch);
#pragma unroll
                for (int r = 0; r < ROWS; ++r)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        mine[2 * r + h] = make_float4(acc[r][4 * h], acc[r][4 * h + 1], acc[r][4 * h + 2],
                                                      acc[r][4 * h + 3]);
            }
            __syncthreads();
            if (ty == 0) {
                for (int q = 1; q < split; ++q) {
                    const float4 *theirs =
                        reinterpret_cast<const float4 *>(part + ((int64_t)(q - 1) * blockDim.x + tx) * kPitch);
#pragma unroll
                    for (int r = 0; r < ROWS; ++r)
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const float4 v = theirs[2 * r + h];
                            acc[r][4 * h] += v.x;
                            acc[r][4 * h + 1] += v.y;
                            acc[r][4 * h + 2] += v.z;
                            acc[r][4 * h + 3] += v.w;
                        }
                }
            }
        }
        if (ty == 0 && active) {
            float b[AWQ_COLS_PER_WORD];
            if (a.bias != nullptr) {
                if (a.vec)
                    load8_float<T, true>(a.bias, c * AWQ_COLS_PER_WORD, b);
                else
                    load8_float<T, false>(a.bias, c * AWQ_COLS_PER_WORD, b);
            }
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                if (r >= nrows) break;
                float v[AWQ_COLS_PER_WORD];
#pragma unroll
                for (int j = 0; j < AWQ_COLS_PER_WORD; ++j) v[j] = a.bias != nullptr ? acc[r][j] + b[j] : acc[r][j];
                const int64_t at = (m0 + r) * a.N + c * AWQ_COLS_PER_WORD;
                if (a.vec)
                    store8<T, true>(a.y, at, v);
                else
                    store8<T, false>(a.y, at, v);
            }
        }
        if (split > 1) __syncthreads(); /* the next chunk writes the same shared memory */
    }
}

/* ======================================================================
 * Host side
 * ====================================================================== */

constexpr int kMaxGridY = 65535; /* gridDim.y limit; the kernels loop over the rest */

bool valid_dtype(awq_dtype t) { return t == AWQ_F16 || t == AWQ_BF16 || t == AWQ_F32; }

bool aligned(const void *p, uintptr_t n) { return ((uintptr_t)p % n) == 0; }

bool nothing_to_do(const awq_linear_problem *p) { return p->M == 0 || p->N == 0; }

/* Defensive re-check of what the caller validated (a bad problem must not
 * divide by zero or fault here), plus element alignment of every pointer. */
awq_status check_problem(const awq_linear_problem *p)
{
    if (!p || p->M < 0 || p->K < 0 || p->N < 0 || p->N % AWQ_COLS_PER_WORD != 0 || p->G < 1)
        return AWQ_ERR_CONFIG;
    if (!valid_dtype(p->dtype)) return AWQ_ERR_CONFIG;
    if (p->device < 0) return AWQ_ERR_DEVICE;
    if (nothing_to_do(p)) return AWQ_OK;
    if (p->K % p->G != 0) return AWQ_ERR_CONFIG;
    const size_t e = awq_dtype_size(p->dtype);
    if (!p->y || !aligned(p->y, e) || (p->bias && !aligned(p->bias, e))) return AWQ_ERR_CONFIG;
    if (p->K == 0) return AWQ_OK; /* y = bias (or 0): nothing else is read */
    if (!p->x || !p->qweight || !p->qzeros || !p->scales) return AWQ_ERR_CONFIG;
    if (!aligned(p->x, e) || !aligned(p->scales, e) || !aligned(p->qweight, 4) || !aligned(p->qzeros, 4))
        return AWQ_ERR_CONFIG;
    return AWQ_OK;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool is_pow2(int64_t v) { return v >= 1 && (v & (v - 1)) == 0; }

/* ---- device facts ------------------------------------------------------ */

/* The virtual architecture the kernels of this build run as on `device`
 * (cudaFuncAttributes::ptxVersion: 90 for sm_90 code).  A build without
 * code for the device's generation runs JIT-compiled older PTX there, whose
 * MMA kernel has no tensor-core (below 80) or cluster (below 90) code: such
 * configurations must be refused, not launched.  Asked once per device;
 * -1 when the query fails (asked again next time). */
int kernel_arch(int device)
{
    static std::atomic<int> cache[AWQ_MAX_DEVICES]; /* 0: not asked yet */
    if (device >= 0 && device < AWQ_MAX_DEVICES) {
        const int v = cache[device].load(std::memory_order_acquire);
        if (v != 0) return v;
    }
    DeviceScope scope;
    cudaFuncAttributes attr;
    int v = -1;
    if (scope.enter(device) == cudaSuccess &&
        clear_error(cudaFuncGetAttributes(&attr, reinterpret_cast<const void *>(awq_mma_kernel<F16T, 1, false>))) ==
            cudaSuccess)
        v = attr.ptxVersion;
    if (v > 0 && device >= 0 && device < AWQ_MAX_DEVICES) cache[device].store(v, std::memory_order_release);
    return v;
}

struct Device {
    int major = 0, minor = 0, sms = 132, threads_per_sm = 2048; /* H100/H200 if unknown */
    int arch = -1; /* kernel_arch */
    int64_t smem_optin = kDefaultSmemLimit;
    bool tensor_cores() const { return major >= 8 && arch >= 80; } /* mma.sync bf16 */
    bool clusters() const { return major >= 9 && arch >= 90; }
    /* sm_90a machine code (wgmma) runs on compute capability 9.0 only, and a
     * build for 9.0 always carries it (setup.py): code of version 90 there is it */
    bool warpgroups() const { return major == 9 && minor == 0 && arch >= 90; }
};

cudaError_t device_of(int dev, Device *d)
{
    *d = Device();
    DeviceInfo info;
    const cudaError_t e = device_info(dev, &info);
    if (e != cudaSuccess) return e;
    d->major = info.major;
    d->minor = info.minor;
    d->sms = info.sms > 0 ? info.sms : d->sms;
    d->threads_per_sm = info.threads_per_sm > 0 ? info.threads_per_sm : d->threads_per_sm;
    d->smem_optin = info.smem_per_block_optin > 0 ? info.smem_per_block_optin : d->smem_optin;
    if (d->major >= 8) d->arch = kernel_arch(dev);
    return cudaSuccess;
}

/* Why: dynamic shared memory above 48 KB needs an opt-in per kernel and
 * device, once (cudaFuncSetAttribute is not a stream operation).  Devices
 * past AWQ_MAX_DEVICES opt in on every launch that needs it.  SharedFirst
 * kernels also ask for the largest shared-memory carveout: the driver
 * otherwise sizes it for one block, and their blocks are meant to share a
 * multiprocessor. */
template <auto Kernel, bool SharedFirst = false> cudaError_t allow_smem(int device, unsigned bytes, int64_t optin)
{
    if (bytes <= kDefaultSmemLimit && !SharedFirst) return cudaSuccess;
    static std::atomic<uint64_t> done{0};
    static std::mutex mutex;
    static_assert(AWQ_MAX_DEVICES <= 64, "one bit per device");
    const uint64_t bit = device < AWQ_MAX_DEVICES ? uint64_t(1) << device : 0;
    if (bit && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mutex);
    if (bit && (done.load(std::memory_order_relaxed) & bit)) return cudaSuccess;
    /* the opt-in covers static and dynamic shared memory together */
    cudaFuncAttributes attr;
    cudaError_t e = clear_error(cudaFuncGetAttributes(&attr, reinterpret_cast<const void *>(Kernel)));
    if (e == cudaSuccess)
        e = clear_error(cudaFuncSetAttribute(reinterpret_cast<const void *>(Kernel),
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)(optin - (int64_t)attr.sharedSizeBytes)));
    if (e == cudaSuccess && SharedFirst)
        e = clear_error(cudaFuncSetAttribute(reinterpret_cast<const void *>(Kernel),
                                             cudaFuncAttributePreferredSharedMemoryCarveout,
                                             (int)cudaSharedmemCarveoutMaxShared));
    if (e == cudaSuccess && bit) done.fetch_or(bit, std::memory_order_release);
    return e;
}

/* Why: every kernel's launch ends the same way: the shared-memory opt-in,
 * then a cluster of `cluster` blocks along x (sm_90) or a plain launch. */
template <auto Kernel, bool SharedFirst = false, class... Args>
cudaError_t launch_with_smem(const LaunchShape &s, unsigned cluster, int device, const Device &d, cudaStream_t stream,
                             const Args &...a)
{
    const cudaError_t e = allow_smem<Kernel, SharedFirst>(device, s.smem, d.smem_optin);
    if (e != cudaSuccess) return e;
    return cluster > 1 ? launch_cluster<Kernel>(s, cluster, stream, a...) : launch<Kernel>(s, stream, a...);
}

/* A configuration with these launch fields (the others zero). */
awq_config config_of(int kernel, int block_size, int rows, int split)
{
    awq_config c;
    memset(&c, 0, sizeof c);
    c.kernel = kernel;
    c.block_size = block_size;
    c.rows = rows;
    c.split = split;
    return c;
}

/* ---- the MMA kernel: when it applies, and its launch ------------------- */

constexpr int kMmaRows[] = {1, 2, 4};

bool mma_rows_ok(int r) { return r == 1 || r == 2 || r == 4; }
bool mma_warps_ok(int s) { return s == 1 || s == 2 || s == 4 || s == kMmaMaxWarps; }
bool mma_split_ok(int s) { return s == 1 || s == 2 || s == 4 || s == kMmaMaxSplit; }

/* What the MMA kernel needs from the problem, whatever the configuration:
 * f16/bf16; every k16 step inside one group (G % 16 == 0, or one group);
 * x read as 4-byte pairs (K even, base 4-byte aligned); scales, bias and y
 * 16-byte aligned (N % 8 == 0 makes their rows so).
 * Anything else runs on the SIMT kernel (docs/KERNELS.md). */
bool mma_problem_ok(const awq_linear_problem *p)
{
    if (p->dtype != AWQ_F16 && p->dtype != AWQ_BF16) return false;
    if (p->K == 0) return aligned(p->y, 16) && (!p->bias || aligned(p->bias, 16));
    return p->K < kMmaMaxK && (p->G % mm::kStepK == 0 || p->G == p->K) && p->K % 2 == 0 && aligned(p->x, 4) &&
           aligned(p->scales, 16) &&
           aligned(p->y, 16) && (!p->bias || aligned(p->bias, 16));
}

int64_t mma_mrows(const awq_linear_problem *p, int rows) { return std::min<int64_t>(mm::kTileM * rows, p->M); }

/* Dynamic shared memory of one block: the S warps' partial tiles, when
 * there is anything to reduce. */
int64_t mma_smem(const awq_linear_problem *p, int warps, int rows, int split)
{
    if (warps == 1 && split == 1) return 0;
    return (int64_t)warps * mma_mrows(p, rows) * mm::kWarpCols * (int64_t)sizeof(float);
}

int64_t mma_colblocks(const awq_linear_problem *p) { return ceil_div(p->N / AWQ_COLS_PER_WORD, mm::kWarpWords); }

/* The configuration can run this problem on this device. */
bool mma_config_ok(const awq_linear_problem *p, const awq_config *c, const Device &d)
{
    const int warps = c->block_size / 32;
    if (c->block_size % 32 != 0 || !mma_warps_ok(warps) || !mma_rows_ok(c->rows) || !mma_split_ok(c->split))
        return false;
    if (!d.tensor_cores() || (c->split > 1 && !d.clusters())) return false;
    if (!mma_problem_ok(p)) return false;
    if (mma_smem(p, warps, c->rows, c->split) > d.smem_optin) return false;
    return mma_colblocks(p) * c->split <= 2147483647;
}

template <class T, int ROWS, bool KTAIL>
cudaError_t mma_launch_rows(const awq_linear_problem *p, const awq_config *c, const Device &d, cudaStream_t stream)
{
    MmaArgs a;
    static_cast<LinearOperands &>(a) = operands_of(p);
    a.M = p->M;
    a.N = p->N;
    a.W = p->N / AWQ_COLS_PER_WORD;
    a.K = (int)p->K;
    a.nsteps = (int)ceil_div(p->K, mm::kStepK);
    a.spg = p->G % mm::kStepK == 0 ? (int)std::min<int64_t>(p->G / mm::kStepK, kMmaMaxK) : std::max(a.nsteps, 1);
    a.mtiles = ceil_div(p->M, mm::kTileM * ROWS);
    a.mrows = mma_mrows(p, ROWS);
    a.split = c->split;
    const int warps = c->block_size / 32;
    LaunchShape s;
    s.grid = dim3((unsigned)(mma_colblocks(p) * c->split), (unsigned)std::min<int64_t>(a.mtiles, kMaxGridY), 1);
    s.block = dim3((unsigned)c->block_size, 1, 1);
    s.smem = (unsigned)mma_smem(p, warps, ROWS, c->split);
    return launch_with_smem<awq_mma_kernel<T, ROWS, KTAIL>>(s, (unsigned)c->split, p->device, d, stream, a);
}

template <class T, bool KTAIL>
cudaError_t mma_launch_tail(const awq_linear_problem *p, const awq_config *c, const Device &d, cudaStream_t stream)
{
    switch (c->rows) {
    case 1: return mma_launch_rows<T, 1, KTAIL>(p, c, d, stream);
    case 2: return mma_launch_rows<T, 2, KTAIL>(p, c, d, stream);
    default: return mma_launch_rows<T, 4, KTAIL>(p, c, d, stream);
    }
}

template <class T>
cudaError_t mma_launch_type(const awq_linear_problem *p, const awq_config *c, const Device &d, cudaStream_t stream)
{
    return p->K % mm::kStepK != 0 ? mma_launch_tail<T, true>(p, c, d, stream)
                                  : mma_launch_tail<T, false>(p, c, d, stream);
}

cudaError_t mma_launch(const awq_linear_problem *p, const awq_config *c, const Device &d, cudaStream_t stream)
{
    return p->dtype == AWQ_F16 ? mma_launch_type<F16T>(p, c, d, stream) : mma_launch_type<BF16T>(p, c, d, stream);
}

/* The MMA default.  Memory-bound small M wants the whole GPU streaming
 * qweight from the first microsecond: with D = 4 stages a warp keeps
 * 4 x 512 bytes of qweight in flight, so about 16 warps per SM (~32 KB a
 * SM) are needed; larger M (4 m16 tiles, ~2x the registers, 2 stages) is
 * closer to compute-bound and needs fewer.  Column blocks x M tiles rarely
 * give that many warps (1536 columns are 24 blocks), so K is sliced: first
 * into up to 4 warps of a block (an in-block reduction is cheap), then
 * across up to 8 blocks of a cluster on sm_90 (more SMs stream), then into
 * 8 warps; never into slices under kMinSliceSteps k16 steps (the reduction
 * would cost more than the slice), and never past 48 KB of shared memory
 * (no opt-in on the hot path).  Rows: 1 m16 tile up to M = 16, 2 up to 32,
 * 4 above (each weight fragment reused 4 times).  docs/KERNELS.md says what
 * to measure; the constants are first guesses until then. */
constexpr int kMinSliceSteps = 2;

awq_config mma_default(const awq_linear_problem *p, const Device &d)
{
    awq_config c = config_of(AWQ_KERNEL_MMA, 0, p->M <= 16 ? 1 : p->M <= 32 ? 2 : 4, 0);
    const int warps_per_sm = c.rows == 1 ? 16 : c.rows == 2 ? 12 : 8;
    const int64_t units = mma_colblocks(p) * ceil_div(std::max<int64_t>(p->M, 1), mm::kTileM * c.rows);
    const int64_t nsteps = ceil_div(p->K, mm::kStepK);
    const int64_t want = ceil_div((int64_t)d.sms * warps_per_sm, std::max<int64_t>(units, 1));
    const int64_t slices = std::max<int64_t>(1, std::min(want, nsteps / kMinSliceSteps));
    int warps = 1, split = 1;
    auto fits = [&](int w, int s) { return mma_smem(p, w, c.rows, s) <= kDefaultSmemLimit; };
    while ((int64_t)warps * split * 2 <= slices) {
        if (warps < 4 && fits(warps * 2, split)) warps *= 2;
        else if (d.clusters() && split < kMmaMaxSplit && fits(warps, split * 2)) split *= 2;
        else if (warps < kMmaMaxWarps && fits(warps * 2, split)) warps *= 2;
        else break;
    }
    c.block_size = 32 * warps;
    c.split = split;
    return c;
}

/* ---- the SIMT kernel ----------------------------------------------------- */

bool simt_rows_ok(int r) { return r == 1 || r == 2 || r == 4; }

int64_t simt_smem(int block, int rows, int split)
{
    if (split == 1) return 0;
    return (int64_t)(split - 1) * (block / split) * simt_pitch(rows) * (int64_t)sizeof(float);
}

bool simt_config_ok(const awq_linear_problem *p, const awq_config *c, const Device &d)
{
    if (!awq_block_size_valid(c->block_size) || c->block_size > kSimtMaxBlock || !simt_rows_ok(c->rows)) return false;
    if (!is_pow2(c->split) || c->split > AWQ_MAX_SPLIT || c->block_size % c->split != 0) return false;
    if (simt_smem(c->block_size, c->rows, c->split) > d.smem_optin) return false;
    return ceil_div(p->N / AWQ_COLS_PER_WORD, c->block_size / c->split) <= 2147483647;
}

template <class T, int ROWS>
cudaError_t simt_launch_rows(const awq_linear_problem *p, const awq_config *c, const Device &d, cudaStream_t stream)
{
    SimtArgs a;
    static_cast<LinearOperands &>(a) = operands_of(p);
    a.M = p->M;
    a.K = p->K;
    a.N = p->N;
    a.W = p->N / AWQ_COLS_PER_WORD;
    a.G = p->G;
    a.mchunks = ceil_div(p->M, ROWS);
    /* N % 8 == 0 keeps every 8-element run of a row on a 16-byte boundary when the base is. */
    a.vec = aligned(p->scales, 16) && aligned(p->y, 16) && (!p->bias || aligned(p->bias, 16));
    const int bdx = c->block_size / c->split;
    LaunchShape s;
    s.grid = dim3((unsigned)ceil_div(a.W, bdx), (unsigned)std::min<int64_t>(a.mchunks, kMaxGridY), 1);
    s.block = dim3((unsigned)bdx, (unsigned)c->split, 1);
    s.smem = (unsigned)simt_smem(c->block_size, ROWS, c->split);
    /* the split is the block's y (threads sharing a column), never a cluster */
    return launch_with_smem<awq_simt_kernel<T, ROWS>>(s, 1, p->device, d, stream, a);
}

template <class T>
cudaError_t simt_launch_type(const awq_linear_problem *p, const awq_config *c, const Device &d, cudaStream_t stream)
{
    switch (c->rows) {
    case 1: return simt_launch_rows<T, 1>(p, c, d, stream);
    case 2: return simt_launch_rows<T, 2>(p, c, d, stream);
    default: return simt_launch_rows<T, 4>(p, c, d, stream);
    }
}

cudaError_t simt_launch(const awq_linear_problem *p, const awq_config *c, const Device &d, cudaStream_t stream)
{
    switch (p->dtype) {
    case AWQ_F16: return simt_launch_type<F16T>(p, c, d, stream);
    case AWQ_BF16: return simt_launch_type<BF16T>(p, c, d, stream);
    default: return simt_launch_type<F32T>(p, c, d, stream);
    }
}

/* The SIMT default: 4 rows of x a thread from M = 3 (a chunk reads each
 * weight once for 4 rows), 256-thread blocks, and K split into as many
 * slices of the block (up to 8, each at least 64 rows of K) as it takes
 * for the word columns x M chunks to fill the device's resident threads. */
constexpr int kSimtBlock = 256;
constexpr int kSimtMaxSplit = 8;
constexpr int64_t kSimtMinSliceRows = 64;

awq_config simt_default(const awq_linear_problem *p, const Device &d)
{
    awq_config c = config_of(AWQ_KERNEL_SIMT, kSimtBlock, p->M >= 3 ? 4 : p->M == 2 ? 2 : 1, 0);
    const int64_t threads = (p->N / AWQ_COLS_PER_WORD) * ceil_div(std::max<int64_t>(p->M, 1), c.rows);
    const int64_t target = (int64_t)d.sms * d.threads_per_sm;
    int split = 1;
    while (split < kSimtMaxSplit && threads * split * 2 <= target && p->K / (split * 2) >= kSimtMinSliceRows)
        split *= 2;
    c.split = split;
    return c;
}

/* ---- the decode kernel ------------------------------------------------------ */

bool gemv_warps_ok(int w) { return w == 1 || w == 2 || w == 4 || w == gv::kMaxWarps; }
bool gemv_split_ok(int s) { return s == 1 || s == 2 || s == 4 || s == gv::kMaxSplit; }
bool gemv_ring_ok(int r) { return r == gv::kMinRing || r == gv::kMaxRing; }

/* What the decode kernel needs from the problem: f16/bf16, 1 <= M <= 32,
 * whole k16 steps inside whole groups (K % 16 == 0, G % 16 == 0), word
 * columns in fours (N % 32 == 0: 16-byte copies of qweight rows, 8-byte loads
 * of qzeros), qweight, x, scales, bias and y 16-byte aligned.  The rest runs
 * on the MMA or SIMT kernel. */
bool gemv_problem_ok(const awq_linear_problem *p)
{
    if (p->dtype != AWQ_F16 && p->dtype != AWQ_BF16) return false;
    if (p->M < 1 || p->M > gv::kMaxM || p->K <= 0 || p->K >= kMmaMaxK) return false;
    if (p->K % gv::kStepK != 0 || p->G % gv::kStepK != 0 || p->N % (4 * AWQ_COLS_PER_WORD) != 0) return false;
    return aligned(p->x, 16) && aligned(p->qweight, 16) && aligned(p->qzeros, 8) && aligned(p->scales, 16) &&
           aligned(p->y, 16) && (!p->bias || aligned(p->bias, 16));
}

int64_t gemv_strips(const awq_linear_problem *p) { return ceil_div(p->N / AWQ_COLS_PER_WORD, gv::kStripWords); }

bool gemv_config_ok(const awq_linear_problem *p, const awq_config *c, const Device &d)
{
    if (c->block_size % 32 != 0 || !gemv_warps_ok(c->block_size / 32) || !gemv_ring_ok(c->rows) ||
        !gemv_split_ok(c->split))
        return false;
    if (!d.tensor_cores() || (c->split > 1 && !d.clusters())) return false;
    if (gv::smem_bytes(c->block_size / 32, c->rows, gv::tiles_of(p->M)) > d.smem_optin) return false;
    return gemv_problem_ok(p) && gemv_strips(p) * c->split <= 2147483647;
}

template <class T, int Ring, int NT>
cudaError_t gemv_launch_ring(const awq_linear_problem *p, const awq_config *c, const Device &d, cudaStream_t stream)
{
    gv::Args a;
    static_cast<LinearOperands &>(a) = operands_of(p);
    a.K = p->K;
    a.N = p->N;
    a.W = p->N / AWQ_COLS_PER_WORD;
    a.M = (int)p->M;
    a.nsteps = (int)(p->K / gv::kStepK);
    a.spg = (int)(p->G / gv::kStepK);
    a.split = c->split;
    LaunchShape s;
    s.grid = dim3((unsigned)(gemv_strips(p) * c->split), 1, 1);
    s.block = dim3((unsigned)c->block_size, 1, 1);
    s.smem = (unsigned)gv::smem_bytes(c->block_size / 32, Ring, NT);
    return launch_with_smem<gv::kernel<T, Ring, NT>>(s, (unsigned)c->split, p->device, d, stream, a);
}

template <class T, int NT>
cudaError_t gemv_launch_tiles(const awq_linear_problem *p, const awq_config *c, const Device &d, cudaStream_t stream)
{
    return c->rows == gv::kMaxRing ? gemv_launch_ring<T, gv::kMaxRing, NT>(p, c, d, stream)
                                   : gemv_launch_ring<T, gv::kMinRing, NT>(p, c, d, stream);
}

template <class T>
cudaError_t gemv_launch_type(const awq_linear_problem *p, const awq_config *c, const Device &d, cudaStream_t stream)
{
    static_assert(gv::kMaxTiles == 4, "one, two or four n8 tiles of x");
    switch (gv::tiles_of(p->M)) {
    case 1: return gemv_launch_tiles<T, 1>(p, c, d, stream);
    case 2: return gemv_launch_tiles<T, 2>(p, c, d, stream);
    default: return gemv_launch_tiles<T, 4>(p, c, d, stream);
    }
}

cudaError_t gemv_launch(const awq_linear_problem *p, const awq_config *c, const Device &d, cudaStream_t stream)
{
    return p->dtype == AWQ_F16 ? gemv_launch_type<F16T>(p, c, d, stream) : gemv_launch_type<BF16T>(p, c, d, stream);
}

/* The decode default, from a sweep on the H200 (docs/KERNELS.md): K slices
 * of each strip until strips x slices reach about 6 warps a SM (at least 8
 * slices, at most 64, each at least 4 k16 steps); the slices go first into
 * the warps of a block, and from 32 slices on 8 blocks of a cluster share a
 * strip (more SMs stream each strip).  Without clusters, one block a strip. */
constexpr int kGemvWarpsPerSm = 6;
constexpr int kGemvMinSliceSteps = 4;

awq_config gemv_default(const awq_linear_problem *p, const Device &d)
{
    const int64_t strips = gemv_strips(p);
    const int64_t nsteps = p->K / gv::kStepK;
    const int64_t max_slices = d.clusters() ? (int64_t)gv::kMaxWarps * gv::kMaxSplit : gv::kMaxWarps;
    int64_t slices = gv::kMaxWarps;
    while (slices < max_slices && strips * slices < (int64_t)kGemvWarpsPerSm * d.sms) slices *= 2;
    while (slices > 1 && slices * kGemvMinSliceSteps > nsteps) slices /= 2;
    const int split = slices >= 32 ? gv::kMaxSplit : (int)std::max<int64_t>(1, slices / gv::kMaxWarps);
    return config_of(AWQ_KERNEL_GEMV, 32 * (int)(slices / split), gv::kMinRing, split);
}

/* ---- the warpgroup kernel ------------------------------------------------ */

/* What the warpgroup kernel needs from the problem: f16/bf16, whole stages
 * of 64 k inside whole groups (K % 64 == 0, G % 64 == 0), word columns in
 * fours (N % 32 == 0: 16-byte copies), every array 16-byte aligned.  The
 * rest runs on the other kernels. */
bool wgmma_problem_ok(const awq_linear_problem *p)
{
    if (p->dtype != AWQ_F16 && p->dtype != AWQ_BF16) return false;
    if (p->M < 1 || p->K <= 0 || p->K >= kMmaMaxK) return false;
    if (p->K % wg::kStageK != 0 || p->G % wg::kStageK != 0 || p->N % (4 * AWQ_COLS_PER_WORD) != 0) return false;
    return aligned(p->x, 16) && aligned(p->qweight, 16) && aligned(p->qzeros, 16) && aligned(p->scales, 16) &&
           aligned(p->y, 16) && (!p->bias || aligned(p->bias, 16));
}

/* Warpgroups of a configuration's block. */
int wgmma_groups(const awq_config *c) { return c->block_size / wg::kThreads; }
bool wgmma_block_ok(int block_size)
{
    return block_size == wg::kThreads || block_size == wg::kMaxGroups * wg::kThreads;
}

int64_t wgmma_colblocks(const awq_linear_problem *p, int groups)
{
    return ceil_div(p->N / AWQ_COLS_PER_WORD, (int64_t)wg::kBlockWords * groups);
}

/* A configuration's rows counts 16-row groups of x: wgmma's N is 16 rows. */
constexpr int kWgmmaRowGroup = 16;
int wgmma_nt(const awq_config *c) { return kWgmmaRowGroup * c->rows; }
bool wgmma_rows_ok(int r) { return r == 2 || r == 4 || r == 8; }
static_assert(128 / kWgmmaRowGroup <= AWQ_MAX_ROWS, "every rows value of the kernel fits the autotune cache");

bool wgmma_config_ok(const awq_linear_problem *p, const awq_config *c, const Device &d)
{
    if (!wgmma_block_ok(c->block_size) || !wgmma_rows_ok(c->rows) || !mma_split_ok(c->split)) return false;
    if (!d.warpgroups() || !wgmma_problem_ok(p)) return false;
    if (wg::smem_bytes(wgmma_nt(c), wgmma_groups(c)) > d.smem_optin) return false;
    if (c->split > p->K / wg::kStageK) return false; /* every block of a cluster has a stage */
    return wgmma_colblocks(p, wgmma_groups(c)) * c->split <= 2147483647;
}

template <class T, int NT, int H>
cudaError_t wgmma_launch_rows(const awq_linear_problem *p, const awq_config *c, const Device &d, cudaStream_t stream)
{
    wg::Args a;
    static_cast<LinearOperands &>(a) = operands_of(p);
    a.M = p->M;
    a.N = p->N;
    a.W = p->N / AWQ_COLS_PER_WORD;
    a.mtiles = ceil_div(p->M, NT);
    a.K = (int)p->K;
    a.nstages = (int)(p->K / wg::kStageK);
    a.spg = (int)(p->G / wg::kStageK);
    a.split = c->split;
    LaunchShape s;
    s.grid = dim3((unsigned)(wgmma_colblocks(p, H) * c->split), (unsigned)std::min<int64_t>(a.mtiles, kMaxGridY), 1);
    s.block = dim3((unsigned)(wg::kThreads * H), 1, 1);
    s.smem = (unsigned)wg::smem_bytes(NT, H);
    return launch_with_smem<wg::kernel<T, NT, H>, true>(s, (unsigned)c->split, p->device, d, stream, a);
}

template <class T, int H>
cudaError_t wgmma_launch_groups(const awq_linear_problem *p, const awq_config *c, const Device &d, cudaStream_t stream)
{
    switch (wgmma_nt(c)) {
    case 32: return wgmma_launch_rows<T, 32, H>(p, c, d, stream);
    case 64: return wgmma_launch_rows<T, 64, H>(p, c, d, stream);
    default: return wgmma_launch_rows<T, 128, H>(p, c, d, stream);
    }
}

template <class T>
cudaError_t wgmma_launch_type(const awq_linear_problem *p, const awq_config *c, const Device &d, cudaStream_t stream)
{
    return wgmma_groups(c) == 1 ? wgmma_launch_groups<T, 1>(p, c, d, stream)
                                : wgmma_launch_groups<T, wg::kMaxGroups>(p, c, d, stream);
}

cudaError_t wgmma_launch(const awq_linear_problem *p, const awq_config *c, const Device &d, cudaStream_t stream)
{
    return p->dtype == AWQ_F16 ? wgmma_launch_type<F16T>(p, c, d, stream) : wgmma_launch_type<BF16T>(p, c, d, stream);
}

/* The warpgroup default: one warpgroup a block, the smallest tile of rows
 * that holds M (128 above 64 rows), and K split across a cluster while
 * column blocks x row tiles x split stay under 90% of the multiprocessors,
 * each slice at least kWgmmaMinSliceStages stages.  (The tuner's picks at
 * M = 64 on the H200 benchmark's layers: about one block a SM; splitting
 * further, to two blocks a SM, cost up to a third more time.) */
constexpr int kWgmmaMinSliceStages = 4;

awq_config wgmma_default(const awq_linear_problem *p, const Device &d)
{
    const int nt = p->M <= 32 ? 32 : p->M <= 64 ? 64 : 128;
    const int64_t units = wgmma_colblocks(p, 1) * ceil_div(std::max<int64_t>(p->M, 1), nt);
    const int64_t nstages = p->K / wg::kStageK;
    int split = 1;
    while (split < wg::kMaxSplit && 10 * units * split < 9 * (int64_t)d.sms &&
           nstages / (split * 2) >= kWgmmaMinSliceStages)
        split *= 2;
    return config_of(AWQ_KERNEL_WGMMA, wg::kThreads, nt / kWgmmaRowGroup, split);
}

/* ---- configuration, dispatch ------------------------------------------ */

/* The configuration can run this problem on this device, for its kernel. */
bool config_ok(const awq_linear_problem *p, const awq_config *c, const Device &d)
{
    switch (c->kernel) {
    case AWQ_KERNEL_GEMV: return gemv_config_ok(p, c, d);
    case AWQ_KERNEL_WGMMA: return wgmma_config_ok(p, c, d);
    case AWQ_KERNEL_MMA: return mma_config_ok(p, c, d);
    case AWQ_KERNEL_SIMT: return simt_config_ok(p, c, d);
    default: return false;
    }
}

/* The fastest fused kernel that can run the problem, with its defaults: the
 * decode kernel up to 16 rows; from 17 it is a tuning candidate only (four
 * tiles of x win on the large layers, the MMA kernel on the small ones);
 * from 33 rows the warpgroup kernel where it runs (H100, H200), else MMA. */
constexpr int64_t kGemvDefaultMaxM = 16;
constexpr int64_t kWgmmaDefaultMinM = 33;

awq_config default_config(const awq_linear_problem *p, const Device &d)
{
    const awq_config g = gemv_default(p, d);
    if (p->M <= kGemvDefaultMaxM && gemv_config_ok(p, &g, d)) return g;
    const awq_config w = wgmma_default(p, d);
    if (p->M >= kWgmmaDefaultMinM && wgmma_config_ok(p, &w, d)) return w;
    awq_config m = mma_default(p, d);
    if (mma_config_ok(p, &m, d)) return m;
    return simt_default(p, d);
}

/* Validates *in and fills its zero fields; AWQ_ERR_CONFIG when the
 * configuration cannot run the problem on its device. */
awq_status resolve_config(const awq_linear_problem *p, const awq_config *in, const Device &d, awq_config *out)
{
    awq_config c;
    memset(&c, 0, sizeof c);
    if (in) c = *in;
    if (c.kernel == AWQ_KERNEL_AUTO) {
        const awq_config def = default_config(p, d);
        c.kernel = def.kernel;
    }
    if (c.kernel != AWQ_KERNEL_GEMV && c.kernel != AWQ_KERNEL_WGMMA && c.kernel != AWQ_KERNEL_MMA &&
        c.kernel != AWQ_KERNEL_SIMT)
        return AWQ_ERR_CONFIG;
    if (c.block_size < 0 || c.rows < 0 || c.split < 0) return AWQ_ERR_CONFIG;
    const awq_config def = c.kernel == AWQ_KERNEL_GEMV    ? gemv_default(p, d)
                           : c.kernel == AWQ_KERNEL_WGMMA ? wgmma_default(p, d)
                           : c.kernel == AWQ_KERNEL_MMA   ? mma_default(p, d)
                                                          : simt_default(p, d);
    if (c.block_size == 0) c.block_size = def.block_size;
    if (c.rows == 0) c.rows = def.rows;
    if (c.split == 0) c.split = def.split;
    if (!config_ok(p, &c, d)) return AWQ_ERR_CONFIG;
    *out = c;
    return AWQ_OK;
}

cudaError_t launch_linear(const awq_linear_problem *p, const awq_config *c, const Device &d, cudaStream_t stream)
{
    if (nothing_to_do(p)) return cudaSuccess;
    switch (c->kernel) {
    case AWQ_KERNEL_GEMV: return gemv_launch(p, c, d, stream);
    case AWQ_KERNEL_WGMMA: return wgmma_launch(p, c, d, stream);
    case AWQ_KERNEL_MMA: return mma_launch(p, c, d, stream);
    default: return simt_launch(p, c, d, stream);
    }
}

/* A launch the device refuses for this configuration -- threads, registers,
 * shared memory, a cluster that cannot be co-scheduled -- enqueues nothing
 * and leaves the context usable: it is a configuration that does not apply
 * (the tuner skips it), not a CUDA failure. */
awq_status linear_status(cudaError_t e)
{
    if (e == cudaErrorInvalidConfiguration || e == cudaErrorLaunchOutOfResources || e == cudaErrorInvalidClusterSize)
        return AWQ_ERR_CONFIG;
    return status_of(e);
}

/* Validation shared by linear and time: the problem, the device's facts and the resolved configuration. */
awq_status prepare(const awq_linear_problem *p, const awq_config *in, Device *d, awq_config *c, int *detail)
{
    const awq_status s = check_problem(p);
    if (s != AWQ_OK) return s;
    const cudaError_t e = device_of(p->device, d);
    set_detail(detail, (int)e);
    if (e != cudaSuccess) return status_of(e);
    return resolve_config(p, in, *d, c);
}

/* ---- the prepared-layout kernel (cuda/linear_prepared.cuh) --------------- */

/* What it needs from the problem: f16/bf16, N % 128 == 0, K a multiple of
 * 128 below 2^30 (K/64 stages, an even number a block), G = 64 x 2^j
 * dividing K, x, the layout, y and bias 16-byte aligned -- the C entry checks
 * these with clear messages; this is the backend's own guard. */
bool prepared_problem_ok(const awq_prepared_problem *p)
{
    if (p->dtype != AWQ_F16 && p->dtype != AWQ_BF16) return false;
    if (p->M < 1 || p->N < prep::kCols || p->N % prep::kCols || p->K < 2 * prep::kStageK ||
        p->K % (2 * prep::kStageK) || p->K >= (int64_t(1) << 30) || p->G < prep::kStageK || p->K % p->G)
        return false;
    if (!is_pow2(p->G / prep::kStageK) || p->G % prep::kStageK) return false;
    return aligned(p->x, 16) && aligned(p->words, 16) && aligned(p->operands, 16) && aligned(p->y, 16) &&
           (!p->bias || aligned(p->bias, 16));
}

/* How a problem runs: rows of x a block (nt), and the first `head` tiles
 * with K over `split` blocks of a cluster, the rest (the tail) over 2. */
struct PreparedPlan {
    int nt, split;
    int64_t tiles, head;
};

/* The plan of least rounds x (stages a block x the time of a stage + a
 * split's reduction), where a round is one block on every multiprocessor, a
 * stage of 128 rows costs about 0.8 of one of 256 (the products halve; the
 * weights' loads and dequantization, and the warps' other work, stay) and
 * the reduction about 8 stages of 256 rows.  Fitted to every (256 | 128) x
 * (1 | 2) on the seven Llama-3-8B projections at M = 512 on an H100, it picks
 * the fastest on each (docs/KERNELS.md).  Besides one split for every tile,
 * a plan may run whole rounds without a split and the last, partial round's
 * tiles (at most half the multiprocessors) over 2 blocks each: a second
 * launch, so that a tail of 3.39 rounds (gate/up as one layer at 512 rows)
 * costs 3 rounds and a short one instead of 4. */
PreparedPlan prepared_choice(const awq_prepared_problem *p, const Device &d)
{
    PreparedPlan plan = {256, 1, 0, 0};
    double best = 0.0;
    const int64_t stages = p->K / prep::kStageK;
    auto consider = [&](int nt, int split, int64_t tiles, int64_t head, double cost) {
        if (best == 0.0 || cost < best - 1e-9) {
            best = cost;
            plan = {nt, split, tiles, head};
        }
    };
    for (int nt : {256, 128}) {
        const double stage = nt == 256 ? 1.0 : 0.8;
        const int64_t tiles = ceil_div(p->M, nt) * (p->N / prep::kCols);
        for (int split : {1, 2})
            if (stages % (prep::kAhead * split) == 0)
                consider(nt, split, tiles, tiles,
                         (double)ceil_div(tiles * split, d.sms) *
                             ((double)(stages / split) * stage + (split > 1 ? 8.0 : 0.0)));
        const int64_t rounds = tiles / d.sms, rest = tiles - rounds * d.sms;
        if (rounds > 0 && rest > 0 && 2 * rest <= d.sms && stages % (prep::kAhead * 2) == 0)
            consider(nt, 1, tiles, rounds * d.sms,
                     (double)rounds * (double)stages * stage + (double)(stages / 2) * stage + 8.0);
    }
    return plan;
}

template <class T, int NT>
cudaError_t prepared_launch_tile(const awq_prepared_problem *p, int split, int64_t tile0, int64_t tiles, const Device &d,
                                 cudaStream_t stream)
{
    const sm90::EncodeTiled encode = sm90::tensor_map_encoder();
    if (!encode) return cudaErrorNotSupported;
    CUtensorMap tx;
    const CUtensorMapDataType xt =
        std::is_same<T, F16T>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    if (sm90::tensor_map(encode, &tx, xt, p->x, p->M, p->K, 2, prep::kStageK, NT)) return cudaErrorInvalidValue;
    prep::Args a;
    a.words = static_cast<const uint4 *>(p->words);
    a.operands = static_cast<const uint4 *>(p->operands);
    a.bias = static_cast<const char *>(p->bias);
    a.y = static_cast<char *>(p->y);
    a.M = p->M;
    a.N = p->N;
    a.tile0 = tile0;
    a.K = (int)p->K;
    a.split = split;
    a.gshift = 0;
    while ((int64_t(prep::kStageK) << a.gshift) < p->G) ++a.gshift;
    LaunchShape s;
    const int64_t blocks = tiles * split;
    if (blocks > 2147483647) return cudaErrorInvalidConfiguration;
    s.grid = dim3((unsigned)blocks, 1, 1);
    s.block = dim3(prep::kThreads, 1, 1);
    s.smem = prep::Tile<NT>::kSmem;
    return launch_with_smem<prep::prepared_kernel<T, NT>>(s, (unsigned)split, p->device, d, stream, a, tx);
}

template <class T>
cudaError_t prepared_launch_type(const awq_prepared_problem *p, const PreparedPlan &plan, const Device &d,
                                 cudaStream_t stream)
{
    auto part = [&](int split, int64_t tile0, int64_t tiles) {
        return plan.nt == 256 ? prepared_launch_tile<T, 256>(p, split, tile0, tiles, d, stream)
                              : prepared_launch_tile<T, 128>(p, split, tile0, tiles, d, stream);
    };
    cudaError_t e = part(plan.split, 0, plan.head);
    if (e == cudaSuccess && plan.head < plan.tiles) e = part(2, plan.head, plan.tiles - plan.head);
    return e;
}
} // namespace

extern "C" {

awq_status awq_cuda_linear(const awq_linear_problem *p, const awq_config *c, int *detail)
{
    set_detail(detail, 0);
    Device d;
    awq_config rc;
    const awq_status s = prepare(p, c, &d, &rc, detail);
    if (s != AWQ_OK || nothing_to_do(p)) return s;
    DeviceScope scope;
    cudaError_t e = scope.enter(p->device);
    if (e == cudaSuccess) e = clear_error(launch_linear(p, &rc, d, static_cast<cudaStream_t>(p->stream)));
    set_detail(detail, (int)e);
    return linear_status(e);
}

int awq_cuda_prepared_supported(int device)
{
    Device d;
    return device_of(device, &d) == cudaSuccess && d.warpgroups() && d.smem_optin >= prep::Tile<256>::kSmem;
}

awq_status awq_cuda_linear_prepared(const awq_prepared_problem *p, int *detail)
{
    set_detail(detail, 0);
    if (!p || !prepared_problem_ok(p)) return AWQ_ERR_CONFIG;
    Device d;
    cudaError_t e = device_of(p->device, &d);
    if (e != cudaSuccess) {
        set_detail(detail, (int)e);
        return status_of(e);
    }
    if (!d.warpgroups() || d.smem_optin < prep::Tile<256>::kSmem) return AWQ_ERR_CONFIG;
    const PreparedPlan plan = prepared_choice(p, d);
    DeviceScope scope;
    e = scope.enter(p->device);
    if (e == cudaSuccess) {
        const cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
        e = clear_error(p->dtype == AWQ_F16 ? prepared_launch_type<F16T>(p, plan, d, stream)
                                            : prepared_launch_type<BF16T>(p, plan, d, stream));
    }
    set_detail(detail, (int)e);
    return linear_status(e);
}

awq_status awq_cuda_linear_default(const awq_linear_problem *p, awq_config *c, int *detail)
{
    set_detail(detail, 0);
    if (!c) return AWQ_ERR_CONFIG;
    memset(c, 0, sizeof *c);
    const awq_status s = check_problem(p);
    if (s != AWQ_OK) return s;
    Device d;
    const cudaError_t e = device_of(p->device, &d);
    set_detail(detail, (int)e);
    if (e != cudaSuccess) return status_of(e);
    *c = default_config(p, d);
    return AWQ_OK;
}

int awq_cuda_linear_candidates(const awq_linear_problem *p, awq_config *configs, int cap)
{
    Device d;
    if (!configs || cap <= 0 || check_problem(p) != AWQ_OK || device_of(p->device, &d) != cudaSuccess) return 0;
    int n = 0;
    auto add = [&](const awq_config &c) {
        if (n >= cap || !config_ok(p, &c, d)) return;
        for (int i = 0; i < n; ++i)
            if (configs[i].kernel == c.kernel && configs[i].block_size == c.block_size && configs[i].rows == c.rows &&
                configs[i].split == c.split)
                return;
        configs[n++] = c;
    };
    add(default_config(p, d)); /* the default first: it survives a small cap */

    const int64_t nsteps = ceil_div(p->K, mm::kStepK);
    if (gemv_problem_ok(p) && d.tensor_cores()) {
        /* warps x cluster blocks a strip, around the default's slices */
        static const int kGemvSlices[][2] = {{8, 1}, {4, 2}, {8, 2}, {4, 4}, {8, 4}, {4, 8}, {8, 8}, {2, 8}};
        for (const auto &ws : kGemvSlices)
            if ((int64_t)ws[0] * ws[1] * kGemvMinSliceSteps <= nsteps)
                for (int ring : {gv::kMinRing, gv::kMaxRing}) add(config_of(AWQ_KERNEL_GEMV, 32 * ws[0], ring, ws[1]));
    }
    if (wgmma_problem_ok(p) && d.warpgroups() && p->M > gv::kTileM) {
        /* one or two warpgroups, every tile of rows that M fills at least half of, every split with a
         * stage a block */
        const int64_t nstages = p->K / wg::kStageK;
        for (int groups = 1; groups <= wg::kMaxGroups; ++groups)
            for (int nt : {32, 64, 128})
                if (nt == 32 || p->M > nt / 2)
                    for (int split : {1, 2, 4, 8})
                        if (split <= nstages)
                            add(config_of(AWQ_KERNEL_WGMMA, wg::kThreads * groups, nt / kWgmmaRowGroup, split));
    }
    if (mma_problem_ok(p) && d.tensor_cores()) {
        /* rows: the default's and the next smaller one (more M tiles, fewer registers) */
        const int rows_def = mma_default(p, d).rows;
        static const int kSlices[][2] = {{1, 1}, {2, 1}, {4, 1}, {8, 1}, {2, 2}, {4, 2},
                                         {4, 4}, {8, 2}, {8, 4}, {4, 8}, {8, 8}};
        for (int rows : kMmaRows) {
            if (rows != rows_def && rows != rows_def / 2) continue;
            for (const auto &ws : kSlices)
                if ((int64_t)ws[0] * ws[1] <= std::max<int64_t>(nsteps, 1)) add(config_of(AWQ_KERNEL_MMA, 32 * ws[0], rows, ws[1]));
        }
    }
    /* SIMT: every problem (float32, odd G, misalignment, old GPUs); a few
     * alternatives where it is the only kernel, the default where it may
     * race the tensor cores (M <= 4). */
    const awq_config sd = simt_default(p, d);
    if (p->M <= 4 || !mma_problem_ok(p) || !d.tensor_cores()) add(sd);
    if (!mma_problem_ok(p) || !d.tensor_cores()) {
        static const int kSimtBlocks[] = {128, 256};
        static const int kSimtSplits[] = {1, 2, 4, 8};
        for (int block : kSimtBlocks)
            for (int split : kSimtSplits) add(config_of(AWQ_KERNEL_SIMT, block, sd.rows, split));
    }
    return n;
}

awq_status awq_cuda_linear_time(const awq_linear_problem *p, const awq_config *c, const awq_cuda_flush *flush,
                                int warmup, int iters, float *ms, int *detail)
{
    set_detail(detail, 0);
    if (ms) *ms = 0.0f;
    if (iters < 1 || iters > kMaxTimedRuns || warmup < 0) return AWQ_ERR_CONFIG;
    Device d;
    awq_config rc;
    const awq_status s = prepare(p, c, &d, &rc, detail);
    if (s != AWQ_OK) return s;
    const cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
    float t = 0.0f;
    const cudaError_t e =
        time_launches(p->device, stream, flush, warmup, iters, [&] { return launch_linear(p, &rc, d, stream); }, &t);
    set_detail(detail, (int)e);
    if (e != cudaSuccess) return linear_status(e);
    if (ms) *ms = t;
    return AWQ_OK;
}

} /* extern "C" */
