/*
 * cuda/dequantize.cu -- the dequantize kernels v1..v4, their launchers, the
 * v4 default configuration and the autotuner's candidates.
 *
 * No Python and no torch here.  Every entry point returns an awq_status, never
 * aborts, never synchronizes (except awq_cuda_time, on its end event), and
 * checks the result of every launch (cuda/launch.cuh).  Contract: csrc/awq.h
 * and DESIGN.md section 1; design notes and measurements: docs/KERNELS.md.
 *
 * All four kernels produce identical bits:
 *   out[k, n] = round_to_out( float32(q - z) * float32(scale[k / G, n]) )
 * with q - z an exact integer and a single round-to-nearest-even at the end.
 */
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cuda/cuda.h"
#include "cuda/launch.cuh"
#include "cuda/layout.cuh"

using namespace awq_cu;

namespace {

/* ======================================================================
 * Arguments shared by v1..v3 (one struct passed by value)
 * ====================================================================== */
/* The operands every v1..v3 and general v4 launch passes, from the problem. */
struct Operands {
    const uint32_t *qweight;
    const uint32_t *qzeros;
    const void *scales;
    void *out;
    int64_t N; /* columns */
    int64_t W; /* packed words per row: N / 8 */
};

Operands operands_of(const awq_problem *p)
{
    return Operands{p->qweight, p->qzeros, p->scales, p->out, p->N, p->N / kColsPerWord};
}

struct SimpleArgs : Operands {
    int64_t count; /* v1: K * N elements; v2/v3: K * W words */
    Divisor divN, divW, divG;
};

constexpr int kV1Block = 256; /* v1 and v2 use a fixed block size, as originally written */
constexpr int kV2Block = 256;
constexpr int kMaxBlock = AWQ_MAX_BLOCK; /* CUDA's limit on threads per block */

/* ---- v1: one thread per output element -------------------------------- */
template <class S, class O> __global__ void __launch_bounds__(kV1Block) awq_v1_kernel(const SimpleArgs a)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < a.count; e += stride) {
        const int64_t k = divide(e, a.divN);
        const int64_t n = e - k * a.N;
        const int64_t g = divide(k, a.divG);
        const int64_t c = n >> 3; /* 8 columns per word */
        const uint32_t w = __ldg(a.qweight + k * a.W + c);
        const uint32_t zw = __ldg(a.qzeros + g * a.W + c);
        const uint32_t s = load_elem<S>(a.scales, g * a.N + n);
        store_elem<O>(a.out, e, dequant_one<S, O>(w, zw, (int)(n & 7), s));
    }
}

/* ======================================================================
 * v4 -- the production kernel
 *
 * Row tile = up to R consecutive rows k0 .. k0+R-1 inside one group g; tiles
 * never straddle a group, so "K not a multiple of R" and "G not a multiple
 * of R" are the same case: a group's last tile is short (its leftover rows
 * go one at a time; the tuner and the default only pick R dividing G, and
 * R > G just makes every tile short).  Unit = (tile, column block of
 * blockDim.x word columns), one block each, in a 1-D grid: consecutive
 * blocks take a tile's column blocks, then the next tile's, so the blocks
 * in flight cover one compact stretch of the matrix.  Consecutive lanes
 * take consecutive word columns c, so every warp-wide access is one
 * contiguous span: 128 B of qweight per row (4 B a lane), 512 B of f16
 * output per row (16 B a lane: whole 32 B sectors, no partial writes).
 * Lanes past the row's end (W not a multiple of the block) just exit.
 *
 * Two kernels share this plan: the lean one (R = 1, 2, 4 or 8 dividing G,
 * 32-bit word indices: every DESIGN.md shape) and the general one (any R,
 * short tiles, 64-bit indices, a grid-stride loop over units).
 *
 * Per (tile, c) a thread (1) issues every independent load at once -- the
 * zero word, the group's 8 scales (16 B; 32 B for f32) and the first RB rows
 * of qweight, RB = min(R, 8) -- (2) decodes the zeros/scales once into
 * registers, (3) per row computes 8 outputs and stores them (16 bytes a
 * lane; the cache policy is the Access mode).  R > 8 rows go in batches of 8
 * (register arrays are indexed only by constants).  No per-row branches:
 * the batch is straight-line code.  In the write-back mode the lean kernel
 * also prefetches, between (1) and (2), the qweight rows of the unit one wave
 * ahead (prefetch_ahead).
 *
 * ACC != kAccScalar: scales and out are 16-byte aligned (checked on the
 * host): one 16-byte access per 8 elements (two for f32); otherwise
 * element-wise accesses.
 * ====================================================================== */
struct V4Args : Operands {
    int64_t G;      /* group size */
    int64_t R;      /* rows per tile (config.rows) */
    int64_t tpg;     /* tiles per group: ceil(G / R) */
    int64_t cblocks; /* column blocks per tile: ceil(W / blockDim.x) */
    int64_t units;   /* tiles * cblocks: one block's work each */
    Divisor divT;    /* by tpg: tile -> group */
    Divisor divC;    /* by cblocks: unit -> tile */
    uint32_t zero;   /* always 0, opaque to the compiler: see after_loads */
};

