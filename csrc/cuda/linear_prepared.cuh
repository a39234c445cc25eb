/*
 * cuda/linear_prepared.cuh -- the prefill kernel on a prepared weight
 * layout (sm_90a only): y = x @ W + bias for hundreds of rows of x, each
 * lane's weights loaded from memory straight into the registers of wgmma's
 * A operand.  Not one of linear()'s kernels: it reads the layout, not
 * qweight (prepared.c is its entry point).  Included by cuda/linear.cu
 * only.  Design notes and measurements: docs/KERNELS.md, "The
 * prepared-layout kernel".
 *
 * As in the warpgroup kernel (cuda/linear_wgmma.cuh) the product is
 * y^T = W^T x^T: W is wgmma's A operand, dequantized in registers, x its B
 * operand in shared memory.  A block is two warpgroups on 128 output
 * columns (64 each) and NT rows of x (128 or 256: wgmma's N), in stages of
 * 64 k; with split > 1 the blocks of a cluster take contiguous slices of
 * the stages and sum in rank order.
 *
 * ---- the layout (built from qweight, qzeros and scales once, by
 * awq_fast_dequant.torch.prepare_prefill) ----------------------------------------
 * words int32 [N/128][K/64][2][4][32][4]: for 128-column tile t, stage s,
 * warpgroup h, warp w and lane (g, i), word kk (one per k16 step) holds for
 * the output columns c = 128 t + 64 h + 16 w + 2 g and c + 1 (A rows g and
 * g + 8) and k = 64 s + 16 kk + 2 i the nibbles [k][c] [k][c+1] [k+8][c]
 * [k+8][c+1] in bits 0-15 and the same of k + 1 in bits 16-31: one 16-byte
 * load a lane and stage, nothing loaded that the lane does not use, and no
 * shared memory for W.
 * operands int32 [K/G][N/128][2][4][8][4]: for group q and lane group g of
 * that warp, the half-precision words dequant_pairs takes (cuda/
 * linear_gemv.cuh): 0x6400 + z (float16) or 0x4300 + z (bfloat16) of column
 * c, then of c + 1 -(64 + z) (float16) or 0x4300 + z, then the two scales,
 * each value in both halves of its word.
 *
 * ---- pipeline ----------------------------------------------------------------------
 * Thread 0 copies x's stages with the tensor memory accelerator (128-byte
 * swizzle, one mbarrier "full" per buffer; a buffer is refilled once the
 * eight warps have arrived on its "empty" barrier).  Each lane loads its
 * words two stages ahead.  Each k16 step is a commit group of its own:
 * before a warp rewrites a step's A registers it waits only for that step
 * of the stage before (wait_group 3), so three steps stay queued on the
 * tensor cores while it dequantizes the next.  (ptxas keeps that pipeline
 * for at most three pending groups at a step's wait; with more it
 * serializes every wgmma, C7513, which setup.py refuses.)
 *
 * ---- K slices and the reduction ---------------------------------------------------
 * With split > 1 each block's sums go to its shared memory as an
 * [NT][128] float32 tile and every output is the sum over the cluster's
 * ranks in order 0, 1, ..., split - 1 (distributed shared memory), plus the
 * bias in float32, rounded once.  Every sum has a fixed order: the result is
 * deterministic.
 */
#ifndef AWQ_CUDA_LINEAR_PREPARED_CUH
#define AWQ_CUDA_LINEAR_PREPARED_CUH

#include <cooperative_groups.h>

#include <cstdint>
#include <type_traits>

#include "cuda/linear_gemv.cuh"
#include "cuda/linear_ops.cuh"
#include "cuda/linear_wgmma.cuh"
#include "cuda/sm90.cuh"

