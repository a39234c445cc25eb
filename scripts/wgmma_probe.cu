// scripts/wgmma_probe.cu -- the warpgroup kernel's issue pattern on the tensor
// cores, without and with a stage's memory work (docs/KERNELS.md, "Measured on
// the H200: the warpgroup kernel").  Not part of the package.
//
//     nvcc -O3 -std=c++17 -I csrc -gencode arch=compute_90a,code=sm_90a scripts/wgmma_probe.cu -o wgmma_probe
//     ./wgmma_probe
//
// Per k16 step, as in csrc/cuda/linear_wgmma.cuh: wgmma.wait_group LAG (the
// step's source passes through it), OPS ALU instructions a register to make
// fresh A registers, wgmma.fence, two wgmma.m64n128k16 with A from registers
// on two accumulators, one commit.  Every 4 steps (a stage), optionally: a
// block barrier (BAR), fence.proxy.async (FENCE), COPY 16-byte cp.async a
// thread into a ring of 8 stages of 24 KB, 6 in flight (COPY = 6: a stage of
// the two-warpgroup kernel at 128 rows), and the 16 qweight words each warp
// loads a stage (LDS), which then feed the A registers.  Prints the cycles of
// a multiprocessor per wgmma of a warpgroup, and MAC per cycle and SM (the
// tensor cores' dense float16 rate is 2048).
#include <cstdint>
#include <cstdio>

#include "cuda/linear_wgmma.cuh" /* the kernel's descriptor, wgmma and fence wrappers */

using namespace awq_cu;

/* at most LAG groups pending; x passes through, so that what is computed from it comes after */
template <int LAG> __device__ __forceinline__ void wait_through(uint32_t &x)
{
    asm volatile("wgmma.wait_group.sync.aligned %1;" : "+r"(x) : "n"(LAG) : "memory");
}

constexpr int kRing = 8;          /* stages of the copy ring */
constexpr int kInFlight = 6;      /* stages in flight */
constexpr int kStage = 24576;     /* bytes of a stage: x 16 KB + qweight 8 KB */
constexpr int kBTile = 32768;     /* the B tile the wgmma read, before the ring */
constexpr int kSrcChunks = 64 << 16; /* 16-byte chunks of the copy source (64 MiB) */
constexpr int kSmem = kBTile + kRing * kStage + 1024;

template <int LAG, int OPS, bool BAR, bool FENCE, int COPY, bool LDS>
__global__ void __launch_bounds__(256, 1) probe(int iters, long long *cycles, float *sink, uint32_t seed,
                                                const int4 *src)
{
#if AWQ_WGMMA_CODE
    extern __shared__ __align__(1024) char smem[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t base = (raw + 1023) & ~1023u;
    const char *sbase = smem + (base - raw);
    for (int i = threadIdx.x; i < kBTile / 4; i += blockDim.x) reinterpret_cast<uint32_t *>(smem)[i] = 0;
    __syncthreads();
    wg::fence_async_proxy();
    __syncthreads();
    float d0[64], d1[64];
    for (int e = 0; e < 64; ++e) d0[e] = d1[e] = 0.0f;
    const uint32_t mine = seed ^ threadIdx.x;
    const long long t0 = clock64();
    auto issue = [&](int stage) { /* this thread's COPY chunks of a stage, one commit group */
#pragma unroll
        for (int c = 0; c < COPY; ++c) {
            const int chunk = c * 256 + threadIdx.x;
            const uint32_t dst = base + kBTile + (stage % kRing) * kStage + chunk * 16;
            const int4 *g = src + ((size_t)stage * (kStage / 16) + chunk) % kSrcChunks;
            wg::cp_16(dst, g, true);
        }
        gemv::cp_commit();
    };
    for (int s = 0; s < kInFlight; ++s) issue(s);
    uint2 words[4][4];
    for (int it = 0; it < iters; ++it) { /* one stage: 4 k16 steps */
        if (COPY) gemv::cp_wait<kInFlight - 1>();
        if (FENCE) wg::fence_async_proxy();
        if (BAR) __syncthreads();
        if (COPY) issue(it + kInFlight);
        if (LDS) { /* rows 16 kk + 4 r + t % 4, 8 bytes of word pair (t / 4) % 8: 256 distinct bytes a load */
            const char *wq = sbase + kBTile + (it % kRing) * kStage + 16384;
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int row = kk * 16 + r * 4 + (threadIdx.x & 3);
                    words[kk][r] = *reinterpret_cast<const uint2 *>(wq + row * 64 + 8 * ((threadIdx.x >> 2) & 7));
                }
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            uint32_t x = mine + it * 4 + kk;
            if (LDS) x += words[kk][0].x + words[kk][1].y + words[kk][2].x + words[kk][3].y;
            wait_through<LAG>(x);
            uint32_t a[2][4];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                uint32_t v = x + r, u = x ^ r;
#pragma unroll
                for (int o = 0; o < OPS / 2; ++o) {
                    v = __byte_perm(v, u, 0x5140 + o);
                    u = (u & 0x000F000F) | 0x64006400;
                }
                a[0][r] = v & 0x3c003c00u;
                a[1][r] = u & 0x3c003c00u;
            }
            wg::wgmma_fence(a);
            const uint64_t bd = wg::x_desc(base + kk * 32);
            wg::wgmma<F16T, 128>(d0, a[0], bd);
            wg::wgmma<F16T, 128>(d1, a[1], bd);
            wg::wgmma_commit();
        }
    }
    wg::wgmma_wait<0>();
    const long long t1 = clock64();
    gemv::cp_wait<0>();
    float sum = 0;
    for (int e = 0; e < 64; ++e) sum += d0[e] + d1[e];
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
    if (sum == 12345.0f) sink[0] = sum; /* keeps the products */
