// scripts/prefill_reg_probe.cu -- a fused W4A16 GEMM for prefill-sized M in
// which each lane's weights come from a layout prepared for it, straight
// from memory into the registers of wgmma's A operand (docs/KERNELS.md,
// "Measured on the H100: a prepared layout"). Not part of the package: a
// probe of the design, built and driven by scripts/prefill_reg_probe.py.
//
//     nvcc -O3 -std=c++17 -I csrc -gencode arch=compute_90a,code=sm_90a \
//          -shared -Xcompiler -fPIC scripts/prefill_reg_probe.cu -o prefill_reg_probe.so
//
// y = x @ W, x [M, K] in float16 or bfloat16, W from AWQ's qweight / qzeros /
// scales after prepare (the .py): N % 128 == 0, K % 64 == 0, G % 64 == 0.
//
// As in the package's warpgroup kernel the product is y^T = W^T x^T: W is
// wgmma's A operand, dequantized in registers, x its B operand in shared
// memory. A block is two warpgroups on 128 output columns (64 each) and NT
// rows of x (128 or 256: wgmma's N), in stages of 64 k; with split > 1 the
// blocks of a cluster take slices of the stages and sum in rank order.
//
// What differs from the package's kernel:
// - the prepared layout: for each 128 columns, stage, warpgroup h and warp w,
//   lane (g, i) holds 4 words, one per k16 step, each the 8 nibbles of its
//   A fragment (columns c = 64 h + 16 w + 2 g and c + 1 as A rows g and
//   g + 8; k 2i, 2i + 1, 2i + 8, 2i + 9): one 16-byte load a stage, nothing
//   loaded that the lane does not use, no shared memory for W;
// - its group's zero and scale operands prepared the same way, 16 bytes;
// - x copied by the tensor memory accelerator (thread 0), mbarriers;
// - wgmma.m64n256k16 at NT = 256: each dequantized weight feeds 256 rows.
// Each k16 step is a commit group of its own, its A registers rewritten once
// the same step of the stage before is complete: three steps stay queued on
// the tensor cores while a warp dequantizes the next.
#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/linear_wgmma.cuh" /* the descriptor, fence, commit and wait wrappers; dequant_pairs */
#include "cuda/sm90.cuh"   /* mbarriers, the tensor memory accelerator */

#ifndef PROBE_AHEAD
#define PROBE_AHEAD 2 /* 2 or 4 */
#endif

namespace {

using namespace awq_cu;
using namespace awq_cu::sm90;

constexpr int kBK = 64;        /* k of a stage: one 128-byte row of x */
constexpr int kBN = 128;       /* output columns of a block */
constexpr int kThreads = 256;  /* two warpgroups */
constexpr int kLaneStage = 256; /* uint4 of the prepared words per stage and 128 columns */
constexpr int kLaneGroup = 64;  /* uint4 of the prepared zero/scale operands per group and 128 columns */

template <int NT> struct Tile {
    static constexpr int kX = NT * 128;
    static constexpr int kStages = NT == 256 ? 6 : 8;
    static constexpr int kPitch = kBN + 4; /* floats a row of partial sums: 16-byte rows */
    static constexpr int kPart = NT * kPitch * 4;
    static constexpr int kSmem = (kStages * kX > kPart ? kStages * kX : kPart) + 1024;
};
static_assert(Tile<256>::kSmem <= 227 * 1024, "six stages of 256 rows fit a multiprocessor");

struct Args {
    const uint4 *pw; /* prepared words [N/128][K/64][2][4][32] */
    const uint4 *pm; /* prepared operands [K/G][N/128][2][4][8] */
    char *y;
    int M, N, K, G, split;
    int gshift; /* log2(G / 64) */
};

#if AWQ_WGMMA_CODE

#define REG_D128                                                                                                   \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                                        \
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"                                              \
    "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"                                              \
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"                                              \
    "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"                                              \
    "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"                                              \
    "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"                                  \
    "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define D8(o)                                                                                                      \
    "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), "+f"(d[o + 6]),   \
        "+f"(d[o + 7])
#define D64(o) D8(o), D8(o + 8), D8(o + 16), D8(o + 24), D8(o + 32), D8(o + 40), D8(o + 48), D8(o + 56)
#define RS_N256(TYPE)                                                                                              \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, 1, 0;\n\twgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE \
                 "." TYPE " {" REG_D128 "}, {%128,%129,%130,%131}, %132, p, 1, 1, 0;\n\t}"                         \
                 : D64(0), D64(64)                                                                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc))

