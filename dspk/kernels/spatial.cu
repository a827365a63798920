// Neighbourhood-sparse spatial filters: out[row, t] = sum_c W[row, c] * x[c, t] for a W with
// a few tens of non-zeros per row (local whitening: 32 of 384; local references; Laplacians).
//
// sparse_rows<T>: the rows of W are grouped by the host plan (dspk/ops/_spatial_gpu.py) into
//   groups of SR_R = 8 rows with overlapping neighbourhoods, and SR_G groups make a block. A
//   block copies the x rows that any of its groups touches (the block's column union) for
//   SR_TS consecutive samples into shared memory, once; then each warp takes one group and
//   loops over that group's column union (the sorted union of its 8 rows' non-zeros), with
//   8 weights per column (zero where a row does not use the column). Each lane keeps the 8
//   rows x 2V samples of its slice in registers: per column it reads 2 vectors of x from
//   shared memory (conflict-free: consecutive lanes, consecutive 16-byte words), 8 weights
//   (the same address for the whole warp: a broadcast) and issues 16V FMAs. So a group costs
//   |union| instead of 8 x 32 gathers, shared memory is read once per 8 rows, and x is read
//   from global memory about once (row blocks of the same sample tile run side by side and
//   share it through L2): the floor is reading x and writing the output, not the products.
//   A dense product would do 384 / |union| (about 10) times the arithmetic; cuSPARSE's CSR
//   product re-reads x per non-zero.
//
// Summation order: per row, the columns in ascending order (deterministic; the tuner checks
// the result against the dense product). Samples are T; accumulation in T (as a GEMM in the
// operands' precision would).

#include "common.cuh"
#include "launch.cuh"

// x [C, n] (row stride ldx), out [M, n] (row stride ldo). Block (bx, by): groups
// bx*G .. bx*G+G-1 (G = blockDim.x / 32), samples by*TS .. by*TS+TS-1 with TS = 32*V*VPL
// (VPL 16-byte vectors per lane: 2 gives each lane more work per shared-memory read, 1 half
// the shared memory per block and so more blocks per SM; the tuner times both).
//   bcols[boff[bx] .. boff[bx+1])   the block's x rows (its column union), ascending
//   gcols[goff[g] .. goff[g+1])     group g's columns as positions in its block's union
//   gw[e * SR_R + r]                weight of row r of group g at entry e (goff[g] <= e)
//   grows[g * SR_R + r]             the output row of row r of group g (-1: padding)
// vec: x, ldx, out, ldo are all 16-byte aligned (vector loads and stores; else scalar).
// Issues the copies of the block's x rows for samples t0 .. t0+TS-1 into xs (zeros past n):
// asynchronous (sm_80+), so every load of the tile is in flight at once, where a
// load-then-store loop would wait for each in turn (measured: the tile load, not the
// products, bounded the first version). The caller commits and waits.
template <typename T, int TS>
__device__ __forceinline__ void sr_issue_tile(T* xs, const T* __restrict__ x, long long ldx,
                                              int n, const int* __restrict__ cols, int nu,
                                              long long t0, bool vec)
{
    constexpr int V = Vec16<T>::n;
    const int tid = threadIdx.x, nt = blockDim.x;
    if (vec && t0 + TS <= n) {
        for (int e = tid; e < nu * (TS / V); e += nt) {
            const int u = e / (TS / V), s = (e - u * (TS / V)) * V;
            const T* src = x + (long long)cols[u] * ldx + t0 + s;
            cp_async_copy<16>(xs + u * TS + s, src, 16);
        }
    } else {   // unaligned rows or the last tile: element by element, zeros past n
        for (int e = tid; e < nu * TS; e += nt) {
            const int u = e / TS, s = e - u * TS;
            const bool in = t0 + s < n;
            const T* src = x + (long long)cols[u] * ldx + (in ? t0 + s : 0);
            // size 0 fills the element with zeros (nothing is read)
            cp_async_copy<(int)sizeof(T)>(xs + u * TS + s, src, in ? (int)sizeof(T) : 0);
        }
    }
    cp_async_commit();
}

