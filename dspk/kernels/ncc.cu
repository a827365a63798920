// Normalized cross-correlation of a template bank, fused: one pass that loads each image patch
// once into shared memory, correlates every window with the whole bank using __dp4a (four
// int8 multiply-adds per instruction; no tensor cores), and writes the coefficients.
//
// Works in the centred int8 domain (uint8 images and templates are shifted by -128: NCC is
// invariant to the shift): for the window I and template T (K pixels),
//   num = K*S_IT - S_I*S_T,  var_I = K*S_II - S_I^2,  var_T = K*S_TT - S_T^2
// with S_IT, S_I, S_II accumulated exactly in int32 (|sum| <= K*128^2 < 2^31 for K <= 131071)
// and combined in int64; only the final ratio is float32: num * (1/sqrt(var_I)) * (1/sqrt(var_T)),
// 0 where a variance is 0, with IEEE sqrt and division (not rsqrtf's 2-ulp approximation) in
// the host formula's order, so every implementation gives the same float32 bits. No float64 in device code (consumer GPUs run it at 1/64 rate).
//
// Block: NCC_TX x NCC_TY output positions (one per thread). The patch of the image under the
// block's windows and the packed bank (int32 words of 4 template pixels, [N][th][twq], zero
// past tw) sit in dynamic shared memory: bank first, patch after. Templates are taken TG at a
// time (TG accumulators per thread); bank words are read as broadcasts.

constexpr int NCC_TX = 32;
constexpr int NCC_TY = 8;

// The image under a block's windows, rows y0.., columns x0.., as centred int8 (uint8 - 128 when
// CENTER), zero outside the image: ph rows of pw bytes.
template <bool CENTER>
__device__ __forceinline__ void load_patch(const unsigned char* __restrict__ img, long long pitch,
                                           int H, int W, int y0, int x0, int ph, int pw,
                                           unsigned char* patch, int tid, int nthreads)
{
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
}

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
    const int pw = NCC_TX + 4 * twq + 8;  // patch row in bytes: the windows, word reads past
                                          // the last one, 4-byte aligned (a multiple of 4)
    const int ph = NCC_TY + th - 1;
    const int x0 = blockIdx.x * NCC_TX, y0 = blockIdx.y * NCC_TY;
    const int tid = threadIdx.y * NCC_TX + threadIdx.x;
    const int nthreads = NCC_TX * NCC_TY;

    for (int e = tid; e < bank_words; e += nthreads) sbank[e] = bank[e];
    load_patch<CENTER>(img, pitch, H, W, y0, x0, ph, pw, patch, tid, nthreads);
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
            const float ri = var_i > 0 ? 1.0f / sqrtf((float)var_i) : 0.0f;
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


