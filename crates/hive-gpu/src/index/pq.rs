//! The product quantizer of IVF-PQ and the flat PQ index: a residual (a vector less its list's
//! centroid) cut into `m` sub-vectors, each replaced by the number of the nearest of `2^bits`
//! centroids trained for its sub-space ([`crate::backend::pq`] has the layout and the scan's
//! distance).
//!
//! Training is k-means per sub-space ([`crate::index::kmeans`], so on the collection's device:
//! every assignment step is the backend's exact 1-NN), and encoding is the same 1-NN of each
//! sub-vector over its codebook ([`RowStore::nearest_rows`]), which the codebooks keep on the
//! backend as flat row stores.
//! Both follow FAISS's `ProductQuantizer` defaults: 25 Lloyd iterations on at most 256
//! training vectors per centroid.

use rayon::prelude::*;

use crate::backend::pq::{code_at, code_bytes};
use crate::backend::{GpuBackend, RowStore};
use crate::error::{HiveGpuError, Result};
use crate::index::kmeans::{self, KMeansParams};
use crate::types::{SearchPrecision, StoragePrecision};

/// Lloyd iterations of each codebook's training (FAISS's `ProductQuantizer` default).
const CODEBOOK_ITERATIONS: usize = 25;
/// Training vectors per codebook centroid at most (FAISS's default).
const TRAINING_PER_CENTROID: usize = 256;
/// Seed of each codebook's k-means (offset by the sub-quantizer's number).
const SEED: u64 = 4321;
/// Sub-vectors encoded per `nearest_rows` call, bounding the copy each call reads.
const ENCODE_PIECE: usize = 1 << 16;

/// `m` codebooks of `2^bits` centroids each, over consecutive sub-vectors.
#[derive(Debug)]
pub(crate) struct ProductQuantizer {
    dim: usize,
    m: usize,
    bits: usize,
    /// Codebook `j`'s centroid `c` is `codebooks[(j * 2^bits + c) * sub..][..sub]`.
    codebooks: Vec<f32>,
    /// The same codebooks on the collection's backend: encoding is their exact 1-NN.
    books: Vec<Box<dyn RowStore>>,
    /// Sub-quantizers encoded at once ([`crate::Tuning::piece_workers`]).
    workers: usize,
}

