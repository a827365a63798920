// Direct kernels for skinny products, the shapes where a tiled library has little to reuse and
// where Python/launch overhead dominates (seed 002, "What the numbers teach").
//
//   gram_small  out[b] = A[b]·B[b] with a tiny output (M, N <= 8) and long K: covariance of a
//               few channels. Split-K over CTAs; the last CTA to finish reduces the partials in
//               a fixed order (deterministic), so it is one launch.
//   gram_tiled  the same for outputs up to 64x64 (covariance of 64 channels): 64x64 register
//               tile per CTA, K split over CTAs, partials reduced by splitk_reduce.
//               SYM (A·Aᵀ): only the upper triangle of 4x4 thread tiles is computed, on a packed
//               thread layout, so the redundant half of the products is never issued.
//   wx_direct   out[b] = W[b]·X[b] with small W (M <= 64 rows, K·M in shared memory): spatial filters and
//               projections. W is staged once per CTA in shared memory; each thread owns CPT
//               output columns and reads each X element once.
//   wx_vec      the same with 4 consecutive columns per thread (16-byte loads and stores, each W
//               value feeds 4 FMAs) and the rows split over SLICES warps-groups.
//   (wx_tile, the same as a register-tiled GEMM, is in wx_tile.cu: its many instances are
//   compiled apart from these, so a product that never takes it does not compile them.)
//   splitk_reduce  sums split-K partials in a fixed order, coalesced (256/G outputs x G groups
//               of partials per block); optionally mirrors a symmetric result.
//   symblock_reduce  the same for partial products of the upper-triangular blocks of X·Xᵀ
//               computed by cuBLAS (linalg/candidates_gpu.py, "cublas_symblock").
//
// Every product is an explicit fma() in the operands' precision: no promotion, no TF32.
// Indices are 32-bit: the Python side checks every view with MatrixView.check(index_bits=32)
// before launch. Pointers passed in point at element [0,0,0] of each view; strides may be 0
// (broadcast) or negative.

#include "common.cuh"
#include "launch.cuh"

template <typename T>
__device__ __forceinline__ T warp_sum(T v, int width)
{
    // Butterfly over `width` lanes (a power of two <= 32): a fixed tree, so deterministic.
    for (int off = width >> 1; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off, width);
    return v;
}