// ------------------------------------------------------------------------------------------
// ncc_bank_mma: the same computation on INT8 tensor cores (mma.sync m16n8k32 s8, inline PTX:
// no CUDA headers needed under NVRTC), with an implicit im2col: the A fragments are built from
// the patch in shared memory, so the K-times-larger window matrix is never written.
//
// Same block geometry as ncc_bank_dp4a: NCC_TX x NCC_TY positions, 8 warps; warp w owns output
// row y0 + w and its 32 positions as two m-tiles of 16. A template group of 32 (4 n-tiles of 8)
// is taken at a time; K runs over the bank's words (4 pixels each, [N][Wtot], zero padded to a
// multiple of 8 words = one mma K step of 32). Fragment layouts (PTX ISA, m16n8k32, .s8):
//   A (row): reg r of lane (g = lane >> 2, t = lane & 3): row g + 8*(r & 1), bytes
//            4t..4t+3 + 16*(r >> 1) of the K step;
//   B (col): reg r: column (template) g, bytes 4t..4t+3 + 16*r;
//   C:       reg r: row g + 8*(r >> 1), column 2t + (r & 1).
// Window sums S_I, S_II are accumulated with __dp4a on the same A words (masked past tw) and
// summed over the 4 lanes of a group by shuffles. Epilogue as in ncc_bank_dp4a.
// Shared memory: bank Npad*Wtot words, then the patch (as ncc_bank_dp4a).
// ------------------------------------------------------------------------------------------
__device__ __forceinline__ void mma_s8_16832(int (&c)[4], const int (&a)[4], const int (&b)[2])
{
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <bool CENTER>
__global__ void __launch_bounds__(NCC_TX * NCC_TY)
ncc_bank_mma(const unsigned char* __restrict__ img, long long pitch, int H, int W,
             const int* __restrict__ bank, int N, int Npad, int th, int tw, int twq, int Wtot,
             const long long* __restrict__ t_sum, const float* __restrict__ t_rs,
             float* __restrict__ out, int ho, int wo)
{
    extern __shared__ __align__(16) int ncc_smem[];
    int* sbank = ncc_smem;
    unsigned char* patch = reinterpret_cast<unsigned char*>(ncc_smem + Npad * Wtot);
    const int pw = NCC_TX + 4 * twq + 8;
    const int ph = NCC_TY + th - 1;
    const int x0 = blockIdx.x * NCC_TX, y0 = blockIdx.y * NCC_TY;
    const int tid = threadIdx.y * NCC_TX + threadIdx.x;
    const int nthreads = NCC_TX * NCC_TY;

    for (int e = tid; e < Npad * Wtot; e += nthreads) sbank[e] = bank[e];
    load_patch<CENTER>(img, pitch, H, W, y0, x0, ph, pw, patch, tid, nthreads);
    __syncthreads();

    const int warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int y = y0 + warp;
    const int words = th * twq;             // real words of a window (per template)
    const int rem = tw & 3;
    const int last_mask = rem == 0 ? -1 : (int)((1u << (8 * rem)) - 1u);
    const int K = th * tw;
    // positions of this lane's A rows: m-tile mt, half h -> x = x0 + 16*mt + g + 8*h
    // (g + 8h has the same low two bits as g: one byte_perm selector per lane)
    const int shift = g & 3;
    const unsigned sel = (unsigned)(shift | ((shift + 1) << 4) | ((shift + 2) << 8) |
                                    ((shift + 3) << 12));

    auto a_word = [&](int px, int w) -> int {
        if (w >= words) return 0;
        const int dy = w / twq, q = w - dy * twq;
        const int* row = reinterpret_cast<const int*>(patch + (warp + dy) * pw + ((px + 4 * q) & ~3));
        return (int)__byte_perm((unsigned)row[0], (unsigned)row[1], sel);
    };

    int s_i[2][2] = {{0, 0}, {0, 0}}, s_ii[2][2] = {{0, 0}, {0, 0}};
    for (int n0 = 0; n0 < Npad; n0 += 32) {
        int acc[2][4][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int r = 0; r < 4; ++r) acc[mt][nt][r] = 0;
        for (int w0 = 0; w0 < Wtot; w0 += 8) {
            int a[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int px = 16 * mt + g + 8 * (r & 1);
                    const int w = w0 + t + 4 * (r >> 1);
                    a[mt][r] = a_word(px, w);
                    if (n0 == 0 && w < words) {
                        const int q = w % twq;
                        const int wm = q == twq - 1 ? (a[mt][r] & last_mask) : a[mt][r];
                        s_i[mt][r & 1] = __dp4a(wm, 0x01010101, s_i[mt][r & 1]);
                        s_ii[mt][r & 1] = __dp4a(wm, wm, s_ii[mt][r & 1]);
                    }
                }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const int* bw = sbank + (n0 + 8 * nt + g) * Wtot + w0 + t;
                const int b[2] = {bw[0], bw[4]};
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) mma_s8_16832(acc[mt][nt], a[mt], b);
            }
        }
        if (n0 == 0) {  // window sums: add the 4 lanes of each group (words t, t+4, ... split)
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    s_i[mt][h] += __shfl_xor_sync(0xffffffffu, s_i[mt][h], 1);
                    s_i[mt][h] += __shfl_xor_sync(0xffffffffu, s_i[mt][h], 2);
                    s_ii[mt][h] += __shfl_xor_sync(0xffffffffu, s_ii[mt][h], 1);
                    s_ii[mt][h] += __shfl_xor_sync(0xffffffffu, s_ii[mt][h], 2);
                }
        }
        if (y < ho) {
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int x = x0 + 16 * mt + g + 8 * h;
                    if (x >= wo) continue;
                    const long long si = s_i[mt][h];
                    const long long var_i = (long long)K * s_ii[mt][h] - si * si;
                    const float ri = var_i > 0 ? 1.0f / sqrtf((float)var_i) : 0.0f;
#pragma unroll
                    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                        for (int c = 0; c < 2; ++c) {
                            const int n = n0 + 8 * nt + 2 * t + c;
                            if (n >= N) continue;
                            const long long num = (long long)K * acc[mt][nt][2 * h + c] -
                                                  si * t_sum[n];
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
template __global__ void ncc_bank_mma<true>(const unsigned char*, long long, int, int,
                                           const int*, int, int, int, int, int, int,
                                           const long long*, const float*, float*, int, int);
template __global__ void ncc_bank_mma<false>(const unsigned char*, long long, int, int,
                                            const int*, int, int, int, int, int, int,
                                            const long long*, const float*, float*, int, int);
#endif