namespace awq_cu {
namespace prep {

constexpr int kStageK = 64;     /* k of a stage: one 128-byte row of x */
constexpr int kCols = 128;      /* output columns of a block */
constexpr int kThreads = 256;   /* two warpgroups */
constexpr int kAhead = 2;       /* stages a lane's words are loaded ahead */
constexpr int kLaneStage = 256; /* uint4 of words per stage and 128 columns */
constexpr int kLaneGroup = 64;  /* uint4 of operands per group and 128 columns */
constexpr int kMaxSplit = 8;

template <int NT> struct Tile {
    static constexpr int kX = NT * 128; /* bytes of x a stage */
    static constexpr int kStages = NT == 256 ? 6 : 8;
    static constexpr int kPitch = kCols + 4; /* floats a row of partial sums: 16-byte rows */
    static constexpr int kPart = NT * kPitch * 4;
    static constexpr int kSmem = (kStages * kX > kPart ? kStages * kX : kPart) + 1024;
};
static_assert(Tile<256>::kSmem <= 227 * 1024 && Tile<128>::kSmem <= 227 * 1024, "the stages fit a multiprocessor");

struct Args {
    const uint4 *words;    /* [N/128][K/64][2][4][32] */
    const uint4 *operands; /* [K/G][N/128][2][4][8] */
    const char *bias;      /* [N] or nullptr */
    char *y;               /* [M][N] */
    int64_t M, N;
    int64_t tile0; /* the first tile of this launch (the tail of a plan: linear.cu) */
    int K, split;
    int gshift; /* log2(G / 64) */
};

#if AWQ_WGMMA_CODE

#define PREP_D128                                                                                                  \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                                        \
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"                                              \
    "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"                                              \
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"                                              \
    "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"                                              \
    "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"                                              \
    "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"                                  \
    "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define PREP_D8(o)                                                                                                 \
    "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), "+f"(d[o + 6]),   \
        "+f"(d[o + 7])
#define PREP_D64(o)                                                                                                \
    PREP_D8(o), PREP_D8(o + 8), PREP_D8(o + 16), PREP_D8(o + 24), PREP_D8(o + 32), PREP_D8(o + 40),               \
        PREP_D8(o + 48), PREP_D8(o + 56)
#define PREP_RS_N256(TYPE)                                                                                         \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, 1, 0;\n\twgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE \
                 "." TYPE " {" PREP_D128 "}, {%128,%129,%130,%131}, %132, p, 1, 1, 0;\n\t}"                        \
                 : PREP_D64(0), PREP_D64(64)                                                                       \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc))

/* Why: d += A (64 x 16 in registers) x B (16 x NT of x in shared memory), asynchronously. */
template <class T, int NT>
__device__ __forceinline__ void wgmma_rs(float (&d)[NT / 2], const uint32_t (&a)[4], uint64_t desc)
{
    if constexpr (NT == 256) {
        if constexpr (std::is_same<T, F16T>::value)
            PREP_RS_N256("f16");
        else
            PREP_RS_N256("bf16");
    } else {
        wg::wgmma<T, NT>(d, a, desc);
    }
}
#undef PREP_RS_N256
#undef PREP_D64
#undef PREP_D8
#undef PREP_D128

/* Why: orders the writes of a step's 4 A registers before the wgmma that reads them. */
__device__ __forceinline__ void fence_regs(uint32_t (&a)[4])
{
    asm volatile("wgmma.fence.sync.aligned;" : "+r"(a[0]), "+r"(a[1]), "+r"(a[2]), "+r"(a[3]));
}

/* Why: waits until at most N of the warp's wgmma groups are pending; the word the next
 * step dequantizes passes through it, so that the dequantization cannot move above it. */
template <int N> __device__ __forceinline__ void wait_passing(uint32_t &word)
{
    asm volatile("wgmma.wait_group.sync.aligned %1;" : "+r"(word) : "n"(N) : "memory");
}

/* Why: the bias of output column c, widened to float32 (0 without one). */
template <class T> __device__ __forceinline__ float bias_at(const char *bias, int64_t c)
{
    return bias ? scale_to_float<T>(load_elem<T>(bias, c)) : 0.0f;
}

#endif /* AWQ_WGMMA_CODE */

