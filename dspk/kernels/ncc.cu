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

#include "common.cuh"
#include "launch.cuh"

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
// ncc_bank_mma: the same computation on INT8 tensor cores (mma.sync m16n8k32 s8 through inline
// PTX: no CUDA headers under NVRTC) with an implicit im2col: the window matrix is read from the
// image patch in shared memory, never written.
//
// Why the layout below: a window starts at any byte, so a plain fragment load is unaligned
// (two loads and a byte permute per register). The block instead keeps 8 shifted copies of its
// patch, copy_s[r][c] = patch[r][c + s]; the window of position p then starts 8-byte aligned in
// copy (p & 7). The K order inside an mma K step is free as long as A and B agree, so lane t
// takes the 8 contiguous window bytes of "chunk" 4*step + t (a chunk = 8 bytes of one template
// row, rows padded to twp = 8*cpr bytes) as its A registers {r0, r2} (and {r1, r3} for the
// row 8 positions on): two 8-byte loads per 16x32 fragment, no permutes. The bank is packed on
// the device (ncc_mma_pack) in fragment order [n-tile][step][lane] of 8-byte pairs, so a B
// fragment is one conflict-free 8-byte load. Copy stride Cs = 32 mod 64 and row stride
// R = 8*Cs + (8*cpr mod 32) bytes put the 16 lanes of a half-warp on distinct banks for
// 16-byte template rows.
//
// Block: MMA_BX = 64 positions (4 m-tiles) x BY rows (32 or 64: taller blocks spread the
// prologue's th - 1 halo rows over more outputs, for more shared memory); warp w computes rows w + 8i,
// NT n-tiles (8*NT templates) at a time, all of its templates slice (grid z) from shared memory.
// Prologue (over half of ncu's warp-stall samples at 4096², N = 32, before the rework): the
// bank slice and the raw patch by cp.async, all in flight at once (centred while the copies
// are built); the 8 shifted copies, one warp each; window sums S_I, S_II: horizontal sums per
// patch row by __dp4a on the aligned copies (one thread per column, a partial last chunk
// masked), then vertical running sums per column in 4 segments of rows, fused with
// 1/sqrt(var_I). Measured (profile_ncc_store, benchmarks/NOTES.md): 1.01-1.04 -> 0.98 ms.
// Epilogue: num = K*S_IT - S_I*S_T and var_I = K*S_II - S_I^2 are exact in 32-bit arithmetic
// when K <= 362 (|num| <= sqrt(var_I*var_T) <= K^2*128^2 < 2^31); WIDE uses int64 otherwise.
// The per-position 1/sqrt(var_I) is formed once in the prologue (hss is overwritten with it).
// PEAKS: instead of maps, append (key = (n*ho + y)*wo + x, score) of every score >= threshold
// to a candidate list: a cheap superset test per output first, the ballots and atomics only for
// rows with a candidate (MmaRow::append); ncc_peak_check keeps the local maxima.
// MINB: blocks per SM for __launch_bounds__ (2 leaves 128 registers for NT = 4; 3 caps at 80).
// ------------------------------------------------------------------------------------------
template <bool WIDE> struct SumType { typedef int type; };      // no <type_traits> in NVRTC
template <> struct SumType<true> { typedef long long type; };

