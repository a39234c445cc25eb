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
 * A block is H warpgroups (1 or 2) on NT rows of x, which they share;
 * warpgroup h takes 16 consecutive word columns (128 outputs), cb + 16 h ..
 * (with H = 1 two or three blocks fit a multiprocessor, with H = 2 one).
 * Warp w of a warpgroup supplies rows 16w .. 16w + 15 of A, which are the
 * decode kernel's A tile for byte w (cuda/linear_gemv.cuh): lane (g, i)
 * reads the two words cw = 2g, cw + 1 of the rows k0 + 2i, 2i + 1, 2i + 8,
 * 2i + 9, and for word v builds A row g from nibble 2w and row g + 8 from
 * nibble 2w + 1.  So a warpgroup issues two wgmma a k16 step, one per word
 * v, each covering nibbles 2w, 2w + 1 of the 8 words cw + v (g = 0..7) in
 * every warp w: 64 distinct outputs, and the two together its 128.
 * Accumulator 4j + e of a lane is row 8j + 2i + (e & 1) of x at the output
 * column of nibble 2w + (e >> 1) of word cw + v (the mma C layout, per n8).
 *
 * ---- pipeline ----------------------------------------------------------------------
 * Stages of 64 k in shared memory, stages(NT, H) deep, filled by cp.async
 * (every thread copies its 16-byte share; all but two stages in flight): the NT x
 * 128-byte rows of x in the 128-byte swizzle wgmma's descriptor names (chunk
 * c of row n at c ^ (n % 8)), the 64 x 64-byte rows of qweight (wgmma_map in
 * cuda/linear_layout.cuh: the rows a half-warp reads at once fall on
 * different banks, and so do the chunks a quarter-warp copies), the group's
 * zero words and scales (G % 64 == 0: a stage lies in one group), per
 * warpgroup.  After a stage lands (cp.async.wait_group, the async-proxy
 * fence, a block barrier) each warp dequantizes the A registers of the four
 * k16 steps, one step after the other, and issues the step's two wgmma as
 * soon as its registers are written, one commit group a step.  Before it
 * rewrites a step's registers it waits only for that step of the previous
 * stage (wait_group 3): the tensor cores always hold three steps' products
 * while the warps dequantize the next, across stage boundaries too.  So the
 * stage before the current one may still be read, and the buffer refilled
 * at stage s is that of stage s - 2.
 *
 * ---- K slices and the reduction ---------------------------------------------------------
 * With split > 1 the blocks of a thread-block cluster share the columns and
 * rows and take contiguous slices of the stages; each block's sums go to
 * its shared memory as H [NT][128] float32 tiles, and every output is the sum
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
constexpr int kMaxGroups = 2;     /* warpgroups of a block */
constexpr int kStepK = 16;        /* k of one wgmma */
constexpr int kStageK = wgmma_map::kStageK; /* k of a stage: one 128-byte row of x */
constexpr int kStageSteps = kStageK / kStepK;
constexpr int kRowBytes = wgmma_map::kXRowBytes;  /* a stage row of x: 64 k */
constexpr int kBlockWords = wgmma_map::kBlockWords; /* word columns of a warpgroup */
constexpr int kWRowBytes = kBlockWords * 4;
constexpr int kBlockCols = kBlockWords * AWQ_COLS_PER_WORD;
constexpr int kMaxSplit = 8;      /* blocks of a cluster: the portable limit */
constexpr int kAlign = 1024;      /* the 128-byte swizzle repeats every 8 rows: stages start on 1 KB */

/* Rows of x a block takes (16 x the configuration's `rows`): wgmma's N. */
__host__ __device__ constexpr bool rows_ok(int nt) { return nt == 32 || nt == 64 || nt == 128; }

/* One stage: x [NT][128 B], then per warpgroup its qweight [64][64 B],
 * zero words [16] and scales [128]. */
constexpr int kWBytes = kStageK * kWRowBytes;
constexpr int kZBytes = kBlockWords * 4;
constexpr int kSBytes = kBlockCols * 2;
constexpr int kGroupBytes = kWBytes + kZBytes + kSBytes;
__host__ __device__ constexpr int round_up(int v, int m) { return (v + m - 1) / m * m; }
__host__ __device__ constexpr int stage_bytes(int nt, int h)
{
    return round_up(nt * kRowBytes + h * kGroupBytes, kAlign);
}
/* Stages of a block.  Two are being read (the tensor cores finish one
 * stage's products while the warps start on the next), the rest are in
 * flight: with one warpgroup 5 of them (NT = 32) or 3, and three or two
 * blocks a multiprocessor; with two warpgroups 6, and one block. */
