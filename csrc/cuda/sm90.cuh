/*
 * cuda/sm90.cuh -- Hopper's asynchronous copies: mbarriers, the tensor
 * memory accelerator's 2-D copy (cp.async.bulk.tensor) and the driver's
 * tensor-map encoder, reached through the runtime (nothing links against
 * libcuda).  Used by the prepared-layout kernel (cuda/linear_prepared.cuh)
 * and by the sm_90a probes in scripts/.
 */
#ifndef AWQ_CUDA_SM90_CUH
#define AWQ_CUDA_SM90_CUH

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/linear_wgmma.cuh" /* AWQ_WGMMA_CODE */

namespace awq_cu {
namespace sm90 {

#if AWQ_WGMMA_CODE

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* Why: spins on try_wait, which itself suspends the thread for a while. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    uint32_t ok = 0;
    while (!ok)
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(ok)
                     : "r"(bar), "r"(parity)
                     : "memory");
}
/* Why: one 2-D box of a tensor map into shared memory; the barrier counts its bytes. */
__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

#endif /* AWQ_WGMMA_CODE */

typedef CUresult (*EncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* Why: the driver's cuTensorMapEncodeTiled through the runtime, looked up
 * once per process; nullptr where the driver has none. */
inline EncodeTiled tensor_map_encoder()
{
    static const EncodeTiled encode = [] {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) !=
                cudaSuccess ||
            found != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            return (EncodeTiled) nullptr;
        }
        return (EncodeTiled)p;
    }();
    return encode;
}

/* Why: a row-major [rows, cols] tensor map with boxes of [box_rows, box_cols]
 * in the 128-byte swizzle (box_cols x elem_bytes = 128); rows past the tensor
 * read as zeros.  0, or -1 where the driver refuses it. */
inline int tensor_map(EncodeTiled encode, CUtensorMap *map, CUtensorMapDataType type, const void *p, int64_t rows,
                      int64_t cols, int elem_bytes, int box_cols, int box_rows)
{
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)cols * elem_bytes};
    const cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows};
    const cuuint32_t unit[2] = {1, 1};
    return encode(map, type, 2, const_cast<void *>(p), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) ==
                   CUDA_SUCCESS
               ? 0
               : -1;
}

} // namespace sm90
} // namespace awq_cu

#endif /* AWQ_CUDA_SM90_CUH */
