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
//   pack_planes_rows the same for K contiguous, 16-byte aligned rows, 16 bytes per load.
//   combine_planes  the int32 GEMM of stacked planes, S split-K partials [S][B][P*Mp, P*Np]
//                   -> int64 out (any strides): over the partials, the sum of the plane products
//                   with weights 65536, 256, 256, 1, plus the centring correction
//                   128*(row sum of a + column sum of b) - 128^2*K, or accumulated onto out for
//                   the later K chunks.
// Grids: pack_planes: x over K in blocks of 4*blockDim, y over the B*Rp rows (looped past
// 65535). 64-bit offsets: a packed operand may exceed 2^31 bytes.

// One raw value as its plane bytes: int16 (P = 2) hi = v >> 8 (arithmetic: -128..127) and
// lo = (v & 255) - 128, so that v - 128 = 256*hi + lo; uint8 (CENTER) lo = v - 128; int8 lo = v.
template <int P, bool CENTER>
__device__ __forceinline__ void split_value(int v, int& hi, int& lo)
{
    if (P == 2) {
        hi = v >> 8;
        lo = (v & 0xFF) - 128;
    } else {
        hi = 0;
        lo = CENTER ? v - 128 : v;
    }
}

// The warp's partial row sums added to the row's exact int64 sum (one atomic per warp).
__device__ __forceinline__ void add_row_sum(long long s, bool row_inside,
                                            unsigned long long* __restrict__ at)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0 && row_inside && s != 0) atomicAdd(at, (unsigned long long)s);
}

// The block's row sum (int32 per thread: at most 64 int16 or 128 uint8 values, so a warp's
// sum is below 2^27) added to the row's exact int64 sum: one atomic per block rather than one
// per warp, and 32-bit shuffles rather than 64-bit ones. The row is uniform per block.
__device__ __forceinline__ void add_block_row_sum(int s, bool row_inside,
                                                  unsigned long long* __restrict__ at)
{
    __shared__ long long warp_sums[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long t = 0;
        for (int w = 0; w < (int)(blockDim.x + 31) / 32; ++w) t += warp_sums[w];
        if (row_inside && t != 0) atomicAdd(at, (unsigned long long)t);
    }
    __syncthreads();   // warp_sums is written again for the block's next row
}

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
                split_value<P, CENTER>(v, hi, lo);
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
        if (SUMS) add_row_sum(s, r < R, rowsum + (long long)b * R + r);
    }
}

// pack_planes for rows with K contiguous and 16-byte aligned (the usual [channels, samples]
// recording): each thread reads U x 16 bytes (8 int16 or 16 8-bit values per load) instead of
// one element per load with 64-bit index arithmetic -- the same output. The U loads are issued
// before any is used, so that a thread keeps U loads in flight (the pass is bound by how many
// bytes are in flight, not by its arithmetic); a block covers U * blockDim * 16 bytes of a row,
// its U slices each coalesced.
template <typename T, bool CENTER, bool SUMS, int U>
__global__ void pack_planes_rows(const T* __restrict__ x, long long sb, long long sr, int B,
                                 int R, int K, int Rp, int Kp, signed char* __restrict__ dst,
                                 unsigned long long* __restrict__ rowsum)
{
    constexpr int P = sizeof(T) == 2 ? 2 : 1;
    constexpr int E = 16 / (int)sizeof(T);
    constexpr int PER = 4 / (int)sizeof(T);      // elements per 32-bit word
    static_assert(U >= 1 && U <= 8, "the int32 row sums hold up to 8 loads per thread");
    const long long plane = (long long)Rp * Kp;
    const int kb = blockIdx.x * blockDim.x * U * E + threadIdx.x * E;
    for (int row = blockIdx.y; row < B * Rp; row += gridDim.y) {   // uniform per block
        const int b = row / Rp, r = row - b * Rp;
        const T* src = x + b * sb + r * sr;
        unsigned wd[U][4];                            // the U x 16 bytes, as words (registers)
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k0 = kb + u * blockDim.x * E;
            wd[u][0] = wd[u][1] = wd[u][2] = wd[u][3] = 0u;
            if (r < R && k0 + E <= K) {
                const int4 w = *reinterpret_cast<const int4*>(src + k0);
                wd[u][0] = (unsigned)w.x; wd[u][1] = (unsigned)w.y;
                wd[u][2] = (unsigned)w.z; wd[u][3] = (unsigned)w.w;
            } else if (r < R && k0 < K) {
#pragma unroll
                for (int e = 0; e < E; ++e)
                    if (k0 + e < K)
                        wd[u][e / PER] |= ((unsigned)src[k0 + e]
                                           & (sizeof(T) == 2 ? 0xFFFFu : 0xFFu))
                                          << (8 * sizeof(T) * (e % PER));
            }
        }
        int s = 0;   // |s| <= U * E * 32768 <= 2^21 (U <= 8)
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k0 = kb + u * blockDim.x * E;
            const int n = (r < R && k0 < K) ? min(E, K - k0) : 0;   // valid elements
            unsigned hw[E / 4], lw[E / 4];
#pragma unroll
            for (int q = 0; q < E / 4; ++q) hw[q] = lw[q] = 0u;
#pragma unroll
            for (int e = 0; e < E; ++e) {
                int hi = 0, lo = 0;
                if (e < n) {
                    const unsigned raw = wd[u][e / PER] >> (8 * sizeof(T) * (e % PER));
                    const int val = sizeof(T) == 2 ? (int)(short)(raw & 0xFFFFu)
                                    : (CENTER ? (int)(raw & 0xFFu)
                                              : (int)(signed char)(raw & 0xFFu));
                    s += val;
                    split_value<P, CENTER>(val, hi, lo);
                }
                hw[e >> 2] |= (unsigned)(hi & 0xFF) << (8 * (e & 3));
                lw[e >> 2] |= (unsigned)(lo & 0xFF) << (8 * (e & 3));
            }
            if (k0 < Kp) {   // Kp is a multiple of 16 and k0 of E: the bytes are in the row
                signed char* d = dst + b * P * plane + (long long)r * Kp + k0;
                if (P == 2) {
                    *reinterpret_cast<uint2*>(d) = make_uint2(hw[0], hw[1]);
                    *reinterpret_cast<uint2*>(d + plane) = make_uint2(lw[0], lw[1]);
                } else {
                    *reinterpret_cast<uint4*>(d) = make_uint4(lw[0], lw[1], lw[2], lw[3]);
                }
            }
        }
        if (SUMS) add_block_row_sum(s, r < R, rowsum + (long long)b * R + r);
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