/* Why: d += A (64 x 16 in registers) x B (16 x NT of x in shared memory), asynchronously. */
template <class T, int NT>
__device__ __forceinline__ void wgmma_rs(float (&d)[NT / 2], const uint32_t (&a)[4], uint64_t desc)
{
    if constexpr (NT == 256) {
        if constexpr (std::is_same<T, F16T>::value)
            RS_N256("f16");
        else
            RS_N256("bf16");
    } else {
        wg::wgmma<T, NT>(d, a, desc);
    }
}
#undef RS_N256
#undef D64
#undef D8
#undef REG_D128

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

#endif /* AWQ_WGMMA_CODE */

template <class T, int NT>
__global__ void __launch_bounds__(kThreads, 1) reg_kernel(const Args a, const __grid_constant__ CUtensorMap tmx)
{
#if AWQ_WGMMA_CODE
    constexpr int S = Tile<NT>::kStages;
    constexpr int kX = Tile<NT>::kX;
    extern __shared__ __align__(1024) char dsmem[];
    __shared__ uint64_t full[S], empty[S];
    const uint32_t raw = smem_addr(dsmem);
    const uint32_t base = (raw + 1023) & ~1023u;
    char *sm = dsmem + (base - raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = warp >> 2, w = warp & 3, g = lane >> 2, i = lane & 3;
    const int mtiles = (a.M + NT - 1) / NT, ntiles = a.N / kBN;
    const int rank = (int)(blockIdx.x % a.split), tile = (int)(blockIdx.x / a.split);
    const int m0 = (tile % mtiles) * NT, nt = tile / mtiles; /* row tiles fastest: they share W in L2 */
    const int nst = a.K / kBK;
    const int s_begin = rank * nst / a.split, s_end = (rank + 1) * nst / a.split; /* an even count */
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
        tma_2d(base + j * kX, &tmx, s * kBK, m0, bar);
    };
    if (tid == 0)
        for (int s = s_begin; s < s_begin + S && s < s_end; ++s) produce(s);

    const uint4 *wp = a.pw + (size_t)nt * nst * kLaneStage + (h * 4 + w) * 32 + lane;
    const uint4 *mp = a.pm + (size_t)nt * kLaneGroup + (h * 4 + w) * 8 + g;
    const size_t m_pitch = (size_t)ntiles * kLaneGroup;
    constexpr int PF = PROBE_AHEAD; /* stages the words are loaded ahead */
    uint4 qv[PF], mv[PF];
    auto fetch = [&](int s, int slot) {
        s = s < s_end ? s : s_end - 1; /* past the slice: a harmless reload, no branch */
        qv[slot] = __ldg(wp + (size_t)s * kLaneStage);
        mv[slot] = __ldg(mp + (size_t)(s >> a.gshift) * m_pitch);
    };
#pragma unroll
    for (int p = 0; p < PF; ++p) fetch(s_begin + p, p);

    float acc[NT / 2];
#pragma unroll
    for (int e = 0; e < NT / 2; ++e) acc[e] = 0.0f;
    /* Each k16 step is a commit group of its own.  Step kk of stage s rewrites af[kk] once
     * step kk of stage s - 1, its last reader, is complete: while a warp dequantizes a step,
     * the three before it stay queued on the tensor cores.  (ptxas keeps the pipeline for
     * at most three groups pending at a step's wait; with more it serializes every wgmma,
     * C7513.) */
    uint32_t af[4][4];
    int j = 0, jr = 0;   /* the buffers of stages s and s - 1 */
    uint32_t phase = 0;  /* the parity of buffer j's fills */
    const uint64_t desc0 = wg::x_desc(base);
    auto stage = [&](int s, auto slot) {
        constexpr int Q = decltype(slot)::value;
        uint32_t words[4] = {qv[Q].x, qv[Q].y, qv[Q].z, qv[Q].w};
        const uint4 op = mv[Q];
        fetch(s + PF, Q);
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
    for (int s = s_begin; s < s_end; s += PF) {
        stage(s, std::integral_constant<int, 0>());
        stage(s + 1, std::integral_constant<int, 1>());
        if constexpr (PF == 4) {
            stage(s + 2, std::integral_constant<int, 2>());
            stage(s + 3, std::integral_constant<int, 3>());
        }
    }
    wg::wgmma_wait<0>();
#pragma unroll
    for (int e = 0; e < NT / 2; ++e) asm volatile("" : "+f"(acc[e])::"memory"); /* after the wait */

    /* accumulator 4 q + 2 r + e: output column 64 h + 16 w + 2 g + r, row 8 q + 2 i + e of the tile */
    const int col = nt * kBN + 64 * h + 16 * w + 2 * g;
    if (a.split == 1) {
#pragma unroll
        for (int q = 0; q < NT / 8; ++q)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int m = m0 + 8 * q + 2 * i + e;
                if (m < a.M)
                    *reinterpret_cast<uint32_t *>(a.y + ((size_t)m * a.N + col) * 2) =
                        pack_pair<T>(acc[4 * q + e], acc[4 * q + 2 + e]);
            }
        return;
    }
    /* the cluster's sum, rank 0 first: each block's tile into its shared memory, then every block
     * finishes a share of the rows from all of them */
    constexpr int kPitch = Tile<NT>::kPitch;
    float *part = reinterpret_cast<float *>(sm);
    __syncthreads(); /* every warp's products are done: the stages may be overwritten */
    const int c = 64 * h + 16 * w + 2 * g;
#pragma unroll
    for (int q = 0; q < NT / 8; ++q)
#pragma unroll
        for (int e = 0; e < 2; ++e)
            *reinterpret_cast<float2 *>(part + (8 * q + 2 * i + e) * kPitch + c) =
                make_float2(acc[4 * q + e], acc[4 * q + 2 + e]);
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    cluster.sync();
    for (int u = rank * kThreads + tid; u < NT * (kBN / 8); u += a.split * kThreads) {
        const int row = u / (kBN / 8), c8 = u % (kBN / 8);
        if (m0 + row >= a.M) continue;
        float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (int r = 0; r < a.split; ++r) {
            const float4 *p = reinterpret_cast<const float4 *>(cluster.map_shared_rank(part, r) + row * kPitch + 8 * c8);
            const float4 lo = p[0], hi = p[1];
            v[0] += lo.x, v[1] += lo.y, v[2] += lo.z, v[3] += lo.w;
            v[4] += hi.x, v[5] += hi.y, v[6] += hi.z, v[7] += hi.w;
        }
        *reinterpret_cast<uint4 *>(a.y + ((size_t)(m0 + row) * a.N + nt * kBN + 8 * c8) * 2) =
            make_uint4(pack_pair<T>(v[0], v[1]), pack_pair<T>(v[2], v[3]), pack_pair<T>(v[4], v[5]),
                       pack_pair<T>(v[6], v[7]));
    }
    cluster.sync(); /* no block leaves while another reads its sums */
#else
    (void)a;
#endif
}

