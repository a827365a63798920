// Launch constants: what a kernel is written for and its launch from Python must agree on
// (threads per block, outputs per thread, tile sizes), each defined once, here. The kernels
// include this file; Python reads its `constexpr int NAME = value;` lines (dspk.kernels.LAUNCH,
// parsed once at import), so a value changed here changes both. Only integer literals: a
// derived value (FIR_TILE = FIR_R * FIR_THREADS) is written as its formula on each side.
#ifndef DSPK_LAUNCH_CUH
#define DSPK_LAUNCH_CUH

// skinny.cu (dspk/linalg/candidates_gpu.py)
constexpr int GS_THREADS = 256;        // gram_small: threads per block (8 warps)
constexpr int GS_U = 4;                // gram_small: samples per thread per step
constexpr int GT_TILE = 64;            // gram_tiled: output rows and columns per block
constexpr int GT_THREADS = 256;        // gram_tiled: threads per block, one 4x4 tile each
constexpr int GT_SYM_THREADS = 160;    // gram_tiled for A·Aᵀ: threads (136 upper tiles compute)
constexpr int RED_THREADS = 256;       // splitk_reduce, symblock_reduce: threads per block
constexpr int WXD_THREADS = 256;       // wx_direct: threads per block (CPT columns each)
constexpr int WXV_THREADS = 64;        // wx_vec: threads per row slice (4 columns each)

// wx_tile.cu (dspk/linalg/candidates_gpu.py)
constexpr int WT_TM = 8;               // wx_tile: rows per thread

// traces.cu (dspk/ops/_traces_gpu.py)
constexpr int FIR_R = 16;              // fir_direct: consecutive outputs per thread
constexpr int FIR_THREADS = 128;       // fir_direct: threads per block
constexpr int CAR_S = 32;              // car_median: samples per block
constexpr int CAR_WARPS = 8;           // car_median: warps per block

// spatial.cu (dspk/ops/_spatial_gpu.py)
constexpr int SR_R = 8;                // sparse_rows: rows per group (one warp's)

// distance.cu (dspk/ops/distance.py)
constexpr int SQD_THREADS = 256;       // sqdist_finish: threads per block
constexpr int SQD_UNROLL = 4;          // sqdist_finish: columns per thread, SQD_THREADS apart
constexpr int SQDD_TILE = 128;         // sqdist_direct: rows and columns of D per block

// projection.cu (dspk/ops/_pca_gpu.py)
constexpr int PR_THREADS = 256;        // center_project: threads per block
constexpr int PR_MAX_PER_THREAD = 16;  // center_project: most components per thread (MPT)

// covariance.cu (dspk/ops/_covariance_gpu.py)
constexpr int CENTER_THREADS = 512;    // center_rows: threads per block

// detect.cu (dspk/_detect_gpu.py)
constexpr int DS_THREADS = 128;        // detect_score: threads per block
constexpr int DS_R = 4;                // detect_score: samples per thread, DS_THREADS apart
constexpr int DS_NN_MAX = 64;          // detect_score: most neighbours per position
constexpr int DP_THREADS = 256;        // detect_peaks: threads per block
constexpr int RM_THREADS = 256;        // row_abs_median: threads per block

// ncc.cu (dspk/match.py)
constexpr int NCC_TX = 32;             // ncc_bank_dp4a: positions per block along x
constexpr int NCC_TY = 8;              // ncc_bank_dp4a: positions per block along y
constexpr int MMA_BX = 64;             // ncc_bank_mma: positions per block along x
constexpr int NCC_MMA_THREADS = 256;   // ncc_bank_mma: threads per block (8 warps)
constexpr int NCC_PACK_THREADS = 128;  // ncc_mma_pack: threads per block

// gram16.cu (dspk/linalg/candidates_int.py)
constexpr int G16_BT = 64;             // gram16: rows per tile
constexpr int G16_THREADS = 128;       // gram16: threads per block
constexpr int GRAM16_MAX_K = 32768;    // gram16: longest K chunk (no int32 accumulator overflows)

#endif  // DSPK_LAUNCH_CUH
