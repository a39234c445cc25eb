/*
 * cuda/linear_gemv.cuh -- the decode kernel of the fused linear
 * (AWQ_KERNEL_GEMV): y = x @ W + bias for 1 <= M <= 32 rows of x, W never
 * written to memory.  Tensor cores (mma.sync m16n8k16, f16/bf16, sm_80+);
 * included by cuda/linear.cu only.  Design notes: docs/KERNELS.md, "The
 * decode kernel (gemv)".
 *
 * The roles of the operands are the transpose of the MMA kernel's: the
 * dequantized weights are the A operand (16 output columns x 16 k) and x is
 * B (16 k x 8 rows of x, the rows past M zero), so M <= 8 wastes no
 * tensor-core work on an m16 tile of x.  M = 9..16 takes two such n8 tiles
 * and M = 17..32 four: each dequantized A fragment feeds NT mma (template
 * parameter NT).
 *
 * ---- the mapping -------------------------------------------------------------
 * Lane t has groupID g = t / 4 and threadID_in_group i = t % 4 (PTX ISA).  A
 * warp owns a strip of 16 consecutive word columns (128 outputs): lane group
 * g takes the 2 words cw = strip + 2g, cw + 1 of the rows
 *
 *     k0 + 2i, k0 + 2i + 1, k0 + 2i + 8, k0 + 2i + 9         (one k16 step)
 *
 * from the shared-memory stage its warp copied (each row's 64 bytes of the
 * strip in four 16-byte copies).  These are the k of the ISA's A fragment
 * for threadID_in_group i (registers 0/1: k = 2i, 2i+1; 2/3: k = 2i+8, 2i+9),
 * so B is x in its own order: b0 = x[g][k0+2i .. 2i+1], b1 = x[g][k0+8+2i ..].
 *
 * Byte b of the words of rows (k, k+1) holds nibbles 2b and 2b+1 of each; one
 * byte permute puts row k's byte in byte 0 and row k+1's in byte 2, and a mask
 * then gives both halves of an A register at once: nibble 2b (mask
 * 0x000F000F) or nibble 2b+1 (0x00F000F0) of the two rows.  The A tile of mma
 * (v, b) -- word v of the lane, byte b -- has row g = the output column of
 * nibble 2b of word cw + v, row g + 8 = that of nibble 2b + 1; accumulator e
 * of that mma is row 2i + (e & 1) of x at the column of nibble 2b + (e >> 1).
 *
 * ---- exact W in the dtype's own x2 arithmetic ---------------------------------
 * OR-ing a nibble q into the mantissa of 1024 (f16 0x6400; bf16 128, 0x4300)
 * gives base + q exactly; base + z likewise, once per group.  Then
 *   q - z = (base + q) - (base + z)        exact: small integers
 *   W     = (q - z) * s                    one rounding, to nearest even
 * -- the dequantize kernels' bits.  f16 reads the high nibble in place: 1024 +
 * 16q times 1/16 plus -(64 + z) is q - z in one fused multiply-add (exact: the
 * exact result is a small integer).  bf16's 7-bit mantissa has no room for
 * 16q: its high nibble is shifted down first.
 *
 * ---- pipeline, K slices and the reduction -------------------------------------
 * Each warp streams its k16 steps through a ring of Ring stages (4 or 8, the
 * configuration's `rows`) in shared memory filled by cp.async: per stage its
 * strip's 16 rows x 64 bytes and 16 k of x, in 16-byte copies shared by the
 * lanes (a warp barrier per step), Ring - 1 steps of loads in flight without
 * holding registers.  The warps of a block, and the blocks of a cluster (sm_90),
 * share one strip and take contiguous slices of its steps: slice
 * rank * warps + warp.  The warps' partial sums meet in shared memory (each
 * in its own, drained ring) and are added in warp order; the blocks' sums
 * across the cluster in rank order through distributed shared memory.  Every
 * sum has a fixed order: the result is deterministic.
 */
#ifndef AWQ_CUDA_LINEAR_GEMV_CUH
#define AWQ_CUDA_LINEAR_GEMV_CUH

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/layout.cuh"
#include "cuda/linear_ops.cuh"

