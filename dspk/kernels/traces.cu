// Kernels of dspk.ops on [channels, samples] traces (row-major, samples contiguous).
//
// fir_direct<T>: out[c, i, t] = sum_j bank[i, j] * x[c, t + j - center] (zero outside
//   [0, n)), every filter i of a bank, direct summation in T. A block takes one channel and
//   FIR_TILE consecutive outputs; the input segment under them (FIR_TILE + taps) and the taps
//   sit in shared memory. Each thread keeps FIR_R consecutive outputs and a sliding window of
//   2*FIR_R inputs in registers: per FIR_R taps it loads FIR_R new inputs and FIR_R taps
//   (broadcast) and issues FIR_R^2 FMAs, so the FMA pipe, not shared memory, bounds it. This
//   is the [k, taps]·im2col(x) product with im2col implicit: materialized, the windows would be
//   taps times the data (5.6 GB for 61 taps of 384 x 60000). Taps zero-padded to a multiple of
//   FIR_R (tpad).
//
// fir_rows<T>: the same tile, each channel through its own filter of a bank (below).
//
// car_median<T>: out[c, t] = x[c, t] - median_c x[:, t], the median across channels per sample
//   (numpy's convention: the mean of the two middle values for an even count). A selection,
//   not a product: a block loads a [C, CAR_S] tile coalesced into shared memory (row stride
//   CAR_S + 1: the column reads below hit distinct banks), each warp takes samples one at a
//   time with the C values spread over its lanes, finds the k-th smallest by a radix select
//   on order-preserving unsigned keys (one bit per pass, counts by warp reduction), and the
//   block writes the referenced tile back. Exact: the result is an input value (or the mean
//   of two), never an approximation.

#include "common.cuh"
#include "launch.cuh"

constexpr int FIR_TILE = FIR_R * FIR_THREADS;

// Shared-memory index of input e: one word of padding per 32, so that the 32 lanes of a warp
// (FIR_R = 16 inputs apart) read 32 different banks.
__device__ __forceinline__ int fir_pad(int e) { return e + (e >> 5); }

// The input segment under a tile (FIR_TILE outputs from t0: inputs t0 - center ..), zero
// outside [0, n), into shared memory.
template <typename T>
__device__ __forceinline__ void fir_load_tile(const T* __restrict__ xr, int n, int t0,
                                              int center, int span, T* xs)
{
    for (int e = threadIdx.x; e < span; e += FIR_THREADS) {
        const int t = t0 - center + e;
        xs[fir_pad(e)] = (t >= 0 && t < n) ? xr[t] : T(0);
    }
}

// This thread's FIR_R consecutive outputs of one filter h (tpad taps, shared memory) over
// the tile xs, written to o (the first output of the thread; `left` outputs remain in the row).
template <typename T>
__device__ __forceinline__ void fir_outputs(const T* h, const T* xs, int base, int tpad,
                                            T* __restrict__ o, int left)
{
    typedef typename Vec16<T>::type V;
    constexpr int VN = Vec16<T>::n;
    T acc[FIR_R];
    T w[2 * FIR_R];
#pragma unroll
    for (int r = 0; r < FIR_R; ++r) {
        acc[r] = T(0);
        w[r] = xs[fir_pad(base + r)];
    }
    for (int j0 = 0; j0 < tpad; j0 += FIR_R) {
#pragma unroll
        for (int r = 0; r < FIR_R; ++r) w[FIR_R + r] = xs[fir_pad(base + j0 + FIR_R + r)];
#pragma unroll
        for (int jj = 0; jj < FIR_R; ++jj) {
            const T hv = h[j0 + jj];
#pragma unroll
            for (int r = 0; r < FIR_R; ++r) acc[r] = fma(hv, w[r + jj], acc[r]);
        }
#pragma unroll
        for (int r = 0; r < FIR_R; ++r) w[r] = w[FIR_R + r];
    }
    if (left >= FIR_R && ((unsigned long long)o & 15) == 0) {
#pragma unroll
        for (int r = 0; r < FIR_R; r += VN) {
            V v;
            T* vp = reinterpret_cast<T*>(&v);
#pragma unroll
            for (int q = 0; q < VN; ++q) vp[q] = acc[r + q];
            *reinterpret_cast<V*>(o + r) = v;
        }
    } else {
#pragma unroll
        for (int r = 0; r < FIR_R; ++r)
            if (r < left) o[r] = acc[r];
    }
}

template <typename T>
__global__ void __launch_bounds__(FIR_THREADS)
fir_direct(const T* __restrict__ x, long long ldx, int n, const T* __restrict__ bank, int nf,
           int taps, int tpad, int center, T* __restrict__ out, long long ldo_c,
           long long ldo_f)
{
    extern __shared__ __align__(16) unsigned char fir_smem[];
    const int span = FIR_TILE + tpad + FIR_R;
    T* hs = reinterpret_cast<T*>(fir_smem);                    // nf * tpad taps
    T* xs = hs + nf * tpad;                                    // fir_pad(span) inputs
    const int c = blockIdx.y;
    const int t0 = blockIdx.x * FIR_TILE;
    fir_load_tile(x + (long long)c * ldx, n, t0, center, span, xs);
    for (int e = threadIdx.x; e < nf * tpad; e += FIR_THREADS) {
        const int i = e / tpad, j = e - i * tpad;
        hs[e] = j < taps ? bank[(long long)i * taps + j] : T(0);
    }
    __syncthreads();
    const int base = threadIdx.x * FIR_R;        // this thread's outputs: t0 + base + r
    for (int i = 0; i < nf; ++i)
        fir_outputs(hs + i * tpad, xs, base, tpad,
                    out + (long long)c * ldo_c + (long long)i * ldo_f + t0 + base,
                    n - t0 - base);
}

