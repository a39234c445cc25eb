/*
 * cuda/linear_wgmma.cuh -- the warpgroup kernel of the fused linear
 * (AWQ_KERNEL_WGMMA): y = x @ W + bias for many rows of x, W never written
 * to memory.  Hopper's asynchronous warpgroup matrix multiply (wgmma,
 * sm_90a only), f16/bf16 with float32 accumulators; included by
 * cuda/linear.cu only.  Design notes: docs/KERNELS.md, "The warpgroup
 * kernel (wgmma)".
 *
 * The operands are the transpose of y = x @ W: y^T = W^T x^T, so that the
 * dequantized weights are wgmma's A operand, which may come from registers
 * -- they are dequantized there and never stored -- and x is its B operand,
 * read by the tensor cores from shared memory as it lies in memory (each
 * row of x contiguous along K: "K-major").  One wgmma.m64nNTk16 multiplies
 * 64 output columns by 16 k by NT rows of x.
 *
 * ---- the mapping ------------------------------------------------------------------
 * A block is one warpgroup on 16 consecutive word columns (128 outputs) and
 * NT rows of x (two or three blocks fit a multiprocessor, each with its own
 * barrier).  Warp w
 * supplies rows 16w .. 16w + 15 of A, which are the decode kernel's A tile
 * for byte w (cuda/linear_gemv.cuh): lane (g, i) reads the two words
 * cw = 2g, cw + 1 of the rows k0 + 2i, 2i + 1, 2i + 8, 2i + 9,
 * and for word v builds A row g from nibble 2w and row g + 8 from nibble
 * 2w + 1.  So a warpgroup issues two wgmma a k16 step, one per word v, each
 * covering nibbles 2w, 2w + 1 of the 8 words cw + v (g = 0..7) in every
 * warp w: 64 distinct outputs, and the two together the block's 128.
 * Accumulator 4j + e of a lane is row 8j + 2i + (e & 1) of x at the output
 * column of nibble 2w + (e >> 1) of word cw + v (the mma C layout, per n8).
 *
 * ---- pipeline ----------------------------------------------------------------------
 * Stages of 64 k in shared memory, stages(NT) deep, filled by cp.async (every
 * thread copies its 16-byte share; all but one stage in flight): the NT x
 * 128-byte rows of x in the 128-byte swizzle wgmma's descriptor names (chunk
 * c of row n at c ^ (n % 8)), the 64 x 64-byte rows of qweight (wgmma_map in
 * cuda/linear_layout.cuh: the rows a half-warp reads at once fall on
 * different banks, and so do the chunks a quarter-warp copies), the group's
 * zero words and scales (G % 64 == 0: a
 * stage lies in one group).  After a stage lands (cp.async.wait_group, the
 * async-proxy fence, a block barrier) each warp dequantizes the A registers
 * of the four k16 steps, one step after the other, issuing the step's two
 * wgmma as soon as its registers are written (the tensor cores work on one
 * step while the next is dequantized), and waits for the stage's eight
 * before the barrier that lets its buffer be refilled.
 *
 * ---- K slices and the reduction ---------------------------------------------------------
 * With split > 1 the blocks of a thread-block cluster share the columns and
 * rows and take contiguous slices of the stages; each block's sums go to
 * its shared memory as a [NT][128] float32 tile, and every output is the sum
 * over the cluster's ranks in order 0, 1, ..., split - 1 (distributed shared
 * memory), plus the bias in float32, rounded once.  Without a split the
 * tile only turns the lanes' scattered columns into 16-byte stores.  Every
 * sum has a fixed order: the result is deterministic.
 */
#ifndef AWQ_CUDA_LINEAR_WGMMA_CUH
#define AWQ_CUDA_LINEAR_WGMMA_CUH

#include <cooperative_groups.h>

#include <cstdint>

#include "cuda/linear_gemv.cuh"
#include "cuda/linear_layout.cuh"
#include "cuda/linear_ops.cuh"

/* wgmma is an sm_90a instruction: other targets compile an empty kernel,
 * which the host never launches (cuda/linear.cu: wgmma_config_ok). */
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define AWQ_WGMMA_CODE 1
#else
#define AWQ_WGMMA_CODE 0
#endif

