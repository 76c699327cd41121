// Row maintenance: squared norms of new rows and compaction on the device.

template <typename T>
__device__ void hg_norms(const T* rows, u32 dim, u32 first, u32 count, float* norms) {
    u32 warps_total = gridDim.x * (blockDim.x / HG_WARP);
    u32 warp = blockIdx.x * (blockDim.x / HG_WARP) + threadIdx.x / HG_WARP;
    u32 lane = threadIdx.x % HG_WARP;
    for (u32 i = warp; i < count; i += warps_total) {
        u32 slot = first + i;
        double acc = 0.0;
        for (u32 c = lane; c < dim; c += HG_WARP) {
            double x = (double)hg_load<T>(rows, (u64)slot * dim + c);
            acc += x * x;
        }
        acc = hg_warp_sum_f64(acc);
        if (lane == 0) norms[slot] = (float)acc;
    }
}
// Squared norms (summed in f64, rounded to f32) of slots [first, first + count).
extern "C" __global__ void hg_norms_f32(const float* rows, u32 dim, u32 first, u32 count, float* norms) {
    hg_norms<float>(rows, dim, first, count, norms);
}
extern "C" __global__ void hg_norms_f16(const u16* rows, u32 dim, u32 first, u32 count, float* norms) {
    hg_norms<u16>(rows, dim, first, count, norms);
}
extern "C" __global__ void hg_norms_bf16(const hg_bf16* rows, u32 dim, u32 first, u32 count, float* norms) {
    hg_norms<hg_bf16>(rows, dim, first, count, norms);
}
extern "C" __global__ void hg_norms_i8(const i8* rows, u32 dim, u32 first, u32 count, float* norms) {
    hg_norms<i8>(rows, dim, first, count, norms);
}
extern "C" __global__ void hg_norms_u8(const u8* rows, u32 dim, u32 first, u32 count, float* norms) {
    hg_norms<u8>(rows, dim, first, count, norms);
}

// dst[i] = src[keep[i]] for rows of `row_bytes` bytes, and norms alongside: copied in 4-byte
// words where the rows are whole words (f32, and f16 / bf16 / byte rows of even or 4-multiple
// lengths), else in 2-byte or single bytes (byte rows of odd length).
template <typename W>
__device__ void hg_gather_units(const W* src, W* dst, u64 units, const u32* keep, u32 count, const float* norms_src,
                                float* norms_dst) {
    u64 total = units * count;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        u64 row = i / units, w = i % units;
        dst[i] = src[(u64)keep[row] * units + w];
        if (w == 0) norms_dst[row] = norms_src[keep[row]];
    }
}
extern "C" __global__ void hg_gather(const u8* src, u8* dst, u64 row_bytes, const u32* keep, u32 count,
                                     const float* norms_src, float* norms_dst) {
    if ((row_bytes & 3u) == 0)
        hg_gather_units<u32>((const u32*)src, (u32*)dst, row_bytes / 4, keep, count, norms_src, norms_dst);
    else if ((row_bytes & 1u) == 0)
        hg_gather_units<u16>((const u16*)src, (u16*)dst, row_bytes / 2, keep, count, norms_src, norms_dst);
    else
        hg_gather_units<u8>(src, dst, row_bytes, keep, count, norms_src, norms_dst);
}

// out[i] = norms[i * stride] for i < count: a sample's norms side by side, so the threshold
// kernel over its GEMM tile (hg_sample_tau) reads them in whole lines instead of one line a row.
extern "C" __global__ void hg_strided_norms(const float* norms, u32 stride, u32 count, float* out) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
        out[i] = norms[(u64)i * stride];
}
