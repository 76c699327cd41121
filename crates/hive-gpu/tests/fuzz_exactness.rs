//! Fuzz-style exactness test of the CPU backend (and, with fewer seeds, of every available GPU
//! backend): many small adversarial instances from seeds,
//! every search path (SIMD scan for 1-3 queries, f32 GEMM tiles for 4-15, bf16 / byte tiles
//! for 16+) checked id by id against an f64 brute force, with upserts and removals between
//! searches.
//!
//! Knobs (environment):
//! - `FUZZ_SEEDS` (default 1500, so CI runs the same instances every time): how many seeds;
//!   `FUZZ_SEED_START` (default 0): first seed; `FUZZ_SECONDS`: also stop after this long
//!   (for long campaigns: `FUZZ_SEEDS=100000000 FUZZ_SECONDS=1200`).
//! - `FUZZ_SEED=N`: replay one seed, printing what it does.
//! - `FUZZ_SKIP=tinynorm,hugetiny`: leave categories out (names as printed).
//! - `FUZZ_MAX_FAILURES` (default 30): failures recorded before the run stops.
//! - `FUZZ_SKIP_DIMS=31`: leave out instances of these dimensions.
//! - `FUZZ_COSINE_SAFE=1`: rescale cosine vectors to norms in [2^-20, 2^62] (leaves out the
//!   known tiny-norm cosine class, to look for others).
//! - `FUZZ_SHOW_TIES=1`: print every different id accepted as a tie.
//!
//! A failure prints the seed, the instance, and a shrunk reproducer (fresh collection, the
//! query repeated to the failing batch size) when one reproduces without the history.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use common::Rng;
use half::f16;
use hive_gpu::{
    GpuBackendType, GpuContext, GpuDistanceMetric as Metric, GpuSearchResult, GpuVector, GpuVectorStorage,
    StorageConfig, StoragePrecision as Precision,
};

const METRICS: [Metric; 5] =
    [Metric::Euclidean, Metric::Cosine, Metric::DotProduct, Metric::Manhattan, Metric::Chebyshev];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Category {
    Gaussian,
    Bf16Boundary,
    HugeTiny,
    F16Limits,
    Bytes,
    BytesOneNonInteger,
    NearDupFar,
    Duplicates,
    SmallInts,
    TinyNorm,
    Mixed,
}

const CATEGORIES: [Category; 11] = [
    Category::Gaussian,
    Category::Bf16Boundary,
    Category::HugeTiny,
    Category::F16Limits,
    Category::Bytes,
    Category::BytesOneNonInteger,
    Category::NearDupFar,
    Category::Duplicates,
    Category::SmallInts,
    Category::TinyNorm,
    Category::Mixed,
];

impl Category {
    fn name(self) -> &'static str {
        match self {
            Category::Gaussian => "gaussian",
            Category::Bf16Boundary => "bf16boundary",
            Category::HugeTiny => "hugetiny",
            Category::F16Limits => "f16limits",
            Category::Bytes => "bytes",
            Category::BytesOneNonInteger => "bytes1nonint",
            Category::NearDupFar => "neardupfar",
            Category::Duplicates => "duplicates",
            Category::SmallInts => "smallints",
            Category::TinyNorm => "tinynorm",
            Category::Mixed => "mixed",
        }
    }
    fn is_bytes(self) -> bool {
        matches!(self, Category::Bytes | Category::BytesOneNonInteger)
    }
}

// ---------------------------------------------------------------- value helpers

fn pow2(e: i32) -> f32 {
    // Exact for -149..=127; 0 below, infinity above (sanitize() replaces non-finite values).
    match e {
        ..=-150 => 0.0,
        -149..=-127 => f32::from_bits(1u32 << (e + 149)),
        -126..=127 => f32::from_bits(((e + 127) as u32) << 23),
        _ => f32::INFINITY,
    }
}

/// `x` moved by `n` f32 ulps (through zero and subnormals), kept finite.
fn step_f32(x: f32, n: i64) -> f32 {
    let b = x.to_bits();
    let key = if b >> 31 == 1 { -((b & 0x7FFF_FFFF) as i64) } else { b as i64 };
    let k = (key + n).clamp(-0x7F7F_FFFF, 0x7F7F_FFFF);
    if k < 0 { f32::from_bits((-k) as u32 | 0x8000_0000) } else { f32::from_bits(k as u32) }
}

/// `x` moved by `n` f16 ulps, as f32.
fn step_f16(x: f32, n: i64) -> f32 {
    let b = f16::from_f32(x).to_bits();
    let key = if b >> 15 == 1 { -((b & 0x7FFF) as i64) } else { b as i64 };
    let k = (key + n).clamp(-0x7BFF, 0x7BFF);
    let bits = if k < 0 { (-k) as u16 | 0x8000 } else { k as u16 };
    f16::from_bits(bits).to_f32()
}

/// `x` moved by `n` bf16 ulps, as f32 (x rounded to bf16 first).
fn step_bf16(x: f32, n: i64) -> f32 {
    let b = half::bf16::from_f32(x).to_bits();
    let key = if b >> 15 == 1 { -((b & 0x7FFF) as i64) } else { b as i64 };
    let k = (key + n).clamp(-0x7F7F, 0x7F7F);
    let bits = if k < 0 { (-k) as u16 | 0x8000 } else { k as u16 };
    half::bf16::from_bits(bits).to_f32()
}

/// `x` moved by `n` steps of what `precision` stores: one ulp of its float type, or one unit
/// of an integer type (sanitize() clamps into the type's range). A step finer than the stored
/// type would make an exact duplicate, not a near one.
fn step_stored(precision: Precision, x: f32, n: i64) -> f32 {
    match precision {
        Precision::F16 => step_f16(x, n),
        Precision::Bf16 => step_bf16(x, n),
        Precision::I8 | Precision::U8 => x.round() + n as f32,
        _ => step_f32(x, n),
    }
}

fn sign(rng: &mut Rng) -> f32 {
    if rng.below(2) == 0 { 1.0 } else { -1.0 }
}

