// Scans of coded inverted lists: SQ8 codes (IVF-SQ8 and the flat SQ8 index), product-quantized
// codes (IVF-PQ and the flat PQ index) and binary codes (backend/codes.rs, pq.rs and bits.rs
// document each code and its distance). One block per query scores every row of the lists it
// probes, a row per thread, from terms it readies per list in shared memory.

// Byte i of a row whose 32-bit words are `w` (rows of whole words, else null) or bytes `b`.
__device__ __forceinline__ u32 hg_code_byte(const u32* w, const u8* b, u32 i) {
    return w ? (w[i >> 2] >> (8u * (i & 3u))) & 255u : (u32)b[i];
}

// The skeleton every coded scan shares. Launch contract: grid (queries), block HG_BLOCK.
// Block q takes query q's lists probes[q * nprobe ..]; for each list l every thread calls
// `scorer.list(l)`, which readies the list's terms in shared memory and ends at a barrier,
// then rows offsets[l] .. offsets[l + 1] are scored a row per thread by `scorer.row(r)`. The
// block keeps its k best (distance, slot) entries as the exact scan does (hg_push / hg_merge
// without a band: mul 1, add 0), skipping slots set in the bitmap `skip` (null: none), and
// writes them ascending to out[q * k ..] (all ones past the rows it found). k <= kcap and
// sortn - kcap >= HG_BLOCK (a round's pushes fit the buffer). `sh` is sortn u64s of shared memory.
template <class S>
__device__ void hg_coded_scan(S& scorer, const u32* offsets, const u32* slots, const u32* probes, u32 nprobe,
                              const u32* skip, u32 k, u32 kcap, u32 sortn, u64* out, u64* sh) {
    __shared__ HgTopK st;
    u32 q = blockIdx.x, t = threadIdx.x;
    hg_init(sh, &st, kcap, 0, HG_NONE, k, 1.0f, 0.0f);
    u32 bcap = sortn - kcap;
    for (u32 p = 0; p < nprobe; p++) {
        u32 l = probes[(u64)q * nprobe + p];
        scorer.list(l);
        u32 end = offsets[l + 1];
        for (u32 first = offsets[l]; first < end; first += blockDim.x) {
            if (hg_must_merge(&st, blockDim.x, bcap)) hg_merge(sh, &st, k, kcap, sortn, 1.0f, 0.0f);
            float thr = st.thr;
            u32 r = first + t;
            if (r < end) {
                float d = scorer.row(r);
                u32 slot = slots[r];
                if (d <= thr && !hg_dead(skip, slot)) hg_push(sh, &st, kcap, sortn, d, slot);
            }
            // The next round's merge check, and the next list's terms, come after every read
            // and push of this round.
            __syncthreads();
        }
    }
    if (st.count > 0) hg_merge(sh, &st, k, kcap, sortn, 1.0f, 0.0f);
    for (u32 i = t; i < k; i += blockDim.x) out[(u64)q * k + i] = sh[i];
}

// The sum over the block of each thread's `v` into *result, in f64 (every thread calls it;
// `scratch` holds HG_BLOCK doubles of shared memory; thread 0 adds them in order).
__device__ void hg_block_sum_f64(double v, double* scratch, double* result) {
    scratch[threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double sum = 0.0;
        for (u32 i = 0; i < blockDim.x; i++) sum += scratch[i];
        *result = sum;
    }
    __syncthreads();
}

// SQ8: a row of list l is centroid_l + base + step * c. Per list the query's weights
// (-2 u step under L2 with u = q - centroid_l, else -q step) and offset (sum of u^2 - 2 u base,
// else -q . (centroid_l + base)) are computed in f64 and rounded, as the host does
// (CodeScan::terms); a row is offset + weights . c (by fmaf in order), plus its stored term
// under L2.
struct HgSq8Scorer {
    const u8* codes;
    const float* terms;
    const float* centroids;
    const float* base;
    const float* step;
    const float* query;
    u32 dim;
    int metric;
    float* weights;
    double* scratch;
    double* offset;

    __device__ void list(u32 l) {
        const float* centroid = centroids + (u64)l * dim;
        double part = 0.0;
        for (u32 d = threadIdx.x; d < dim; d += blockDim.x) {
            double x = query[d];
            if (metric == HG_L2) {
                double u = x - (double)centroid[d];
                part += u * u - 2.0 * u * (double)base[d];
                weights[d] = (float)(-2.0 * u * (double)step[d]);
            } else {
                part -= x * ((double)centroid[d] + (double)base[d]);
                weights[d] = (float)(-x * (double)step[d]);
            }
        }
        hg_block_sum_f64(part, scratch, offset);
    }

    __device__ float row(u32 r) const {
        const u8* c = codes + (u64)r * dim;
        const u32* w = (dim & 3u) == 0 ? (const u32*)c : 0;
        float p = 0.0f;
        for (u32 d = 0; d < dim; d++) p = fmaf(weights[d], (float)hg_code_byte(w, c, d), p);
        float a = (float)*offset + p;
        return metric == HG_L2 ? a + terms[r] : a;
    }
};

extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_sq8_scan(const u8* codes, const float* terms,
        const u32* offsets, const u32* slots, const float* centroids, const float* base, const float* step,
        const u32* probes, u32 nprobe, const float* queries, u32 dim, const u32* skip, int metric, u32 k, u32 kcap,
        u32 sortn, u64* out) {
    extern __shared__ __align__(16) u64 hg_smem[];
    __shared__ double scratch[HG_BLOCK];
    __shared__ double offset;
    // Dynamic shared memory: sortn u64s, then the query, then the weights (dim floats each).
    float* query = (float*)(hg_smem + sortn);
    float* weights = query + dim;
    for (u32 c = threadIdx.x; c < dim; c += blockDim.x) query[c] = queries[(u64)blockIdx.x * dim + c];
    __syncthreads();
    HgSq8Scorer scorer{codes, terms, centroids, base, step, query, dim, metric, weights, scratch, &offset};
    hg_coded_scan(scorer, offsets, slots, probes, nprobe, skip, k, kcap, sortn, out, hg_smem);
}

