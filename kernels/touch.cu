// Memory touch, verify and bandwidth kernels the vramguard node agent runs on a
// block it has just allocated. Compiled at run time with NVRTC (no headers, no
// CUDA toolkit on the node beyond libnvrtc), loaded through cudarc.
//
// A block that allocates but is bad (a faulty page, a bit that sticks) reads
// back something other than what was written: touch_verify counts such 8-byte
// words and records the first one. Two passes with complementary patterns flip
// every bit both ways.

// A pattern that differs in every word and with every seed: the word index
// mixed by a 64-bit odd multiplier (Fibonacci hashing), xor the seed.
__device__ __forceinline__ unsigned long long vg_pattern(unsigned long long i,
                                                         unsigned long long seed) {
    return (i * 0x9E3779B97F4A7C15ull) ^ (i << 32) ^ seed;
}

// Write the pattern into words [0, n) of p (grid-stride loop).
extern "C" __global__ void touch_write(unsigned long long *p,
                                       unsigned long long n,
                                       unsigned long long seed) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += stride) {
        p[i] = vg_pattern(i, seed);
    }
}

// Read words [0, n) back. counters[0] += words that differ; counters[1] = the
// lowest bad index (the host sets it to all ones before the launch).
extern "C" __global__ void touch_verify(const unsigned long long *p,
                                        unsigned long long n,
                                        unsigned long long seed,
                                        unsigned long long *counters) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long bad = 0;
    unsigned long long first = ~0ull;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += stride) {
        if (p[i] != vg_pattern(i, seed)) {
            bad += 1;
            if (i < first) {
                first = i;
            }
        }
    }
    if (bad != 0) {
        atomicAdd(&counters[0], bad);
        atomicMin(&counters[1], first);
    }
}
