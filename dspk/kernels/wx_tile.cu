// wx_tile: the direct kernel for a small W times a wide X (spatial filters, projections) as a
// register-tiled GEMM: persistent CTAs stage W once (transposed, in shared memory) and stream
// column tiles of X through a cp.async pipeline of STAGES k-chunks; each thread owns 8 rows x
// TC columns, so per k it makes 2-4 16-byte shared loads for 32-64 FMAs, and stores 16-byte
// vectors (linalg/candidates_gpu.py, "direct_wxtile"). The other direct kernels of skinny
// products are in skinny.cu; this one is a file of its own because the tuner uses many of its
// instances (CTAs per SM and k-chunk vary with W's shape and the device), which dspk.kernels
// compiles together on first use.
//
// Every product is an explicit fma() in the operands' precision: no promotion, no TF32.
// Indices are 32-bit: the Python side checks every view with MatrixView.check(index_bits=32)
// before launch. Pointers passed in point at element [0,0,0] of each view; strides may be 0
// (broadcast) or negative.

#include "common.cuh"
#include "launch.cuh"

// ------------------------------------------------------------------------------------------
// wx_tile: out[b, m, n] = sum_k W[b, m, k] X[b, k, n] for M <= MM (8, 16, 32 or 64) and a wide
// X and out with unit column stride and 16-byte aligned rows (checked by the caller).
//
// Why another W·X kernel: wx_vec reads X straight from global memory into registers, so each
// thread waits on its own loads, and each X vector it loads feeds only MT rows; on an H200 it
// runs the 64x64 spatial filter at ~1/3 of the FP32 rate and ~1/4 of the copy rate. Here the
// two floors of that product (64x64·64x60000 float32: ~7.5 us of HBM traffic, ~8 us of FMAs)
// overlap:
//   - persistent CTAs (grid.x = about the CTAs that fit on the device, chosen on the host;
//     grid.y = batch): W[b] is staged once per CTA, and the copy pipeline runs across column
//     tiles, so the next tile's X is in flight while this one is multiplied (a CTA of one
//     tile exposes the DRAM latency at its start, and with K = 64 a tile is only a few k-steps);
//   - X moves global -> shared by cp.async, STAGES k-chunks of KC rows x TN columns in flight,
//     no register round trip (the loads of a stage do not wait on each other or on the FMAs);
//     the last column tile and the k rows past K are zero-filled by the copy itself;
//   - a classic SGEMM micro-tile: each thread owns TM = 8 rows x TC columns in registers; per k
//     it reads its 8 W values and TC X values with 16-byte shared loads (2 + 2 for float, TC = 8)
//     and issues TM*TC FMAs, so FMAs are ~94% of the issued instructions;
//   - lanes form WR x WC groups in a warp (4 x 8 when MM >= 32), and a thread's rows and columns
//     are interleaved by 16-byte vectors (vector v at v*VE*WR + lr*VE rows, v*VE*WC + lc*VE
//     columns), so every shared load of a warp reads WR or WC consecutive 16-byte words (no
//     bank conflict) and every global store of a warp writes whole 128-byte lines.
// W is staged as Ws[k][m] with a row pitch of MM + VE elements: rows stay 16-byte aligned and
// the transposing writes (lanes 8 k x 4 m, so that the global reads of a row-major W are 32-byte
// sectors) hit 32 different banks. Ws is zero for k >= K and m >= M, X for k >= K and n >= N:
// the padded products add exact zeros (and never 0 * garbage, which could be NaN).
// Each k-chunk is a pipeline step; step s of a CTA is k-chunk s % kch of its (s / kch)-th tile
// (tiles blockIdx.x, blockIdx.x + gridDim.x, ...), tracked by counters (no division in the
// loop). The W and X register fragments are double-buffered: k+1's are read while k's FMAs
// issue; the one barrier of a step comes before its last k (it waits for step s+1's copies,
// STAGES-3 groups may stay pending, and frees step s-1's stage for step s+STAGES-1), so the
// next step's first fragments are read before this step's last FMAs too. MINB goes to
// __launch_bounds__: the registers of MINB CTAs fit on an SM (128 for 16 warps of 8x8 tiles).
// Products are fma() in T, summed over k in increasing order: deterministic, and exact in the
// operands' precision.
// Shared memory (dynamic): STAGES*KC*TN + ceil(K/KC)*KC*(MM + VE) elements.
// ------------------------------------------------------------------------------------------
// The copies of one pipeline step: rows k0 .. k0+KC-1, columns n0 .. n0+TN-1 of X[b] into the
// stage buffer xs [KC][TN], one 16-byte vector per copy (consecutive threads, consecutive
// vectors: coalesced reads, conflict-free writes). A vector that straddles N is copied in part
// (the row starts are 16-byte aligned, so the vector's address is too); rows >= K and vectors
// past N are zero-filled.
template <typename T, int TN, int KC, int NT>
__device__ __forceinline__ void wt_issue_x(T* xs, const T* __restrict__ Xb, int sxk, int K,
                                           int N, int k0, int n0, int tid)
{
    constexpr int VE = Vec16<T>::n, TV = TN / VE, CH = KC * TV;
#pragma unroll
    for (int e0 = 0; e0 < CH; e0 += NT) {
        const int e = e0 + tid;
        if (CH % NT == 0 || e < CH) {
            const int k = k0 + e / TV, n = n0 + (e % TV) * VE;
            const int bytes = (k < K && n < N) ? min(N - n, VE) * (int)sizeof(T) : 0;
            cp_async_copy<16>(xs + e * VE, bytes ? Xb + k * sxk + n : Xb, bytes);
        }
    }
}