namespace awq_cu {
namespace gemv {

constexpr int kTileM = 8;        /* rows of x an mma takes: the n8 side of mma.m16n8k16 */
constexpr int kMaxTiles = 4;     /* n8 tiles of x a kernel takes (the template's NT: 1, 2 or 4) */
constexpr int kMaxM = kTileM * kMaxTiles;
constexpr int kStepK = 16;       /* k of one mma */
constexpr int kGroups = 8;       /* lane groups of a warp, side by side along the strip */
constexpr int kLaneWords = 2;    /* words of a row a lane takes (one 8-byte fragment load) */
constexpr int kStripWords = kGroups * kLaneWords;                 /* 16 */
constexpr int kStripCols = kStripWords * AWQ_COLS_PER_WORD;       /* 128 outputs */
constexpr int kMaxWarps = 8;     /* K slices of a block */
constexpr int kMaxThreads = 32 * kMaxWarps;
constexpr int kMaxSplit = 8;     /* blocks of a cluster: the portable limit */
/* Ring stages of a warp (the configuration's `rows`): Ring - 1 steps of
 * copies in flight. */
constexpr int kMinRing = 4;
constexpr int kMaxRing = 8;
/* One stage of a kernel for nt n8 tiles: the strip's 16 rows x 64 bytes,
 * then 16 k of the 8 nt rows of x. */
__host__ __device__ constexpr int stage_bytes(int nt) { return 16 * kStripWords * 4 + nt * kTileM * kStepK * 2; }
/* A warp's ring, later its partial sums ([8 nt][128] floats). */
__host__ __device__ constexpr int warp_smem(int ring, int nt)
{
    return ring * stage_bytes(nt) > nt * kTileM * kStripCols * 4 ? ring * stage_bytes(nt)
                                                                  : nt * kTileM * kStripCols * 4;
}

/* Dynamic shared memory of a block of `warps` warps. */
__host__ __device__ constexpr int smem_bytes(int warps, int ring, int nt) { return warps * warp_smem(ring, nt); }

/* The n8 tiles of x a problem of M rows needs. */
__host__ __device__ constexpr int tiles_of(int64_t M) { return M > 2 * kTileM ? 4 : M > kTileM ? 2 : 1; }

/* Output column, inside its word, of nibble p (the inverse of AWQ_NIBBLE). */
using gemv_map::nibble_col;
static_assert(nibble_col(AWQ_NIBBLE(1)) == 1 && nibble_col(AWQ_NIBBLE(2)) == 2 && nibble_col(AWQ_NIBBLE(7)) == 7,
              "nibble_col inverts AWQ_NIBBLE");

struct Args : LinearOperands {
    int64_t K, N, W; /* W = N / 8 word columns, even */
    int M;           /* 1 .. 8 NT */
    int nsteps;      /* K / 16 */
    int spg;         /* k16 steps per group: G / 16 */
    int split;       /* blocks per cluster */
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

constexpr uint32_t kF16Sixteenth = 0x2C002C00u; /* 1/16 in both halves */
constexpr uint32_t kF16Base960 = 0x63806380u;   /* 960 = 1024 - 64 in both halves */

/* What one k16 step of a lane holds once its stage has landed. */
template <int NT> struct Step {
    uint32_t w[4][kLaneWords]; /* rows k0 + 2i, +1, +8, +9 of words cw, cw + 1 */
    uint32_t b[NT][2];         /* B registers of tile t: x[8t + g][k0 + 2i ..], x[8t + g][k0 + 8 + 2i ..] */
};

/* A group's zero and scale pairs for the lane's 16 columns, by word and nibble. */
struct Group {
    uint32_t z[kLaneWords][8]; /* even nibble: base + z; odd: f16 -(64 + z), bf16 base + z */
    uint32_t s[kLaneWords][8]; /* s in both halves */
};

/* A group's raw zero words and scales (8 per word), loaded a group ahead. */
struct RawGroup {
    uint2 z;
    uint4 s[kLaneWords];
};

__device__ __forceinline__ void load_group(RawGroup &r, const uint32_t *zp, const char *sp)
{
    r.z = __ldg(reinterpret_cast<const uint2 *>(zp));
#pragma unroll
    for (int v = 0; v < kLaneWords; ++v) r.s[v] = __ldg(reinterpret_cast<const uint4 *>(sp) + v);
}

/* Why: the zero operand of nibble p of a zero word, as dequant_pairs takes
 * it: base + z in both halves, or for an odd nibble of f16 -(64 + z). */
template <class T> __device__ __forceinline__ uint32_t zero_operand(uint32_t zword, int p)
{
    const uint32_t zp = mma_map::zero_pair(zword, p) | PairMagic<T>::kValue;
    if constexpr (std::is_same<T, F16T>::value)
        if (p & 1) return half2_bits(__hsub2_rn(as_half2(kF16Base960), as_half2(zp)));
    return zp;
}

template <class T> __device__ __forceinline__ void decode_group(Group &gs, const RawGroup &r)
{
    const uint32_t zw[kLaneWords] = {r.z.x, r.z.y};
#pragma unroll
    for (int v = 0; v < kLaneWords; ++v) {
        const uint32_t sw[4] = {r.s[v].x, r.s[v].y, r.s[v].z, r.s[v].w};
#pragma unroll
        for (int p = 0; p < 8; ++p) {
            const int c = nibble_col(p);
            gs.z[v][p] = zero_operand<T>(zw[v], p);
            gs.s[v][p] = mma_map::scale_pair(sw[c >> 1], c);
        }
    }
}

/* Why: the two A registers of one row pair from r, its words' byte b
 * permuted into bytes 0 (row k) and 2 (row k + 1): the exact W of nibble
 * 2b (even) and 2b + 1 (odd) of both rows; zero operands from zero_operand. */
template <class T>
__device__ __forceinline__ void dequant_pairs(uint32_t r, uint32_t ze, uint32_t zo, uint32_t se, uint32_t so,
                                              uint32_t &even, uint32_t &odd)
{
    even = mul2<T>(sub2<T>(and_or<gemv_map::kEvenNibbles, PairMagic<T>::kValue>(r), ze), se);
    if constexpr (std::is_same<T, F16T>::value) {
        const __half2 q16 = as_half2(and_or<gemv_map::kOddNibbles, PairMagic<T>::kValue>(r)); /* 1024 + 16q */
        odd = mul2<T>(half2_bits(__hfma2(q16, as_half2(kF16Sixteenth), as_half2(zo))), so);
    } else {
        odd = mul2<T>(sub2<T>(and_or<gemv_map::kEvenNibbles, PairMagic<T>::kValue>(r >> 4), zo), so);
    }
}

/* Why: dequant_pairs for byte B of the words lo, hi of rows k, k + 1. */
template <class T, int B>
__device__ __forceinline__ void dequant_byte(uint32_t lo, uint32_t hi, uint32_t ze, uint32_t zo, uint32_t se,
                                             uint32_t so, uint32_t &even, uint32_t &odd)
{
    dequant_pairs<T>(__byte_perm(lo, hi, gemv_map::pair_select(B)), ze, zo, se, so, even, odd);
}

template <class T, int NT, int B>
__device__ __forceinline__ void compute_byte(float (&acc)[NT][kLaneWords][4][4], const Step<NT> &st, const Group &gs)
{
#pragma unroll
    for (int v = 0; v < kLaneWords; ++v) {
        uint32_t a[4]; /* A registers: rows (g, g + 8) x k pairs (2i, 2i + 8) */
#pragma unroll
        for (int p = 0; p < 2; ++p)
            dequant_byte<T, B>(st.w[2 * p][v], st.w[2 * p + 1][v], gs.z[v][2 * B], gs.z[v][2 * B + 1],
                               gs.s[v][2 * B], gs.s[v][2 * B + 1], a[gemv_map::a_reg(p, 0)], a[gemv_map::a_reg(p, 1)]);
#pragma unroll
        for (int t = 0; t < NT; ++t) mma_16816<T>(acc[t][v][B], a, st.b[t][0], st.b[t][1]);
    }
}

template <class T, int NT>
__device__ __forceinline__ void compute(float (&acc)[NT][kLaneWords][4][4], const Step<NT> &st, const Group &gs)
{
    compute_byte<T, NT, 0>(acc, st, gs);
    compute_byte<T, NT, 1>(acc, st, gs);
    compute_byte<T, NT, 2>(acc, st, gs);
    compute_byte<T, NT, 3>(acc, st, gs);
}

/* ---- the ring: cp.async into a warp's own shared memory ------------------- */

/* The stage's layout, for the banks: gemv_map in cuda/linear_layout.cuh. */
namespace gm = gemv_map;
static_assert(gm::kTileM == kTileM && gm::kStepK == kStepK && gm::kRowBytes == kStripWords * 4,
              "the stage holds one k16 step of a strip");
static_assert(stage_bytes(1) == gm::kRowsBytes + gm::kXTileBytes, "a stage is the strip's rows, then x");

/* Why: 16 bytes of qweight, asking L2 for the 256-byte neighbourhood (the
 * next strips read it at about the same time). */
__device__ __forceinline__ void cp_16(uint32_t dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global.L2::256B [%0], [%1], 16;" ::"r"(dst), "l"(src));
}

/* Why: 16 bytes of x, or 16 zero bytes (source size 0) for a row past M. */
__device__ __forceinline__ void cp_16_or_zero(uint32_t dst, const void *src, bool ok)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }

template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

/* A lane's share of the copies of one step (gemv_map): 16 bytes of two
 * rows of the strip and, for lanes below x_copy_lanes(NT), 16 bytes of x
 * (two pieces, 16 rows apart, for NT = 4).  The lanes' fragments come from
 * all of them: a warp barrier separates the copies from the reads. */
struct Copier {
    const uint32_t *qp; /* &qweight[k0 + r0][chunk] */
    const char *xp;     /* &x[m][k0 + 8 h] */
    int64_t x_next;     /* bytes from xp to the second piece's row m + 16 (NT = 4), 0 past M */
    uint32_t q_dst;     /* offset of the lane's qweight chunk in a stage */
    uint32_t x_dst;     /* offset of its x chunk */
    bool x_copy, x_ok;  /* lanes below x_copy_lanes(NT) copy x; rows past M are zeros */
    bool x_ok2;         /* the second piece's row is below M (NT = 4) */
};

/* Why: one step's copies into the stage at shared address `stage`; the copier moves on. */
template <int NT> __device__ __forceinline__ void ring_issue(uint32_t stage, Copier &c, int64_t W)
{
    cp_16(stage + c.q_dst, c.qp);
    cp_16(stage + c.q_dst + gm::kRowsBytes / 2, c.qp + 8 * W);
    if (gm::x_copy_lanes(NT) == 32 || c.x_copy) cp_16_or_zero(stage + c.x_dst, c.xp, c.x_ok);
    static_assert(gm::x_pieces(NT) <= 2, "at most two pieces of x a lane");
    if constexpr (gm::x_pieces(NT) == 2)
        cp_16_or_zero(stage + c.x_dst + gm::kXPieceRows * gm::kXRowBytes, c.xp + c.x_next, c.x_ok2);
    c.qp += kStepK * W;
    c.xp += kStepK * sizeof(uint16_t);
}

/* Where a lane's fragments sit in a stage: rows 2i, 2i + 1 (+ 8 for the
 * second pair) at bytes 8g of the strip, x row g (8t + g for tile t) at k 2i
 * and 2i + 8. */
struct Reader {
    uint32_t r0, r1, x;
};

/* Why: a landed stage into registers. */
template <int NT> __device__ __forceinline__ void ring_read(Step<NT> &st, const char *stage, const Reader &r)
{
    const uint2 a = *reinterpret_cast<const uint2 *>(stage + r.r0);
    const uint2 b = *reinterpret_cast<const uint2 *>(stage + r.r1);
    const uint2 c = *reinterpret_cast<const uint2 *>(stage + r.r0 + gm::kRowsBytes / 2);
    const uint2 d = *reinterpret_cast<const uint2 *>(stage + r.r1 + gm::kRowsBytes / 2);
    st.w[0][0] = a.x, st.w[0][1] = a.y;
    st.w[1][0] = b.x, st.w[1][1] = b.y;
    st.w[2][0] = c.x, st.w[2][1] = c.y;
    st.w[3][0] = d.x, st.w[3][1] = d.y;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        st.b[t][0] = *reinterpret_cast<const uint32_t *>(stage + r.x + t * gm::kXTileBytes);
        st.b[t][1] = *reinterpret_cast<const uint32_t *>(stage + r.x + t * gm::kXTileBytes + gm::kXHalfBytes);
    }
}

/* Why: the k16 steps [s_begin, s_end) of one warp into acc through its ring
 * of Ring stages; returns with every copy of the warp landed and read. */
template <class T, int Ring, int NT>
__device__ __forceinline__ void mainloop(float (&acc)[NT][kLaneWords][4][4], const Args &a, int s_begin, int s_end,
                                         int64_t w0, int64_t cw, int g, int i, int lane, char *ring)
{
    int group = s_begin / a.spg;
    int next_start = (group + 1) * a.spg; /* first step of the next group */
    const uint32_t *zp = a.qzeros + group * a.W + cw;
    const int64_t sp_pitch = a.N * (int64_t)sizeof(uint16_t);
    const char *sp = a.scales + group * sp_pitch + cw * AWQ_COLS_PER_WORD * (int64_t)sizeof(uint16_t);

    RawGroup raw, next;
    load_group(raw, zp, sp);
    if (next_start < s_end) load_group(next, zp + a.W, sp + sp_pitch);

    const int64_t k0 = (int64_t)s_begin * kStepK;
    const int r0 = gm::copy_row(lane), chunk = gm::copy_chunk(lane);
    Copier cp;
    /* chunks past N, clamped, feed only outputs that are never stored */
    cp.qp = a.qweight + (k0 + r0) * a.W + min(w0 + 4 * chunk, a.W - 4);
    cp.q_dst = (uint32_t)gm::row_byte(r0, 16 * chunk);
    constexpr int kStage = stage_bytes(NT);
    const int xm = gm::x_copy_row(lane) & (NT * kTileM - 1), xh = gm::x_copy_half(lane);
    cp.x_copy = lane < gm::x_copy_lanes(NT);
    cp.x_ok = xm < a.M;
    cp.xp = a.x + ((int64_t)(cp.x_ok ? xm : 0) * a.K + k0 + 8 * xh) * (int64_t)sizeof(uint16_t);
    /* row xm + 16 below M puts row xm below M too: its piece is 16 rows further, else a zero fill at xp */
    cp.x_ok2 = xm + gm::kXPieceRows < a.M;
    cp.x_next = cp.x_ok2 ? gm::kXPieceRows * a.K * (int64_t)sizeof(uint16_t) : 0;
    cp.x_dst = (uint32_t)gm::x_byte(xm, 16 * xh);
    Reader rd;
    rd.r0 = (uint32_t)gm::row_byte(gm::frag_row(i, 0), 8 * g);
    rd.r1 = (uint32_t)gm::row_byte(gm::frag_row(i, 1), 8 * g);
    rd.x = (uint32_t)gm::x_byte(g, 4 * i);

    const uint32_t base = (uint32_t)__cvta_generic_to_shared(ring);
    /* Ring - 1 steps in flight; a commit per step, empty past the slice, keeps the count */
#pragma unroll
    for (int d = 0; d < Ring - 1; ++d) {
        if (s_begin + d < s_end) ring_issue<NT>(base + d * kStage, cp, a.W);
        cp_commit();
    }

    Group gs;
    decode_group<T>(gs, raw);
    /* Step s (stage j = (s - s_begin) % Ring); refill: step s + Ring - 1 is in the slice. */
    const auto step = [&](int s, int j, bool refill) {
        cp_wait<Ring - 2>(); /* this lane's copies of step s have landed... */
        __syncwarp();        /* ...and every lane's; every lane is done with step s - 1 */
        Step<NT> st;
        ring_read(st, ring + j * kStage, rd);
        /* step s + Ring - 1 into the stage step s - 1 used */
        if (refill) ring_issue<NT>(base + ((j + Ring - 1) % Ring) * kStage, cp, a.W);
        cp_commit();
        if (s == next_start) { /* a new group: decode the loaded one, fetch the one after */
            decode_group<T>(gs, next);
            next_start += a.spg;
            zp += a.W;
            sp += sp_pitch;
            if (next_start < s_end) load_group(next, zp + a.W, sp + sp_pitch);
        }
        compute<T, NT>(acc, st, gs);
    };
    int s0 = s_begin;
    /* whole rounds whose every refill is in the slice: no tests but the group's */
    for (; s0 + 2 * Ring - 1 <= s_end; s0 += Ring) {
#pragma unroll
        for (int j = 0; j < Ring; ++j) step(s0 + j, j, true);
    }
    /* the last 2 Ring - 2 steps or fewer */
    for (; s0 < s_end; s0 += Ring) {
#pragma unroll
        for (int j = 0; j < Ring; ++j) {
            if (s0 + j >= s_end) break;
            step(s0 + j, j, s0 + j + Ring - 1 < s_end);
        }
    }
    cp_wait<0>();
}

/* Why: bias in float32, one rounding, one 16-byte store of 8 outputs. */
template <class T, class A> __device__ __forceinline__ void finish(const A &a, int64_t row, int64_t col, float (&v)[8])
{
    if (a.bias != nullptr) {
        const uint4 u = __ldg(reinterpret_cast<const uint4 *>(a.bias + col * 2));
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            v[2 * p] += scale_to_float<T>(w[p] & 0xFFFFu);
            v[2 * p + 1] += scale_to_float<T>(w[p] >> 16);
        }
    }
    uint4 o;
    o.x = pack_pair<T>(v[0], v[1]);
    o.y = pack_pair<T>(v[2], v[3]);
    o.z = pack_pair<T>(v[4], v[5]);
    o.w = pack_pair<T>(v[6], v[7]);
    *reinterpret_cast<uint4 *>(a.y + (row * a.N + col) * 2) = o;
}

