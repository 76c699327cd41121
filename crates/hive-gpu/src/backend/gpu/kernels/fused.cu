// Batch search fused with its filter on tensor cores (CUDA, compute capability 8.0 and later;
// only compiled there). A block keeps 128 queries in shared memory, multiplies them by tiles of
// 128 stored rows with mma.sync, turns the products into approximate distances in registers and
// appends each one at or below its query's threshold to that query's candidate buffer. No
// distance matrix is ever written: the thresholds come from the queries' products with a sample
// of the rows (hg_sample_tau), so few rows pass, and the finalize kernel proves afterwards that
// no row inside the band was left out, or flags the query (search.rs).

#define HG_MMA_TILE 128
// Bytes of every row staged per pipeline step (32 f32 or 64 f16 components), and the padded
// pitch of a staged row: 36 words put the 8 rows x 4 columns of a fragment load in 32 banks.
// The 4 spare words of lines 0-31 of a tile's last step carry the tile's 128 norms, copied with
// the rows, so the filter reads them from shared memory instead of waiting on global loads.
// Shared memory: the query tile (hg_mma_query_pitch words per line), then the stages; the host
// computes the same size (kernels.rs, mma_shared_bytes).
#define HG_MMA_STEP_BYTES 128
#define HG_MMA_PITCH_WORDS 36
// Stages of the row pipeline: 3, or 2 for f32 rows multiplied on TF32, whose larger query tile
// would otherwise leave room for one block per multiprocessor (8 warps do not hide the loads'
// latency). T is the stored row type, M the type the tensor cores multiply.
#define HG_MMA_STAGES(T, M) (sizeof(T) == 4 && sizeof(M) == 4 ? 2 : 3)
#define HG_MMA_STAGE_WORDS (HG_MMA_TILE * HG_MMA_PITCH_WORDS)
// f32 rows multiplied in f16 are converted from their staged step (32 components) into one of
// two f16 buffers: 16 words a line plus 4, which carry the norms as in the stages and keep the
// fragment loads free of bank conflicts (a pitch of 80 bytes spreads 8 lines over 32 banks).
#define HG_MMA_HALF_PITCH_WORDS 20
#define HG_MMA_HALF_WORDS (HG_MMA_TILE * HG_MMA_HALF_PITCH_WORDS)

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

// Where one thread's four 16-byte pieces of every staged step go: lines line, line + 32, line
// + 64 and line + 96 of the tile at byte `col` of the step. The source pointer walks the rows
// (128 bytes per step, a tile's rows at a time), so a step costs four copies and a few adds
// instead of recomputing every address (the kernel runs at its register limit, where the
// compiler would otherwise rebuild them from the thread index on every step).
struct HgStager {
    const char* src;  // this thread's piece of line `line` at step 0 of the current tile
    u64 line_stride;  // 32 rows, in bytes
    u32 dst;          // shared address of the piece in stage 0
    u32 col;          // byte of the piece within a step
    int rows_left;    // rows of the current tile from line `line` on (the last tile may be short)
};

__device__ __forceinline__ HgStager hg_stager(u32 stage_base, const char* rows, u32 row0, u32 n, u32 row_bytes) {
    HgStager st;
    u32 line = threadIdx.x / 8;
    st.col = (threadIdx.x % 8) * 16;
    st.dst = stage_base + (line * HG_MMA_PITCH_WORDS) * 4 + st.col;
    st.src = rows + (u64)(row0 + line) * row_bytes + st.col;
    st.line_stride = 32ull * row_bytes;
    st.rows_left = (int)n - (int)(row0 + line);
    return st;
}

// Two f32 values rounded to nearest f16, packed with `lo` in the low half.
__device__ __forceinline__ u32 hg_f16x2(float lo, float hi) {
    u32 packed;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}

