// Exact integer products on INT8 tensor cores: the passes around the cuBLAS int8 GEMM.
//
//   pack_planes     x [B, R, K] (any strides; uint8, int8 or int16) -> int8 planes, row-major
//                   [B, P*Rp, Kp], K contiguous (the "TN" layout cuBLAS runs at full rate),
//                   zero-padded to Rp, Kp (multiples of 16). int16 (P = 2): plane 0 is the high
//                   byte h = x >> 8, plane 1 the centred low byte l = (x & 255) - 128, so that
//                   x - 128 = 256*h + l. uint8 (CENTER): x - 128. int8: x. One pass, padding
//                   included (no separate memset). With SUMS, also the exact row sums of the
//                   raw values (int64, added atomically into a zeroed [B, R]) that the centring
//                   correction needs: the operand is read once.
//   combine_planes  the int32 GEMM of stacked planes, S split-K partials [S][B][P*Mp, P*Np]
//                   -> int64 out (any strides): over the partials, the sum of the plane products
//                   with weights 65536, 256, 256, 1, plus the centring correction
//                   128*(row sum of a + column sum of b) - 128^2*K, or accumulated onto out for
//                   the later K chunks.
// Grids: pack_planes: x over K in blocks of 4*blockDim, y over the B*Rp rows (looped past
// 65535). 64-bit offsets: a packed operand may exceed 2^31 bytes.

template <typename T, bool CENTER, bool SUMS>
__global__ void pack_planes(const T* __restrict__ x, long long sb, long long sr, long long sk,
                            int B, int R, int K, int Rp, int Kp, signed char* __restrict__ dst,
                            unsigned long long* __restrict__ rowsum)
{
    constexpr int P = sizeof(T) == 2 ? 2 : 1;
    const long long plane = (long long)Rp * Kp;
    const int k0 = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    for (int row = blockIdx.y; row < B * Rp; row += gridDim.y) {   // uniform per block
        const int b = row / Rp, r = row - b * Rp;
        long long s = 0;
        unsigned hw = 0, lw = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int k = k0 + e;
            int hi = 0, lo = 0;
            if (r < R && k < K) {
                const int v = (int)x[b * sb + r * sr + k * sk];
                s += v;
                if (P == 2) {
                    hi = v >> 8;               // arithmetic shift: -128..127
                    lo = (v & 0xFF) - 128;     // -128..127
                } else {
                    lo = CENTER ? v - 128 : v;
                }
            }
            hw |= (unsigned)(hi & 0xFF) << (8 * e);
            lw |= (unsigned)(lo & 0xFF) << (8 * e);
        }
        if (k0 < Kp) {   // Kp is a multiple of 16: the 4 bytes are in the row and aligned
            signed char* d = dst + b * P * plane + (long long)r * Kp + k0;
            if (P == 2) {
                *reinterpret_cast<unsigned*>(d) = hw;
                *reinterpret_cast<unsigned*>(d + plane) = lw;
            } else {
                *reinterpret_cast<unsigned*>(d) = lw;
            }
        }
        if (SUMS) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if ((threadIdx.x & 31) == 0 && r < R && s != 0)
                atomicAdd(rowsum + (long long)b * R + r, (unsigned long long)s);
        }
    }
}

__global__ void combine_planes(const int* __restrict__ c, int S, int P, int Mp, int Np, int B,
                               int M, int N, long long* __restrict__ out, long long sob,
                               long long som, long long son,
                               const long long* __restrict__ rowsum_a,
                               const long long* __restrict__ colsum_b, long long kcorr,
                               int first)
{
    const long long total = (long long)B * M * N;
    const long long ldc = (long long)P * Np;
    const long long part = (long long)B * P * Mp * ldc;   // one split-K partial
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int j = (int)(idx % N);
        const int i = (int)((idx / N) % M);
        const long long b = idx / ((long long)M * N);
        long long v = 0;
        for (int s = 0; s < S; ++s) {
            const int* cb = c + s * part + b * (long long)P * Mp * ldc;
            if (P == 2) {
                const long long hh = cb[(long long)i * ldc + j];
                const long long hl = cb[(long long)i * ldc + Np + j];
                const long long lh = cb[(long long)(Mp + i) * ldc + j];
                const long long ll = cb[(long long)(Mp + i) * ldc + Np + j];
                v += 65536LL * hh + 256LL * (hl + lh) + ll;
            } else {
                v += cb[(long long)i * ldc + j];
            }
        }
        if (first && rowsum_a != nullptr)
            v += 128LL * (rowsum_a[b * M + i] + colsum_b[b * N + j]) - kcorr;
        long long* o = out + b * sob + (long long)i * som + (long long)j * son;
        *o = first ? v : *o + v;
    }
}

#ifdef DSPK_COMPILE_CHECK
template __global__ void pack_planes<unsigned char, true, true>(
    const unsigned char*, long long, long long, long long, int, int, int, int, int,
    signed char*, unsigned long long*);
template __global__ void pack_planes<signed char, false, false>(
    const signed char*, long long, long long, long long, int, int, int, int, int, signed char*,
    unsigned long long*);
template __global__ void pack_planes<short, false, true>(
    const short*, long long, long long, long long, int, int, int, int, int, signed char*,
    unsigned long long*);
#endif