// ------------------------------------------------------------------------------------------
// gram_small: M, N <= MD (MD in {1, 2, 4, 8}), GS_THREADS threads, grid (S, batches).
// Each CTA covers kchunk = GS_THREADS*GS_U*steps samples.
// part: [batches, S, MD*MD] in Acc. counters[b] must be 0 at launch; the last CTA resets it.
// ------------------------------------------------------------------------------------------
template <typename T, typename Acc, int MD, bool SYM>
__global__ void __launch_bounds__(GS_THREADS)
gram_small(const T* __restrict__ A, int sab, int sam, int sak,
           const T* __restrict__ B, int sbb, int sbk, int sbn,
           int M, int N, int K, int kchunk, Acc* __restrict__ part,
           unsigned int* __restrict__ counters, T* __restrict__ out, int sob, int som, int son)
{
    constexpr int MN = MD * MD;
    constexpr int WARPS = GS_THREADS / 32;
    static_assert(WARPS == 8, "the block's sum below adds 8 warps");
    __shared__ Acc red[WARPS][MN];
    __shared__ bool is_last;

    const int s = blockIdx.x, S = gridDim.x, b = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const T* Ab = A + b * sab;
    const T* Bb = B + b * sbb;
    const int k0 = s * kchunk;
    const int k1 = min(K, k0 + kchunk);

    Acc acc[MD][MD];
#pragma unroll
    for (int i = 0; i < MD; ++i)
#pragma unroll
        for (int j = 0; j < MD; ++j) acc[i][j] = Acc(0);

    // GS_U samples of k per thread per step, all loaded before any is used: the loads are in
    // flight together (this kernel is bound by memory latency, not bandwidth).
    for (int kb = k0 + tid; kb < k1; kb += GS_THREADS * GS_U) {
        Acc a[GS_U][MD], bv[GS_U][MD];
#pragma unroll
        for (int u = 0; u < GS_U; ++u) {
            const int k = kb + u * GS_THREADS;
            const bool in = k < k1;
#pragma unroll
            for (int i = 0; i < MD; ++i)
                a[u][i] = (in && i < M) ? Acc(Ab[i * sam + k * sak]) : Acc(0);
            if (!SYM) {
#pragma unroll
                for (int j = 0; j < MD; ++j)
                    bv[u][j] = (in && j < N) ? Acc(Bb[k * sbk + j * sbn]) : Acc(0);
            }
        }
#pragma unroll
        for (int u = 0; u < GS_U; ++u)
#pragma unroll
            for (int i = 0; i < MD; ++i)
#pragma unroll
                for (int j = 0; j < MD; ++j)
                    if (!SYM || j >= i)
                        acc[i][j] = fma(a[u][i], SYM ? a[u][j] : bv[u][j], acc[i][j]);
    }

#pragma unroll
    for (int i = 0; i < MD; ++i)
#pragma unroll
        for (int j = 0; j < MD; ++j) {
            if ((SYM && j < i) || i >= M || j >= N) continue;
            const Acc v = warp_sum(acc[i][j], 32);
            if (lane == 0) red[warp][i * MD + j] = v;
        }
    __syncthreads();
    if (tid < MN) {
        const int i = tid / MD, j = tid % MD;
        if ((!SYM || j >= i) && i < M && j < N) {
            const Acc v = ((red[0][tid] + red[1][tid]) + (red[2][tid] + red[3][tid])) +
                          ((red[4][tid] + red[5][tid]) + (red[6][tid] + red[7][tid]));
            part[((size_t)b * S + s) * MN + tid] = v;
        }
    }

    // The last CTA of this batch reduces all S partials (fixed order) and writes out.
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        const unsigned int ticket = atomicAdd(&counters[b], 1u);
        is_last = (ticket == (unsigned int)(S - 1));
    }
    __syncthreads();
    if (!is_last) return;
    if (tid == 0) counters[b] = 0u;  // ready for the next launch on this stream
    __threadfence();
    for (int o = warp; o < MN; o += WARPS) {
        const int i = o / MD, j = o % MD;
        if ((SYM && j < i) || i >= M || j >= N) continue;
        const Acc* p = part + (size_t)b * S * MN + o;
        Acc a0 = Acc(0), a1 = Acc(0);
        int q = lane;
        for (; q + 32 < S; q += 64) {
            a0 += __ldcg(p + (size_t)q * MN);
            a1 += __ldcg(p + (size_t)(q + 32) * MN);
        }
        if (q < S) a0 += __ldcg(p + (size_t)q * MN);
        const T v = T(warp_sum(a0 + a1, 32));
        if (lane == 0) {
            out[b * sob + i * som + j * son] = v;
            if (SYM && i != j) out[b * sob + j * som + i * son] = v;
        }
    }
}

// ------------------------------------------------------------------------------------------
// gram_tiled: M, N <= GT_TILE = 64. Grid (S, batches). GT_THREADS = 256 threads
// (GT_SYM_THREADS = 160 when SYM: 136 compute tiles). part: [batches, S, 64, 64].
// ------------------------------------------------------------------------------------------
static_assert(GT_THREADS == (GT_TILE / 4) * (GT_TILE / 4), "a 4x4 output tile per thread");
constexpr int GT_KT = 32;
constexpr int GT_PAD = 4;  // keeps rows 16-byte aligned for the vector loads

// The tile of one operand, Ts[k][row] = src[row * s_row + (k0 + k) * s_k], zero outside
// [0, rows) x [k0, kend), in two halves: fetch() into registers (GT_LPT per thread), then
// put() into shared memory, so the next tile's global loads overlap this tile's FMAs.
// Lanes walk the operand's contiguous dimension so that global loads coalesce.
constexpr int GT_LPT =       // loads per thread at GT_SYM_THREADS threads
    (GT_TILE * GT_KT + GT_SYM_THREADS - 1) / GT_SYM_THREADS;

template <typename T>
struct GtTile {
    T v[GT_LPT];