constexpr int kV4MaxBatch = 8; /* rows of qweight held in registers at once */

/* Raw bits of one word-column's 8 scales: 4 words (16-bit types) or 8 (f32). */
template <class S> struct ScaleBits {
    static constexpr int kWords = is_16bit<S>::value ? 4 : 8;
    uint32_t w[kWords];
};

/* Why: fetch the group's 8 scales for columns 8c..8c+7 with the widest legal access. */
template <class S, bool VEC> __device__ __forceinline__ ScaleBits<S> load_scales(const void *base, int64_t i)
{
    ScaleBits<S> s;
    if constexpr (VEC) {
        const uint4 *v = reinterpret_cast<const uint4 *>(static_cast<const char *>(base) +
                                                         i * (int64_t)sizeof(typename S::bits));
#pragma unroll
        for (int h = 0; h < ScaleBits<S>::kWords / 4; ++h) {
            const uint4 x = __ldg(v + h);
            s.w[4 * h + 0] = x.x;
            s.w[4 * h + 1] = x.y;
            s.w[4 * h + 2] = x.z;
            s.w[4 * h + 3] = x.w;
        }
    } else if constexpr (is_16bit<S>::value) {
#pragma unroll
        for (int p = 0; p < kPairsPerWord; ++p)
            s.w[p] = load_elem<S>(base, i + 2 * p) | (load_elem<S>(base, i + 2 * p + 1) << 16);
    } else {
#pragma unroll
        for (int j = 0; j < kColsPerWord; ++j) s.w[j] = load_elem<S>(base, i + j);
    }
    return s;
}

/* How a kernel touches memory: element by element (any alignment), or with
 * 16-byte accesses whose output stores either stream past L2 (st.global.cs,
 * evict-first) or go through it as ordinary write-back stores.  Write-back
 * wins once the output is larger than a few MB (L2 drains it in longer
 * bursts); streaming wins when it fits in L2 many times over
 * (docs/KERNELS.md has the figures).  The host picks per launch. */
enum Access { kAccScalar = 0, kAccStream = 1, kAccWriteBack = 2 };

/* Why: one 16-byte store with the cache policy of the access mode. */
template <int ACC> __device__ __forceinline__ void store_wide(uint4 *p, uint4 v)
{
    if constexpr (ACC == kAccWriteBack)
        __stwb(p, v); /* st.global.wb.v4: a plain `*p = v` was split into four 4-byte stores */
    else
        __stcs(p, v);
}

/* Output bits of one row of one word-column: 4 words (16-bit types) or 8 (f32). */
template <class O> struct OutBits {
    static constexpr int kWords = is_16bit<O>::value ? 4 : 8;
    uint32_t w[kWords];
};

/* Why: write 8 outputs with the widest legal access, in the access mode ACC (see Access). */
template <class O, int ACC> __device__ __forceinline__ void store_outputs(void *dst, const OutBits<O> &o)
{
    if constexpr (ACC != kAccScalar) {
        uint4 *v = static_cast<uint4 *>(dst);
#pragma unroll
        for (int h = 0; h < OutBits<O>::kWords / 4; ++h)
            store_wide<ACC>(v + h, make_uint4(o.w[4 * h], o.w[4 * h + 1], o.w[4 * h + 2], o.w[4 * h + 3]));
    } else if constexpr (is_16bit<O>::value) {
#pragma unroll
        for (int p = 0; p < kPairsPerWord; ++p) {
            store_elem<O>(dst, 2 * p, o.w[p] & 0xFFFFu);
            store_elem<O>(dst, 2 * p + 1, o.w[p] >> 16);
        }
    } else {
#pragma unroll
        for (int j = 0; j < kColsPerWord; ++j) store_elem<O>(dst, j, o.w[j]);
    }
}

/* Decoded per-group state of one word-column, reused for all rows of the tile.
 * Generic path (any pair except f16 -> f16): the zero nibbles kept as pairs,
 * the scales widened to float32. */
