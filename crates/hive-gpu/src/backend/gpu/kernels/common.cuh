// Shared by every kernel of the GPU engine. Written in the CUDA/HIP common subset: no
// includes, no intrinsics beyond the ones the prelude maps (HG_SHFL_XOR, HG_SHFL), warp width from
// HG_WARP (set from the device at compile time, 32 or 64).
#ifndef __align__
#define __align__(n) __attribute__((aligned(n)))
#endif
typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short u16;
typedef unsigned char u8;
typedef signed char i8;
// A stored bfloat16 (its 16 bits): a type of its own, so that templates over the stored element
// tell it from f16 (u16).
struct hg_bf16 {
    u16 bits;
};

#define HG_NONE 0xffffffffffffffffull
#define HG_L2 0
#define HG_DOT 1
#define HG_COS 2
#define HG_L1 3
#define HG_LINF 4

// Sortable encodings: unsigned order equals numeric order.
__device__ __forceinline__ u32 hg_f32_key(float a) {
    u32 b = __float_as_uint(a);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float hg_key_f32(u32 k) {
    u32 b = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    return __uint_as_float(b);
}
__device__ __forceinline__ u64 hg_f64_key(double a) {
    u64 b = (u64)__double_as_longlong(a);
    return (b & 0x8000000000000000ull) ? ~b : (b | 0x8000000000000000ull);
}
__device__ __forceinline__ double hg_key_f64(u64 k) {
    u64 b = (k & 0x8000000000000000ull) ? (k & 0x7fffffffffffffffull) : ~k;
    return __longlong_as_double((long long)b);
}
// A candidate: approximate distance key in the high half, slot in the low half, so one u64
// comparison orders by distance, then by slot.
__device__ __forceinline__ u64 hg_entry(float a, u32 slot) { return ((u64)hg_f32_key(a) << 32) | slot; }
__device__ __forceinline__ float hg_entry_dist(u64 e) { return hg_key_f32((u32)(e >> 32)); }

// Exact f16 -> f32 for finite halves (normal and subnormal): shift into the f32 layout, then
// rebias the exponent by 2^112.
__device__ __forceinline__ float hg_h2f(u16 h) {
    float mag = __uint_as_float(((u32)(h & 0x7fffu)) << 13) * 5.192296858534828e+33f;
    return (h & 0x8000u) ? -mag : mag;
}

// Exact bf16 -> f32: bf16 is the high half of an f32.
__device__ __forceinline__ float hg_bf2f(u16 b) { return __uint_as_float(((u32)b) << 16); }

__device__ __forceinline__ bool hg_dead(const u32* dead, u32 slot) {
    return dead != 0 && ((dead[slot >> 5] >> (slot & 31)) & 1u);
}

// The candidate gate: rows with an approximate distance above band(a_k) cannot be among the
// true k nearest (see the host's bounds). Rounded upward so the f32 arithmetic here cannot
// make the band narrower than the proof needs.
__device__ __forceinline__ float hg_band(float ak, float mul, float add) {
    float r = fmaf(ak, mul, add);
    return r + fabsf(r) * 4.76837158203125e-07f + 1e-37f;
}

__device__ __forceinline__ float hg_warp_sum(float v) {
    for (int o = HG_WARP / 2; o > 0; o >>= 1) v += HG_SHFL_XOR(v, o);
    return v;
}
__device__ __forceinline__ float hg_warp_max(float v) {
    for (int o = HG_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, HG_SHFL_XOR(v, o));
    return v;
}
__device__ __forceinline__ double hg_warp_sum_f64(double v) {
    for (int o = HG_WARP / 2; o > 0; o >>= 1) v += HG_SHFL_XOR(v, o);
    return v;
}

// Ascending bitonic sort of n (a power of two) keys in shared memory, with an optional
// companion array; every thread of the block must call it.
__device__ void hg_bitonic(u64* keys, u32* vals, u32 n) {
    for (u32 size = 2; size <= n; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            for (u32 t = threadIdx.x; t < n / 2; t += blockDim.x) {
                u32 i = 2 * t - (t & (stride - 1));
                u32 j = i + stride;
                bool up = (i & size) == 0;
                u64 a = keys[i], b = keys[j];
                bool swap;
                if (vals) {
                    u32 va = vals[i], vb = vals[j];
                    bool greater = a > b || (a == b && va > vb);
                    swap = greater == up;
                    if (swap) { vals[i] = vb; vals[j] = va; }
                } else {
                    swap = (a > b) == up;
                }
                if (swap) { keys[i] = b; keys[j] = a; }
            }
            __syncthreads();
        }
    }
}