/* grid.x = tiles x split from tile a.tile0 on, the split blocks of a tile one
 * cluster; tiles are numbered row tiles fastest (they share W in L2). */
template <class T, int NT>
__global__ void __launch_bounds__(kThreads, 1) prepared_kernel(const Args a, const __grid_constant__ CUtensorMap tmx)
{
#if AWQ_WGMMA_CODE
    using namespace sm90;
    constexpr int S = Tile<NT>::kStages;
    constexpr int kX = Tile<NT>::kX;
    extern __shared__ __align__(1024) char dsmem[];
    __shared__ uint64_t full[S], empty[S];
    const uint32_t raw = smem_addr(dsmem);
    const uint32_t base = (raw + 1023) & ~1023u;
    char *sm = dsmem + (base - raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = warp >> 2, w = warp & 3, g = lane >> 2, i = lane & 3;
    const int64_t mtiles = (a.M + NT - 1) / NT, ntiles = a.N / kCols;
    const int rank = (int)(blockIdx.x % a.split);
    const int64_t tile = a.tile0 + blockIdx.x / a.split;
    const int64_t m0 = (tile % mtiles) * NT, nt = tile / mtiles;
    const int nst = a.K / kStageK;
    const int s_begin = rank * nst / a.split, s_end = (rank + 1) * nst / a.split; /* a multiple of kAhead */
    if (tid == 0)
        for (int s = 0; s < S; ++s) {
            mbar_init(smem_addr(&full[s]), 1);
            mbar_init(smem_addr(&empty[s]), 8); /* lane 0 of every warp */
        }
    __syncthreads();

    /* thread 0: x of stage s into buffer (s - s_begin) % S once its previous stage is consumed */
    auto produce = [&](int s) {
        const int j = (s - s_begin) % S, u = (s - s_begin) / S;
        if (u > 0) mbar_wait(smem_addr(&empty[j]), (u - 1) & 1);
        const uint32_t bar = smem_addr(&full[j]);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(kX) : "memory");
        tma_2d(base + j * kX, &tmx, s * kStageK, (int)m0, bar);
    };
    if (tid == 0)
        for (int s = s_begin; s < s_begin + S && s < s_end; ++s) produce(s);

    const uint4 *wp = a.words + (size_t)nt * nst * kLaneStage + (h * 4 + w) * 32 + lane;
    const uint4 *mp = a.operands + (size_t)nt * kLaneGroup + (h * 4 + w) * 8 + g;
    const size_t m_pitch = (size_t)ntiles * kLaneGroup;
    uint4 qv[kAhead], mv[kAhead];
    auto fetch = [&](int s, int slot) {
        s = s < s_end ? s : s_end - 1; /* past the slice: a harmless reload, no branch */
        qv[slot] = __ldg(wp + (size_t)s * kLaneStage);
        mv[slot] = __ldg(mp + (size_t)(s >> a.gshift) * m_pitch);
    };
#pragma unroll
    for (int p = 0; p < kAhead; ++p) fetch(s_begin + p, p);

    float acc[NT / 2];
#pragma unroll
    for (int e = 0; e < NT / 2; ++e) acc[e] = 0.0f;
    uint32_t af[4][4];
    int j = 0, jr = 0;  /* the buffers of stages s and s - 1 */
    uint32_t phase = 0; /* the parity of buffer j's fills */
    const uint64_t desc0 = wg::x_desc(base);
    auto stage = [&](int s, auto slot) {
        constexpr int Q = decltype(slot)::value;
        uint32_t words[4] = {qv[Q].x, qv[Q].y, qv[Q].z, qv[Q].w};
        const uint4 op = mv[Q];
        fetch(s + kAhead, Q);
        const uint64_t desc = desc0 + (uint64_t)(j * (kX >> 4));
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            wait_passing<3>(words[kk]); /* step kk of stage s - 1 is complete */
            gemv::dequant_pairs<T>(words[kk], op.x, op.y, op.z, op.w, af[kk][0], af[kk][1]);
            gemv::dequant_pairs<T>(words[kk] >> 8, op.x, op.y, op.z, op.w, af[kk][2], af[kk][3]);
            if (kk == 0) mbar_wait(smem_addr(&full[j]), phase);
            fence_regs(af[kk]);
            wgmma_rs<T, NT>(acc, af[kk], desc + 2 * kk);
            wg::wgmma_commit();
        }
        if (s > s_begin) { /* all of stage s - 1 is complete: its buffer may be refilled */
            if (lane == 0) mbar_arrive(smem_addr(&empty[jr]));
            if (tid == 0 && s - 1 + S < s_end) produce(s - 1 + S);
            jr = jr + 1 == S ? 0 : jr + 1;
        }
        j = j + 1 == S ? 0 : j + 1;
        phase ^= j == 0;
    };
    for (int s = s_begin; s < s_end; s += kAhead) {
        stage(s, std::integral_constant<int, 0>());
        stage(s + 1, std::integral_constant<int, 1>());
    }
    wg::wgmma_wait<0>();
