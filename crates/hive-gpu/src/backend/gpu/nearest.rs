//! [`crate::backend::RowStore::nearest_rows`] on the device: `hg_nearest_rows`
//! (`kernels/nearest.cu`) picks each point's nearest row from f32 distances, the host proves
//! each pick from the gap to the runner-up, and the points it cannot prove go through the exact
//! k-NN. The result is the exact 1-NN, ties to the lower slot, as the trait's default gives.
//!
//! Why a kernel of its own: a k-means assignment is the 1-NN of 262,144 points over 1,024
//! centroids, 25 times per training, and product-quantization encoding the 1-NN of every row's
//! sub-vectors over 256 centroids per sub-quantizer. Through the exact k-NN each call prepared
//! its points, ran the tiles, the selection and the f64 finalize, and read back lists: 41-49 ms
//! per assignment of which the GEMM was 4.5 ms, and 10-15 ms per encoding call, mostly fixed
//! (docs/PERFORMANCE.md, "Quantized IVF" and "The tile selection's own bound"). Here one
//! launch per piece of points reads back three numbers a point.
//!
//! **The proof.** For a point `x` and a row `y` of `dim` components the kernel sums
//! `fmaf(t, t, acc)` over `t = fl(x_i - y_i)`. Every term is non-negative, so with unit
//! roundoff `u` the computed `s` is `D (1 + theta) + alpha` for the true squared distance `D`,
//! `|theta| <= gamma_{dim + 2}` (one rounding in each difference, squared, and one per fused
//! multiply-add) and `|alpha| <= tau`, `tau = (dim + 2) 2^-149` covering results that fall
//! below the normal range (each such rounding loses at most half the smallest subnormal; the
//! subtraction of two f32 is exact there). So `D >= (s - tau) / (1 + g)` and
//! `D <= (s + tau) / (1 - g)` for any `g >= gamma`. The kernel returns the smallest `s`
//! (`first`, row `c`) and the smallest `s` of every other row (`second`). If
//! `(second - tau) (1 - g) > (first + tau) (1 + g)`, every other row's true distance exceeds
//! row `c`'s: `c` is the one nearest row, no tie. The host evaluates that in f64 with
//! `g = ErrorBound::gamma(dim)`, which is `2 gamma_{dim + 4}`: the doubling covers f64's own
//! roundings (about `2^-52` relative, far below `gamma`). Anything else is not proven and takes
//! the k-NN: equal or close distances (ties go to the lower slot there), an overflowed pick, a
//! NaN, a point that picked nothing. A runner-up whose sum overflowed (+inf while the store has
//! other rows) counts as `f32::MAX`, all that its true distance is known to exceed.
//!
//! The k-NN orders rows by its own f64 distances, not by the true ones; a proven gap is still
//! its order: the gap is a ratio of at least about `1 + 2 gamma_{dim + 6}`, far wider than the
//! f64 sum's error (about `dim 2^-53` relative), and where the pick's true distance is 0 the
//! other row's f64 distance is positive. The `tau` slack assumes the device keeps subnormal
//! results (NVRTC is asked for no flushing to zero, `--ftz=false`; hiprtc keeps f32 subnormals
//! by default), which the primitive test's rows at a scale of 1e-22 would catch.

use super::abi::{Launch, NearestRows};
use super::driver::Driver;
use super::kernels::BLOCK;
use super::rows::GpuRows;
use super::search::{Profiler, align, copy_bytes};
use crate::backend::nearest_by_knn;
use crate::error::{HiveGpuError, Result};
use crate::exact::error::ErrorBound;
use crate::types::StoragePrecision;

/// Points per block of `hg_nearest_rows` (`HG_NEAREST_TILE`).
const TILE: usize = 64;

/// Whether the kernel's `first` and `second` distances of a point prove its pick (the module
/// docs give the argument): false for anything not proven, NaN and an overflowed `first`
/// included. `rows` is the store's: with more than one, a `second` of +inf means every other
/// row's sum overflowed, which bounds their true distances only by `f32::MAX`, so it counts as
/// that.
pub(super) fn proven(first: f32, second: f32, dim: usize, rows: usize) -> bool {
    let g = f64::from(ErrorBound::gamma(dim));
    // Past 2^24 components `gamma` is no bound at all (its formula turns negative).
    if !(g > 0.0 && g < 0.5) {
        return false;
    }
    let tau = (dim as f64 + 2.0) * 2f64.powi(-149);
    let second = if rows > 1 && second == f32::INFINITY { f32::MAX } else { second };
    let (first, second) = (f64::from(first), f64::from(second));
    first.is_finite() && (second - tau) * (1.0 - g) > (first + tau) * (1.0 + g)
}