    __device__ __forceinline__ void fetch(const T* __restrict__ src, int s_row, int s_k, int rows,
                                          int k0, int kend, int tid, int nthreads)
    {
#pragma unroll
        for (int t = 0; t < GT_LPT; ++t) {
            const int e = tid + t * nthreads;
            int k, r;
            if (s_k == 1) { k = e % GT_KT; r = e / GT_KT; }
            else { r = e % GT_TILE; k = e / GT_TILE; }
            const int kk = k0 + k;
            v[t] = (e < GT_TILE * GT_KT && r < rows && kk < kend) ? src[r * s_row + kk * s_k]
                                                                  : T(0);
        }
    }

    __device__ __forceinline__ void put(T (*Ts)[GT_TILE + GT_PAD], int s_k, int tid,
                                        int nthreads) const
    {
#pragma unroll
        for (int t = 0; t < GT_LPT; ++t) {
            const int e = tid + t * nthreads;
            if (e < GT_TILE * GT_KT) {
                if (s_k == 1) Ts[e % GT_KT][e / GT_KT] = v[t];
                else Ts[e / GT_TILE][e % GT_TILE] = v[t];
            }
        }
    }
};

// MINB: CTAs per SM the register allocation must allow (1: no limit; 3: at most 85 registers).
template <typename T, typename Acc, bool SYM, int MINB>
__global__ void __launch_bounds__(GT_THREADS, MINB)
gram_tiled(const T* __restrict__ A, int sab, int sam, int sak,
           const T* __restrict__ B, int sbb, int sbk, int sbn,
           int M, int N, int K, int kchunk, Acc* __restrict__ part)
{
    __shared__ __align__(16) T As[GT_KT][GT_TILE + GT_PAD];
    __shared__ __align__(16) T Bs[SYM ? 1 : GT_KT][GT_TILE + GT_PAD];

    const int s = blockIdx.x, S = gridDim.x, b = blockIdx.y;
    const int tid = threadIdx.x, nthreads = blockDim.x;
    const int k0 = s * kchunk;
    const int k1 = min(K, k0 + kchunk);
    const T* Ab = A + b * sab;
    const T* Bb = B + b * sbb;

    // Thread tile (ty, tx) of the 16x16 grid of 4x4 tiles.
    int ty = tid / 16, tx = tid % 16;
    bool computes = tid < GT_THREADS;
    if (SYM) {
        // Packed upper triangle: tile t -> (ty <= tx), row-major over the triangle.
        int t = tid;
        ty = 0;
        while (ty < 16 && t >= 16 - ty) { t -= 16 - ty; ++ty; }
        tx = ty + t;
        computes = ty < 16;
    }

    Acc acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = Acc(0);

    GtTile<T> ra, rb;
    ra.fetch(Ab, sam, sak, M, k0, k1, tid, nthreads);
    if (!SYM) rb.fetch(Bb, sbn, sbk, N, k0, k1, tid, nthreads);
    for (int kt = k0; kt < k1; kt += GT_KT) {
        ra.put(As, sak, tid, nthreads);
        if (!SYM) rb.put(Bs, sbk, tid, nthreads);
        __syncthreads();
        if (kt + GT_KT < k1) {  // next tile in flight while this one is multiplied
            ra.fetch(Ab, sam, sak, M, kt + GT_KT, k1, tid, nthreads);
            if (!SYM) rb.fetch(Bb, sbn, sbk, N, kt + GT_KT, k1, tid, nthreads);
        }
        if (computes) {
#pragma unroll 8
            for (int k = 0; k < GT_KT; ++k) {
                T a[4], bv[4];
                Quad<T>::load(&As[k][ty * 4], a);
                if (SYM) Quad<T>::load(&As[k][tx * 4], bv);
                else Quad<T>::load(&Bs[k][tx * 4], bv);
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) acc[i][j] = fma(Acc(a[i]), Acc(bv[j]), acc[i][j]);
            }
        }
        __syncthreads();
    }

    if (computes) {
        Acc* p = part + ((size_t)b * S + s) * (GT_TILE * GT_TILE);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) p[(ty * 4 + i) * GT_TILE + tx * 4 + j] = acc[i][j];
    }
}

