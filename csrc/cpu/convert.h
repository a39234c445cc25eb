/*
 * cpu/convert.h -- exact scalar conversions between float32 and the 16-bit
 * types, IEEE 754 round-to-nearest-even, shared by the host kernels.
 */
#ifndef AWQ_CPU_CONVERT_H
#define AWQ_CPU_CONVERT_H

#include <stdint.h>
#include <string.h>

#include "awq.h"

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float16 bits -> float32 (exact: every half is a float). */
static inline float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    if (exp == 0x1F) /* Inf / NaN: keep the payload, keep NaN-ness */
        return bits_f32(sign | 0x7F800000u | (man << 13));
    if (exp != 0)
        return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24, exact in float32 */
    float f = (float)man * 5.9604644775390625e-8f;
    return sign ? -f : f;
}

/* float32 -> float16 bits, round to nearest even. */
static inline uint16_t float_to_half(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) /* Inf or NaN (NaN stays a quiet NaN) */
        return sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u | ((ax >> 13) & 0x3FFu) : 0u);
    if (ax >= 0x477FF000u) /* >= 65520 rounds to Inf */
        return sign | 0x7C00u;
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (ax < 0x33000000u) /* < 2^-25: rounds to zero (2^-25 ties to even zero) */
            return sign;
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return sign | (uint16_t)r;
    }
    /* normal: rebias the exponent, round the 13 dropped bits to even */
    uint32_t r = ax - 0x38000000u; /* exponent 127 -> 15 */
    r += 0x0FFFu + ((r >> 13) & 1u);
    return sign | (uint16_t)(r >> 13);
}

/* float32 -> bfloat16 bits, round to nearest even; NaN stays quiet NaN. */
static inline uint16_t float_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float load_scale(const void *s, int64_t i, awq_dtype t)
{
    switch (t) {
    case AWQ_F16: return half_to_float(((const uint16_t *)s)[i]);
    case AWQ_BF16: return bits_f32((uint32_t)((const uint16_t *)s)[i] << 16);
    default: return ((const float *)s)[i];
    }
}

/* a[i] = v rounded to the dtype t of the array a. */
static inline void store_value(void *a, int64_t i, float v, awq_dtype t)
{
    switch (t) {
    case AWQ_F16: ((uint16_t *)a)[i] = float_to_half(v); break;
    case AWQ_BF16: ((uint16_t *)a)[i] = float_to_bf16(v); break;
    default: ((float *)a)[i] = v; break;
    }
}

#endif /* AWQ_CPU_CONVERT_H */