namespace awq_cu {
namespace wg {

constexpr int kThreads = 128;    /* one warpgroup */
constexpr int kStepK = 16;        /* k of one wgmma */
constexpr int kStageK = wgmma_map::kStageK; /* k of a stage: one 128-byte row of x */
constexpr int kStageSteps = kStageK / kStepK;
constexpr int kRowBytes = wgmma_map::kXRowBytes;  /* a stage row of x: 64 k */
constexpr int kBlockWords = wgmma_map::kBlockWords; /* word columns of a block */
constexpr int kWRowBytes = kBlockWords * 4;
constexpr int kBlockCols = kBlockWords * AWQ_COLS_PER_WORD;
constexpr int kMaxSplit = 8;      /* blocks of a cluster: the portable limit */
constexpr int kAlign = 1024;      /* the 128-byte swizzle repeats every 8 rows: stages start on 1 KB */

/* Rows of x a block takes (16 x the configuration's `rows`): wgmma's N. */
__host__ __device__ constexpr bool rows_ok(int nt) { return nt == 32 || nt == 64 || nt == 128; }

/* One stage: x [NT][128 B], qweight [64][64 B], zero words [16], scales [128]. */
constexpr int kWBytes = kStageK * kWRowBytes;
constexpr int kZBytes = kBlockWords * 4;
constexpr int kSBytes = kBlockCols * 2;
__host__ __device__ constexpr int round_up(int v, int m) { return (v + m - 1) / m * m; }
__host__ __device__ constexpr int stage_bytes(int nt)
{
    return round_up(nt * kRowBytes + kWBytes + kZBytes + kSBytes, kAlign);
}
/* Stages of a block: all but one in flight, 53 to 63 KB of copies. */
__host__ __device__ constexpr int stages(int nt) { return nt == 32 ? 7 : nt == 64 ? 5 : 4; }
/* The block's sums, [NT][kPartPitch] floats, over the drained stages. */
constexpr int kPartPitch = kBlockCols + 4; /* 16-byte rows */
__host__ __device__ constexpr int part_bytes(int nt) { return nt * kPartPitch * 4; }
/* Dynamic shared memory of a block: the larger of the two, and room to align. */
__host__ __device__ constexpr int smem_bytes(int nt)
{
    return (stages(nt) * stage_bytes(nt) > part_bytes(nt) ? stages(nt) * stage_bytes(nt) : part_bytes(nt)) + kAlign;
}

using wgmma_map::w_chunk;
using wgmma_map::x_chunk;

struct Args : LinearOperands {
    int64_t M, N, W; /* W = N / 8 word columns, a multiple of 4 */
    int64_t mtiles;  /* tiles of NT rows */
    int K;           /* a multiple of 64, < 2^30 */
    int nstages;     /* K / 64 */
    int spg;         /* stages per group: G / 64 */
    int split;       /* blocks per cluster */
};

#if AWQ_WGMMA_CODE

__device__ __forceinline__ void fence_async_proxy() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
/* Why: orders the writes of a step's A registers (operands: the compiler
 * keeps those writes before it) before the wgmma that read them.  No
 * memory clobber here or on wgmma: shared-memory reads of qweight may move
 * ahead of them (they touch no memory a wgmma reads). */
__device__ __forceinline__ void wgmma_fence(uint32_t (&a)[2][4])
{
    asm volatile("wgmma.fence.sync.aligned;"
                 : "+r"(a[0][0]), "+r"(a[0][1]), "+r"(a[0][2]), "+r"(a[0][3]), "+r"(a[1][0]), "+r"(a[1][1]),
                   "+r"(a[1][2]), "+r"(a[1][3]));
}
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;"); }
template <int N> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

/* Why: the shared-memory descriptor of 16 k of the NT rows of x at `addr`:
 * 128-byte swizzle (mode 1, bits 62-63), 1024 bytes between groups of 8
 * rows (stride byte offset, bits 32-45), the leading offset unused by a
 * swizzled K-major operand (1), all in units of 16 bytes (PTX ISA, matrix
 * descriptor). */
__device__ __forceinline__ uint64_t x_desc(uint32_t addr)
{
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

/* The asm of one wgmma: D accumulated (scale-d: the predicate p, true),
 * A and B not negated (+1, +1), B not transposed (K-major). */
#define AWQ_WGMMA_ASM(SHAPE, TYPE, DREGS, AREGS, DESC, ...)                                                          \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, 1, 0;\n\t"                                                   \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " {" DREGS "}, {" AREGS "}, " DESC      \
                 ", p, 1, 1, 0;\n\t}"                                                                              \
                 : __VA_ARGS__                                                                                     \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc))
#define AWQ_D8(o)                                                                                                  \
    "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), "+f"(d[o + 6]),   \
        "+f"(d[o + 7])
#define AWQ_R16_0 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
#define AWQ_R16_16 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define AWQ_R16_32 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47"
#define AWQ_R16_48 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define AWQ_WGMMA_TYPES(T, SHAPE, DREGS, AREGS, DESC, ...)                                                         \
    if constexpr (std::is_same<T, F16T>::value)                                                                     \
        AWQ_WGMMA_ASM(SHAPE, "f16", DREGS, AREGS, DESC, __VA_ARGS__);                                              \
    else                                                                                                           \
        AWQ_WGMMA_ASM(SHAPE, "bf16", DREGS, AREGS, DESC, __VA_ARGS__)

/* Why: d += A (64 x 16, this warp's rows in registers) x B (16 x NT, x in
 * shared memory), asynchronously: the caller fences, commits and waits. */
template <class T, int NT>
__device__ __forceinline__ void wgmma(float (&d)[NT / 2], const uint32_t (&a)[4], uint64_t desc)
{
    static_assert(rows_ok(NT), "NT is 32, 64 or 128");
    if constexpr (NT == 32) {
        AWQ_WGMMA_TYPES(T, "m64n32k16", AWQ_R16_0, "%16,%17,%18,%19", "%20", AWQ_D8(0), AWQ_D8(8));
    } else if constexpr (NT == 64) {
        AWQ_WGMMA_TYPES(T, "m64n64k16", AWQ_R16_0 "," AWQ_R16_16, "%32,%33,%34,%35", "%36", AWQ_D8(0), AWQ_D8(8),
                        AWQ_D8(16), AWQ_D8(24));
    } else {
        AWQ_WGMMA_TYPES(T, "m64n128k16", AWQ_R16_0 "," AWQ_R16_16 "," AWQ_R16_32 "," AWQ_R16_48, "%64,%65,%66,%67",
                        "%68", AWQ_D8(0), AWQ_D8(8), AWQ_D8(16), AWQ_D8(24), AWQ_D8(32), AWQ_D8(40), AWQ_D8(48),
                        AWQ_D8(56));
    }
}
#undef AWQ_WGMMA_TYPES
#undef AWQ_R16_48
#undef AWQ_R16_32
#undef AWQ_R16_16
#undef AWQ_R16_0
#undef AWQ_D8
#undef AWQ_WGMMA_ASM

/* Why: 16 bytes from global memory into shared memory, or 16 zero bytes
 * (source size 0: nothing is read) past M or N. */
__device__ __forceinline__ void cp_16(uint32_t dst, const void *src, bool ok)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}