// One warp: group g's 8 output rows for the tile in xs (samples t0 ..), written to out.
template <typename T, int VPL>
__device__ __forceinline__ void sr_group_rows(const T* xs, int g, int lane, long long t0, int n,
                                              const int* __restrict__ gcols,
                                              const int* __restrict__ goff,
                                              const T* __restrict__ gw,
                                              const int* __restrict__ grows,
                                              T* __restrict__ out, long long ldo, bool vec)
{
    typedef typename Vec16<T>::type Vt;
    constexpr int V = Vec16<T>::n;
    constexpr int TS = 32 * V * VPL;
    T acc[SR_R][VPL * V];
#pragma unroll
    for (int r = 0; r < SR_R; ++r)
#pragma unroll
        for (int v = 0; v < VPL * V; ++v) acc[r][v] = T(0);
    const int e1 = goff[g + 1];
#pragma unroll 2
    for (int e = goff[g]; e < e1; ++e) {
        const int u = __ldg(gcols + e);
        Vt xv[VPL];
#pragma unroll
        for (int q = 0; q < VPL; ++q)
            xv[q] = *reinterpret_cast<const Vt*>(xs + u * TS + q * 32 * V + lane * V);
        // the 8 weights of this column: SR_R / V vector loads, one address for the warp
        alignas(16) T wv[SR_R];
        const Vt* wr = reinterpret_cast<const Vt*>(gw + (long long)e * SR_R);
#pragma unroll
        for (int q = 0; q < SR_R / V; ++q) *reinterpret_cast<Vt*>(wv + q * V) = __ldg(wr + q);
#pragma unroll
        for (int r = 0; r < SR_R; ++r) {
            const T w = wv[r];
#pragma unroll
            for (int q = 0; q < VPL; ++q) {
                const T* xq = reinterpret_cast<const T*>(&xv[q]);
#pragma unroll
                for (int v = 0; v < V; ++v) acc[r][q * V + v] = fma(w, xq[v], acc[r][q * V + v]);
            }
        }
    }
    const bool full = t0 + TS <= n;
#pragma unroll
    for (int r = 0; r < SR_R; ++r) {
        const int row = __ldg(grows + g * SR_R + r);
        if (row < 0) continue;
        T* o = out + (long long)row * ldo + t0;
#pragma unroll
        for (int q = 0; q < VPL; ++q) {
            const int s0 = q * 32 * V + lane * V;
            if (vec && full) {
                Vt vv;
                T* pv = reinterpret_cast<T*>(&vv);
#pragma unroll
                for (int v = 0; v < V; ++v) pv[v] = acc[r][q * V + v];
                *reinterpret_cast<Vt*>(o + s0) = vv;
            } else {
#pragma unroll
                for (int v = 0; v < V; ++v)
                    if (t0 + s0 + v < n) o[s0 + v] = acc[r][q * V + v];
            }
        }
    }
}

// One tile per block: load, wait, compute.
template <typename T, int VPL>
__global__ void __launch_bounds__(256, 4 / VPL)
sparse_rows(const T* __restrict__ x, long long ldx, int n, const int* __restrict__ bcols,
            const int* __restrict__ boff, const int* __restrict__ gcols,
            const int* __restrict__ goff, const T* __restrict__ gw,
            const int* __restrict__ grows, int n_groups, T* __restrict__ out, long long ldo,
            int vec)
{
    constexpr int TS = 32 * Vec16<T>::n * VPL;
    extern __shared__ __align__(16) unsigned char sr_smem[];
    T* xs = reinterpret_cast<T*>(sr_smem);     // [union][TS]
    const int b = blockIdx.x;
    const long long t0 = (long long)blockIdx.y * TS;
    const int c0 = boff[b], nu = boff[b + 1] - c0;
    sr_issue_tile<T, TS>(xs, x, ldx, n, bcols + c0, nu, t0, vec != 0);
    cp_async_wait<0>();
    __syncthreads();
    const int g = b * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (g < n_groups)
        sr_group_rows<T, VPL>(xs, g, threadIdx.x & 31, t0, n, gcols, goff, gw, grows, out, ldo,
                              vec != 0);
}

// Persistent blocks, double-buffered: block (bx, by) takes tiles by, by + gridDim.y, ... of
// row block bx; the copies of the next tile are in flight while the current one is computed
// (two [union][TS] buffers), so loads and FMAs overlap within a block instead of only across
// blocks.
template <typename T, int VPL>
__global__ void __launch_bounds__(256, 2)
sparse_rows_pipe(const T* __restrict__ x, long long ldx, int n, const int* __restrict__ bcols,
                 const int* __restrict__ boff, const int* __restrict__ gcols,
                 const int* __restrict__ goff, const T* __restrict__ gw,
                 const int* __restrict__ grows, int n_groups, T* __restrict__ out,
                 long long ldo, int vec)
{
    constexpr int TS = 32 * Vec16<T>::n * VPL;
    extern __shared__ __align__(16) unsigned char sr_smem[];
    const int b = blockIdx.x;
    const int c0 = boff[b], nu = boff[b + 1] - c0;
    T* const buf0 = reinterpret_cast<T*>(sr_smem);        // buffers k & 1: buf0 + (k & 1) * span
    const int span = nu * TS;
    const long long tiles = ((long long)n + TS - 1) / TS;
    const int g = b * (blockDim.x >> 5) + (threadIdx.x >> 5);
    long long tile = blockIdx.y;
    if (tile >= tiles) return;                 // the whole block: no barrier is skipped
    sr_issue_tile<T, TS>(buf0, x, ldx, n, bcols + c0, nu, tile * TS, vec != 0);
    for (int k = 0; tile < tiles; ++k, tile += gridDim.y) {
        const long long next = tile + gridDim.y;
        if (next < tiles) {
            sr_issue_tile<T, TS>(buf0 + ((k + 1) & 1) * span, x, ldx, n, bcols + c0, nu,
                                 next * TS, vec != 0);
            cp_async_wait<1>();                      // this tile's copies done, the next in flight
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (g < n_groups)
            sr_group_rows<T, VPL>(buf0 + (k & 1) * span, g, threadIdx.x & 31, tile * TS, n,
                                  gcols, goff, gw, grows, out, ldo, vec != 0);
        __syncthreads();                       // this buffer is refilled two tiles on
    }
}