template <class S, class O> struct GroupState {
    uint32_t zpair[kPairsPerWord]; /* (zword >> 4p) & kPairMask */
    float scale[kColsPerWord];     /* float32(scale) of column j */

    __device__ __forceinline__ GroupState(uint32_t zword, const ScaleBits<S> &s)
    {
#pragma unroll
        for (int p = 0; p < kPairsPerWord; ++p) zpair[p] = (zword >> (kNibbleBits * p)) & kPairMask;
#pragma unroll
        for (int p = 0; p < kPairsPerWord; ++p) {
            if constexpr (is_16bit<S>::value) {
                scale[2 * p] = scale_to_float<S>(s.w[p] & 0xFFFFu);
                scale[2 * p + 1] = scale_to_float<S>(s.w[p] >> 16);
            } else {
                scale[2 * p] = scale_to_float<S>(s.w[2 * p]);
                scale[2 * p + 1] = scale_to_float<S>(s.w[2 * p + 1]);
            }
        }
    }

    /* Why: 8 outputs of one row with no int->float conversion instruction:
     * d = (q | 16) - z per 16-bit half is 16 + q - z in [1, 31] (no borrow);
     * byte_perm drops it into the mantissa of 2^23, and subtracting 2^23 + 16
     * leaves float32(q - z) exactly (+0 when q == z).  Then the float32 product
     * and one rounding, as the contract says. */
    __device__ __forceinline__ OutBits<O> apply(uint32_t word) const
    {
        OutBits<O> o;
#pragma unroll
        for (int p = 0; p < kPairsPerWord; ++p) {
            const uint32_t d = (((word >> (kNibbleBits * p)) & kPairMask) | kPairBias) - zpair[p];
            const float lo = __fsub_rn(__uint_as_float(__byte_perm(d, kF32Magic, kPermLowHalf)), kF32MagicBias);
            const float hi = __fsub_rn(__uint_as_float(__byte_perm(d, kF32Magic, kPermHighHalf)), kF32MagicBias);
            const float vlo = __fmul_rn(lo, scale[2 * p]);
            const float vhi = __fmul_rn(hi, scale[2 * p + 1]);
            if constexpr (is_16bit<O>::value) {
                o.w[p] = pack_pair<O>(vlo, vhi);
            } else {
                o.w[2 * p] = __float_as_uint(vlo);
                o.w[2 * p + 1] = __float_as_uint(vhi);
            }
        }
        return o;
    }
};

/* f16 scales -> f16 out: half2 arithmetic, two columns per instruction.
 * (1024 + q) - (1024 + z) is exact in f16 (integers below 2048), +0 when
 * q == z; the f16 product of the exact q - z and the scale is rounded once,
 * to nearest even, with subnormals kept -- the same bits as the float32 path. */
template <> struct GroupState<F16T, F16T> {
    uint32_t zh[kPairsPerWord]; /* half2 (1024 + z[2p], 1024 + z[2p+1]) */
    uint32_t sh[kPairsPerWord]; /* half2 (scale[2p], scale[2p+1]) as stored */

    __device__ __forceinline__ GroupState(uint32_t zword, const ScaleBits<F16T> &s)
    {
#pragma unroll
        for (int p = 0; p < kPairsPerWord; ++p) {
            zh[p] = ((zword >> (kNibbleBits * p)) & kPairMask) | kF16x2Magic;
            sh[p] = s.w[p];
        }
    }

    __device__ __forceinline__ OutBits<F16T> apply(uint32_t word) const
    {
        OutBits<F16T> o;
#pragma unroll
        for (int p = 0; p < kPairsPerWord; ++p) {
            const uint32_t qh = ((word >> (kNibbleBits * p)) & kPairMask) | kF16x2Magic;
            o.w[p] = half2_bits(__hmul2_rn(__hsub2_rn(as_half2(qh), as_half2(zh[p])), as_half2(sh[p])));
        }
        return o;
    }
};

/* Why: the v2/v3 body -- one packed word: 1 qweight, 1 zero word, 8 scales,
 * 8 outputs; with VEC the 8 scales arrive in one 16-byte load and the 8
 * outputs leave in one 16-byte store (instead of 8 strided 2-byte ones). */
template <class S, class O, bool VEC> __device__ __forceinline__ void word_task(const SimpleArgs &a, int64_t t)
{
    const int64_t k = divide(t, a.divW);
    const int64_t c = t - k * a.W;
    const int64_t g = divide(k, a.divG);
    const uint32_t w = __ldg(a.qweight + t); /* t == k * W + c */
    const uint32_t zw = __ldg(a.qzeros + g * a.W + c);
    const GroupState<S, O> st(zw, load_scales<S, VEC>(a.scales, g * a.N + kColsPerWord * c));
    store_outputs<O, VEC ? kAccStream : kAccScalar>(static_cast<typename O::bits *>(a.out) + k * a.N +
                                                       kColsPerWord * c,
                                                   st.apply(w));
}

/* ---- v2: one thread per packed word, compile-time block size ---------- */
template <class S, class O, bool VEC> __global__ void __launch_bounds__(kV2Block) awq_v2_kernel(const SimpleArgs a)
{
    const int64_t stride = (int64_t)gridDim.x * kV2Block;
    for (int64_t t = (int64_t)blockIdx.x * kV2Block + threadIdx.x; t < a.count; t += stride)
        word_task<S, O, VEC>(a, t);
}

/* ---- v3: v2 with a runtime block size ---------------------------------- */
template <class S, class O, bool VEC> __global__ void __launch_bounds__(kMaxBlock) awq_v3_kernel(const SimpleArgs a)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < a.count; t += stride)
        word_task<S, O, VEC>(a, t);
}

/* Why: qweight is read exactly once.  With write-back output stores (large
 * launches) its lines are loaded with an L2 evict-first policy and no L1
 * allocation, so they are the first to go when the output's lines arrive
 * (measured: docs/KERNELS.md).  sm_75 has no cache-policy operand: plain __ldg. */
template <int ACC> __device__ __forceinline__ uint64_t qweight_policy()
{
    uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (ACC == kAccWriteBack) asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
    return policy;
}