// Queues step `step` (bytes [step * 128, +128) of every row) of the stager's current tile into
// the stage at byte offset `stage_off`.
__device__ __forceinline__ void hg_mma_stage(const HgStager& st, const char* rows, u32 stage_off, u32 row_bytes,
                                             u32 step) {
    u32 byte = step * HG_MMA_STEP_BYTES;
    bool col_ok = byte + st.col < row_bytes;
    const char* src = st.src + byte;
#pragma unroll
    for (int l = 0; l < 4; l++) {
        bool ok = col_ok && st.rows_left > 32 * l;
        // Invalid pieces still need a mapped address; the copy reads nothing from it.
        hg_copy16(st.dst + stage_off + l * 32 * HG_MMA_PITCH_WORDS * 4, ok ? src : rows, ok);
        src += st.line_stride;
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
// tile (128 lines of hg_mma_query_pitch words), HG_MMA_STAGES(T, M) staged row steps and, for
// f32 rows multiplied in f16, two converted f16 buffers (kernels.rs, mma_shared_bytes). Block (x, y)
// keeps queries [x * 128, +128) in shared memory and streams the 128-row tiles
// [y * tiles, (y + 1) * tiles) through a pipeline that runs across tile boundaries. Blocks
// with consecutive x run together on the same rows, which they then share in L2.
// Eight warps in 2 (rows) x 4 (queries) each own 64 x 32 products of a tile, their operands
// loaded by ldmatrix (one instruction per 16 x 8 words instead of four).
// Distances follow hg_tile_topk's formulas, so the host's gate applies unchanged. The f16
// path's scales (the query's, and the rows' where f32 rows are rounded) are powers of two:
// folding them into L2's -2 changes no bit as long as the folded factor is a normal f32 (the
// host sends batches where it would not be to the plain f32 tiles), except where the
// scaled product is subnormal, and there it only removes a rounding. The
// metric is a template parameter: the filter runs once per product and must stay a few
// instructions. dim * sizeof(T) and dim * sizeof(M) must be multiples of 16. Candidate q's buffer holds
// `cap` entries; an entry that finds it full lowers evicted[q] instead, so finalize flags the
// query if that entry was inside the band.
template <typename T, typename M, int METRIC>
__device__ void hg_mma_filter(const T* rows, const float* norms, const u32* dead, u32 n, u32 tiles, u32 dim,
                              const M* queries, u32 nq, const float* inv_scale, float row_scale, const float* tau,
                              u32 cap, u64* cand, u32* counts, u64* evicted) {
    // f32 rows on f16 tensor cores: each staged step is scaled by row_scale (a power of two that
    // keeps every component in f16's range), rounded to nearest f16 and multiplied from there.
    const bool convert = sizeof(T) != sizeof(M);
    const u32 stages_n = HG_MMA_STAGES(T, M);
    // Bytes of the multiplied operands per staged step, and 16-wide (f16) or 8-wide (TF32)
    // k steps in them.
    const u32 operand_step_bytes = HG_MMA_STEP_BYTES * sizeof(M) / sizeof(T);
    const u32 kks = operand_step_bytes / 32;
    extern __shared__ __align__(16) u64 hg_smem[];
    u32* words = (u32*)hg_smem;
    u32 row_bytes = dim * (u32)sizeof(T);
    u32 query_bytes = dim * (u32)sizeof(M);
    u32 steps = (row_bytes + HG_MMA_STEP_BYTES - 1) / HG_MMA_STEP_BYTES;
    u32 query_steps = (query_bytes + HG_MMA_STEP_BYTES - 1) / HG_MMA_STEP_BYTES;
    u32 qpitch = hg_mma_query_pitch(query_steps);
    u32* staged = words + HG_MMA_TILE * qpitch;
    u32* halves = staged + stages_n * HG_MMA_STAGE_WORDS;
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
    u32 pieces_per_line = query_steps * (HG_MMA_STEP_BYTES / 16);
    for (u32 piece = threadIdx.x; piece < HG_MMA_TILE * pieces_per_line; piece += HG_BLOCK) {
        u32 line = piece / pieces_per_line, byte = (piece % pieces_per_line) * 16;
        bool ok = q0 + line < nq && byte < query_bytes;
        hg_copy16(query_base + (line * qpitch) * 4 + byte,
                  (const char*)queries + (ok ? (u64)(q0 + line) * query_bytes + byte : 0), ok);
    }
    hg_copy_commit();

    // The pipeline's next load: (tile, step) pairs in order.
    u32 load_tile = 0, load_step = 0, load_stage = 0;
    HgStager stager = hg_stager(staged_base, row_src, first_tile * HG_MMA_TILE, n, row_bytes);
    auto load_next = [&]() {
        if (load_tile < my_tiles) {
            hg_mma_stage(stager, row_src, load_stage * HG_MMA_STAGE_WORDS * 4, row_bytes, load_step);
            // With the tile's last step, its 128 norms: four in the padding of each of lines 0-31.
            if (METRIC != HG_DOT && load_step + 1 == steps && threadIdx.x < HG_MMA_TILE / 4) {
                u32 row = (first_tile + load_tile) * HG_MMA_TILE + 4 * threadIdx.x;
                u32 bytes = row < n ? 4u * min(n - row, 4u) : 0u;
                hg_copy_bytes(staged_base + (load_stage * HG_MMA_STAGE_WORDS + threadIdx.x * HG_MMA_PITCH_WORDS + 32) * 4,
                              norms + (bytes ? row : 0), bytes);
            }
        }
        hg_copy_commit();
        if (++load_step == steps) {
            load_step = 0;
            load_tile++;
            stager.src += 4 * stager.line_stride;
            stager.rows_left -= HG_MMA_TILE;
        }
        load_stage = load_stage + 1 == stages_n ? 0 : load_stage + 1;
    };
#pragma unroll
    for (u32 s = 0; s + 1 < stages_n; s++) load_next();

    // Per query of this thread: its threshold (-inf past the last query: nothing passes) and
    // the factor of its products (-2 / scale for L2, -1 / scale otherwise; the scales are the
    // query's and the rows', powers of two).
    float limit[4][2], factor[4][2];
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            u32 q = q0 + warp_query + nt * 8 + 2 * t + e2;
            float scale = (q < nq && inv_scale) ? inv_scale[q] : 1.0f;
            limit[nt][e2] = q < nq ? tau[q] : -__uint_as_float(0x7f800000u);
            factor[nt][e2] = (METRIC == HG_L2 ? -2.0f : -1.0f) * scale / row_scale;
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
    // pair of query fragments, (queries 0-7 | 8-15) x (words 0-3 | 4-7), word half first. Row
    // fragments come from the staged steps, or from the f16 buffers where rows are converted.
    const u32 a_pitch = convert ? HG_MMA_HALF_PITCH_WORDS : HG_MMA_PITCH_WORDS;
    u32 mi = lane / 8, mr = lane % 8;
    u32 a_lane = (convert ? hg_shared_address(halves) : staged_base) +
                 ((warp_row + mr + 8 * (mi & 1)) * a_pitch + 4 * (mi >> 1)) * 4;
    u32 b_lane = query_base + ((warp_query + mr + 8 * (mi >> 1)) * qpitch + 4 * (mi & 1)) * 4;

    // One staged step's products: `a_off` selects the stage (or f16 buffer), `step` the step of
    // the tile.
    auto multiply = [&](u32 a_off, u32 step) {
#pragma unroll
        for (u32 kk = 0; kk < kks; kk++) {
            u32 a[4][4], b[4][2];
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
                hg_ldsm4(a[mt][0], a[mt][1], a[mt][2], a[mt][3], a_lane + (u32)(mt * 16 * a_pitch * 4) + a_off + kk * 32);
#pragma unroll
            for (int np = 0; np < 2; np++)
                hg_ldsm4(b[2 * np][0], b[2 * np][1], b[2 * np + 1][0], b[2 * np + 1][1],
                         b_lane + np * 16 * qpitch * 4 + step * operand_step_bytes + kk * 32);
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++) hg_mma<M>(acc[mt][nt], a[mt], b[nt]);
        }
    };

    // The tile is complete: accumulator e of (mt, nt) is row g (e < 2) or g + 8 of the m
    // tile, query 2t + e % 2. Distances replace the products in place; one branch per tile
    // finds the rare passing ones. The tile's norms sit in the padding of line r / 4, word
    // `pitch - 4 + r % 4`, of `tile_norms` (its last step's stage or f16 buffer).
    auto finish_tile = [&](u32 tile, const float* tile_norms, u32 pitch) {
        u32 row0 = (first_tile + tile) * HG_MMA_TILE + warp_row + g;
        // One flag per m tile: four independent predicate chains instead of one 64 long.
        bool any[4] = {false, false, false, false};
#pragma unroll
        for (int mt = 0; mt < 4; mt++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                u32 r = warp_row + g + mt * 16 + half * 8;
                float norm = METRIC != HG_DOT ? tile_norms[(r / 4) * pitch + pitch - 4 + r % 4] : 0.0f;
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
                        any[mt] |= d <= limit[nt][e2];
                    }
                }
            }
        }
        if (any[0] | any[1] | any[2] | any[3]) {
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
    };

    if (!convert) {
        u32 stage = 0;
        for (u32 tile = 0; tile < my_tiles; tile++) {
            for (u32 step = 0; step < steps; step++) {
                hg_copy_wait<HG_MMA_STAGES(T, M) - 2>();
                // The stage read below is complete for every thread, and the one refilled next
                // was last read in the previous step, which every thread has finished.
                __syncthreads();
                load_next();
                multiply(stage * HG_MMA_STAGE_WORDS * 4, step);
                if (step + 1 < steps) stage = stage + 1 == stages_n ? 0 : stage + 1;
            }
            finish_tile(tile, (const float*)staged + stage * HG_MMA_STAGE_WORDS, HG_MMA_PITCH_WORDS);
            stage = stage + 1 == stages_n ? 0 : stage + 1;
        }
    } else {
        // Step s (over all tiles) is staged in stage s % 3 and converted into buffer s % 2 one
        // step ahead of its products, so one barrier per step orders everything: at the
        // barrier of step s, step s + 1 has landed and every thread has converted step s and
        // finished the products of step s - 1, whose buffer step s + 1 then takes. The load
        // after the barrier refills the stage of step s - 1, converted before it.
        u32 total = my_tiles * steps;
        float* halves_f = (float*)halves;
        auto convert_step = [&](u32 s) {
            const float* from = (const float*)staged + (s % 3) * HG_MMA_STAGE_WORDS;
            u32* to = halves + (s % 2) * HG_MMA_HALF_WORDS;
            u32 line = threadIdx.x / 8, col = (threadIdx.x % 8) * 4;
#pragma unroll
            for (int l = 0; l < 4; l++) {
                u32 at = line + 32 * l;
                float4 v = *(const float4*)(from + at * HG_MMA_PITCH_WORDS + col);
                uint2 h = make_uint2(hg_f16x2(v.x * row_scale, v.y * row_scale), hg_f16x2(v.z * row_scale, v.w * row_scale));
                *(uint2*)(to + at * HG_MMA_HALF_PITCH_WORDS + col / 2) = h;
            }
            // The padding words: norms, on a tile's last step.
            if (threadIdx.x < HG_MMA_TILE / 4)
                *(float4*)(halves_f + (s % 2) * HG_MMA_HALF_WORDS + threadIdx.x * HG_MMA_HALF_PITCH_WORDS + 16) =
                    *(const float4*)(from + threadIdx.x * HG_MMA_PITCH_WORDS + 32);
        };
        if (total > 0) {
            hg_copy_wait<1>();
            __syncthreads();
            convert_step(0);
        }
        u32 tile = 0, step = 0;
        for (u32 s = 0; s < total; s++) {
            load_next();
            hg_copy_wait<1>();
            __syncthreads();
            if (s + 1 < total) convert_step(s + 1);
            multiply((s % 2) * HG_MMA_HALF_WORDS * 4, step);
            if (++step == steps) {
                finish_tile(tile, halves_f + (s % 2) * HG_MMA_HALF_WORDS, HG_MMA_HALF_PITCH_WORDS);
                step = 0;
                tile++;
            }
        }
    }
    hg_copy_wait<0>();
}

