// Exact search of one query over few rows: every row's canonical f64 distance, with no
// approximate pass, no error band and no candidate lists. A single query over a few thousand
// rows (a prepared filter's gathered rows, a small collection) spent its time in the fixed
// costs of the scan's in-block merges and finalize's sorts, about 15 us each however few the
// rows (docs/PERFORMANCE.md, "Filters evaluated by every search call"); the f64 terms of the
// few rows themselves cost less than one of those sorts.
//
// Launch contract (the host's `GpuRows::few_path`): grid (ceil(n / HG_FEW_ROWS)), block
// HG_BLOCK; kb <= HG_FEW_ROWS; keys / slots hold kb entries per block (the host merges the
// blocks' lists from mapped host memory, reading each only up to the k-th least list head).

// Rows per block, and components staged per pass: a pass holds HG_FEW_ROWS * HG_FEW_CHUNK
// floats in flight for the block, so that over 10,253 rows of 128 (161 blocks) every row is
// asked for at once. Smaller passes over blocks of 256 rows left most multiprocessors idle and
// waited on memory once per pass: 17 us a query under ncu on the H100 (docs/PERFORMANCE.md,
// "One exact pass for a query over few rows").
// The block takes 34 KB of shared memory: on ROCm devices with 64 KiB of LDS one block fits a
// compute unit at a time (not measured there).
#define HG_FEW_ROWS 64
#define HG_FEW_CHUNK 128
// Rows one thread stages per pass, HG_FEW_STEP rows apart.
#define HG_FEW_STEP (HG_BLOCK / HG_FEW_CHUNK)
#define HG_FEW_PER (HG_FEW_ROWS / HG_FEW_STEP)
#if HG_BLOCK % HG_FEW_CHUNK != 0 || HG_FEW_ROWS % (HG_BLOCK / HG_FEW_CHUNK) != 0 || HG_FEW_ROWS > HG_BLOCK
#error "hg_few_topk stages whole runs of HG_FEW_CHUNK components with HG_BLOCK threads"
#endif

// This thread's share of one pass: component c0 + lane of rows first, first + HG_FEW_STEP, ...
// into registers, every load issued before any is used.
template <typename T>
__device__ __forceinline__ void hg_few_stage(const T* rows, u32 row0, u32 count, u32 dim, u32 c0, u32 lane,
                                             u32 first, float (&values)[HG_FEW_PER]) {
    bool in = c0 + lane < dim;
#pragma unroll
    for (u32 i = 0; i < HG_FEW_PER; i++) {
        u32 r = first + i * HG_FEW_STEP;
        values[i] = in && r < count ? hg_load<T>(rows, (u64)(row0 + r) * dim + c0 + lane) : 0.0f;
    }
}

// Block b takes rows [b * HG_FEW_ROWS, ...), one per thread of its first HG_FEW_ROWS. The
// rows' components are staged in shared memory HG_FEW_CHUNK at a time by the whole block
// (each warp reads 32 consecutive components of one row at a time, 128 bytes of f32, and the
// next pass's loads are in flight while this one is summed), then each row's thread adds its
// terms in component order with the host reference's arithmetic (hg_exact_term): the distance
// is bit for bit the one every backend's re-rank computes. The block's kb best (key, slot) pairs go to keys / slots[b * kb ...] in
// ascending order, each pair at its rank (every pair differs: slots are distinct); a removed
// row or a thread past the rows holds HG_NONE.
//
// `tile` holds HG_FEW_ROWS * (HG_FEW_CHUNK + 1) floats, `qs` HG_FEW_CHUNK floats and `sorted`
// HG_FEW_ROWS keys of shared memory, declared by the kernels themselves, and everything here
// is inlined into them: HIP's compiler gives shared arrays that a device function of its own
// reaches to every kernel of the module that calls such functions (hg_finalize's limit).
template <typename T, int M>
__device__ __forceinline__ void hg_few_topk(const T* rows, const u32* dead, u32 n, u32 dim, const float* q,
                                            double q_norm, u32 kb, u64* keys, u32* slots, float* tile, float* qs,
                                            u64* sorted) {
    u32 t = threadIdx.x;
    u32 row0 = blockIdx.x * HG_FEW_ROWS;
    u32 count = min((u32)HG_FEW_ROWS, n - row0);
    u32 lane = t % HG_FEW_CHUNK, first = t / HG_FEW_CHUNK;
    float next[HG_FEW_PER];
    hg_few_stage<T>(rows, row0, count, dim, 0, lane, first, next);
    double acc = 0.0, rr = 0.0;
    for (u32 c0 = 0; c0 < dim; c0 += HG_FEW_CHUNK) {
        u32 width = min((u32)HG_FEW_CHUNK, dim - c0);
        // An odd pitch (HG_FEW_CHUNK + 1) puts consecutive threads' rows on different banks.
#pragma unroll
        for (u32 i = 0; i < HG_FEW_PER; i++) {
            u32 r = first + i * HG_FEW_STEP;
            if (r < count) tile[r * (HG_FEW_CHUNK + 1) + lane] = next[i];
        }
        if (t < width) qs[t] = q[c0 + t];
        __syncthreads();
        if (c0 + HG_FEW_CHUNK < dim) hg_few_stage<T>(rows, row0, count, dim, c0 + HG_FEW_CHUNK, lane, first, next);
        if (t < count) {
            const float* x = tile + t * (HG_FEW_CHUNK + 1);
            u32 j = 0;
            for (; j + 16 <= width; j += 16) {
#pragma unroll
                for (u32 u = 0; u < 16; u++) hg_exact_term<M>(acc, rr, (double)x[j + u], (double)qs[j + u]);
            }
            for (; j < width; j++) hg_exact_term<M>(acc, rr, (double)x[j], (double)qs[j]);
        }
        __syncthreads();
    }
    u32 slot = row0 + t;
    if (t < HG_FEW_ROWS) {
        u64 key = HG_NONE;
        if (t < count && !hg_dead(dead, slot)) key = hg_f64_key(hg_exact_finish(acc, rr, q_norm, M));
        sorted[t] = key;
    }
    __syncthreads();
    if (t >= HG_FEW_ROWS) return;
    u64 key = sorted[t];
    // The pair's rank by (key, slot), eight keys a step; a thread stops once it is out of the
    // kb best.
    u32 rank = 0;
    for (u32 j = 0; j < HG_FEW_ROWS && rank < kb; j += 8) {
#pragma unroll
        for (u32 u = 0; u < 8; u++) {
            u64 other = sorted[j + u];
            rank += other < key || (other == key && j + u < t);
        }
    }
    if (rank < kb) {
        keys[(u64)blockIdx.x * kb + rank] = key;
        slots[(u64)blockIdx.x * kb + rank] = slot;
    }
}