#pragma unroll
    for (int e = 0; e < NT / 2; ++e) asm volatile("" : "+f"(acc[e])::"memory"); /* after the wait */

    /* accumulator 4 q + 2 r + e: output column 64 h + 16 w + 2 g + r, row 8 q + 2 i + e of the tile */
    const int c = 64 * h + 16 * w + 2 * g;
    if (a.split == 1) {
        const int64_t col = nt * kCols + c;
        const float b0 = bias_at<T>(a.bias, col), b1 = bias_at<T>(a.bias, col + 1);
#pragma unroll
        for (int q = 0; q < NT / 8; ++q)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int64_t m = m0 + 8 * q + 2 * i + e;
                if (m < a.M)
                    *reinterpret_cast<uint32_t *>(a.y + (m * a.N + col) * 2) =
                        pack_pair<T>(acc[4 * q + e] + b0, acc[4 * q + 2 + e] + b1);
            }
        return;
    }
    constexpr int kPitch = Tile<NT>::kPitch;
    float *part = reinterpret_cast<float *>(sm);
    __syncthreads(); /* every warp's products are done: the stages may be overwritten */
#pragma unroll
    for (int q = 0; q < NT / 8; ++q)
#pragma unroll
        for (int e = 0; e < 2; ++e)
            *reinterpret_cast<float2 *>(part + (8 * q + 2 * i + e) * kPitch + c) =
                make_float2(acc[4 * q + e], acc[4 * q + 2 + e]);
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    cluster.sync();
    for (int u = rank * kThreads + tid; u < NT * (kCols / 8); u += a.split * kThreads) {
        const int row = u / (kCols / 8), c8 = u % (kCols / 8);
        if (m0 + row >= a.M) continue;
        const int64_t col = nt * kCols + 8 * c8;
        float v[8];
#pragma unroll
        for (int r = 0; r < 8; ++r) v[r] = 0.0f;
        for (int r = 0; r < a.split; ++r) {
            const float4 *p = reinterpret_cast<const float4 *>(cluster.map_shared_rank(part, r) + row * kPitch + 8 * c8);
            const float4 lo = p[0], hi = p[1];
            v[0] += lo.x, v[1] += lo.y, v[2] += lo.z, v[3] += lo.w;
            v[4] += hi.x, v[5] += hi.y, v[6] += hi.z, v[7] += hi.w;
        }
#pragma unroll
        for (int r = 0; r < 8; ++r) v[r] += bias_at<T>(a.bias, col + r);
        *reinterpret_cast<uint4 *>(a.y + ((m0 + row) * a.N + col) * 2) =
            make_uint4(pack_pair<T>(v[0], v[1]), pack_pair<T>(v[2], v[3]), pack_pair<T>(v[4], v[5]),
                       pack_pair<T>(v[6], v[7]));
    }
    cluster.sync(); /* no block leaves while another reads its sums */
#else
    (void)a;
#endif
}

} // namespace prep
} // namespace awq_cu

#endif /* AWQ_CUDA_LINEAR_PREPARED_CUH */