template <int ACC> __device__ __forceinline__ uint32_t load_qword(const uint32_t *p, uint64_t policy)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (ACC == kAccWriteBack) {
        uint32_t v;
        asm("ld.global.nc.L1::no_allocate.L2::cache_hint.b32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(policy));
        return v;
    }
#endif
    (void)policy;
    return __ldg(p);
}

/* Why: issue RB independent qweight loads back to back before any is used. */
template <int RB, int ACC>
__device__ __forceinline__ void load_rows(uint32_t (&q)[RB], const uint32_t *p, int64_t pitch, uint64_t policy)
{
#pragma unroll
    for (int r = 0; r < RB; ++r) q[r] = load_qword<ACC>(p + r * pitch, policy);
}

/* Why: a value equal to x that the compiler must compute after every q[r] has
 * arrived (zero is a kernel argument, always 0).  Without it ptxas interleaves
 * the batch's loads with the first rows' stores (seen in the SASS), which
 * costs a second memory latency per thread; with it, the zero word, scales
 * and all RB rows leave back to back and are waited for once. */
template <int RB> __device__ __forceinline__ uint32_t after_loads(uint32_t x, const uint32_t (&q)[RB], uint32_t zero)
{
    uint32_t any = 0;
#pragma unroll
    for (int r = 0; r < RB; ++r) any |= q[r];
    return x | (any & zero);
}

/* Why: rows one at a time -- only for what is left of a short tile (a group's
 * last tile when R does not divide G), so the full batches stay branch-free. */
template <class S, class O, int ACC>
__device__ __forceinline__ void v4_rows_one_by_one(const GroupState<S, O> &st, const uint32_t *qp,
                                                   typename O::bits *op, int64_t W, int64_t N, int n,
                                                   uint64_t policy)
{
    for (int r = 0; r < n; ++r, qp += W, op += N) store_outputs<O, ACC>(op, st.apply(load_qword<ACC>(qp, policy)));
}

/* Why: all work of one word-column c of one row tile (rows k0 .. k0+nrows-1
 * of group g) in the general kernel: batches of RB rows, a short tile's rows
 * one at a time. */
template <class S, class O, int RB, int ACC>
__device__ __forceinline__ void v4_column(const V4Args &a, int64_t g, int64_t k0, int nrows, int64_t c,
                                          uint64_t policy)
{
    using OB = typename O::bits;
    const uint32_t *qp = a.qweight + k0 * a.W + c;
    OB *op = static_cast<OB *>(a.out) + k0 * a.N + kColsPerWord * c;

    /* 1. every independent load of the first batch, before any use */
    const uint32_t zword = __ldg(a.qzeros + g * a.W + c);
    const ScaleBits<S> sb = load_scales<S, ACC != kAccScalar>(a.scales, g * a.N + kColsPerWord * c);
    if (nrows < RB) { /* short tile: rare (R does not divide G) */
        v4_rows_one_by_one<S, O, ACC>(GroupState<S, O>(zword, sb), qp, op, a.W, a.N, nrows, policy);
        return;
    }
    uint32_t q[RB];
    load_rows<RB, ACC>(q, qp, a.W, policy);

    /* 2. decode the group's zeros and scales once for all rows */
    const GroupState<S, O> st(after_loads<RB>(zword, q, a.zero), sb);

    /* 3. full batches of RB rows: compute and write out */
    int left = nrows;
    for (;;) {
#pragma unroll
        for (int r = 0; r < RB; ++r) store_outputs<O, ACC>(op + r * a.N, st.apply(q[r]));
        left -= RB;
        qp += RB * a.W;
        op += RB * a.N;
        if (left < RB) break;
        load_rows<RB, ACC>(q, qp, a.W, policy);
    }
    if (left > 0) v4_rows_one_by_one<S, O, ACC>(st, qp, op, a.W, a.N, left, policy);
}

/* The general v4 kernel: any R (batches of 8 rows, short tiles), 64-bit
 * indices, a grid-stride loop over units.  Launched when the lean kernel's
 * conditions do not hold (see v4_lean_ok). */
template <class S, class O, int ACC> __global__ void __launch_bounds__(kMaxBlock) awq_v4_kernel(const V4Args a)
{
    const uint64_t policy = qweight_policy<ACC>();
    for (int64_t u = blockIdx.x; u < a.units; u += gridDim.x) {
        const int64_t tile = divide(u, a.divC);
        const int64_t c = (u - tile * a.cblocks) * blockDim.x + threadIdx.x;
        if (c >= a.W) continue; /* the last column block of a tile may be partial */
        const int64_t g = divide(tile, a.divT);
        const int64_t r0 = (tile - g * a.tpg) * a.R; /* first row of the tile inside group g */
        const int nrows = (int)min(a.R, a.G - r0);    /* < R only for a group's last tile */
        v4_column<S, O, kV4MaxBatch, ACC>(a, g, g * a.G + r0, nrows, c, policy);
    }
}

/* ---- the lean v4 kernel: the production path ---------------------------
 * Every tile is exactly RB = R <= 8 rows (R divides G), one unit per block,
 * and every index is a 32-bit word index (K * N/8 < 2^32): the thread's
 * whole job is straight-line code of a dozen integer instructions before
 * its loads leave, about 32 registers, full occupancy (docs/KERNELS.md
 * compares it with the general kernel). */