template <typename T>
__device__ __forceinline__ void hg_few_topk_any(const T* rows, const u32* dead, u32 n, u32 dim, const float* q,
                                                double q_norm, int metric, u32 kb, u64* keys, u32* slots,
                                                float* tile, float* qs, u64* sorted) {
    if (metric == HG_L2) hg_few_topk<T, HG_L2>(rows, dead, n, dim, q, q_norm, kb, keys, slots, tile, qs, sorted);
    else if (metric == HG_DOT) hg_few_topk<T, HG_DOT>(rows, dead, n, dim, q, q_norm, kb, keys, slots, tile, qs, sorted);
    else if (metric == HG_L1) hg_few_topk<T, HG_L1>(rows, dead, n, dim, q, q_norm, kb, keys, slots, tile, qs, sorted);
    else if (metric == HG_LINF) hg_few_topk<T, HG_LINF>(rows, dead, n, dim, q, q_norm, kb, keys, slots, tile, qs, sorted);
    else hg_few_topk<T, HG_COS>(rows, dead, n, dim, q, q_norm, kb, keys, slots, tile, qs, sorted);
}

extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_few_topk_f32(const float* rows, const u32* dead, u32 n,
                                                                  u32 dim, const float* q, double q_norm,
                                                                  int metric, u32 kb, u64* keys, u32* slots) {
    __shared__ float tile[HG_FEW_ROWS * (HG_FEW_CHUNK + 1)];
    __shared__ float qs[HG_FEW_CHUNK];
    __shared__ u64 sorted[HG_FEW_ROWS];
    hg_few_topk_any<float>(rows, dead, n, dim, q, q_norm, metric, kb, keys, slots, tile, qs, sorted);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_few_topk_f16(const u16* rows, const u32* dead, u32 n,
                                                                  u32 dim, const float* q, double q_norm,
                                                                  int metric, u32 kb, u64* keys, u32* slots) {
    __shared__ float tile[HG_FEW_ROWS * (HG_FEW_CHUNK + 1)];
    __shared__ float qs[HG_FEW_CHUNK];
    __shared__ u64 sorted[HG_FEW_ROWS];
    hg_few_topk_any<u16>(rows, dead, n, dim, q, q_norm, metric, kb, keys, slots, tile, qs, sorted);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_few_topk_bf16(const hg_bf16* rows, const u32* dead, u32 n,
                                                                  u32 dim, const float* q, double q_norm,
                                                                  int metric, u32 kb, u64* keys, u32* slots) {
    __shared__ float tile[HG_FEW_ROWS * (HG_FEW_CHUNK + 1)];
    __shared__ float qs[HG_FEW_CHUNK];
    __shared__ u64 sorted[HG_FEW_ROWS];
    hg_few_topk_any<hg_bf16>(rows, dead, n, dim, q, q_norm, metric, kb, keys, slots, tile, qs, sorted);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_few_topk_i8(const i8* rows, const u32* dead, u32 n,
                                                                  u32 dim, const float* q, double q_norm,
                                                                  int metric, u32 kb, u64* keys, u32* slots) {
    __shared__ float tile[HG_FEW_ROWS * (HG_FEW_CHUNK + 1)];
    __shared__ float qs[HG_FEW_CHUNK];
    __shared__ u64 sorted[HG_FEW_ROWS];
    hg_few_topk_any<i8>(rows, dead, n, dim, q, q_norm, metric, kb, keys, slots, tile, qs, sorted);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_few_topk_u8(const u8* rows, const u32* dead, u32 n,
                                                                  u32 dim, const float* q, double q_norm,
                                                                  int metric, u32 kb, u64* keys, u32* slots) {
    __shared__ float tile[HG_FEW_ROWS * (HG_FEW_CHUNK + 1)];
    __shared__ float qs[HG_FEW_CHUNK];
    __shared__ u64 sorted[HG_FEW_ROWS];
    hg_few_topk_any<u8>(rows, dead, n, dim, q, q_norm, metric, kb, keys, slots, tile, qs, sorted);
}