__device__ __forceinline__ void mma_s8_16832(int (&c)[4], const int (&a)[4], int b0, int b1)
{
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ int byte_mask(int nbytes)  // the low nbytes bytes (0..4) of a word
{
    return nbytes >= 4 ? -1 : (nbytes <= 0 ? 0 : (int)((1u << (8 * nbytes)) - 1u));
}

// The bank, centred, in fragment order: packed[(tile * KS + step) * 32 + g * 4 + t] holds
// chunk 4*step + t of template 8*tile + g (zero past the template and for padding templates),
// with the exact sums S_T and the float32 1/sqrt(var_T) (0 for a flat template).
// Grid: one block per (padded) template.
template <bool CENTER>
__global__ void __launch_bounds__(NCC_PACK_THREADS)
ncc_mma_pack(const unsigned char* __restrict__ tmpl, int N, int th, int tw, int cpr, int KC,
             int2* __restrict__ packed, long long* __restrict__ t_sum,
             float* __restrict__ t_rs)
{
    __shared__ long long red[2][NCC_PACK_THREADS];
    const int n = blockIdx.x, KS = KC >> 2;
    const int tile = n >> 3, g = n & 7;
    long long s = 0, ss = 0;
    for (int c = threadIdx.x; c < KC; c += blockDim.x) {
        const int dy = c / cpr, dx0 = (c - dy * cpr) * 8;
        unsigned w[2] = {0u, 0u};
        if (n < N && dy < th) {
#pragma unroll
            for (int b = 0; b < 8; ++b) {
                const int dx = dx0 + b;
                if (dx < tw) {
                    int v = tmpl[((long long)n * th + dy) * tw + dx];
                    v = CENTER ? v - 128 : (int)(signed char)v;
                    s += v;
                    ss += v * v;
                    w[b >> 2] |= (unsigned)(v & 0xff) << (8 * (b & 3));
                }
            }
        }
        packed[((long long)tile * KS + (c >> 2)) * 32 + g * 4 + (c & 3)] =
            make_int2((int)w[0], (int)w[1]);
    }
    red[0][threadIdx.x] = s;
    red[1][threadIdx.x] = ss;
    __syncthreads();
    for (int h = NCC_PACK_THREADS / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) {
            red[0][threadIdx.x] += red[0][threadIdx.x + h];
            red[1][threadIdx.x] += red[1][threadIdx.x + h];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0 && n < N) {
        const long long K = (long long)th * tw, st = red[0][0];
        const long long var_t = K * red[1][0] - st * st;
        t_sum[n] = st;
        t_rs[n] = var_t > 0 ? 1.0f / sqrtf((float)var_t) : 0.0f;
    }
}

// One warp's row of results after the mma loop: C fragment reg r of m-tile mt and n-tile nt is
// position 16*mt + g + 8*(r >> 1), template 8*(nt0 + nt) + 2t + (r & 1) of the slice. The
// window terms (S_I, 1/sqrt(var_I)) come per position from shared memory; the template
// constants and the output row address are formed once per template, not per output (the
// epilogue is most of the kernel's instructions). FULL: every position and template of the
// row is inside (no per-output tests).
// Full maps are gigabytes written once and not read back by the kernel: stores marked
// evict-first (st.global.cs) keep them from displacing the patch and bank lines in L2: with the
// sector stores below, 1.031-1.042 ms against 1.042-1.047 plain (4096², N = 32), 4.95 against
// 5.09 (N = 128). Interior blocks store through a lane rotation that fills whole sectors
// (store_full): 1.43 ms with one plain store per output against 0.98. The raw patch and the
// bank slice arrive by cp.async, all in flight at once (centred in the shifted-copies pass):
// 1.01-1.02 ms with plain loads against 0.98. (Measured on an H200 with the builds these
// alternatives had: benchmarks/NOTES.md, "profile_ncc_store".)

// Position (0..63 in the block's row) of C-fragment row g + 8h of m-tile mt.
__device__ __forceinline__ int mma_pos(int g, int mt, int h) { return 16 * mt + g + 8 * h; }

template <int NT, bool WIDE> struct MmaRow {
    int (&acc)[4][NT][4];
    int si[4][2];
    float ri[4][2];
    const long long* s_tsum;
    const float* s_trs;
    int nt0, tile0, N, K, y, ho, wo, x0, g, t, lane;

    // template 2t + c of n-tile nt (in the bank), its S_T and 1/sqrt(var_T)
    struct Tmpl {
        int n;
        typename SumType<WIDE>::type ts;
        float tr;
    };
    __device__ __forceinline__ Tmpl tmpl(int nt, int c) const
    {
        const int nl = 8 * (nt0 + nt) + 2 * t + c;   // in the slice
        return {8 * tile0 + nl, (typename SumType<WIDE>::type)s_tsum[nl], s_trs[nl]};
    }

    // num * (1/sqrt(var_I)) * (1/sqrt(var_T)), unclamped
    __device__ __forceinline__ float score(int mt, int h, int nt, int c,
                                           typename SumType<WIDE>::type ts, float tr) const
    {
        const int sit = acc[mt][nt][2 * h + c];
        float num;
        if (WIDE) {
            num = (float)((long long)K * sit - (long long)si[mt][h] * ts);
        } else {   // exact in 32 bits (see above); unsigned: defined wrap
            num = (float)(int)((unsigned)K * (unsigned)sit - (unsigned)si[mt][h] * (unsigned)ts);
        }
        return num * ri[mt][h] * tr;
    }

    __device__ __forceinline__ static void put(float* p, float v)
    {
        __stcs(p, v);   // evict-first: the maps are written once
    }

    // One store per output (FULL: no bounds tests); edge blocks take this path.
    template <bool FULL> __device__ __forceinline__ void store_each(float* __restrict__ out) const
    {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const Tmpl tm = tmpl(nt, c);
                float* orow = out + ((long long)tm.n * ho + y) * wo + x0;
#pragma unroll
                for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int off = mma_pos(g, mt, h);
                        const float r =
                            fminf(1.0f, fmaxf(-1.0f, score(mt, h, nt, c, tm.ts, tm.tr)));
                        if (FULL || (tm.n < N && x0 + off < wo)) put(orow + off, r);
                    }
            }
    }

    // Interior blocks: the 8 lanes of one t hold positions g + 8j (j = 2mt + h) of a template
    // row whose start is rarely 32-byte aligned (wo is any width), so each plain store of 8
    // consecutive floats would straddle two 32-byte sectors, half-filling both -- ncu showed
    // 17 of 32 bytes used per stored sector and L2 the busiest unit. Rotating the values
    // among those 8 lanes by the row's misalignment (one shuffle per value) makes every store
    // instruction fill whole sectors: 9 stores per row instead of 8, half the sectors.
    __device__ __forceinline__ void store_full(float* __restrict__ out) const
    {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const Tmpl tm = tmpl(nt, c);
                float* orow = out + ((long long)tm.n * ho + y) * wo + x0;
                const int mis = (int)((reinterpret_cast<unsigned long long>(orow) >> 2) & 7);
                const int src = 4 * ((g - mis) & 7) + t;   // same t: same template row
                float w[8];
#pragma unroll
                for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        w[2 * mt + h] = __shfl_sync(
                            0xffffffffu,
                            fminf(1.0f, fmaxf(-1.0f, score(mt, h, nt, c, tm.ts, tm.tr))), src);
                // store j writes positions 8j - mis .. 8j - mis + 7: one aligned sector; lane g
                // holds position 8j + g - mis in w[j] (g >= mis) or w[j - 1] (g < mis)
                const int p0 = g - mis;
                const bool lo = g >= mis;
                if (lo) put(orow + p0, w[0]);
#pragma unroll
                for (int j = 1; j < 8; ++j) put(orow + 8 * j + p0, lo ? w[j] : w[j - 1]);
                if (!lo) put(orow + 64 + p0, w[7]);
            }
    }

    template <bool FULL> __device__ __forceinline__ void store(float* __restrict__ out) const
    {
        if (FULL) store_full(out);
        else store_each<FULL>(out);
    }

    // Whether any output of this lane may reach the threshold: a superset test (unclamped
    // score; every output when threshold <= -1), so the exact pass runs only for rows with a
    // candidate -- most rows at a useful threshold have none.
    template <bool FULL> __device__ __forceinline__ bool any_above(float threshold) const
    {
        const float lo = threshold > -1.0f ? threshold : -__int_as_float(0x7f800000);
        bool any = false;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const Tmpl tm = tmpl(nt, c);
                const bool nin = FULL || tm.n < N;
#pragma unroll
                for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const bool in = FULL || (nin && x0 + mma_pos(g, mt, h) < wo);
                        any |= in && score(mt, h, nt, c, tm.ts, tm.tr) >= lo;
                    }
            }
        return any;
    }

    // Append (key = (n*ho + y)*wo + x, score) of every output >= threshold (warp-aggregated
    // atomics; the whole warp calls it).
    __device__ __forceinline__ void append(float threshold, unsigned* __restrict__ count,
                                           int capacity, long long* __restrict__ cand_key,
                                           float* __restrict__ cand_score) const
    {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const Tmpl tm = tmpl(nt, c);
                const long long orow = ((long long)tm.n * ho + y) * wo + x0;
#pragma unroll
                for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int off = mma_pos(g, mt, h);
                        const float r =
                            fminf(1.0f, fmaxf(-1.0f, score(mt, h, nt, c, tm.ts, tm.tr)));
                        const bool hit = tm.n < N && x0 + off < wo && r >= threshold;
                        const unsigned m = __ballot_sync(0xffffffffu, hit);
                        if (m) {
                            const int leader = __ffs(m) - 1;
                            unsigned base = 0;
                            if (lane == leader) base = atomicAdd(count, __popc(m));
                            base = __shfl_sync(0xffffffffu, base, leader);
                            if (hit) {
                                const unsigned i = base + __popc(m & ((1u << lane) - 1u));
                                if (i < (unsigned)capacity) {
                                    cand_key[i] = orow + off;
                                    cand_score[i] = r;
                                }
                            }
                        }
                    }
            }
    }
};