struct V4LeanArgs {
    const uint32_t *qweight;
    const uint32_t *qzeros;
    const char *scales; /* 8 scales (one word column) = one chunk of 8 * sizeof(S) bytes */
    char *out;          /* 8 outputs = one chunk of 8 * sizeof(O) bytes */
    uint32_t W;         /* words per row */
    uint32_t cblocks;   /* column blocks per tile */
    uint32_t c_m, c_l;  /* u / cblocks = (umulhi(u, c_m) + u) >> c_l */
    uint32_t t_m, t_l;  /* tile / (G / R), likewise */
    uint32_t units;     /* blocks in the grid */
    uint32_t ahead;     /* write-back mode: units of one wave of resident blocks (see prefetch_ahead) */
    uint32_t zero;      /* always 0: see after_loads */
};

/* Why: n / d for a 32-bit n with the reciprocal of Divisor (exact, see above). */
__device__ __forceinline__ uint32_t divide32(uint32_t n, uint32_t m, uint32_t l)
{
    return (uint32_t)(((uint64_t)__umulhi(n, m) + n) >> l);
}

/* Why: on the large layers (write-back mode, several waves of blocks) DRAM
 * moves more bytes per second when more reads are in flight than the resident
 * threads' own loads; more rows per thread would add them at the cost of
 * registers and longer store bursts per SM.  Instead each thread asks L2
 * for the qweight rows of the same lane in the unit one wave ahead -- the
 * block that will run in this one's place -- with a fire-and-forget
 * prefetch that holds no register; that block then finds its rows in L2
 * (docs/KERNELS.md, "L2 prefetch one wave ahead"). */
template <int RB> __device__ __forceinline__ void prefetch_ahead(const V4LeanArgs &a, uint32_t u)
{
    if (a.ahead == 0 || a.units - u <= a.ahead) return; /* no unit that far ahead */
    const uint32_t u2 = u + a.ahead;
    const uint32_t tile = divide32(u2, a.c_m, a.c_l);
    const uint32_t c = (u2 - tile * a.cblocks) * blockDim.x + threadIdx.x;
    if (c >= a.W) return;
    const uint32_t *p = a.qweight + (tile * RB * a.W + c);
#pragma unroll
    for (int r = 0; r < RB; ++r, p += a.W) asm volatile("prefetch.global.L2 [%0];" ::"l"(p) : "memory");
}

template <class S, class O, int RB, int ACC>
__global__ void __launch_bounds__(kMaxBlock) awq_v4_lean_kernel(const V4LeanArgs a)
{
    constexpr uint32_t kScaleChunk = kColsPerWord * sizeof(typename S::bits);
    constexpr uint32_t kOutChunk = kColsPerWord * sizeof(typename O::bits);
    const uint32_t u = blockIdx.x;
    const uint32_t tile = divide32(u, a.c_m, a.c_l);
    const uint32_t c = (u - tile * a.cblocks) * blockDim.x + threadIdx.x;
    if (c >= a.W) return; /* the last column block of a tile may be partial */
    const uint32_t g = divide32(tile, a.t_m, a.t_l);
    const uint32_t w0 = tile * RB * a.W + c; /* word index of the tile's first row */
    const uint32_t gw = g * a.W + c;         /* word index into qzeros; chunk index into scales */
    const uint64_t policy = qweight_policy<ACC>();

    const uint32_t zword = __ldg(a.qzeros + gw);
    const ScaleBits<S> sb = load_scales<S, ACC != kAccScalar>(a.scales + (uint64_t)gw * kScaleChunk, 0);
    uint32_t q[RB];
    const uint32_t *qp = a.qweight + w0;
#pragma unroll
    for (int r = 0; r < RB; ++r, qp += a.W) q[r] = load_qword<ACC>(qp, policy);
    if constexpr (ACC == kAccWriteBack) prefetch_ahead<RB>(a, u);

    /* One running output pointer (not RB precomputed ones): keeps RB = 8 at 32 registers. */
    const GroupState<S, O> st(after_loads<RB>(zword, q, a.zero), sb);
    char *op = a.out + (uint64_t)w0 * kOutChunk;
    const uint64_t pitch = (uint64_t)a.W * kOutChunk;
#pragma unroll
    for (int r = 0; r < RB; ++r, op += pitch) store_outputs<O, ACC>(op, st.apply(q[r]));
}

/* ======================================================================
 * Host side
 * ====================================================================== */


SimpleArgs simple_args(const awq_problem *p, int64_t count)
{
    SimpleArgs a;
    static_cast<Operands &>(a) = operands_of(p);
    a.count = count;
    a.divN = make_divisor(p->N);
    a.divW = make_divisor(a.W);
    a.divG = make_divisor(p->G);
    return a;
}

cudaError_t awq_v1_launch(const awq_problem *p, cudaStream_t stream)
{
    const SimpleArgs a = simple_args(p, awq_numel(p));
    const unsigned grid = grid_for(a.count, kV1Block);
    return dispatch_dtypes(p->scale_dtype, p->out_dtype, [&](auto st, auto ot) {
        return launch<awq_v1_kernel<typename decltype(st)::type, typename decltype(ot)::type>>(grid, kV1Block,
                                                                                                stream, a);
    });
}

