// Search kernels: the single-query scan fused with top-k, top-k over GEMM tiles, the final
// merge with the exact f64 re-rank, and the radix-select path for any k.

#define HG_ROWS_PER_WARP 4
// Vector path (dimension a multiple of 4): HG_LPR lanes share a row and load 4 elements at a
// time (16 bytes of f32, 8 of f16); a warp covers HG_WARP / HG_LPR rows HG_RPL times per pass.
#define HG_LPR 8
#define HG_RPL 4
#define HG_STEPS 2

// Approximate distance of `rows_n` consecutive rows starting at `first` (warp-cooperative;
// every lane gets every result). The element type is a template so f32 and f16 share it.
template <typename T> __device__ __forceinline__ float hg_load(const T* p, u64 i);
template <> __device__ __forceinline__ float hg_load<float>(const float* p, u64 i) { return p[i]; }
template <> __device__ __forceinline__ float hg_load<u16>(const u16* p, u64 i) { return hg_h2f(p[i]); }
template <> __device__ __forceinline__ float hg_load<hg_bf16>(const hg_bf16* p, u64 i) { return hg_bf2f(p[i].bits); }
template <> __device__ __forceinline__ float hg_load<i8>(const i8* p, u64 i) { return (float)p[i]; }
template <> __device__ __forceinline__ float hg_load<u8>(const u8* p, u64 i) { return (float)p[i]; }

// Four consecutive elements from a 4-element-aligned index.
template <typename T> __device__ __forceinline__ float4 hg_load4(const T* p, u64 i);
// Stored rows are read once per search: on CUDA 8.0+ they bypass L1 and ask L2 to fetch
// 256-byte blocks, which keeps more of DRAM's bandwidth busy for a streaming scan.
template <> __device__ __forceinline__ float4 hg_load4<float>(const float* p, u64 i) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];\n"
        : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
        : "l"(p + i));
    return v;
#else
    return *(const float4*)(p + i);
#endif
}
template <> __device__ __forceinline__ float4 hg_load4<u16>(const u16* p, u64 i) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p + i));
#else
    uint2 v = *(const uint2*)(p + i);
#endif
    return make_float4(hg_h2f((u16)(v.x & 0xffffu)), hg_h2f((u16)(v.x >> 16)), hg_h2f((u16)(v.y & 0xffffu)),
                       hg_h2f((u16)(v.y >> 16)));
}
// Four bf16 (8 bytes, 8-aligned), four bytes (4 bytes, 4-aligned), streamed the same way.
__device__ __forceinline__ uint2 hg_stream_load8(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
#else
    return *(const uint2*)p;
#endif
}
__device__ __forceinline__ u32 hg_stream_load4(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    u32 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
    return v;
#else
    return *(const u32*)p;
#endif
}
__device__ __forceinline__ float4 hg_bf16x4(uint2 v) {
    return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                       __uint_as_float(v.y & 0xffff0000u));
}
__device__ __forceinline__ float4 hg_i8x4(u32 v) {
    return make_float4((float)((int)(v << 24) >> 24), (float)((int)(v << 16) >> 24), (float)((int)(v << 8) >> 24),
                       (float)((int)v >> 24));
}
__device__ __forceinline__ float4 hg_u8x4(u32 v) {
    return make_float4((float)(v & 0xffu), (float)((v >> 8) & 0xffu), (float)((v >> 16) & 0xffu), (float)(v >> 24));
}
template <> __device__ __forceinline__ float4 hg_load4<hg_bf16>(const hg_bf16* p, u64 i) {
    return hg_bf16x4(hg_stream_load8(p + i));
}
template <> __device__ __forceinline__ float4 hg_load4<i8>(const i8* p, u64 i) { return hg_i8x4(hg_stream_load4(p + i)); }
template <> __device__ __forceinline__ float4 hg_load4<u8>(const u8* p, u64 i) { return hg_u8x4(hg_stream_load4(p + i)); }

__device__ __forceinline__ float hg_accumulate4(float acc, float4 q, float4 x, int metric) {
    if (metric == HG_L2) {
        float d0 = q.x - x.x, d1 = q.y - x.y, d2 = q.z - x.z, d3 = q.w - x.w;
        return fmaf(d3, d3, fmaf(d2, d2, fmaf(d1, d1, fmaf(d0, d0, acc))));
    }
    if (metric >= HG_L1) {
        float d0 = fabsf(q.x - x.x), d1 = fabsf(q.y - x.y), d2 = fabsf(q.z - x.z), d3 = fabsf(q.w - x.w);
        if (metric == HG_L1) return acc + d0 + d1 + d2 + d3;
        return fmaxf(fmaxf(fmaxf(acc, d0), fmaxf(d1, d2)), d3);
    }
    return fmaf(q.w, x.w, fmaf(q.z, x.z, fmaf(q.y, x.y, fmaf(q.x, x.x, acc))));
}

// One component's term added into a lane's partial (the scalar path of hg_warp_distances).
__device__ __forceinline__ float hg_accumulate1(float acc, float q, float x, int metric) {
    float d = q - x;
    if (metric == HG_L2) return fmaf(d, d, acc);
    if (metric == HG_L1) return acc + fabsf(d);
    if (metric == HG_LINF) return fmaxf(acc, fabsf(d));
    return fmaf(q, x, acc);
}

// Two lanes' partials combined: a maximum for L-infinity, else a sum.
__device__ __forceinline__ float hg_combine(float a, float b, int metric) {
    return metric == HG_LINF ? fmaxf(a, b) : a + b;
}

// Rows one warp covers per pass.
__device__ __forceinline__ u32 hg_warp_rows(u32 dim) {
    return (dim & 3u) == 0 ? (HG_WARP / HG_LPR) * HG_RPL : HG_ROWS_PER_WARP;
}