/// A value on or next to a bf16 rounding boundary.
fn bf16_boundary(rng: &mut Rng, exp_lo: i32, exp_hi: i32) -> f32 {
    let e = exp_lo + rng.below((exp_hi - exp_lo + 1) as usize) as i32;
    let m = 128 + rng.below(128) as i32; // 8-bit significand
    let base = m as f32 * pow2(e - 7);
    let half = (2 * m + 1) as f32 * pow2(e - 8); // halfway to the next bf16
    let x = match rng.below(8) {
        0 | 1 => base,
        2 => half,
        3 => step_f32(half, 1),
        4 => step_f32(half, -1),
        5 => step_f32(base, 1),
        6 => step_f32(base, -1),
        _ => (2 * m + 1) as f32 * pow2(e - 8) + if rng.below(2) == 0 { 0.0 } else { pow2(e - 20) },
    };
    x * sign(rng)
}

fn huge_tiny(rng: &mut Rng) -> f32 {
    let mant = 1.0 + rng.uniform() as f32;
    match rng.below(6) {
        0 => mant * pow2(20 + rng.below(40) as i32) * sign(rng),
        1 => mant * pow2(-60 - rng.below(60) as i32) * sign(rng),
        // f32 subnormals
        2 => f32::from_bits(1 + rng.below(0x7F_FFFF) as u32) * sign(rng),
        3 => f32::from_bits(1 + rng.below(8) as u32) * sign(rng),
        _ => rng.normal(),
    }
}

fn f16_limit(rng: &mut Rng) -> f32 {
    let s = sign(rng);
    match rng.below(10) {
        0 => 65504.0 * s,
        1 => step_f16(65504.0, -(rng.below(4) as i64)) * s,
        2 => 65519.0 * s,                                      // rounds to 65504 in f16
        3 => (65504.0 - 16.0) * s,                             // halfway between two f16
        4 => 6.103_515_6e-5 * s,                               // f16 min normal
        5 => (1 + rng.below(1023)) as f32 * pow2(-24) * s,     // f16 subnormals
        6 => (2 * rng.below(1024) + 1) as f32 * pow2(-25) * s, // halfway between f16 subnormals
        7 => (2049 + 2 * rng.below(100)) as f32 * s,           // odd above 2048: halfway in f16
        8 => step_f16(rng.normal() * 1000.0, rng.below(3) as i64 - 1),
        _ => rng.normal(),
    }
}

fn value(rng: &mut Rng, cat: Category) -> f32 {
    match cat {
        Category::Gaussian | Category::NearDupFar | Category::Duplicates | Category::TinyNorm => rng.normal(),
        Category::Bf16Boundary => {
            if rng.below(10) == 0 {
                bf16_boundary(rng, -140, -110)
            } else {
                bf16_boundary(rng, -6, 6)
            }
        }
        Category::HugeTiny => huge_tiny(rng),
        Category::F16Limits => f16_limit(rng),
        Category::Bytes | Category::BytesOneNonInteger => match rng.below(6) {
            0 => 0.0,
            1 => 255.0,
            2 => rng.below(4) as f32,
            _ => rng.below(256) as f32,
        },
        Category::SmallInts => rng.below(7) as f32 - 3.0,
        Category::Mixed => unreachable!(),
    }
}

fn plain_vector(rng: &mut Rng, cat: Category, dim: usize) -> Vec<f32> {
    let cat = if cat == Category::Mixed {
        [Category::Gaussian, Category::Bf16Boundary, Category::HugeTiny, Category::Bytes, Category::SmallInts]
            [rng.below(5)]
    } else {
        cat
    };
    let mut v: Vec<f32> = (0..dim).map(|_| value(rng, cat)).collect();
    if cat == Category::TinyNorm {
        let e = [0, 0, -20, -40, -60, -64, -66, -70, -75, -80, -100, -120, -130, -140][rng.below(14)];
        for x in &mut v {
            *x *= pow2(e.max(-126));
            if e < -126 {
                *x *= pow2(e + 126);
            }
        }
    }
    v
}

/// Makes `v` a valid vector (stored, if `stored`) for the collection: finite, squared norm at
/// most 1e37, within f16 range, non-zero under cosine.
fn sanitize(v: &mut [f32], metric: Metric, precision: Precision, stored: bool, rng: &mut Rng) {
    for x in v.iter_mut() {
        if !x.is_finite() {
            *x = 1.0;
        }
        if stored && precision == Precision::F16 && f16::from_f32(*x).is_infinite() {
            *x = 65504.0f32.copysign(*x);
        }
    }
    let norm: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    if norm > 1e36 {
        let s = (1e36 / norm).sqrt() as f32;
        for x in v.iter_mut() {
            *x *= s;
        }
    }
    if metric == Metric::Cosine && std::env::var("FUZZ_COSINE_SAFE").is_ok() {
        // Leave out the known cosine underflow class: norms in [2^-20, 2^62] by power-of-two
        // scaling (components may still be subnormal).
        let norm: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
        if norm > 0.0 && !(2f64.powi(-20)..=2f64.powi(62)).contains(&norm) {
            let e = -(norm.log2().round() as i32);
            for x in v.iter_mut() {
                *x = (f64::from(*x) * 2f64.powi(e)) as f32;
            }
        }
    }
    if metric == Metric::Cosine && stored {
        // Stored cosine vectors need |x| >= 1e-18 (smaller ones are refused, see bad_input.rs);
        // scale such a vector up by a power of two, which cosine does not notice.
        let norm: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
        if norm > 0.0 && norm < 1e-18 {
            let e = -(norm.log2().floor() as i32);
            for x in v.iter_mut() {
                *x = (f64::from(*x) * 2f64.powi(e)) as f32;
            }
        }
    }
    if stored && matches!(precision, Precision::I8 | Precision::U8) {
        // Integer types hold integers in their range and refuse anything else.
        let (lo, hi) = if precision == Precision::I8 { (-128.0, 127.0) } else { (0.0, 255.0) };
        for x in v.iter_mut() {
            *x = x.round().clamp(lo, hi);
        }
    }
    if metric == Metric::Cosine {
        let zero = if stored && precision == Precision::F16 {
            v.iter().all(|&x| f16::from_f32(x).to_f32() == 0.0)
        } else {
            v.iter().all(|&x| x == 0.0)
        };
        if zero {
            let i = rng.below(v.len());
            v[i] = 1.0;
        }
    }
}

