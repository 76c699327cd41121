//! The sample plan of the filtered batch paths (the CUDA/ROCm engine's fused filter and wgpu's
//! cooperative-matrix filter): which sample row gives a query's threshold, and how long the
//! candidate lists are.

/// The fused filters' thresholds come from the queries' distances to every `SAMPLE_STRIDE`-th row.
pub(crate) const SAMPLE_STRIDE: usize = 32;
/// Candidate entries per query in the fused filter's buffer.
pub(crate) const FUSED_CAP: usize = 2048;

/// The rank j in the sample (every `SAMPLE_STRIDE`-th of `len` slots, `live` of them live)
/// whose distance gives a filter threshold for k neighbors: about 2k + 8 * SAMPLE_STRIDE rows
/// of the collection are expected below it. None where the sample is too small for one.
pub(crate) fn sample_rank(len: usize, live: usize, k: usize) -> Option<usize> {
    let j = (2 * k).div_ceil(SAMPLE_STRIDE) + 8;
    (len.div_ceil(SAMPLE_STRIDE) >= 4 * j && live >= len / 2).then_some(j)
}

/// The candidate list size of a tensor-core path for k: room for its wider band.
pub(crate) fn wide_list_size(k: usize) -> usize {
    (k + (2 * k).max(128)).next_power_of_two()
}