template <bool CENTER, int NT, bool WIDE, bool PEAKS, int MINB, int BY>
__global__ void __launch_bounds__(NCC_MMA_THREADS, MINB)
ncc_bank_mma(const unsigned char* __restrict__ img, long long pitch, int H, int W,
             const int2* __restrict__ bank, int th, int tw, int cpr, int KC, int N, int tiles_z,
             const long long* __restrict__ t_sum, const float* __restrict__ t_rs, int Cs, int R,
             float* __restrict__ out, int ho, int wo,
             float threshold, unsigned* __restrict__ count, int capacity,
             long long* __restrict__ cand_key, float* __restrict__ cand_score)
{
    extern __shared__ __align__(16) int ncc_smem[];
    const int KS = KC >> 2;
    const int PH = BY + th - 1;
    const int twp = 8 * cpr;
    const int RW = 64 + twp + 8;                 // raw patch row: bytes 0 .. 63+twp, +1 word
    const int CW = (56 + twp) >> 2;              // words per copy row that windows read
    int2* sbank = reinterpret_cast<int2*>(ncc_smem);
    long long* s_tsum = reinterpret_cast<long long*>(sbank + tiles_z * KS * 32);
    float* s_trs = reinterpret_cast<float*>(s_tsum + tiles_z * 8);
    int* koff = reinterpret_cast<int*>(s_trs + tiles_z * 8);
    unsigned char* copies = reinterpret_cast<unsigned char*>(koff + KC);
    int* hs = reinterpret_cast<int*>(copies + PH * R);      // [PH][64], aliases the raw patch
    int* hss = hs + PH * MMA_BX;
    unsigned* raw = reinterpret_cast<unsigned*>(hs);         // [PH][RW / 4] centred bytes

    const int tid = threadIdx.x, nthreads = blockDim.x;
    const int x0 = blockIdx.x * MMA_BX, y0 = blockIdx.y * BY;
    const int tile0 = blockIdx.z * tiles_z;

    {   // bank slice, its template constants, chunk offsets, raw patch
        const int4* src = reinterpret_cast<const int4*>(bank + (long long)tile0 * KS * 32);
        int4* dst = reinterpret_cast<int4*>(sbank);
        for (int e = tid; e < tiles_z * KS * 16; e += nthreads)
            cp_async_copy<16>(dst + e, src + e, 16);
        for (int e = tid; e < tiles_z * 8; e += nthreads) {
            const int n = 8 * tile0 + e;
            s_tsum[e] = n < N ? t_sum[n] : 0;
            s_trs[e] = n < N ? t_rs[n] : 0.0f;
        }
        for (int c = tid; c < KC; c += nthreads) {
            const int dy = c / cpr;
            koff[c] = dy < th ? dy * R + (c - dy * cpr) * 8 : 0;  // padding: any valid address
        }
        // thread -> (row group, word column), rows looped: no division in the loop
        const int rw4 = RW >> 2;
        const int groups = nthreads >= rw4 ? nthreads / rw4 : 1;
        const bool words = ((pitch & 3) == 0) && (((unsigned long long)img & 3) == 0);
        for (int e0 = tid; e0 < groups * rw4 && (nthreads >= rw4 || e0 < rw4); e0 += nthreads) {
            const int grp = e0 / rw4, q = e0 - grp * rw4;
            const int x = x0 + 4 * q;
            for (int r = grp; r < PH; r += groups) {
                const int y = y0 + r;
                if (words) {   // bytes past the image arrive as zeros (src-size)
                    const int nb = y < H ? min(max(W - x, 0), 4) : 0;
                    const unsigned* src = nb > 0
                        ? reinterpret_cast<const unsigned*>(img + (long long)y * pitch + x)
                        : reinterpret_cast<const unsigned*>(img);
                    cp_async_copy<4>(raw + r * rw4 + q, src, nb);
                    continue;
                }
                unsigned w = 0;
                if (y < H) {
                    const unsigned char* row = img + (long long)y * pitch;
                    if (words && x + 3 < W) {
                        w = *reinterpret_cast<const unsigned*>(row + x);
                    } else {
#pragma unroll
                        for (int b = 0; b < 4; ++b)
                            if (x + b < W) w |= (unsigned)row[x + b] << (8 * b);
                    }
                }
                raw[r * rw4 + q] = w;
            }
        }
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    {   // 8 shifted copies: copy_s word q = raw bytes 4q + s .. 4q + s + 3. Warp w builds copy
        // w & 7, its lanes walking the (row, word) items in order (row and word carried, no
        // division): all threads busy, where one thread per (s, q) left 256 - 8 CW idle.
        // (The launch is always NCC_MMA_THREADS = 8 warps: launch.cuh.)
        const int rw4 = RW >> 2, sft = tid >> 5, b = sft & 3;
        const unsigned sel = (unsigned)(b | ((b + 1) << 4) | ((b + 2) << 8) | ((b + 3) << 12));
        int r = (tid & 31) / CW, q = (tid & 31) - r * CW;
        const int dr = 32 / CW, dq = 32 - dr * CW;
        for (; r < PH; r += dr, q += dq) {
            if (q >= CW) { q -= CW; ++r; if (r >= PH) break; }
            const unsigned* src = raw + r * rw4 + q + (sft >> 2);
            unsigned v = __byte_perm(src[0], src[1], sel);
            // centred here: v - 128 as int8 is v ^ 0x80 (bytes past the image: never read
            // for an output)
            if (CENTER) v ^= 0x80808080u;
            reinterpret_cast<unsigned*>(copies + r * R + sft * Cs)[q] = v;
        }
    }
    __syncthreads();
    const int K = th * tw;
    {   // horizontal window sums per patch row (overwrites the raw patch): thread -> column p,
        // rows r0, r0 + 4, ...; the whole 8-byte chunks unmasked, a partial last one masked
        const int p = tid & (MMA_BX - 1), rstep = nthreads / MMA_BX;
        const int whole = tw >> 3, rest = tw & 7;
        const int mlo = byte_mask(rest), mhi = byte_mask(rest - 4);
        const unsigned char* col = copies + (p & 7) * Cs + (p & ~7);
        for (int r = tid / MMA_BX; r < PH; r += rstep) {
            const unsigned char* base = col + r * R;
            int s = 0, ss = 0;
            for (int j = 0; j < whole; ++j) {
                const int2 v = *reinterpret_cast<const int2*>(base + 8 * j);
                s = __dp4a(v.x, 0x01010101, __dp4a(v.y, 0x01010101, s));
                ss = __dp4a(v.x, v.x, __dp4a(v.y, v.y, ss));
            }
            if (rest) {
                const int2 v = *reinterpret_cast<const int2*>(base + 8 * whole);
                const int lo = v.x & mlo, hi = v.y & mhi;
                s = __dp4a(lo, 0x01010101, __dp4a(hi, 0x01010101, s));
                ss = __dp4a(lo, lo, __dp4a(hi, hi, ss));
            }
            hs[r * MMA_BX + p] = s;
            hss[r * MMA_BX + p] = ss;
        }
    }
    __syncthreads();
    {   // vertical sums: thread -> column p, segment of SEG rows; S_I stays in hs and
        // 1/sqrt(var_I) (0 for a flat window) replaces S_II in hss, once per position. All
        // reads before the barrier, the writes after it (segments read each other's rows).
        static_assert(BY % 4 == 0, "rows per block: 4 segments");
        constexpr int SEG = BY / 4;
        const int p = tid & (MMA_BX - 1), ys = (tid / MMA_BX) * SEG;
        int s1[SEG], s2[SEG];
        if (tid < 4 * MMA_BX) {
            int a = 0, b = 0;
#pragma unroll 4
            for (int r = 0; r < th; ++r) {
                a += hs[(ys + r) * MMA_BX + p];
                b += hss[(ys + r) * MMA_BX + p];
            }
#pragma unroll
            for (int i = 0; i < SEG; ++i) {
                s1[i] = a;
                s2[i] = b;
                if (i + 1 < SEG) {
                    a += hs[(ys + i + th) * MMA_BX + p] - hs[(ys + i) * MMA_BX + p];
                    b += hss[(ys + i + th) * MMA_BX + p] - hss[(ys + i) * MMA_BX + p];
                }
            }
        }
        __syncthreads();
        if (tid < 4 * MMA_BX) {
            float* rs = reinterpret_cast<float*>(hss);
#pragma unroll
            for (int i = 0; i < SEG; ++i) {
                float ri;
                if (WIDE) {
                    const long long var_i = (long long)K * s2[i] - (long long)s1[i] * s1[i];
                    ri = var_i > 0 ? 1.0f / sqrtf((float)var_i) : 0.0f;
                } else {
                    const int var_i = K * s2[i] - s1[i] * s1[i];
                    ri = var_i > 0 ? 1.0f / sqrtf((float)var_i) : 0.0f;
                }
                hs[(ys + i) * MMA_BX + p] = s1[i];
                rs[(ys + i) * MMA_BX + p] = ri;
            }
        }
    }
    __syncthreads();

    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const float* s_ri = reinterpret_cast<const float*>(hss);
    for (int nt0 = 0; nt0 < tiles_z; nt0 += NT) {
        if (8 * (tile0 + nt0) >= N) break;
        // every position and template of this pass inside: no per-output bounds tests
        const bool full = x0 + MMA_BX <= wo && 8 * (tile0 + nt0 + NT) <= N;
        for (int yl = warp; yl < BY; yl += 8) {
            const int y = y0 + yl;
            if (y >= ho) break;
            int acc[4][NT][4];
#pragma unroll
            for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int r = 0; r < 4; ++r) acc[mt][nt][r] = 0;
            const unsigned char* abase = copies + yl * R + g * Cs;
            const int2* bbase = sbank + nt0 * KS * 32 + lane;
            for (int st = 0; st < KS; ++st) {
                const unsigned char* ap = abase + koff[4 * st + t];
                int a[4][4];
#pragma unroll
                for (int mt = 0; mt < 4; ++mt) {
                    // (a0, a2) and (a1, a3) by 8-byte loads: the compiler moves them into the
                    // mma's register quad (~2 moves per mma). 4-byte loads straight into place
                    // spilled (56 bytes) and were slower, 1.03 ms against 0.98 (4096², N = 32)
                    const int2 lo = *reinterpret_cast<const int2*>(ap + 16 * mt);
                    const int2 hi = *reinterpret_cast<const int2*>(ap + 16 * mt + 8);
                    a[mt][0] = lo.x; a[mt][2] = lo.y; a[mt][1] = hi.x; a[mt][3] = hi.y;
                }
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const int2 b = bbase[(nt * KS + st) * 32];
#pragma unroll
                    for (int mt = 0; mt < 4; ++mt) mma_s8_16832(acc[mt][nt], a[mt], b.x, b.y);
                }
            }
            MmaRow<NT, WIDE> row{acc, {}, {}, s_tsum, s_trs, nt0, tile0, N, K, y, ho, wo, x0,
                                 g, t, lane};
#pragma unroll
            for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int p = yl * MMA_BX + mma_pos(g, mt, h);
                    row.si[mt][h] = hs[p];
                    row.ri[mt][h] = s_ri[p];
                }
            if (!PEAKS) {
                if (full) row.template store<true>(out);
                else row.template store<false>(out);
            } else {
                const bool any = full ? row.template any_above<true>(threshold)
                                      : row.template any_above<false>(threshold);
                if (__any_sync(0xffffffffu, any))
                    row.append(threshold, count, capacity, cand_key, cand_score);
            }
        }
    }
}

