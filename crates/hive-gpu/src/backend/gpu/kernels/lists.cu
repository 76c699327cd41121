// Inverted-list scan (IVF-Flat): each (query, probed list) pair is scanned by one block into a
// candidate list, as the single-query scan does for a segment of the rows, and the query's
// lists then go through the usual finalize (band check, f64 re-rank).

// grid (pairs), block HG_BLOCK, dynamic shared memory sortn u64s + dim floats (as
// hg_scan_topk). Block b scans pair p = work[b]: query q = p / nprobe scans list
// l = probes[p], whose rows are slots[offsets[l] .. offsets[l + 1]). The host orders `work`
// by list, so the blocks that read one list run side by side and find its rows in L2.
// Queries and gates are indexed by q, the candidate list and evicted entry by p - pair0 (the
// first pair of this launch).
template <typename T>
__device__ void hg_list_topk(const T* rows, const float* norms, const u32* dead, u32 dim, const u32* offsets,
                             const u32* slots, const u32* probes, const u32* work, u32 nprobe, u32 pair0,
                             const float* queries, const float* gate_mul, const float* gate_add, int metric, u32 k,
                             u32 kcap, u32 sortn, u32 max_sub, u64* lists, u64* evicted) {
    u32 p = work[blockIdx.x];
    u32 q = p / nprobe;
    u32 list = probes[p];
    u32 start = offsets[list], end = offsets[list + 1];
    u64 at = (u64)(p - pair0);
    hg_scan_range<T, true>(rows, norms, dead, dim, start, end, slots, queries + (u64)q * dim, gate_mul[q],
                           gate_add[q], metric, k, kcap, sortn, max_sub, lists + at * kcap, evicted + at);
}

extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_list_topk_f32(const float* rows, const float* norms,
        const u32* dead, u32 dim, const u32* offsets, const u32* slots, const u32* probes, const u32* work,
        u32 nprobe, u32 pair0, const float* queries, const float* gate_mul, const float* gate_add, int metric,
        u32 k, u32 kcap, u32 sortn, u32 max_sub, u64* lists, u64* evicted) {
    hg_list_topk<float>(rows, norms, dead, dim, offsets, slots, probes, work, nprobe, pair0, queries, gate_mul,
                        gate_add, metric, k, kcap, sortn, max_sub, lists, evicted);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_list_topk_f16(const u16* rows, const float* norms,
        const u32* dead, u32 dim, const u32* offsets, const u32* slots, const u32* probes, const u32* work,
        u32 nprobe, u32 pair0, const float* queries, const float* gate_mul, const float* gate_add, int metric,
        u32 k, u32 kcap, u32 sortn, u32 max_sub, u64* lists, u64* evicted) {
    hg_list_topk<u16>(rows, norms, dead, dim, offsets, slots, probes, work, nprobe, pair0, queries, gate_mul,
                      gate_add, metric, k, kcap, sortn, max_sub, lists, evicted);
}
