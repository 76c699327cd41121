// Inverted-list scan (IVF-Flat): a block reads one probed list and scores each of its rows
// against a group of up to HG_LIST_GROUP queries that probe that list, each query keeping its
// own candidate list as the single-query scan does (same distances, gate and merges); each
// query's lists then go through the usual finalize (band check, f64 re-rank).

#if HG_LIST_GROUP > HG_LPR
#error "a group's queries are spread over the HG_LPR lanes of a row (hg_group_distances4)"
#endif
#if HG_LPR != 8
#error "hg_group_distances4 folds across exactly three lane bits (4, 2, 1)"
#endif

// Halves a lane's n values, summed with its partner's across lane bit `mask`: a lane with that
// bit clear keeps v[0, n/2) and gives away v[n/2, n), its partner the other way round, so each
// pair of lanes sums every value once with n/2 shuffles instead of n.
template <int N>
__device__ __forceinline__ void hg_fold(float* v, u32 lane, u32 mask) {
    bool upper = (lane & mask) != 0;
#pragma unroll
    for (int i = 0; i < N / 2; i++) {
        float send = upper ? v[i] : v[i + N / 2];
        float keep = upper ? v[i + N / 2] : v[i];
        v[i] = keep + HG_SHFL_XOR(send, mask);
    }
}

// Raw distances (sum of squares or dot product) of the rows at positions first + r * (HG_WARP /
// HG_LPR) + g (r < HG_RPL) below `end` of a list (position i is the stored row map[i]) to
// `count` <= HG_LIST_GROUP queries, query j at qs + j * qstride (16-byte aligned); dim is a
// multiple of 4. Warp-cooperative: the HG_LPR lanes of lane group g = lane / HG_LPR read its
// rows once for all the queries (4 components a lane a step), then three folds (hg_fold, 28
// shuffles instead of 96) leave lane (g, s = lane % HG_LPR) with query s's distances to
// those rows in d[r] (for s >= count, zeros). Each fold adds the same pairs of partial sums
// (lanes xor 4, then 2, then 1) as the all-lane butterfly it replaced and as hg_warp_distances,
// so the distances are the same bit for bit, within the same error bound, gamma(dim).
template <typename T, int metric>
__device__ __forceinline__ void hg_group_distances4(const T* rows, u32 dim, u32 first, u32 end, const u32* map,
                                                    const float* qs, u32 qstride, u32 count, float* d) {
    const u32 groups = HG_WARP / HG_LPR;
    u32 lane = threadIdx.x % HG_WARP;
    u32 g = lane / HG_LPR, s = lane % HG_LPR;
    // acc[j * HG_RPL + r]: query j against row r, query-major so each fold halves the queries.
    float acc[HG_LPR * HG_RPL];
    u64 at[HG_RPL];
#pragma unroll
    for (int r = 0; r < HG_RPL; r++) {
        u32 row = first + r * groups + g;
        at[r] = (u64)(row < end ? map[row] : 0u) * dim;
    }
#pragma unroll
    for (int i = 0; i < HG_LPR * HG_RPL; i++) acc[i] = 0.0f;
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
                for (int r = 0; r < HG_RPL; r++) acc[j * HG_RPL + r] = hg_accumulate4(acc[j * HG_RPL + r], qv, x[r], metric);
            }
        }
    }
    hg_fold<HG_LPR * HG_RPL>(acc, lane, HG_LPR / 2);
    hg_fold<HG_LPR * HG_RPL / 2>(acc, lane, HG_LPR / 4);
    hg_fold<HG_LPR * HG_RPL / 4>(acc, lane, HG_LPR / 8);
#pragma unroll
    for (int r = 0; r < HG_RPL; r++) d[r] = acc[r];
}