/* Why: the next 8 partial sums of one output word, added in place. */
__device__ __forceinline__ void add8(const float *p, float (&v)[8])
{
    const float4 t0 = reinterpret_cast<const float4 *>(p)[0], t1 = reinterpret_cast<const float4 *>(p)[1];
    v[0] += t0.x, v[1] += t0.y, v[2] += t0.z, v[3] += t0.w;
    v[4] += t1.x, v[5] += t1.y, v[6] += t1.z, v[7] += t1.w;
}

#endif /* __CUDA_ARCH__ >= 800 */

/* Block: blockDim.x = 32 x warps, warp w = slice rank * warps + w of the
 * strip's K; grid.x = strips x split, the split blocks of a strip one cluster.
 * NT n8 tiles of x (M <= 8 NT): two or four tiles double or quadruple the
 * accumulators, so only one block of 8 warps fits a SM. */
template <class T, int Ring, int NT>
__global__ void __launch_bounds__(kMaxThreads, NT == 1 ? 2 : 1) kernel(const Args a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    extern __shared__ float4 gemv_shared[];
    char *smem = reinterpret_cast<char *>(gemv_shared);
    constexpr float kZero = 0.0f;

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    const int g = lane >> 2, i = lane & 3;
    const int64_t strip = blockIdx.x / a.split;
    const int rank = (int)(blockIdx.x - strip * a.split); /* == the block's rank in its cluster */
    const int64_t w0 = strip * kStripWords;                /* first word column of the strip */
    /* the lane's words, clamped: past N they feed only outputs that are never stored */
    const int64_t cw = min(w0 + g * kLaneWords, a.W - kLaneWords);

    const int nslices = a.split * warps;
    const int slice = rank * warps + warp;
    /* mma_map::slice_begin in 32 bits, unsigned: K < 2^30 keeps nsteps under
     * 2^26, so (slice + 1) * nsteps <= 64 nsteps < 2^32 */
    static_assert(kMaxWarps * kMaxSplit <= 64, "slice bounds fit 32 bits");
    const unsigned n = (unsigned)a.nsteps, ns = (unsigned)nslices;
    const int s_begin = (int)((unsigned)slice * n / ns);
    const int s_end = (int)((unsigned)(slice + 1) * n / ns);

    float acc[NT][kLaneWords][4][4];
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int v = 0; v < kLaneWords; ++v)
#pragma unroll
            for (int b = 0; b < 4; ++b)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[t][v][b][e] = kZero;
    constexpr int kWarpSmem = warp_smem(Ring, NT);
    if (s_begin < s_end) mainloop<T, Ring, NT>(acc, a, s_begin, s_end, w0, cw, g, i, lane, smem + warp * kWarpSmem);
    __syncwarp(); /* every lane's copies have landed and been read: the ring may be overwritten */

    if (warps == 1 && a.split == 1) {
        /* one slice: each lane stores its own outputs, 8 columns of a word at a time */
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2) {
                const int m = gemv_map::acc_x_row(t, i, e2);
                if (m >= a.M) continue;
#pragma unroll
                for (int v = 0; v < kLaneWords; ++v) {
                    const int64_t wc = w0 + g * kLaneWords + v;
                    if (wc >= a.W) continue;
                    float o[8];
#pragma unroll
                    for (int b = 0; b < 4; ++b) {
                        o[nibble_col(gemv_map::acc_nibble(b, e2))] = acc[t][v][b][e2];
                        o[nibble_col(gemv_map::acc_nibble(b, e2 + 2))] = acc[t][v][b][e2 + 2];
                    }
                    finish<T>(a, m, wc * AWQ_COLS_PER_WORD, o);
                }
            }
        return;
    }

    /* the warp's partial sums [M][128] into its own ring */
    float *mine = reinterpret_cast<float *>(smem + warp * kWarpSmem);
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int m = gemv_map::acc_x_row(t, i, e);
            if (m >= a.M) continue;
