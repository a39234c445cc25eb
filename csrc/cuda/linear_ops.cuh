/*
 * cuda/linear_ops.cuh -- what the two tensor-core kernels of the fused linear
 * (cuda/linear.cu's MMA kernel, cuda/linear_gemv.cuh's decode kernel) share:
 * the arrays of a problem, and the device operations on packed f16/bf16
 * pairs and on the tensor cores.
 */
#ifndef AWQ_CUDA_LINEAR_OPS_CUH
#define AWQ_CUDA_LINEAR_OPS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/layout.cuh"
#include "cuda/linear_layout.cuh"

namespace awq_cu {

/* The arrays of a linear problem, as the fused kernels take them (byte
 * pointers where the element type is a kernel's template parameter). */
struct LinearOperands {
    const char *x;           /* [M, K] */
    const uint32_t *qweight; /* [K, W] */
    const uint32_t *qzeros;  /* [K/G, W] */
    const char *scales;      /* [K/G, N] */
    const char *bias;        /* [N] or nullptr */
    char *y;                 /* [M, N] */
};

/* base in both halves of a packed pair, whose low mantissa bits a nibble q
 * OR-ed in turns into base + q exactly (linear_layout.cuh): 1024 (f16), 128 (bf16). */
template <class T> struct PairMagic;
template <> struct PairMagic<F16T> {
    static constexpr uint32_t kValue = mma_map::kF16PairMagic;
};
template <> struct PairMagic<BF16T> {
    static constexpr uint32_t kValue = mma_map::kBF16PairMagic;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

/* Why: (x & MASK) | BITS in one LOP3 (the compiler emits two for constant operands). */
template <uint32_t MASK, uint32_t BITS> __device__ __forceinline__ uint32_t and_or(uint32_t x)
{
    uint32_t r;
    /* immLut 0xEA = (a & b) | c with a = 0xF0, b = 0xCC, c = 0xAA */
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(x), "n"(MASK), "n"(BITS));
    return r;
}

/* Why: one packed x2 operation of the dtype (f16 or bf16) on raw words, each
 * half rounded once to nearest even. */
template <class T, class Op> __device__ __forceinline__ uint32_t pair_op(uint32_t a, uint32_t b, Op op)
{
    using P = typename std::conditional<std::is_same<T, F16T>::value, __half2, __nv_bfloat162>::type;
    P x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    const P r = op(x, y);
    uint32_t u;
    memcpy(&u, &r, 4);
    return u;
}

template <class T> __device__ __forceinline__ uint32_t sub2(uint32_t a, uint32_t b)
{
    return pair_op<T>(a, b, [](auto x, auto y) { return __hsub2_rn(x, y); });
}

template <class T> __device__ __forceinline__ uint32_t mul2(uint32_t a, uint32_t b)
{
    return pair_op<T>(a, b, [](auto x, auto y) { return __hmul2_rn(x, y); });
}

/* Why: one tensor-core step, d += A(16x16) * B(16x8), float32 accumulators. */
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    if constexpr (std::is_same<T, F16T>::value)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif /* __CUDA_ARCH__ >= 800 */

} // namespace awq_cu

#endif /* AWQ_CUDA_LINEAR_OPS_CUH */
