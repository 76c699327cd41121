// Scans of coded inverted lists: SQ8 codes (IVF-SQ8 and the flat SQ8 index), product-quantized
// codes (IVF-PQ and the flat PQ index) and binary codes (backend/codes.rs, pq.rs and bits.rs
// document each code and its distance). One block per query scores every row of the lists it
// probes, a row per thread, from terms it readies per list in shared memory.

// Bytes of each row a scan stages in shared memory per pass, and the pitch of a staged row: 4
// bytes more makes it an odd number of words, so the threads reading word w of their own rows
// hit 32 different banks.
#define HG_CODE_CHUNK 128u
#define HG_CODE_PITCH (HG_CODE_CHUNK + 4u)
// Rows of whole words shorter than this are read by their threads straight from memory: for
// 16-byte PQ rows (4 KiB a round) the staging's two barriers per pass cost more than they save,
// while 128-byte SQ8 rows gained several times from it (docs/PERFORMANCE.md, quantized IVF on
// CUDA).
#define HG_CODE_STAGE_MIN 64u

// Byte i of a staged row (whole words in shared memory).
__device__ __forceinline__ u32 hg_staged_byte(const u32* w, u32 i) { return (w[i >> 2] >> (8u * (i & 3u))) & 255u; }

// The skeleton every coded scan shares. Launch contract: grid (queries), block HG_BLOCK.
// Block q takes query q's lists probes[q * nprobe ..]; for each list l every thread calls
// `scorer.list(l)`, which readies the list's terms in shared memory and ends at a barrier.
// Rows offsets[l] .. offsets[l + 1] of `codes` (row_bytes each, one list's rows side by side)
// are then scored HG_BLOCK at a time, a row per thread: its thread starts with
// `scorer.begin(r)`, adds every HG_CODE_CHUNK bytes of the row by `scorer.chunk` in order
// (the block first copies that part of all the round's rows into `tile`, reading memory in
// order; rows of whole words under HG_CODE_STAGE_MIN bytes are read in place instead), and
// ends with `scorer.finish`. The block keeps its k best (distance, slot) entries as
// the exact scan does (hg_push / hg_merge without a band: mul 1, add 0), skipping slots set in
// the bitmap `skip` (null: none), and writes them ascending to out[q * k ..] (all ones past the
// rows it found). k <= kcap and sortn - kcap >= HG_BLOCK (a round's pushes fit the buffer).
// `sh` is sortn u64s of shared memory, `tile` HG_BLOCK * HG_CODE_PITCH bytes, 4-byte aligned.
template <class S>
__device__ void hg_coded_scan(S& scorer, const u8* codes, u32 row_bytes, const u32* offsets, const u32* slots,
                              const u32* probes, u32 nprobe, const u32* skip, u32 k, u32 kcap, u32 sortn, u64* out,
                              u64* sh, u8* tile) {
    __shared__ HgTopK st;
    u32 q = blockIdx.x, t = threadIdx.x;
    hg_init(sh, &st, kcap, 0, HG_NONE, k, 1.0f, 0.0f);
    u32 bcap = sortn - kcap;
    bool words = (row_bytes & 3u) == 0;
    // Short rows of whole words: each thread reads its own (row_bytes <= HG_CODE_CHUNK, so
    // one chunk covers it).
    bool direct = words && row_bytes < HG_CODE_STAGE_MIN;
    const u32* mine = (const u32*)(tile + t * HG_CODE_PITCH);
    for (u32 p = 0; p < nprobe; p++) {
        u32 l = probes[(u64)q * nprobe + p];
        scorer.list(l);
        u32 end = offsets[l + 1];
        for (u32 first = offsets[l]; first < end; first += blockDim.x) {
            if (hg_must_merge(&st, blockDim.x, bcap)) hg_merge(sh, &st, k, kcap, sortn, 1.0f, 0.0f);
            float thr = st.thr;
            u32 n = min((u32)blockDim.x, end - first);
            u32 r = first + t;
            float acc = t < n ? scorer.begin(r) : 0.0f;
            const u8* rows = codes + (u64)first * row_bytes;
            if (direct) {
                if (t < n) acc = scorer.chunk(acc, (const u32*)(rows + (u64)t * row_bytes), 0, row_bytes);
            }
            for (u32 c0 = 0; c0 < row_bytes && !direct; c0 += HG_CODE_CHUNK) {
                u32 cb = min(HG_CODE_CHUNK, row_bytes - c0);
                if (words) {
                    u32 cw = cb / 4u;
                    for (u32 i = t; i < n * cw; i += blockDim.x) {
                        u32 row = i / cw, w = i % cw;
                        ((u32*)(tile + row * HG_CODE_PITCH))[w] = ((const u32*)(rows + (u64)row * row_bytes + c0))[w];
                    }
                } else {
                    for (u32 i = t; i < n * cb; i += blockDim.x) {
                        u32 row = i / cb, b = i % cb;
                        tile[row * HG_CODE_PITCH + b] = rows[(u64)row * row_bytes + c0 + b];
                    }
                }
                __syncthreads();
                if (t < n) acc = scorer.chunk(acc, mine, c0, cb);
                // The next pass (or round) overwrites the tile.
                __syncthreads();
            }
            if (t < n) {
                float d = scorer.finish(acc, r);
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

    __device__ float begin(u32) const { return 0.0f; }

    __device__ float chunk(float acc, const u32* w, u32 c0, u32 cb) const {
        const float* wt = weights + c0;
        u32 i = 0;
        for (; i + 4u <= cb; i += 4u) {
            u32 v = w[i >> 2];
            acc = fmaf(wt[i], (float)(v & 255u), acc);
            acc = fmaf(wt[i + 1], (float)((v >> 8) & 255u), acc);
            acc = fmaf(wt[i + 2], (float)((v >> 16) & 255u), acc);
            acc = fmaf(wt[i + 3], (float)(v >> 24), acc);
        }
        for (; i < cb; i++) acc = fmaf(wt[i], (float)hg_staged_byte(w, i), acc);
        return acc;
    }

    __device__ float finish(float acc, u32 r) const {
        float a = (float)*offset + acc;
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
    // Dynamic shared memory: sortn u64s, the tile, then the query and the weights (dim floats each).
    u8* tile = (u8*)(hg_smem + sortn);
    float* query = (float*)(tile + HG_BLOCK * HG_CODE_PITCH);
    float* weights = query + dim;
    for (u32 c = threadIdx.x; c < dim; c += blockDim.x) query[c] = queries[(u64)blockIdx.x * dim + c];
    __syncthreads();
    HgSq8Scorer scorer{terms, centroids, base, step, query, dim, metric, weights, scratch, &offset};
    hg_coded_scan(scorer, codes, dim, offsets, slots, probes, nprobe, skip, k, kcap, sortn, out, hg_smem, tile);
}

// PQ: query q's table (entry j * 2^bits + c is -w q_j . codebook_j[c], w = 2 under L2 and 1
// otherwise, the products summed in order by fmaf as the host's GEMM does) serves every list;
// per list the term |q - centroid|^2 under L2, else -(q . centroid), in f64; a row adds in the
// host's order (backend/pq.rs scan_query): the list term plus the row's stored term under L2
// (0 otherwise), then the lookups (8-bit codes summed apart first, 4-bit codes one by one).
struct HgPqScorer {
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

    __device__ float fixed(u32 r) const { return (float)*list_term + (metric == HG_L2 ? terms[r] : 0.0f); }

    __device__ float begin(u32 r) const { return bits == 8 ? 0.0f : fixed(r); }

    __device__ float chunk(float acc, const u32* w, u32 c0, u32 cb) const {
        if (bits == 8) {
            const float* tb = table + c0 * 256u;
            for (u32 i = 0; i < cb; i++) acc += tb[i * 256u + hg_staged_byte(w, i)];
        } else {
            for (u32 i = 0; i < cb; i++) {
                u32 byte = hg_staged_byte(w, i), j = 2u * (c0 + i);
                acc += table[j * 16u + (byte & 15u)];
                if (j + 1u < m) acc += table[(j + 1u) * 16u + (byte >> 4)];
            }
        }
        return acc;
    }

    __device__ float finish(float acc, u32 r) const { return bits == 8 ? fixed(r) + acc : acc; }
};

extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_pq_scan(const u8* codes, u32 row_bytes, const float* terms,
        const u32* offsets, const u32* slots, const float* centroids, const float* codebooks, u32 m, u32 bits,
        const u32* probes, u32 nprobe, const float* queries, u32 dim, const u32* skip, int metric, u32 k, u32 kcap,
        u32 sortn, u64* out) {
    extern __shared__ __align__(16) u64 hg_smem[];
    __shared__ double scratch[HG_BLOCK];
    __shared__ double list_term;
    // Dynamic shared memory: sortn u64s, the tile, the table (m << bits floats), then the query.
    u32 ksub = 1u << bits, sub = dim / m;
    u8* tile = (u8*)(hg_smem + sortn);
    float* table = (float*)(tile + HG_BLOCK * HG_CODE_PITCH);
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
    HgPqScorer scorer{terms, centroids, query, table, m, bits, dim, metric, scratch, &list_term};
    hg_coded_scan(scorer, codes, row_bytes, offsets, slots, probes, nprobe, skip, k, kcap, sortn, out, hg_smem, tile);
}

// Binary codes: per list the query's bits against the centroid (set where it exceeds it,
// little-endian in 64-bit words, padding 0, read here as 32-bit halves); a row's distance is
// the number of differing bits.
struct HgBitsScorer {
    const float* centroids;
    const float* query;
    u32 dim;
    u64* bits;

    __device__ void list(u32 l) {
        const float* centroid = centroids + (u64)l * dim;
        for (u32 w = threadIdx.x; w < (dim + 63u) / 64u; w += blockDim.x) {
            u64 word = 0;
            for (u32 b = 0; b < 64u && w * 64u + b < dim; b++) word |= (u64)(query[w * 64u + b] > centroid[w * 64u + b]) << b;
            bits[w] = word;
        }
        __syncthreads();
    }

    __device__ float begin(u32) const { return 0.0f; }

    __device__ float chunk(float acc, const u32* w, u32 c0, u32 cb) const {
        const u32* q = (const u32*)bits + c0 / 4u;
        u32 count = 0;
        for (u32 i = 0; i < cb / 4u; i++) count += __popc(w[i] ^ q[i]);
        return acc + (float)count;
    }

    __device__ float finish(float acc, u32) const { return acc; }
};

extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_bits_scan(const u8* codes, const u32* offsets,
        const u32* slots, const float* centroids, const u32* probes, u32 nprobe, const float* queries, u32 dim,
        const u32* skip, u32 k, u32 kcap, u32 sortn, u64* out) {
    extern __shared__ __align__(16) u64 hg_smem[];
    // Dynamic shared memory: sortn u64s, the tile, the query's bits (whole words), then the query.
    u32 words = (dim + 63u) / 64u;
    u8* tile = (u8*)(hg_smem + sortn);
    u64* bits = (u64*)(tile + HG_BLOCK * HG_CODE_PITCH);
    float* query = (float*)(bits + words);
    for (u32 c = threadIdx.x; c < dim; c += blockDim.x) query[c] = queries[(u64)blockIdx.x * dim + c];
    __syncthreads();
    HgBitsScorer scorer{centroids, query, dim, bits};
    hg_coded_scan(scorer, codes, words * 8u, offsets, slots, probes, nprobe, skip, k, kcap, sortn, out, hg_smem, tile);
}
