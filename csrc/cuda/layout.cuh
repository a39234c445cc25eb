/*
 * cuda/layout.cuh -- what every kernel knows about the data: the bit layout
 * of a packed word, the element types, exact conversions, and 64-bit index
 * division.  Device helpers are small, inline, and each says why it exists.
 */
#ifndef AWQ_CUDA_LAYOUT_CUH
#define AWQ_CUDA_LAYOUT_CUH

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "awq.h"

namespace awq_cu {

/* ======================================================================
 * Bit layout of one packed word (qweight and qzeros alike)
 *
 *   bits   31..28 27..24 23..20 19..16 15..12 11..8  7..4   3..0
 *   nibble    7      6      5      4      3      2      1      0
 *   column   8c+7   8c+5   8c+3   8c+1   8c+6   8c+4   8c+2   8c+0
 *
 * i.e. nibble i holds column ORDER[i], ORDER = {0,2,4,6,1,3,5,7}, and column
 * j is read from nibble REVERSE[j] = {0,4,1,5,2,6,3,7}[j] = j/2 + 4*(j%2).
 * Consequence used by the fast paths: for p = 0..3, (word >> 4p) & 0x000F000F
 * holds column 2p in its low 16-bit half and column 2p+1 in its high half --
 * exactly the element order of a packed pair (half2 / bf16x2 / two floats).
 * ====================================================================== */

constexpr int kNibbleBits = 4;
constexpr int kColsPerWord = 8;  /* 32-bit word / 4-bit nibble */
constexpr int kPairsPerWord = 4; /* column pairs (2p, 2p+1) per word */
static_assert(sizeof(uint32_t) * 8 == kColsPerWord * kNibbleBits, "eight nibbles fill a word");
static_assert(kPairsPerWord * 2 == kColsPerWord, "a word splits into four column pairs");

static_assert(kColsPerWord == AWQ_COLS_PER_WORD, "awq.h agrees");

/* Nibble holding column j of a word: AWQ_NIBBLE, the contract's one definition (awq.h). */
__host__ __device__ constexpr int reverse_nibble(int j) { return AWQ_NIBBLE(j); }

constexpr bool pairs_are_nibbles_p_and_p_plus_4()
{
    for (int p = 0; p < kPairsPerWord; ++p)
        if (reverse_nibble(2 * p) != p || reverse_nibble(2 * p + 1) != p + 4) return false;
    return true;
}
static_assert(pairs_are_nibbles_p_and_p_plus_4(), "pair extraction mask 0x000F000F assumes this");

/* (word >> 4p) & kPairMask: nibble p in bits 0..3, nibble p+4 in bits 16..19. */
constexpr uint32_t kPairMask = 0x000F000Fu;

/* float32 2^23: OR-ing an integer m < 2^23 into its mantissa gives exactly 2^23 + m. */
constexpr uint32_t kF32Magic = 0x4B000000u;
/* Added to each 16-bit half before subtracting z so that 16 + q - z is in [1, 31]:
 * never negative, so no borrow crosses from the high half into the low one. */
constexpr uint32_t kPairBias = 0x00100010u;
/* 2^23 + 16: the float value of (kF32Magic | 16); subtracting it leaves q - z exactly. */
constexpr float kF32MagicBias = 8388624.0f;
static_assert(kF32MagicBias == 8388608.0f + 16.0f, "2^23 + 16");

/* float16 1024.0: OR-ing q < 16 into its mantissa gives exactly 1024 + q (spacing 1). */
constexpr uint32_t kF16x2Magic = 0x64006400u;

/* __byte_perm selectors: result = {byte b of x, 0x00, 0x00, 0x4B} from (x, kF32Magic). */
constexpr unsigned kPermLowHalf = 0x7650u;  /* byte 0 of x: the low 16-bit half  */
constexpr unsigned kPermHighHalf = 0x7652u; /* byte 2 of x: the high 16-bit half */

/* ---- element types ---------------------------------------------------- */

struct F16T {
    using bits = uint16_t;
};
struct BF16T {
    using bits = uint16_t;
};
struct F32T {
    using bits = uint32_t;
};

template <class T> struct is_16bit {
    static constexpr bool value = sizeof(typename T::bits) == 2;
};
static_assert(sizeof(__half) == 2 && sizeof(__nv_bfloat16) == 2 && sizeof(float) == 4,
              "storage sizes assumed by the bit casts below");
static_assert(sizeof(__half2) == 4 && sizeof(__nv_bfloat162) == 4, "packed pairs are one word");

/* ---- small device helpers --------------------------------------------- */

/* Why: a 32-bit register viewed as half2 without a conversion instruction. */
__device__ __forceinline__ __half2 as_half2(uint32_t u)
{
    __half2 h;
    memcpy(&h, &u, sizeof h);
    return h;
}

/* Why: the inverse view, to store a half2 result as a plain word. */
__device__ __forceinline__ uint32_t half2_bits(__half2 h)
{
    uint32_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

/* Why: float -> bfloat16 with one round-to-nearest-even where sm < 80 lacks
 * the cvt instruction; NaN stays NaN (quiet bit forced) and never rounds to Inf. */
[[maybe_unused]] __device__ __forceinline__ uint32_t bf16_rne_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) /* NaN: exponent all ones, mantissa != 0 */
        return (u >> 16) | 0x0040u;     /* keep sign and top payload, set the quiet bit */
    u += 0x7FFFu + ((u >> 16) & 1u);    /* half of the 16 dropped bits, ties to even */
    return u >> 16;
}

