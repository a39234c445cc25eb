"""How close the decode kernel is to a kernel that only reads the packed weights.

For each preset layer (float16, G = 128, one row of x) three times, each under
the method of `bench --linear` (the L2 flushed by a 256 MiB memset before
every timed launch, one launch between CUDA events, median of trials x runs):

- `read qweight`: a kernel that reads the K*N/2 bytes of qweight once with
  16-byte loads (256-thread blocks, 8 per SM, 4 loads in flight per thread,
  the words XOR-ed into a register) and writes nothing -- no kernel that
  streams the weights from memory once can be faster by much;
- `fused`: awq_fast_dequant.linear(x, ..., out=y, path="fused"): the fused
  configuration of the autotune cache (tuned at the first, untimed call when
  the cache has none), checked against the float64 reference;
- the floor model of `bench --linear`: the launch floor (v4 on a 1x8 layer)
  plus the layer's bytes at the device-to-device copy bandwidth, both
  measured here.

Printed per layer: the three times, read / floor model and fused / read.
Needs a CUDA GPU, PyTorch and CuPy (the read kernel is a CuPy RawKernel).

    python3 scripts/read_floor.py [--trials 5] [--runs 10]
"""

import argparse
import statistics
import sys

import numpy as np

READ_SRC = r"""
extern "C" __global__ void read_only(const uint4 *p, unsigned long long n, unsigned int *sink)
{
    unsigned int acc = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; t + 3 * stride < n; t += 4 * stride) {
        const uint4 a = __ldg(p + t), b = __ldg(p + t + stride);
        const uint4 c = __ldg(p + t + 2 * stride), d = __ldg(p + t + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; t < n; t += stride) {
        const uint4 a = __ldg(p + t);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x9E3779B9u) sink[0] = acc; /* keeps the loads; almost never taken */
}
"""

FLUSH_BYTES = 256 << 20
G = 128


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=5, help="trials per layer (default 5)")
    ap.add_argument("--runs", type=int, default=10, help="timed launches per trial (default 10)")
    args = ap.parse_args()

    import torch

    import awq_fast_dequant as awq
    from awq_fast_dequant.bench import (PRESETS, CudaTimer, cuda_copy_bandwidth, linear_bytes,
                                        make_inputs, tolerance_check)

    if not awq.cuda_available():
        print("read_floor.py: needs a CUDA device and a CUDA build", file=sys.stderr)
        return 2
    try:
        import cupy
    except ImportError:
        print("read_floor.py: needs CuPy (the read-only kernel is a CuPy RawKernel)", file=sys.stderr)
        return 2

    dev = torch.device("cuda", torch.cuda.current_device())
    timer = CudaTimer(torch, dev, FLUSH_BYTES)
    kernel = cupy.RawKernel(READ_SRC, "read_only")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    sink = cupy.zeros(1, dtype=cupy.uint32)

    def median(fn):
        fn()
        samples = []
        for _ in range(args.trials):
            samples += timer.run(fn, args.runs)[0]
        return statistics.median(samples)

    copy = cuda_copy_bandwidth(torch, dev, timer, 1 << 30, 20)
    gbps = copy["gbps"]
    tiny = [torch.from_numpy(np.asarray(a)).to(dev) for a in make_inputs(1, 8, 1, "float16", 0)]
    tiny_out = torch.empty((1, 8), dtype=torch.float16, device=dev)
    floor_us = median(lambda: awq.dequantize(*tiny, group_size=1, out=tiny_out, kernel="v4"))
    print(f"{torch.cuda.get_device_name(dev)}: copy {gbps:.0f} GB/s, launch floor {floor_us:.2f} us; "
          f"float16, G = {G}, M = 1, {args.trials} x {args.runs} runs, L2 flushed before each")
    print(f"{'layer (K x N)':<14} {'floor model':>11} {'read qweight':>12} {'fused':>8} "
          f"{'read/floor':>10} {'fused/read':>10}")
    rng = np.random.default_rng(0)
    for name, shapes in PRESETS.items():
        for K, N in shapes:
            qw, qz, sc = (torch.from_numpy(np.asarray(a)).to(dev) for a in make_inputs(K, N, G, "float16", 0))
            x = torch.from_numpy(rng.standard_normal((1, K)).astype(np.float16)).to(dev)
            y = torch.empty((1, N), dtype=torch.float16, device=dev)
            words = cupy.from_dlpack(qw).view(cupy.uint32)
            n16 = words.size // 4
            grid, block = (sms * 8,), (256,)

            def read(words=words, n16=n16):
                kernel(grid, block, (words, cupy.uint64(n16), sink))

            # one row of x: the floor model's memory term is the larger one
            model = floor_us + linear_bytes(1, K, N, G, "float16") / gbps / 1e3
            t_read = median(read)
            t_fused = median(lambda: awq.linear(x, qw, qz, sc, out=y, path="fused"))
            ok = tolerance_check(torch, x, awq.dequantize(qw, qz, sc))(y)[0] == 0
            print(f"{K}x{N:<9} {model:>9.2f} us {t_read:>9.2f} us {t_fused:>5.2f} us "
                  f"{t_read / model:>10.2f} {t_fused / t_read:>10.2f}{'' if ok else '  OUTSIDE TOLERANCE'}")
            if not ok:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
