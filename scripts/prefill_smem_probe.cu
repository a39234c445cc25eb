// scripts/prefill_smem_probe.cu -- a fused W4A16 GEMM for prefill-sized M in
// which W is dequantized into shared memory and wgmma reads both operands
// from there (docs/KERNELS.md, "Measured on the H100: W dequantized into
// shared memory").  Not part of the package: a probe of the design, built
// and driven by scripts/prefill_smem_probe.py.
//
//     nvcc -O3 -std=c++17 -I csrc -gencode arch=compute_90a,code=sm_90a \
//          -shared -Xcompiler -fPIC scripts/prefill_smem_probe.cu -o prefill_smem_probe.so
//
// y = x @ W (+ bias), x [M, K] and W [K, N] in float16 or bfloat16, W from
// AWQ's qweight / qzeros / scales; N % 256 == 0, K % 64 == 0, G % 64 == 0.
//
// A block takes BM rows of x (128 or 64) and 256 output columns, in stages
// of 64 k.  Its two warpgroups each issue wgmma.m64nNTk16 with both operands
// in shared memory: at BM = 128 warpgroup c takes rows 64 c .. and all 256
// columns (NT = 256), at BM = 64 all rows and columns 128 c .. (NT = 128).
// Between issuing stage s and waiting for stage s - 1, every thread
// dequantizes its 64 weights of stage s + 1 into shared memory, so that the
// tensor cores multiply while the warps dequantize.  Thread 0 copies x and
// qweight with the tensor memory accelerator, S stages ahead.
//
// Buffer b of stage s (s % S), 1 KB aligned:
//   x        [BM][128 B]   64 k of a row, TMA's 128-byte swizzle (16-byte chunk
//                          c of row r at c ^ (r % 8)), which is wgmma's
//   W        [256][128 B]  wgmma's K-major operand in the same swizzle: B row
//                          8 w + (col ^ (w % 8)) holds output column 8 w + col,
//                          so that the 8 lanes of a quarter-warp, which store
//                          the same col of 8 words w, hit 8 different chunks
//   qweight  [64][128 B]   32 words of a row, TMA's 128-byte swizzle
// Warp kb dequantizes rows 8 kb .. 8 kb + 7 of the stage, lane w word column w.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/linear_wgmma.cuh" /* the descriptor, fence and wait wrappers; the dequantization helpers */
#include "cuda/sm90.cuh"   /* mbarriers, the tensor memory accelerator */

namespace {

using namespace awq_cu;
using namespace awq_cu::sm90;

constexpr int kBN = 256;         /* output columns of a block */
constexpr int kBK = 64;          /* k of a stage: one 128-byte row of x */
constexpr int kThreads = 256;    /* two warpgroups */
constexpr int kStages = 4;
constexpr int kW = kBN * 128;
constexpr int kQ = kBK * 128;
template <int BM> struct Tile {
    static constexpr int kX = BM * 128;
    static constexpr int kBuf = kX + kW + kQ;
    static constexpr int kSmem = kStages * kBuf + 1024;
    static constexpr int kNT = BM == 128 ? 256 : 128;
};
static_assert(Tile<128>::kSmem <= 227 * 1024, "four stages of the 128-row tile fit a multiprocessor");

struct Args {
    const char *x;
    const uint32_t *qweight, *qzeros;
    const char *scales, *bias;
    char *y;
    int M, N, K, G;
};

#if AWQ_WGMMA_CODE

/* The asm of one wgmma with both operands in shared memory: D accumulated,
 * A and B not negated, both K-major. */
#define PROBE_D8(o)                                                                                                \
    "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), "+f"(d[o + 6]),   \
        "+f"(d[o + 7])
#define PROBE_D64(o) PROBE_D8(o), PROBE_D8(o + 8), PROBE_D8(o + 16), PROBE_D8(o + 24), PROBE_D8(o + 32),            \
                     PROBE_D8(o + 40), PROBE_D8(o + 48), PROBE_D8(o + 56)
#define PROBE_R8(a, b, c, d, e, f, g, h) "%" #a ",%" #b ",%" #c ",%" #d ",%" #e ",%" #f ",%" #g ",%" #h
template <class T, int NT> __device__ __forceinline__ void wgmma_ss(float (&d)[NT / 2], uint64_t da, uint64_t db);
/* The 64 or 128 register names, generated once: %0 .. %(NT/2 - 1). */
#define PROBE_REGS64                                                                                               \
    PROBE_R8(0, 1, 2, 3, 4, 5, 6, 7) "," PROBE_R8(8, 9, 10, 11, 12, 13, 14, 15) "," PROBE_R8(                        \
        16, 17, 18, 19, 20, 21, 22, 23) "," PROBE_R8(24, 25, 26, 27, 28, 29, 30, 31) "," PROBE_R8(32, 33, 34, 35, 36, \
        37, 38, 39) "," PROBE_R8(40, 41, 42, 43, 44, 45, 46, 47) "," PROBE_R8(48, 49, 50, 51, 52, 53, 54, 55) ","     \
        PROBE_R8(56, 57, 58, 59, 60, 61, 62, 63)
#define PROBE_REGS128                                                                                              \
    PROBE_REGS64 "," PROBE_R8(64, 65, 66, 67, 68, 69, 70, 71) "," PROBE_R8(72, 73, 74, 75, 76, 77, 78, 79) ","        \
        PROBE_R8(80, 81, 82, 83, 84, 85, 86, 87) "," PROBE_R8(88, 89, 90, 91, 92, 93, 94, 95) "," PROBE_R8(          \
            96, 97, 98, 99, 100, 101, 102, 103) "," PROBE_R8(104, 105, 106, 107, 108, 109, 110, 111) ","             \
            PROBE_R8(112, 113, 114, 115, 116, 117, 118, 119) "," PROBE_R8(120, 121, 122, 123, 124, 125, 126, 127)
#define PROBE_WGMMA(SHAPE, TYPE, REGS, DA, DB, ...)                                                               \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, 1, 0;\n\twgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE   \
                 "." TYPE " {" REGS "}, " DA ", " DB ", p, 1, 1, 0, 0;\n\t}"                                        \
                 : __VA_ARGS__                                                                                     \
                 : "l"(da), "l"(db))