// PQ: query q's table (entry j * 2^bits + c is -w q_j . codebook_j[c], w = 2 under L2 and 1
// otherwise, the products summed in order by fmaf as the host's GEMM does) serves every list;
// per list the term |q - centroid|^2 under L2, else -(q . centroid), in f64; a row adds in the
// host's order (backend/pq.rs scan_query): the list term, the row's stored term under L2, then
// the lookups (8-bit codes summed apart first, 4-bit codes one by one).
struct HgPqScorer {
    const u8* codes;
    u32 row_bytes;
    const float* terms;
    const float* centroids;
    const float* query;
    const float* table;
    u32 m, bits, dim;
    int metric;
    double* scratch;
    double* list_term;

    __device__ void list(u32 l) {
        const float* centroid = centroids + (u64)l * dim;
        double part = 0.0;
        for (u32 c = threadIdx.x; c < dim; c += blockDim.x) {
            double a = query[c], b = centroid[c];
            part += metric == HG_L2 ? (a - b) * (a - b) : -(a * b);
        }
        hg_block_sum_f64(part, scratch, list_term);
    }

    __device__ float row(u32 r) const {
        const u8* row = codes + (u64)r * row_bytes;
        const u32* w = (row_bytes & 3u) == 0 ? (const u32*)row : 0;
        float d = (float)*list_term;
        if (metric == HG_L2) d += terms[r];
        if (bits == 8) {
            float s = 0.0f;
            for (u32 j = 0; j < m; j++) s += table[j * 256u + hg_code_byte(w, row, j)];
            d += s;
        } else {
            for (u32 j = 0; j < m; j++) d += table[j * 16u + ((hg_code_byte(w, row, j >> 1) >> (4u * (j & 1u))) & 15u)];
        }
        return d;
    }
};

extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_pq_scan(const u8* codes, u32 row_bytes, const float* terms,
        const u32* offsets, const u32* slots, const float* centroids, const float* codebooks, u32 m, u32 bits,
        const u32* probes, u32 nprobe, const float* queries, u32 dim, const u32* skip, int metric, u32 k, u32 kcap,
        u32 sortn, u64* out) {
    extern __shared__ __align__(16) u64 hg_smem[];
    __shared__ double scratch[HG_BLOCK];
    __shared__ double list_term;
    // Dynamic shared memory: sortn u64s, then the table (m << bits floats), then the query.
    u32 ksub = 1u << bits, sub = dim / m;
    float* table = (float*)(hg_smem + sortn);
    float* query = table + m * ksub;
    for (u32 c = threadIdx.x; c < dim; c += blockDim.x) query[c] = queries[(u64)blockIdx.x * dim + c];
    __syncthreads();
    float weight = metric == HG_L2 ? -2.0f : -1.0f;
    for (u32 i = threadIdx.x; i < m * ksub; i += blockDim.x) {
        const float* book = codebooks + (u64)i * sub;
        const float* part = query + (i >> bits) * sub;
        float acc = 0.0f;
        for (u32 s = 0; s < sub; s++) acc = fmaf(part[s], book[s], acc);
        table[i] = weight * acc;
    }
    // (hg_coded_scan's first barrier, in hg_init, comes before any lookup.)
    HgPqScorer scorer{codes, row_bytes, terms, centroids, query, table, m, bits, dim, metric, scratch, &list_term};
    hg_coded_scan(scorer, offsets, slots, probes, nprobe, skip, k, kcap, sortn, out, hg_smem);
}

// Binary codes: per list the query's bits against the centroid (set where it exceeds it,
// little-endian in 64-bit words, padding 0); a row's distance is the number of differing bits.
struct HgBitsScorer {
    const u64* codes;
    u32 words;
    const float* centroids;
    const float* query;
    u32 dim;
    u64* bits;

    __device__ void list(u32 l) {
        const float* centroid = centroids + (u64)l * dim;
        __syncthreads();
        for (u32 w = threadIdx.x; w < words; w += blockDim.x) {
            u64 word = 0;
            for (u32 b = 0; b < 64 && w * 64 + b < dim; b++) word |= (u64)(query[w * 64 + b] > centroid[w * 64 + b]) << b;
            bits[w] = word;
        }
        __syncthreads();
    }

    __device__ float row(u32 r) const {
        const u64* code = codes + (u64)r * words;
        u32 count = 0;
        for (u32 w = 0; w < words; w++) count += __popcll(code[w] ^ bits[w]);
        return (float)count;
    }
};

extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_bits_scan(const u64* codes, const u32* offsets,
        const u32* slots, const float* centroids, const u32* probes, u32 nprobe, const float* queries, u32 dim,
        const u32* skip, u32 k, u32 kcap, u32 sortn, u64* out) {
    extern __shared__ __align__(16) u64 hg_smem[];
    // Dynamic shared memory: sortn u64s, then the query's bits (whole words), then the query.
    u32 words = (dim + 63u) / 64u;
    u64* bits = hg_smem + sortn;
    float* query = (float*)(bits + words);
    for (u32 c = threadIdx.x; c < dim; c += blockDim.x) query[c] = queries[(u64)blockIdx.x * dim + c];
    __syncthreads();
    HgBitsScorer scorer{codes, words, centroids, query, dim, bits};
    hg_coded_scan(scorer, offsets, slots, probes, nprobe, skip, k, kcap, sortn, out, hg_smem);
}