// ------------------------------------------------------------------------------------------
// Split-K reductions. A block of RED_THREADS = 256 threads owns OPB = 256/G consecutive outputs
// of one row: thread t reads output t % OPB of every G-th partial (group g = t / OPB), so each
// warp load is a run of consecutive elements (coalesced); the G group sums are then added in a
// fixed pairwise tree. Deterministic. For SYM only the upper triangle is read and each value is
// written to both (i, j) and (j, i), so the result is exactly symmetric.
// ------------------------------------------------------------------------------------------
template <typename Acc, int G>
__device__ __forceinline__ Acc strided_sum(const Acc* __restrict__ p, int S, long long pss, int g)
{
    Acc a0 = Acc(0), a1 = Acc(0), a2 = Acc(0), a3 = Acc(0);
    int s = g;
    for (; s + 3 * G < S; s += 4 * G) {
        a0 += p[(long long)s * pss];
        a1 += p[(long long)(s + G) * pss];
        a2 += p[(long long)(s + 2 * G) * pss];
        a3 += p[(long long)(s + 3 * G) * pss];
    }
    for (; s < S; s += G) a0 += p[(long long)s * pss];
    return (a0 + a1) + (a2 + a3);
}

template <typename Acc, int G, int OPB>
__device__ __forceinline__ Acc group_tree_sum(Acc (*red)[OPB + 1], int o)
{
    Acc r[G];
#pragma unroll
    for (int g = 0; g < G; ++g) r[g] = red[g][o];
#pragma unroll
    for (int w = G / 2; w > 0; w >>= 1)
#pragma unroll
        for (int q = 0; q < w; ++q) r[q] = r[q] + r[q + w];
    return r[0];
}

// out[b, i, j] = sum_s part[b*pbs + s*pss + i*ldp + j]. Grid (M * ceil(N/OPB), batches).
template <typename Acc, typename T, int G, bool SYM>
__global__ void __launch_bounds__(RED_THREADS)
splitk_reduce(const Acc* __restrict__ part, int S, long long pbs, long long pss, int ldp,
              int M, int N, T* __restrict__ out, int sob, int som, int son)
{
    constexpr int OPB = RED_THREADS / G;
    __shared__ Acc red[G][OPB + 1];
    const int o = threadIdx.x % OPB, g = threadIdx.x / OPB;
    const int nj = (N + OPB - 1) / OPB;
    const int i = blockIdx.x / nj, j = (blockIdx.x % nj) * OPB + o, b = blockIdx.y;
    const bool valid = j < N && (!SYM || j >= i);
    red[g][o] = valid ? strided_sum<Acc, G>(part + b * pbs + (long long)i * ldp + j, S, pss, g)
                      : Acc(0);
    __syncthreads();
    if (g == 0 && valid) {
        const T v = T(group_tree_sum<Acc, G, OPB>(red, o));
        out[b * sob + i * som + j * son] = v;
        if (SYM && i != j) out[b * sob + j * som + i * son] = v;
    }
}

// X·Xᵀ assembled from cuBLAS products of upper-triangular blocks. Block q covers rows
// [start(q), start(q)+bs), start(q) = min(q*bs, M-bs); pair (p, q), p <= q, has index
// p*nb - p*(p-1)/2 + (q-p); part is [S][pairs][bs][bs] row-major with
// part[s][pair][r][c] = sum_k X[start(p)+r, k] X[start(q)+c, k]. Output (i, j), i <= j, is read
// from the first block pair that contains it. Grid (M * ceil(M/OPB)).
template <typename T, int G>
__global__ void __launch_bounds__(RED_THREADS)
symblock_reduce(const T* __restrict__ part, int S, int nb, int bs, int M,
                T* __restrict__ out, int som, int son)
{
    constexpr int OPB = RED_THREADS / G;
    __shared__ T red[G][OPB + 1];
    const int o = threadIdx.x % OPB, g = threadIdx.x / OPB;
    const int nj = (M + OPB - 1) / OPB;
    const int i = blockIdx.x / nj, j = (blockIdx.x % nj) * OPB + o;
    if ((blockIdx.x % nj) * OPB + OPB - 1 < i) return;  // block entirely below the diagonal
    const bool valid = j < M && j >= i;
    T v = T(0);
    if (valid) {
        const int p = min(i / bs, nb - 1), q = min(j / bs, nb - 1);
        const int rp = i - min(p * bs, M - bs), cq = j - min(q * bs, M - bs);
        const long long pairs = (long long)nb * (nb + 1) / 2;
        const long long pair = (long long)p * nb - (long long)p * (p - 1) / 2 + (q - p);
        v = strided_sum<T, G>(part + pair * bs * bs + (long long)rp * bs + cq, S,
                              pairs * bs * bs, g);
    }
    red[g][o] = v;
    __syncthreads();
    if (g == 0 && valid) {
        const T r = group_tree_sum<T, G, OPB>(red, o);
        out[i * som + j * son] = r;
        if (i != j) out[j * som + i * son] = r;
    }
}

