/*
 * cuda/launch.cuh -- host-side plumbing shared by every kernel file: error
 * handling, the current-device scope, cached device facts, and the one way
 * kernels are launched.  No kernels and no Python here.
 */
#ifndef AWQ_CUDA_LAUNCH_CUH
#define AWQ_CUDA_LAUNCH_CUH

#include <cuda.h> /* driver types only: the driver is reached through the runtime (see launch) */
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "awq.h"
#include "cuda/cuda.h"

namespace awq_cu {

/* Returns e, leaving no stale runtime error for the next caller. */
inline cudaError_t clear_error(cudaError_t e)
{
    if (e != cudaSuccess) (void)cudaGetLastError();
    return e;
}

inline awq_status status_of(cudaError_t e)
{
    if (e == cudaSuccess) return AWQ_OK;
    if (e == cudaErrorInvalidDevice || e == cudaErrorNoDevice) return AWQ_ERR_DEVICE;
    return AWQ_ERR_CUDA;
}

inline void set_detail(int *detail, int v)
{
    if (detail) *detail = v;
}

/* Makes `dev` current for a scope (only if it is not already) and restores
 * the caller's device on exit. */
class DeviceScope {
  public:
    cudaError_t enter(int dev)
    {
        cudaError_t e = clear_error(cudaGetDevice(&prev_));
        if (e != cudaSuccess) return e;
        if (prev_ == dev) return cudaSuccess;
        e = clear_error(cudaSetDevice(dev));
        if (e == cudaSuccess) changed_ = true;
        return e;
    }
    ~DeviceScope()
    {
        if (changed_) (void)clear_error(cudaSetDevice(prev_));
    }

