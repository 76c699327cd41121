//! The f32 matrix product every host path multiplies queries with rows by (the `gemm`
//! crate, single-threaded: callers split the work over their own threads).

/// `products[i][j] = queries[i] . rows[j]` for `nq` queries and `count` rows (row-major).
pub(crate) fn inner_products(
    queries: &[f32],
    rows: &[f32],
    dim: usize,
    nq: usize,
    count: usize,
    products: &mut [f32],
) {
    assert!(queries.len() >= nq * dim && rows.len() >= count * dim && products.len() >= nq * count);
    // SAFETY: the assert above bounds every access: lhs is nq x dim row-major (row stride dim),
    // rhs is the transpose of `rows` (dim x count, column stride dim), dst is nq x count
    // row-major (row stride count). The three buffers are distinct borrows, so they do not alias.
    unsafe {
        gemm::gemm(
            nq,
            count,
            dim,
            products.as_mut_ptr(),
            1,
            count as isize,
            false,
            queries.as_ptr(),
            1,
            dim as isize,
            rows.as_ptr(),
            dim as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}