fn stored_values(precision: Precision, v: &[f32]) -> Vec<f32> {
    match precision {
        Precision::F16 => v.iter().map(|&x| f16::from_f32(x).to_f32()).collect(),
        Precision::Bf16 => v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect(),
        // An integer type has one zero: a -0.0 component is stored (and read back) as +0.0.
        Precision::I8 | Precision::U8 => v.iter().map(|&x| x + 0.0).collect(),
        _ => v.to_vec(),
    }
}

fn is_byte(x: f32) -> bool {
    (0.0..=255.0).contains(&x) && x.fract() == 0.0
}

// ---------------------------------------------------------------- model and reference

#[derive(Default, Clone)]
struct Model {
    order: Vec<String>,
    vectors: HashMap<String, Vec<f32>>,
}

impl Model {
    /// An upsert writes the vector anew after every other: the collection's tie order is the
    /// order of last writes.
    fn upsert(&mut self, id: &str, stored: Vec<f32>) {
        if self.vectors.insert(id.to_string(), stored).is_some() {
            self.order.retain(|x| x != id);
        }
        self.order.push(id.to_string());
    }
    fn remove(&mut self, id: &str) {
        self.vectors.remove(id);
        self.order.retain(|x| x != id);
    }
    fn rows(&self) -> Vec<(&str, &[f32])> {
        self.order.iter().map(|id| (id.as_str(), self.vectors[id].as_slice())).collect()
    }
}

fn distance(metric: Metric, q: &[f32], x: &[f32]) -> f64 {
    common::distance(metric, q, x)
}

/// Reference top-k: indexes into `rows`, ties by position.
fn reference(metric: Metric, rows: &[(&str, &[f32])], q: &[f32], k: usize) -> Vec<(usize, f64)> {
    let mut scored: Vec<(usize, f64)> =
        rows.iter().enumerate().map(|(i, (_, x))| (i, distance(metric, q, x))).collect();
    scored.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    scored.truncate(k);
    scored
}

thread_local! {
    /// What is being checked, for the tie printout.
    static CONTEXT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

#[derive(Default)]
struct CheckStats {
    tolerated_ties: usize,
    /// Of those, exactly equal f64 distances returned out of insertion order.
    exact_tie_order: usize,
}

/// Checks one result list; Err(description) on the first discrepancy.
fn check_list(
    metric: Metric,
    rows: &[(&str, &[f32])],
    q: &[f32],
    k: usize,
    got: &[GpuSearchResult],
    stats: &mut CheckStats,
) -> Result<(), String> {
    let want = reference(metric, rows, q, k.min(rows.len()));
    let position: HashMap<&str, usize> = rows.iter().enumerate().map(|(i, (id, _))| (*id, i)).collect();
    if got.len() != want.len() {
        return Err(format!("returned {} results, expected {}", got.len(), want.len()));
    }
    let mut seen = std::collections::HashSet::new();
    for (rank, (r, &(wi, wd))) in got.iter().zip(&want).enumerate() {
        if !seen.insert(r.id.as_str()) {
            return Err(format!("rank {rank}: id {} returned twice", r.id));
        }
        let Some(&gi) = position.get(r.id.as_str()) else {
            return Err(format!("rank {rank}: returned id {} is not live (removed or unknown)", r.id));
        };
        if gi != wi {
            let gd = distance(metric, q, rows[gi].1);
            if (gd - wd).abs() <= 1e-12 * gd.abs().max(wd.abs()) {
                stats.tolerated_ties += 1;
                if gd == wd {
                    stats.exact_tie_order += 1;
                }
                if std::env::var("FUZZ_SHOW_TIES").is_ok() {
                    eprintln!(
                        "tie [{}] at rank {rank}: got {} ({gd:e}) at position {gi} = {} want {} ({wd:e}) at position {wi} = {} q {}",
                        CONTEXT.with(|c| c.borrow().clone()),
                        r.id,
                        fmt_vec(rows[gi].1),
                        rows[wi].0,
                        fmt_vec(rows[wi].1),
                        fmt_vec(q)
                    );
                }
            } else {
                return Err(format!(
                    "rank {rank}: returned {} (exact distance {gd:e}) instead of {} (exact distance {wd:e})",
                    r.id, rows[wi].0
                ));
            }
        }
    }
    let differs = got.iter().zip(&want).any(|(r, &(wi, _))| r.id != rows[wi].0);
    if differs {
        strict_tie_check(metric, rows, q, k.min(rows.len()), got, &position)
            .map_err(|e| format!("TIE-ORDER: {e}"))?;
    }
    Ok(())
}

// ---------------------------------------------------------------- exact arithmetic

/// `a + b = s + e` exactly.
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    let e = (a - (s - bb)) + (b - bb);
    (s, e)
}

/// Adds `b` to the non-overlapping expansion `e` (Shewchuk's GROW-EXPANSION, zeros dropped).
fn grow(e: &mut Vec<f64>, b: f64) {
    let mut q = b;
    let mut out = Vec::with_capacity(e.len() + 1);
    for &h in e.iter() {
        let (s, err) = two_sum(q, h);
        if err != 0.0 {
            out.push(err);
        }
        q = s;
    }
    if q != 0.0 {
        out.push(q);
    }
    *e = out;
}