template <class T, int NT> int launch_tile(const Args &a, const void *x, EncodeTiled encode, cudaStream_t stream)
{
    CUtensorMap tx;
    const CUtensorMapDataType xt =
        std::is_same<T, F16T>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    if (tensor_map(encode, &tx, xt, x, a.M, a.K, 2, kBK, NT)) return -3;
    cudaError_t e =
        cudaFuncSetAttribute(reg_kernel<T, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile<NT>::kSmem);
    if (e != cudaSuccess) return (int)e;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(((a.M + NT - 1) / NT) * (a.N / kBN) * a.split));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = Tile<NT>::kSmem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)a.split;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return (int)cudaLaunchKernelEx(&cfg, reg_kernel<T, NT>, a, tx);
}

} // namespace

/* dtype 0 float16, 1 bfloat16; nt 128 or 256 rows of x a block; split 1, 2, 4 or 8.
 * 0, a CUDA error, or -1 (shape), -2 (no tensor-map encoder), -3 (tensor map refused). */
extern "C" int prefill_reg_launch(int dtype, int nt, int split, const void *x, const void *pw, const void *pm, void *y,
                                  int M, int N, int K, int G, cudaStream_t stream)
{
    if (M < 1 || N % kBN || K % kBK || G % kBK || K % G || (nt != 128 && nt != 256) ||
        (split != 1 && split != 2 && split != 4 && split != 8) || (K / kBK) % (PROBE_AHEAD * split))
        return -1;
    const EncodeTiled encode = tensor_map_encoder();
    if (!encode) return -2;
    int gshift = 0;
    while ((kBK << gshift) < G) ++gshift;
    if ((kBK << gshift) != G) return -1;
    const Args a{static_cast<const uint4 *>(pw), static_cast<const uint4 *>(pm), static_cast<char *>(y), M, N, K, G,
                 split, gshift};
    if (dtype == 0)
        return nt == 256 ? launch_tile<F16T, 256>(a, x, encode, stream) : launch_tile<F16T, 128>(a, x, encode, stream);
    return nt == 256 ? launch_tile<BF16T, 256>(a, x, encode, stream) : launch_tile<BF16T, 128>(a, x, encode, stream);
}