// Keep the candidates that are local maxima: candidate i (keys sorted ascending) is a peak when
// no candidate of the same template within the (2d+1)^2 square scores higher (any position
// not in the list scores below the threshold, so below every candidate). One thread each;
// peaks are appended (key, score) at *count (any order: the host sorts the short list).
__global__ void ncc_peak_check(const long long* __restrict__ keys, const float* __restrict__ score,
                               int C, int ho, int wo, int d, unsigned* __restrict__ count,
                               long long* __restrict__ peak_key, float* __restrict__ peak_score)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C) return;
    const long long key = keys[i];
    const long long plane = (long long)ho * wo;
    const long long n = key / plane;
    const int y = (int)((key - n * plane) / wo), x = (int)(key - n * plane - (long long)y * wo);
    const float s = score[i];
    bool peak = true;
    for (int dy = -d; dy <= d && peak; ++dy) {
        const int yy = y + dy;
        if (yy < 0 || yy >= ho) continue;
        const long long row = (n * ho + yy) * wo;
        const long long lo_key = row + max(x - d, 0), hi_key = row + min(x + d, wo - 1);
        int lo = 0, hi = C;                      // first index with keys >= lo_key
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (keys[mid] < lo_key) lo = mid + 1; else hi = mid;
        }
        for (int j = lo; j < C && keys[j] <= hi_key; ++j)
            if (score[j] > s) { peak = false; break; }
    }
    if (peak) {
        const unsigned j = atomicAdd(count, 1u);   // at most C peaks: the list has room
        peak_key[j] = key;
        peak_score[j] = s;
    }
}

