// Asynchronous global -> shared copies (cp.async, sm_80+), shared by the kernels that stream
// tiles through a shared-memory pipeline (skinny.cu's wx_tile, spatial.cu's sparse rows).
// `dspk.kernels` pastes this file in place of its #include line before NVRTC compiles a
// source, so the compile cache's key covers it; nvcc finds it next to the including file.
#ifndef DSPK_CP_ASYNC_CUH
#define DSPK_CP_ASYNC_CUH

// BYTES (4, 8 or 16) bytes to shared dst: the first `bytes` from global src, zeros after (all
// zeros when bytes == 0, and then src is not read). Asynchronous on sm_80+ (cp.async; .cg, L2
// only, for 16-byte vectors); older GPUs copy synchronously, which gives the same shared
// contents by the time the caller's wait and __syncthreads() are passed.
template <int BYTES, typename T>
__device__ __forceinline__ void cp_async_copy(T* dst, const T* src, int bytes)
{
#if __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     :: "r"(d), "l"(src), "r"(bytes));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n"
                     :: "r"(d), "l"(src), "n"(BYTES), "r"(bytes));
#else
#pragma unroll
    for (int i = 0; i < BYTES / (int)sizeof(T); ++i)
        dst[i] = i * (int)sizeof(T) < bytes ? src[i] : T(0);
#endif
}

// Closes this thread's current group of copies (an empty group counts too).
__device__ __forceinline__ void cp_async_commit()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most PENDING of this thread's committed copy groups are still in flight.
template <int PENDING>
__device__ __forceinline__ void cp_async_wait()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" :: "n"(PENDING) : "memory");
#endif
}

#endif  // DSPK_CP_ASYNC_CUH
