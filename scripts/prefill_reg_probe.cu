// scripts/prefill_reg_probe.cu -- the package's prepared-layout kernel
// (csrc/cuda/linear_prepared.cuh) launched with a tile and split given by
// the caller, where the package chooses them itself: the sweep the choice
// was fitted to (docs/KERNELS.md, "The prepared-layout kernel").  Not part
// of the package; built and driven by scripts/prefill_reg_probe.py.
//
//     nvcc -O3 -std=c++17 -I csrc -gencode arch=compute_90a,code=sm_90a \
//          -shared -Xcompiler -fPIC scripts/prefill_reg_probe.cu -o prefill_reg_probe.so
//
// y = x @ W, x [M, K] in float16 or bfloat16, W in the prepared layout
// (awq_fast_dequant.torch's prepare_prefill): N % 128 == 0, K % 128 == 0,
// G = 64 x 2^j.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/linear_prepared.cuh"
#include "cuda/sm90.cuh"

namespace {

using namespace awq_cu;

template <class T, int NT> int launch_tile(const prep::Args &a, const void *x, cudaStream_t stream)
{
    const sm90::EncodeTiled encode = sm90::tensor_map_encoder();
    if (!encode) return -2;
    CUtensorMap tx;
    const CUtensorMapDataType xt =
        std::is_same<T, F16T>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    if (sm90::tensor_map(encode, &tx, xt, x, a.M, a.K, 2, prep::kStageK, NT)) return -3;
    cudaError_t e = cudaFuncSetAttribute(prep::prepared_kernel<T, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         prep::Tile<NT>::kSmem);
    if (e != cudaSuccess) return (int)e;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(((a.M + NT - 1) / NT) * (a.N / prep::kCols) * a.split));
    cfg.blockDim = dim3(prep::kThreads);
    cfg.dynamicSmemBytes = prep::Tile<NT>::kSmem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)a.split;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return (int)cudaLaunchKernelEx(&cfg, prep::prepared_kernel<T, NT>, a, tx);
}

} // namespace

/* dtype 0 float16, 1 bfloat16; nt 128 or 256 rows of x a block; split 1, 2, 4 or 8.
 * 0, a CUDA error, or -1 (shape), -2 (no tensor-map encoder), -3 (tensor map refused). */
extern "C" int prefill_reg_launch(int dtype, int nt, int split, const void *x, const void *pw, const void *pm, void *y,
                                  int M, int N, int K, int G, cudaStream_t stream)
{
    if (M < 1 || N % prep::kCols || K % prep::kStageK || G % prep::kStageK || K % G || (nt != 128 && nt != 256) ||
        (split != 1 && split != 2 && split != 4 && split != 8) || (K / prep::kStageK) % (prep::kAhead * split))
        return -1;
    prep::Args a;
    a.words = static_cast<const uint4 *>(pw);
    a.operands = static_cast<const uint4 *>(pm);
    a.bias = nullptr;
    a.y = static_cast<char *>(y);
    a.M = M;
    a.N = N;
    a.K = K;
    a.split = split;
    a.gshift = 0;
    while ((prep::kStageK << a.gshift) < G) ++a.gshift;
    if ((prep::kStageK << a.gshift) != G) return -1;
    if (dtype == 0) return nt == 256 ? launch_tile<F16T, 256>(a, x, stream) : launch_tile<F16T, 128>(a, x, stream);
    return nt == 256 ? launch_tile<BF16T, 256>(a, x, stream) : launch_tile<BF16T, 128>(a, x, stream);
}