template <bool VEC> cudaError_t v2_launch_vec(const awq_problem *p, int block, cudaStream_t stream)
{
    const SimpleArgs a = simple_args(p, p->K * (p->N / kColsPerWord));
    const unsigned grid = grid_for(a.count, block == 0 ? kV2Block : block);
    return dispatch_dtypes(p->scale_dtype, p->out_dtype, [&](auto st, auto ot) {
        using S = typename decltype(st)::type;
        using O = typename decltype(ot)::type;
        return block == 0 ? launch<awq_v2_kernel<S, O, VEC>>(grid, kV2Block, stream, a)
                          : launch<awq_v3_kernel<S, O, VEC>>(grid, (unsigned)block, stream, a);
    });
}

bool v4_vector_ok(const awq_problem *p);

/* v2 (block == 0: the compile-time block) and v3 (runtime block). */
cudaError_t awq_v2_launch(const awq_problem *p, int block, cudaStream_t stream)
{
    return v4_vector_ok(p) ? v2_launch_vec<true>(p, block, stream) : v2_launch_vec<false>(p, block, stream);
}

constexpr uintptr_t kVecBytes = 16; /* one 128-bit access */

/* The 16-byte path is legal when the base pointers and the row pitches of
 * scales and out are multiples of 16 bytes (every 8-column run then starts
 * on a 16-byte boundary).  qweight/qzeros are read one 4-byte word a lane. */
bool v4_vector_ok(const awq_problem *p)
{
    const int64_t spitch = p->N * (int64_t)awq_dtype_size(p->scale_dtype);
    const int64_t opitch = p->N * (int64_t)awq_dtype_size(p->out_dtype);
    return ((uintptr_t)p->scales % kVecBytes) == 0 && ((uintptr_t)p->out % kVecBytes) == 0 &&
           spitch % (int64_t)kVecBytes == 0 && opitch % (int64_t)kVecBytes == 0;
}

int64_t v4_tiles_per_group(int64_t G, int64_t R) { return (G + R - 1) / R; }

int64_t v4_tiles(const awq_problem *p, int64_t R) { return (p->K / p->G) * v4_tiles_per_group(p->G, R); }

/* Column blocks of a tile and units (one block each) of a v4 launch. */
int64_t v4_cblocks(const awq_problem *p, int block) { return (p->N / kColsPerWord + block - 1) / block; }

int64_t v4_units(const awq_problem *p, int64_t R, int block) { return v4_tiles(p, R) * v4_cblocks(p, block); }

/* The lean kernel applies: R is 1, 2, 4 or 8 and divides G, every word index
 * fits 32 bits, and there is one block per unit. */
bool v4_lean_ok(const awq_problem *p, int64_t R, int block)
{
    const int64_t words = p->K * (p->N / kColsPerWord);
    return (R == 1 || R == 2 || R == 4 || R == kV4MaxBatch) && p->G % R == 0 && words <= (int64_t)UINT32_MAX &&
           v4_units(p, R, block) <= 2147483647;
}

template <int ACC> cudaError_t v4_launch_lean(const awq_problem *p, int block, int R, cudaStream_t stream)
{
    V4LeanArgs a;
    a.qweight = p->qweight;
    a.qzeros = p->qzeros;
    a.scales = static_cast<const char *>(p->scales);
    a.out = static_cast<char *>(p->out);
    a.W = (uint32_t)(p->N / kColsPerWord);
    a.cblocks = (uint32_t)v4_cblocks(p, block);
    const Divisor dc = make_divisor(a.cblocks), dt = make_divisor(p->G / R);
    a.c_m = dc.m;
    a.c_l = dc.l;
    a.t_m = dt.m;
    a.t_l = dt.l;
    a.zero = 0;
    const unsigned grid = (unsigned)v4_units(p, R, block);
    a.units = grid;
    a.ahead = ACC == kAccWriteBack ? (uint32_t)device_resident_blocks(p->device, block) : 0;
    return dispatch_dtypes(p->scale_dtype, p->out_dtype, [&](auto st, auto ot) {
        using S = typename decltype(st)::type;
        using O = typename decltype(ot)::type;
        const unsigned b = (unsigned)block;
        switch (R) {
        case 1: return launch<awq_v4_lean_kernel<S, O, 1, ACC>>(grid, b, stream, a);
        case 2: return launch<awq_v4_lean_kernel<S, O, 2, ACC>>(grid, b, stream, a);
        case 4: return launch<awq_v4_lean_kernel<S, O, 4, ACC>>(grid, b, stream, a);
        default: return launch<awq_v4_lean_kernel<S, O, kV4MaxBatch, ACC>>(grid, b, stream, a);
        }
    });
}