// The same for any dim, one component a lane a step (rows at positions [first, first +
// HG_ROWS_PER_WARP) below `end`): the lane that owns a row gets its offset from `first` (else
// 0xffffffff) and its distances to the queries in out[j].
template <typename T, int metric>
__device__ __forceinline__ u32 hg_group_distances1(const T* rows, u32 dim, u32 first, u32 end, const u32* map,
                                                   const float* qs, u32 qstride, u32 count, float* out) {
    u32 lane = threadIdx.x % HG_WARP;
    u32 owned = 0xffffffffu;
#pragma unroll
    for (int j = 0; j < HG_LIST_GROUP; j++) out[j] = 0.0f;
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
                float total = hg_warp_sum(acc[j][r]);
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

// hg_merge for every query j of the group with bit j of `merges` set (a block-uniform mask), in
// one sorting network: query j's entries are smem[j * stride ..], and all the merged queries'
// lists are sorted side by side in the same bitonic stages, each of the length the fullest of
// them needs. The same sort and the same state updates as one hg_merge per query, with one
// network's barriers instead of one per query (a group's queries tend to need their merges at
// the same round, the first one most of all). Where every merged list is still empty (the
// first merge), only the buffers are sorted and their first kcap entries moved into the lists:
// the same result as sorting the empty lists with them, on a network half as wide. Every
// thread of the block must call it.
__device__ void hg_merge_group(u64* smem, u32 stride, HgTopK* st, u32 merges, u32 count, u32 k, u32 kcap,
                               u32 sortn, const float* mul, const float* add) {
    __shared__ u32 order[HG_LIST_GROUP];
    __syncthreads();
    u32 most = 0, segments = 0;
    bool fresh = true;
    for (u32 j = 0; j < count; j++) {
        if ((merges >> j) & 1u) {
            most = max(most, st[j].count);
            fresh = fresh && smem[j * stride] == HG_NONE;
            if (threadIdx.x == 0) order[segments] = j;
            segments++;
        }
    }
    u32 n = 1;
    while (n < most) n <<= 1;
    // Sorted entries start at `lo` of each query's memory: the buffer alone, or list and buffer.
    u32 lo = kcap;
    if (!fresh || kcap + n > sortn) {
        lo = 0;
        n = 1;
        while (n < kcap + most + 1) n <<= 1;
        if (n > sortn) n = sortn;
    }
    for (u32 j = 0; j < count; j++) {
        if ((merges >> j) & 1u) {
            u64* sh = smem + j * stride;
            for (u32 i = kcap + st[j].count + threadIdx.x; i < lo + n; i += blockDim.x) sh[i] = HG_NONE;
        }
    }
    __syncthreads();
    // n / 2 compare-exchanges per segment and stage; half is a power of two.
    u32 half = n / 2, shift = __ffs(half) - 1;
    for (u32 size = 2; size <= n; size <<= 1) {
        for (u32 step = size >> 1; step > 0; step >>= 1) {
            for (u32 t = threadIdx.x; t < segments * half; t += blockDim.x) {
                u64* keys = smem + order[t >> shift] * stride + lo;
                u32 u = t & (half - 1);
                u32 i = 2 * u - (u & (step - 1));
                u32 o = i + step;
                bool up = (i & size) == 0;
                u64 a = keys[i], b = keys[o];
                if ((a > b) == up) {
                    keys[i] = b;
                    keys[o] = a;
                }
            }
            __syncthreads();
        }
    }
    if (lo != 0) {
        // Sorted buffers to the empty lists: reads [kcap, 2 kcap), writes [0, kcap).
        for (u32 t = threadIdx.x; t < segments * kcap; t += blockDim.x) {
            u64* sh = smem + order[t / kcap] * stride;
            u32 i = t % kcap;
            sh[i] = i < n ? sh[kcap + i] : HG_NONE;
        }
        __syncthreads();
    }
    if (threadIdx.x < segments) {
        u32 j = order[threadIdx.x];
        const u64* sh = smem + j * stride;
        if (kcap < n && sh[lo + kcap] < st[j].evicted) st[j].evicted = sh[lo + kcap];
        st[j].count = 0;
        u64 kth = sh[k - 1];
        st[j].thr = kth == HG_NONE ? __uint_as_float(0x7f800000u) : hg_band(hg_entry_dist(kth), mul[j], add[j]);
    }
    __syncthreads();
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
template <typename T, int metric>
__device__ void hg_list_topk(const T* rows, const float* norms, const u32* dead, u32 dim, const u32* offsets,
                             const u32* slots, const u32* probes, const u32* work, const u32* groups, u32 splits,
                             u32 nprobe, u32 pair0, const float* queries, const float* gate_mul, const float* gate_add,
                             u32 k, u32 kcap, u32 sortn, u32 max_sub, u64* lists, u64* evicted) {
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
        if (merges != 0) hg_merge_group(hg_smem, stride, st, merges, count, k, kcap, sortn, mul, add);
        // Every merge ended at a barrier: the thresholds read here are the merged ones.
        u32 lane = threadIdx.x % HG_WARP;
        float own_thr = lane % HG_LPR < count ? st[lane % HG_LPR].thr : 0.0f;
        float thr[HG_LIST_GROUP];
#pragma unroll
        for (int j = 0; j < HG_LIST_GROUP; j++) thr[j] = (u32)j < count ? st[j].thr : 0.0f;
        for (u32 u = 0; u < sub; u++) {
            u32 first = base + u * step + warp * warp_rows;
            if (first >= end) continue;
            if ((dim & 3u) == 0) {
                // Lane (g, s) pushes query s's candidates among its group's rows.
                float d[HG_RPL];
                hg_group_distances4<T, metric>(rows, dim, first, end, slots, qs, qstride, count, d);
                u32 g = lane / HG_LPR, s = lane % HG_LPR;
                if (s < count) {
#pragma unroll
                    for (int r = 0; r < HG_RPL; r++) {
                        u32 at = first + r * (HG_WARP / HG_LPR) + g;
                        if (at < end) {
                            u32 slot = slots[at];
                            float a = hg_finish(d[r], metric, norms, slot);
                            if (a <= own_thr && !hg_dead(dead, slot)) hg_push(hg_smem + s * stride, &st[s], kcap, sortn, a, slot);
                        }
                    }
                }
            } else {
                float raw[HG_LIST_GROUP];
                u32 offset = hg_group_distances1<T, metric>(rows, dim, first, end, slots, qs, qstride, count, raw);
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
    // Every thread reads the counts the last round left (its closing barrier is behind them).
    u32 held = 0;
    for (u32 j = 0; j < count; j++) held |= (st[j].count > 0 ? 1u : 0u) << j;
    if (held != 0) hg_merge_group(hg_smem, stride, st, held, count, k, kcap, sortn, mul, add);
    for (u32 j = 0; j < count; j++) {
        u64 at = (u64)(work[head + j] - pair0) * splits + part;
        const u64* sh = hg_smem + j * stride;
        for (u32 i = threadIdx.x; i < kcap; i += blockDim.x) lists[at * kcap + i] = sh[i];
        if (threadIdx.x == 0) evicted[at] = st[j].evicted;
    }
}

// The metric is a template argument, so the distance loop compiles to its own arithmetic:
// decided per component at run time, the branches and selects were most of the instructions
// the kernel issued (docs/PERFORMANCE.md, IVF-Flat list scan on the H100). The host sends only
// L2, dot and cosine here: the difference norms are refined (`scan_lists_on_device` checks, and
// asserts at the launch), so the last branch is cosine.
template <typename T>
__device__ __forceinline__ void hg_list_topk_metric(const T* rows, const float* norms, const u32* dead, u32 dim,
                                                    const u32* offsets, const u32* slots, const u32* probes,
                                                    const u32* work, const u32* groups, u32 splits, u32 nprobe,
                                                    u32 pair0, const float* queries, const float* gate_mul,
                                                    const float* gate_add, int metric, u32 k, u32 kcap, u32 sortn,
                                                    u32 max_sub, u64* lists, u64* evicted) {
    if (metric == HG_L2)
        hg_list_topk<T, HG_L2>(rows, norms, dead, dim, offsets, slots, probes, work, groups, splits, nprobe, pair0,
                               queries, gate_mul, gate_add, k, kcap, sortn, max_sub, lists, evicted);
    else if (metric == HG_DOT)
        hg_list_topk<T, HG_DOT>(rows, norms, dead, dim, offsets, slots, probes, work, groups, splits, nprobe, pair0,
                                queries, gate_mul, gate_add, k, kcap, sortn, max_sub, lists, evicted);
    else
        hg_list_topk<T, HG_COS>(rows, norms, dead, dim, offsets, slots, probes, work, groups, splits, nprobe, pair0,
                                queries, gate_mul, gate_add, k, kcap, sortn, max_sub, lists, evicted);
}

extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_list_topk_f32(const float* rows, const float* norms,
        const u32* dead, u32 dim, const u32* offsets, const u32* slots, const u32* probes, const u32* work,
        const u32* groups, u32 splits, u32 nprobe, u32 pair0, const float* queries, const float* gate_mul,
        const float* gate_add, int metric, u32 k, u32 kcap, u32 sortn, u32 max_sub, u64* lists, u64* evicted) {
    hg_list_topk_metric<float>(rows, norms, dead, dim, offsets, slots, probes, work, groups, splits, nprobe, pair0,
                               queries, gate_mul, gate_add, metric, k, kcap, sortn, max_sub, lists, evicted);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_list_topk_f16(const u16* rows, const float* norms,
        const u32* dead, u32 dim, const u32* offsets, const u32* slots, const u32* probes, const u32* work,
        const u32* groups, u32 splits, u32 nprobe, u32 pair0, const float* queries, const float* gate_mul,
        const float* gate_add, int metric, u32 k, u32 kcap, u32 sortn, u32 max_sub, u64* lists, u64* evicted) {
    hg_list_topk_metric<u16>(rows, norms, dead, dim, offsets, slots, probes, work, groups, splits, nprobe, pair0,
                             queries, gate_mul, gate_add, metric, k, kcap, sortn, max_sub, lists, evicted);
}