/* A thread's share of a stage's copies: 16-byte chunk tid % 4 of the
 * qweight rows tid / 4 and tid / 4 + 32, chunk tid % 8 of the x rows
 * tid / 8 + 16 j, and for tid < 20 one chunk of the group's zero words
 * (tid < 4) or scales. */
struct Copier {
    const char *qp;     /* &qweight[tid / 4][cb + 4 (tid % 4)] */
    const char *xp;     /* &x[m0 + tid / 8][8 (tid % 8)], or row m0 past M */
    const char *zsp;    /* &qzeros[0][cb + 4 tid] or &scales[0][8 cb + 8 (tid - 4)] */
    int64_t x_pitch16;  /* bytes of 16 rows of x */
    int64_t zs_pitch;   /* bytes from one group's row to the next */
    int64_t q_pitch;    /* bytes of a row of qweight */
    uint32_t w_dst[2];  /* stage offsets of the qweight chunks */
    uint32_t zs_dst;    /* stage offset of the zero or scale chunk */
    int xrow;           /* tid / 8: rows xrow + 16 j of the tile */
    int xc;             /* chunk of x */
    bool q_ok;          /* the qweight chunk is inside N */
    bool zs_copy, zs_ok;
};

/* Why: this thread's copies of stage s (k 64 s .. 64 s + 63, group s / spg)
 * into the buffer at shared address `stage`. */
