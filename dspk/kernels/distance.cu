// sqdist_finish: the epilogue of dspk.ops.pairwise_sqdist, in place over the product
// D = A·Bᵀ [n, m] (row-major, contiguous):
//   D[i, j] = max((na[i] + nb[j]) - 2 * D[i, j], 0)        (NaN stays NaN, as numpy.maximum)
// with na, nb the rows' squared norms. One read and one write of D where the CuPy expression
// made four [n, m] temporaries (for 20 000 x 20 000 float32: 13 GB moved, 8.4 ms on the H200,
// against ~3.2 GB here). 2 * D is exact, so a contracted fma(-2, D, s) rounds as s - 2D does:
// the bits of NumPy's expression na[:, None] + nb[None, :] - 2 * ab.
// Grid: x over column blocks of SQD_THREADS * SQD_UNROLL, y over rows (grid-stride).
#include "common.cuh"
#include "launch.cuh"

template <typename T>
__global__ void __launch_bounds__(SQD_THREADS)
sqdist_finish(T* __restrict__ d, const T* __restrict__ na, const T* __restrict__ nb,
              long long n, long long m)
{
    const long long j0 = (long long)blockIdx.x * (SQD_THREADS * SQD_UNROLL) + threadIdx.x;
    for (long long i = blockIdx.y; i < n; i += gridDim.y) {
        const T a = na[i];
        T* row = d + i * m;
        T v[SQD_UNROLL];
#pragma unroll
        for (int u = 0; u < SQD_UNROLL; ++u) {
            const long long j = j0 + u * SQD_THREADS;
            v[u] = j < m ? (a + nb[j]) - T(2) * row[j] : T(0);
        }
#pragma unroll
        for (int u = 0; u < SQD_UNROLL; ++u) {
            const long long j = j0 + u * SQD_THREADS;
            if (j < m) row[j] = v[u] < T(0) ? T(0) : v[u];
        }
    }
}

// sqdist_direct: the whole of pairwise_sqdist for few dimensions (the caller's bound), one launch
// that writes D once: the product A·Bᵀ, the norms and the clamp, where the engine's product
// wrote D and the finish read and wrote it again (20 000² x 16 float32 on the H100: 1.77 ms back
// to back, 4.8 GB moved; D alone is 1.6 GB). Where d is small there is little for a tiled
// library to reuse, and the time is the store of D.
//   D[i, j] = max((na[i] + nb[j]) - 2 * dot(a_i, b_j), 0)
// with na, nb and dot each a sequential fma chain over the d dimensions in T (no promotion, no
// TF32): the same chain for a norm and for a point's product with itself, so the distance of a
// point to an identical point is exactly 0 (the engine's product and CuPy's sums round
// differently, so there it is only near 0).
// Block: 256 threads own a 128 x 128 tile of D, 8 x 8 each: rows 4ty + u and 64 + 4ty + u,
// columns 4tx + v and 64 + 4tx + v, so per dimension a thread makes four 16-byte shared loads
// for 64 fmas, and a warp stores 256-byte row segments. The dimensions are staged SQDD_KC at a
// time, transposed (row index fastest: conflict-free shared stores; the tile's rows are one
// contiguous run in global memory, so the strided reads hit L1). a, b [*, d] row-major.
constexpr int SQDD_KC = 16;

template <typename T>
__global__ void __launch_bounds__(256)
sqdist_direct(const T* __restrict__ a, const T* __restrict__ b, long long n, long long m, int d,
              T* __restrict__ out)
{
    __shared__ __align__(16) T as[SQDD_KC][SQDD_TILE];
    __shared__ __align__(16) T bs[SQDD_KC][SQDD_TILE];
    __shared__ T na[SQDD_TILE], nb[SQDD_TILE];
    const long long i0 = (long long)blockIdx.y * SQDD_TILE;
    const long long j0 = (long long)blockIdx.x * SQDD_TILE;
    const int ra = (int)min((long long)SQDD_TILE, n - i0);
    const int rb = (int)min((long long)SQDD_TILE, m - j0);
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const T* arows = a + i0 * d;
    const T* brows = b + j0 * d;
    T acc[8][8];
#pragma unroll
    for (int u = 0; u < 8; ++u)
#pragma unroll
        for (int v = 0; v < 8; ++v) acc[u][v] = T(0);
    T norm = T(0);          // thread t < 128: row t of a's tile; t >= 128: row t - 128 of b's
    for (int k0 = 0; k0 < d; k0 += SQDD_KC) {
        const int kc = min(SQDD_KC, d - k0);
        if (k0 > 0) __syncthreads();                 // the previous chunk is read
        for (int e = threadIdx.x; e < SQDD_TILE * kc; e += 256) {
            const int r = e & (SQDD_TILE - 1), k = e >> 7;
            as[k][r] = r < ra ? arows[(long long)r * d + k0 + k] : T(0);
            bs[k][r] = r < rb ? brows[(long long)r * d + k0 + k] : T(0);
        }
        __syncthreads();
        {
            const int r = threadIdx.x & (SQDD_TILE - 1);
            const T (*src)[SQDD_TILE] = threadIdx.x < SQDD_TILE ? as : bs;
            for (int k = 0; k < kc; ++k) norm = fma(src[k][r], src[k][r], norm);
        }
        for (int k = 0; k < kc; ++k) {
            T av[8], bv[8];
            Quad<T>::load(&as[k][4 * ty], av);
            Quad<T>::load(&as[k][64 + 4 * ty], av + 4);
            Quad<T>::load(&bs[k][4 * tx], bv);
            Quad<T>::load(&bs[k][64 + 4 * tx], bv + 4);
#pragma unroll
            for (int u = 0; u < 8; ++u)
#pragma unroll
                for (int v = 0; v < 8; ++v) acc[u][v] = fma(av[u], bv[v], acc[u][v]);
        }
    }
    (threadIdx.x < SQDD_TILE ? na : nb)[threadIdx.x & (SQDD_TILE - 1)] = norm;
    __syncthreads();

    const bool aligned = (m & 3) == 0;                  // 16-byte aligned vectors of a row
#pragma unroll
    for (int u = 0; u < 8; ++u) {
        const int il = (u < 4 ? 0 : 64) + 4 * ty + (u & 3);
        if (il >= ra) continue;
        const T x = na[il];
        T* row = out + (i0 + il) * m + j0;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int jl = 64 * h + 4 * tx;
            T v4[4];
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                const T s = (x + nb[jl + v]) - T(2) * acc[u][4 * h + v];
                v4[v] = s < T(0) ? T(0) : s;            // NaN stays NaN, as numpy.maximum
            }
            if (aligned && jl + 3 < rb) {
                Quad<T>::store(row + jl, v4);
            } else {
#pragma unroll
                for (int v = 0; v < 4; ++v)
                    if (jl + v < rb) row[jl + v] = v4[v];
            }
        }
    }
}
