// fingerprint64: a 64-bit fingerprint of an array's bytes, for recognising an operand a one-shot
// call has prepared before (dspk.linalg.prepared). Each 32-bit word (or byte, for sizes that are
// not a multiple of 4) is mixed with its index (splitmix64 finaliser) and the mixed values are
// summed mod 2^64: the sum does not depend on the order the threads add in, so the fingerprint
// is deterministic, and a change of any word or a move of a word changes it (but for a 2^-64
// chance). Not a cryptographic hash: it tells a modified array from the one that was prepared.
//   out[0] += sum_i mix(i, v[i]); the caller zeroes out[0] first.

__device__ __forceinline__ unsigned long long fp_mix(unsigned long long i, unsigned long long v)
{
    unsigned long long z = v + i * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

template <typename W>
__global__ void fingerprint64(const W* __restrict__ v, long long n,
                              unsigned long long* __restrict__ out)
{
    unsigned long long acc = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        acc += fp_mix((unsigned long long)i, (unsigned long long)v[i]);
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0 && acc != 0) atomicAdd(out, acc);
}