/// Sign of `true_distance(x) - true_distance(y)` in exact arithmetic (Euclidean and dot
/// product: every term is a product of two f32, exact in f64, summed without rounding; L1:
/// each |q - x| is q - x or x - q by the exact comparison of two f32, so its two f32 terms
/// go into the sum with that sign).
fn exact_cmp(metric: Metric, q: &[f32], x: &[f32], y: &[f32]) -> std::cmp::Ordering {
    let mut e = Vec::new();
    for i in 0..q.len() {
        let (qi, xi, yi) = (f64::from(q[i]), f64::from(x[i]), f64::from(y[i]));
        match metric {
            Metric::Euclidean => {
                grow(&mut e, -2.0 * qi * xi);
                grow(&mut e, xi * xi);
                grow(&mut e, 2.0 * qi * yi);
                grow(&mut e, -(yi * yi));
            }
            Metric::Manhattan => {
                let (sx, sy) = (if qi >= xi { 1.0 } else { -1.0 }, if qi >= yi { 1.0 } else { -1.0 });
                grow(&mut e, sx * qi);
                grow(&mut e, -sx * xi);
                grow(&mut e, -sy * qi);
                grow(&mut e, sy * yi);
            }
            _ => {
                grow(&mut e, -qi * xi);
                grow(&mut e, qi * yi);
            }
        }
    }
    let top = e.last().copied().unwrap_or(0.0);
    top.partial_cmp(&0.0).unwrap_or(std::cmp::Ordering::Equal)
}