template <> __device__ __forceinline__ void wgmma_ss<F16T, 128>(float (&d)[64], uint64_t da, uint64_t db)
{
    PROBE_WGMMA("m64n128k16", "f16", PROBE_REGS64, "%64", "%65", PROBE_D64(0));
}
template <> __device__ __forceinline__ void wgmma_ss<BF16T, 128>(float (&d)[64], uint64_t da, uint64_t db)
{
    PROBE_WGMMA("m64n128k16", "bf16", PROBE_REGS64, "%64", "%65", PROBE_D64(0));
}
template <> __device__ __forceinline__ void wgmma_ss<F16T, 256>(float (&d)[128], uint64_t da, uint64_t db)
{
    PROBE_WGMMA("m64n256k16", "f16", PROBE_REGS128, "%128", "%129", PROBE_D64(0), PROBE_D64(64));
}
template <> __device__ __forceinline__ void wgmma_ss<BF16T, 256>(float (&d)[128], uint64_t da, uint64_t db)
{
    PROBE_WGMMA("m64n256k16", "bf16", PROBE_REGS128, "%128", "%129", PROBE_D64(0), PROBE_D64(64));
}
#undef PROBE_WGMMA
#undef PROBE_REGS128
#undef PROBE_REGS64
#undef PROBE_R8
#undef PROBE_D64
#undef PROBE_D8

#endif /* AWQ_WGMMA_CODE */