impl ProductQuantizer {
    /// Checks that `m` sub-quantizers of `bits` bits cut `dim` components.
    pub(crate) fn check_shape(dim: usize, m: usize, bits: usize) -> Result<()> {
        if m == 0 || !dim.is_multiple_of(m) || !matches!(bits, 4 | 8) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "product quantization needs m dividing the dimension and 4 or 8 bits: m = {m} of a {dim}-dimensional collection, {bits} bits"
            )));
        }
        Ok(())
    }

    /// Trains the codebooks on `residuals` (row-major, `dim` per row, at least `2^bits` rows)
    /// with `backend`'s k-means.
    pub(crate) fn train(
        backend: &dyn GpuBackend,
        tuning: &crate::tuning::Tuning,
        residuals: &[f32],
        dim: usize,
        m: usize,
        bits: usize,
    ) -> Result<Self> {
        Self::check_shape(dim, m, bits)?;
        let (sub, ksub) = (dim / m, 1usize << bits);
        let n = residuals.len() / dim;
        if n < ksub {
            return Err(HiveGpuError::InvalidArgument(format!(
                "{bits}-bit product quantization trains {ksub} centroids per sub-quantizer: it needs at least {ksub} vectors, got {n}"
            )));
        }
        // The sub-quantizers train independently (each from its own seed), so up to
        // `piece_workers` at a time: one k-means's host preparation and read backs overlap the
        // others' device work, and the result is the same as one after another.
        let train_one = |j: usize| -> Result<Vec<f32>> {
            let part: Vec<f32> =
                residuals.chunks_exact(dim).flat_map(|r| r[j * sub..(j + 1) * sub].iter().copied()).collect();
            let params = KMeansParams {
                clusters: ksub,
                iterations: CODEBOOK_ITERATIONS,
                max_training_vectors: ksub * TRAINING_PER_CENTROID,
                seed: SEED + j as u64,
            };
            Ok(kmeans::train(backend, tuning, &part, sub, &params)?.centroids)
        };
        let mut codebooks = Vec::with_capacity(ksub * dim);
        let at_once = tuning.piece_workers.max(1);
        for first in (0..m).step_by(at_once) {
            let books: Vec<Vec<f32>> =
                (first..(first + at_once).min(m)).into_par_iter().map(train_one).collect::<Result<_>>()?;
            codebooks.extend(books.into_iter().flatten());
        }
        Self::from_parts(backend, tuning, dim, m, bits, codebooks)
    }

    /// A quantizer from its codebooks (stored or trained): the shape checked, every value
    /// finite, the books placed on `backend`.
    pub(crate) fn from_parts(
        backend: &dyn GpuBackend,
        tuning: &crate::tuning::Tuning,
        dim: usize,
        m: usize,
        bits: usize,
        codebooks: Vec<f32>,
    ) -> Result<Self> {
        Self::check_shape(dim, m, bits)?;
        let (sub, ksub) = (dim / m, 1usize << bits);
        if codebooks.len() != ksub * dim {
            return Err(HiveGpuError::InvalidArgument(format!(
                "{m} codebooks of {ksub} centroids of {sub} components need {} values, got {}",
                ksub * dim,
                codebooks.len()
            )));
        }
        if let Some(at) = codebooks.iter().position(|x| !x.is_finite()) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "codebook {} has a non-finite value at centroid {}",
                at / (ksub * sub),
                at / sub % ksub
            )));
        }
        let mut books = Vec::with_capacity(m);
        for book in codebooks.chunks_exact(ksub * sub) {
            let mut rows = backend.new_rows(sub, StoragePrecision::F32, SearchPrecision::Exact, tuning)?;
            rows.append(book)?;
            books.push(rows);
        }
        Ok(Self { dim, m, bits, codebooks, books, workers: tuning.piece_workers })
    }

    /// Sub-quantizers.
    pub(crate) fn m(&self) -> usize {
        self.m
    }

    /// Bits per code.
    pub(crate) fn bits(&self) -> usize {
        self.bits
    }

    /// The codebooks, sub-quantizer after sub-quantizer.
    pub(crate) fn codebooks(&self) -> &[f32] {
        &self.codebooks
    }

    /// Bytes of one row's codes.
    pub(crate) fn code_bytes(&self) -> usize {
        code_bytes(self.m, self.bits)
    }

    /// Bytes the codebooks take (host and backend copies).
    pub(crate) fn memory_bytes(&self) -> usize {
        self.codebooks.len() * 4 + self.books.iter().map(|b| b.memory_bytes()).sum::<usize>()
    }

    /// The codes of each of `residuals` (row-major): [`ProductQuantizer::code_bytes`] per row,
    /// each sub-vector's nearest codebook centroid (ties to the lower number).
    pub(crate) fn encode(&self, residuals: &[f32]) -> Result<Vec<u8>> {
        let (dim, sub) = (self.dim, self.dim / self.m);
        let n = residuals.len() / dim;
        let bytes = self.code_bytes();
        let mut codes = vec![0u8; n * bytes];
        let at_once = self.workers.max(1);
        for first in (0..n).step_by(ENCODE_PIECE) {
            let rows = &residuals[first * dim..(first + ENCODE_PIECE.min(n - first)) * dim];
            // Each sub-quantizer's nearest centroids, up to `workers` searches at a time.
            let nearest_of = |j: usize| -> Result<Vec<usize>> {
                let part: Vec<f32> =
                    rows.chunks_exact(dim).flat_map(|r| r[j * sub..(j + 1) * sub].iter().copied()).collect();
                self.books[j].nearest_rows(&part)
            };
            for j0 in (0..self.m).step_by(at_once) {
                let found: Vec<Vec<usize>> = (j0..(j0 + at_once).min(self.m))
                    .into_par_iter()
                    .map(nearest_of)
                    .collect::<Result<_>>()?;
                for (j, nearest) in (j0..).zip(found) {
                    for (i, c) in nearest.into_iter().enumerate() {
                        let row = &mut codes[(first + i) * bytes..(first + i + 1) * bytes];
                        if self.bits == 4 {
                            row[j / 2] |= (c as u8 & 0xF) << (4 * (j % 2));
                        } else {
                            row[j] = c as u8;
                        }
                    }
                }
            }
        }
        Ok(codes)
    }

    /// The vector a row's `codes` stand for, less its centroid.
    pub(crate) fn decode(&self, codes: &[u8], out: &mut [f32]) {
        let (sub, ksub) = (self.dim / self.m, 1usize << self.bits);
        for (j, part) in out.chunks_exact_mut(sub).enumerate() {
            let c = code_at(codes, j, self.bits);
            part.copy_from_slice(&self.codebooks[(j * ksub + c) * sub..(j * ksub + c + 1) * sub]);
        }
    }

    /// A row's term of the scan's Euclidean distance: `|r^|^2 + 2 centroid . r^` for the
    /// decoded residual `r^` of `codes` ([`crate::backend::pq`]).
    pub(crate) fn row_term(&self, codes: &[u8], centroid: &[f32], scratch: &mut [f32]) -> f32 {
        self.decode(codes, scratch);
        let term: f64 = scratch
            .iter()
            .zip(centroid)
            .map(|(&r, &c)| {
                let (r, c) = (f64::from(r), f64::from(c));
                r * r + 2.0 * c * r
            })
            .sum();
        term as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GpuContext;

    fn cpu() -> GpuContext {
        GpuContext::with_backend(crate::GpuBackendType::Cpu, 0).expect("the CPU backend opens")
    }

    #[test]
    fn every_sub_vector_is_encoded_as_its_nearest_codebook_centroid() {
        let context = cpu();
        let (dim, n) = (6, 400);
        let mut state = 7u64;
        let residuals: Vec<f32> = (0..n * dim)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        for (m, bits) in [(3, 4), (2, 8), (6, 4), (1, 8)] {
            let pq = ProductQuantizer::train(context.backend(), context.tuning(), &residuals, dim, m, bits)
                .unwrap();
            let codes = pq.encode(&residuals).unwrap();
            let (sub, ksub, bytes) = (dim / m, 1 << bits, pq.code_bytes());
            assert_eq!(codes.len(), n * bytes);
            for (r, row) in residuals.chunks_exact(dim).zip(codes.chunks_exact(bytes)) {
                for j in 0..m {
                    let part = &r[j * sub..(j + 1) * sub];
                    let distance = |c: usize| -> f64 {
                        let centroid = &pq.codebooks()[(j * ksub + c) * sub..(j * ksub + c + 1) * sub];
                        part.iter().zip(centroid).map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2)).sum()
                    };
                    let got = distance(code_at(row, j, bits));
                    let best = (0..ksub).map(distance).fold(f64::INFINITY, f64::min);
                    assert!(got <= best + 1e-6, "m {m} bits {bits} sub {j}: {got} vs {best}");
                }
            }
            // The row term is |r^|^2 + 2 c . r^ of the decoded residual.
            let centroid = vec![0.25f32; dim];
            let mut scratch = vec![0.0; dim];
            let term = pq.row_term(&codes[..bytes], &centroid, &mut scratch);
            let want: f32 = scratch.iter().map(|r| r * r + 0.5 * r).sum();
            assert!((term - want).abs() <= 1e-5, "{term} vs {want}");
        }
    }

    #[test]
    fn a_shape_the_codes_cannot_cut_or_a_damaged_codebook_is_refused() {
        let context = cpu();
        let (b, t) = (context.backend(), context.tuning());
        let e = ProductQuantizer::train(b, t, &[0.0; 70], 7, 2, 8).unwrap_err().to_string();
        assert!(e.contains("m dividing the dimension"), "{e}");
        let e = ProductQuantizer::train(b, t, &[0.0; 40], 4, 2, 8).unwrap_err().to_string();
        assert!(e.contains("at least 256 vectors"), "{e}");
        assert!(ProductQuantizer::from_parts(b, t, 4, 2, 4, vec![0.0; 63]).is_err());
        let mut books = vec![0.0; 64];
        books[40] = f32::NAN;
        let e = ProductQuantizer::from_parts(b, t, 4, 2, 4, books).unwrap_err().to_string();
        assert!(e.contains("codebook 1") && e.contains("centroid 4"), "{e}");
        assert!(ProductQuantizer::from_parts(b, t, 4, 2, 4, vec![0.5; 64]).is_ok());
    }
}