/// When the list differs from the f64 reference only by f64 ties: accept it iff it is the f64
/// best-k (ties by position) of a candidate set that contains every true top-k row. That is,
/// the list is ordered by (f64 distance, position), and every live row missing from it that
/// the f64 order would have put in is truly (exactly) worse than k other rows, i.e. outside
/// the true top-k. Cosine has no exact comparison here: any such row is a failure.
fn strict_tie_check(
    metric: Metric,
    rows: &[(&str, &[f32])],
    q: &[f32],
    k: usize,
    got: &[GpuSearchResult],
    position: &HashMap<&str, usize>,
) -> Result<(), String> {
    let d: Vec<f64> = rows.iter().map(|(_, x)| distance(metric, q, x)).collect();
    let keys: Vec<(f64, usize)> = got
        .iter()
        .map(|r| {
            let p = position[r.id.as_str()];
            (d[p], p)
        })
        .collect();
    for w in keys.windows(2) {
        if !(w[0].0 < w[1].0 || (w[0].0 == w[1].0 && w[0].1 < w[1].1)) {
            return Err(format!("list not ordered by (f64 distance, position): {:?} then {:?}", w[0], w[1]));
        }
    }
    let last = *keys.last().expect("k >= 1");
    let returned: std::collections::HashSet<usize> = keys.iter().map(|&(_, p)| p).collect();
    for (y, &dy) in d.iter().enumerate() {
        if returned.contains(&y) || !(dy < last.0 || (dy == last.0 && y < last.1)) {
            continue;
        }
        let why = format!(
            "{} at position {y} (f64 distance {dy:e}) is missing though the f64 order puts it before the last returned, position {} ({:e})",
            rows[y].0, last.1, last.0
        );
        if metric == Metric::Cosine {
            return Err(format!("{why} [cosine: no exact check]"));
        }
        if metric == Metric::Chebyshev {
            // Every backend's exact distance is the reference's own f64 arithmetic (the
            // largest widened difference), so f64 ties break by position for both: a missing
            // row was never a candidate.
            return Err(format!("{why} [l-infinity: the same f64 arithmetic as the reference]"));
        }
        let better = (0..rows.len())
            .filter(|&z| z != y && exact_cmp(metric, q, rows[z].1, rows[y].1) == std::cmp::Ordering::Less)
            .count();
        if better < k {
            return Err(format!("{why}; only {better} rows are truly better, so it is in the true top-{k}"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- paths

fn tiles_enabled() -> bool {
    std::env::var("HIVE_GPU_CPU_SIMD").is_err()
}

fn path_name(nq: usize, all_bytes: bool) -> &'static str {
    match nq {
        1..=3 => "scan",
        4..=15 => "gemm",
        _ if !tiles_enabled() => "gemm16+",
        _ if all_bytes => "bytes",
        _ => "bf16",
    }
}

// ---------------------------------------------------------------- one instance

struct Failure {
    seed: u64,
    signature: String,
    text: String,
}

struct Totals {
    instances: usize,
    by_path: BTreeMap<&'static str, usize>,
    by_category: BTreeMap<&'static str, usize>,
    by_metric_precision: BTreeMap<String, usize>,
    ties: usize,
    exact_tie_order: usize,
    failures: Vec<Failure>,
}

struct Instance {
    seed: u64,
    metric: Metric,
    precision: Precision,
    cat: Category,
    dim: usize,
}

impl Instance {
    fn describe(&self) -> String {
        format!(
            "seed {} {} {:?} {} dim {}",
            self.seed,
            self.metric,
            self.precision,
            self.cat.name(),
            self.dim
        )
    }
}

fn cpu() -> GpuContext {
    GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend opens")
}

fn new_storage(ctx: &GpuContext, dim: usize, metric: Metric, precision: Precision) -> GpuVectorStorage {
    ctx.create_storage_with(StorageConfig::new(dim, metric).with_precision(precision)).expect("storage")
}

fn choose_dim(rng: &mut Rng) -> usize {
    match rng.below(20) {
        0 => 128,
        1 => 129,
        2..=7 => 1 + rng.below(4),
        _ => 1 + rng.below(40),
    }
}

fn choose_n(rng: &mut Rng, dim: usize) -> usize {
    if dim <= 3 && rng.below(150) == 0 {
        return 16_385 + rng.below(4000); // more than one scan task: exercises the scan merge
    }
    if dim >= 128 && rng.below(8) == 0 {
        return 500 + rng.below(700); // several tiles / row ranges: exercises merging
    }
    match rng.below(4) {
        0 => 2 + rng.below(6),
        1 => 2 + rng.below(30),
        2 => 2 + rng.below(100),
        _ => 2 + rng.below(299),
    }
}

/// One row of the instance (before sanitising).
fn gen_row(rng: &mut Rng, inst: &Instance, bases: &[Vec<f32>]) -> Vec<f32> {
    let dim = inst.dim;
    match inst.cat {
        Category::NearDupFar => {
            let base = &bases[rng.below(bases.len())];
            let mut v = base.clone();
            let changes = rng.below(3);
            for _ in 0..changes {
                let i = rng.below(dim);
                let n = rng.below(5) as i64 - 2;
                v[i] = step_stored(inst.precision, v[i], n);
            }
            v
        }
        Category::Duplicates => {
            let base = &bases[rng.below(bases.len())];
            let mut v = base.clone();
            if rng.below(6) == 0 {
                let i = rng.below(dim);
                v[i] = step_stored(inst.precision, v[i], 1);
            }
            v
        }
        _ => plain_vector(rng, inst.cat, dim),
    }
}

fn gen_bases(rng: &mut Rng, inst: &Instance) -> Vec<Vec<f32>> {
    let dim = inst.dim;
    match inst.cat {
        Category::NearDupFar => (0..1 + rng.below(3))
            .map(|_| {
                let e = match inst.precision {
                    Precision::F16 => 8 + rng.below(7) as i32,
                    // Centres inside the integer types' range, so rows differ by steps.
                    Precision::I8 | Precision::U8 => 3 + rng.below(4) as i32,
                    _ => 10 + rng.below(40) as i32,
                };
                let center = rng.normal() * pow2(e);
                (0..dim).map(|_| center + rng.normal() * pow2(e - 6 - rng.below(10) as i32)).collect()
            })
            .collect(),
        Category::Duplicates => (0..1 + rng.below(4))
            .map(|_| {
                let sub =
                    [Category::Gaussian, Category::Bf16Boundary, Category::SmallInts, Category::HugeTiny]
                        [rng.below(4)];
                plain_vector(rng, sub, dim)
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// A query: a live row, a perturbed row, a fresh vector, a zero-ish vector or a scaled row.
fn gen_query(rng: &mut Rng, inst: &Instance, model: &Model, bases: &[Vec<f32>]) -> Vec<f32> {
    let dim = inst.dim;
    let row = |rng: &mut Rng| model.vectors[&model.order[rng.below(model.order.len())]].clone();
    let mut q = match rng.below(if inst.cat.is_bytes() { 14 } else { 10 }) {
        0..=2 => row(rng),
        3 => {
            // row +- a few ulps in a few components
            let mut v = row(rng);
            for _ in 0..1 + rng.below(3) {
                let i = rng.below(dim);
                v[i] = step_f32(v[i], rng.below(7) as i64 - 3);
            }
            v
        }
        4 => {
            let mut v = row(rng);
            let eps = [1e-7f32, 1e-6, 1e-4, 1e-3][rng.below(4)];
            for x in &mut v {
                *x += eps * rng.normal() * x.abs().max(1e-3);
            }
            v
        }
        5 => {
            // zero-ish: zero or one tiny component
            let mut v = vec![0f32; dim];
            if inst.metric == Metric::Cosine || rng.below(2) == 0 {
                let i = rng.below(dim);
                v[i] = [1e-30f32, 1e-20, 1e-39, 1e-45, 1e-10, 1e-3][rng.below(6)] * sign(rng);
            }
            v
        }
        6 => {
            // scaled row: cosine ties up to rounding
            let mut v = row(rng);
            let s = [0.5f32, 2.0, 3.0, 1e-20, 1e10, 0.1][rng.below(6)];
            for x in &mut v {
                *x *= s;
            }
            v
        }
        7 if !bases.is_empty() => bases[rng.below(bases.len())].clone(),
        _ if inst.cat.is_bytes() => (0..dim).map(|_| rng.below(256) as f32).collect(),
        _ => gen_row(rng, inst, bases),
    };
    sanitize(&mut q, inst.metric, inst.precision, false, rng);
    q
}

/// Rebuilds `rows` in a fresh collection and searches `q` repeated `batch` times.
fn fresh_fails(
    ctx: &GpuContext,
    metric: Metric,
    precision: Precision,
    rows: &[Vec<f32>],
    q: &[f32],
    k: usize,
    batch: usize,
) -> Option<String> {
    let dim = q.len();
    let storage = new_storage(ctx, dim, metric, precision);
    let vectors: Vec<GpuVector> =
        rows.iter().enumerate().map(|(i, r)| GpuVector::new(format!("r{i}"), r.clone())).collect();
    storage.add_vectors(&vectors).ok()?;
    let ids: Vec<String> = (0..rows.len()).map(|i| format!("r{i}")).collect();
    let stored: Vec<Vec<f32>> = rows.iter().map(|r| stored_values(precision, r)).collect();
    let pairs: Vec<(&str, &[f32])> =
        ids.iter().map(|s| s.as_str()).zip(stored.iter().map(|v| v.as_slice())).collect();
    let queries: Vec<f32> = (0..batch).flat_map(|_| q.iter().copied()).collect();
    let searched =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| storage.search_batch(&queries, k)));
    let Ok(result) = searched else { return Some("search panicked".into()) };
    let lists = result.ok()?;
    let mut stats = CheckStats::default();
    for list in &lists {
        if let Err(e) = check_list(metric, &pairs, q, k, list, &mut stats) {
            return Some(e);
        }
    }
    None
}

/// Greedy shrink of a reproducer: fewer rows, smaller k, earliest failing batch size kept.
fn shrink(
    ctx: &GpuContext,
    metric: Metric,
    precision: Precision,
    mut rows: Vec<Vec<f32>>,
    q: &[f32],
    mut k: usize,
    batch: usize,
) -> Option<(Vec<Vec<f32>>, usize, String)> {
    let mut why = fresh_fails(ctx, metric, precision, &rows, q, k, batch)?;
    let mut budget = 4000usize;
    loop {
        let mut progress = false;
        // smaller k
        while k > 1 && budget > 0 {
            budget -= 1;
            if let Some(w) = fresh_fails(ctx, metric, precision, &rows, q, k - 1, batch) {
                k -= 1;
                why = w;
                progress = true;
            } else {
                break;
            }
        }
        // drop chunks of rows, then single rows
        let mut chunk = rows.len() / 2;
        while chunk >= 1 && budget > 0 {
            let mut i = 0;
            while i + chunk <= rows.len() && rows.len() - chunk >= k.max(1) && budget > 0 {
                budget -= 1;
                let mut fewer = rows.clone();
                fewer.drain(i..i + chunk);
                if let Some(w) = fresh_fails(ctx, metric, precision, &fewer, q, k, batch) {
                    rows = fewer;
                    why = w;
                    progress = true;
                } else {
                    i += chunk;
                }
            }
            chunk /= 2;
        }
        if !progress || budget == 0 {
            return Some((rows, k, why));
        }
    }
}

fn fmt_vec(v: &[f32]) -> String {
    let mut s = String::from("[");
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let _ = write!(s, "{x:?}");
    }
    s.push(']');
    s
}

#[allow(clippy::too_many_arguments)]
fn record_failure(
    totals: &mut Totals,
    ctx: &GpuContext,
    inst: &Instance,
    model: &Model,
    queries: &[f32],
    qi: usize,
    k: usize,
    path: &'static str,
    why: String,
    round: usize,
) {
    let dim = inst.dim;
    let nq = queries.len() / dim;
    let q = &queries[qi * dim..(qi + 1) * dim];
    let signature = format!("{path} {} {:?} {}", inst.metric, inst.precision, inst.cat.name());
    let mut text = format!(
        "FAILURE {} | path {path} batch {nq} (query {qi}) k {k} round {round} live {}\n  {why}\n  query = {}\n",
        inst.describe(),
        model.order.len(),
        fmt_vec(q)
    );
    let already = totals.failures.iter().filter(|f| f.signature == signature).count();
    if already < 2 {
        let rows: Vec<Vec<f32>> = model.order.iter().map(|id| model.vectors[id].clone()).collect();
        // Try the failing batch size with the query repeated, then the other paths' sizes.
        let mut shrunk = None;
        for b in [nq, 1, 5, 16, 17] {
            if let Some(s) = shrink(ctx, inst.metric, inst.precision, rows.clone(), q, k, b) {
                shrunk = Some((b, s));
                break;
            }
        }
        match shrunk {
            Some((b, (rows, k, why))) => {
                let _ = writeln!(
                    text,
                    "  SHRUNK (fresh collection, query repeated {b}x, path {}): {} {:?} dim {dim} k {k}\n    {why}",
                    path_name(b, rows.iter().flatten().chain(q).all(|&x| is_byte(x))),
                    inst.metric,
                    inst.precision
                );
                for (i, r) in rows.iter().enumerate() {
                    let _ = writeln!(
                        text,
                        "    r{i} = {}   (exact distance {:e})",
                        fmt_vec(r),
                        distance(inst.metric, q, &stored_values(inst.precision, r))
                    );
                }
            }
            None => {
                let _ = writeln!(text, "  (does not reproduce in a fresh collection: depends on history)");
            }
        }
    }
    eprintln!("{text}");
    totals.failures.push(Failure { seed: inst.seed, signature, text });
}

fn run_instance(ctx: &GpuContext, seed: u64, skip: &[String], totals: &mut Totals, verbose: bool) {
    let mut rng = Rng::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5EED);
    let cat = CATEGORIES[rng.below(CATEGORIES.len())];
    if skip.iter().any(|s| s == cat.name()) {
        return;
    }
    let metric = METRICS[rng.below(METRICS.len())];
    // f16 a quarter of the time (always for its limits), bf16 an eighth, i8 or u8 an eighth,
    // f32 the rest: bf16 and integer rows widen exactly to f32, so the f32 kernels' traps hold
    // for them with their own rounding (integer rows are every category's values rounded and
    // clamped into the type: ties, saturated components and zero rows under cosine).
    let precision = match rng.below(8) {
        _ if cat == Category::F16Limits => Precision::F16,
        0 | 1 => Precision::F16,
        2 => Precision::Bf16,
        3 if rng.below(2) == 0 => Precision::I8,
        3 => Precision::U8,
        _ => Precision::F32,
    };
    let dim = choose_dim(&mut rng);
    let skip_dims = std::env::var("FUZZ_SKIP_DIMS").unwrap_or_default();
    if skip_dims.split(',').any(|d| d.trim().parse::<usize>().ok() == Some(dim)) {
        return;
    }
    let inst = Instance { seed, metric, precision, cat, dim };
    let n = choose_n(&mut rng, dim);
    let bases = gen_bases(&mut rng, &inst);
    if verbose {
        eprintln!("{} n {n}", inst.describe());
    }
    let storage = new_storage(ctx, dim, metric, precision);
    let mut model = Model::default();
    let mut next_id = 0usize;
    // The row store's all-bytes flag: every row stored since the last compaction or clear.
    let mut store_bytes = true;

    let make_row = |rng: &mut Rng, model: &Model| -> Vec<f32> {
        let mut v = if !model.order.is_empty() && rng.below(12) == 0 {
            // exact duplicate of a live row
            model.vectors[&model.order[rng.below(model.order.len())]].clone()
        } else {
            gen_row(rng, &inst, &bases)
        };
        sanitize(&mut v, metric, precision, true, rng);
        v
    };

    // Initial fill, in one to three batches.
    let mut rows: Vec<Vec<f32>> = Vec::with_capacity(n);
    for _ in 0..n {
        let r = make_row(&mut rng, &model);
        rows.push(r);
    }
    if cat == Category::BytesOneNonInteger {
        let r = rng.below(n);
        let i = rng.below(dim);
        rows[r][i] = [0.5f32, 255.5, 256.0, -1.0, 1e-3, 127.25][rng.below(6)];
        sanitize(&mut rows[r], metric, precision, true, &mut rng);
    }
    let splits = 1 + rng.below(3);
    let chunk = n.div_ceil(splits);
    for part in rows.chunks(chunk) {
        let batch: Vec<GpuVector> = part
            .iter()
            .map(|r| {
                let v = GpuVector::new(format!("r{next_id}"), r.clone());
                next_id += 1;
                v
            })
            .collect();
        storage.add_vectors(&batch).unwrap_or_else(|e| panic!("{}: add: {e}", inst.describe()));
        for v in &batch {
            let s = stored_values(precision, &v.data);
            store_bytes &= s.iter().all(|&x| is_byte(x));
            model.upsert(&v.id, s);
        }
    }
    totals.instances += 1;
    *totals.by_category.entry(cat.name()).or_default() += 1;
    *totals.by_metric_precision.entry(format!("{metric}/{precision:?}")).or_default() += 1;

    let rounds = 1 + rng.below(4);
    for round in 0..rounds {
        if model.order.is_empty() {
            break;
        }
        let live = model.order.len();
        // Query pool.
        let pool: Vec<Vec<f32>> =
            (0..1 + rng.below(4)).map(|_| gen_query(&mut rng, &inst, &model, &bases)).collect();
        let pairs_owned = model.rows();
        let ks = [1, 2, 3, 5, live.saturating_sub(1).max(1), live, live + 2];
        let mut searches: Vec<(Vec<f32>, usize)> = Vec::new();
        for q in &pool {
            for &b in &[1usize, 5, 16 + rng.below(2)] {
                let k = ks[rng.below(ks.len())];
                searches.push(((0..b).flat_map(|_| q.iter().copied()).collect(), k));
            }
        }
        // Mixed batches, one per path.
        for b in [1 + rng.below(3), 4 + rng.below(12), 16 + rng.below(20)] {
            let k = ks[rng.below(ks.len())];
            let qs: Vec<f32> = (0..b).flat_map(|_| pool[rng.below(pool.len())].iter().copied()).collect();
            searches.push((qs, k));
        }
        for (queries, k) in searches {
            let nq = queries.len() / dim;
            let all_bytes = store_bytes && queries.iter().all(|&x| is_byte(x));
            let path = path_name(nq, all_bytes);
            let searched =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| storage.search_batch(&queries, k)));
            let lists = match searched {
                Ok(result) => {
                    result.unwrap_or_else(|e| panic!("{}: search (batch {nq}, k {k}): {e}", inst.describe()))
                }
                Err(panic) => {
                    let msg = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    let text = format!(
                        "PANIC {} | path {path} batch {nq} k {k} round {round} live {}: {msg}",
                        inst.describe(),
                        model.order.len()
                    );
                    eprintln!("{text}");
                    totals.failures.push(Failure {
                        seed: inst.seed,
                        signature: format!("PANIC {path} dim {dim}"),
                        text,
                    });
                    continue;
                }
            };
            assert_eq!(lists.len(), nq, "{}: one list per query", inst.describe());
            let mut stats = CheckStats::default();
            CONTEXT.with(|c| {
                *c.borrow_mut() = format!("{} path {path} batch {nq} k {k} round {round}", inst.describe())
            });
            for (qi, list) in lists.iter().enumerate() {
                let q = &queries[qi * dim..(qi + 1) * dim];
                *totals.by_path.entry(path).or_default() += 1;
                if let Err(why) = check_list(metric, &pairs_owned, q, k, list, &mut stats) {
                    record_failure(totals, ctx, &inst, &model, &queries, qi, k, path, why, round);
                    break;
                }
            }
            totals.ties += stats.tolerated_ties;
            totals.exact_tie_order += stats.exact_tie_order;
        }

        // Mutations between searches: upserts, removals, inserts, re-adds.
        if round + 1 == rounds {
            break;
        }
        let mut batch: Vec<GpuVector> = Vec::new();
        let mut used = std::collections::HashSet::new();
        for _ in 0..rng.below(1 + live / 3) {
            let id = model.order[rng.below(model.order.len())].clone();
            if !used.insert(id.clone()) {
                continue;
            }
            let mut v = match rng.below(3) {
                0 => make_row(&mut rng, &model),
                1 => {
                    let mut v = model.vectors[&id].clone();
                    let i = rng.below(dim);
                    v[i] = step_stored(precision, v[i], if rng.below(2) == 0 { 1 } else { -1 });
                    v
                }
                _ => model.vectors[&model.order[rng.below(model.order.len())]].clone(),
            };
            sanitize(&mut v, metric, precision, true, &mut rng);
            batch.push(GpuVector::new(id, v));
        }
        for _ in 0..rng.below(5) {
            let v = make_row(&mut rng, &model);
            batch.push(GpuVector::new(format!("r{next_id}"), v));
            next_id += 1;
        }
        if !batch.is_empty() {
            storage.add_vectors(&batch).unwrap_or_else(|e| panic!("{}: upsert: {e}", inst.describe()));
            for v in &batch {
                let s = stored_values(precision, &v.data);
                store_bytes &= s.iter().all(|&x| is_byte(x));
                model.upsert(&v.id, s);
            }
        }
        // Removals: a few, or many (which compacts).
        let live = model.order.len();
        let count = match rng.below(4) {
            0 => 0,
            1 => live / 2,
            _ => rng.below(1 + live / 5),
        }
        .min(live.saturating_sub(1));
        let mut doomed: Vec<String> = Vec::new();
        for _ in 0..count {
            let id = model.order[rng.below(model.order.len())].clone();
            if !doomed.contains(&id) {
                doomed.push(id);
            }
        }
        if !doomed.is_empty() {
            storage.remove_vectors(&doomed).unwrap_or_else(|e| panic!("{}: remove: {e}", inst.describe()));
            for id in &doomed {
                model.remove(id);
            }
            // Re-add one removed id now and then (goes to the end of the tie order).
            if rng.below(3) == 0 {
                let id = doomed[0].clone();
                let v = make_row(&mut rng, &model);
                storage.add_vectors(&[GpuVector::new(id.clone(), v.clone())]).expect("re-add");
                let s = stored_values(precision, &v);
                store_bytes &= s.iter().all(|&x| is_byte(x));
                model.upsert(&id, s);
            }
        }
        if storage.slot_count() == storage.vector_count() {
            // compacted (or nothing removed): the flag is recomputed over the live rows
            store_bytes = model.vectors.values().flatten().all(|&x| is_byte(x));
        }
        assert_eq!(storage.vector_count(), model.order.len(), "{}: count", inst.describe());
    }
}

#[test]
fn fuzz_exactness() {
    campaign(&cpu(), 1500);
}

/// The same instances on every available GPU backend (fewer by default: each search there is a
/// device round trip). `FUZZ_GPU_SEEDS` sets the count; `HIVE_GPU_REQUIRE` makes a missing
/// backend a failure, as everywhere.
#[test]
fn fuzz_exactness_gpu_backends() {
    let seeds = std::env::var("FUZZ_GPU_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    for ctx in
        common::contexts_with_forced_paths().into_iter().filter(|c| c.backend_type() != GpuBackendType::Cpu)
    {
        eprintln!("fuzzing {}", common::describe(&ctx));
        campaign(&ctx, seeds);
    }
}

fn campaign(ctx: &GpuContext, default_seeds: u64) {
    let env = |k: &str| std::env::var(k).ok();
    let seconds: f64 = env("FUZZ_SECONDS").and_then(|s| s.parse().ok()).unwrap_or(f64::INFINITY);
    let start: u64 = env("FUZZ_SEED_START").and_then(|s| s.parse().ok()).unwrap_or(0);
    let max_seeds: u64 = env("FUZZ_SEEDS").and_then(|s| s.parse().ok()).unwrap_or(default_seeds);
    let max_failures: usize = env("FUZZ_MAX_FAILURES").and_then(|s| s.parse().ok()).unwrap_or(30);
    let skip: Vec<String> = env("FUZZ_SKIP")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    std::panic::set_hook(Box::new(|info| eprintln!("panic: {info}")));
    let mut totals = Totals {
        instances: 0,
        by_path: BTreeMap::new(),
        by_category: BTreeMap::new(),
        by_metric_precision: BTreeMap::new(),
        ties: 0,
        exact_tie_order: 0,
        failures: Vec::new(),
    };
    let began = Instant::now();
    let budget = Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX);
    let mut seeds = 0u64;
    if let Some(one) = env("FUZZ_SEED").and_then(|s| s.parse::<u64>().ok()) {
        run_instance(ctx, one, &skip, &mut totals, true);
        seeds = 1;
    } else {
        let mut seed = start;
        while began.elapsed() < budget && seeds < max_seeds && totals.failures.len() < max_failures {
            run_instance(ctx, seed, &skip, &mut totals, false);
            seed += 1;
            seeds += 1;
        }
        eprintln!("seeds {start}..{seed}");
    }
    eprintln!(
        "fuzz_exactness on {}: {} seeds, {} instances in {:.1}s (HIVE_GPU_CPU_SIMD={:?})",
        ctx.backend_type(),
        seeds,
        totals.instances,
        began.elapsed().as_secs_f64(),
        env("HIVE_GPU_CPU_SIMD")
    );
    eprintln!("  query checks by path: {:?}", totals.by_path);
    eprintln!("  instances by category: {:?}", totals.by_category);
    eprintln!("  instances by metric/precision: {:?}", totals.by_metric_precision);
    eprintln!(
        "  different id tolerated as a tie (<=1e-12 rel): {} (of which bit-equal distances out of insertion order: {})",
        totals.ties, totals.exact_tie_order
    );
    let mut by_sig: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for f in &totals.failures {
        by_sig.entry(f.signature.as_str()).or_default().push(f.seed);
    }
    eprintln!("  failures: {} {:?}", totals.failures.len(), by_sig);
    assert!(
        totals.failures.is_empty(),
        "{} failures; first:\n{}",
        totals.failures.len(),
        totals.failures[0].text
    );
}

// ---------------------------------------------------------------- minimal reproducers found by the fuzzer

/// Searches `q` repeated to batch sizes 1 (scan), 5 (f32 GEMM) and 16 (bf16 / byte tiles) and
/// returns, per batch size, the first failure.
fn repro(
    metric: Metric,
    precision: Precision,
    rows: &[Vec<f32>],
    q: &[f32],
    k: usize,
) -> Vec<(usize, String)> {
    let ctx = cpu();
    [1usize, 5, 16]
        .into_iter()
        .filter_map(|b| fresh_fails(&ctx, metric, precision, rows, q, k, b).map(|w| (b, w)))
        .collect()
}

/// A tiny (valid, non-zero) cosine query: q.x underflows in f32 (2e-46 -> 0) and the error is
/// then multiplied by 1/|x| = 5e14; the bound's absolute term (dim * f32::MIN_POSITIVE) is not.
#[test]
fn repro_cosine_tiny_query_underflow() {
    let failures =
        repro(Metric::Cosine, Precision::F32, &[vec![2e-15, 0.0], vec![1.0, 0.5]], &[1e-31, 0.0], 1);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// bf16 kernel only: `vdpbf16ps` flushes the product 1e-39 to zero; the cosine scale 1/|x| =
/// 1e15 turns that into an error of |q| = 1e-24, far above the bf16 bound's `dim * 1e-30`.
#[test]
fn repro_cosine_bf16_flush_to_zero() {
    let failures =
        repro(Metric::Cosine, Precision::F32, &[vec![1e-15, 0.0], vec![1.0, 1.0]], &[1e-24, 0.0], 1);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Dimensions 31, 63, 95, ... (dim % 32 == 31) panic in `bf16::kernel::row_to_pairs`: the row
/// has no full 32-value chunk left but the output has a full 16-word chunk, so `out_tail` is
/// empty when the odd last value is written.
#[test]
fn repro_bf16_packing_panics_for_dim_31() {
    for dim in [31usize, 63] {
        let rows: Vec<Vec<f32>> =
            (0..3).map(|i| (0..dim).map(|j| (i * dim + j) as f32 * 0.37 + 0.1).collect()).collect();
        let q: Vec<f32> = (0..dim).map(|j| j as f32 * 0.5 + 0.25).collect();
        let failures = repro(Metric::Euclidean, Precision::F32, &rows, &q, 1);
        assert!(failures.is_empty(), "dim {dim}: {failures:#?}");
    }
}
