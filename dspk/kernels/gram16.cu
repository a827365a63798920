// Exact X·Xᵀ of int16 rows on INT8 tensor cores in one pass: no int8 planes are written.
//
// Why this kernel exists: the general integer path (intpack.cu + a cuBLAS/cuBLASLt INT8 GEMM)
// first writes each int16 value as two int8 planes, a pass over 2x the data that cost about
// as much as the GEMM (0.047 of 0.105 ms for 384 x 60 000 on an H200), and then multiplies
// all four plane blocks of a symmetric product. Here each CTA reads its int16 tiles straight
// into shared memory (cp.async), splits the bytes in registers while it builds the mma
// fragments, and computes only the tiles on and above the diagonal.
//
// Bytes: v = 256*h + u with h = v >> 8 (signed, -128..127) and u = v & 255 (unsigned, 0..255).
// mma.sync m16n8k32 takes s8 or u8 for each operand, so no centring is needed:
//   v_i·v_j = 65536 (h_i·h_j) + 256 (h_i·u_j + u_i·h_j) + u_i·u_j,
// three int32 accumulators per output (hh; hu + uh, whose weights agree; uu). A CTA sums at
// most GRAM16_MAX_K samples, so none can overflow: |hh| <= 128^2 K, |hu + uh| <= 2·128·255 K,
// uu <= 255^2 K, each < 2^31 for K <= 32 768. The CTA's int64 partial is added to S with
// integer atomics (exact and order-free: the same bits whatever the schedule).
//
// Layout: x [M, K] int16, row stride ldx (a multiple of 8 elements), K contiguous, x 16-byte
// aligned. S [M, M] int64 with row stride lds and unit column stride, zeroed by the caller.
// rowsum (optional, int64 [M], zeroed): the exact row sums, formed by the diagonal CTAs from
// the fragments they already hold (what a covariance's centring needs; no second read of x).
// Grid: x = the T(T+1)/2 tile pairs (ti <= tj) of T = ceil(M / 64) row tiles, y = K chunks of
// kchunk samples (a multiple of BK, <= GRAM16_MAX_K). Block: 128 threads (2 x 2 warps of
// 32 x 32 outputs). Dynamic shared memory: max(STAGES x 2 x 64 rows x 2·BK bytes, the int64
// tile of the epilogue, 64 x 65 x 8 bytes).

#include "common.cuh"
#include "launch.cuh"


// D = A·B + D for one m16n8k32 tile; A row-major 16 x 32, B column-major 32 x 8, each byte
// signed (s8) or unsigned (u8) as named.
#define G16_MMA(NAME, AT, BT)                                                                \
    __device__ __forceinline__ void NAME(int (&c)[4], const unsigned (&a)[4], unsigned b0,  \
                                         unsigned b1)                                       \
    {                                                                                       \
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32." AT "." BT ".s32 "             \
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"     \
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])                       \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));       \
    }
G16_MMA(g16_mma_ss, "s8", "s8")
G16_MMA(g16_mma_su, "s8", "u8")
G16_MMA(g16_mma_us, "u8", "s8")
G16_MMA(g16_mma_uu, "u8", "u8")
#undef G16_MMA

// The 16-byte chunk of a tile row (BK / 8 chunks) where logical chunk c of row r is kept: the
// low 3 bits of c are permuted, within its aligned group of 8 (128 bytes, all 32 banks). Lanes
// 8p..8p+7 of a fragment load read rows 2q, 2q+1 at chunks 4s + t (t = 0..3): the row's parity
// flips bit 2 and (r >> 1) & 3 permutes the rest, so those 8 lanes hit 8 different bank
// groups; the 8 lanes that copy 8 chunks of one row write all 32 banks, also conflict-free.
__device__ __forceinline__ int g16_swizzle(int r, int c)
{
    return c ^ (((r & 1) << 2) | ((r >> 1) & 3));
}

// High and low bytes of 4 consecutive int16 (two words): the fragment registers.
__device__ __forceinline__ unsigned g16_hi(unsigned w0, unsigned w1)
{
    return __byte_perm(w0, w1, 0x7531);
}
__device__ __forceinline__ unsigned g16_lo(unsigned w0, unsigned w1)
{
    return __byte_perm(w0, w1, 0x6420);
}