template <typename T, typename M>
__device__ __forceinline__ void hg_mma_filter_metric(const T* rows, const float* norms, const u32* dead, u32 n,
        u32 tiles, u32 dim, const M* queries, u32 nq, const float* inv_scale, float row_scale, const float* tau,
        int metric, u32 cap, u64* cand, u32* counts, u64* evicted) {
    if (metric == HG_L2)
        hg_mma_filter<T, M, HG_L2>(rows, norms, dead, n, tiles, dim, queries, nq, inv_scale, row_scale, tau, cap, cand,
                                   counts, evicted);
    else if (metric == HG_DOT)
        hg_mma_filter<T, M, HG_DOT>(rows, norms, dead, n, tiles, dim, queries, nq, inv_scale, row_scale, tau, cap, cand,
                                    counts, evicted);
    else
        hg_mma_filter<T, M, HG_COS>(rows, norms, dead, n, tiles, dim, queries, nq, inv_scale, row_scale, tau, cap, cand,
                                    counts, evicted);
}

extern "C" __global__ void __launch_bounds__(HG_BLOCK, 2) hg_mma_filter_tf32(const float* rows, const float* norms,
        const u32* dead, u32 n, u32 tiles, u32 dim, const float* queries, u32 nq, const float* inv_scale,
        float row_scale, const float* tau, int metric, u32 cap, u64* cand, u32* counts, u64* evicted) {
    hg_mma_filter_metric<float, float>(rows, norms, dead, n, tiles, dim, queries, nq, inv_scale, row_scale, tau, metric,
                                       cap, cand, counts, evicted);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK, 2) hg_mma_filter_f16(const u16* rows, const float* norms,
        const u32* dead, u32 n, u32 tiles, u32 dim, const u16* queries, u32 nq, const float* inv_scale,
        float row_scale, const float* tau, int metric, u32 cap, u64* cand, u32* counts, u64* evicted) {
    hg_mma_filter_metric<u16, u16>(rows, norms, dead, n, tiles, dim, queries, nq, inv_scale, row_scale, tau, metric,
                                   cap, cand, counts, evicted);
}
// f32 rows, f16 queries: the rows are rounded to f16 in shared memory (see hg_mma_filter).
extern "C" __global__ void __launch_bounds__(HG_BLOCK, 2) hg_mma_filter_f32h(const float* rows, const float* norms,
        const u32* dead, u32 n, u32 tiles, u32 dim, const u16* queries, u32 nq, const float* inv_scale,
        float row_scale, const float* tau, int metric, u32 cap, u64* cand, u32* counts, u64* evicted) {
    hg_mma_filter_metric<float, u16>(rows, norms, dead, n, tiles, dim, queries, nq, inv_scale, row_scale, tau, metric,
                                     cap, cand, counts, evicted);
}

