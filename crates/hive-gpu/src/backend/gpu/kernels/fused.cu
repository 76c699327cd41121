// Batch search fused with its filter on tensor cores (CUDA, compute capability 8.0 and later;
// only compiled there). A block keeps 128 queries in shared memory, multiplies them by tiles of
// 128 stored rows with mma.sync, turns the products into approximate distances in registers and
// appends each one at or below its query's threshold to that query's candidate buffer. No distance matrix is ever written: the
// host picks thresholds from an exact search of a sample of the rows, so few rows pass, and the
// finalize kernel proves afterwards that no row inside the band was left out (search.rs).

#define HG_MMA_TILE 128
// Bytes of every row staged per pipeline step (32 f32 or 64 f16 components), and the padded
// pitch of a staged row: 36 words put the 8 rows x 4 columns of a fragment load in 32 banks.
// The 4 spare words of lines 0-31 of a tile's last step carry the tile's 128 norms, copied with
// the rows, so the filter reads them from shared memory instead of waiting on global loads.
// Shared memory: the query tile (hg_mma_query_pitch words per line), then the stages; the host
// computes the same size (kernels.rs, mma_shared_bytes).
#define HG_MMA_STEP_BYTES 128
#define HG_MMA_PITCH_WORDS 36
// Stages of the row pipeline: 3, or 2 for f32 rows, whose larger query tile would otherwise
// leave room for one block per multiprocessor (8 warps do not hide the loads' latency).
#define HG_MMA_STAGES(T) (sizeof(T) == 4 ? 2 : 3)
#define HG_MMA_STAGE_WORDS (HG_MMA_TILE * HG_MMA_PITCH_WORDS)

