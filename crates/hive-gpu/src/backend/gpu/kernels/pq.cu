// Product-quantized list scan (IVF-PQ and the flat PQ index; backend/pq.rs documents the codes
// and the distance). One block per query: its lookup table lives in shared memory for all the
// lists it probes, so each row costs m shared-memory lookups and adds.

// Code j of a row whose 32-bit words are `w` (rows of whole words) or whose bytes are `b`.
__device__ __forceinline__ u32 hg_pq_byte(const u32* w, const u8* b, u32 i) {
    return w ? (w[i >> 2] >> (8u * (i & 3u))) & 255u : (u32)b[i];
}

// Launch contract: grid (queries), block HG_BLOCK. Block q fills query q's table (entry
// j * 2^bits + c is -w q_j . codebook_j[c], w = 2 under L2 and 1 otherwise, the products summed
// in order by fmaf as the host's GEMM does), then scans its nprobe lists a row per thread,
// keeping its k best (distance, slot) entries as the exact scan does (hg_push / hg_merge with
// no band: mul 1, add 0), and writes them ascending to out[q * k ..] (all ones past the rows
// it found). A row's distance adds in the host's order (backend/pq.rs scan_query): the list
// term (|q - centroid|^2 under L2, else -(q . centroid), summed in f64), then the row's stored
// term under L2, then the lookups (8-bit codes summed apart first, 4-bit codes one by one).
// Rows: list l is rows offsets[l] .. offsets[l + 1] of `codes` (row_bytes each, whole words
// when row_bytes is a multiple of 4), `terms` and `slots`; `skip` is a bitmap of slots never
// returned, or null. k <= kcap < sortn - HG_BLOCK. Dynamic shared memory: sortn u64s, then
// the table (m << bits floats), then the query (dim floats).
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_pq_scan(const u8* codes, u32 row_bytes, const float* terms,
        const u32* offsets, const u32* slots, const float* centroids, const float* codebooks, u32 m, u32 bits,
        const u32* probes, u32 nprobe, const float* queries, u32 dim, const u32* skip, int metric, u32 k, u32 kcap,
        u32 sortn, u64* out) {
    extern __shared__ __align__(16) u64 hg_smem[];
    __shared__ HgTopK st;
    __shared__ double partial[HG_WARP];
    __shared__ float list_term;
    u64* sh = hg_smem;
    u32 ksub = 1u << bits, sub = dim / m;
    float* table = (float*)(sh + sortn);
    float* qv = table + m * ksub;
    u32 q = blockIdx.x, t = threadIdx.x;
    for (u32 c = t; c < dim; c += blockDim.x) qv[c] = queries[(u64)q * dim + c];
    __syncthreads();
    float weight = metric == HG_L2 ? -2.0f : -1.0f;
    for (u32 i = t; i < m * ksub; i += blockDim.x) {
        u32 j = i >> bits;
        const float* book = codebooks + (u64)i * sub;
        const float* part = qv + j * sub;
        float acc = 0.0f;
        for (u32 s = 0; s < sub; s++) acc = fmaf(part[s], book[s], acc);
        table[i] = weight * acc;
    }
    hg_init(sh, &st, kcap, 0, HG_NONE, k, 1.0f, 0.0f);
    u32 bcap = sortn - kcap;
    bool words = (row_bytes & 3u) == 0;
    for (u32 p = 0; p < nprobe; p++) {
        u32 l = probes[(u64)q * nprobe + p];
        if (t < HG_WARP) {
            const float* centroid = centroids + (u64)l * dim;
            double acc = 0.0;
            for (u32 c = t; c < dim; c += HG_WARP) {
                double a = qv[c], b = centroid[c];
                acc += metric == HG_L2 ? (a - b) * (a - b) : a * b;
            }
            partial[t] = acc;
        }
        __syncthreads();
        if (t == 0) {
            double sum = 0.0;
            for (u32 i = 0; i < HG_WARP; i++) sum += partial[i];
            list_term = (float)(metric == HG_L2 ? sum : -sum);
        }
        __syncthreads();
        float base = list_term;
        u32 end = offsets[l + 1];
        for (u32 first = offsets[l]; first < end; first += blockDim.x) {
            if (hg_must_merge(&st, blockDim.x, bcap)) hg_merge(sh, &st, k, kcap, sortn, 1.0f, 0.0f);
            float thr = st.thr;
            u32 r = first + t;
            if (r < end) {
                const u8* row = codes + (u64)r * row_bytes;
                const u32* w = words ? (const u32*)row : 0;
                float d = metric == HG_L2 ? base + terms[r] : base;
                if (bits == 8) {
                    float s = 0.0f;
                    for (u32 j = 0; j < m; j++) s += table[j * 256u + hg_pq_byte(w, row, j)];
                    d += s;
                } else {
                    for (u32 j = 0; j < m; j++) d += table[j * 16u + ((hg_pq_byte(w, row, j >> 1) >> (4u * (j & 1u))) & 15u)];
                }
                u32 slot = slots[r];
                if (d <= thr && !hg_dead(skip, slot)) hg_push(sh, &st, kcap, sortn, d, slot);
            }
            // The next round's merge check must see every push of this one.
            __syncthreads();
        }
    }
    if (st.count > 0) hg_merge(sh, &st, k, kcap, sortn, 1.0f, 0.0f);
    for (u32 i = t; i < k; i += blockDim.x) out[(u64)q * k + i] = sh[i];
}