#pragma unroll
            for (int v = 0; v < kLaneWords; ++v)
#pragma unroll
                for (int b = 0; b < 4; ++b)
                    mine[m * kStripCols + (g * kLaneWords + v) * AWQ_COLS_PER_WORD + nibble_col(gemv_map::acc_nibble(b, e))] =
                        acc[t][v][b][e];
        }
    __syncthreads();

    /* the block's sum, warp 0 first, then 1, ..., warps-1, in units of one output word */
    constexpr int kUnitsPerRow = kStripWords;
    const int units = a.M * kUnitsPerRow;
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
        const int m = u / kUnitsPerRow, o = u % kUnitsPerRow;
        const int off = m * kStripCols + o * AWQ_COLS_PER_WORD;
        float v[8] = {kZero, kZero, kZero, kZero, kZero, kZero, kZero, kZero};
        for (int w = 0; w < warps; ++w) add8(reinterpret_cast<const float *>(smem + w * kWarpSmem) + off, v);
        if (a.split == 1) {
            if (w0 + o < a.W) finish<T>(a, m, (w0 + o) * AWQ_COLS_PER_WORD, v);
        } else {
            /* in warp 0's partials: only this thread reads and writes unit u */
            float4 *q = reinterpret_cast<float4 *>(reinterpret_cast<float *>(smem) + off);
            q[0] = make_float4(v[0], v[1], v[2], v[3]);
            q[1] = make_float4(v[4], v[5], v[6], v[7]);
        }
    }
#if __CUDA_ARCH__ >= 900
    if (a.split > 1) {
        /* the cluster's sum, rank 0 first, then 1, ..., split-1; each block finishes a share */
        cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
        cluster.sync();
        float *part = reinterpret_cast<float *>(smem);
        for (int u = rank * blockDim.x + threadIdx.x; u < units; u += a.split * blockDim.x) {
            const int m = u / kUnitsPerRow, o = u % kUnitsPerRow;
            if (w0 + o >= a.W) continue;
            const int off = m * kStripCols + o * AWQ_COLS_PER_WORD;
            float v[8] = {kZero, kZero, kZero, kZero, kZero, kZero, kZero, kZero};
            for (int q = 0; q < a.split; ++q) add8(cluster.map_shared_rank(part, q) + off, v);
            finish<T>(a, m, (w0 + o) * AWQ_COLS_PER_WORD, v);
        }
        cluster.sync(); /* no block leaves while another reads its partials */
    }
#endif
#else
    (void)a; /* before sm_80: the host never launches it */
#endif
}

} // namespace gemv
} // namespace awq_cu

#endif /* AWQ_CUDA_LINEAR_GEMV_CUH */