__device__ __forceinline__ u32 hg_shared_address(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared without passing through registers; an invalid source fills zeros.
__device__ __forceinline__ void hg_copy16(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// Up to 16 bytes global -> shared, the rest of the 16 zero-filled.
__device__ __forceinline__ void hg_copy_bytes(u32 dst, const void* src, u32 bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void hg_copy_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void hg_copy_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// One 16 x 8 x (8 TF32 | 16 f16) product added to c. Operand registers hold the same words
// for both types: 4-byte units at (row g | g + 8, word t | t + 4) of A and (query g, word t |
// t + 4) of B, g = lane / 4, t = lane % 4 (PTX ISA, "Matrix fragments for mma.m16n8k8 / k16").
template <typename T> __device__ __forceinline__ void hg_mma(float* c, const u32* a, const u32* b);
template <> __device__ __forceinline__ void hg_mma<float>(float* c, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void hg_mma<u16>(float* c, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8 x 8 matrices of 16-bit pairs from shared memory: lane l gets word l % 4 of row l / 4
// of each; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void hg_ldsm4(u32& r0, u32& r1, u32& r2, u32& r3, u32 address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(address));
}

// Queues step `step` (bytes [step * 128, +128) of every row) of the 128-row tile at row0 into
// `stage`: 128 lines of 8 16-byte pieces, 4 per thread.
__device__ __forceinline__ void hg_mma_stage(u32 stage, const char* rows, u32 row0, u32 n, u32 row_bytes, u32 step) {
#pragma unroll
    for (int l = 0; l < 4; l++) {
        u32 piece = threadIdx.x + l * HG_BLOCK;
        u32 line = piece / 8, col = (piece % 8) * 16;
        u32 byte = step * HG_MMA_STEP_BYTES + col;
        bool ok = row0 + line < n && byte < row_bytes;
        // Invalid pieces still need a mapped address; the copy reads nothing from it.
        hg_copy16(stage + (line * HG_MMA_PITCH_WORDS) * 4 + col, rows + (ok ? (u64)(row0 + line) * row_bytes + byte : 0),
                  ok);
    }
}

// Words of one resident query line: whole steps plus 4, which keeps fragment loads free of
// bank conflicts as in the staged rows.
__device__ __forceinline__ u32 hg_mma_query_pitch(u32 steps) { return steps * (HG_MMA_STEP_BYTES / 4) + 4; }

// A row that passed its query's threshold (rare): skip padding and removed rows, else append.
__device__ __noinline__ void hg_mma_push(u32 q, u32 row, float d, u32 n, const u32* dead, u32 cap, u64* cand,
                                         u32* counts, u64* evicted) {
    if (row >= n || hg_dead(dead, row)) return;
    u64 entry = hg_entry(d, row);
    u32 pos = atomicAdd(&counts[q], 1u);
    if (pos < cap) cand[(u64)q * cap + pos] = entry;
    else atomicMin(&evicted[q], entry);
}

// grid (query tiles, row groups), block HG_BLOCK, dynamic shared memory for the resident query
// tile (128 lines of hg_mma_query_pitch words) and HG_MMA_STAGES(T) staged row steps. Block (x, y)
// keeps queries [x * 128, +128) in shared memory and streams the 128-row tiles
// [y * tiles, (y + 1) * tiles) through a pipeline that runs across tile boundaries. Blocks
// with consecutive x run together on the same rows, which they then share in L2.
// Eight warps in 2 (rows) x 4 (queries) each own 64 x 32 products of a tile, their operands
// loaded by ldmatrix (one instruction per 16 x 8 words instead of four).
// Distances follow hg_tile_topk's formulas, so the host's gate applies unchanged. The f16
// path's scale is a power of two: folding it into L2's -2 changes no bit, except where the
// scaled product is subnormal, and there it only removes a rounding. The
// metric is a template parameter: the filter runs once per product and must stay a few
// instructions. row_bytes = dim * sizeof(T) must be a multiple of 16. Candidate q's buffer holds
// `cap` entries; an entry that finds it full lowers evicted[q] instead, so finalize flags the
// query if that entry was inside the band.
template <typename T, int METRIC>
__device__ void hg_mma_filter(const T* rows, const float* norms, const u32* dead, u32 n, u32 tiles, u32 dim,
                              const T* queries, u32 nq, const float* inv_scale, const float* tau, u32 cap,
                              u64* cand, u32* counts, u64* evicted) {
    extern __shared__ __align__(16) u64 hg_smem[];
    u32* words = (u32*)hg_smem;
    u32 row_bytes = dim * (u32)sizeof(T);
    u32 steps = (row_bytes + HG_MMA_STEP_BYTES - 1) / HG_MMA_STEP_BYTES;
    u32 qpitch = hg_mma_query_pitch(steps);
    u32* staged = words + HG_MMA_TILE * qpitch;
    u32 staged_base = hg_shared_address(staged);
    u32 q0 = blockIdx.x * HG_MMA_TILE;
    u32 first_tile = blockIdx.y * tiles;
    u32 row_tiles = (n + HG_MMA_TILE - 1) / HG_MMA_TILE;
    u32 my_tiles = first_tile < row_tiles ? min(tiles, row_tiles - first_tile) : 0;
    u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    u32 g = lane / 4, t = lane % 4;
    u32 warp_row = (warp % 2) * 64, warp_query = (warp / 2) * 32;
    const char* row_src = (const char*)rows;

    // The query tile, zero-filled past the dimension and past the last query.
    u32 query_base = hg_shared_address(words);
    u32 pieces_per_line = steps * (HG_MMA_STEP_BYTES / 16);
    for (u32 piece = threadIdx.x; piece < HG_MMA_TILE * pieces_per_line; piece += HG_BLOCK) {
        u32 line = piece / pieces_per_line, byte = (piece % pieces_per_line) * 16;
        bool ok = q0 + line < nq && byte < row_bytes;
        hg_copy16(query_base + (line * qpitch) * 4 + byte,
                  (const char*)queries + (ok ? (u64)(q0 + line) * row_bytes + byte : 0), ok);
    }
    hg_copy_commit();

    // The pipeline's next load: (tile, step) pairs in order, HG_MMA_STAGES(T) - 1 ahead.
    u32 load_tile = 0, load_step = 0, load_stage = 0;
    auto load_next = [&]() {
        if (load_tile < my_tiles) {
            u32 row0 = (first_tile + load_tile) * HG_MMA_TILE;
            hg_mma_stage(staged_base + load_stage * HG_MMA_STAGE_WORDS * 4, row_src, row0, n, row_bytes, load_step);
            // With the tile's last step, its 128 norms: four in the padding of each of lines 0-31.
            if (METRIC != HG_DOT && load_step + 1 == steps && threadIdx.x < HG_MMA_TILE / 4) {
                u32 row = row0 + 4 * threadIdx.x;
                u32 bytes = row < n ? 4u * min(n - row, 4u) : 0u;
                hg_copy_bytes(staged_base + (load_stage * HG_MMA_STAGE_WORDS + threadIdx.x * HG_MMA_PITCH_WORDS + 32) * 4,
                              norms + (bytes ? row : 0), bytes);
            }
        }
        hg_copy_commit();
        if (++load_step == steps) {
            load_step = 0;
            load_tile++;
        }
        load_stage = load_stage + 1 == HG_MMA_STAGES(T) ? 0 : load_stage + 1;
    };
#pragma unroll
    for (int s = 0; s < HG_MMA_STAGES(T) - 1; s++) load_next();

    // Per query of this thread: its threshold (-inf past the last query: nothing passes) and
    // the factor of its products (-2 / scale for L2, -1 / scale otherwise).
    float limit[4][2], factor[4][2];
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            u32 q = q0 + warp_query + nt * 8 + 2 * t + e2;
            float scale = (q < nq && inv_scale) ? inv_scale[q] : 1.0f;
            limit[nt][e2] = q < nq ? tau[q] : -__uint_as_float(0x7f800000u);
            factor[nt][e2] = (METRIC == HG_L2 ? -2.0f : -1.0f) * scale;
        }
    float acc[4][4][4];
    auto clear = [&]() {
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f;
    };
    clear();

    // ldmatrix row addresses of this lane: lanes 8i..8i+7 name the rows of matrix i. For the
    // row fragment, matrices are (rows 0-7 | 8-15) x (words 0-3 | 4-7), row half first; for a
    // pair of query fragments, (queries 0-7 | 8-15) x (words 0-3 | 4-7), word half first.
    u32 mi = lane / 8, mr = lane % 8;
    u32 a_lane = staged_base + ((warp_row + mr + 8 * (mi & 1)) * HG_MMA_PITCH_WORDS + 4 * (mi >> 1)) * 4;
    u32 b_lane = query_base + ((warp_query + mr + 8 * (mi >> 1)) * qpitch + 4 * (mi & 1)) * 4;
    u32 stage = 0, last_stage = 0;
    for (u32 tile = 0; tile < my_tiles; tile++) {
        for (u32 step = 0; step < steps; step++) {
            hg_copy_wait<HG_MMA_STAGES(T) - 2>();
            // The stage read below is complete for every thread, and the one refilled next
            // was last read in the previous step, which every thread has finished.
            __syncthreads();
            load_next();
            u32 stage_off = stage * HG_MMA_STAGE_WORDS * 4;
            last_stage = stage;
            stage = stage + 1 == HG_MMA_STAGES(T) ? 0 : stage + 1;
#pragma unroll
            for (u32 kk = 0; kk < 4; kk++) {
                u32 a[4][4], b[4][2];
#pragma unroll
                for (int mt = 0; mt < 4; mt++)
                    hg_ldsm4(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
                             a_lane + (u32)(mt * 16 * HG_MMA_PITCH_WORDS * 4) + stage_off + kk * 32);
#pragma unroll
                for (int np = 0; np < 2; np++)
                    hg_ldsm4(b[2 * np][0], b[2 * np][1], b[2 * np + 1][0], b[2 * np + 1][1],
                             b_lane + np * 16 * qpitch * 4 + step * HG_MMA_STEP_BYTES + kk * 32);
#pragma unroll
                for (int mt = 0; mt < 4; mt++)
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) hg_mma<T>(acc[mt][nt], a[mt], b[nt]);
            }
        }

        // The tile is complete: accumulator e of (mt, nt) is row g (e < 2) or g + 8 of the m
        // tile, query 2t + e % 2. Distances replace the products in place; one branch per
        // tile finds the rare passing ones. The tile's norms sit in the last step's padding.
        u32 row0 = (first_tile + tile) * HG_MMA_TILE + warp_row + g;
        const float* tile_norms = (const float*)staged + last_stage * HG_MMA_STAGE_WORDS;
        bool any = false;
#pragma unroll
        for (int mt = 0; mt < 4; mt++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                u32 r = warp_row + g + mt * 16 + half * 8;
                float norm = METRIC != HG_DOT ? tile_norms[(r / 4) * HG_MMA_PITCH_WORDS + 32 + r % 4] : 0.0f;
                float root = METRIC == HG_COS ? sqrtf(norm) : 1.0f;
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
#pragma unroll
                    for (int e2 = 0; e2 < 2; e2++) {
                        float p = acc[mt][nt][half * 2 + e2];
                        float d;
                        if (METRIC == HG_L2) d = fmaf(factor[nt][e2], p, norm);
                        else if (METRIC == HG_DOT) d = factor[nt][e2] * p;
                        else d = (factor[nt][e2] * p) / root;
                        acc[mt][nt][half * 2 + e2] = d;
                        any |= d <= limit[nt][e2];
                    }
                }
            }
        }
        if (any) {
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int half = 0; half < 2; half++)
#pragma unroll
                    for (int nt = 0; nt < 4; nt++)
#pragma unroll
                        for (int e2 = 0; e2 < 2; e2++) {
                            float d = acc[mt][nt][half * 2 + e2];
                            if (d <= limit[nt][e2])
                                hg_mma_push(q0 + warp_query + nt * 8 + 2 * t + e2, row0 + mt * 16 + half * 8, d, n,
                                            dead, cap, cand, counts, evicted);
                        }
        }
        clear();
    }
    hg_copy_wait<0>();
}