template <typename T, int MM, int TN, int TC, int KC, int STAGES, int MINB>
__global__ void __launch_bounds__((MM / WT_TM) * (TN / TC), MINB)
wx_tile(const T* __restrict__ W, int swb, int swm, int swk,
        const T* __restrict__ X, int sxb, int sxk,
        int M, int K, int N, T* __restrict__ out, int sob, int som)
{
    constexpr int TM = WT_TM;                 // rows per thread
    constexpr int VE = Vec16<T>::n;           // elements per 16-byte vector
    constexpr int RY = MM / TM, CX = TN / TC, NT = RY * CX;
    constexpr int WR = RY < 4 ? RY : 4, WC = 32 / WR;  // lanes of a warp: WR rows x WC columns
    constexpr int WP = MM + VE;               // Ws row pitch
    static_assert(MM % TM == 0 && MM >= 8 && MM <= 64, "MM is 8, 16, 32 or 64");
    static_assert(TC % VE == 0 && TN % TC == 0, "whole 16-byte vectors per thread");
    static_assert(CX % WC == 0 && NT % 32 == 0 && NT <= 1024, "whole warps of WR x WC lanes");
    static_assert(STAGES >= 3, "a stage being read, one being filled, at least one ahead");
    static_assert(KC >= 2 && KC % 2 == 0, "fragment buffers alternate over an even k-chunk");

    extern __shared__ __align__(16) unsigned char wt_smem[];
    T* Xs = reinterpret_cast<T*>(wt_smem);    // [STAGES][KC][TN]
    T* Ws = Xs + STAGES * KC * TN;            // [KP][WP]

    const int tid = threadIdx.x, b = blockIdx.y;
    const int kch = K > 0 ? (K + KC - 1) / KC : 1;  // k-chunks per tile (K = 0: one of zeros)
    const int KP = kch * KC;
    const int tiles = (N + TN - 1) / TN;
    const int G = gridDim.x, first = blockIdx.x;
    const int steps = (first < tiles ? (tiles - 1 - first) / G + 1 : 0) * kch;
    const T* Wb = W + b * swb;
    const T* Xb = X + b * sxb;

    // W[b] transposed into Ws; these copies join the first group, so step 0's wait covers them.
    const int kp8 = (KP + 7) & ~7;
    for (int e = tid; e < kp8 * MM; e += NT) {
        const int m = (e >> 3) % MM, k = ((e >> 3) / MM) * 8 + (e & 7);
        if (k < KP) {
            const bool in = k < K && m < M;
            cp_async_copy<(int)sizeof(T)>(Ws + k * WP + m, in ? Wb + m * swm + k * swk : Wb,
                                    in ? (int)sizeof(T) : 0);
        }
    }
    // The producer: step `is` (k-chunk ikc of tile itile) goes to stage istage. Counters, not
    // divisions: the loop below has no integer division.
    int is = 0, ikc = 0, itile = first, istage = 0;
    auto issue_next = [&]() {
        if (is < steps)
            wt_issue_x<T, TN, KC, NT>(Xs + istage * (KC * TN), Xb, sxk, K, N, ikc * KC,
                                      itile * TN, tid);
        cp_async_commit();  // committed even when empty: the group count is what cp_async_wait counts
        ++is;
        if (++istage == STAGES) istage = 0;
        if (++ikc == kch) { ikc = 0; itile += G; }
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue_next();  // steps 0 .. STAGES-2

    const int lane = tid & 31, warp = tid >> 5;
    const int row0 = (warp / (CX / WC)) * (TM * WR) + (lane / WC) * VE;
    const int col0 = (warp % (CX / WC)) * (TC * WC) + (lane % WC) * VE;
    T acc[TM][TC];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TC; ++j) acc[i][j] = T(0);

    // Register fragments, double-buffered: k+1's W and X values are read from shared memory
    // while k's FMAs issue, across k-chunk boundaries too (the barrier that makes the next
    // chunk visible comes before the last k of this one).
    T a[2][TM], x[2][TC];
    auto load_frag = [&](int buf, const T* ws, const T* xs) {
#pragma unroll
        for (int v = 0; v < TM / VE; ++v) Vec16<T>::load(ws + v * (VE * WR), &a[buf][v * VE]);
#pragma unroll
        for (int v = 0; v < TC / VE; ++v) Vec16<T>::load(xs + v * (VE * WC), &x[buf][v * VE]);
    };

    cp_async_wait<STAGES - 2>();  // step 0 (and W) complete for this thread ...
    __syncthreads();        // ... and for all
    int kc = 0, tile = first, stage = 0;
    load_frag(0, Ws + row0, Xs + col0);

    for (int s = 0; s < steps; ++s) {
        const T* xs = Xs + stage * (KC * TN) + col0;
        const T* ws = Ws + kc * (KC * WP) + row0;
        const int nstage = stage + 1 == STAGES ? 0 : stage + 1;
        const int nkc = kc + 1 == kch ? 0 : kc + 1;
#pragma unroll
        for (int k = 0; k < KC; ++k) {
            const int cur = k & 1;
            if (k + 1 < KC) {
                load_frag(cur ^ 1, ws + (k + 1) * WP, xs + (k + 1) * TN);
            } else {
                // Step s+1's group is complete for this thread (groups committed: steps up to
                // s+STAGES-2); the barrier makes every thread's copies visible, and says that
                // all threads are done with step s-1's stage, which the copies issued next
                // (step s+STAGES-1) overwrite. After the last step it reads unused values.
                cp_async_wait<STAGES - 3>();
                __syncthreads();
                issue_next();
                load_frag(cur ^ 1, Ws + nkc * (KC * WP) + row0, Xs + nstage * (KC * TN) + col0);
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TC; ++j) acc[i][j] = fma(a[cur][i], x[cur][j], acc[i][j]);
        }

        if (kc == kch - 1) {  // the tile's last k-chunk: write it out, start the next
            const int n0 = tile * TN + col0;
            T* ob = out + b * sob;
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                const int m = row0 + (i / VE) * (VE * WR) + i % VE;
                if (m >= M) continue;
#pragma unroll
                for (int v = 0; v < TC / VE; ++v) {
                    const int n = n0 + v * (VE * WC);
                    if (n + VE <= N) {
                        Vec16<T>::store(ob + m * som + n, &acc[i][v * VE]);
                    } else {
#pragma unroll
                        for (int c = 0; c < VE; ++c)
                            if (n + c < N) ob[m * som + n + c] = acc[i][v * VE + c];
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TC; ++j) acc[i][j] = T(0);
            tile += G;
        }
        stage = nstage;
        kc = nkc;
    }
    cp_async_wait<0>();  // only empty groups can remain; nothing is left in flight at exit
}