// ------------------------------------------------------------------------------------------
// wx_vec: out[b, m, n] = sum_k W[b, m, k] X[b, k, n] for small M, each thread computing MT rows
// x 4 consecutive columns, so every W value read from shared memory feeds 4 FMAs and every X
// load is 16 bytes. Block (64, SLICES): threadIdx.y picks the row slice [y*MT, (y+1)*MT) (all
// lanes of a warp share it, so W reads are broadcasts; slices share X through L1). Needs X and
// out with unit column stride and 16-byte aligned rows (checked by the caller); the last
// columns are handled element by element. W is staged as Ws[k][m], MM = MT*SLICES rows, zero
// padded. K unrolled by KU with the loads issued first. Grid (ceil(N / 256), B).
// ------------------------------------------------------------------------------------------
template <typename T, int MT, int SLICES, int KU>
__global__ void __launch_bounds__(WXV_THREADS * SLICES)
wx_vec(const T* __restrict__ W, int swb, int swm, int swk,
       const T* __restrict__ X, int sxb, int sxk,
       int M, int K, int N, T* __restrict__ out, int sob, int som)
{
    constexpr int MM = MT * SLICES;
    extern __shared__ __align__(16) unsigned char wv_smem[];
    T* Ws = reinterpret_cast<T*>(wv_smem);
    const int b = blockIdx.y;
    const int tid = threadIdx.y * WXV_THREADS + threadIdx.x;
    const T* Wb = W + b * swb;
    for (int e = tid; e < K * MM; e += WXV_THREADS * SLICES) {
        const int k = e / MM, m = e % MM;
        Ws[e] = m < M ? Wb[m * swm + k * swk] : T(0);
    }
    __syncthreads();

    const int m0 = threadIdx.y * MT;
    if (m0 >= M) return;
    const int n = (blockIdx.x * WXV_THREADS + threadIdx.x) * 4;
    if (n >= N) return;
    const bool full = n + 3 < N;
    const T* Xb = X + b * sxb + n;
    T acc[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[m][c] = T(0);

    auto load_x = [&](int k, T (&x)[4]) {
        if (full) {
            Quad<T>::load_ro(Xb + k * sxk, x);
        } else {
#pragma unroll
            for (int c = 0; c < 4; ++c) x[c] = n + c < N ? Xb[k * sxk + c] : T(0);
        }
    };
    auto step = [&](int k, const T (&x)[4]) {
        const T* wk = Ws + k * MM + m0;
#pragma unroll
        for (int m4 = 0; m4 < MT; m4 += 4) {
            T w[4];
            Quad<T>::load(wk + m4, w);
#pragma unroll
            for (int t = 0; t < 4; ++t)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[m4 + t][c] = fma(w[t], x[c], acc[m4 + t][c]);
        }
    };

    // KU rows of X in flight per thread: the kernel is bound by memory latency, so all loads of
    // a block of KU are issued before the first is used; the last block is predicated.
    for (int k = 0; k < K; k += KU) {
        T x[KU][4];
#pragma unroll
        for (int u = 0; u < KU; ++u) {
            if (k + u < K) {
                load_x(k + u, x[u]);
            } else {
#pragma unroll
                for (int c = 0; c < 4; ++c) x[u][c] = T(0);
            }
        }
#pragma unroll
        for (int u = 0; u < KU; ++u)
            if (k + u < K) step(k + u, x[u]);
    }

    T* ob = out + b * sob + n;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (m0 + m >= M) break;
        if (full) {
            Quad<T>::store(ob + (m0 + m) * som, acc[m]);
        } else {
#pragma unroll
            for (int c = 0; c < 4; ++c)
                if (n + c < N) ob[(m0 + m) * som + c] = acc[m][c];
        }
    }
}