template <class T, int BM>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_smem_kernel(const Args a, const __grid_constant__ CUtensorMap tmx, const __grid_constant__ CUtensorMap tmq)
{
#if AWQ_WGMMA_CODE
    constexpr int S = kStages;
    constexpr int kX = Tile<BM>::kX, kBuf = Tile<BM>::kBuf, NT = Tile<BM>::kNT;
    extern __shared__ __align__(1024) char dsmem[];
    __shared__ uint64_t copied[S], dequantized[S], consumed[S];
    const uint32_t raw = smem_addr(dsmem);
    const uint32_t base = (raw + 1023) & ~1023u;
    char *sm = dsmem + (base - raw);
    const int tid = threadIdx.x;
    const int mtiles = (a.M + BM - 1) / BM;
    const int m0 = (int)(blockIdx.x % mtiles) * BM; /* row tiles fastest: the blocks of a column block share W in L2 */
    const int n0 = (int)(blockIdx.x / mtiles) * kBN;
    const int nst = a.K / kBK; /* stages */
    if (tid == 0)
        for (int s = 0; s < S; ++s) {
            mbar_init(smem_addr(&copied[s]), 1);
            mbar_init(smem_addr(&dequantized[s]), kThreads);
            mbar_init(smem_addr(&consumed[s]), kThreads);
        }
    __syncthreads();

    /* thread 0: x and qweight of stage s into buffer s % S once stage s - S has left it */
    auto copy = [&](int s) {
        const int b = s % S;
        if (s >= S) mbar_wait(smem_addr(&consumed[b]), (s / S - 1) & 1);
        const uint32_t bar = smem_addr(&copied[b]), xa = base + b * kBuf;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(kX + kQ) : "memory");
        tma_2d(xa, &tmx, s * kBK, m0, bar);
        tma_2d(xa + kX + kW, &tmq, n0 / AWQ_COLS_PER_WORD, s * kBK, bar);
    };
    if (tid == 0)
        for (int s = 0; s < S && s < nst; ++s) copy(s);

    const int c = tid >> 7;                 /* warpgroup */
    const int kb = tid >> 5, w = tid & 31;  /* rows 8 kb .. of a stage, word column w */
    const int W = a.N / AWQ_COLS_PER_WORD;
    const int spg = a.G / kBK;
    uint32_t zword = 0;
    uint4 sraw = make_uint4(0, 0, 0, 0);
    auto load_group = [&](int g) {
        zword = __ldg(a.qzeros + (size_t)g * W + n0 / AWQ_COLS_PER_WORD + w);
        sraw = __ldg(reinterpret_cast<const uint4 *>(a.scales) + ((size_t)g * a.N + n0) / 8 + w);
    };
    uint32_t ze[4], zo[4], se[4], so[4]; /* zero and scale operands of nibbles 2b, 2b + 1 */
    /* Why every stage, with no branch: a group's arithmetic behind a branch
     * between wgmma and its wait makes ptxas serialize the wgmma (C7515).
     * The loads fetch the group of the stage after. */
    const int ngroups = a.K / a.G;
    auto enter_stage = [&](int s) {
        const uint32_t sw[4] = {sraw.x, sraw.y, sraw.z, sraw.w};
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            ze[b] = gemv::zero_operand<T>(zword, 2 * b);
            zo[b] = gemv::zero_operand<T>(zword, 2 * b + 1);
            const int ce = gemv_map::nibble_col(2 * b), co = gemv_map::nibble_col(2 * b + 1);
            se[b] = mma_map::scale_pair(sw[ce >> 1], ce);
            so[b] = mma_map::scale_pair(sw[co >> 1], co);
        }
        load_group(min((s + 1) / spg, ngroups - 1));
    };
    auto dequantize = [&](int s) {
        const int b = s % S;
        mbar_wait(smem_addr(&copied[b]), (s / S) & 1);
        const char *qs = sm + b * kBuf + kX + kW;
        char *ws = sm + b * kBuf + kX;
        uint32_t wd[8]; /* rows 8 kb + i, word w: chunk w / 4 of the row, swizzled by i */
#pragma unroll
        for (int i = 0; i < 8; ++i)
            wd[i] = *reinterpret_cast<const uint32_t *>(qs + (8 * kb + i) * 128 + (((w >> 2) ^ i) * 16) + (w & 3) * 4);
#pragma unroll
        for (int nb = 0; nb < 4; ++nb) {
            uint32_t ev[4], od[4]; /* k pairs 2p, 2p + 1 of nibbles 2 nb, 2 nb + 1 */
#pragma unroll
            for (int p = 0; p < 4; ++p)
                gemv::dequant_pairs<T>(__byte_perm(wd[2 * p], wd[2 * p + 1], gemv_map::pair_select(nb)), ze[nb],
                                       zo[nb], se[nb], so[nb], ev[p], od[p]);
            const int re = 8 * w + (gemv_map::nibble_col(2 * nb) ^ (w & 7));
            const int ro = 8 * w + (gemv_map::nibble_col(2 * nb + 1) ^ (w & 7));
            *reinterpret_cast<uint4 *>(ws + re * 128 + ((kb ^ (re & 7)) * 16)) = make_uint4(ev[0], ev[1], ev[2], ev[3]);
            *reinterpret_cast<uint4 *>(ws + ro * 128 + ((kb ^ (ro & 7)) * 16)) = make_uint4(od[0], od[1], od[2], od[3]);
        }
        wg::fence_async_proxy(); /* the stores, visible to the tensor cores... */
        mbar_arrive(smem_addr(&dequantized[b])); /* ...once every thread's are */
    };

    float acc[NT / 2];