template <int ACC> cudaError_t v4_launch_general(const awq_problem *p, int block, int R, cudaStream_t stream)
{
    V4Args a;
    static_cast<Operands &>(a) = operands_of(p);
    a.G = p->G;
    a.R = R;
    a.tpg = v4_tiles_per_group(p->G, R);
    a.cblocks = v4_cblocks(p, block);
    a.units = v4_units(p, R, block);
    a.divT = make_divisor(a.tpg);
    a.divC = make_divisor(a.cblocks);
    a.zero = 0;
    const unsigned grid = grid_for(a.units, 1);
    return dispatch_dtypes(p->scale_dtype, p->out_dtype, [&](auto st, auto ot) {
        return launch<awq_v4_kernel<typename decltype(st)::type, typename decltype(ot)::type, ACC>>(
            grid, (unsigned)block, stream, a);
    });
}

template <int ACC> cudaError_t v4_launch_acc(const awq_problem *p, int block, int R, cudaStream_t stream)
{
    return v4_lean_ok(p, R, block) ? v4_launch_lean<ACC>(p, block, R, stream)
                                   : v4_launch_general<ACC>(p, block, R, stream);
}

/* Outputs up to this size stream past L2 (see Access). */
constexpr int64_t kStreamOutBytes = 8ll << 20;

/* The access mode a v4 launch uses (see Access). */
int v4_access(const awq_problem *p)
{
    if (!v4_vector_ok(p)) return kAccScalar;
    const int64_t out_bytes = awq_numel(p) * (int64_t)awq_dtype_size(p->out_dtype);
    return out_bytes <= kStreamOutBytes ? kAccStream : kAccWriteBack;
}

cudaError_t awq_v4_launch(const awq_problem *p, int block, int rows, cudaStream_t stream)
{
    switch (v4_access(p)) {
    case kAccScalar: return v4_launch_acc<kAccScalar>(p, block, rows, stream);
    case kAccStream: return v4_launch_acc<kAccStream>(p, block, rows, stream);
    default: return v4_launch_acc<kAccWriteBack>(p, block, rows, stream);
    }
}

/* ---- device facts, cached per ordinal (hot path of the autotune cache) -- */

bool valid_dtype(awq_dtype t) { return t == AWQ_F16 || t == AWQ_BF16 || t == AWQ_F32; }

bool is_empty(const awq_problem *p) { return p->K == 0 || p->N == 0; }

/* Defensive re-check of what the caller validated (a bad problem must not
 * divide by zero or fault here), plus element alignment of every pointer. */
awq_status check_problem(const awq_problem *p)
{
    if (!p || p->K < 0 || p->N < 0 || p->N % kColsPerWord != 0 || p->G < 1) return AWQ_ERR_CONFIG;
    if (!valid_dtype(p->scale_dtype) || !valid_dtype(p->out_dtype)) return AWQ_ERR_CONFIG;
    if (p->device < 0) return AWQ_ERR_DEVICE;
    if (is_empty(p)) return AWQ_OK;
    if (p->K % p->G != 0) return AWQ_ERR_CONFIG;
    if (!p->qweight || !p->qzeros || !p->scales || !p->out) return AWQ_ERR_CONFIG;
    if ((uintptr_t)p->qweight % sizeof(uint32_t) || (uintptr_t)p->qzeros % sizeof(uint32_t) ||
        (uintptr_t)p->scales % awq_dtype_size(p->scale_dtype) || (uintptr_t)p->out % awq_dtype_size(p->out_dtype))
        return AWQ_ERR_CONFIG;
    return AWQ_OK;
}

/* Validates the fields the caller set; zero fields stay zero (defaults are
 * filled by fill_defaults, which may query the device). */
awq_status check_config(const awq_config *in, awq_config *c)
{
    awq_config r;
    memset(&r, 0, sizeof r);
    if (in) r = *in;
    if (r.kernel == AWQ_KERNEL_AUTO) r.kernel = AWQ_KERNEL_V4;
    if (r.kernel < AWQ_KERNEL_V1 || r.kernel > AWQ_KERNEL_V4) return AWQ_ERR_CONFIG;
    if ((r.block_size != 0 && !awq_block_size_valid(r.block_size)) || (r.rows != 0 && !awq_rows_valid(r.rows)))
        return AWQ_ERR_CONFIG;
    *c = r;
    return AWQ_OK;
}

/* The configuration kernel "auto"/v4 uses when nothing is tuned. */
void default_config(const awq_problem *p, awq_config *c)
{
    if (!c) return;
    memset(c, 0, sizeof *c);
    c->kernel = AWQ_KERNEL_V4;
    c->block_size = 64;
    c->rows = 2;
    if (!p || p->K <= 0 || p->N <= 0 || p->G < 1 || p->K % p->G != 0 || p->N % kColsPerWord != 0) return;

    /* The defaults and the measurements behind them: docs/KERNELS.md,
     * "Default configuration" and "Block size with the prefetch".
     * - Large layers (> 32M elements) are bound by DRAM: 2 rows a thread.
     *   More rows in flight per SM cost DRAM efficiency; fewer re-read each
     *   group's zeros and scales from L2 for every row.
     * - Smaller layers are bound by latency: 4 rows a thread (4 loads in
     *   flight) while the launch fits in one wave of resident threads, else
     *   8 rows, which halves the threads.
     * - With the prefetch one wave ahead (large layers), 512-thread blocks:
     *   each block's rows, and the rows it prefetches, are 2 KB runs of
     *   qweight.  Halved while more than 1/8 of the last column block's
     *   lanes would idle (W = N/8 not a multiple of the block). */
    int block = 64;
    int rows = 2;
    if (p->K * p->N <= (32ll << 20)) {
        rows = v4_units(p, 4, block) * block <= device_resident_threads(p->device) ? 4 : kV4MaxBatch;
    } else {
        const int64_t W = p->N / kColsPerWord;
        block = 512;
        while (block > 64 && 8 * (v4_cblocks(p, block) * block - W) > v4_cblocks(p, block) * block) block >>= 1;
    }
    while (p->G % rows != 0) rows >>= 1; /* full tiles only: the lean kernel */
    c->rows = rows;
    c->block_size = block;
}