// Ascending sort of n <= blockDim.x (key, value) pairs in shared memory by rank: each thread
// counts the pairs before its own and moves it there. Two barriers instead of the bitonic
// network's log2(n)^2 / 2, for a lone block whose barriers nothing else overlaps; more
// instructions, so blocks that share a multiprocessor keep the bitonic sort. Every thread of
// the block must call it.
__device__ void hg_rank_sort(u64* keys, u32* vals, u32 n) {
    u32 i = threadIdx.x, rank = 0, val = 0;
    u64 key = 0;
    if (i < n) {
        key = keys[i];
        val = vals[i];
        for (u32 j = 0; j < n; j++) {
            u64 other = keys[j];
            u32 ov = vals[j];
            rank += other < key || (other == key && (ov < val || (ov == val && j < i)));
        }
    }
    __syncthreads();
    if (i < n) {
        keys[rank] = key;
        vals[rank] = val;
    }
    __syncthreads();
}

// Block-wide top-k with an error band. Shared layout: sh[0, kcap) is the sorted list,
// sh[kcap, sortn) the buffer of new candidates. `state` lives in shared memory.
struct HgTopK {
    u32 count;     // candidates in the buffer
    float thr;     // filter: band of the current k-th best, +inf until k are known
    u64 evicted;   // smallest entry pushed out of the list (HG_NONE if none)
};

__device__ void hg_merge(u64* sh, HgTopK* st, u32 k, u32 kcap, u32 sortn, float mul, float add) {
    __syncthreads();
    // Sort only what holds entries (plus the first evicted position): later merges, with a
    // few new candidates, cost a small sort instead of the whole buffer's.
    u32 n = 1;
    while (n < kcap + st->count + 1) n <<= 1;
    if (n > sortn) n = sortn;
    for (u32 i = kcap + st->count + threadIdx.x; i < n; i += blockDim.x) sh[i] = HG_NONE;
    __syncthreads();
    hg_bitonic(sh, 0, n);
    if (threadIdx.x == 0) {
        if (kcap < n && sh[kcap] < st->evicted) st->evicted = sh[kcap];
        st->count = 0;
        u64 kth = sh[k - 1];
        st->thr = kth == HG_NONE ? __uint_as_float(0x7f800000u) : hg_band(hg_entry_dist(kth), mul, add);
    }
    __syncthreads();
}

// Whether the buffer must be merged before a round of up to `round` pushes. Every thread reads
// the count, then all meet at a barrier before any of them pushes: without the barrier a late
// warp could read a count that early warps of the same round already raised, take the merge
// alone and leave the block's barriers out of step.
__device__ __forceinline__ bool hg_must_merge(const HgTopK* st, u32 round, u32 bcap) {
    u32 count = st->count;
    __syncthreads();
    return count + round > bcap;
}

// Appends a candidate. A push that finds the buffer full (a sizing mistake, never expected)
// counts as an eviction, so the final band check flags the query instead of losing the row.
__device__ __forceinline__ void hg_push(u64* sh, HgTopK* st, u32 kcap, u32 sortn, float a, u32 slot) {
    u32 pos = atomicAdd(&st->count, 1u);
    u64 e = hg_entry(a, slot);
    if (kcap + pos < sortn) {
        sh[kcap + pos] = e;
    } else {
        atomicMin(&st->evicted, e);
    }
}

// The k-th smallest of the values the block's threads hold, one each (+inf for none; ties
// ordered by thread), or +inf when fewer than k are finite. k <= blockDim.x. Every thread must
// call it with the same k; `scratch` holds blockDim.x floats of shared memory and `result`
// one, both free until the call returns. k = 1 is a min reduction; any other k ranks every
// value against all the others (blockDim.x shared reads per thread, no barrier among them).
__device__ float hg_block_kth(float v, u32 k, float* scratch, float* result) {
    const float inf = __uint_as_float(0x7f800000u);
    if (k == 1) {
        for (int o = HG_WARP / 2; o > 0; o >>= 1) v = fminf(v, HG_SHFL_XOR(v, o));
        if (threadIdx.x % HG_WARP == 0) scratch[threadIdx.x / HG_WARP] = v;
        __syncthreads();
        float least = inf;
        for (u32 w = 0; w < blockDim.x / HG_WARP; w++) least = fminf(least, scratch[w]);
        __syncthreads();
        return least;
    }
    scratch[threadIdx.x] = v;
    if (threadIdx.x == 0) *result = inf;
    __syncthreads();
    u32 rank = 0;
    for (u32 j = 0; j < blockDim.x; j++) {
        float other = scratch[j];
        rank += other < v || (other == v && j < threadIdx.x);
    }
    // Ranks are a permutation of 0..blockDim.x, so at most one thread writes.
    if (rank == k - 1 && v < inf) *result = v;
    __syncthreads();
    float kth = *result;
    __syncthreads();
    return kth;
}

__device__ void hg_init(u64* sh, HgTopK* st, u32 kcap, const u64* list, u64 evicted, u32 k, float mul, float add) {
    for (u32 i = threadIdx.x; i < kcap; i += blockDim.x) sh[i] = list ? list[i] : HG_NONE;
    if (threadIdx.x == 0) {
        st->count = 0;
        st->evicted = evicted;
        st->thr = __uint_as_float(0x7f800000u);
    }
    __syncthreads();
    if (threadIdx.x == 0 && sh[k - 1] != HG_NONE) st->thr = hg_band(hg_entry_dist(sh[k - 1]), mul, add);
    __syncthreads();
}