/* Why: one exact widening of a stored scale to float32 (all three are exact). */
template <class T> __device__ __forceinline__ float scale_to_float(uint32_t bits)
{
    if constexpr (std::is_same<T, F16T>::value)
        return __half2float(__ushort_as_half((unsigned short)bits));
    else if constexpr (std::is_same<T, BF16T>::value)
        return __uint_as_float(bits << 16); /* bf16 is the top half of a float32 */
    else
        return __uint_as_float(bits);
}

/* Why: the single round-to-nearest-even from the float32 product to the output type. */
template <class T> __device__ __forceinline__ uint32_t float_to_out(float f)
{
    if constexpr (std::is_same<T, F16T>::value) {
        return __half_as_ushort(__float2half_rn(f));
    } else if constexpr (std::is_same<T, BF16T>::value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
        return bf16_rne_bits(f);
#endif
    } else {
        return __float_as_uint(f);
    }
}

/* Why: two conversions in one instruction (cvt.rn.{f16,bf16}x2.f32 on sm_80+),
 * each still a single RNE rounding; lo lands in bits 0..15 (the lower address). */
template <class T> __device__ __forceinline__ uint32_t pack_pair(float lo, float hi)
{
    if constexpr (std::is_same<T, F16T>::value) {
        return half2_bits(__floats2half2_rn(lo, hi));
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
        uint32_t u;
        memcpy(&u, &b, sizeof u);
        return u;
#else
        return bf16_rne_bits(lo) | (bf16_rne_bits(hi) << 16);
#endif
    }
}

/* Why: the reference formula for one element, used by the simple kernels v1..v3. */
template <class S, class O>
__device__ __forceinline__ uint32_t dequant_one(uint32_t word, uint32_t zword, int j, uint32_t sbits)
{
    const int shift = kNibbleBits * reverse_nibble(j);
    const int q = (int)((word >> shift) & 0xFu);
    const int z = (int)((zword >> shift) & 0xFu);
    return float_to_out<O>(__fmul_rn((float)(q - z), scale_to_float<S>(sbits)));
}

/* Why: typed read-only load of one stored scale element as raw bits. */
template <class T> __device__ __forceinline__ uint32_t load_elem(const void *base, int64_t i)
{
    if constexpr (is_16bit<T>::value)
        return __ldg(static_cast<const unsigned short *>(base) + i);
    else
        return __ldg(static_cast<const unsigned int *>(base) + i);
}

/* Why: streaming (evict-first) store of one output element; out is written once. */
template <class T> __device__ __forceinline__ void store_elem(void *base, int64_t i, uint32_t bits)
{
    if constexpr (is_16bit<T>::value)
        __stcs(static_cast<unsigned short *>(base) + i, (unsigned short)bits);
    else
        __stcs(static_cast<unsigned int *>(base) + i, bits);
}

/* ---- 64-bit index division ---------------------------------------------
 * Every grid index is int64.  Dividing it by a runtime constant (N, N/8, G,
 * ...) with a 64-bit '/' is a call to a division routine (tens of
 * instructions); in practice both operands fit 32 bits, where a multiply-high
 * by a precomputed reciprocal is exact
 * (Granlund & Montgomery 1994, "Division by invariant integers using
 * multiplication", round-up variant): q = (umulhi(n, m) + n) >> l, with
 * l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1 < 2^32.
 * Larger operands take the plain 64-bit division. */
struct Divisor {
    int64_t d;
    uint32_t m;
    uint32_t l;
    int fast; /* d < 2^32 */
};

inline Divisor make_divisor(int64_t d)
{
    Divisor r{d, 0u, 0u, 0};
    if (d >= 1 && d <= (int64_t)UINT32_MAX) {
        uint32_t l = 0;
        while ((uint64_t(1) << l) < (uint64_t)d) ++l;
        r.m = (uint32_t)((((uint64_t(1) << l) - (uint64_t)d) << 32) / (uint64_t)d + 1);
        r.l = l;
        r.fast = 1;
    }
    return r;
}

/* Why: n / d for n >= 0 in ~3 instructions on the common (32-bit) path. */
__device__ __forceinline__ int64_t divide(int64_t n, const Divisor &v)
{
    if (v.fast && (uint64_t)n <= UINT32_MAX) {
        const uint64_t hi = ((uint64_t)(uint32_t)n * v.m) >> 32; /* umulhi */
        return (int64_t)((hi + (uint64_t)n) >> v.l);
    }
    return n / v.d;
}

/* A type carried as a value, to pick template instances from runtime ids. */
template <class T> struct Tag {
    using type = T;
};

/* Switch from the runtime (scale, out) dtype pair to one template instance. */
template <class F> cudaError_t dispatch_dtypes(awq_dtype s, awq_dtype o, F &&f)
{
    auto with_out = [&](auto st) -> cudaError_t {
        switch (o) {
        case AWQ_F16: return f(st, Tag<F16T>{});
        case AWQ_BF16: return f(st, Tag<BF16T>{});
        case AWQ_F32: return f(st, Tag<F32T>{});
        }
        return cudaErrorInvalidValue; /* unreachable: validated before */
    };
    switch (s) {
    case AWQ_F16: return with_out(Tag<F16T>{});
    case AWQ_BF16: return with_out(Tag<BF16T>{});
    case AWQ_F32: return with_out(Tag<F32T>{});
    }
    return cudaErrorInvalidValue;
}
} // namespace awq_cu

#endif /* AWQ_CUDA_LAYOUT_CUH */
