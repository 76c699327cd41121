// The merge of several searches' top-k lists on one device (a sharded search's shards, each
// copied here from its own device). List s holds widths[s] entries per query, ascending by
// distance, then slot, at entries offsets[s] + q * widths[s] of `slots` and `dist`.
//
// Launch: one thread per query, HG_BLOCK per block, grid ceil(nq / HG_BLOCK); lists <=
// HG_MERGE_LISTS (kernels.rs, MERGE_LISTS) and k <= the sum of the widths (the host's contract).
//
// Each of the k picks takes the smallest head by distance, then list. Ties inside one list
// are already in its slot order, which is its write order; the order between equal distances
// of different lists is the storage's write order, which only the host knows: where the
// smallest head ties another list's head, the query is flagged in `tied` and the host merges
// it from the lists. Without a flag, no two lists' heads were ever equal at a pick, so the
// picks are the unique k smallest and in the host's order.
extern "C" __global__ void hg_merge_lists(const u32* slots, const double* dist, const u64* offsets,
                                          const u32* widths, u32 lists, u32 nq, u32 k, u32* out_lists,
                                          u32* out_slots, double* out_dist, u32* tied) {
    u32 q = blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= nq) return;
    u32 head[HG_MERGE_LISTS];
    for (u32 s = 0; s < lists; s++) head[s] = 0;
    u32 flag = 0;
    u64 out = (u64)q * k;
    for (u32 i = 0; i < k; i++) {
        u32 best = lists, best_slot = 0xffffffffu, equal = 0;
        double best_dist = 0.0;
        for (u32 s = 0; s < lists; s++) {
            if (head[s] >= widths[s]) continue;
            u64 e = offsets[s] + (u64)q * widths[s] + head[s];
            double d = dist[e];
            if (best == lists || d < best_dist) {
                best = s;
                best_dist = d;
                best_slot = slots[e];
                equal = 0;
            } else if (d == best_dist) {
                equal = 1;
            }
        }
        flag |= equal;
        out_lists[out + i] = best;
        out_slots[out + i] = best_slot;
        out_dist[out + i] = best_dist;
        if (best < lists) head[best]++;
    }
    tied[q] = flag;
}