#endif
}

template <int LAG, int OPS, bool BAR, bool FENCE, int COPY, bool LDS>
void run(int warpgroups, const int4 *src, int blocks)
{
    const int iters = 2048;
    long long *cycles;
    float *sink;
    cudaMalloc(&cycles, blocks * sizeof(long long));
    cudaMalloc(&sink, 4);
    auto kernel = probe<LAG, OPS, BAR, FENCE, COPY, LDS>;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    kernel<<<blocks, 128 * warpgroups, kSmem>>>(iters, cycles, sink, 7, src);
    long long c = 0;
    cudaMemcpy(&c, cycles, sizeof c, cudaMemcpyDeviceToHost); /* block 0's */
    const double per = (double)c / (iters * 8.0);
    std::printf("wait_group %d, ALU %2d, barrier %d, fence %d, copies %d, loads %d, warpgroups %d, blocks %3d: "
                "%.1f cycles a wgmma, %.0f MAC/cycle/SM%s\n",
                LAG, OPS, BAR, FENCE, COPY, LDS, warpgroups, blocks, per, 64.0 * 128 * 16 * warpgroups / per,
                cudaGetLastError() != cudaSuccess ? " (error)" : "");
    cudaFree(cycles);
    cudaFree(sink);
}

int main()
{
    int4 *src;
    cudaMalloc(&src, kSrcChunks * sizeof(int4));
    cudaMemset(src, 0, kSrcChunks * sizeof(int4));
    /* the issue pattern alone, one block */
    for (int wgs : {1, 2}) {
        run<3, 0, false, false, 0, false>(wgs, src, 1);
        run<1, 0, false, false, 0, false>(wgs, src, 1);
        run<0, 0, false, false, 0, false>(wgs, src, 1);
        run<3, 8, false, false, 0, false>(wgs, src, 1);
        run<3, 16, false, false, 0, false>(wgs, src, 1);
        run<3, 8, true, false, 0, false>(wgs, src, 1);
        run<1, 8, true, false, 0, false>(wgs, src, 1);
    }
    /* a stage's memory work added piece by piece, two warpgroups, one block or one a SM */
    for (int blocks : {1, 132}) {
        run<3, 8, true, false, 0, false>(2, src, blocks);
        run<3, 8, true, true, 0, false>(2, src, blocks);
        run<3, 8, true, true, 6, false>(2, src, blocks);
        run<3, 8, true, true, 6, true>(2, src, blocks);
        run<3, 8, true, false, 6, true>(2, src, blocks);
        run<3, 8, true, true, 0, true>(2, src, blocks);
    }
    cudaFree(src);
    return 0;
}
