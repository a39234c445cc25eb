/*
 * tests/cuda_host/isa_mma.h -- what the host checks of the tensor-core
 * kernels share: 16-bit floats written out, and mma.sync m16n8k16 emulated
 * from the PTX ISA's fragment tables, in double.  Included by
 * test_mma_layout.cpp and test_gemv_layout.cpp only.
 */
#ifndef AWQ_TESTS_ISA_MMA_H
#define AWQ_TESTS_ISA_MMA_H

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace isa {

inline int g_failures = 0;

#define CHECK(cond, ...)                                                                                  \
    do {                                                                                                  \
        if (!(cond)) {                                                                                    \
            if (++g_failures <= 20) {                                                                     \
                std::printf("FAIL %s:%d: ", __FILE__, __LINE__);                                          \
                std::printf(__VA_ARGS__);                                                                 \
                std::printf("\n");                                                                        \
            }                                                                                             \
        }                                                                                                 \
    } while (0)

/* ======================================================================
 * 16-bit floats, written out (no compiler half type)
 * ====================================================================== */
enum Dtype { F16, BF16 };

inline double f16_value(uint16_t h)
{
    const int sign = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    double v;
    if (e == 0)
        v = std::ldexp((double)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = std::ldexp((double)(m | 0x400), e - 25);
    return sign ? -v : v;
}

inline double bf16_value(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline double value(Dtype t, uint16_t h) { return t == F16 ? f16_value(h) : bf16_value(h); }

/* Bits of v, which the test keeps exactly representable (checked). */
inline uint16_t bits_of(Dtype t, double v)
{
    uint16_t h = 0;
    if (t == BF16) {
        const float f = (float)v;
        uint32_t u;
        std::memcpy(&u, &f, 4);
        h = (uint16_t)(u >> 16);
    } else if (v == 0) {
        h = std::signbit(v) ? 0x8000 : 0;
    } else {
        const double a = std::fabs(v);
        int e;
        std::frexp(a, &e); /* a = f 2^e, f in [0.5, 1) */
        int biased = e - 1 + 15;
        uint32_t m;
        if (biased <= 0) { /* subnormal */
            biased = 0;
            m = (uint32_t)std::ldexp(a, 24);
        } else {
            m = (uint32_t)std::ldexp(a, 25 - (biased)) & 0x3FF;
        }
        h = (uint16_t)((v < 0 ? 0x8000 : 0) | (biased << 10) | m);
    }
    CHECK(value(t, h) == v, "%.17g is not exact in %s", v, t == F16 ? "float16" : "bfloat16");
    return h;
}

inline uint16_t lo16(uint32_t r) { return (uint16_t)(r & 0xFFFF); }
inline uint16_t hi16(uint32_t r) { return (uint16_t)(r >> 16); }

/* ======================================================================
 * mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32, from the
 * PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type"):
 *   groupID = laneid >> 2, threadID_in_group = laneid % 4
 *   A (16x16): four .b32 registers holding a0..a7, two per register, the
 *     lower-numbered element in the low half;
 *     row = groupID for a0, a1, a4, a5 and groupID + 8 for a2, a3, a6, a7;
 *     col = threadID_in_group * 2 + (i & 1), plus 8 for a4..a7.
 *   B (16x8): two registers holding b0..b3;
 *     row = threadID_in_group * 2 + (i & 1), plus 8 for b2, b3; col = groupID.
 *   C, D (16x8, f32): c0..c3;
 *     row = groupID for c0, c1 and groupID + 8 for c2, c3;
 *     col = threadID_in_group * 2 + (i & 1).
 * D = A * B + C, here in double (every value of this test is exact).
 * ====================================================================== */
struct Warp {
    uint32_t a[32][4];
    uint32_t b[32][2];
};

inline int isa_a_row(int lane, int i) { return (lane >> 2) + ((i == 2 || i == 3 || i == 6 || i == 7) ? 8 : 0); }
inline int isa_a_col(int lane, int i) { return (lane % 4) * 2 + (i & 1) + (i >= 4 ? 8 : 0); }
inline int isa_b_row(int lane, int i) { return (lane % 4) * 2 + (i & 1) + (i >= 2 ? 8 : 0); }
inline int isa_b_col(int lane) { return lane >> 2; }
inline int isa_c_row(int lane, int i) { return (lane >> 2) + (i >= 2 ? 8 : 0); }
inline int isa_c_col(int lane, int i) { return (lane % 4) * 2 + (i & 1); }

inline void isa_matrices(const Warp &w, Dtype t, double A[16][16], double B[16][8])
{
    int seen_a[16][16] = {}, seen_b[16][8] = {};
    for (int lane = 0; lane < 32; ++lane) {
        for (int i = 0; i < 8; ++i) {
            const uint32_t reg = w.a[lane][i / 2];
            const int r = isa_a_row(lane, i), c = isa_a_col(lane, i);
            A[r][c] = value(t, (i & 1) ? hi16(reg) : lo16(reg));
            seen_a[r][c]++;
        }
        for (int i = 0; i < 4; ++i) {
            const uint32_t reg = w.b[lane][i / 2];
            const int r = isa_b_row(lane, i), c = isa_b_col(lane);
            B[r][c] = value(t, (i & 1) ? hi16(reg) : lo16(reg));
            seen_b[r][c]++;
        }
    }
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) CHECK(seen_a[r][c] == 1, "ISA table: A[%d][%d] held %d times", r, c, seen_a[r][c]);
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 8; ++c) CHECK(seen_b[r][c] == 1, "ISA table: B[%d][%d] held %d times", r, c, seen_b[r][c]);
}

/* d[lane][i] += (A B)[row][col] of the lane's accumulator i. */
inline void isa_mma(const Warp &w, Dtype t, double (*d)[4])
{
    double A[16][16], B[16][8];
    isa_matrices(w, t, A, B);
    for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < 4; ++i) {
            const int r = isa_c_row(lane, i), c = isa_c_col(lane, i);
            double s = 0;
            for (int k = 0; k < 16; ++k) s += A[r][k] * B[k][c];
            d[lane][i] += s;
        }
}

} // namespace isa

#endif /* AWQ_TESTS_ISA_MMA_H */
