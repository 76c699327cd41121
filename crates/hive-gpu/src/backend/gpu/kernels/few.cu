// Exact search of one query over few rows: every row's canonical f64 distance, with no
// approximate pass, no error band and no candidate lists. A single query over a few thousand
// rows (a prepared filter's gathered rows, a small collection) spent its time in the fixed
// costs of the scan's in-block merges and finalize's sorts, about 15 us each however few the
// rows (docs/PERFORMANCE.md, "Filters evaluated by every search call"); the f64 terms of the
// few rows themselves cost less than one of those sorts.
//
// Launch contract (the host's `GpuRows::few_path`): grid (ceil(n / HG_FEW_ROWS)), block
// HG_FEW_THREADS; kb <= HG_FEW_ROWS; heads holds one key per block, keys / slots kb entries
// per block (the host merges the blocks' lists from mapped host memory: it reads the heads,
// one contiguous run, and then only the lists whose head is at or under the k-th least head).

// Rows per block (HG_FEW_ROWS) and threads per block (HG_FEW_THREADS) come from the host
// (`kernels.rs`, FEW_ROWS and FEW_THREADS). Components go HG_FEW_CHUNK at a time: thread t holds
// component (t % HG_FEW_CHUNK) of rows t / HG_FEW_CHUNK + HG_FEW_GROUPS * i, so that 32
// consecutive threads read 32 consecutive components of one row (128 bytes of f32), and
// HG_FEW_DEPTH chunks are in flight at once: 128 components, every row of 128 asked for at
// the start.
#define HG_FEW_CHUNK 32
#define HG_FEW_DEPTH 4
#define HG_FEW_GROUPS (HG_FEW_THREADS / HG_FEW_CHUNK)
#define HG_FEW_PER (HG_FEW_ROWS / HG_FEW_GROUPS)
// Doubles per row of a chunk's terms: an odd pitch keeps each half-warp's rows on distinct
// banks when the rows' threads read their terms.
#define HG_FEW_PITCH (HG_FEW_CHUNK + 1)
#if HG_FEW_THREADS % HG_FEW_CHUNK != 0 || HG_FEW_ROWS % HG_FEW_GROUPS != 0 || HG_FEW_ROWS > HG_FEW_THREADS
#error "hg_few_topk holds whole runs of HG_FEW_CHUNK components with HG_FEW_THREADS threads"
#endif
#if HG_FEW_ROWS % 8 != 0
#error "hg_few_topk ranks its rows eight keys a step"
#endif
// The block takes 34 KB of shared memory (two buffers of terms and two of cosine's squares,
// 2 * 2 * HG_FEW_ROWS * HG_FEW_PITCH doubles): on ROCm devices with 64 KiB of LDS one block
// fits a compute unit at a time (never run there: the HIP driver maps no host memory yet, so
// ROCm keeps the scan).

// This thread's share of one chunk (components c0 + lane of rows group, group + HG_FEW_GROUPS,
// ...) and the query's component c0 + lane into registers, every load issued before any is
// used.
template <typename T>
__device__ __forceinline__ void hg_few_load(const T* rows, u32 row0, u32 count, u32 dim, const float* q, u32 c0,
                                            u32 lane, u32 group, float (&values)[HG_FEW_PER], float& qv) {
    bool in = c0 + lane < dim;
    qv = in ? q[c0 + lane] : 0.0f;
#pragma unroll
    for (u32 i = 0; i < HG_FEW_PER; i++) {
        u32 r = group + i * HG_FEW_GROUPS;
        values[i] = in && r < count ? hg_load<T>(rows, (u64)(row0 + r) * dim + c0 + lane) : 0.0f;
    }
}

// The terms of this thread's share of a chunk, each rounded as hg_exact_term rounds it before
// adding it (for cosine, the row's own square in `norms` too), into shared memory.
template <int M>
__device__ __forceinline__ void hg_few_terms(const float (&values)[HG_FEW_PER], float qv, u32 lane, u32 group,
                                             double* terms, double* norms) {
    double q = (double)qv;
#pragma unroll
    for (u32 i = 0; i < HG_FEW_PER; i++) {
        u32 at = (group + i * HG_FEW_GROUPS) * HG_FEW_PITCH + lane;
        double x = (double)values[i];
        if (M == HG_L2) {
            double d = __dsub_rn(q, x);
            terms[at] = __dmul_rn(d, d);
        } else if (M == HG_L1 || M == HG_LINF) {
            terms[at] = fabs(__dsub_rn(q, x));
        } else {
            terms[at] = __dmul_rn(q, x);
            if (M == HG_COS) norms[at] = __dmul_rn(x, x);
        }
    }
}

