// int_cov_finish: the covariance of int16 channels from their exact sums, in one pass over the
// C x C output (dspk.ops.covariance): with S = X·Xᵀ and s the channel sums (int64, exact),
//   CENTER: out[i, j] = (double)(n * S[i, j] - s[i] * s[j]) / denom,  denom = n * (n - ddof)
//   else:   out[i, j] = (double)S[i, j] / denom,                      denom = n - ddof
// The int64 numerator is exact when n < 2^16 (|S| <= n*2^30, |s| <= n*2^15); the caller takes
// this kernel only then. The division (not a multiplication by 1/denom) gives NumPy's bits.

#include "launch.cuh"

template <bool CENTER>
__global__ void int_cov_finish(const long long* __restrict__ S, const long long* __restrict__ s,
                               int C, long long n, double denom, double* __restrict__ out)
{
    const long long total = (long long)C * C;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
        long long v = S[k];
        if (CENTER) {
            const int i = (int)(k / C), j = (int)(k - (long long)i * C);
            v = n * v - s[i] * s[j];
        }
        out[k] = (double)v / denom;
    }
}

// center_rows: the float path of dspk.ops.covariance centres a copy before the product (a mean
// subtracted from the product afterwards would cancel catastrophically); this does the copy in
// one pass, where CuPy's mean, cast and subtraction took three launches and two extra trips
// through memory (0.23 ms of a 0.49 ms covariance of 384 x 60 000 on the H200).
//   out[r, j] = x[r, j] - (T)(sum_j x[r, j] / n)    (the sum in double; NumPy's mean, then cast)
//   mean[r]   = sum_j x[r, j] / n                   (double; may be null)
// Grid (rows, splits): every block of a row sums the whole row in the same order (the same bits,
// the row read again from L2 by the others), then writes its own 1/splits of the row — so a few
// long rows still fill the GPU without a second launch or a grid-wide barrier.
// Block: CENTER_THREADS threads (any multiple of 32 up to 1024 works; the reduction assumes it).

template <typename T>
__global__ void __launch_bounds__(CENTER_THREADS)
center_rows(const T* __restrict__ x, long long row_stride, long long col_stride, long long n,
            T* __restrict__ out, double* __restrict__ mean)
{
    const T* xr = x + (long long)blockIdx.x * row_stride;
    const long long step = blockDim.x;
    // eight loads in flight per thread, four double accumulators (the adds' latency)
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    long long j = threadIdx.x;
    for (; j + 7 * step < n; j += 8 * step) {
        T v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = xr[(j + u * step) * col_stride];
        a0 += (double)v[0]; a1 += (double)v[1]; a2 += (double)v[2]; a3 += (double)v[3];
        a0 += (double)v[4]; a1 += (double)v[5]; a2 += (double)v[6]; a3 += (double)v[7];
    }
    for (; j < n; j += step) a0 += (double)xr[j * col_stride];
    double acc = (a0 + a1) + (a2 + a3);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    __shared__ double warp_sums[32];
    __shared__ double total;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) warp_sums[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        const int nw = (int)(blockDim.x >> 5);
        double t = lane < nw ? warp_sums[lane] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (lane == 0) total = t;
    }
    __syncthreads();
    const double m = total / (double)n;
    if (mean != nullptr && blockIdx.y == 0 && threadIdx.x == 0) mean[blockIdx.x] = m;
    const T mt = (T)m;
    // this block's segment, a multiple of 128 elements long (whole sectors per warp store)
    long long per = (n + gridDim.y - 1) / gridDim.y;
    per = (per + 127) / 128 * 128;
    const long long j0 = (long long)blockIdx.y * per;
    const long long j1 = j0 + per < n ? j0 + per : n;
    T* orow = out + (long long)blockIdx.x * n;
    for (long long k = j0 + threadIdx.x; k < j1; k += step) orow[k] = xr[k * col_stride] - mt;
}

// cov_finish: out = (T)((double)m2 / denom), elementwise over the C x C product — NumPy's
// (m2.astype(float64) / (n - ddof)).astype(T), in one launch instead of three.
template <typename T>
__global__ void cov_finish(const T* __restrict__ m2, long long total, double denom,
                           T* __restrict__ out)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride)
        out[k] = (T)((double)m2[k] / denom);
}