  private:
    int prev_ = 0;
    bool changed_ = false;
};

/* Both events destroyed on every path. */
struct EventPair {
    cudaEvent_t start = nullptr, stop = nullptr;
    ~EventPair()
    {
        if (start) (void)clear_error(cudaEventDestroy(start));
        if (stop) (void)clear_error(cudaEventDestroy(stop));
    }
};

/* ---- device facts (launch.cu), cached per ordinal: the hot path reads
 * them on every launch.  The cache is process-wide by nature: it describes
 * the devices, not a module. */
struct DeviceInfo {
    char name[256]; /* cudaDeviceProp::name is 256 bytes */
    int major, minor, sms, threads_per_sm, blocks_per_sm;
    int64_t smem_per_block_optin; /* dynamic shared memory a block may opt into */
};

cudaError_t device_info(int dev, DeviceInfo *out);

/* What a launch can keep resident on a device: SMs and the per-SM thread
 * and block limits (blocks_per_sm 0: no separate limit known); H100/H200
 * figures if the query fails. */
struct Residency {
    int64_t sms, threads_per_sm, blocks_per_sm;
};

Residency residency(int dev);

/* Threads the whole device holds at once (one "wave"). */
int64_t device_resident_threads(int dev);

/* Blocks of `block` threads the whole device holds at once, by the thread
 * and block limits per SM (registers may allow fewer). */
int64_t device_resident_blocks(int dev, int block);

/* ---- launching -------------------------------------------------------
 *
 * Every kernel goes out through launch<kernel>(grid, block, stream, args):
 * the driver's cuLaunchKernel on the kernel's context-independent handle
 * (cudaGetKernel), both found once through the runtime, so nothing links
 * against libcuda.  That costs less per launch than the runtime's <<<>>>
 * and cudaGetLastError (docs/KERNELS.md, "Launching", has the figures).
 * Anything else -- a runtime older than 12.5, a driver without the entry
 * point, a thread with no current context yet, a failed launch -- goes
 * through the runtime's cudaLaunchKernel, which binds the current device's
 * primary context and reports the runtime's own error for a launch that
 * cannot run.  A failed cuLaunchKernel enqueues nothing, so the retry never
 * runs a kernel twice.  AWQ_FAST_DEQUANT_RUNTIME_LAUNCH=1 (read once per
 * process) keeps every launch on the runtime path.
 */
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12050
#define AWQ_DRIVER_LAUNCH 1
#else
#define AWQ_DRIVER_LAUNCH 0
#endif

#if AWQ_DRIVER_LAUNCH
/* cuLaunchKernel's signature (unchanged since CUDA 4.0). */
using DriverLaunchFn = CUresult(CUDAAPI *)(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                                           unsigned block_x, unsigned block_y, unsigned block_z,
                                           unsigned shared_bytes, CUstream stream, void **params,
                                           void **extra);

/* cuLaunchKernel, or nullptr (launch.cu): resolved once per process. */
DriverLaunchFn driver_launch_fn();

/* The context-independent handle of one kernel, as the CUfunction that
 * cuLaunchKernel accepts for it; nullptr when the runtime has none. */
template <auto Kernel> CUfunction driver_handle()
{
    static std::atomic<CUfunction> handle{nullptr};
    static std::atomic<bool> unavailable{false};
    CUfunction f = handle.load(std::memory_order_acquire);
    if (f != nullptr || unavailable.load(std::memory_order_relaxed)) return f;
    cudaKernel_t k = nullptr;
    if (clear_error(cudaGetKernel(&k, reinterpret_cast<const void *>(Kernel))) != cudaSuccess || k == nullptr) {
        unavailable.store(true, std::memory_order_relaxed);
        return nullptr;
    }
    f = reinterpret_cast<CUfunction>(k);
    handle.store(f, std::memory_order_release);
    return f;
}
#endif

/* Grid, block and dynamic shared memory of one launch. */
struct LaunchShape {
    dim3 grid;
    dim3 block;
    unsigned smem = 0;
};

/* Launches Kernel<<<s.grid, s.block, s.smem, stream>>>(args...) and returns
 * its launch error (cudaSuccess once enqueued); leaves no stale runtime
 * error. */
template <auto Kernel, class... Args> cudaError_t launch(const LaunchShape &s, cudaStream_t stream, Args... args)
{
    static_assert(std::is_same<decltype(Kernel), void (*)(Args...)>::value,
                  "the arguments are the kernel's parameters, type for type");
    void *params[] = {static_cast<void *>(&args)..., nullptr};
#if AWQ_DRIVER_LAUNCH
    if (const DriverLaunchFn drive = driver_launch_fn()) {
        const CUfunction f = driver_handle<Kernel>();
        if (f != nullptr && drive(f, s.grid.x, s.grid.y, s.grid.z, s.block.x, s.block.y, s.block.z, s.smem,
                                  reinterpret_cast<CUstream>(stream), params, nullptr) == CUDA_SUCCESS)
            return cudaSuccess;
    }
#endif
    return clear_error(
        cudaLaunchKernel(reinterpret_cast<const void *>(Kernel), s.grid, s.block, params, s.smem, stream));
}

/* Launches Kernel as clusters of `cluster_x` consecutive blocks along x
 * (sm_90+: a cluster's blocks run at the same time and may read each
 * other's shared memory; grid.x must be a multiple of cluster_x).  It goes
 * through the runtime's cudaLaunchKernelExC, the one launch call that takes
 * a cluster dimension; kernels without clusters keep `launch`.  Returns the
 * launch error, leaving no stale runtime error. */
template <auto Kernel, class... Args>
cudaError_t launch_cluster(const LaunchShape &s, unsigned cluster_x, cudaStream_t stream, Args... args)
{
    static_assert(std::is_same<decltype(Kernel), void (*)(Args...)>::value,
                  "the arguments are the kernel's parameters, type for type");
#if defined(CUDART_VERSION) && CUDART_VERSION >= 11080
    void *params[] = {static_cast<void *>(&args)..., nullptr};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster_x;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = s.grid;
    config.blockDim = s.block;
    config.dynamicSmemBytes = s.smem;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = 1;
    return clear_error(cudaLaunchKernelExC(&config, reinterpret_cast<const void *>(Kernel), params));
#else
    (void)s, (void)cluster_x, (void)stream;
    return cudaErrorNotSupported; /* clusters need CUDA 11.8 */
#endif
}

/* A 1-D launch without dynamic shared memory. */
template <auto Kernel, class... Args>
cudaError_t launch(unsigned grid, unsigned block, cudaStream_t stream, Args... args)
{
    return launch<Kernel>(LaunchShape{dim3(grid), dim3(block), 0}, stream, args...);
}

/* Blocks for `count` items of `per_block`, capped at gridDim.x's limit (the
 * kernels' grid-stride loops cover the rest). */
inline unsigned grid_for(int64_t count, int per_block)
{
    const int64_t blocks = (count + per_block - 1) / per_block;
    const int64_t cap = 2147483647; /* 2^31 - 1: gridDim.x limit */
    return (unsigned)(blocks < cap ? (blocks < 1 ? 1 : blocks) : cap);
}

/* ---- timing (the autotuner's clock) ----------------------------------- */

constexpr int kMaxTimedRuns = 32;

/* On `device` (made current for the call): `warmup` calls of launch_once(),
 * then `iters` calls, each preceded by a write of `flush` (when it is for
 * this device) and bracketed by its own events on `stream`; *ms receives
 * the median.  Synchronizes on the last event only. */
template <class F>
cudaError_t time_launches(int device, cudaStream_t stream, const awq_cuda_flush *flush, int warmup, int iters,
                          F &&launch_once, float *ms)
{
    const bool cold = flush && flush->ptr && flush->device == device;
    DeviceScope scope;
    EventPair ev[kMaxTimedRuns];
    float t[kMaxTimedRuns];
    cudaError_t e = scope.enter(device);
    for (int i = 0; i < iters && e == cudaSuccess; ++i) {
        e = clear_error(cudaEventCreate(&ev[i].start));
        if (e == cudaSuccess) e = clear_error(cudaEventCreate(&ev[i].stop));
    }
    for (int i = 0; i < warmup && e == cudaSuccess; ++i) e = clear_error(launch_once());
    for (int i = 0; i < iters && e == cudaSuccess; ++i) {
        if (cold) e = clear_error(cudaMemsetAsync(flush->ptr, i & 0xFF, flush->bytes, stream));
        if (e == cudaSuccess) e = clear_error(cudaEventRecord(ev[i].start, stream));
        if (e == cudaSuccess) e = clear_error(launch_once());
        if (e == cudaSuccess) e = clear_error(cudaEventRecord(ev[i].stop, stream));
    }
    if (e == cudaSuccess) e = clear_error(cudaEventSynchronize(ev[iters - 1].stop));
    for (int i = 0; i < iters && e == cudaSuccess; ++i)
        e = clear_error(cudaEventElapsedTime(&t[i], ev[i].start, ev[i].stop));
    if (e != cudaSuccess) return e;
    std::sort(t, t + iters);
    *ms = iters % 2 ? t[iters / 2] : 0.5f * (t[iters / 2 - 1] + t[iters / 2]);
    return cudaSuccess;
}

} // namespace awq_cu

#endif /* AWQ_CUDA_LAUNCH_CUH */