__host__ __device__ constexpr int stages(int nt, int h) { return h == 2 ? 8 : nt == 32 ? 7 : 5; }
/* The block's sums, [h][NT][kPartPitch] floats, over the drained stages. */
constexpr int kPartPitch = kBlockCols + 4; /* 16-byte rows */
__host__ __device__ constexpr int part_bytes(int nt, int h) { return h * nt * kPartPitch * 4; }
/* Dynamic shared memory of a block: the larger of the two, and room to align. */
__host__ __device__ constexpr int smem_bytes(int nt, int h)
{
    return (stages(nt, h) * stage_bytes(nt, h) > part_bytes(nt, h) ? stages(nt, h) * stage_bytes(nt, h)
                                                                   : part_bytes(nt, h)) +
           kAlign;
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

/* A thread's share of a stage's copies, t = its index in its warpgroup:
 * 16-byte chunk t % 4 of its warpgroup's qweight rows t / 4 and t / 4 + 32,
 * for t < 20 one chunk of the warpgroup's zero words (t < 4) or scales; and
 * chunk tid % 8 of the x rows tid / 8 + 16 H j (tid over the block). */
struct Copier {
    const char *qp;     /* &qweight[t / 4][cbh + 4 (t % 4)] */
    const char *xp;     /* &x[m0 + tid / 8][8 (tid % 8)], or row m0 past M */
    const char *zsp;    /* &qzeros[0][cbh + 4 t] or &scales[0][8 cbh + 8 (t - 4)] */
    int64_t x_pitch;    /* bytes of 16 H rows of x */
    int64_t zs_pitch;   /* bytes from one group's row to the next */
    int64_t q_pitch;    /* bytes of a row of qweight */
    uint32_t w_dst[2];  /* stage offsets of the qweight chunks */
    uint32_t zs_dst;    /* stage offset of the zero or scale chunk */
    int xrow;           /* tid / 8: rows xrow + 16 H j of the tile */
    int xc;             /* chunk of x */
    bool q_ok;          /* the qweight chunk is inside N */
    bool zs_copy, zs_ok;
};

/* Why: this thread's copies of stage s (k 64 s .. 64 s + 63, group s / spg)
 * into the buffer at shared address `stage`. */
template <int NT, int H>
__device__ __forceinline__ void stage_issue(uint32_t stage, const Copier &c, int64_t rows_left, int s, int spg)
{
    const int64_t k_off = (int64_t)s * kStageK;
    const char *q = c.qp + k_off * c.q_pitch;
    cp_16(stage + c.w_dst[0], q, c.q_ok);
    cp_16(stage + c.w_dst[1], q + 32 * c.q_pitch, c.q_ok);
#pragma unroll
    for (int j = 0; j < NT / (16 * H); ++j) {
        const int n = c.xrow + 16 * H * j;
        const bool ok = n < rows_left; /* a zero fill reads nothing: its address stays a valid row */
        cp_16(stage + x_chunk(n, c.xc), c.xp + (ok ? j * c.x_pitch : 0) + k_off * 2, ok);
    }
    if (c.zs_copy) cp_16(stage + c.zs_dst, c.zsp + (int64_t)(s / spg) * c.zs_pitch, c.zs_ok);
}

/* Why: wait until at most N of this warp's wgmma groups are pending.  The
 * words the next step dequantizes pass through it ("+r"), so that no
 * register the pending products may still read is rewritten before it. */
template <int N> __device__ __forceinline__ void wgmma_wait_words(uint2 (&wr)[4])
{
    asm volatile("wgmma.wait_group.sync.aligned %8;"
                 : "+r"(wr[0].x), "+r"(wr[0].y), "+r"(wr[1].x), "+r"(wr[1].y), "+r"(wr[2].x), "+r"(wr[2].y),
                   "+r"(wr[3].x), "+r"(wr[3].y)
                 : "n"(N)
                 : "memory");
}

/* Why: the stages [s_begin, s_end) of the block's slice into the warp's
 * accumulators; returns with every copy landed and every wgmma complete. */
template <class T, int NT, int H>
__device__ __forceinline__ void mainloop(float (&acc)[2][NT / 2], const Args &a, int s_begin, int s_end, int64_t cb,
                                         int64_t m0, const char *smem, uint32_t sbase)
{
    constexpr int kStage = stage_bytes(NT, H);
    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int w = warp & 3;  /* the byte of the words this warp turns into A */
    const int h = warp >> 2; /* its warpgroup: word columns cb + 16 h .. */
    const int t = tid & (kThreads - 1);
    const int g = lane >> 2, i = lane & 3;
    const int64_t cbh = cb + kBlockWords * h;
    const int wg_base = NT * kRowBytes + h * kGroupBytes; /* the warpgroup's part of a stage */

    Copier c;
    const int qr = t >> 2, qc = t & 3;
    c.q_pitch = a.W * 4;
    c.q_ok = cbh + 4 * qc < a.W;
    c.qp = reinterpret_cast<const char *>(a.qweight) + ((int64_t)qr * a.W + (c.q_ok ? cbh + 4 * qc : 0)) * 4;
    c.w_dst[0] = (uint32_t)(wg_base + w_chunk(qr, qc));
    c.w_dst[1] = (uint32_t)(wg_base + w_chunk(qr + 32, qc));
    const int r0 = tid >> 3, ch = tid & 7;
    c.xrow = r0;
    c.xc = ch;
    c.x_pitch = 16 * H * (int64_t)a.K * 2;
    const int64_t rows_left = a.M - m0;
    /* rows past M are zero fills: their address only has to be formed */
    c.xp = a.x + ((m0 + (r0 < rows_left ? r0 : 0)) * (int64_t)a.K + 8 * ch) * 2;
    c.zs_copy = t < (kZBytes + kSBytes) / 16;
    const int zs_base = wg_base + kWBytes;
    if (t < kZBytes / 16) {
        c.zs_ok = cbh + 4 * t < a.W;
        c.zsp = reinterpret_cast<const char *>(a.qzeros + (c.zs_ok ? cbh + 4 * t : 0));
        c.zs_pitch = a.W * 4;
        c.zs_dst = (uint32_t)(zs_base + 16 * t);
    } else {
        const int sc = t - kZBytes / 16; /* scale chunk: 8 columns */
        c.zs_ok = (cbh * AWQ_COLS_PER_WORD + 8 * sc) < a.N;
        c.zsp = a.scales + (c.zs_ok ? cbh * AWQ_COLS_PER_WORD + 8 * sc : 0) * 2;
        c.zs_pitch = a.N * 2;
        c.zs_dst = (uint32_t)(zs_base + kZBytes + 16 * sc);
    }
    /* what this lane reads of a stage: words cw, cw + 1 of its rows, the zero word and scales of its nibbles */
    const int cw = 2 * g;
    const uint32_t sel = gemv_map::pair_select(w);
    const int col_e = gemv_map::nibble_col(2 * w), col_o = gemv_map::nibble_col(2 * w + 1);

    /* Stage s sits in buffer (s - s_begin) % S.  The products of stage s - 1
     * are still running while stage s starts, so the buffer refilled at
     * stage s is the one of stage s - 2: P = S - 2 stages are in flight. */
    constexpr int S = stages(NT, H);
    constexpr int P = S - 2;
#pragma unroll
    for (int d = 0; d < P; ++d) {
        if (s_begin + d < s_end) stage_issue<NT, H>(sbase + d * kStage, c, rows_left, s_begin + d, a.spg);
        gemv::cp_commit();
    }

    for (int s = s_begin; s < s_end; ++s) {
        const int j = (s - s_begin) % S;
        gemv::cp_wait<P - 1>(); /* this thread's copies of stage s have landed... */
        fence_async_proxy();    /* ...are visible to the tensor cores... */
        __syncthreads();        /* ...and so are every thread's; every wgmma of stage s - 2 is complete */
        if (s + P < s_end) stage_issue<NT, H>(sbase + ((j + P) % S) * kStage, c, rows_left, s + P, a.spg);
        gemv::cp_commit();

        const char *wq = smem + j * kStage + wg_base;
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
        const uint32_t xaddr = sbase + j * kStage;
        /* every word of the stage first (rows 16 kk + 2i, +1, +8, +9: words cw, cw + 1, 8 bytes of
         * chunk cw / 4), so that the loads' latency is paid once a stage */
        uint2 wr[kStageSteps][4];
#pragma unroll
        for (int kk = 0; kk < kStageSteps; ++kk)
#pragma unroll
            for (int r = 0; r < 4; ++r)
                wr[kk][r] = *reinterpret_cast<const uint2 *>(
                    wq + w_chunk(kStepK * kk + gemv_map::frag_row(i, r), cw >> 2) + 4 * (cw & 3));
#pragma unroll
        for (int kk = 0; kk < kStageSteps; ++kk) {
            /* step kk of the previous stage is complete (the groups of its last three steps and of this
             * stage's first kk may still run): its A registers may be rewritten */
            wgmma_wait_words<kStageSteps - 1>(wr[kk]);
            uint32_t af[2][4];
#pragma unroll
            for (int v = 0; v < 2; ++v)
#pragma unroll
                for (int p = 0; p < 2; ++p) {
                    const uint2 l = wr[kk][2 * p], u = wr[kk][2 * p + 1];
                    const uint32_t lo = v ? l.y : l.x, hi = v ? u.y : u.x;
                    gemv::dequant_pairs<T>(__byte_perm(lo, hi, sel), ze[v], zo[v], se[v], so[v],
                                           af[v][gemv_map::a_reg(p, 0)], af[v][gemv_map::a_reg(p, 1)]);
                }
            wgmma_fence(af); /* the step's A registers are written */
            const uint64_t desc = x_desc(xaddr + kk * kStepK * 2);
            wgmma<T, NT>(acc[0], af[0], desc);
            wgmma<T, NT>(acc[1], af[1], desc);
            wgmma_commit();
        }
    }
    wgmma_wait<0>();
    gemv::cp_wait<0>();
}

#endif /* AWQ_WGMMA_CODE */

/* Block: H warpgroups, 128 H threads, word columns cb = (blockIdx.x / split) * 16 H ..
 * (warpgroup h: cb + 16 h ..), rows of x m0 = tile * NT .. (tiles blockIdx.y,
 * + gridDim.y, ...); the split blocks of a column block are one cluster,
 * rank = blockIdx.x % split. */
template <class T, int NT, int H> __global__ void __launch_bounds__(kThreads *H, 1) kernel(const Args a)
{
#if AWQ_WGMMA_CODE
    extern __shared__ float4 wgmma_shared[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(wgmma_shared);
    const uint32_t sbase = (raw + kAlign - 1) & ~(uint32_t)(kAlign - 1);
    char *smem = reinterpret_cast<char *>(wgmma_shared) + (sbase - raw);
    constexpr float kZero = 0.0f;
    constexpr int kWords = kBlockWords * H; /* word columns of the block */

    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int w = warp & 3, h = warp >> 2;
    const int g = lane >> 2, i = lane & 3;
    const int64_t cblock = blockIdx.x / a.split;
    const int rank = (int)(blockIdx.x - cblock * a.split);
    const int64_t cb = cblock * kWords;
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
        if (s_begin < s_end) mainloop<T, NT, H>(acc, a, s_begin, s_end, cb, m0, smem, sbase);
        __syncthreads(); /* every stage is drained: the sums may overwrite them */

        /* the warpgroup's sums into its [NT][kPartPitch]: column 8 (cw + v) + nibble_col(2w + e / 2)
         * of row 8j + 2i + e % 2 */
        const int cw = 2 * g;
        float *mine = part + h * NT * kPartPitch;
#pragma unroll
        for (int v = 0; v < 2; ++v)
#pragma unroll
            for (int j = 0; j < NT / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = 8 * j + 2 * i + (e & 1);
                    const int col = AWQ_COLS_PER_WORD * (cw + v) + gemv_map::nibble_col(2 * w + (e >> 1));
                    mine[row * kPartPitch + col] = acc[v][4 * j + e];
                }
        /* output word o of a row: warpgroup o / 16's sums, its word o % 16 */
        auto sums = [&](int row, int o) {
            return (o / kBlockWords * NT + row) * kPartPitch + o % kBlockWords * AWQ_COLS_PER_WORD;
        };
        if (a.split == 1) {
            __syncthreads();
            for (int u = tid; u < rows * kWords; u += kThreads * H) {
                const int row = u / kWords, o = u % kWords;
                if (cb + o >= a.W) continue;
                float v[8] = {kZero, kZero, kZero, kZero, kZero, kZero, kZero, kZero};
                gemv::add8(part + sums(row, o), v);
                gemv::finish<T>(a, m0 + row, (cb + o) * AWQ_COLS_PER_WORD, v);
            }
            __syncthreads(); /* the next tile's stages overwrite the sums */
            continue;
        }
        /* the cluster's sum, rank 0 first, then 1, ..., split-1; each block finishes a share */
        cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
        cluster.sync();
        for (int u = rank * kThreads * H + tid; u < rows * kWords; u += a.split * kThreads * H) {
            const int row = u / kWords, o = u % kWords;
            if (cb + o >= a.W) continue;
            const int off = sums(row, o);
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