constexpr int kV3DefaultBlock = 256;

void fill_defaults(const awq_problem *p, awq_config *c)
{
    if (c->kernel == AWQ_KERNEL_V3 && c->block_size == 0) c->block_size = kV3DefaultBlock;
    if (c->kernel == AWQ_KERNEL_V4 && (c->block_size == 0 || c->rows == 0)) {
        awq_config d;
        default_config(p, &d);
        if (c->block_size == 0) c->block_size = d.block_size;
        if (c->rows == 0) c->rows = d.rows;
    }
}

/* The switch from kernel id to launcher; c is validated and complete. */
cudaError_t launch_config(const awq_problem *p, const awq_config *c, cudaStream_t stream)
{
    if (is_empty(p)) return cudaSuccess;
    switch (c->kernel) {
    case AWQ_KERNEL_V1: return awq_v1_launch(p, stream);
    case AWQ_KERNEL_V2: return awq_v2_launch(p, 0, stream);
    case AWQ_KERNEL_V3: return awq_v2_launch(p, c->block_size, stream);
    case AWQ_KERNEL_V4: return awq_v4_launch(p, c->block_size, c->rows, stream);
    default: return cudaErrorInvalidValue; /* unreachable: check_config */
    }
}

/* Validation shared by dequantize and time; fills *c with the resolved config. */
awq_status prepare(const awq_problem *p, const awq_config *in, awq_config *c)
{
    awq_status s = check_problem(p);
    if (s != AWQ_OK) return s;
    s = check_config(in, c);
    if (s != AWQ_OK) return s;
    if (!is_empty(p)) fill_defaults(p, c);
    return AWQ_OK;
}

} // namespace

extern "C" {

awq_status awq_cuda_dequantize(const awq_problem *p, const awq_config *c, int *detail)
{
    set_detail(detail, 0);
    awq_config rc;
    awq_status s = prepare(p, c, &rc);
    if (s != AWQ_OK || is_empty(p)) return s;
    DeviceScope scope;
    cudaError_t e = scope.enter(p->device);
    if (e == cudaSuccess) e = clear_error(launch_config(p, &rc, static_cast<cudaStream_t>(p->stream)));
    set_detail(detail, (int)e);
    return status_of(e);
}

awq_status awq_cuda_time(const awq_problem *p, const awq_config *c, const awq_cuda_flush *flush, int warmup,
                         int iters, float *ms, int *detail)
{
    set_detail(detail, 0);
    if (ms) *ms = 0.0f;
    if (iters < 1 || iters > kMaxTimedRuns || warmup < 0) return AWQ_ERR_CONFIG;
    awq_config rc;
    const awq_status s = prepare(p, c, &rc);
    if (s != AWQ_OK) return s;
    const cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
    float t = 0.0f;
    const cudaError_t e =
        time_launches(p->device, stream, flush, warmup, iters, [&] { return launch_config(p, &rc, stream); }, &t);
    set_detail(detail, (int)e);
    if (e != cudaSuccess) return status_of(e);
    if (ms) *ms = t;
    return AWQ_OK;
}

int awq_cuda_candidates(const awq_problem *p, awq_config *configs, int cap)
{
    if (!configs || cap <= 0) return 0;
    int n = 0;
    auto add = [&](int kernel, int block, int rows) {
        if (n >= cap) return;
        for (int i = 0; i < n; ++i)
            if (configs[i].kernel == kernel && configs[i].block_size == block && configs[i].rows == rows) return;
        awq_config c;
        memset(&c, 0, sizeof c);
        c.kernel = kernel;
        c.block_size = block;
        c.rows = rows;
        configs[n++] = c;
    };
    awq_config d;
    default_config(p, &d);
    add(AWQ_KERNEL_V4, d.block_size, d.rows); /* the default first: it survives a small cap */
    const int64_t G = p && p->G > 0 ? p->G : 1;
    static const int kBlocks[] = {64, 128, 256, 512};
    static const int kRows[] = {1, 2, 4, 8};
    for (int rows : kRows) {
        if (G % rows != 0) continue; /* a tile never spans two groups: keep tiles full */
        for (int block : kBlocks) add(AWQ_KERNEL_V4, block, rows);
    }
    static const int kV3Blocks[] = {128, 256, 512};
    for (int block : kV3Blocks) add(AWQ_KERNEL_V3, block, 0);
    return n;
}

} /* extern "C" */
