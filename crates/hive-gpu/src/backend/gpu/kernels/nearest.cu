// Each point's nearest stored row under the squared Euclidean distance, for the 1-NN of many
// points over few rows that k-means assignments, IVF adds and product-quantization encoding run
// (`RowStore::nearest_rows`). No selection, no finalize: one pass over the rows per tile of
// points, and three numbers back per point. The distance is summed in f32 from direct
// differences, t = x - y then fmaf(t, t, acc) over the dimensions in order, so every term is
// non-negative and the sum is within a relative gamma of the true one (plus a few subnormal
// units where results fall below f32's normal range); the runner-up's distance
// comes back with the pick, and the host (backend/gpu/nearest.rs) accepts a pick only where that
// gap proves it, sending the other points through the exact k-NN.
//
// Launch contract: grid (ceil(count / HG_NEAREST_TILE), 1), HG_BLOCK = 256 threads, no dynamic
// shared memory. rows: n f32 rows of dim values (slot stride dim), every one live; points:
// count x dim f32. Writes, for each point p < count: nearest[p], the row of the smallest f32
// distance (the lower row where two are equal); first[p], that distance; second[p], the smallest
// f32 distance of any other row (+inf when n = 1, or when every other row's sum overflowed). A
// point whose distances are all NaN or +inf gets nearest[p] = 0xffffffff.

#define HG_NEAREST_TILE 64
#define HG_NEAREST_STEP 16

#if HG_BLOCK != 256
#error "hg_nearest_rows lays 16 x 16 threads over a tile of 64 points x 64 rows"
#endif

// Folds one distance into a thread's (best, runner-up, pick): rows arrive in ascending order,
// so an equal distance keeps the lower row and becomes the runner-up.
__device__ __forceinline__ void hg_nearest_take(float v, u32 row, float& best, float& runner, u32& pick) {
    if (v < best) {
        runner = best;
        best = v;
        pick = row;
    } else if (v < runner) {
        runner = v;
    }
}

extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_nearest_rows(const float* rows, u32 n, u32 dim,
        const float* points, u32 count, u32* nearest, float* first, float* second) {
    // Two columns of padding: a warp's stores cover two tile lines (e / 16) of 16 steps each, at
    // banks (d * 66 + r) mod 32, all 32 distinct (one column left the two lines 15 banks in
    // common).
    __shared__ float ps[HG_NEAREST_STEP][HG_NEAREST_TILE + 2];
    __shared__ float rs[HG_NEAREST_STEP][HG_NEAREST_TILE + 2];
    u32 p0 = blockIdx.x * HG_NEAREST_TILE;
    // The 16 threads of one `ty` are consecutive lanes: they hold the same points, so their
    // picks merge by shuffles within 16 lanes at the end (on 32- and 64-wide warps alike).
    u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float best[4], runner[4];
    u32 pick[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        best[i] = __int_as_float(0x7f800000);
        runner[i] = __int_as_float(0x7f800000);
        pick[i] = 0xffffffffu;
    }
    for (u32 r0 = 0; r0 < n; r0 += HG_NEAREST_TILE) {
        float acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
        for (u32 k0 = 0; k0 < dim; k0 += HG_NEAREST_STEP) {
#pragma unroll
            for (u32 l = 0; l < (HG_NEAREST_TILE * HG_NEAREST_STEP) / HG_BLOCK; l++) {
                u32 e = threadIdx.x + HG_BLOCK * l;
                u32 r = e / HG_NEAREST_STEP, d = e % HG_NEAREST_STEP;
                u32 k = k0 + d;
                // Zeros past the dimension on both sides: fmaf(0, 0, acc) is acc exactly.
                ps[d][r] = (p0 + r < count && k < dim) ? points[(u64)(p0 + r) * dim + k] : 0.0f;
                rs[d][r] = (r0 + r < n && k < dim) ? rows[(u64)(r0 + r) * dim + k] : 0.0f;
            }
            __syncthreads();
#pragma unroll
            for (u32 d = 0; d < HG_NEAREST_STEP; d++) {
                float x[4], y[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    x[i] = ps[d][ty + 16 * i];
                    y[i] = rs[d][tx + 16 * i];
                }
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        float t = x[i] - y[j];
                        acc[i][j] = fmaf(t, t, acc[i][j]);
                    }
            }
            __syncthreads();
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            u32 row = r0 + tx + 16 * j;
            if (row < n) {
#pragma unroll
                for (int i = 0; i < 4; i++) hg_nearest_take(acc[i][j], row, best[i], runner[i], pick[i]);
            }
        }
    }
    // Each lane saw rows tx, tx + 16, ...: merge the 16 lanes' picks, the lower row on equal
    // distances, the loser's best joining the runner-up.
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (u32 o = 8; o >= 1; o /= 2) {
            float b = HG_SHFL_XOR(best[i], o);
            float s = HG_SHFL_XOR(runner[i], o);
            u32 c = HG_SHFL_XOR(pick[i], o);
            if (b < best[i] || (b == best[i] && c < pick[i])) {
                runner[i] = fminf(s, best[i]);
                best[i] = b;
                pick[i] = c;
            } else {
                runner[i] = fminf(runner[i], b);
            }
        }
        u32 p = p0 + ty + 16 * i;
        if (tx == 0 && p < count) {
            nearest[p] = pick[i];
            first[p] = best[i];
            second[p] = runner[i];
        }
    }
}