// Copies the rows [row0, row0 + 64) x samples [k0, k0 + BK) of x into a stage tile (zeros
// past M and past kend; a chunk cut by kend is copied in part).
template <int BK>
__device__ __forceinline__ void g16_issue(int4* tile, const short* __restrict__ x, long long ldx,
                                          int M, int row0, int k0, int kend)
{
    constexpr int CH = BK / 8;
#pragma unroll
    for (int i = 0; i < G16_BT * CH / G16_THREADS; ++i) {
        const int e = threadIdx.x + i * G16_THREADS;
        const int r = e / CH, c = e % CH;
        const int row = row0 + r, k = k0 + 8 * c;
        const int bytes = (row < M && k < kend) ? 2 * min(8, kend - k) : 0;
        cp_async_copy<16>(reinterpret_cast<short*>(tile + r * CH + g16_swizzle(r, c)),
                          bytes ? x + (long long)row * ldx + k : x, bytes);
    }
}

// MINB: CTAs per SM asked of the register allocator (2: 217 registers, no spills; 3 caps at
// 168 and spills ~0.5 KB per thread, measured by ptxas for sm_90).
// BK: samples per pipeline stage (64 or 128: 128 or 256 bytes per tile row; one barrier per
// BK / 32 mma k-steps).
// The same copies for a stage inside the rows and the chunk (the usual case): the thread's
// source row pointer and shared-memory slot are fixed (src, dst0); copy i is rows
// 128 / CH further down, which keeps the row's swizzle (128 / CH is a multiple of 8), so its
// slot is i * 128 int4 on: one address add per copy, no bounds arithmetic.
template <int BK>
__device__ __forceinline__ void g16_issue_inside(int4* tile, const short* src, long long step)
{
    constexpr int CH = BK / 8;
#pragma unroll
    for (int i = 0; i < G16_BT * CH / G16_THREADS; ++i)
        cp_async_copy<16>(reinterpret_cast<short*>(tile + i * G16_THREADS), src + i * step, 16);
}