template <typename T>
__device__ __forceinline__ void hg_mma_filter_metric(const T* rows, const float* norms, const u32* dead, u32 n,
        u32 tiles, u32 dim, const T* queries, u32 nq, const float* inv_scale, const float* tau, int metric, u32 cap,
        u64* cand, u32* counts, u64* evicted) {
    if (metric == HG_L2)
        hg_mma_filter<T, HG_L2>(rows, norms, dead, n, tiles, dim, queries, nq, inv_scale, tau, cap, cand, counts, evicted);
    else if (metric == HG_DOT)
        hg_mma_filter<T, HG_DOT>(rows, norms, dead, n, tiles, dim, queries, nq, inv_scale, tau, cap, cand, counts, evicted);
    else
        hg_mma_filter<T, HG_COS>(rows, norms, dead, n, tiles, dim, queries, nq, inv_scale, tau, cap, cand, counts, evicted);
}

extern "C" __global__ void __launch_bounds__(HG_BLOCK, 2) hg_mma_filter_tf32(const float* rows, const float* norms,
        const u32* dead, u32 n, u32 tiles, u32 dim, const float* queries, u32 nq, const float* inv_scale,
        const float* tau, int metric, u32 cap, u64* cand, u32* counts, u64* evicted) {
    hg_mma_filter_metric<float>(rows, norms, dead, n, tiles, dim, queries, nq, inv_scale, tau, metric, cap, cand,
                                counts, evicted);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK, 2) hg_mma_filter_f16(const u16* rows, const float* norms,
        const u32* dead, u32 n, u32 tiles, u32 dim, const u16* queries, u32 nq, const float* inv_scale,
        const float* tau, int metric, u32 cap, u64* cand, u32* counts, u64* evicted) {
    hg_mma_filter_metric<u16>(rows, norms, dead, n, tiles, dim, queries, nq, inv_scale, tau, metric, cap, cand,
                              counts, evicted);
}