impl<D: Driver> GpuRows<D> {
    /// [`crate::backend::RowStore::nearest_rows`] (see the module docs). What the kernel does
    /// not cover takes the exact k-NN for every point: switched off (`Tuning::nearest_kernel`),
    /// fewer points than `Tuning::nearest_min_points`, rows not in f32, removed rows, no rows,
    /// or sizes past 32-bit counts.
    pub(super) fn nearest_on_device(&self, points: &[f32]) -> Result<Vec<usize>> {
        let dim = self.dim;
        let covered = self.tuning.nearest_kernel
            && points.len() / dim.max(1) >= self.tuning.nearest_min_points
            && self.precision == StoragePrecision::F32
            && self.len > 0
            && self.dead.count() == 0
            // The kernel steps through rows by 64 and components by 16 in 32-bit counters.
            && self.len <= u32::MAX as usize - 64
            && dim <= u32::MAX as usize - 16
            && points.len().is_multiple_of(dim)
            && !points.is_empty();
        if !covered {
            return nearest_by_knn(self, points);
        }
        let count = points.len() / dim;
        // Points and their three results per launch within `nearest_piece_bytes`.
        let piece = (self.tuning.nearest_piece_bytes / (dim * 4 + 12)).max(1);
        let mut nearest = Vec::with_capacity(count);
        let mut unproven: Vec<usize> = Vec::new();
        let mut ws = self.checkout()?;
        let mut profile = Profiler::new();
        let result = (|| -> Result<()> {
            let driver = self.driver().clone();
            let arrays = self.arrays.as_ref().ok_or(HiveGpuError::EmptyCollection)?;
            for (first_point, part) in (0..).step_by(piece).zip(points.chunks(piece * dim)) {
                let in_piece = part.len() / dim;
                let in_bytes = align(part.len() * 4);
                let out_bytes = in_piece * 12;
                // Nothing queued may still read the buffers when they are regrown or refilled.
                driver.synchronize(&ws.stream)?;
                let base = ws.inputs.get(&driver, in_bytes + out_bytes)?;
                let out = base + in_bytes as u64;
                let staging = ws.staging.get(&*driver, (part.len() * 4).max(out_bytes))?;
                // On the library's threads: a k-means sample is 128 MiB, which one thread copied
                // slower than the device uploads and searches it.
                copy_bytes(&mut staging[..part.len() * 4], bytemuck::cast_slice(part))?;
                profile.mark(&*driver, &ws.stream, "stage")?;
                driver.upload(&ws.stream, base, staging, part.len() * 4)?;
                profile.mark(&*driver, &ws.stream, "upload")?;
                self.device.launch(
                    &ws.stream,
                    self.device.kernels.nearest_rows,
                    Launch::new((in_piece.div_ceil(TILE) as u32, 1), BLOCK),
                    &NearestRows {
                        rows: arrays.rows.ptr(),
                        n: self.len as u32,
                        dim: dim as u32,
                        points: base,
                        count: in_piece as u32,
                        nearest: out,
                        first: out + (in_piece * 4) as u64,
                        second: out + (in_piece * 8) as u64,
                    },
                )?;
                profile.mark(&*driver, &ws.stream, "kernel")?;
                driver.download(&ws.stream, staging, out, out_bytes)?;
                driver.synchronize(&ws.stream)?;
                profile.mark(&*driver, &ws.stream, "download")?;
                let words: &[u8] = &staging[..out_bytes];
                let picks: Vec<u32> = bytemuck::pod_collect_to_vec(&words[..in_piece * 4]);
                let firsts: Vec<f32> = bytemuck::pod_collect_to_vec(&words[in_piece * 4..in_piece * 8]);
                let seconds: Vec<f32> = bytemuck::pod_collect_to_vec(&words[in_piece * 8..in_piece * 12]);
                for (i, ((&pick, &first), &second)) in picks.iter().zip(&firsts).zip(&seconds).enumerate() {
                    if (pick as usize) < self.len && proven(first, second, dim, self.len) {
                        nearest.push(pick as usize);
                    } else {
                        nearest.push(usize::MAX);
                        unproven.push(first_point + i);
                    }
                }
                profile.mark(&*driver, &ws.stream, "prove")?;
            }
            Ok(())
        })();
        if result.is_ok() {
            self.checkin(ws);
        }
        result?;
        profile.report(&format!(
            "nearest rows of {count} points over {} rows, {} unproven",
            self.len,
            unproven.len()
        ));
        if !unproven.is_empty() {
            let again: Vec<f32> =
                unproven.iter().flat_map(|&p| points[p * dim..(p + 1) * dim].iter().copied()).collect();
            for (&p, slot) in unproven.iter().zip(nearest_by_knn(self, &again)?) {
                nearest[p] = slot;
            }
        }
        Ok(nearest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pick_is_proven_only_by_a_gap_wider_than_both_distances_error() {
        let rows = 9;
        assert!(proven(1.0, 2.0, 128, rows));
        assert!(proven(0.0, 1e-30, 8, rows), "a point on its row, the next one well apart");
        assert!(proven(5.0, f32::INFINITY, 16, 1), "one row: no runner-up");
        // Equal distances are a tie (or may hide one): the exact k-NN orders them by slot.
        assert!(!proven(1.0, 1.0, 4, rows));
        assert!(!proven(0.0, 0.0, 4, rows));
        // A gap inside the bound proves nothing; the same gap at a lower dimension does.
        let g = f64::from(ErrorBound::gamma(1000));
        let inside = (1.0 + 1.5 * g) as f32;
        assert!(!proven(1.0, inside, 1000, rows));
        assert!(proven(1.0, inside, 10, rows));
        // Results below the normal range: a gap of a few subnormals proves nothing.
        assert!(!proven(0.0, f32::from_bits(3), 8, rows));
        // What an overflow or a NaN leaves is never proven.
        assert!(!proven(f32::INFINITY, f32::INFINITY, 4, rows));
        assert!(!proven(f32::NAN, 1.0, 4, rows));
        assert!(!proven(1.0, f32::NAN, 4, rows));
        // The trap: other rows whose sums overflowed are only known to lie beyond f32::MAX, so
        // a pick near it is not proven by them; a small pick still is.
        let near_max = (f64::from(f32::MAX) * (1.0 - f64::from(ErrorBound::gamma(4)) / 2.0)) as f32;
        assert!(!proven(near_max, f32::INFINITY, 4, rows));
        assert!(proven(1e30, f32::INFINITY, 4, rows));
        // Past 2^24 components the bound's formula breaks down: nothing is proven.
        assert!(!proven(1.0, 1e30, 1 << 25, rows));
    }
}
