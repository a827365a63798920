// int_cov_finish: the covariance of int16 channels from their exact sums, in one pass over the
// C x C output (dspk.ops.covariance): with S = X·Xᵀ and s the channel sums (int64, exact),
//   CENTER: out[i, j] = (double)(n * S[i, j] - s[i] * s[j]) / denom,  denom = n * (n - ddof)
//   else:   out[i, j] = (double)S[i, j] / denom,                      denom = n - ddof
// The int64 numerator is exact when n < 2^16 (|S| <= n*2^30, |s| <= n*2^15); the caller takes
// this kernel only then. The division (not a multiplication by 1/denom) gives NumPy's bits.

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

#ifdef DSPK_COMPILE_CHECK
template __global__ void int_cov_finish<true>(const long long*, const long long*, int, long long,
                                              double, double*);
template __global__ void int_cov_finish<false>(const long long*, const long long*, int,
                                               long long, double, double*);
#endif