template <int NT>
__device__ __forceinline__ void stage_issue(uint32_t stage, const Copier &c, int64_t rows_left, int s, int spg)
{
    const int64_t k_off = (int64_t)s * kStageK;
    const char *q = c.qp + k_off * c.q_pitch;
    cp_16(stage + NT * kRowBytes + c.w_dst[0], q, c.q_ok);
    cp_16(stage + NT * kRowBytes + c.w_dst[1], q + 32 * c.q_pitch, c.q_ok);
#pragma unroll
    for (int j = 0; j < NT / 16; ++j) {
        const int n = c.xrow + 16 * j;
        const bool ok = n < rows_left; /* a zero fill reads nothing: its address stays a valid row */
        cp_16(stage + x_chunk(n, c.xc), c.xp + (ok ? j * c.x_pitch16 : 0) + k_off * 2, ok);
    }
    if (c.zs_copy) cp_16(stage + c.zs_dst, c.zsp + (int64_t)(s / spg) * c.zs_pitch, c.zs_ok);
}

/* Why: the stages [s_begin, s_end) of the block's slice into the warp's
 * accumulators; returns with every copy landed and every wgmma complete. */
template <class T, int NT>
__device__ __forceinline__ void mainloop(float (&acc)[2][NT / 2], const Args &a, int s_begin, int s_end, int64_t cb,
                                         int64_t m0, const char *smem, uint32_t sbase)
{
    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int w = warp; /* the byte of the words this warp turns into A */
    const int g = lane >> 2, i = lane & 3;

    Copier c;
    const int qr = tid >> 2, qc = tid & 3;
    c.q_pitch = a.W * 4;
    c.q_ok = cb + 4 * qc < a.W;
    c.qp = reinterpret_cast<const char *>(a.qweight) + ((int64_t)qr * a.W + (c.q_ok ? cb + 4 * qc : 0)) * 4;
    c.w_dst[0] = (uint32_t)w_chunk(qr, qc);
    c.w_dst[1] = (uint32_t)w_chunk(qr + 32, qc);
    const int r0 = tid >> 3, ch = tid & 7;
    c.xrow = r0;
    c.xc = ch;
    c.x_pitch16 = 16 * (int64_t)a.K * 2;
    const int64_t rows_left = a.M - m0;
    /* rows past M are zero fills: their address only has to be formed */
    c.xp = a.x + ((m0 + (r0 < rows_left ? r0 : 0)) * (int64_t)a.K + 8 * ch) * 2;
    c.zs_copy = tid < (kZBytes + kSBytes) / 16;
    const int zs_base = NT * kRowBytes + kWBytes;
    if (tid < kZBytes / 16) {
        c.zs_ok = cb + 4 * tid < a.W;
        c.zsp = reinterpret_cast<const char *>(a.qzeros + (c.zs_ok ? cb + 4 * tid : 0));
        c.zs_pitch = a.W * 4;
        c.zs_dst = (uint32_t)(zs_base + 16 * tid);
    } else {
        const int sc = tid - kZBytes / 16; /* scale chunk: 8 columns */
        c.zs_ok = (cb * AWQ_COLS_PER_WORD + 8 * sc) < a.N;
        c.zsp = a.scales + (c.zs_ok ? cb * AWQ_COLS_PER_WORD + 8 * sc : 0) * 2;
        c.zs_pitch = a.N * 2;
        c.zs_dst = (uint32_t)(zs_base + kZBytes + 16 * sc);
    }
    /* what this lane reads of a stage: words cw, cw + 1 of its rows, the zero word and scales of its nibbles */
    const int cw = 2 * g;
    const uint32_t sel = gemv_map::pair_select(w);
    const int col_e = gemv_map::nibble_col(2 * w), col_o = gemv_map::nibble_col(2 * w + 1);

    constexpr int S = stages(NT);
#pragma unroll
    for (int d = 0; d < S - 1; ++d) {
        if (s_begin + d < s_end) stage_issue<NT>(sbase + d * stage_bytes(NT), c, rows_left, s_begin + d, a.spg);
        gemv::cp_commit();
    }

    for (int s = s_begin; s < s_end; ++s) {
        const int j = (s - s_begin) % S;
        gemv::cp_wait<S - 2>(); /* this thread's copies of stage s have landed... */
        fence_async_proxy();    /* ...are visible to the tensor cores... */
        __syncthreads();        /* ...and so are every thread's; every wgmma of stage s - 1 is complete */
        if (s + S - 1 < s_end)
            stage_issue<NT>(sbase + ((j + S - 1) % S) * stage_bytes(NT), c, rows_left, s + S - 1, a.spg);
        gemv::cp_commit();

        const char *wq = smem + j * stage_bytes(NT) + NT * kRowBytes;
        /* the group's zero and scale operands of the lane's two rows of A, per word */
        uint32_t ze[2], zo[2], se[2], so[2];
#pragma unroll
        for (int v = 0; v < 2; ++v) {
            const uint32_t zword = *reinterpret_cast<const uint32_t *>(wq + kWBytes + 4 * (cw + v));
            const uint16_t *sc =
                reinterpret_cast<const uint16_t *>(wq + kWBytes + kZBytes) + AWQ_COLS_PER_WORD * (cw + v);
            ze[v] = gemv::zero_operand<T>(zword, 2 * w);
            zo[v] = gemv::zero_operand<T>(zword, 2 * w + 1);
            se[v] = sc[col_e] * 0x00010001u;
            so[v] = sc[col_o] * 0x00010001u;
        }
        const uint32_t xaddr = sbase + j * stage_bytes(NT);
        /* every word of the stage first (rows 16 kk + 2i, +1, +8, +9: words cw, cw + 1, 8 bytes of
         * chunk cw / 4), so that the loads' latency is paid once a stage */
        uint2 wr[kStageSteps][4];
#pragma unroll
        for (int kk = 0; kk < kStageSteps; ++kk)
#pragma unroll
            for (int r = 0; r < 4; ++r)
                wr[kk][r] = *reinterpret_cast<const uint2 *>(
                    wq + w_chunk(kStepK * kk + gemv_map::frag_row(i, r), cw >> 2) + 4 * (cw & 3));
        uint32_t af[kStageSteps][2][4];
#pragma unroll
        for (int kk = 0; kk < kStageSteps; ++kk) {
#pragma unroll
            for (int v = 0; v < 2; ++v)
#pragma unroll
                for (int p = 0; p < 2; ++p) {
                    const uint2 l = wr[kk][2 * p], u = wr[kk][2 * p + 1];
                    const uint32_t lo = v ? l.y : l.x, hi = v ? u.y : u.x;
                    gemv::dequant_pairs<T>(__byte_perm(lo, hi, sel), ze[v], zo[v], se[v], so[v],
                                           af[kk][v][gemv_map::a_reg(p, 0)], af[kk][v][gemv_map::a_reg(p, 1)]);
                }
            wgmma_fence(af[kk]); /* the step's A registers are written */
            const uint64_t desc = x_desc(xaddr + kk * kStepK * 2);
            wgmma<T, NT>(acc[0], af[kk][0], desc);
            wgmma<T, NT>(acc[1], af[kk][1], desc);
        }
        wgmma_commit();
        wgmma_wait<0>(); /* the stage's buffer may be refilled after the next barrier */
    }
    gemv::cp_wait<0>();
}

