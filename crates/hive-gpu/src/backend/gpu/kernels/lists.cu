// Inverted-list scan (IVF-Flat): a block reads one probed list and scores each of its rows
// against a group of up to HG_LIST_GROUP queries that probe that list, each query keeping its
// own candidate list as the single-query scan does (same distances, gate and merges); each
// query's lists then go through the usual finalize (band check, f64 re-rank).

// Raw distances (as hg_warp_distances computes them, in the same order of operations) of the
// rows at positions [first, first + hg_warp_rows(dim)) below `end` of a list (position i is
// the stored row map[i]) to `count` <= HG_LIST_GROUP queries, query j at qs + j * qstride
// (16-byte aligned): each row is read once for all of them. Warp-cooperative; the lane that
// owns a row gets its offset from `first` (else 0xffffffff) and its distances in out[j].
template <typename T>
__device__ __forceinline__ u32 hg_warp_distances_group(const T* rows, u32 dim, u32 first, u32 end, const u32* map,
                                                       const float* qs, u32 qstride, u32 count, int metric,
                                                       float* out) {
    u32 lane = threadIdx.x % HG_WARP;
    u32 owned = 0xffffffffu;
#pragma unroll
    for (int j = 0; j < HG_LIST_GROUP; j++) out[j] = 0.0f;
    if ((dim & 3u) == 0) {
        const u32 groups = HG_WARP / HG_LPR;
        u32 g = lane / HG_LPR, s = lane % HG_LPR;
        float acc[HG_LIST_GROUP][HG_RPL];
        u64 at[HG_RPL];
#pragma unroll
        for (int r = 0; r < HG_RPL; r++) {
            u32 row = first + r * groups + g;
            at[r] = (u64)(row < end ? map[row] : 0u) * dim;
#pragma unroll
            for (int j = 0; j < HG_LIST_GROUP; j++) acc[j][r] = 0.0f;
        }
#pragma unroll 2
        for (u32 c = s * 4; c < dim; c += HG_LPR * 4) {
            float4 x[HG_RPL];
#pragma unroll
            for (int r = 0; r < HG_RPL; r++) {
                u32 row = first + r * groups + g;
                x[r] = row < end ? hg_load4<T>(rows, at[r] + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int j = 0; j < HG_LIST_GROUP; j++) {
                if ((u32)j < count) {
                    float4 qv = *(const float4*)(qs + j * qstride + c);
#pragma unroll
                    for (int r = 0; r < HG_RPL; r++) acc[j][r] = hg_accumulate4(acc[j][r], qv, x[r], metric);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < HG_RPL; r++) {
            u32 offset = r * groups + g;
            bool mine = s == (u32)r && first + offset < end;
#pragma unroll
            for (int j = 0; j < HG_LIST_GROUP; j++) {
                if ((u32)j < count) {
                    float v = acc[j][r];
                    for (int o = HG_LPR / 2; o > 0; o >>= 1) v = hg_combine(v, HG_SHFL_XOR(v, o), metric);
                    if (mine) out[j] = v;
                }
            }
            if (mine) owned = offset;
        }
        return owned;
    }
    float acc[HG_LIST_GROUP][HG_ROWS_PER_WARP];
    u64 at[HG_ROWS_PER_WARP];
#pragma unroll
    for (int r = 0; r < HG_ROWS_PER_WARP; r++) {
        u32 row = first + r;
        at[r] = (u64)(row < end ? map[row] : 0u) * dim;
#pragma unroll
        for (int j = 0; j < HG_LIST_GROUP; j++) acc[j][r] = 0.0f;
    }
    for (u32 c = lane; c < dim; c += HG_WARP) {
        float x[HG_ROWS_PER_WARP];
#pragma unroll
        for (int r = 0; r < HG_ROWS_PER_WARP; r++) x[r] = first + r < end ? hg_load<T>(rows, at[r] + c) : 0.0f;
#pragma unroll
        for (int j = 0; j < HG_LIST_GROUP; j++) {
            if ((u32)j < count) {
                float qv = qs[j * qstride + c];
#pragma unroll
                for (int r = 0; r < HG_ROWS_PER_WARP; r++) acc[j][r] = hg_accumulate1(acc[j][r], qv, x[r], metric);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < HG_ROWS_PER_WARP; r++) {
        bool mine = lane == (u32)r && first + r < end;
#pragma unroll
        for (int j = 0; j < HG_LIST_GROUP; j++) {
            if ((u32)j < count) {
                float total = metric == HG_LINF ? hg_warp_max(acc[j][r]) : hg_warp_sum(acc[j][r]);
                if (mine) out[j] = total;
            }
        }
        if (mine) owned = r;
    }
    return owned;
}

// The queries of a group whose buffers must be merged before a round of up to `round` pushes,
// as a bit mask: a buffer that would overflow, or (the early merge) a query with k candidates
// but no threshold yet. Merging as soon as k are known turns the rest of the scan's pushes into
// the few rows inside the band: waiting for the buffer to fill cost much of the kernel's time
// in merges of 512 entries (docs/PERFORMANCE.md, IVF-Flat on CUDA). Every thread reads every
// state, then all meet at one barrier (not one per query) before any merge or push (see
// hg_must_merge).
__device__ __forceinline__ u32 hg_list_merges(const HgTopK* st, u32 count, u32 round, u32 bcap, u32 k) {
    u32 merges = 0;
    for (u32 j = 0; j < count; j++) {
        u32 held = st[j].count;
        bool early = held >= k && st[j].thr == __uint_as_float(0x7f800000u);
        if (early || held + round > bcap) merges |= 1u << j;
    }
    __syncthreads();
    return merges;
}

// grid (groups * splits), block HG_BLOCK. Group b is the pairs work[groups[2b] .. groups[2b + 1]]
// (1 to HG_LIST_GROUP of them, all probing one list; the host orders `work` by list and the
// groups by their list's length, longest first, so the longest scans start first): pair p
// is query q = p / nprobe scanning list l = probes[p], whose rows are slots[offsets[l] ..
// offsets[l + 1]). Block (b, part) scans part `part` of `splits` equal parts of the list (few
// queries: more blocks than pairs keep the device busy). Queries and gates are indexed by q;
// the candidate list and evicted entry of (p, part) are number (p - pair0) * splits + part
// (pair0: the first pair of this launch), so each query's splits * nprobe lists are side by
// side. Dynamic shared memory: per query of the group, its sortn-entry candidate list then its
// dim floats (rounded up to 16 bytes).
template <typename T>
__device__ void hg_list_topk(const T* rows, const float* norms, const u32* dead, u32 dim, const u32* offsets,
                             const u32* slots, const u32* probes, const u32* work, const u32* groups, u32 splits,
                             u32 nprobe, u32 pair0, const float* queries, const float* gate_mul, const float* gate_add,
                             int metric, u32 k, u32 kcap, u32 sortn, u32 max_sub, u64* lists, u64* evicted) {
    extern __shared__ __align__(16) u64 hg_smem[];
    __shared__ HgTopK st[HG_LIST_GROUP];
    __shared__ float mul[HG_LIST_GROUP], add[HG_LIST_GROUP];
    u32 group = blockIdx.x / splits, part = blockIdx.x % splits;
    u32 head = groups[2 * group];
    u32 count = min(groups[2 * group + 1] - head, (u32)HG_LIST_GROUP);
    // u64 words per query: its list, then its floats in whole 16-byte units (sortn is even).
    u32 stride = sortn + ((dim + 3u) / 4u) * 2u;
    u32 qstride = 2u * stride;
    const float* qs = (const float*)(hg_smem + sortn);
    u32 list = probes[work[head]];
    u32 per = (offsets[list + 1] - offsets[list] + splits - 1) / splits;
    u32 start = min(offsets[list] + part * per, offsets[list + 1]);
    u32 end = min(start + per, offsets[list + 1]);
    for (u32 j = 0; j < count; j++) {
        u32 q = work[head + j] / nprobe;
        float* to = (float*)(hg_smem + j * stride + sortn);
        for (u32 c = threadIdx.x; c < dim; c += blockDim.x) to[c] = queries[(u64)q * dim + c];
        if (threadIdx.x == 0) {
            mul[j] = gate_mul[q];
            add[j] = gate_add[q];
        }
    }
    __syncthreads();
    for (u32 j = 0; j < count; j++) hg_init(hg_smem + j * stride, &st[j], kcap, 0, HG_NONE, k, mul[j], add[j]);
    u32 warps = blockDim.x / HG_WARP, warp = threadIdx.x / HG_WARP;
    u32 warp_rows = hg_warp_rows(dim);
    u32 step = warps * warp_rows;
    u32 bcap = sortn - kcap;
    u32 sub = max(1u, min(max_sub, bcap / (2 * step)));
    u32 round = step * sub;
    for (u32 base = start; base < end; base += round) {
        u32 merges = hg_list_merges(st, count, round, bcap, k);
        for (u32 j = 0; j < count; j++) {
            if ((merges >> j) & 1u) hg_merge(hg_smem + j * stride, &st[j], k, kcap, sortn, mul[j], add[j]);
        }
        // Every merge ended at a barrier: the thresholds read here are the merged ones.
        float thr[HG_LIST_GROUP];
#pragma unroll
        for (int j = 0; j < HG_LIST_GROUP; j++) thr[j] = (u32)j < count ? st[j].thr : 0.0f;
        for (u32 u = 0; u < sub; u++) {
            u32 first = base + u * step + warp * warp_rows;
            if (first < end) {
                float raw[HG_LIST_GROUP];
                u32 offset = hg_warp_distances_group<T>(rows, dim, first, end, slots, qs, qstride, count, metric, raw);
                if (offset != 0xffffffffu) {
                    u32 slot = slots[first + offset];
                    if (!hg_dead(dead, slot)) {
#pragma unroll
                        for (int j = 0; j < HG_LIST_GROUP; j++) {
                            if ((u32)j < count) {
                                float a = hg_finish(raw[j], metric, norms, slot);
                                if (a <= thr[j]) hg_push(hg_smem + j * stride, &st[j], kcap, sortn, a, slot);
                            }
                        }
                    }
                }
            }
        }
        __syncthreads();
    }
    for (u32 j = 0; j < count; j++) {
        if (st[j].count > 0) hg_merge(hg_smem + j * stride, &st[j], k, kcap, sortn, mul[j], add[j]);
        u64 at = (u64)(work[head + j] - pair0) * splits + part;
        const u64* sh = hg_smem + j * stride;
        for (u32 i = threadIdx.x; i < kcap; i += blockDim.x) lists[at * kcap + i] = sh[i];
        if (threadIdx.x == 0) evicted[at] = st[j].evicted;
    }
}

extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_list_topk_f32(const float* rows, const float* norms,
        const u32* dead, u32 dim, const u32* offsets, const u32* slots, const u32* probes, const u32* work,
        const u32* groups, u32 splits, u32 nprobe, u32 pair0, const float* queries, const float* gate_mul,
        const float* gate_add, int metric, u32 k, u32 kcap, u32 sortn, u32 max_sub, u64* lists, u64* evicted) {
    hg_list_topk<float>(rows, norms, dead, dim, offsets, slots, probes, work, groups, splits, nprobe, pair0, queries,
                        gate_mul, gate_add, metric, k, kcap, sortn, max_sub, lists, evicted);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_list_topk_f16(const u16* rows, const float* norms,
        const u32* dead, u32 dim, const u32* offsets, const u32* slots, const u32* probes, const u32* work,
        const u32* groups, u32 splits, u32 nprobe, u32 pair0, const float* queries, const float* gate_mul,
        const float* gate_add, int metric, u32 k, u32 kcap, u32 sortn, u32 max_sub, u64* lists, u64* evicted) {
    hg_list_topk<u16>(rows, norms, dead, dim, offsets, slots, probes, work, groups, splits, nprobe, pair0, queries,
                      gate_mul, gate_add, metric, k, kcap, sortn, max_sub, lists, evicted);
}
