// scripts/prefill_overlap_probe.cu -- a dequantize kernel for a second stream
// that holds only the multiprocessors it is given, so that it can write the
// next projection's float16 weights while the current projection's GEMM
// runs on the others (docs/KERNELS.md, "Measured on the H100: dequantizing
// beside the GEMM").  Not part of the package: driven by
// scripts/prefill_overlap_probe.py.
//
//     nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 \
//          -shared -Xcompiler -fPIC scripts/prefill_overlap_probe.cu -o prefill_overlap_probe.so
//
// W [K, N] float16 = (q - z) * s from AWQ's qweight [K, N/8], qzeros
// [K/G, N/8] and scales [K/G, N]; N % 8 == 0, G % kRows == 0.  Three ways to
// store it: plain or streaming 16-byte stores from each thread, or a tile at a
// time through shared memory and the bulk copy engine.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

// Rows of one word column a thread dequantizes per item: its kRows loads of
// qweight are in flight together, and one group's zero and scales serve all.
constexpr int kRows = 8;

// Column j of a word sits at nibble kShift[j]: AWQ packs columns 0, 2, 4, 6, 1, 3, 5, 7.
__constant__ int kShift[8] = {0, 16, 4, 20, 8, 24, 12, 28};

// A grid of any size walks all K / kRows x N / 8 items (grid-stride), so the
// caller chooses how many multiprocessors it takes: with the dynamic shared
// memory it is launched with, one block fills one multiprocessor.  Each
// weight is one exact (q - z) times its scale, rounded once: the bits of
// awq_fast_dequant.dequantize.
template <bool kStreaming>
__global__ void side_dequant_kernel(const uint32_t *__restrict__ qweight, const uint32_t *__restrict__ qzeros,
                                    const __half *__restrict__ scales, __half *__restrict__ out, int words, int G,
                                    long long items)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < items;
         i += (long long)gridDim.x * blockDim.x) {
        const long long c = i % words, k0 = i / words * kRows, g = k0 / G;
        uint32_t q[kRows];
#pragma unroll
        for (int r = 0; r < kRows; r++)
            q[r] = __ldcs(qweight + (k0 + r) * words + c);  // read once: evict first
        const uint32_t z = __ldg(qzeros + g * words + c);
        const uint4 s8 = __ldg(reinterpret_cast<const uint4 *>(scales + (g * words + c) * 8));
        const __half *s = reinterpret_cast<const __half *>(&s8);
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            uint4 o;
            __half *h = reinterpret_cast<__half *>(&o);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int d = (int)((q[r] >> kShift[j]) & 15) - (int)((z >> kShift[j]) & 15);
                h[j] = __hmul(__int2half_rn(d), s[j]);  // d is exact in float16
            }
            uint4 *dst = reinterpret_cast<uint4 *>(out + ((k0 + r) * words + c) * 8);
            if (kStreaming)
                __stcs(dst, o);
            else
                *dst = o;
        }
    }
}

// The same weights written through shared memory and the bulk copy engine:
// a block dequantizes a tile of kTileRows rows x kTileWords words (1,024
// columns) into one of two shared buffers, and thread 0 copies its rows out
// with cp.async.bulk (one 2 KB copy a row), so that the stores leave the
// warps' instruction stream.  Needs N % 1024 == 0 and G % kTileRows == 0;
// launched with 1,024 threads and 2 x 64 KB of dynamic shared memory.
constexpr int kTileRows = 32, kTileWords = 128;