#endif /* AWQ_WGMMA_CODE */

/* Block: kThreads threads, word columns cb = (blockIdx.x / split) * 16 ..,
 * rows of x m0 = tile * NT .. (tiles blockIdx.y, + gridDim.y, ...); the
 * split blocks of a column block are one cluster, rank = blockIdx.x % split. */
template <class T, int NT> __global__ void __launch_bounds__(kThreads, 1) kernel(const Args a)
{
#if AWQ_WGMMA_CODE
    extern __shared__ float4 wgmma_shared[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(wgmma_shared);
    const uint32_t sbase = (raw + kAlign - 1) & ~(uint32_t)(kAlign - 1);
    char *smem = reinterpret_cast<char *>(wgmma_shared) + (sbase - raw);
    constexpr float kZero = 0.0f;

    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int w = warp;
    const int g = lane >> 2, i = lane & 3;
    const int64_t cblock = blockIdx.x / a.split;
    const int rank = (int)(blockIdx.x - cblock * a.split);
    const int64_t cb = cblock * kBlockWords;
    const int s_begin = (int)((int64_t)rank * a.nstages / a.split);
    const int s_end = (int)((int64_t)(rank + 1) * a.nstages / a.split);
    float *part = reinterpret_cast<float *>(smem);

    for (int64_t mt = blockIdx.y; mt < a.mtiles; mt += gridDim.y) {
        const int64_t m0 = mt * NT;
        const int rows = a.M - m0 < NT ? (int)(a.M - m0) : NT;
        float acc[2][NT / 2];
#pragma unroll
        for (int v = 0; v < 2; ++v)
#pragma unroll
            for (int e = 0; e < NT / 2; ++e) acc[v][e] = kZero;
        if (s_begin < s_end) mainloop<T, NT>(acc, a, s_begin, s_end, cb, m0, smem, sbase);
        __syncthreads(); /* every stage is drained: the sums may overwrite them */

        /* the block's sums into [NT][kPartPitch]: column 8 (cw + v) + nibble_col(2w + e / 2) of row 8j + 2i + e % 2 */
        const int cw = 2 * g;
#pragma unroll
        for (int v = 0; v < 2; ++v)
#pragma unroll
            for (int j = 0; j < NT / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = 8 * j + 2 * i + (e & 1);
                    const int col = AWQ_COLS_PER_WORD * (cw + v) + gemv_map::nibble_col(2 * w + (e >> 1));
                    part[row * kPartPitch + col] = acc[v][4 * j + e];
                }
        if (a.split == 1) {
            __syncthreads();
            for (int u = tid; u < rows * kBlockWords; u += kThreads) {
                const int row = u / kBlockWords, o = u % kBlockWords;
                if (cb + o >= a.W) continue;
                float v[8] = {kZero, kZero, kZero, kZero, kZero, kZero, kZero, kZero};
                gemv::add8(part + row * kPartPitch + o * AWQ_COLS_PER_WORD, v);
                gemv::finish<T>(a, m0 + row, (cb + o) * AWQ_COLS_PER_WORD, v);
            }
            __syncthreads(); /* the next tile's stages overwrite the sums */
            continue;
        }
        /* the cluster's sum, rank 0 first, then 1, ..., split-1; each block finishes a share */
        cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
        cluster.sync();
        for (int u = rank * kThreads + tid; u < rows * kBlockWords; u += a.split * kThreads) {
            const int row = u / kBlockWords, o = u % kBlockWords;
            if (cb + o >= a.W) continue;
            const int off = row * kPartPitch + o * AWQ_COLS_PER_WORD;
            float v[8] = {kZero, kZero, kZero, kZero, kZero, kZero, kZero, kZero};
            for (int q = 0; q < a.split; ++q) gemv::add8(cluster.map_shared_rank(part, q) + off, v);
            gemv::finish<T>(a, m0 + row, (cb + o) * AWQ_COLS_PER_WORD, v);
        }
        cluster.sync(); /* no block leaves or rewrites its sums while another reads them */
    }
#else
    (void)a; /* not sm_90a: the host never launches it */
#endif
}

} // namespace wg
} // namespace awq_cu

#endif /* AWQ_CUDA_LINEAR_WGMMA_CUH */
