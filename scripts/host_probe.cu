// What one dequantize call's host time is made of, piece by piece: each
// function times `n` repetitions of one piece in a C loop and returns
// microseconds per repetition (negative on a CUDA or DLPack error).
// Built and driven by scripts/host_probe.py; not part of the package.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <chrono>

namespace {

// A 64-byte parameter block, the size of the package's kernel arguments.
struct Params {
    const unsigned *src;
    unsigned *dst;
    const void *pad0;
    void *pad1;
    unsigned words[8];
};
static_assert(sizeof(Params) == 64, "64 bytes of kernel parameters");

__global__ void probe_kernel(const Params p)
{
    if (threadIdx.x == 1023 && p.words[0] == 12345u) p.dst[0] = p.src[0];
}

// The DLPack C exchange API table, written from the DLPack 1.x spec: only the
// two entries timed here are named.
struct DLDevice { int type, id; };
struct DLDataType { unsigned char code, bits; unsigned short lanes; };
struct DLTensor {
    void *data;
    DLDevice device;
    int ndim;
    DLDataType dtype;
    long long *shape, *strides;
    unsigned long long byte_offset;
};
struct ExchangeApi {
    unsigned version[2];
    const void *prev_api;
    const void *allocator, *from_py, *to_py;
    int (*dltensor_from_py)(void *obj, DLTensor *out);
    int (*current_work_stream)(int device_type, int device_id, void **stream);
};

unsigned *g_buf;
PFN_cuLaunchKernel_v4000 g_cu_launch;
cudaKernel_t g_kernel;

using Clock = std::chrono::steady_clock;
double per_call_us(Clock::time_point t0, int n)
{
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n;
}

}  // namespace

extern "C" int probe_init()
{
    if (cudaMalloc(&g_buf, 64) != cudaSuccess) return 1;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuLaunchKernel", reinterpret_cast<void **>(&g_cu_launch), 12000,
                                         cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return 2;
    if (cudaGetKernel(&g_kernel, reinterpret_cast<const void *>(probe_kernel)) != cudaSuccess) return 3;
    return 0;
}

// mode 0: probe_kernel<<<2304, 64>>> + cudaGetLastError (the package's way)
// mode 1: the same through the driver: cuLaunchKernel on the CUkernel
extern "C" double launch_loop(int n, int mode, unsigned long long stream)
{
    const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    Params p{g_buf, g_buf + 4, nullptr, nullptr, {1, 2, 3, 4, 5, 6, 7, 8}};
    void *args[] = {&p};
    int bad = 0;
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
        if (mode == 0) {
            probe_kernel<<<2304, 64, 0, s>>>(p);
            bad |= cudaGetLastError();
        } else {
            bad |= g_cu_launch(reinterpret_cast<CUfunction>(g_kernel), 2304, 1, 1, 64, 1, 1, 0,
                               reinterpret_cast<CUstream>(s), args, nullptr);
        }
    }
    return bad ? -1.0 : per_call_us(t0, n);
}

// Called through ctypes.PyDLL: the GIL is held, as in a dequantize call.
extern "C" double dltensor_loop(int n, const void *api, void *obj)
{
    const ExchangeApi *a = static_cast<const ExchangeApi *>(api);
    DLTensor t;
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i)
        if (a->dltensor_from_py(obj, &t) != 0) return -1.0;
    return per_call_us(t0, n);
}

extern "C" double stream_loop(int n, const void *api, int device)
{
    const ExchangeApi *a = static_cast<const ExchangeApi *>(api);
    void *s;
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i)
        if (a->current_work_stream(2 /* kDLCUDA */, device, &s) != 0) return -1.0;
    return per_call_us(t0, n);
}

extern "C" double get_device_loop(int n)
{
    int d;
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i)
        if (cudaGetDevice(&d) != cudaSuccess) return -1.0;
    return per_call_us(t0, n);
}