// fir_rows<T>: out[c, t] = sum_j bank[sel[c], j] * x[c, t + j - center] (zero outside [0, n)),
//   each channel through its own filter of the bank (a per-channel delay: dspk.ops.phase_shift,
//   one filter per ADC shift): fir_direct's tile with one filter, one launch for every channel.
template <typename T>
__global__ void __launch_bounds__(FIR_THREADS)
fir_rows(const T* __restrict__ x, long long ldx, int n, const T* __restrict__ bank,
         const int* __restrict__ sel, int taps, int tpad, int center, T* __restrict__ out,
         long long ldo)
{
    extern __shared__ __align__(16) unsigned char fir_smem[];
    const int span = FIR_TILE + tpad + FIR_R;
    T* hs = reinterpret_cast<T*>(fir_smem);                    // tpad taps
    T* xs = hs + tpad;                                         // fir_pad(span) inputs
    const int c = blockIdx.y;
    const int t0 = blockIdx.x * FIR_TILE;
    fir_load_tile(x + (long long)c * ldx, n, t0, center, span, xs);
    const T* h = bank + (long long)sel[c] * taps;
    for (int j = threadIdx.x; j < tpad; j += FIR_THREADS) hs[j] = j < taps ? h[j] : T(0);
    __syncthreads();
    const int base = threadIdx.x * FIR_R;
    fir_outputs(hs, xs, base, tpad, out + (long long)c * ldo + t0 + base, n - t0 - base);
}


__device__ __forceinline__ unsigned order_key(float v)
{
    const unsigned u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(unsigned k, float)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
__device__ __forceinline__ unsigned long long order_key(double v)
{
    const unsigned long long u = (unsigned long long)__double_as_longlong(v);
    return (u & 0x8000000000000000ull) ? ~u : (u | 0x8000000000000000ull);
}
__device__ __forceinline__ double key_value(unsigned long long k, double)
{
    return __longlong_as_double((long long)((k & 0x8000000000000000ull)
                                                ? (k & 0x7fffffffffffffffull) : ~k));
}

template <typename T, typename K>
__device__ __forceinline__ K warp_min(K v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const K w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w < v ? w : v;
    }
    return v;
}

// The k-th smallest (0-based) of the keys spread over the warp (VPL per lane, padding keys
// are the largest value and never selected while k < count).
template <typename K, int VPL>
__device__ __forceinline__ K warp_select(const K (&keys)[VPL], int k)
{
    constexpr int BITS = 8 * sizeof(K);
    K prefix = 0;
#pragma unroll 1
    for (int bit = BITS - 1; bit >= 0; --bit) {
        const K cand = prefix | ((K)1 << bit);
        int below = 0;
#pragma unroll
        for (int v = 0; v < VPL; ++v) below += keys[v] < cand ? 1 : 0;
        below = __reduce_add_sync(0xffffffffu, below);
        if (below <= k) prefix = cand;   // the k-th smallest is >= cand
    }
    return prefix;
}

template <typename T, typename K, int VPL>
__global__ void __launch_bounds__(CAR_WARPS * 32)
car_median(const T* __restrict__ x, long long ldx, int C, int n, T* __restrict__ out,
           long long ldo)
{
    extern __shared__ __align__(16) unsigned char car_smem[];
    T* tile = reinterpret_cast<T*>(car_smem);     // [C][CAR_S + 1]
    const int t0 = blockIdx.x * CAR_S;
    const int tid = threadIdx.x;
    for (int e = tid; e < C * CAR_S; e += CAR_WARPS * 32) {
        const int c = e / CAR_S, s = e - c * CAR_S;
        const int t = t0 + s;
        tile[c * (CAR_S + 1) + s] = t < n ? x[(long long)c * ldx + t] : T(0);
    }
    __syncthreads();
    __shared__ T med[CAR_S];
    const int warp = tid >> 5, lane = tid & 31;
    const int k = (C - 1) / 2;                    // lower middle
    for (int s = warp; s < CAR_S; s += CAR_WARPS) {
        K keys[VPL];
#pragma unroll
        for (int v = 0; v < VPL; ++v) {
            const int c = lane + 32 * v;
            keys[v] = c < C ? order_key(tile[c * (CAR_S + 1) + s]) : ~(K)0;
        }
        const K lo = warp_select<K, VPL>(keys, k);
        T m = key_value(lo, T(0));
        if ((C & 1) == 0) {   // the upper middle: lo again if it repeats, else the next key
            int le = 0;
            K above = ~(K)0;
#pragma unroll
            for (int v = 0; v < VPL; ++v) {
                const int c = lane + 32 * v;
                if (c < C) {
                    le += keys[v] <= lo ? 1 : 0;
                    if (keys[v] > lo && keys[v] < above) above = keys[v];
                }
            }
            le = __reduce_add_sync(0xffffffffu, le);
            above = warp_min<T, K>(above);
            const K hi = le >= k + 2 ? lo : above;
            m = (m + key_value(hi, T(0))) * T(0.5);
        }
        if (lane == 0) med[s] = m;
    }
    __syncthreads();
    for (int e = tid; e < C * CAR_S; e += CAR_WARPS * 32) {
        const int c = e / CAR_S, s = e - c * CAR_S;
        const int t = t0 + s;
        if (t < n) out[(long long)c * ldo + t] = tile[c * (CAR_S + 1) + s] - med[s];
    }
}
