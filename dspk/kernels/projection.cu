// center_project: the features of dspk.ops.PCA.transform in one pass over the clips,
//   out[i, j] = sum_k (x[i, k] - mean[k]) * w[j, k]       x [n, K], w [M, K], out [n, M]
// where CuPy's (x - mean) @ w.T wrote the centred clips to memory and read them back through a
// library product tuned for square shapes (100 000 x 61 -> 6 float32: 0.059 ms back to back on
// the H100, torch 0.053; the clips alone are 24 MB, ~9 µs of the H100's bandwidth).
//
// Each block stages row tiles of x in shared memory (coalesced, any strides; four loads in
// flight per thread), the centring done while staging with the expression's own rounding
// (x - mean in T); then each thread owns one row and every (256 / rows)-th component, MPT of
// them at most (a template, so no dead component is issued), each a sequential fma chain over
// k in T (no promotion, no TF32); the tile's outputs leave through shared memory as one
// contiguous, coalesced store. w and the mean are staged once per block. Tiles of 64 rows keep
// a block's shared memory small enough for eight blocks per SM, so one block's loads overlap
// another's products (tiles of 128 rows gave a single wave whose phases ran one after the
// other: 0.050 ms for 100 000 x 61 -> 6 float32 on the H100).
// Shared memory (dynamic): w [M*K], mean [K], the tile [rows * pitch] with an odd pitch >= K
// (conflict-free column reads); the Python side (ops/_pca_gpu.py) picks rows and checks the
// total. Indices in 64 bits where they span the clips.
#include "launch.cuh"

#define PR_UNROLL 4
// blocks per SM to fit in registers for up to 16 bytes of accumulators per thread: eight
// where an SM holds 2048 threads, six on the consumer Ampere/Ada parts (1536)
#if defined(__CUDA_ARCH__) && \
    (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 870 || __CUDA_ARCH__ == 890)
#define PR_BLOCKS_SMALL 6
#else
#define PR_BLOCKS_SMALL 8
#endif
#define PR_MIN_BLOCKS(T, MPT) \
    ((MPT) * sizeof(T) <= 16 ? PR_BLOCKS_SMALL : ((MPT) * sizeof(T) <= 32 ? 4 : 2))

template <typename T, int MPT>
__global__ void __launch_bounds__(PR_THREADS, PR_MIN_BLOCKS(T, MPT))
center_project(const T* __restrict__ x, long long row_stride, long long col_stride, long long n,
               int K, const T* __restrict__ mean, const T* __restrict__ w, int M, int rows,
               int pitch, T* __restrict__ out)
{
    extern __shared__ unsigned char pr_smem[];
    T* ws = reinterpret_cast<T*>(pr_smem);
    T* ms = ws + M * K;
    T* xs = ms + K;
    for (int e = threadIdx.x; e < M * K; e += PR_THREADS) ws[e] = w[e];
    for (int e = threadIdx.x; e < K; e += PR_THREADS) ms[e] = mean[e];
    __syncthreads();

    const int groups = PR_THREADS / rows;          // components interleaved over thread groups
    const int r = threadIdx.x % rows;
    const int g = threadIdx.x / rows;
    const bool contiguous = col_stride == 1 && row_stride == K;
    for (long long row0 = (long long)blockIdx.x * rows; row0 < n;
         row0 += (long long)gridDim.x * rows) {
        const int nr = (int)min((long long)rows, n - row0);
        const int total = nr * K;
        for (int e0 = threadIdx.x; e0 < total; e0 += PR_UNROLL * PR_THREADS) {
            T v[PR_UNROLL];
#pragma unroll
            for (int u = 0; u < PR_UNROLL; ++u) {
                const int e = e0 + u * PR_THREADS;
                if (e < total) {
                    const int rr = e / K, k = e - rr * K;
                    v[u] = contiguous ? x[row0 * K + e]
                                      : x[(row0 + rr) * row_stride + (long long)k * col_stride];
                }
            }
#pragma unroll
            for (int u = 0; u < PR_UNROLL; ++u) {
                const int e = e0 + u * PR_THREADS;
                if (e < total) {
                    const int rr = e / K, k = e - rr * K;
                    xs[rr * pitch + k] = v[u] - ms[k];
                }
            }
        }
        __syncthreads();

        T acc[MPT];
#pragma unroll
        for (int q = 0; q < MPT; ++q) acc[q] = T(0);
        if (r < nr) {
            const T* xr = xs + r * pitch;
            for (int k = 0; k < K; ++k) {
                const T v = xr[k];
#pragma unroll
                for (int q = 0; q < MPT; ++q) {
                    const int j = g + q * groups;
                    if (j < M) acc[q] = fma(v, ws[j * K + k], acc[q]);
                }
            }
        }
        __syncthreads();                            // the tile is read: reuse it for outputs
        if (r < nr) {
#pragma unroll
            for (int q = 0; q < MPT; ++q) {
                const int j = g + q * groups;
                if (j < M) xs[r * M + j] = acc[q];
            }
        }
        __syncthreads();
        T* dst = out + row0 * M;
        for (int e = threadIdx.x; e < nr * M; e += PR_THREADS) dst[e] = xs[e];
        __syncthreads();                            // before the next tile overwrites xs
    }
}
