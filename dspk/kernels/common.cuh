// Device code shared by dspk's kernels, one name per concept:
//   Vec16<T>  16 bytes of T as one vector access (float4: 4 floats; double2: 2 doubles)
//   Quad<T>   4 consecutive elements of T by vector accesses (16 bytes of float, 32 of double)
//   cp_async_copy / cp_async_commit / cp_async_wait   asynchronous global -> shared copies
//             (cp.async, sm_80+), for the kernels that stream tiles through shared memory
// `dspk.kernels` pastes this file in place of its #include line before NVRTC compiles a
// source, so the compile cache's key covers it; nvcc finds it next to the including file.
#ifndef DSPK_COMMON_CUH
#define DSPK_COMMON_CUH

// Vec16<T>: `type` (the vector type), `n` (elements in it), and load/store between a 16-byte
// aligned address and n values.
template <typename T> struct Vec16;
template <> struct Vec16<float> {
    typedef float4 type;
    static constexpr int n = 4;
    static __device__ __forceinline__ void load(const float* p, float* v) {
        const float4 t = *reinterpret_cast<const float4*>(p);
        v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    }
    static __device__ __forceinline__ void store(float* p, const float* v) {
        *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    }
};
template <> struct Vec16<double> {
    typedef double2 type;
    static constexpr int n = 2;
    static __device__ __forceinline__ void load(const double* p, double* v) {
        const double2 t = *reinterpret_cast<const double2*>(p);
        v[0] = t.x; v[1] = t.y;
    }
    static __device__ __forceinline__ void store(double* p, const double* v) {
        *reinterpret_cast<double2*>(p) = make_double2(v[0], v[1]);
    }
};

// Quad<T>: 4 consecutive elements at an address aligned to their vector accesses (16 bytes):
// `load` (any memory space), `load_ro` (global memory, through the read-only path: __ldg),
// `store`.
template <typename T> struct Quad;
template <> struct Quad<float> {
    static __device__ __forceinline__ void load(const float* p, float* v) {
        const float4 t = *reinterpret_cast<const float4*>(p);
        v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    }
    static __device__ __forceinline__ void load_ro(const float* p, float* v) {
        const float4 t = __ldg(reinterpret_cast<const float4*>(p));
        v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    }
    static __device__ __forceinline__ void store(float* p, const float* v) {
        *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    }
};
template <> struct Quad<double> {
    static __device__ __forceinline__ void load(const double* p, double* v) {
        const double2 t0 = *reinterpret_cast<const double2*>(p);
        const double2 t1 = *reinterpret_cast<const double2*>(p + 2);
        v[0] = t0.x; v[1] = t0.y; v[2] = t1.x; v[3] = t1.y;
    }
    static __device__ __forceinline__ void load_ro(const double* p, double* v) {
        const double2 t0 = __ldg(reinterpret_cast<const double2*>(p));
        const double2 t1 = __ldg(reinterpret_cast<const double2*>(p + 2));
        v[0] = t0.x; v[1] = t0.y; v[2] = t1.x; v[3] = t1.y;
    }
    static __device__ __forceinline__ void store(double* p, const double* v) {
        *reinterpret_cast<double2*>(p) = make_double2(v[0], v[1]);
        *reinterpret_cast<double2*>(p + 2) = make_double2(v[2], v[3]);
    }
};

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

#endif  // DSPK_COMMON_CUH