// The same test without sorting, for small neighbourhoods: the candidates go into an
// open-addressing hash table (linear probing, size a power of two >= 2x the list, keys preset
// to -1), then each candidate looks its (2d+1)^2 - 1 neighbours up. Both kernels read the
// candidate count on the device (grid sized for the list's capacity; threads past the count
// return), so the host waits once, after the peaks are known.
__device__ __forceinline__ unsigned long long peak_slot(long long key, unsigned long long mask)
{
    unsigned long long h = (unsigned long long)key * 0x9E3779B97F4A7C15ull;
    return (h ^ (h >> 29)) & mask;
}

__global__ void ncc_peak_insert(const long long* __restrict__ keys,
                                const float* __restrict__ score,
                                const unsigned* __restrict__ count, int capacity,
                                unsigned long long* __restrict__ table_key,
                                float* __restrict__ table_score, unsigned long long mask)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= min(count[0], (unsigned)capacity)) return;
    const unsigned long long key = (unsigned long long)keys[i];
    for (unsigned long long s = peak_slot((long long)key, mask);; s = (s + 1) & mask) {
        const unsigned long long prev = atomicCAS(table_key + s, ~0ull, key);
        if (prev == ~0ull || prev == key) {   // keys are unique: prev == key never happens
            table_score[s] = score[i];
            return;
        }
    }
}