#pragma unroll
    for (int e = 0; e < NT / 2; ++e) acc[e] = 0.0f;
    load_group(0);
    enter_stage(0);
    dequantize(0);
    for (int s = 0; s < nst; ++s) {
        const int b = s % S;
        if (s + 1 < nst) enter_stage(s + 1);
        mbar_wait(smem_addr(&dequantized[b]), (s / S) & 1);
        const uint32_t xs = base + b * kBuf + (BM == 128 ? c * 64 * 128 : 0);
        const uint32_t ws = base + b * kBuf + kX + (BM == 128 ? 0 : c * 128 * 128);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) /* W lies as x does: one descriptor form for both */
            wgmma_ss<T, NT>(acc, wg::x_desc(xs + 32 * kk), wg::x_desc(ws + 32 * kk));
        wg::wgmma_commit();
        /* buffer (s + 1) % S held stage s + 1 - S, whose copy waited for it to be consumed */
        if (s + 1 < nst) dequantize(s + 1);
        wg::wgmma_wait<1>(); /* stage s - 1's products are done: its buffer may be refilled */
        if (s > 0) {
            mbar_arrive(smem_addr(&consumed[(s - 1) % S]));
            if (tid == 0 && s - 1 + S < nst) copy(s - 1 + S);
        }
    }
    wg::wgmma_wait<0>();
#pragma unroll
    for (int e = 0; e < NT / 2; ++e) asm volatile("" : "+f"(acc[e])::"memory"); /* after the wait */

    /* accumulator 4 j + 2 h + e: row 16 (warp % 4) + lane / 4 + 8 h, B row 8 j + 2 (lane % 4) + e */
    const int lane = tid & 31, wq = (tid >> 5) & 3;
    const int g = lane >> 2, i = lane & 3;
    using Bits = typename T::bits;
#pragma unroll
    for (int j = 0; j < NT / 8; ++j) {
        const int col0 = (2 * i) ^ (j & 7); /* output column of B row 8 j + 2 i; the next row holds col0 ^ 1 */
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = m0 + (BM == 128 ? 64 * c : 0) + 16 * wq + g + 8 * h;
            const int n = n0 + (BM == 128 ? 0 : 128 * c) + 8 * j + (col0 & ~1);
            float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
            if (col0 & 1) {
                const float t = v0;
                v0 = v1;
                v1 = t;
            }
            if (a.bias) {
                v0 += scale_to_float<T>(reinterpret_cast<const Bits *>(a.bias)[n]);
                v1 += scale_to_float<T>(reinterpret_cast<const Bits *>(a.bias)[n + 1]);
            }
            if (m < a.M) *reinterpret_cast<uint32_t *>(a.y + ((size_t)m * a.N + n) * 2) = pack_pair<T>(v0, v1);
        }
    }
#else
    (void)a;
#endif
}

template <class T, int BM> int launch_tile(const Args &a, EncodeTiled encode, cudaStream_t stream)
{
    CUtensorMap tx, tq;
    const CUtensorMapDataType xt =
        std::is_same<T, F16T>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    if (tensor_map(encode, &tx, xt, a.x, a.M, a.K, 2, kBK, BM) ||
        tensor_map(encode, &tq, CU_TENSOR_MAP_DATA_TYPE_INT32, a.qweight, a.K, a.N / AWQ_COLS_PER_WORD, 4,
                   kBN / AWQ_COLS_PER_WORD, kBK))
        return -3;
    cudaError_t e = cudaFuncSetAttribute(prefill_smem_kernel<T, BM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Tile<BM>::kSmem);
    if (e != cudaSuccess) return (int)e;
    const unsigned blocks = (unsigned)(((a.M + BM - 1) / BM) * (a.N / kBN));
    prefill_smem_kernel<T, BM><<<blocks, kThreads, Tile<BM>::kSmem, stream>>>(a, tx, tq);
    return (int)cudaGetLastError();
}

} // namespace

/* dtype 0 float16, 1 bfloat16; bm 128 or 64.  0, a CUDA error, or -1 (shape),
 * -2 (no tensor-map encoder), -3 (tensor map refused). */
extern "C" int prefill_smem_launch(int dtype, int bm, const void *x, const void *qweight, const void *qzeros,
                                   const void *scales, const void *bias, void *y, int M, int N, int K, int G,
                                   cudaStream_t stream)
{
    if (M < 1 || N % kBN || K % kBK || K < kBK || G % kBK || K % G || (bm != 128 && bm != 64)) return -1;
    const EncodeTiled encode = tensor_map_encoder();
    if (!encode) return -2;
    const Args a{static_cast<const char *>(x), static_cast<const uint32_t *>(qweight),
                 static_cast<const uint32_t *>(qzeros), static_cast<const char *>(scales),
                 static_cast<const char *>(bias), static_cast<char *>(y), M, N, K, G};
    if (dtype == 0) return bm == 128 ? launch_tile<F16T, 128>(a, encode, stream) : launch_tile<F16T, 64>(a, encode, stream);
    return bm == 128 ? launch_tile<BF16T, 128>(a, encode, stream) : launch_tile<BF16T, 64>(a, encode, stream);
}