// Raw distance (sum of squares, dot product, L1 sum or L-infinity maximum) of the rows [first, first + hg_warp_rows(dim))
// below `end`, warp-cooperative. Each lane owns at most one of them: it gets that row's offset
// from `first` (or 0xffffffff) and its distance in `out`. `q` is 16-byte aligned.
template <typename T>
__device__ __forceinline__ u32 hg_warp_distances(const T* rows, u32 dim, u32 first, u32 end, const float* q,
                                                 int metric, float* out) {
    u32 lane = threadIdx.x % HG_WARP;
    u32 owned = 0xffffffffu;
    *out = 0.0f;
    if ((dim & 3u) == 0) {
        const u32 groups = HG_WARP / HG_LPR;
        u32 g = lane / HG_LPR, s = lane % HG_LPR;
        float acc[HG_RPL];
#pragma unroll
        for (int r = 0; r < HG_RPL; r++) acc[r] = 0.0f;
        // HG_STEPS column steps of every row are loaded before any is used: the loads are all
        // in flight at once whatever the compiler makes of the loop (13 us of a 195 us
        // 1M x 128 scan on the H100). The sums still run in column order.
        for (u32 c = s * 4; c < dim; c += HG_LPR * 4 * HG_STEPS) {
            float4 x[HG_STEPS][HG_RPL];
#pragma unroll
            for (int u = 0; u < HG_STEPS; u++) {
                u32 cu = c + u * HG_LPR * 4;
#pragma unroll
                for (int r = 0; r < HG_RPL; r++) {
                    u32 row = first + r * groups + g;
                    x[u][r] = (cu < dim && row < end) ? hg_load4<T>(rows, (u64)row * dim + cu)
                                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
            }
#pragma unroll
            for (int u = 0; u < HG_STEPS; u++) {
                u32 cu = c + u * HG_LPR * 4;
                if (cu < dim) {
                    float4 qv = *(const float4*)(q + cu);
#pragma unroll
                    for (int r = 0; r < HG_RPL; r++) acc[r] = hg_accumulate4(acc[r], qv, x[u][r], metric);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < HG_RPL; r++) {
            for (int o = HG_LPR / 2; o > 0; o >>= 1) acc[r] = hg_combine(acc[r], HG_SHFL_XOR(acc[r], o), metric);
            u32 offset = r * groups + g;
            if (s == (u32)r && first + offset < end) {
                owned = offset;
                *out = acc[r];
            }
        }
        return owned;
    }
    float acc[HG_ROWS_PER_WARP];
#pragma unroll
    for (int r = 0; r < HG_ROWS_PER_WARP; r++) acc[r] = 0.0f;
#pragma unroll 4
    for (u32 c = lane; c < dim; c += HG_WARP) {
        float qv = q[c];
#pragma unroll
        for (int r = 0; r < HG_ROWS_PER_WARP; r++) {
            if (first + r < end) {
                float x = hg_load<T>(rows, (u64)(first + r) * dim + c);
                acc[r] = hg_accumulate1(acc[r], qv, x, metric);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < HG_ROWS_PER_WARP; r++) {
        float total = metric == HG_LINF ? hg_warp_max(acc[r]) : hg_warp_sum(acc[r]);
        if (lane == (u32)r && first + r < end) {
            owned = r;
            *out = total;
        }
    }
    return owned;
}

__device__ __forceinline__ float hg_finish(float raw, int metric, const float* norms, u32 slot) {
    if (metric == HG_L2 || metric >= HG_L1) return raw;
    if (metric == HG_DOT) return -raw;
    return -raw / sqrtf(norms[slot]);
}

// grid (S, nq), block HG_BLOCK: block s of query q scans rows [s*per, (s+1)*per) and leaves its
// candidate list in lists[(q*S + s)*kcap ..] and its smallest evicted entry in evicted[q*S + s].
// Between two merge checks the block runs up to `max_sub` passes (bounded so the buffer stays
// at most half full), so it synchronizes rarely and keeps many loads in flight.
template <typename T>
__device__ void hg_scan_topk(const T* rows, const float* norms, const u32* dead, u32 n, u32 dim,
                             const float* queries, const float* gate_mul, const float* gate_add, int metric,
                             u32 k, u32 kcap, u32 sortn, u32 per, u32 max_sub, u64* lists, u64* evicted) {
    extern __shared__ __align__(16) u64 hg_smem[];
    __shared__ HgTopK st;
    u64* sh = hg_smem;
    float* qs = (float*)(sh + sortn);
    u32 q = blockIdx.y, s = blockIdx.x, S = gridDim.x;
    for (u32 c = threadIdx.x; c < dim; c += blockDim.x) qs[c] = queries[(u64)q * dim + c];
    float mul = gate_mul[q], add = gate_add[q];
    hg_init(sh, &st, kcap, 0, HG_NONE, k, mul, add);
    u32 start = s * per;
    u32 end = min(n, start + per);
    u32 warps = blockDim.x / HG_WARP, warp = threadIdx.x / HG_WARP;
    u32 warp_rows = hg_warp_rows(dim);
    u32 step = warps * warp_rows;
    u32 bcap = sortn - kcap;
    u32 sub = max(1u, min(max_sub, bcap / (2 * step)));
    u32 round = step * sub;
    for (u32 base = start; base < end; base += round) {
        if (hg_must_merge(&st, round, bcap)) hg_merge(sh, &st, k, kcap, sortn, mul, add);
        float thr = st.thr;
        for (u32 u = 0; u < sub; u++) {
            u32 first = base + u * step + warp * warp_rows;
            if (first < end) {
                float raw;
                u32 offset = hg_warp_distances<T>(rows, dim, first, end, qs, metric, &raw);
                if (offset != 0xffffffffu) {
                    u32 slot = first + offset;
                    float a = hg_finish(raw, metric, norms, slot);
                    if (a <= thr && !hg_dead(dead, slot)) hg_push(sh, &st, kcap, sortn, a, slot);
                }
            }
        }
        __syncthreads();
    }
    if (st.count > 0) hg_merge(sh, &st, k, kcap, sortn, mul, add);
    u64* out = lists + ((u64)q * S + s) * kcap;
    for (u32 i = threadIdx.x; i < kcap; i += blockDim.x) out[i] = sh[i];
    if (threadIdx.x == 0) evicted[(u64)q * S + s] = st.evicted;
}

extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_scan_topk_f32(const float* rows, const float* norms,
        const u32* dead, u32 n, u32 dim, const float* queries, const float* gate_mul, const float* gate_add,
        int metric, u32 k, u32 kcap, u32 sortn, u32 per, u32 max_sub, u64* lists, u64* evicted) {
    hg_scan_topk<float>(rows, norms, dead, n, dim, queries, gate_mul, gate_add, metric, k, kcap, sortn, per,
                        max_sub, lists, evicted);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_scan_topk_f16(const u16* rows, const float* norms,
        const u32* dead, u32 n, u32 dim, const float* queries, const float* gate_mul, const float* gate_add,
        int metric, u32 k, u32 kcap, u32 sortn, u32 per, u32 max_sub, u64* lists, u64* evicted) {
    hg_scan_topk<u16>(rows, norms, dead, n, dim, queries, gate_mul, gate_add, metric, k, kcap, sortn, per,
                      max_sub, lists, evicted);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_scan_topk_bf16(const hg_bf16* rows, const float* norms,
        const u32* dead, u32 n, u32 dim, const float* queries, const float* gate_mul, const float* gate_add,
        int metric, u32 k, u32 kcap, u32 sortn, u32 per, u32 max_sub, u64* lists, u64* evicted) {
    hg_scan_topk<hg_bf16>(rows, norms, dead, n, dim, queries, gate_mul, gate_add, metric, k, kcap, sortn, per,
                      max_sub, lists, evicted);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_scan_topk_i8(const i8* rows, const float* norms,
        const u32* dead, u32 n, u32 dim, const float* queries, const float* gate_mul, const float* gate_add,
        int metric, u32 k, u32 kcap, u32 sortn, u32 per, u32 max_sub, u64* lists, u64* evicted) {
    hg_scan_topk<i8>(rows, norms, dead, n, dim, queries, gate_mul, gate_add, metric, k, kcap, sortn, per,
                      max_sub, lists, evicted);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_scan_topk_u8(const u8* rows, const float* norms,
        const u32* dead, u32 n, u32 dim, const float* queries, const float* gate_mul, const float* gate_add,
        int metric, u32 k, u32 kcap, u32 sortn, u32 per, u32 max_sub, u64* lists, u64* evicted) {
    hg_scan_topk<u8>(rows, norms, dead, n, dim, queries, gate_mul, gate_add, metric, k, kcap, sortn, per,
                      max_sub, lists, evicted);
}

// Approximate distance of every row to one query (removed rows get +inf): the input of the
// radix-select path. grid: any, block HG_BLOCK; the query is read from global memory.
template <typename T>
__device__ void hg_scan_all(const T* rows, const float* norms, const u32* dead, u32 n, u32 dim, const float* q,
                            int metric, float* dist) {
    u32 warps_total = gridDim.x * (blockDim.x / HG_WARP);
    u32 warp = blockIdx.x * (blockDim.x / HG_WARP) + threadIdx.x / HG_WARP;
    u32 warp_rows = hg_warp_rows(dim);
    for (u32 first = warp * warp_rows; first < n; first += warps_total * warp_rows) {
        float raw;
        u32 offset = hg_warp_distances<T>(rows, dim, first, n, q, metric, &raw);
        if (offset != 0xffffffffu) {
            u32 slot = first + offset;
            dist[slot] = hg_dead(dead, slot) ? __uint_as_float(0x7f800000u) : hg_finish(raw, metric, norms, slot);
        }
    }
}
extern "C" __global__ void hg_scan_all_f32(const float* rows, const float* norms, const u32* dead, u32 n, u32 dim,
                                           const float* q, int metric, float* dist) {
    hg_scan_all<float>(rows, norms, dead, n, dim, q, metric, dist);
}
extern "C" __global__ void hg_scan_all_f16(const u16* rows, const float* norms, const u32* dead, u32 n, u32 dim,
                                           const float* q, int metric, float* dist) {
    hg_scan_all<u16>(rows, norms, dead, n, dim, q, metric, dist);
}
extern "C" __global__ void hg_scan_all_bf16(const hg_bf16* rows, const float* norms, const u32* dead, u32 n, u32 dim,
                                           const float* q, int metric, float* dist) {
    hg_scan_all<hg_bf16>(rows, norms, dead, n, dim, q, metric, dist);
}
extern "C" __global__ void hg_scan_all_i8(const i8* rows, const float* norms, const u32* dead, u32 n, u32 dim,
                                           const float* q, int metric, float* dist) {
    hg_scan_all<i8>(rows, norms, dead, n, dim, q, metric, dist);
}
extern "C" __global__ void hg_scan_all_u8(const u8* rows, const float* norms, const u32* dead, u32 n, u32 dim,
                                           const float* q, int metric, float* dist) {
    hg_scan_all<u8>(rows, norms, dead, n, dim, q, metric, dist);
}

// float4 loads per thread per round of hg_tile_topk: 16 columns each.
#define HG_TILE_LOADS 4
#define HG_TILE_PER_THREAD (4 * HG_TILE_LOADS)

// grid (S, qc), block HG_BLOCK: folds one GEMM tile of dot products (or, under L1 and
// L-infinity, hg_differences' distances) (query-major, leading dimension ldc, covering rows
// [row0, row0 + tile_rows)) into each query's candidate lists.
// Block (s, q) takes columns [s * seg, (s + 1) * seg) of the tile (seg a multiple of 4) and
// keeps its own state (index q * S + s: list, smallest evicted entry, filter threshold) in
// global memory, so few queries still fill the device. The list is only read and written when
// the tile has candidates below the threshold, which after the first tiles is rare, so most
// blocks read their tile and one float.
//
// A round counts its passing candidates first (one barrier): when they fit in the buffer,
// which is the common case, they are pushed with no further synchronization; otherwise the
// round is pushed slice by slice with merges in between.
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_tile_topk(const float* dots, u32 ldc, u32 tile_rows,
        u32 row0, u32 seg, const float* norms, const u32* dead, int metric, const float* inv_scale,
        const float* gate_mul, const float* gate_add, u32 k, u32 kcap, u32 sortn, u64* lists, u64* evicted,
        float* thresholds) {
    extern __shared__ __align__(16) u64 hg_smem[];
    __shared__ HgTopK st;
    // Passing candidates of round r, in passing[r % 3]; three so a counter is reset two
    // barriers after its last read and one before its next use.
    __shared__ u32 passing[3];
    // The round's own bound on the k-th best (see below): scratch, result, survivors.
    __shared__ float bound_scratch[HG_BLOCK];
    __shared__ float bound_kth;
    __shared__ u32 repass;
    u64* sh = hg_smem;
    u32 q = blockIdx.y, state = blockIdx.y * gridDim.x + blockIdx.x;
    u32 col0 = blockIdx.x * seg;
    u32 cols = col0 < tile_rows ? min(seg, tile_rows - col0) : 0;
    float mul = gate_mul[q], add = gate_add[q];
    u64* list = lists + (u64)state * kcap;
    if (threadIdx.x == 0) {
        st.count = 0;
        st.thr = thresholds[state];
        st.evicted = evicted[state];
        passing[0] = passing[1] = passing[2] = 0;
    }
    bool loaded = false;
    __syncthreads();
    const float* row = dots + (u64)q * ldc + col0;
    row0 += col0;
    bool aligned = ((row0 | col0 | ldc) & 3u) == 0;
    float dot_scale = inv_scale ? inv_scale[q] : 1.0f;
    u32 round = blockDim.x * HG_TILE_PER_THREAD;
    u32 bcap = sortn - kcap;
    u32 count = 0;  // st.count at the start of each round, the same in every thread
    u32 r = 0;
    for (u32 base = 0; base < cols; base += round, r++) {
        float thr = st.thr;
        float a[HG_TILE_PER_THREAD];
        u32 pass = 0;
#pragma unroll
        for (int l = 0; l < HG_TILE_LOADS; l++) {
            u32 j = base + (l * blockDim.x + threadIdx.x) * 4;
            float v[4], nv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (aligned && j + 4 <= cols) {
                float4 x = *(const float4*)(row + j);
                v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
                if (metric == HG_L2 || metric == HG_COS) {
                    float4 y = *(const float4*)(norms + row0 + j);
                    nv[0] = y.x; nv[1] = y.y; nv[2] = y.z; nv[3] = y.w;
                }
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    v[e] = j + e < cols ? row[j + e] : 0.0f;
                    nv[e] = (j + e < cols && (metric == HG_L2 || metric == HG_COS)) ? norms[row0 + j + e] : 0.0f;
                }
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = l * 4 + e;
                float dot = v[e] * dot_scale;
                float d;
                if (metric == HG_L2) d = fmaf(-2.0f, dot, nv[e]);
                else if (metric == HG_DOT) d = -dot;
                else if (metric >= HG_L1) d = dot;  // hg_differences' distances
                else d = -dot / sqrtf(nv[e]);
                a[i] = d;
                if (j + e < cols && d <= thr && !hg_dead(dead, row0 + j + e)) pass |= 1u << i;
            }
        }
        u32 mine = __popc(pass);
        if (mine) atomicAdd(&passing[r % 3], mine);
        __syncthreads();
        u32 pending = passing[r % 3];
        if (threadIdx.x == 0) passing[(r + 2) % 3] = 0;
        // A round that would push far more than a list holds (a state's first, with no
        // threshold yet: every column passes) first bounds the k-th best by the round itself.
        // Each thread's least passing distance is a distinct live row of this segment, so the
        // k-th smallest of those minima is at least the state's final k-th best; the band is
        // monotone in it (mul >= 0), so a row above band(bound) is above the final threshold
        // and could never be among the k nearest. This replaces thousands of pushes and a
        // 2048-entry sort (k-means assigns 1-NN over 1,024 centroids, an IVF probes a few of
        // them) with a reduction and a handful of pushes.
        if (count + pending > 2 * kcap && k <= blockDim.x) {
            float least = __uint_as_float(0x7f800000u);
#pragma unroll
            for (int i = 0; i < HG_TILE_PER_THREAD; i++) {
                if ((pass >> i) & 1u) least = fminf(least, a[i]);
            }
            if (threadIdx.x == 0) repass = 0;
            float bound = hg_block_kth(least, k, bound_scratch, &bound_kth);
            float tight = bound < __uint_as_float(0x7f800000u) ? hg_band(bound, mul, add) : thr;
            if (tight < thr) {
                thr = tight;
                u32 keep = 0;
#pragma unroll
                for (int i = 0; i < HG_TILE_PER_THREAD; i++) {
                    if (((pass >> i) & 1u) && a[i] <= thr) keep |= 1u << i;
                }
                pass = keep;
                if (threadIdx.x == 0) st.thr = thr;
                u32 kept = __popc(pass);
                if (kept) atomicAdd(&repass, kept);
                __syncthreads();
                pending = repass;
            }
        }
        if (count + pending <= bcap) {
#pragma unroll
            for (int i = 0; i < HG_TILE_PER_THREAD; i++) {
                if ((pass >> i) & 1u) {
                    u32 j = base + ((i / 4) * blockDim.x + threadIdx.x) * 4 + i % 4;
                    u32 pos = atomicAdd(&st.count, 1u);
                    sh[kcap + pos] = hg_entry(a[i], row0 + j);
                }
            }
            count += pending;
        } else {
#pragma unroll
            for (int i = 0; i < HG_TILE_PER_THREAD; i++) {
                if (hg_must_merge(&st, blockDim.x, bcap)) {
                    if (!loaded) {
                        for (u32 t = threadIdx.x; t < kcap; t += blockDim.x) sh[t] = list[t];
                        loaded = true;
                    }
                    hg_merge(sh, &st, k, kcap, sortn, mul, add);
                }
                if (((pass >> i) & 1u) && a[i] <= st.thr) {
                    u32 j = base + ((i / 4) * blockDim.x + threadIdx.x) * 4 + i % 4;
                    hg_push(sh, &st, kcap, sortn, a[i], row0 + j);
                }
                __syncthreads();
            }
            count = st.count;
        }
    }
    if (count > 0) {
        if (!loaded) {
            for (u32 t = threadIdx.x; t < kcap; t += blockDim.x) sh[t] = list[t];
            loaded = true;
        }
        hg_merge(sh, &st, k, kcap, sortn, mul, add);
    }
    if (loaded) {
        for (u32 t = threadIdx.x; t < kcap; t += blockDim.x) list[t] = sh[t];
        if (threadIdx.x == 0) {
            evicted[state] = st.evicted;
            thresholds[state] = st.thr;
        }
    }
}

// The fused filter's threshold for each query, guessed on the device from a GEMM tile of its
// products with a sample of the rows: no exact search of the sample and no trip through the
// host. grid (qc), block HG_BLOCK. Row q of `dots` (query-major, leading dimension ldc) holds
// query q's products with `rows_n` sample rows, sample row r being slot r * stride; `norms`
// are the sample's, by sample row. Each thread keeps its least approximate distance over live
// rows (a NaN never lowers it); the j-th smallest of those minima is reached by j distinct
// sample rows, so it is at least the sample's j-th distance. Widened by `widen` of the query's
// gate bands (search.rs, SAMPLE_WIDEN: one, as the exact sample search added), it becomes
// tau[q], and evicted[q] = entry(tau, 0): only rows above tau are dropped. Where fewer than j
// threads hold a live finite distance, or the widened value is not finite (products that
// overflowed f32), tau is +inf: every row passes, and a buffer that overflows flags the query.
// Nothing here has to be a bound: the finalize proves each query's band or flags the query,
// which the host then searches again on a narrower path. 1 <= j <= HG_BLOCK.
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_sample_tau(const float* dots, u32 ldc, u32 rows_n,
        u32 stride, const float* norms, const u32* dead, int metric, const float* inv_scale, const float* gate_add,
        u32 j, float widen, float* tau, u64* evicted) {
    __shared__ float scratch[HG_BLOCK];
    __shared__ float kth_result;
    const float inf = __uint_as_float(0x7f800000u);
    u32 q = blockIdx.x;
    const float* row = dots + (u64)q * ldc;
    float dot_scale = inv_scale ? inv_scale[q] : 1.0f;
    float least = inf;
    for (u32 r = threadIdx.x; r < rows_n; r += blockDim.x) {
        float dot = row[r] * dot_scale;
        float d;
        if (metric == HG_L2) d = fmaf(-2.0f, dot, norms[r]);
        else if (metric == HG_DOT) d = -dot;
        else if (metric == HG_COS) d = -dot / sqrtf(norms[r]);
        else d = dot;  // hg_differences' distances (the fused filter never takes these)
        if (d < least && !hg_dead(dead, r * stride)) least = d;
    }
    float kth = hg_block_kth(least, j, scratch, &kth_result);
    if (threadIdx.x == 0) {
        float t = inf;
        if (kth > -inf && kth < inf) {
            float w = fmaf(widen, gate_add[q], kth);
            t = w + fabsf(w) * 1e-6f + 1e-37f;
            if (!(t > -inf && t < inf)) t = inf;
        }
        tau[q] = t;
        evicted[q] = hg_entry(t, 0);
    }
}

// The canonical distance from the sums in component order: acc of the squared differences
// (L2) or of the products, rr of the row's squares (cosine only).
__device__ __forceinline__ double hg_exact_finish(double acc, double rr, double q_norm, int metric) {
    if (metric == HG_L2 || metric >= HG_L1) return acc;
    if (metric == HG_DOT) return __dadd_rn(-acc, 0.0);
    double norm = sqrt(rr);
    return (norm == 0.0 || q_norm == 0.0) ? 0.0 : __dadd_rn(-acc / (norm * q_norm), 0.0);
}

// Four consecutive elements from a 4-element-aligned index, through the caches (the re-rank's
// reads, unlike the scan's streaming ones).
template <typename T> __device__ __forceinline__ float4 hg_cached_load4(const T* p, u64 i);
template <> __device__ __forceinline__ float4 hg_cached_load4<float>(const float* p, u64 i) {
    return *(const float4*)(p + i);
}
template <> __device__ __forceinline__ float4 hg_cached_load4<u16>(const u16* p, u64 i) {
    uint2 v = *(const uint2*)(p + i);
    return make_float4(hg_h2f((u16)(v.x & 0xffffu)), hg_h2f((u16)(v.x >> 16)), hg_h2f((u16)(v.y & 0xffffu)),
                       hg_h2f((u16)(v.y >> 16)));
}
template <> __device__ __forceinline__ float4 hg_cached_load4<hg_bf16>(const hg_bf16* p, u64 i) {
    return hg_bf16x4(*(const uint2*)(p + i));
}
template <> __device__ __forceinline__ float4 hg_cached_load4<i8>(const i8* p, u64 i) {
    return hg_i8x4(*(const u32*)(p + i));
}
template <> __device__ __forceinline__ float4 hg_cached_load4<u8>(const u8* p, u64 i) {
    return hg_u8x4(*(const u32*)(p + i));
}

// One term of the canonical distance, from components widened exactly to f64, each operation
// rounded on its own (no fused multiply-add): the host reference's arithmetic, operation for
// operation.
template <int M> __device__ __forceinline__ void hg_exact_term(double& acc, double& rr, double xv, double qv) {
    if (M == HG_L2) {
        double d = __dsub_rn(qv, xv);
        acc = __dadd_rn(acc, __dmul_rn(d, d));
    } else if (M == HG_L1) {
        acc = __dadd_rn(acc, fabs(__dsub_rn(qv, xv)));
    } else if (M == HG_LINF) {
        acc = fmax(acc, fabs(__dsub_rn(qv, xv)));
    } else {
        acc = __dadd_rn(acc, __dmul_rn(qv, xv));
        if (M == HG_COS) rr = __dadd_rn(rr, __dmul_rn(xv, xv));
    }
}

// Blocks of 16 components with no branch inside (the metric is a template parameter): their
// loads, conversions and products overlap the sums, and only the f64 adds wait on each other
// (with a branch per component, each cost 40 cycles instead of the 8 of its add).
template <typename T, int M>
__device__ double hg_exact_row_metric(const T* x, u32 dim, const float* q, double q_norm) {
    double acc = 0.0, rr = 0.0;
    if ((dim & 3u) == 0) {
        u32 c = 0;
        for (; c + 16 <= dim; c += 16) {
            float4 xv[4], qv[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                xv[u] = hg_cached_load4<T>(x, c + 4 * u);
                qv[u] = *(const float4*)(q + c + 4 * u);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                hg_exact_term<M>(acc, rr, xv[u].x, qv[u].x);
                hg_exact_term<M>(acc, rr, xv[u].y, qv[u].y);
                hg_exact_term<M>(acc, rr, xv[u].z, qv[u].z);
                hg_exact_term<M>(acc, rr, xv[u].w, qv[u].w);
            }
        }
        for (; c < dim; c += 4) {
            float4 xv = hg_cached_load4<T>(x, c);
            float4 qv = *(const float4*)(q + c);
            hg_exact_term<M>(acc, rr, xv.x, qv.x);
            hg_exact_term<M>(acc, rr, xv.y, qv.y);
            hg_exact_term<M>(acc, rr, xv.z, qv.z);
            hg_exact_term<M>(acc, rr, xv.w, qv.w);
        }
    } else {
#pragma unroll 4
        for (u32 c = 0; c < dim; c++) hg_exact_term<M>(acc, rr, hg_load<T>(x, c), q[c]);
    }
    return hg_exact_finish(acc, rr, q_norm, M);
}

// Exact f64 canonical distance of the row at `x` (device memory, or a copy staged in shared
// memory), by one thread: the terms summed in component order, so distances that differ only
// in their last bits order the same way on every backend. Re-ranks give each candidate its own
// thread.
template <typename T>
__device__ double hg_exact_row(const T* x, u32 dim, const float* q, double q_norm, int metric) {
    if (metric == HG_L2) return hg_exact_row_metric<T, HG_L2>(x, dim, q, q_norm);
    if (metric == HG_DOT) return hg_exact_row_metric<T, HG_DOT>(x, dim, q, q_norm);
    if (metric == HG_L1) return hg_exact_row_metric<T, HG_L1>(x, dim, q, q_norm);
    if (metric == HG_LINF) return hg_exact_row_metric<T, HG_LINF>(x, dim, q, q_norm);
    return hg_exact_row_metric<T, HG_COS>(x, dim, q, q_norm);
}

template <typename T>
__device__ double hg_exact(const T* rows, u32 dim, u32 slot, const float* q, double q_norm, int metric) {
    return hg_exact_row<T>(rows + (u64)slot * dim, dim, q, q_norm, metric);
}

// hg_exact_row over components already widened to f64 (a staged row and query).
template <int M> __device__ double hg_exact_staged(const double* x, const double* q, u32 dim, double q_norm) {
    double acc = 0.0, rr = 0.0;
    u32 c = 0;
    for (; c + 16 <= dim; c += 16) {
        double xv[16], qv[16];
#pragma unroll
        for (int j = 0; j < 16; j++) {
            xv[j] = x[c + j];
            qv[j] = q[c + j];
        }
#pragma unroll
        for (int j = 0; j < 16; j++) hg_exact_term<M>(acc, rr, xv[j], qv[j]);
    }
    for (; c < dim; c++) hg_exact_term<M>(acc, rr, x[c], q[c]);
    return hg_exact_finish(acc, rr, q_norm, M);
}

// Exact keys sh[i] = hg_f64_key(distance of slots[i]) for i < c, every thread of the block
// calling. With `stage_bytes` of shared memory at `stage`, the query and the rows are first
// copied there, widened to f64, by all threads at once: each thread's dim-long f64 sum then
// reads on chip and converts nothing, instead of waiting dim / 4 times in turn for device
// memory (10 us for one query's few candidates on the H100, against 1).
template <typename T>
__device__ void hg_rerank(u64* sh, const u32* slots, u32 c, const T* rows, u32 dim, const float* q, double q_norm,
                          int metric, double* stage, u32 stage_bytes) {
    // An odd pitch puts consecutive threads' rows on different banks. The query takes the
    // first line, candidate rows the others.
    u32 pitch = dim | 1u;
    u32 lines = stage_bytes / (8u * pitch);
    u32 fit = lines > 1 ? min(lines - 1, (u32)blockDim.x) : 0;
    if (fit == 0) {
        for (u32 i = threadIdx.x; i < c; i += blockDim.x) sh[i] = hg_f64_key(hg_exact<T>(rows, dim, slots[i], q, q_norm, metric));
        __syncthreads();
        return;
    }
    for (u32 i = threadIdx.x; i < dim; i += blockDim.x) stage[i] = (double)q[i];
    double* staged = stage + pitch;
    for (u32 first = 0; first < c; first += fit) {
        u32 n = min(fit, c - first);
        if ((dim & 3u) == 0) {
            u32 per = dim / 4;
#pragma unroll 4
            for (u32 i = threadIdx.x; i < n * per; i += blockDim.x) {
                u32 r = i / per, j = i % per;
                float4 v = hg_cached_load4<T>(rows, (u64)slots[first + r] * dim + 4 * j);
                double* to = staged + r * pitch + 4 * j;
                to[0] = (double)v.x;
                to[1] = (double)v.y;
                to[2] = (double)v.z;
                to[3] = (double)v.w;
            }
        } else {
#pragma unroll 4
            for (u32 i = threadIdx.x; i < n * dim; i += blockDim.x) {
                u32 r = i / dim, j = i % dim;
                staged[r * pitch + j] = (double)hg_load<T>(rows, (u64)slots[first + r] * dim + j);
            }
        }
        __syncthreads();
        if (threadIdx.x < n) {
            const double* x = staged + threadIdx.x * pitch;
            double d = metric == HG_L2     ? hg_exact_staged<HG_L2>(x, stage, dim, q_norm)
                       : metric == HG_DOT  ? hg_exact_staged<HG_DOT>(x, stage, dim, q_norm)
                       : metric == HG_L1   ? hg_exact_staged<HG_L1>(x, stage, dim, q_norm)
                       : metric == HG_LINF ? hg_exact_staged<HG_LINF>(x, stage, dim, q_norm)
                                           : hg_exact_staged<HG_COS>(x, stage, dim, q_norm);
            sh[first + threadIdx.x] = hg_f64_key(d);
        }
        __syncthreads();
    }
}

// The k-th smallest (1 <= k <= count) of `count` keys in shared memory: four rounds of an
// 8-bit radix select, each a histogram of the keys that match the digits found so far and a
// prefix sum over its 256 bins. `bins` is shared room for 256 counters, `state` for two words.
// Every thread of the block (exactly HG_BLOCK = 256 threads, one per bin) must call it.
#if HG_BLOCK != 256
#error "hg_block_kth gives each of its 256 bins to one thread"
#endif
__device__ u32 hg_block_kth(const u32* keys, u32 count, u32 k, u32* bins, u32* state) {
    __shared__ u32 totals[HG_BLOCK / 32];
    u32 t = threadIdx.x;
    if (t == 0) {
        state[0] = 0;
        state[1] = k;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        bins[t] = 0;
        __syncthreads();
        u32 prefix = state[0], rem = state[1];
        u32 high = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
        for (u32 i = t; i < count; i += HG_BLOCK) {
            u32 key = keys[i];
            if ((key & high) == prefix) atomicAdd(&bins[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        // Inclusive prefix sum of the bins: within each warp by shuffles, then over the
        // warps' totals (three barriers a round instead of sixteen).
        u32 count_t = bins[t], lane = t % HG_WARP, w = t / HG_WARP;
        u32 incl = count_t;
        for (u32 o = 1; o < HG_WARP; o <<= 1) {
            u32 y = HG_SHFL(incl, (lane + HG_WARP - o) % HG_WARP);
            if (lane >= o) incl += y;
        }
        if (lane == HG_WARP - 1) totals[w] = incl;
        __syncthreads();
        for (u32 i = 0; i < w; i++) incl += totals[i];
        // Exactly one bin holds the rem-th matching key: the digit of this round.
        u32 below = incl - count_t;
        if (below < rem && incl >= rem) {
            state[0] = prefix | (t << shift);
            state[1] = rem - below;
        }
        __syncthreads();
    }
    return state[0];
}

// grid (nq), block HG_BLOCK. Merges the S candidate lists of each query, checks that no row
// inside the band was lost (flags[q] = 1 if one was, and the host retries with more room, else
// 0), re-ranks the band in f64 and writes the k best (slot, exact distance), ties by slot.
// Lists are sorted (`sorted`: each scan or tile block's) or not (the fused filter's candidate
// buffers, with head = kcap_in so the band comes from a radix select over all of them).
// Dynamic shared memory: sortn u64s, then `stage_bytes` for hg_rerank.
template <typename T>
__device__ void hg_finalize(const u64* lists, const u64* evicted, u32 S, u32 head, u32 sorted, u32 kcap_in, u32 k,
                            u32 kcap, u32 sortn, const float* gate_mul, const float* gate_add, const T* rows,
                            u32 dim, const float* queries, const double* q_norms, int metric, u32* out_slots,
                            double* out_dist, u32* flags, u32 stage_bytes) {
    extern __shared__ __align__(16) u64 hg_smem[];
    __shared__ HgTopK st;
    __shared__ u32 band_count;
    __shared__ u64 tau;
    __shared__ u32 overflow, lost, direct;
    __shared__ u32 radix_state[2];
    u64* sh = hg_smem;
    u32 q = blockIdx.x;
    // One query per launch leaves the block alone on the device: fewer barriers win.
    bool alone = gridDim.x == 1;
    if (threadIdx.x == 0) {
        tau = HG_NONE;
        overflow = 0;
        lost = 0;
        direct = 0;
    }
    float mul = gate_mul[q], add = gate_add[q];
    const u64* in = lists + (u64)q * S * kcap_in;
    if (S == 1 && kcap_in == kcap && sorted) {
        hg_init(sh, &st, kcap, in, evicted[q], k, mul, add);
    } else {
        hg_init(sh, &st, kcap, 0, HG_NONE, k, mul, add);
        // An upper bound on the global k-th best gives a band from the start, so each sorted
        // list contributes only its prefix. The k-th smallest of any k real entries is such a
        // bound: the first `head` entries of every list (sorted here), or else the smallest
        // of the lists' k-th entries. Their distance keys go to shared memory (the host keeps
        // S * head <= sortn, so keys and a radix select's bins fit in sortn u64s)...
        u32 total = S * head;
        u32* keys = (u32*)sh;
        // ...in the same pass as the smallest entry any list evicted, folded by every thread
        // over a stride of the lists (one thread reading all S of them in turn took 60 us for
        // one query), so both reads wait for memory once.
        u64 ev = HG_NONE;
        for (u32 i = threadIdx.x; i < max(S, total); i += blockDim.x) {
            if (i < S) ev = min(ev, evicted[(u64)q * S + i]);
            if (i < total) keys[i] = (u32)(in[(u64)(i / head) * kcap_in + i % head] >> 32);
        }
        if (ev != HG_NONE) atomicMin(&st.evicted, ev);
        __syncthreads();
        if (head > 0) {
            // The k-th smallest of the heads by a radix select (sorting them took half of the
            // whole merge).
            u32* bins = keys + total;
            if (total >= k) {
                u32 kth = hg_block_kth(keys, total, k, bins, radix_state);
                // All ones is an empty slot (HG_NONE): fewer than k real heads, no bound.
                if (threadIdx.x == 0 && kth != 0xffffffffu) tau = (u64)kth << 32;
            }
            __syncthreads();
            for (u32 i = threadIdx.x; i < (total + HG_BLOCK + 1) / 2; i += blockDim.x) sh[i] = HG_NONE;
        } else {
            for (u32 s = threadIdx.x; s < S; s += blockDim.x) atomicMin(&tau, in[(u64)s * kcap_in + k - 1]);
        }
        __syncthreads();
        if (tau != HG_NONE) {
            float thr0 = hg_band(hg_entry_dist(tau), mul, add);
            u32 bcap = sortn - kcap;
            if (sorted) {
                for (u32 s = threadIdx.x; s < S; s += blockDim.x) {
                    for (u32 i = 0; i < kcap_in; i++) {
                        u64 e = in[(u64)s * kcap_in + i];
                        if (e == HG_NONE || hg_entry_dist(e) > thr0) break;
                        u32 pos = atomicAdd(&st.count, 1u);
                        if (pos < bcap) sh[kcap + pos] = e;
                        else overflow = 1;
                    }
                }
            } else {
                for (u32 i = threadIdx.x; i < S * kcap_in; i += blockDim.x) {
                    u64 e = in[i];
                    if (e == HG_NONE || hg_entry_dist(e) > thr0) continue;
                    u32 pos = atomicAdd(&st.count, 1u);
                    if (pos < bcap) sh[kcap + pos] = e;
                    else overflow = 1;
                }
            }
            __syncthreads();
            if (!overflow && !sorted && st.count <= kcap) {
                // tau is the k-th smallest entry of all, so what was collected is the band
                // itself: it goes to the re-rank unsorted (in sh[0, count)), without a merge.
                for (u32 i = threadIdx.x; i < st.count; i += blockDim.x) sh[i] = sh[kcap + i];
                if (threadIdx.x == 0) direct = 1;
                __syncthreads();
            } else if (!overflow && alone && st.count <= kcap && st.count <= blockDim.x) {
                // Few entries and a lone block: sort them by rank into the empty list (one
                // barrier instead of the merge's bitonic network). Nothing is evicted.
                u32 count = st.count;
                if (threadIdx.x < count) {
                    u64 e = sh[kcap + threadIdx.x];
                    u32 rank = 0;
                    for (u32 j = 0; j < count; j++) rank += sh[kcap + j] < e;
                    sh[rank] = e;
                }
                __syncthreads();
            } else if (!overflow) {
                if (st.count > 0) hg_merge(sh, &st, k, kcap, sortn, mul, add);
            } else {
                __syncthreads();
                if (threadIdx.x == 0) st.count = 0;
                __syncthreads();
            }
        }
    }
    if (!(S == 1 && kcap_in == kcap && sorted) && (tau == HG_NONE || overflow)) {
        // The general merge: stream every entry of every list.
        u32 total = S * kcap_in;
        u32 bcap = sortn - kcap;
        for (u32 base = 0; base < total; base += blockDim.x) {
            if (hg_must_merge(&st, blockDim.x, bcap)) hg_merge(sh, &st, k, kcap, sortn, mul, add);
            float thr = st.thr;
            u32 i = base + threadIdx.x;
            if (i < total) {
                u64 e = in[i];
                if (e != HG_NONE && hg_entry_dist(e) <= thr) {
                    u32 pos = atomicAdd(&st.count, 1u);
                    sh[kcap + pos] = e;
                }
            }
            __syncthreads();
        }
        if (st.count > 0) hg_merge(sh, &st, k, kcap, sortn, mul, add);
    }
    __syncthreads();
    // Fewer than k entries in all (an inverted-list scan can find fewer rows than k): every
    // one is inside the band.
    u64 kth_entry = direct ? tau : sh[k - 1];
    float band = kth_entry == HG_NONE ? __uint_as_float(0x7f800000u) : hg_band(hg_entry_dist(kth_entry), mul, add);
    if (threadIdx.x == 0) {
        band_count = direct ? st.count : 0;
        // Written so that a NaN band or threshold counts as lost: the query is searched again.
        lost = st.evicted != HG_NONE && !(hg_entry_dist(st.evicted) > band);
        flags[q] = lost;
    }
    __syncthreads();
    if (lost) return;
    for (u32 i = threadIdx.x; i < kcap && !direct; i += blockDim.x) {
        if (sh[i] != HG_NONE && hg_entry_dist(sh[i]) <= band) atomicMax(&band_count, i + 1);
    }
    __syncthreads();
    u32 c = band_count;
    u32 cp = 1;
    while (cp < c) cp <<= 1;
    // Candidate slots move to the upper half; their exact keys take the lower.
    u32* slots = (u32*)(sh + kcap);
    for (u32 i = threadIdx.x; i < cp; i += blockDim.x) slots[i] = i < c ? (u32)sh[i] : 0xffffffffu;
    __syncthreads();
    for (u32 i = threadIdx.x; i < cp; i += blockDim.x) sh[i] = HG_NONE;
    __syncthreads();
    const float* qv = queries + (u64)q * dim;
    double q_norm = q_norms[q];
    hg_rerank<T>(sh, slots, c, rows, dim, qv, q_norm, metric, (double*)(sh + sortn), stage_bytes);
    if (alone && cp <= blockDim.x) hg_rank_sort(sh, slots, cp);
    else hg_bitonic(sh, slots, cp);
    // Past the c real entries (only where fewer than k exist) the slot is all ones.
    for (u32 i = threadIdx.x; i < k; i += blockDim.x) {
        out_slots[(u64)q * k + i] = i < c ? slots[i] : 0xffffffffu;
        out_dist[(u64)q * k + i] = i < c ? hg_key_f64(sh[i]) : 0.0;
    }
}

extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_finalize_f32(const u64* lists, const u64* evicted, u32 segments,
        u32 head, u32 sorted, u32 kcap_in, u32 k, u32 kcap, u32 sortn, const float* gate_mul, const float* gate_add, const float* rows,
        u32 dim, const float* queries, const double* q_norms, int metric, u32* out_slots, double* out_dist,
        u32* flags, u32 stage_bytes) {
    hg_finalize<float>(lists, evicted, segments, head, sorted, kcap_in, k, kcap, sortn, gate_mul, gate_add, rows, dim, queries,
                       q_norms, metric, out_slots, out_dist, flags, stage_bytes);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_finalize_f16(const u64* lists, const u64* evicted, u32 segments,
        u32 head, u32 sorted, u32 kcap_in, u32 k, u32 kcap, u32 sortn, const float* gate_mul, const float* gate_add, const u16* rows,
        u32 dim, const float* queries, const double* q_norms, int metric, u32* out_slots, double* out_dist,
        u32* flags, u32 stage_bytes) {
    hg_finalize<u16>(lists, evicted, segments, head, sorted, kcap_in, k, kcap, sortn, gate_mul, gate_add, rows, dim, queries,
                       q_norms, metric, out_slots, out_dist, flags, stage_bytes);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_finalize_bf16(const u64* lists, const u64* evicted, u32 segments,
        u32 head, u32 sorted, u32 kcap_in, u32 k, u32 kcap, u32 sortn, const float* gate_mul, const float* gate_add, const hg_bf16* rows,
        u32 dim, const float* queries, const double* q_norms, int metric, u32* out_slots, double* out_dist,
        u32* flags, u32 stage_bytes) {
    hg_finalize<hg_bf16>(lists, evicted, segments, head, sorted, kcap_in, k, kcap, sortn, gate_mul, gate_add, rows, dim, queries,
                       q_norms, metric, out_slots, out_dist, flags, stage_bytes);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_finalize_i8(const u64* lists, const u64* evicted, u32 segments,
        u32 head, u32 sorted, u32 kcap_in, u32 k, u32 kcap, u32 sortn, const float* gate_mul, const float* gate_add, const i8* rows,
        u32 dim, const float* queries, const double* q_norms, int metric, u32* out_slots, double* out_dist,
        u32* flags, u32 stage_bytes) {
    hg_finalize<i8>(lists, evicted, segments, head, sorted, kcap_in, k, kcap, sortn, gate_mul, gate_add, rows, dim, queries,
                       q_norms, metric, out_slots, out_dist, flags, stage_bytes);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_finalize_u8(const u64* lists, const u64* evicted, u32 segments,
        u32 head, u32 sorted, u32 kcap_in, u32 k, u32 kcap, u32 sortn, const float* gate_mul, const float* gate_add, const u8* rows,
        u32 dim, const float* queries, const double* q_norms, int metric, u32* out_slots, double* out_dist,
        u32* flags, u32 stage_bytes) {
    hg_finalize<u8>(lists, evicted, segments, head, sorted, kcap_in, k, kcap, sortn, gate_mul, gate_add, rows, dim, queries,
                       q_norms, metric, out_slots, out_dist, flags, stage_bytes);
}

// ---- Radix-select path (any k): state = {prefix, mask, remaining k, candidate count}. ----

extern "C" __global__ void hg_radix_hist(const float* dist, u32 n, const u32* state, u32 shift, u32* hist) {
    __shared__ u32 local[256];
    for (u32 i = threadIdx.x; i < 256; i += blockDim.x) local[i] = 0;
    __syncthreads();
    u32 prefix = state[0], mask = state[1];
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        u32 key = hg_f32_key(dist[i]);
        if ((key & mask) == prefix) atomicAdd(&local[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    for (u32 i = threadIdx.x; i < 256; i += blockDim.x)
        if (local[i]) atomicAdd(&hist[i], local[i]);
}

// One thread: picks the bucket holding the remaining k-th key and clears the histogram.
extern "C" __global__ void hg_radix_pick(u32* hist, u32* state, u32 shift) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    u32 remaining = state[2], below = 0, bucket = 255;
    for (u32 b = 0; b < 256; b++) {
        if (below + hist[b] >= remaining) { bucket = b; break; }
        below += hist[b];
    }
    state[0] |= bucket << shift;
    state[1] |= 255u << shift;
    state[2] = remaining - below;
    for (u32 b = 0; b < 256; b++) hist[b] = 0;
}

// Every row within the band of the k-th distance (state[0] is its key) becomes a candidate.
extern "C" __global__ void hg_radix_collect(const float* dist, u32 n, u32* state, float mul, float add, u32* cand) {
    float band = hg_band(hg_key_f32(state[0]), mul, add);
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        if (dist[i] <= band) cand[atomicAdd(&state[3], 1u)] = i;
    }
}

// Exact f64 key of each candidate (thread per candidate); pads keys up to `padded` with HG_NONE.
template <typename T>
__device__ void hg_rerank_list(const u32* cand, u32 count, u32 padded, const T* rows, u32 dim, const float* q,
                               double q_norm, int metric, u64* keys, u32* slots) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < padded; i += gridDim.x * blockDim.x) {
        if (i < count) {
            keys[i] = hg_f64_key(hg_exact<T>(rows, dim, cand[i], q, q_norm, metric));
            slots[i] = cand[i];
        } else {
            keys[i] = HG_NONE;
            slots[i] = 0xffffffffu;
        }
    }
}
extern "C" __global__ void hg_rerank_list_f32(const u32* cand, u32 count, u32 padded, const float* rows, u32 dim,
                                              const float* q, double q_norm, int metric, u64* keys, u32* slots) {
    hg_rerank_list<float>(cand, count, padded, rows, dim, q, q_norm, metric, keys, slots);
}
extern "C" __global__ void hg_rerank_list_f16(const u32* cand, u32 count, u32 padded, const u16* rows, u32 dim,
                                              const float* q, double q_norm, int metric, u64* keys, u32* slots) {
    hg_rerank_list<u16>(cand, count, padded, rows, dim, q, q_norm, metric, keys, slots);
}
extern "C" __global__ void hg_rerank_list_bf16(const u32* cand, u32 count, u32 padded, const hg_bf16* rows, u32 dim,
                                              const float* q, double q_norm, int metric, u64* keys, u32* slots) {
    hg_rerank_list<hg_bf16>(cand, count, padded, rows, dim, q, q_norm, metric, keys, slots);
}
extern "C" __global__ void hg_rerank_list_i8(const u32* cand, u32 count, u32 padded, const i8* rows, u32 dim,
                                              const float* q, double q_norm, int metric, u64* keys, u32* slots) {
    hg_rerank_list<i8>(cand, count, padded, rows, dim, q, q_norm, metric, keys, slots);
}
extern "C" __global__ void hg_rerank_list_u8(const u32* cand, u32 count, u32 padded, const u8* rows, u32 dim,
                                              const float* q, double q_norm, int metric, u64* keys, u32* slots) {
    hg_rerank_list<u8>(cand, count, padded, rows, dim, q, q_norm, metric, keys, slots);
}

// ---- Refine of a whole batch in one launch: each query's candidate slots to its exact top-k.
// Launch contract: grid (queries), block HG_BLOCK. Query q's candidates are either
// cand[offsets[q] .. offsets[q + 1]] (`entries` null), or, where a coded scan left them on the
// device, the leading entries of entries[q * stride .. (q + 1) * stride] that are not HG_NONE
// (hg_entry: the slot in the low 32 bits; a scan writes its found entries first, HG_NONE
// after them). Either way they are distinct stored rows, at most `room` of them (a power of
// two of at least 2, so the u32 slots after the u64 keys end on an 8-byte boundary for the
// stage). Its k output entries get the first min(k, count) of the candidates in (distance,
// slot) order and all-ones slots after them. Dynamic shared memory: `room` u64 keys, `room`
// u32 slots, then `stage_bytes` for hg_rerank.
template <typename T>
__device__ void hg_refine_lists(const u32* cand, const u32* offsets, const T* rows, u32 dim, const float* queries,
                                const double* q_norms, int metric, u32 k, u32 room, u32* out_slots, double* out_dist,
                                u32 stage_bytes, const u64* entries, u32 stride) {
    extern __shared__ __align__(16) u64 hg_smem[];
    u64* keys = hg_smem;
    u32* slots = (u32*)(hg_smem + room);
    u32 q = blockIdx.x;
    u64 first;
    u32 count;
    if (entries) {
        first = (u64)q * stride;
        // Every thread takes part in every round: __syncthreads_count is a barrier.
        count = 0;
        for (u32 base = 0; base < stride; base += blockDim.x) {
            u32 i = base + threadIdx.x;
            count += __syncthreads_count(i < stride && entries[first + i] != HG_NONE);
        }
        count = min(count, room);
    } else {
        first = offsets[q];
        count = min(offsets[q + 1] - (u32)first, room);
    }
    u32 cp = 1;
    while (cp < count) cp <<= 1;
    // Padding sorts last: all-ones keys, then all-ones slots.
    for (u32 i = threadIdx.x; i < cp; i += blockDim.x) {
        if (i < count) slots[i] = entries ? (u32)(entries[first + i] & 0xffffffffu) : cand[first + i];
        else slots[i] = 0xffffffffu;
        keys[i] = HG_NONE;
    }
    __syncthreads();
    hg_rerank<T>(keys, slots, count, rows, dim, queries + (u64)q * dim, q_norms[q], metric,
                 (double*)(slots + room), stage_bytes);
    __syncthreads();
    hg_bitonic(keys, slots, cp);
    for (u32 i = threadIdx.x; i < k; i += blockDim.x) {
        out_slots[(u64)q * k + i] = i < count ? slots[i] : 0xffffffffu;
        out_dist[(u64)q * k + i] = i < count ? hg_key_f64(keys[i]) : 0.0;
    }
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_refine_lists_f32(const u32* cand, const u32* offsets,
        const float* rows, u32 dim, const float* queries, const double* q_norms, int metric, u32 k, u32 room,
        u32* out_slots, double* out_dist, u32 stage_bytes, const u64* entries, u32 stride) {
    hg_refine_lists<float>(cand, offsets, rows, dim, queries, q_norms, metric, k, room, out_slots, out_dist,
                           stage_bytes, entries, stride);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_refine_lists_f16(const u32* cand, const u32* offsets,
        const u16* rows, u32 dim, const float* queries, const double* q_norms, int metric, u32 k, u32 room,
        u32* out_slots, double* out_dist, u32 stage_bytes, const u64* entries, u32 stride) {
    hg_refine_lists<u16>(cand, offsets, rows, dim, queries, q_norms, metric, k, room, out_slots, out_dist,
                           stage_bytes, entries, stride);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_refine_lists_bf16(const u32* cand, const u32* offsets,
        const hg_bf16* rows, u32 dim, const float* queries, const double* q_norms, int metric, u32 k, u32 room,
        u32* out_slots, double* out_dist, u32 stage_bytes, const u64* entries, u32 stride) {
    hg_refine_lists<hg_bf16>(cand, offsets, rows, dim, queries, q_norms, metric, k, room, out_slots, out_dist,
                           stage_bytes, entries, stride);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_refine_lists_i8(const u32* cand, const u32* offsets,
        const i8* rows, u32 dim, const float* queries, const double* q_norms, int metric, u32 k, u32 room,
        u32* out_slots, double* out_dist, u32 stage_bytes, const u64* entries, u32 stride) {
    hg_refine_lists<i8>(cand, offsets, rows, dim, queries, q_norms, metric, k, room, out_slots, out_dist,
                           stage_bytes, entries, stride);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_refine_lists_u8(const u32* cand, const u32* offsets,
        const u8* rows, u32 dim, const float* queries, const double* q_norms, int metric, u32 k, u32 room,
        u32* out_slots, double* out_dist, u32 stage_bytes, const u64* entries, u32 stride) {
    hg_refine_lists<u8>(cand, offsets, rows, dim, queries, q_norms, metric, k, room, out_slots, out_dist,
                           stage_bytes, entries, stride);
}

// ---- The k smallest (key, slot) pairs of a long re-ranked list, in time linear in its length.
// Sorting the whole list costs n log^2 n; when many rows tie inside the band (duplicates) the
// list is most of the collection. Instead: a radix select over the 96-bit composite of the
// 64-bit key, then the 32-bit slot, 8 bits a pass (12 passes). Slots are unique, so after the
// last pass the prefix is the k-th composite itself, and exactly k pairs are at or below it.
// state (u32 words): {key prefix lo, hi, key mask lo, hi, slot prefix, slot mask, remaining, count}.
// Launch contract: hist and collect over a grid-stride loop of any size; pick on one thread;
// `hist` is 256 zeroed words before the first pass (pick clears it for the next).

__device__ __forceinline__ u32 hg_composite_digit(u64 key, u32 slot, u32 pass) {
    return pass < 8 ? (u32)(key >> (56 - 8 * pass)) & 255u : (slot >> (24 - 8 * (pass - 8))) & 255u;
}

__device__ __forceinline__ bool hg_composite_matches(u64 key, u32 slot, const u32* state) {
    u64 prefix = ((u64)state[1] << 32) | state[0], mask = ((u64)state[3] << 32) | state[2];
    return (key & mask) == prefix && (slot & state[5]) == state[4];
}

extern "C" __global__ void hg_select_hist(const u64* keys, const u32* slots, u32 n, const u32* state, u32 pass,
                                          u32* hist) {
    __shared__ u32 local[256];
    for (u32 i = threadIdx.x; i < 256; i += blockDim.x) local[i] = 0;
    __syncthreads();
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        u64 key = keys[i];
        u32 slot = slots[i];
        if (hg_composite_matches(key, slot, state)) atomicAdd(&local[hg_composite_digit(key, slot, pass)], 1u);
    }
    __syncthreads();
    for (u32 i = threadIdx.x; i < 256; i += blockDim.x)
        if (local[i]) atomicAdd(&hist[i], local[i]);
}

// One thread: the bucket holding the remaining k-th composite joins the prefix; clears `hist`.
extern "C" __global__ void hg_select_pick(u32* hist, u32* state, u32 pass) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    u32 remaining = state[6], below = 0, bucket = 255;
    for (u32 b = 0; b < 256; b++) {
        if (below + hist[b] >= remaining) { bucket = b; break; }
        below += hist[b];
    }
    if (pass < 8) {
        u32 shift = 56 - 8 * pass, word = shift / 32, bit = shift % 32;
        state[word] |= bucket << bit;
        state[2 + word] |= 255u << bit;
    } else {
        u32 shift = 24 - 8 * (pass - 8);
        state[4] |= bucket << shift;
        state[5] |= 255u << shift;
    }
    state[6] = remaining - below;
    for (u32 b = 0; b < 256; b++) hist[b] = 0;
}

// Every pair at or below the k-th composite (exactly k of them) into `out_keys` / `out_slots`.
extern "C" __global__ void hg_select_collect(const u64* keys, const u32* slots, u32 n, u32* state, u64* out_keys,
                                             u32* out_slots) {
    u64 kth = ((u64)state[1] << 32) | state[0];
    u32 kth_slot = state[4];
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        u64 key = keys[i];
        u32 slot = slots[i];
        if (key < kth || (key == kth && slot <= kth_slot)) {
            u32 at = atomicAdd(&state[7], 1u);
            out_keys[at] = key;
            out_slots[at] = slot;
        }
    }
}

// One compare-exchange step of a bitonic sort over global memory (key, slot) pairs.
extern "C" __global__ void hg_bitonic_step(u64* keys, u32* slots, u32 n, u32 size, u32 stride) {
    u32 t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n / 2) return;
    u32 i = 2 * t - (t & (stride - 1));
    u32 j = i + stride;
    bool up = (i & size) == 0;
    u64 a = keys[i], b = keys[j];
    u32 va = slots[i], vb = slots[j];
    bool greater = a > b || (a == b && va > vb);
    if (greater == up) {
        keys[i] = b; keys[j] = a;
        slots[i] = vb; slots[j] = va;
    }
}

// Keys -> (slot, f64 distance) of the first k, and the query's flag cleared (the radix path
// loses nothing).
extern "C" __global__ void hg_write_results(const u64* keys, const u32* slots, u32 k, u32* out_slots, double* out_dist,
                                            u32* flag) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < k) { out_slots[i] = slots[i]; out_dist[i] = hg_key_f64(keys[i]); }
    if (i == 0) *flag = 0;
}