// Block b takes rows [b * HG_FEW_ROWS, ...). For each chunk of components the whole block
// computes the terms (HG_FEW_ROWS x HG_FEW_CHUNK of them, independent of one another), and
// then each row's thread adds its row's terms in component order with the host reference's
// arithmetic: the distance is bit for bit the one hg_exact_term's chain, and so every
// backend's re-rank, computes. Terms are double-buffered, one barrier a step: in step c the
// rows' threads add chunk c - 1, then every thread (the rows' threads included) computes its
// share of chunk c's terms. Only the chain of additions has to be serial. Before, each row's
// thread also converted, subtracted and multiplied each of its terms on that chain: its sums
// took 5,500 of a block's 10,200 cycles (clock64 marks on the H100, docs/PERFORMANCE.md, "The
// few-rows pass's chain of additions").
//
// The block's kb best (key, slot) pairs go to keys / slots[b * kb ...] in ascending order, each
// pair at its rank (every pair differs: slots are distinct), and its least key to heads[b] as
// well; a removed row or a thread past the rows holds HG_NONE.
//
// `terms` and `norms` hold 2 * HG_FEW_ROWS * HG_FEW_PITCH doubles and `sorted` HG_FEW_ROWS keys
// of shared memory, declared by the kernels themselves, and everything here is inlined into
// them: HIP's compiler gives shared arrays that a device function of its own reaches to every
// kernel of the module that calls such functions (hg_finalize's limit).
template <typename T, int M>
__device__ __forceinline__ void hg_few_topk(const T* rows, const u32* dead, u32 n, u32 dim, const float* q,
                                            double q_norm, u32 kb, u64* heads, u64* keys, u32* slots, double* terms,
                                            double* norms, u64* sorted) {
    u32 t = threadIdx.x;
    u32 row0 = blockIdx.x * HG_FEW_ROWS;
    u32 count = min((u32)HG_FEW_ROWS, n - row0);
    u32 lane = t % HG_FEW_CHUNK, group = t / HG_FEW_CHUNK;
    u32 slot = row0 + t;
    u32 chunks = (dim + HG_FEW_CHUNK - 1) / HG_FEW_CHUNK;
    // Every global load the block needs first is issued before any is waited on: the row's
    // removed bit and the first HG_FEW_DEPTH chunks.
    bool removed = t < count && hg_dead(dead, slot);
    float values[HG_FEW_DEPTH][HG_FEW_PER];
    float qv[HG_FEW_DEPTH];
#pragma unroll
    for (u32 s = 0; s < HG_FEW_DEPTH; s++) {
        if (s < chunks) hg_few_load<T>(rows, row0, count, dim, q, s * HG_FEW_CHUNK, lane, group, values[s], qv[s]);
    }
    double acc = 0.0, rr = 0.0;
    // Chunk c's terms go to buffer c % 2 in step c and are added in step c + 1 (after the
    // barrier that ends step c); step c's writes reuse the buffer added in step c - 1, before
    // that barrier, by the same rows' threads that add now. `chunks + 1` steps in all.
    for (u32 c0 = 0; c0 <= chunks; c0 += HG_FEW_DEPTH) {
#pragma unroll
        for (u32 s = 0; s < HG_FEW_DEPTH; s++) {
            u32 c = c0 + s;
            if (c > 0 && c <= chunks && t < count) {
                u32 prev = c - 1;
                u32 width = min((u32)HG_FEW_CHUNK, dim - prev * HG_FEW_CHUNK);
                const double* x = terms + (prev % 2) * (HG_FEW_ROWS * HG_FEW_PITCH) + t * HG_FEW_PITCH;
                const double* xx = norms + (prev % 2) * (HG_FEW_ROWS * HG_FEW_PITCH) + t * HG_FEW_PITCH;
                if (width == HG_FEW_CHUNK) {
#pragma unroll
                    for (u32 j = 0; j < HG_FEW_CHUNK; j++) {
                        if (M == HG_LINF) acc = fmax(acc, x[j]);
                        else acc = __dadd_rn(acc, x[j]);
                        if (M == HG_COS) rr = __dadd_rn(rr, xx[j]);
                    }
                } else {
                    for (u32 j = 0; j < width; j++) {
                        if (M == HG_LINF) acc = fmax(acc, x[j]);
                        else acc = __dadd_rn(acc, x[j]);
                        if (M == HG_COS) rr = __dadd_rn(rr, xx[j]);
                    }
                }
            }
            if (c < chunks) {
                u32 buffer = (c % 2) * (HG_FEW_ROWS * HG_FEW_PITCH);
                hg_few_terms<M>(values[s], qv[s], lane, group, terms + buffer, norms + buffer);
                u32 ahead = c + HG_FEW_DEPTH;
                if (ahead < chunks)
                    hg_few_load<T>(rows, row0, count, dim, q, ahead * HG_FEW_CHUNK, lane, group, values[s], qv[s]);
            }
            __syncthreads();
        }
    }
    if (t < HG_FEW_ROWS) {
        u64 key = HG_NONE;
        if (t < count && !removed) key = hg_f64_key(hg_exact_finish(acc, rr, q_norm, M));
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
    if (rank == 0) heads[blockIdx.x] = key;
}

template <typename T>
__device__ __forceinline__ void hg_few_topk_any(const T* rows, const u32* dead, u32 n, u32 dim, const float* q,
                                                double q_norm, int metric, u32 kb, u64* heads, u64* keys, u32* slots,
                                                double* terms, double* norms, u64* sorted) {
    if (metric == HG_L2) hg_few_topk<T, HG_L2>(rows, dead, n, dim, q, q_norm, kb, heads, keys, slots, terms, norms, sorted);
    else if (metric == HG_DOT) hg_few_topk<T, HG_DOT>(rows, dead, n, dim, q, q_norm, kb, heads, keys, slots, terms, norms, sorted);
    else if (metric == HG_L1) hg_few_topk<T, HG_L1>(rows, dead, n, dim, q, q_norm, kb, heads, keys, slots, terms, norms, sorted);
    else if (metric == HG_LINF) hg_few_topk<T, HG_LINF>(rows, dead, n, dim, q, q_norm, kb, heads, keys, slots, terms, norms, sorted);
    else hg_few_topk<T, HG_COS>(rows, dead, n, dim, q, q_norm, kb, heads, keys, slots, terms, norms, sorted);
}

extern "C" __global__ void __launch_bounds__(HG_FEW_THREADS) hg_few_topk_f32(const float* rows, const u32* dead, u32 n,
                                                                  u32 dim, const float* q, double q_norm,
                                                                  int metric, u32 kb, u64* heads, u64* keys, u32* slots) {
    __shared__ double terms[2 * HG_FEW_ROWS * HG_FEW_PITCH];
    __shared__ double norms[2 * HG_FEW_ROWS * HG_FEW_PITCH];
    __shared__ u64 sorted[HG_FEW_ROWS];
    hg_few_topk_any<float>(rows, dead, n, dim, q, q_norm, metric, kb, heads, keys, slots, terms, norms, sorted);
}
extern "C" __global__ void __launch_bounds__(HG_FEW_THREADS) hg_few_topk_f16(const u16* rows, const u32* dead, u32 n,
                                                                  u32 dim, const float* q, double q_norm,
                                                                  int metric, u32 kb, u64* heads, u64* keys, u32* slots) {
    __shared__ double terms[2 * HG_FEW_ROWS * HG_FEW_PITCH];
    __shared__ double norms[2 * HG_FEW_ROWS * HG_FEW_PITCH];
    __shared__ u64 sorted[HG_FEW_ROWS];
    hg_few_topk_any<u16>(rows, dead, n, dim, q, q_norm, metric, kb, heads, keys, slots, terms, norms, sorted);
}
extern "C" __global__ void __launch_bounds__(HG_FEW_THREADS) hg_few_topk_bf16(const hg_bf16* rows, const u32* dead, u32 n,
                                                                  u32 dim, const float* q, double q_norm,
                                                                  int metric, u32 kb, u64* heads, u64* keys, u32* slots) {
    __shared__ double terms[2 * HG_FEW_ROWS * HG_FEW_PITCH];
    __shared__ double norms[2 * HG_FEW_ROWS * HG_FEW_PITCH];
    __shared__ u64 sorted[HG_FEW_ROWS];
    hg_few_topk_any<hg_bf16>(rows, dead, n, dim, q, q_norm, metric, kb, heads, keys, slots, terms, norms, sorted);
}
extern "C" __global__ void __launch_bounds__(HG_FEW_THREADS) hg_few_topk_i8(const i8* rows, const u32* dead, u32 n,
                                                                  u32 dim, const float* q, double q_norm,
                                                                  int metric, u32 kb, u64* heads, u64* keys, u32* slots) {
    __shared__ double terms[2 * HG_FEW_ROWS * HG_FEW_PITCH];
    __shared__ double norms[2 * HG_FEW_ROWS * HG_FEW_PITCH];
    __shared__ u64 sorted[HG_FEW_ROWS];
    hg_few_topk_any<i8>(rows, dead, n, dim, q, q_norm, metric, kb, heads, keys, slots, terms, norms, sorted);
}
extern "C" __global__ void __launch_bounds__(HG_FEW_THREADS) hg_few_topk_u8(const u8* rows, const u32* dead, u32 n,
                                                                  u32 dim, const float* q, double q_norm,
                                                                  int metric, u32 kb, u64* heads, u64* keys, u32* slots) {
    __shared__ double terms[2 * HG_FEW_ROWS * HG_FEW_PITCH];
    __shared__ double norms[2 * HG_FEW_ROWS * HG_FEW_PITCH];
    __shared__ u64 sorted[HG_FEW_ROWS];
    hg_few_topk_any<u8>(rows, dead, n, dim, q, q_norm, metric, kb, heads, keys, slots, terms, norms, sorted);
}
