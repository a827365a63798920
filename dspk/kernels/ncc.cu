// Normalized cross-correlation of a template bank, fused: one pass that loads each image patch
// once into shared memory, correlates every window with the whole bank using __dp4a (four
// int8 multiply-adds per instruction; no tensor cores), and writes the coefficients.
//
// Works in the centred int8 domain (uint8 images and templates are shifted by -128: NCC is
// invariant to the shift): for the window I and template T (K pixels),
//   num = K*S_IT - S_I*S_T,  var_I = K*S_II - S_I^2,  var_T = K*S_TT - S_T^2
// with S_IT, S_I, S_II accumulated exactly in int32 (|sum| <= K*128^2 < 2^31 for K <= 131071)
// and combined in int64; only the final ratio is float32: num * rsqrt(var_I) * rsqrt(var_T),
// 0 where a variance is 0. No float64 in device code (consumer GPUs run it at 1/64 rate).
//
// Block: NCC_TX x NCC_TY output positions (one per thread). The patch of the image under the
// block's windows and the packed bank (int32 words of 4 template pixels, [N][th][twq], zero
// past tw) sit in dynamic shared memory: bank first, patch after. Templates are taken TG at a
// time (TG accumulators per thread); bank words are read as broadcasts.

constexpr int NCC_TX = 32;
constexpr int NCC_TY = 8;

template <bool CENTER, int TG>
__global__ void __launch_bounds__(NCC_TX * NCC_TY)
ncc_bank_dp4a(const unsigned char* __restrict__ img, long long pitch, int H, int W,
              const int* __restrict__ bank, int N, int th, int tw, int twq,
              const long long* __restrict__ t_sum, const float* __restrict__ t_rs,
              float* __restrict__ out, int ho, int wo)
{
    extern __shared__ __align__(16) int ncc_smem[];
    const int bank_words = N * th * twq;
    int* sbank = ncc_smem;
    unsigned char* patch = reinterpret_cast<unsigned char*>(ncc_smem + bank_words);
    const int pw = ((NCC_TX + tw - 1 + 3 + 3) / 4) * 4;  // patch row, bytes (+ slack, aligned)
    const int ph = NCC_TY + th - 1;
    const int x0 = blockIdx.x * NCC_TX, y0 = blockIdx.y * NCC_TY;
    const int tid = threadIdx.y * NCC_TX + threadIdx.x;
    const int nthreads = NCC_TX * NCC_TY;

    for (int e = tid; e < bank_words; e += nthreads) sbank[e] = bank[e];
    for (int e = tid; e < ph * pw; e += nthreads) {
        const int r = e / pw, c = e % pw;
        const int y = y0 + r, x = x0 + c;
        int v = 0;
        if (y < H && x < W) {
            v = img[y * pitch + x];
            if (CENTER) v -= 128;
            else v = (signed char)v;
        }
        patch[e] = (unsigned char)(signed char)v;
    }
    __syncthreads();

    const int px = threadIdx.x, py = threadIdx.y;
    const int x = x0 + px, y = y0 + py;
    const bool inside = x < wo && y < ho;
    const int K = th * tw;
    // The window word at (dy, 4q) starts at byte px + 4q of the patch row: px & 3 bytes into
    // an aligned word, the same shift for every q, so one byte_perm selector per thread.
    const int shift = px & 3;
    const unsigned sel = (unsigned)(shift | ((shift + 1) << 4) | ((shift + 2) << 8) |
                                    ((shift + 3) << 12));
    const int rem = tw & 3;
    const int last_mask = rem == 0 ? -1 : (int)((1u << (8 * rem)) - 1u);

    int s_i = 0, s_ii = 0;
    for (int g = 0; g < N; g += TG) {
        int acc[TG];
#pragma unroll
        for (int t = 0; t < TG; ++t) acc[t] = 0;
        for (int dy = 0; dy < th; ++dy) {
            const int* row = reinterpret_cast<const int*>(patch + (py + dy) * pw + (px & ~3));
            for (int q = 0; q < twq; ++q) {
                const int w = (int)__byte_perm((unsigned)row[q], (unsigned)row[q + 1], sel);
                if (g == 0) {
                    const int wm = q == twq - 1 ? (w & last_mask) : w;
                    s_i = __dp4a(wm, 0x01010101, s_i);
                    s_ii = __dp4a(wm, wm, s_ii);
                }
                const int* b = sbank + (g * th + dy) * twq + q;
#pragma unroll
                for (int t = 0; t < TG; ++t)
                    if (g + t < N) acc[t] = __dp4a(w, b[t * th * twq], acc[t]);
            }
        }
        if (inside) {
            const long long var_i = (long long)K * s_ii - (long long)s_i * s_i;
            const float ri = var_i > 0 ? rsqrtf((float)var_i) : 0.0f;
#pragma unroll
            for (int t = 0; t < TG; ++t) {
                const int n = g + t;
                if (n < N) {
                    const long long num = (long long)K * acc[t] - (long long)s_i * t_sum[n];
                    float r = (float)num * ri * t_rs[n];
                    r = fminf(1.0f, fmaxf(-1.0f, r));
                    out[((long long)n * ho + y) * wo + x] = r;
                }
            }
        }
    }
}

#ifdef DSPK_COMPILE_CHECK
template __global__ void ncc_bank_dp4a<true, 16>(const unsigned char*, long long, int, int,
                                                 const int*, int, int, int, int,
                                                 const long long*, const float*, float*, int,
                                                 int);
template __global__ void ncc_bank_dp4a<false, 32>(const unsigned char*, long long, int, int,
                                                  const int*, int, int, int, int,
                                                  const long long*, const float*, float*, int,
                                                  int);
#endif
