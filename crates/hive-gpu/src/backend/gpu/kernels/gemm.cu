// The engine's own GEMM, for devices without a BLAS library (ROCm without rocBLAS) and to
// test that path on CUDA (HIVE_GPU_OWN_GEMM=1). Same contract as the driver's GemmTn:
// c[col * ldc + row] = dot(a[row * lda ..], b[col * ldb ..]) over k, f32 accumulation.
// The same tiles (`hg_tiles`) compute L1 and L-infinity distances, which have no BLAS
// (c[col * ldc + row] = sum or max over k of |a - b|), and the products of bf16 and byte rows
// against f32 queries.
// A block of 256 threads computes 64 rows x 64 queries, 4 x 4 per thread, 16 dimensions of
// both operands staged in shared memory per step. Any summation order meets the f32 bound
// the gate assumes (a maximum is exact); f16 operands are widened exactly, as the tensor
// cores do, and the zeros that pad a step beyond k add nothing to either norm.

#define HG_GEMM_TILE 64
#define HG_GEMM_STEP 16

#define HG_PAIR_DOT 0
#define HG_PAIR_L1 1
#define HG_PAIR_LINF 2

template <int OP> __device__ __forceinline__ float hg_pair_term(float x, float y, float acc) {
    if (OP == HG_PAIR_L1) return acc + fabsf(x - y);
    if (OP == HG_PAIR_LINF) return fmaxf(acc, fabsf(x - y));
    return fmaf(x, y, acc);
}

template <typename TA, typename TB, int OP>
__device__ void hg_pair_tile(const TA* a, u32 lda, const TB* b, u32 ldb, float* c, u32 ldc, u32 m, u32 n, u32 k) {
    // One column of padding keeps the transposed stores free of bank conflicts.
    __shared__ float as[HG_GEMM_STEP][HG_GEMM_TILE + 1];
    __shared__ float bs[HG_GEMM_STEP][HG_GEMM_TILE + 1];
    u32 row0 = blockIdx.x * HG_GEMM_TILE, col0 = blockIdx.y * HG_GEMM_TILE;
    u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (u32 k0 = 0; k0 < k; k0 += HG_GEMM_STEP) {
#pragma unroll
        for (u32 l = 0; l < (HG_GEMM_TILE * HG_GEMM_STEP) / HG_BLOCK; l++) {
            u32 i = threadIdx.x + HG_BLOCK * l;
            u32 r = i / HG_GEMM_STEP, d = i % HG_GEMM_STEP;
            u32 dim = k0 + d;
            u32 row = row0 + r, col = col0 + r;
            as[d][r] = (row < m && dim < k) ? hg_load<TA>(a, (u64)row * lda + dim) : 0.0f;
            bs[d][r] = (col < n && dim < k) ? hg_load<TB>(b, (u64)col * ldb + dim) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (u32 d = 0; d < HG_GEMM_STEP; d++) {
            float x[4], y[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                x[i] = as[d][tx + 16 * i];
                y[i] = bs[d][ty + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = hg_pair_term<OP>(x[i], y[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        u32 col = col0 + ty + 16 * j;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            u32 row = row0 + tx + 16 * i;
            if (row < m && col < n) c[(u64)col * ldc + row] = acc[i][j];
        }
    }
}

extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_gemm_tn_f32(const float* a, u32 lda, const float* b,
        u32 ldb, float* c, u32 ldc, u32 m, u32 n, u32 k) {
    hg_pair_tile<float, float, HG_PAIR_DOT>(a, lda, b, ldb, c, ldc, m, n, k);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_gemm_tn_f16(const u16* a, u32 lda, const u16* b,
        u32 ldb, float* c, u32 ldc, u32 m, u32 n, u32 k) {
    hg_pair_tile<u16, u16, HG_PAIR_DOT>(a, lda, b, ldb, c, ldc, m, n, k);
}

// The tile path's input for what no BLAS computes: rows `a` of any stored type against f32
// queries `b`, laid out as hg_gemm_tn's products. L1 (metric HG_L1) and L-infinity (HG_LINF)
// get their distances; every other metric gets dot products (bf16 and byte rows, which no BLAS
// multiplies against f32 queries). Each stored element widens to f32 exactly, so the products
// are f32 products of the stored values and the f32 bound of the gate holds as for f32 rows.
template <typename T>
__device__ void hg_tiles(const T* a, u32 lda, const float* b, u32 ldb, float* c, u32 ldc, u32 m, u32 n, u32 k,
                         int metric) {
    if (metric == HG_LINF) hg_pair_tile<T, float, HG_PAIR_LINF>(a, lda, b, ldb, c, ldc, m, n, k);
    else if (metric == HG_L1) hg_pair_tile<T, float, HG_PAIR_L1>(a, lda, b, ldb, c, ldc, m, n, k);
    else hg_pair_tile<T, float, HG_PAIR_DOT>(a, lda, b, ldb, c, ldc, m, n, k);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_tiles_f32(const float* a, u32 lda, const float* b,
        u32 ldb, float* c, u32 ldc, u32 m, u32 n, u32 k, int metric) {
    hg_tiles<float>(a, lda, b, ldb, c, ldc, m, n, k, metric);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_tiles_f16(const u16* a, u32 lda, const float* b,
        u32 ldb, float* c, u32 ldc, u32 m, u32 n, u32 k, int metric) {
    hg_tiles<u16>(a, lda, b, ldb, c, ldc, m, n, k, metric);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_tiles_bf16(const hg_bf16* a, u32 lda, const float* b,
        u32 ldb, float* c, u32 ldc, u32 m, u32 n, u32 k, int metric) {
    hg_tiles<hg_bf16>(a, lda, b, ldb, c, ldc, m, n, k, metric);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_tiles_i8(const i8* a, u32 lda, const float* b,
        u32 ldb, float* c, u32 ldc, u32 m, u32 n, u32 k, int metric) {
    hg_tiles<i8>(a, lda, b, ldb, c, ldc, m, n, k, metric);
}
extern "C" __global__ void __launch_bounds__(HG_BLOCK) hg_tiles_u8(const u8* a, u32 lda, const float* b,
        u32 ldb, float* c, u32 ldc, u32 m, u32 n, u32 k, int metric) {
    hg_tiles<u8>(a, lda, b, ldb, c, ldc, m, n, k, metric);
}