__global__ void __launch_bounds__(1024) side_dequant_bulk_kernel(const uint32_t *__restrict__ qweight,
                                                                 const uint32_t *__restrict__ qzeros,
                                                                 const __half *__restrict__ scales,
                                                                 __half *__restrict__ out, int words, int G,
                                                                 long long tiles)
{
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int kRowBytes = kTileWords * 16, kTileBytes = kTileRows * kRowBytes;
    const int w = threadIdx.x % kTileWords, r0 = threadIdx.x / kTileWords;  // 8 row lanes
    const int col_tiles = words / kTileWords;
    int it = 0;
    for (long long t = blockIdx.x; t < tiles; t += gridDim.x, it++) {
        unsigned char *buf = smem + (it & 1) * kTileBytes;
        if (threadIdx.x == 0)  // the copies of two tiles ago have read this buffer
            asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        __syncthreads();
        const long long k0 = t / col_tiles * kTileRows, c = (long long)(t % col_tiles) * kTileWords + w, g = k0 / G;
        uint32_t q[kTileRows / 8];
#pragma unroll
        for (int i = 0; i < kTileRows / 8; i++)
            q[i] = __ldcs(qweight + (k0 + r0 + 8 * i) * words + c);
        const uint32_t z = __ldg(qzeros + g * words + c);
        const uint4 s8 = __ldg(reinterpret_cast<const uint4 *>(scales + (g * words + c) * 8));
        const __half *s = reinterpret_cast<const __half *>(&s8);
#pragma unroll
        for (int i = 0; i < kTileRows / 8; i++) {
            uint4 o;
            __half *h = reinterpret_cast<__half *>(&o);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int d = (int)((q[i] >> kShift[j]) & 15) - (int)((z >> kShift[j]) & 15);
                h[j] = __hmul(__int2half_rn(d), s[j]);
            }
            *reinterpret_cast<uint4 *>(buf + (r0 + 8 * i) * kRowBytes + w * 16) = o;
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the copy engine sees the stores
        __syncthreads();
        if (threadIdx.x == 0) {
            const uint32_t base = (uint32_t)__cvta_generic_to_shared(buf);
            for (int r = 0; r < kTileRows; r++) {
                __half *dst = out + ((k0 + r) * words + c - w) * 8;
                asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst),
                             "r"(base + r * kRowBytes), "n"(kRowBytes)
                             : "memory");
            }
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }
    }
    if (threadIdx.x == 0)
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// The store ceiling of the same grid: W's bytes written with zeros, nothing
// read, the plain kernel's 16-byte stores in its order.
__global__ void fill_kernel(uint4 *__restrict__ out, int words, long long items)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < items;
         i += (long long)gridDim.x * blockDim.x) {
        const long long c = i % words, k0 = i / words * kRows;
#pragma unroll
        for (int r = 0; r < kRows; r++)
            out[(k0 + r) * words + c] = make_uint4(0, 0, 0, 0);
    }
}

}  // namespace

// W's [K, N] float16 bytes written with zeros on the same grid; codes as below.
extern "C" int fill_launch(void *out, int K, int N, int blocks, int threads, int smem, cudaStream_t stream)
{
    if (K < 1 || K % kRows || N % 8 || blocks < 1) return -1;
    if (cudaFuncSetAttribute(fill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
        return -2;
    fill_kernel<<<blocks, threads, smem, stream>>>(static_cast<uint4 *>(out), N / 8, (long long)(K / kRows) * (N / 8));
    return cudaGetLastError() == cudaSuccess ? 0 : -3;
}

// 0 on success; -1 for a shape the kernel does not take, -2 when the shared
// memory cannot be granted, -3 when the launch fails.
// mode 0: plain stores, 1: streaming stores, 2: bulk copies from shared memory
// (threads and smem are then the kernel's own).
extern "C" int side_dequant_launch(int mode, const void *qweight, const void *qzeros, const void *scales, void *out,
                                   int K, int N, int G, int blocks, int threads, int smem, cudaStream_t stream)
{
    if (K < 1 || N < 8 || G < 1 || K % G || G % kRows || N % 8 || blocks < 1 || mode < 0 || mode > 2) return -1;
    const auto *qw = static_cast<const uint32_t *>(qweight);
    const auto *qz = static_cast<const uint32_t *>(qzeros);
    const auto *sc = static_cast<const __half *>(scales);
    auto *o = static_cast<__half *>(out);
    if (mode == 2) {
        if (N % (8 * kTileWords) || G % kTileRows) return -1;
        smem = 2 * kTileRows * kTileWords * 16;
        if (cudaFuncSetAttribute(side_dequant_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
            cudaSuccess)
            return -2;
        const long long tiles = (long long)(K / kTileRows) * (N / 8 / kTileWords);
        side_dequant_bulk_kernel<<<blocks, 8 * kTileWords, smem, stream>>>(qw, qz, sc, o, N / 8, G, tiles);
    } else {
        auto kernel = mode ? side_dequant_kernel<true> : side_dequant_kernel<false>;
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
            return -2;
        const long long items = (long long)(K / kRows) * (N / 8);
        kernel<<<blocks, threads, smem, stream>>>(qw, qz, sc, o, N / 8, G, items);
    }
    return cudaGetLastError() == cudaSuccess ? 0 : -3;
}