__global__ void ncc_peak_check_hash(const long long* __restrict__ keys,
                                    const float* __restrict__ score,
                                    unsigned* __restrict__ count, int capacity,
                                    const unsigned long long* __restrict__ table_key,
                                    const float* __restrict__ table_score,
                                    unsigned long long mask, int ho, int wo, int d,
                                    long long* __restrict__ peak_key,
                                    float* __restrict__ peak_score)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= min(count[0], (unsigned)capacity)) return;
    const long long key = keys[i];
    const long long plane = (long long)ho * wo;
    const long long n = key / plane;
    const int y = (int)((key - n * plane) / wo), x = (int)(key - n * plane - (long long)y * wo);
    const float s = score[i];
    bool peak = true;
    for (int yy = max(0, y - d); yy <= min(ho - 1, y + d) && peak; ++yy)
        for (int xx = max(0, x - d); xx <= min(wo - 1, x + d) && peak; ++xx) {
            if (yy == y && xx == x) continue;
            const unsigned long long nk = (unsigned long long)((n * ho + yy) * wo + xx);
            for (unsigned long long t = peak_slot((long long)nk, mask);; t = (t + 1) & mask) {
                const unsigned long long k = table_key[t];
                if (k == nk) {
                    if (table_score[t] > s) peak = false;
                    break;
                }
                if (k == ~0ull) break;
            }
        }
    if (peak) {
        const unsigned j = atomicAdd(count + 1, 1u);   // at most count[0] peaks: room
        peak_key[j] = key;
        peak_score[j] = s;
    }
}