template <int BK, int STAGES, int MINB>
__global__ void __launch_bounds__(G16_THREADS, MINB)
gram16(const short* __restrict__ x, long long ldx, int M, int K, int kchunk, int tiles,
       unsigned long long* __restrict__ S, long long lds, unsigned long long* __restrict__ rowsum)
{
    static_assert(STAGES >= 2, "at least double buffering");
    static_assert(BK == 64 || BK == 128, "a stage row is 8 or 16 chunks");
    constexpr int CH = BK / 8;                   // 16-byte chunks per tile row
    extern __shared__ int4 g16_smem[];
    // tile pair of this CTA: ti <= tj (row-wise walk over the upper triangle)
    int pair = blockIdx.x, ti = 0;
    while (pair >= tiles - ti) { pair -= tiles - ti; ++ti; }
    const int tj = ti + pair;
    const bool diag = ti == tj;
    const int kbeg = blockIdx.y * kchunk;
    const int kend = min(K, kbeg + kchunk);
    const int nkb = (kend - kbeg + BK - 1) / BK;
    constexpr int STAGE = 2 * G16_BT * CH;       // int4 per stage (A rows, then B rows)

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp >> 1, wn = warp & 1;
    const bool sums = rowsum != nullptr && diag && wn == 0;   // uniform per warp

    // this thread's copies in a stage inside the rows and the chunk (g16_issue_inside)
    const int cr = threadIdx.x / CH, cc = threadIdx.x % CH;
    const int dst0 = cr * CH + g16_swizzle(cr, cc);
    const long long step = (long long)(G16_THREADS / CH) * ldx;
    const short* a_src = x + (long long)(ti * G16_BT + cr) * ldx + kbeg + 8 * cc;
    const short* b_src = x + (long long)(tj * G16_BT + cr) * ldx + kbeg + 8 * cc;
    const bool rows_inside = (tj + 1) * G16_BT <= M;   // ti <= tj: both tiles
    auto issue = [&](int kb, int slot) {
        int4* st = g16_smem + slot * STAGE;
        const int k0 = kbeg + kb * BK;
        if (rows_inside && k0 + BK <= kend) {
            g16_issue_inside<BK>(st + dst0, a_src + kb * BK, step);
            if (!diag) g16_issue_inside<BK>(st + G16_BT * CH + dst0, b_src + kb * BK, step);
        } else {
            g16_issue<BK>(st, x, ldx, M, ti * G16_BT, k0, kend);
            if (!diag) g16_issue<BK>(st + G16_BT * CH, x, ldx, M, tj * G16_BT, k0, kend);
        }
    };

    int hh[2][4][4], hx[2][4][4], uu[2][4][4];
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c) hh[a][b][c] = hx[a][b][c] = uu[a][b][c] = 0;
    int sh[2][2] = {{0, 0}, {0, 0}};
    unsigned su[2][2] = {{0u, 0u}, {0u, 0u}};

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nkb) issue(s, s);
        cp_async_commit();   // committed even when empty: cp_async_wait counts groups
    }
    int slot = 0, next_slot = STAGES - 1;   // kb % STAGES and (kb + STAGES - 1) % STAGES
    for (int kb = 0; kb < nkb; ++kb) {
        cp_async_wait<STAGES - 2>();   // stage kb landed for this thread ...
        __syncthreads();               // ... for all; and all are done with stage kb - 1
        if (kb + STAGES - 1 < nkb) issue(kb + STAGES - 1, next_slot);   // stage kb - 1's slot
        cp_async_commit();
        const int4* As = g16_smem + slot * STAGE;
        slot = slot + 1 == STAGES ? 0 : slot + 1;
        next_slot = next_slot + 1 == STAGES ? 0 : next_slot + 1;
        const int4* Bs = diag ? As : As + G16_BT * CH;
#pragma unroll
        for (int ks = 0; ks < BK / 32; ++ks) {
            // lane (g, t) holds samples 8t..8t+7 of this 32-sample step for rows g and g + 8:
            // the mma's K order is free as long as A and B agree, so the low four go to the
            // fragment's k = 4t.. slot and the high four to k = 16 + 4t..
            const int c = ks * 4 + t;
            unsigned ah[2][4], au[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int r = wm * 32 + mt * 16 + half * 8 + g;
                    const int4 v = As[r * CH + g16_swizzle(r, c)];
                    ah[mt][half] = g16_hi(v.x, v.y);
                    ah[mt][2 + half] = g16_hi(v.z, v.w);
                    au[mt][half] = g16_lo(v.x, v.y);
                    au[mt][2 + half] = g16_lo(v.z, v.w);
                    if (sums) {
                        sh[mt][half] = __dp4a((int)ah[mt][half], 0x01010101,
                                              __dp4a((int)ah[mt][2 + half], 0x01010101,
                                                     sh[mt][half]));
                        su[mt][half] = __dp4a(au[mt][half], 0x01010101u,
                                              __dp4a(au[mt][2 + half], 0x01010101u,
                                                     su[mt][half]));
                    }
                }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const int r = wn * 32 + nt * 8 + g;
                const int4 v = Bs[r * CH + g16_swizzle(r, c)];
                const unsigned bh0 = g16_hi(v.x, v.y), bh1 = g16_hi(v.z, v.w);
                const unsigned bu0 = g16_lo(v.x, v.y), bu1 = g16_lo(v.z, v.w);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    g16_mma_ss(hh[mt][nt], ah[mt], bh0, bh1);
                    g16_mma_su(hx[mt][nt], ah[mt], bu0, bu1);
                    g16_mma_us(hx[mt][nt], au[mt], bh0, bh1);
                    g16_mma_uu(uu[mt][nt], au[mt], bu0, bu1);
                }
            }
        }
    }
    cp_async_wait<0>();   // only empty groups remain
    __syncthreads();      // every warp is done with the stages: their memory is reused below

    if (sums) {           // lanes t = 0..3 of a row hold a quarter of its samples each
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                long long s = 256LL * sh[mt][half] + (long long)su[mt][half];
                s += __shfl_xor_sync(0xffffffffu, s, 1);
                s += __shfl_xor_sync(0xffffffffu, s, 2);
                const int row = ti * G16_BT + wm * 32 + mt * 16 + half * 8 + g;
                if (t == 0 && row < M && s != 0) atomicAdd(rowsum + row, (unsigned long long)s);
            }
    }

    // The CTA's int64 tile through shared memory, so that the atomics of a warp go to 32
    // consecutive words of one row of S (and, for the mirror tile, of one column of the tile).
    constexpr int LD = G16_BT + 1;   // int64 words per tile row (odd: column reads spread)
    long long* tile = reinterpret_cast<long long*>(g16_smem);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int r = wm * 32 + mt * 16 + (q >> 1) * 8 + g;
                const int col = wn * 32 + nt * 8 + 2 * t + (q & 1);
                tile[r * LD + col] = 65536LL * hh[mt][nt][q] + 256LL * hx[mt][nt][q]
                                     + (long long)(unsigned)uu[mt][nt][q];
            }
    __syncthreads();
    const int i0 = ti * G16_BT, j0 = tj * G16_BT;
    for (int e = threadIdx.x; e < G16_BT * G16_BT; e += G16_THREADS) {
        const int r = e >> 6, col = e & 63;
        if (i0 + r < M && j0 + col < M) {
            const long long v = tile[r * LD + col];
            if (v != 0) atomicAdd(S + (long long)(i0 + r) * lds + j0 + col, (unsigned long long)v);
        }
        if (!diag && j0 + r < M && i0 + col < M) {   // S[j][i] = S[i][j]
            const long long v = tile[col * LD + r];
            if (v != 0) atomicAdd(S + (long long)(j0 + r) * lds + i0 + col, (unsigned long long)v);
        }
    }
}
