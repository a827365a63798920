// Exact integer products on INT8 tensor cores: the passes around the cuBLAS int8 GEMM.
//
//   pack_planes     x [B, R, K] (any strides; uint8, int8 or int16) -> int8 planes, row-major
//                   [B, P*Rp, Kp], K contiguous (the "TN" layout cuBLAS runs at full rate),
//                   zero-padded to Rp, Kp (multiples of 16). int16 (P = 2): plane 0 is the high
//                   byte h = x >> 8, plane 1 the centred low byte l = (x & 255) - 128, so that
//                   x - 128 = 256*h + l. uint8 (CENTER): x - 128. int8: x. One pass, padding
//                   included (no separate memset).
//   combine_planes  the int32 GEMM of stacked planes [P*Mp, P*Np] -> int64 out (any strides):
//                   sum of the plane products with weights 65536, 256, 256, 1, plus the centring
//                   correction 128*(row sum of a + column sum of b) - 128^2*K, or accumulated
//                   onto out for the later K chunks.
// 64-bit indices: a packed operand may exceed 2^31 bytes.

template <typename T, bool CENTER>
__global__ void pack_planes(const T* __restrict__ x, long long sb, long long sr, long long sk,
                            int B, int R, int K, int Rp, int Kp, signed char* __restrict__ dst)
{
    constexpr int P = sizeof(T) == 2 ? 2 : 1;
    const long long plane = (long long)Rp * Kp;
    const long long total = (long long)B * plane;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int k = (int)(idx % Kp);
        const int r = (int)((idx / Kp) % Rp);
        const long long b = idx / plane;
        int hi = 0, lo = 0;
        if (r < R && k < K) {
            const int v = (int)x[b * sb + r * sr + k * sk];
            if (P == 2) {
                hi = v >> 8;               // arithmetic shift: -128..127
                lo = (v & 0xFF) - 128;     // -128..127
            } else {
                lo = CENTER ? v - 128 : v;
            }
        }
        signed char* d = dst + b * P * plane + (long long)r * Kp + k;
        if (P == 2) {
            d[0] = (signed char)hi;
            d[plane] = (signed char)lo;
        } else {
            d[0] = (signed char)lo;
        }
    }
}

__global__ void combine_planes(const int* __restrict__ c, int P, int Mp, int Np, int B, int M,
                               int N, long long* __restrict__ out, long long sob, long long som,
                               long long son, const long long* __restrict__ rowsum_a,
                               const long long* __restrict__ colsum_b, long long kcorr,
                               int first)
{
    const long long total = (long long)B * M * N;
    const long long ldc = (long long)P * Np;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int j = (int)(idx % N);
        const int i = (int)((idx / N) % M);
        const long long b = idx / ((long long)M * N);
        const int* cb = c + b * (long long)P * Mp * ldc;
        long long v;
        if (P == 2) {
            const long long hh = cb[(long long)i * ldc + j];
            const long long hl = cb[(long long)i * ldc + Np + j];
            const long long lh = cb[(long long)(Mp + i) * ldc + j];
            const long long ll = cb[(long long)(Mp + i) * ldc + Np + j];
            v = 65536LL * hh + 256LL * (hl + lh) + ll;
        } else {
            v = cb[(long long)i * ldc + j];
        }
        if (first && rowsum_a != nullptr)
            v += 128LL * (rowsum_a[b * M + i] + colsum_b[b * N + j]) - kcorr;
        long long* o = out + b * sob + (long long)i * som + (long long)j * son;
        *o = first ? v : *o + v;
    }
}

#ifdef DSPK_COMPILE_CHECK
template __global__ void pack_planes<unsigned char, true>(const unsigned char*, long long,
                                                          long long, long long, int, int, int,
                                                          int, int, signed char*);
template __global__ void pack_planes<signed char, false>(const signed char*, long long, long long,
                                                         long long, int, int, int, int, int,
                                                         signed char*);
template __global__ void pack_planes<short, false>(const short*, long long, long long, long long,
                                                   int, int, int, int, int, signed char*);
#endif
