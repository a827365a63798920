// Gather a strided view [B, R, C] into a contiguous row-major buffer, in one pass.
//
// Used by MatrixView.contiguous()/aligned() on the GPU: the offset and the three element
// strides are applied here, so an unaligned or BLAS-incompatible view costs exactly one
// read and one write of its elements. 64-bit indices: a view may be larger than 2^31.

template <typename T>
__global__ void gather3d(const T* __restrict__ src, long long offset, long long sb, long long sr,
                         long long sc, long long B, long long R, long long C, T* __restrict__ dst)
{
    const long long total = B * R * C;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long c = idx % C;
        const long long rest = idx / C;
        const long long r = rest % R;
        const long long b = rest / R;
        dst[idx] = src[offset + b * sb + r * sr + c * sc];
    }
}