// ------------------------------------------------------------------------------------------
// wx_direct: out[b, m, n] = sum_k W[b, m, k] X[b, k, n], M <= MM (a multiple of 4), CPT*MM <= 128.
// Dynamic shared memory: K*MM elements, Ws[k][m] = W[b, m, k], zero for m >= M, so each k step
// reads W with MM/4 vector loads (broadcast to the warp). K is unrolled by 4 with the X loads
// issued first, so each thread keeps 4*CPT loads in flight. Grid (ceil(N/(256*CPT)), B).
// ------------------------------------------------------------------------------------------
template <typename T, int MM, int CPT>
__global__ void __launch_bounds__(WXD_THREADS)
wx_direct(const T* __restrict__ W, int swb, int swm, int swk,
          const T* __restrict__ X, int sxb, int sxk, int sxn,
          int M, int K, int N, T* __restrict__ out, int sob, int som, int son)
{
    constexpr int KU = 4;
    extern __shared__ __align__(16) unsigned char wx_smem[];
    T* Ws = reinterpret_cast<T*>(wx_smem);
    const int b = blockIdx.y, tid = threadIdx.x;
    const T* Wb = W + b * swb;
    for (int e = tid; e < K * MM; e += blockDim.x) {
        const int k = e / MM, m = e % MM;
        Ws[e] = m < M ? Wb[m * swm + k * swk] : T(0);
    }
    __syncthreads();

    const int n0 = blockIdx.x * (WXD_THREADS * CPT) + tid;
    const T* Xb = X + b * sxb;
    int col[CPT];
    bool ok[CPT];
#pragma unroll
    for (int q = 0; q < CPT; ++q) {
        const int n = n0 + q * WXD_THREADS;
        ok[q] = n < N;
        col[q] = (ok[q] ? n : 0) * sxn;
    }
    T acc[CPT][MM];
#pragma unroll
    for (int q = 0; q < CPT; ++q)
#pragma unroll
        for (int m = 0; m < MM; ++m) acc[q][m] = T(0);

    int k = 0;
    for (; k + KU <= K; k += KU) {
        T x[KU][CPT];
#pragma unroll
        for (int u = 0; u < KU; ++u)
#pragma unroll
            for (int q = 0; q < CPT; ++q)
                x[u][q] = ok[q] ? Xb[(k + u) * sxk + col[q]] : T(0);
#pragma unroll
        for (int u = 0; u < KU; ++u) {
            const T* wk = Ws + (k + u) * MM;
#pragma unroll
            for (int m4 = 0; m4 < MM; m4 += 4) {
                T w[4];
                Quad<T>::load(wk + m4, w);
#pragma unroll
                for (int t = 0; t < 4; ++t)
#pragma unroll
                    for (int q = 0; q < CPT; ++q)
                        acc[q][m4 + t] = fma(w[t], x[u][q], acc[q][m4 + t]);
            }
        }
    }
    for (; k < K; ++k) {
        T x[CPT];
#pragma unroll
        for (int q = 0; q < CPT; ++q) x[q] = ok[q] ? Xb[k * sxk + col[q]] : T(0);
        const T* wk = Ws + k * MM;
#pragma unroll
        for (int m4 = 0; m4 < MM; m4 += 4) {
            T w[4];
            Quad<T>::load(wk + m4, w);
#pragma unroll
            for (int t = 0; t < 4; ++t)
#pragma unroll
                for (int q = 0; q < CPT; ++q) acc[q][m4 + t] = fma(w[t], x[q], acc[q][m4 + t]);
        }
    }

    T* ob = out + b * sob;
#pragma unroll
    for (int q = 0; q < CPT; ++q) {
        if (ok[q]) {
            const int n = n0 + q * WXD_THREADS;
#pragma unroll
            for (int m = 0; m < MM; ++m)
                if (m < M) ob[m * som + n * son] = acc[q][m];
        }
    }
}