// The f32 rows scaled by `scale` (a power of two) and rounded to nearest f16, four at a time:
// the copy one search multiplies on the f16 filter instead of converting every staged step in
// every block (hg_mma_filter_f32h), when the copy fits its budget (search.rs).
extern "C" __global__ void hg_round_rows_f16(const float4* rows, uint2* out, u64 quads, float scale) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < quads; i += (u64)gridDim.x * blockDim.x) {
        float4 v = rows[i];
        out[i] = make_uint2(hg_f16x2(v.x * scale, v.y * scale), hg_f16x2(v.z * scale, v.w * scale));
    }
}

// bf16 rows scaled by `scale` (a power of two) and rounded to nearest f16, four at a time: the
// copy a batch over bf16 rows multiplies on the f16 filter (bf16 rows have no f32 for TF32 or
// the filter's own conversion), under the rounded filter's bound as f32 rows of the same values.
extern "C" __global__ void hg_round_bf16_rows_f16(const uint2* rows, uint2* out, u64 quads, float scale) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < quads; i += (u64)gridDim.x * blockDim.x) {
        float4 v = hg_bf16x4(rows[i]);
        out[i] = make_uint2(hg_f16x2(v.x * scale, v.y * scale), hg_f16x2(v.z * scale, v.w * scale));
    }
}

// Byte rows (i8 where `is_signed`, else u8) widened to f16, four at a time: exact, since every
// integer up to 2048 is an f16. The copy a batch over byte rows multiplies on the f16 tensor
// cores (filter, sample and tiles) exactly as it would f16 rows (search.rs).
extern "C" __global__ void hg_widen_bytes_f16(const u32* rows, uint2* out, u64 quads, int is_signed) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < quads; i += (u64)gridDim.x * blockDim.x) {
        float4 v = is_signed ? hg_i8x4(rows[i]) : hg_u8x4(rows[i]);
        out[i] = make_uint2(hg_f16x2(v.x, v.y), hg_f16x2(v.z, v.w));
    }
}
