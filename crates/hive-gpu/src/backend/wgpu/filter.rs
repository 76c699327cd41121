//! The tensor-core filter for wgpu batches, where the adapter has cooperative matrices
//! (`VK_KHR_cooperative_matrix` on Vulkan: NVIDIA's tensor cores). The algorithm is the CUDA
//! engine's fused filter, as far as wgpu can run it:
//! 1. a pass over every `SAMPLE_STRIDE`-th row writes each query's approximate distances to
//!    the sample, and a radix select takes the one of rank j (`gpu::search::sample_rank`);
//! 2. its band is the query's threshold, and a pass over all rows lists every live row whose
//!    approximate distance is at most the threshold;
//! 3. per query, the k-th smallest listed distance gives the band; its rows become the
//!    candidates when the band ends at or below the threshold, so no dropped row can be in it.
//!
//! Queries the filter cannot prove (a list that overflowed or a band past the threshold) take
//! the plain path (`WgpuRows::candidates`) afterwards. The host re-ranks candidates in f64.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use half::f16;

use super::params::{Blocks, FilterParams, Params, SelectState};
use super::rows::{
    MAX_GROUPS, PARAMS_BYTES, PARAMS_STRIDE, SELECT_GROUPS, Shared, Skip, WgpuRows, kernel_query, norm,
};
use super::{layout_entry, storage};
use crate::backend::RowStore;
use crate::error::{HiveGpuError, Result};
use crate::exact::gates::{self as bounds, Approximation};
use crate::exact::plan::{FUSED_CAP, SAMPLE_STRIDE, sample_rank, wide_list_size};
use crate::types::{GpuDistanceMetric, StoragePrecision};

const FILTER_WGSL: &str = include_str!("kernels/filter.wgsl");

/// Rows per staged tile: one per lane of a 32-lane subgroup.
const TILE_ROWS: usize = 32;
/// PCI vendor id of the one driver family the filter has been verified on.
const NVIDIA: u32 = 0x10de;
/// Lanes per subgroup the kernel is written for.
pub(super) const SUBGROUP: u32 = 32;
/// The largest dimension whose query fragments the subgroups keep in registers.
pub(super) const MAX_DIM: usize = 256;
/// The largest k the filter serves; larger k take the plain path.
const MAX_K: usize = 256;
/// Batches of at least this many queries take the filter.
const MIN_QUERIES: usize = 8;
/// Workgroups a pass aims for, so that every compute unit has several.
const TARGET_GROUPS: usize = 2048;

/// Query fragments (16 queries each) per subgroup: as many as keep the registers within bounds.
fn query_blocks(dim: usize) -> usize {
    if dim <= 128 { 4 } else { 2 }
}

/// Queries per workgroup (four subgroups).
fn queries_per_group(dim: usize) -> usize {
    64 * query_blocks(dim)
}

/// Whether the adapter runs the filter: an NVIDIA adapter with cooperative 16 x 16 x 16
/// products of f16 into f32, f16 in shaders, and subgroups of exactly 32 lanes.
pub(super) fn adapter_supports(adapter: &wgpu::Adapter) -> bool {
    let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
        | wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP
        | wgpu::Features::SUBGROUP_BARRIER;
    let info = adapter.get_info();
    // Only NVIDIA's driver so far: the kernel relies on a subgroup barrier ordering each
    // subgroup's own workgroup-memory hand-off, which NVIDIA does and Vulkan's memory model does
    // not promise; the GPU suite has verified it there, nowhere else.
    info.vendor == NVIDIA
        && adapter.features().contains(needed)
        && info.subgroup_min_size == SUBGROUP
        && info.subgroup_max_size == SUBGROUP
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
                && p.ab_type == wgpu::CooperativeScalarType::F16
                && p.cr_type == wgpu::CooperativeScalarType::F32
        })
}

/// The features a device needs for the filter.
pub(super) fn features() -> wgpu::Features {
    wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
        | wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP
        | wgpu::Features::SUBGROUP_BARRIER
}

/// Filter pipelines by (dimension, f16 rows); None where the driver refused one.
type PipelineCache = HashMap<(usize, bool), Option<Arc<wgpu::ComputePipeline>>>;

/// The filter's bind group layout and its pipelines, compiled per dimension and storage
/// precision on first use.
#[derive(Debug)]
pub(crate) struct FilterKernels {
    layout: wgpu::BindGroupLayout,
    pipelines: Mutex<PipelineCache>,
}

impl FilterKernels {
    pub(super) fn new(device: &wgpu::Device) -> Self {
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("filter"),
            entries: &[
                layout_entry(0, super::params_binding()),
                layout_entry(1, storage(true)),
                layout_entry(2, storage(true)),
                layout_entry(3, storage(true)),
                layout_entry(4, storage(true)),
                layout_entry(5, storage(true)),
                layout_entry(6, storage(false)),
            ],
        });
        Self { layout, pipelines: Mutex::new(HashMap::new()) }
    }

    /// The pipeline for rows of `dim` in f16 (`f16_rows`) or f32, None where the driver
    /// refused it (the batch then takes the plain path).
    fn pipeline(
        &self,
        device: &wgpu::Device,
        dim: usize,
        f16_rows: bool,
    ) -> Option<Arc<wgpu::ComputePipeline>> {
        let mut cache = self.pipelines.lock().ok()?;
        cache
            .entry((dim, f16_rows))
            .or_insert_with(|| {
                let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
                let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some("filter"),
                    source: wgpu::ShaderSource::Wgsl(source(dim, f16_rows).into()),
                });
                let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                    label: Some("filter"),
                    bind_group_layouts: &[Some(&self.layout)],
                    ..Default::default()
                });
                let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some("filter"),
                    layout: Some(&layout),
                    module: &module,
                    entry_point: Some("filter_rows"),
                    compilation_options: Default::default(),
                    cache: None,
                });
                pollster::block_on(scope.pop()).is_none().then(|| Arc::new(pipeline))
            })
            .clone()
    }
}

/// The filter kernel for rows of `dim` (a multiple of 16, at most `MAX_DIM`): the template
/// with its constants, row loads and unrolled fragment code.
pub(crate) fn source(dim: usize, f16_rows: bool) -> String {
    let qa = query_blocks(dim);
    let steps = dim / 16;
    let row_blocks = TILE_ROWS / 16;
    let mut hoist = String::new();
    for a in 0..qa {
        for s in 0..steps {
            hoist += &format!(
                "    let a{a}_{s} = coopLoadT<coop_mat16x16<f16, A>>(&queries[(q0 + (sg * QA + {a}u) * 16u) * D + {}u], D);\n",
                s * 16
            );
        }
    }
    let mut mma = String::new();
    for a in 0..qa {
        for j in 0..row_blocks {
            mma += &format!("        var c{a}_{j} = coop_mat16x16<f32, C>();\n");
        }
    }
    for s in 0..steps {
        for j in 0..row_blocks {
            mma += &format!(
                "        {{\n            let b = coopLoad<coop_mat16x16<f16, B>>(&xs[{}u], XD);\n",
                j * 16 * (dim + 8) + s * 16
            );
            for a in 0..qa {
                mma += &format!("            c{a}_{j} = coopMultiplyAdd(a{a}_{s}, b, c{a}_{j});\n");
            }
            mma += "        }\n";
        }
    }
    let mut emit = String::new();
    for a in 0..qa {
        for j in 0..row_blocks {
            emit += &format!("        coopStoreT(c{a}_{j}, &cs[sg * 16u * CD + {}u], CD);\n", j * 16);
        }
        emit += &format!(
            "        subgroupBarrier();\n        emit(sg, lane, q0, (sg * QA + {a}u) * 16u, r0, r_end);\n        subgroupBarrier();\n"
        );
    }
    let (row_type, load) =
        if f16_rows { ("vec4<f16>", "rows[i]") } else { ("vec4<f32>", "vec4<f16>(rows[i] * p.x_scale)") };
    let body = FILTER_WGSL
        .replace("ROW_TYPE", row_type)
        .replace("LOAD4(", "load4(")
        .replace("//@HOIST\n", &hoist)
        .replace("//@MMA\n", &mma)
        .replace("//@EMIT\n", &emit);
    format!(
        "enable f16;\nenable wgpu_cooperative_matrix;\n{}\nconst D: u32 = {dim}u;\nconst QA: u32 = {qa}u;\nconst QT: u32 = {}u;\n{body}\nfn load4(i: u32) -> vec4<f16> {{\n    return {load};\n}}\n",
        super::KEYS_WGSL,
        queries_per_group(dim)
    )
}

/// A batch tile's shape on the filter path.
#[derive(Debug, Clone, Copy)]
pub(super) struct FilterPlan {
    /// Queries per tile.
    pub(super) tile: usize,
    /// The sample rank of the threshold, None without a usable sample (every row passes).
    rank: Option<usize>,
    /// Sample rows in all (every `SAMPLE_STRIDE`-th row of each chunk).
    sample: usize,
    /// Candidate slots read back per query.
    cap: usize,
}

impl WgpuRows {
    /// The filter plan for `nq` queries of k neighbors, if the device and the collection suit it.
    pub(super) fn filter_plan(
        &self,
        nq: usize,
        k: usize,
        live: usize,
        metric: GpuDistanceMetric,
    ) -> Option<FilterPlan> {
        let kernels = self.device.filter.as_ref()?;
        let (dim, len) = (self.dim, self.host.len());
        // Cooperative matrices multiply f32 or f16 rows: L1 and L-infinity, and bf16 and byte
        // rows, take the plain tiles.
        let fits = !metric.is_difference_norm()
            && matches!(self.precision, StoragePrecision::F32 | StoragePrecision::F16)
            && nq >= MIN_QUERIES
            && k <= MAX_K
            && dim.is_multiple_of(16)
            && dim <= MAX_DIM
            && self.tuning.wgpu_coop
            && len >= self.tuning.fused_min_rows
            && len < u32::MAX as usize / 2;
        if !fits {
            return None;
        }
        kernels.pipeline(&self.device.device, dim, self.precision == StoragePrecision::F16)?;
        let rank = sample_rank(len, live, k);
        // Without a sample every live row passes: only collections that fit a list gain.
        if rank.is_none() && live > FUSED_CAP {
            return None;
        }
        let sample = self.chunk_rows().map(|(_, rows)| rows.div_ceil(SAMPLE_STRIDE)).sum::<usize>();
        let list_words = 1 + 2 * FUSED_CAP;
        let per_query = (if rank.is_some() { sample } else { 0 } + list_words) * 4;
        let binding =
            self.device.limits.max_storage_buffer_binding_size.min(self.device.limits.max_buffer_size)
                as usize;
        let tile = (binding / per_query).min(4096).min(nq).min(MAX_GROUPS);
        (tile >= MIN_QUERIES || tile == nq).then_some(FilterPlan {
            tile,
            rank,
            sample,
            cap: wide_list_size(k),
        })
    }

    /// Each chunk with stored rows: (chunk index, rows held).
    fn chunk_rows(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let len = self.host.len();
        (0..self.chunks.len())
            .map(move |c| (c, len.saturating_sub(self.chunks[c].first).min(self.rows_per_chunk)))
            .filter(|&(_, rows)| rows > 0)
    }

    /// The power of two f32 rows are scaled by before rounding to f16: the largest component
    /// (at most the largest norm) lands at or below 2^15.
    fn row_scale(&self) -> f64 {
        if self.precision == StoragePrecision::F16 {
            return 1.0;
        }
        bounds::f16_scale_below(f64::from(self.host.max_squared_norm()).sqrt() * (1.0 + 1e-6))
    }

    /// The filter's gate for one query (`q` as the kernels see it: unit for cosine), with the
    /// query's and the rows' f16 scales: `bounds::gate` for the products, plus what this kernel
    /// adds — rows' f16 components flushed below 2^-14, |x|^2 rebuilt from the stored 1 / |x|,
    /// and the last f32 steps.
    fn filter_gate(&self, metric: GpuDistanceMetric, q: &[f32], q_scale: f64, x_scale: f64) -> [f32; 2] {
        let q_norm = norm(q);
        let max_sq = f64::from(self.host.max_squared_norm());
        let rows_rounded = self.precision == StoragePrecision::F32;
        let (mul, add) = bounds::gate(
            metric,
            Approximation::CoopF16 { scale: q_scale, rows_rounded },
            q_norm,
            max_sq,
            self.dim,
        );
        let u = f64::from(f32::EPSILON) / 2.0;
        let r = max_sq.sqrt();
        let flushed = self.flush_extra(metric, q_norm, 2f64.powi(-14) / x_scale);
        let extra = flushed
            + match metric {
                // |x|^2 = 1 / (s * s): s within u of 1/|x| (2u squared), the product (u) and
                // Vulkan's division (2.5 ulp) make at most 6u; 10u leaves room. Then the fma.
                GpuDistanceMetric::Euclidean => 10.0 * u * max_sq + 2.0 * u * (max_sq + 2.0 * q_norm * r),
                GpuDistanceMetric::DotProduct => u * q_norm * r,
                GpuDistanceMetric::Cosine => 2.0 * u * q_norm,
                // Never planned here (`filter_plan`).
                GpuDistanceMetric::Manhattan | GpuDistanceMetric::Chebyshev => 0.0,
            };
        let add = (f64::from(add) + 2.0 * extra * 1.01) * (1.0 + 1e-6);
        [mul, add as f32]
    }

    /// Candidate slots of each query of a tile on the filter path (None where the filter
    /// could not prove its candidates complete).
    pub(super) fn filter_candidates(
        &self,
        plan: &FilterPlan,
        block: &[f32],
        t: usize,
        k: usize,
        metric: GpuDistanceMetric,
        skip: Option<&Skip>,
    ) -> Result<Vec<Option<Vec<usize>>>> {
        let dim = self.dim;
        let device = &self.device;
        let Some(filter) = device.filter.as_ref() else {
            return Err(HiveGpuError::Internal("filter planned on a device without it".into()));
        };
        let f16_rows = self.precision == StoragePrecision::F16;
        let Some(pipeline) = filter.pipeline(&device.device, dim, f16_rows) else {
            return Err(HiveGpuError::Internal("filter pipeline missing".into()));
        };
        let cap = plan.cap;
        let qt = queries_per_group(dim);
        let padded = t.div_ceil(qt) * qt;
        let sample_words = if plan.rank.is_some() { t * plan.sample } else { 0 };
        let list_words = 1 + 2 * FUSED_CAP;
        let chunks: Vec<(usize, usize)> = self.chunk_rows().collect();

        // Inputs (before the workspace lock, so that another piece's search overlaps them): the
        // queries as the kernels see them (unit for cosine), in f16 under one power of two that
        // keeps the tile's largest component in range, and each query's gate.
        let x_scale = self.row_scale();
        let kernel_queries: Cow<'_, [f32]> = if metric == GpuDistanceMetric::Cosine {
            Cow::Owned(block.chunks_exact(dim).flat_map(|q| kernel_query(q, metric).into_owned()).collect())
        } else {
            Cow::Borrowed(block)
        };
        let q_scale = bounds::f16_scale(&kernel_queries);
        let mut halves = vec![0u16; padded * dim];
        for (h, &x) in halves.iter_mut().zip(kernel_queries.iter()) {
            *h = f16::from_f64(f64::from(x) * q_scale).to_bits();
        }
        let unscale = (1.0 / (q_scale * x_scale)) as f32;
        let mut gates = Vec::with_capacity(t * 8);
        for q in kernel_queries.chunks_exact(dim) {
            // Scales at the ends of f32's range: an infinite band lets every row pass, so the
            // query is proven by the plain path (or by its whole list, if that is small).
            let gate = if unscale.is_normal() {
                self.filter_gate(metric, q, q_scale, x_scale)
            } else {
                [1.0, f32::INFINITY]
            };
            gates.extend(gate.iter().flat_map(|x| x.to_ne_bytes()));
        }
        let rank = plan.rank.unwrap_or(k);
        let states = vec![SelectState::start(rank); t];

        let mut guard =
            self.work.lock().map_err(|_| HiveGpuError::Internal("wgpu workspace poisoned".into()))?;
        let work = &mut *guard;
        let storage_usage =
            wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC;
        // Parameter blocks: two per chunk (sample, filter), four radix passes, thresholds, select.
        let dispatches = 2 * chunks.len() + 6;
        let mut generation = work.generation;
        let half_bytes = (padded * dim * 2) as u64;
        self.ensure(&mut work.half_queries, &mut generation, "half queries", half_bytes, storage_usage)?;
        let dist_words = sample_words + t * list_words;
        let Shared { params, dist, state, hist, cand, gate, readback } =
            self.ensure_shared(&mut work.shared, &mut generation, t, cap, dispatches, dist_words)?;
        work.generation = generation;
        let key = (generation ^ (self.chunks_generation << 32), skip.map_or(0, |s| s.id));
        let missing = |name: &str| HiveGpuError::Internal(format!("wgpu buffer {name} missing"));
        let half_queries = work.half_queries.as_ref().ok_or_else(|| missing("half queries"))?;
        let dead = match skip {
            Some(skip) => &skip.buffer,
            None => self.dead.as_ref().ok_or_else(|| missing("dead"))?,
        };
        let scope = device.device.push_error_scope(wgpu::ErrorFilter::Validation);
        if work.filter_groups.as_ref().is_none_or(|(k0, _, _)| *k0 != key) {
            let params_binding = || {
                wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: params,
                    offset: 0,
                    size: std::num::NonZeroU64::new(PARAMS_BYTES),
                })
            };
            let chunk_groups = self
                .chunks
                .iter()
                .map(|chunk| {
                    device.device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some("filter"),
                        layout: &filter.layout,
                        entries: &[
                            wgpu::BindGroupEntry { binding: 0, resource: params_binding() },
                            wgpu::BindGroupEntry { binding: 1, resource: chunk.rows.as_entire_binding() },
                            wgpu::BindGroupEntry { binding: 2, resource: chunk.scale.as_entire_binding() },
                            wgpu::BindGroupEntry { binding: 3, resource: dead.as_entire_binding() },
                            wgpu::BindGroupEntry { binding: 4, resource: half_queries.as_entire_binding() },
                            wgpu::BindGroupEntry { binding: 5, resource: state.as_entire_binding() },
                            wgpu::BindGroupEntry { binding: 6, resource: dist.as_entire_binding() },
                        ],
                    })
                })
                .collect();
            let select_group = self.select_group("filter select", params, [dist, state, hist, cand, gate]);
            work.filter_groups = Some((key, chunk_groups, select_group));
        }
        let Some((_, chunk_groups, select_group)) = &work.filter_groups else {
            return Err(missing("bind groups"));
        };

        let metric_code = crate::exact::metric_code(metric) as u32;

        let query_groups = padded / qt;
        // Rows per workgroup along y: enough workgroups in all, at least 8 tiles each.
        let split = |rows: usize| {
            let splits = (TARGET_GROUPS / query_groups).clamp(1, rows.div_ceil(8 * TILE_ROWS).max(1));
            let per = rows.div_ceil(splits).next_multiple_of(TILE_ROWS);
            (per, rows.div_ceil(per))
        };
        let lists_base = sample_words as u32;
        let mut sample_base = 0usize;
        let mut blocks = Blocks::default();
        // (chunk, params offset, workgroups along y) of each pass.
        let mut sample_passes = Vec::new();
        let mut filter_passes = Vec::new();
        // What every pass of the filter shares.
        let tile_pass = FilterParams {
            nq: t as u32,
            metric: metric_code,
            cap: FUSED_CAP as u32,
            x_scale: x_scale as f32,
            unscale,
            ..FilterParams::default()
        };
        for &(c, rows) in &chunks {
            let first_slot = self.chunks[c].first as u32;
            if plan.rank.is_some() {
                let sample_rows = rows.div_ceil(SAMPLE_STRIDE);
                let (per, groups) = split(sample_rows);
                let sample = FilterParams {
                    n_rows: sample_rows as u32,
                    first_slot,
                    mode: 0,
                    row_step: SAMPLE_STRIDE as u32,
                    rows_per_split: per as u32,
                    out_base: sample_base as u32,
                    out_stride: plan.sample as u32,
                    ..tile_pass
                };
                sample_passes.push((c, blocks.push(sample, PARAMS_STRIDE), groups));
                sample_base += sample_rows;
            }
            let (per, groups) = split(rows);
            let filter = FilterParams {
                n_rows: rows as u32,
                first_slot,
                mode: 1,
                row_step: 1,
                rows_per_split: per as u32,
                out_base: lists_base,
                out_stride: list_words as u32,
                ..tile_pass
            };
            filter_passes.push((c, blocks.push(filter, PARAMS_STRIDE), groups));
        }
        // The selection kernels' blocks (`Params`): over the sample's distances, the radix
        // passes, the thresholds (`lists`: whether a sample ranked the queries), then the
        // selection over the filter's lists.
        let tile = Params {
            dim: dim as u32,
            nq: t as u32,
            metric: metric_code,
            cap: cap as u32,
            ..Params::default()
        };
        let sample = plan.sample as u32;
        let radix_offsets: Vec<u32> = [24u32, 16, 8, 0]
            .iter()
            .map(|&shift| {
                blocks.push(Params { n_rows: sample, stride: sample, shift, ..tile }, PARAMS_STRIDE)
            })
            .collect();
        let sampled = u32::from(plan.rank.is_some());
        let threshold_offset = blocks.push(Params { k: k as u32, lists: sampled, ..tile }, PARAMS_STRIDE);
        let select = Params {
            k: k as u32,
            list_base: lists_base,
            list_words: list_words as u32,
            list_cap: FUSED_CAP as u32,
            ..tile
        };
        let select_offset = blocks.push(select, PARAMS_STRIDE);
        // One workgroup (or row of workgroups) per query of the tile.
        let tq = t as u32;
        let queue = &device.queue;
        queue.write_buffer(params, 0, blocks.bytes());
        queue.write_buffer(half_queries, 0, bytemuck::cast_slice(&halves));
        queue.write_buffer(gate, 0, &gates);
        queue.write_buffer(state, 0, bytemuck::cast_slice(&states));

        // The filter kernel over each chunk: (chunk, parameter offset, workgroups along y).
        let run_passes = |pass: &mut wgpu::ComputePass<'_>, passes: &[(usize, u32, usize)]| {
            pass.set_pipeline(&pipeline);
            for &(c, offset, groups) in passes {
                pass.set_bind_group(0, &chunk_groups[c], &[offset]);
                pass.dispatch_workgroups(query_groups as u32, groups as u32, 1);
            }
        };
        let new_encoder = || {
            device.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("filter") })
        };
        // With HIVE_GPU_PROFILE=1 each phase is submitted and waited for on its own, and timed.
        let profile = crate::backend::profiling();
        let mut marks = Vec::new();
        let mut since = std::time::Instant::now();
        let mut phase_end =
            |encoder: wgpu::CommandEncoder, name: &'static str| -> Result<wgpu::CommandEncoder> {
                if !profile {
                    return Ok(encoder);
                }
                queue.submit([encoder.finish()]);
                device
                    .device
                    .poll(wgpu::PollType::Wait { submission_index: None, timeout: None })
                    .map_err(|e| HiveGpuError::VulkanError(format!("waiting for the filter: {e}")))?;
                marks.push((name, since.elapsed().as_secs_f64() * 1e3));
                since = std::time::Instant::now();
                Ok(new_encoder())
            };
        let mut encoder = new_encoder();
        encoder.clear_buffer(hist, 0, Some((t * 256 * 4) as u64));
        // The lists' counts (and entries, which only matter below a count) start at zero.
        encoder.clear_buffer(dist, (sample_words * 4) as u64, Some((t * list_words * 4) as u64));
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("filter sample"),
                timestamp_writes: None,
            });
            run_passes(&mut pass, &sample_passes);
            if plan.rank.is_some() {
                let groups_x =
                    plan.sample.div_ceil(256).min(MAX_GROUPS).min((SELECT_GROUPS / t).max(1)) as u32;
                for &offset in &radix_offsets {
                    pass.set_bind_group(0, select_group, &[offset]);
                    pass.set_pipeline(&device.kernels.radix_hist);
                    pass.dispatch_workgroups(groups_x, tq, 1);
                    pass.set_pipeline(&device.kernels.radix_pick);
                    pass.dispatch_workgroups(tq, 1, 1);
                }
            }
            pass.set_bind_group(0, select_group, &[threshold_offset]);
            pass.set_pipeline(&device.kernels.thresholds);
            pass.dispatch_workgroups(t.div_ceil(256) as u32, 1, 1);
        }
        let mut encoder = phase_end(encoder, "sample")?;
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("filter"),
                timestamp_writes: None,
            });
            run_passes(&mut pass, &filter_passes);
        }
        let mut encoder = phase_end(encoder, "filter")?;
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("filter select"),
                timestamp_writes: None,
            });
            pass.set_bind_group(0, select_group, &[select_offset]);
            pass.set_pipeline(&device.kernels.select_lists);
            pass.dispatch_workgroups(tq, 1, 1);
        }
        let outcome = self.read_candidates(encoder, state, cand, readback, t, k, cap);
        if profile {
            marks.push(("select and read", since.elapsed().as_secs_f64() * 1e3));
            let listed: Vec<String> = marks.iter().map(|(name, ms)| format!("{name} {ms:.3}")).collect();
            eprintln!("hive-gpu profile (wgpu filter, {t} queries, ms): {}", listed.join(", "));
        }
        if let Some(error) = pollster::block_on(scope.pop()) {
            return Err(HiveGpuError::VulkanError(format!("filter search: {error}")));
        }
        device.take_error("filter search")?;
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wgpu::naga;

    /// Every generated filter kernel parses, validates and translates to SPIR-V (what wgpu
    /// does before the driver sees it), whether or not this machine has an adapter for it.
    #[test]
    fn filter_kernels_validate() {
        for dim in [16, 64, 128, 144, 256] {
            for f16_rows in [false, true] {
                let src = source(dim, f16_rows);
                let module = naga::front::wgsl::parse_str(&src)
                    .unwrap_or_else(|e| panic!("dim {dim} f16 {f16_rows}: {}", e.emit_to_string(&src)));
                let info = naga::valid::Validator::new(
                    naga::valid::ValidationFlags::all(),
                    naga::valid::Capabilities::all(),
                )
                .validate(&module)
                .unwrap_or_else(|e| panic!("dim {dim} f16 {f16_rows}: {}", e.emit_to_string(&src)));
                let spirv = naga::back::spv::write_vec(&module, &info, &Default::default(), None);
                assert!(spirv.is_ok_and(|words| words.len() > 100), "dim {dim} f16 {f16_rows}: no SPIR-V");
            }
        }
    }

    /// The selection module (radix select, lists, thresholds) validates too; adapters compile
    /// it at device creation, so a mistake would cost every wgpu search.
    #[test]
    fn selection_kernels_validate() {
        let src = format!(
            "{}\n{}\n{}",
            super::super::KEYS_WGSL,
            super::super::COMMON_WGSL,
            super::super::SELECT_WGSL
        );
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("select: {}", e.emit_to_string(&src)));
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("select: {}", e.emit_to_string(&src)));
    }

    #[test]
    fn query_fragments_fit_the_registers() {
        assert_eq!(queries_per_group(128), 256);
        assert_eq!(queries_per_group(256), 128);
        // Hoisted fragments: query blocks x 16-wide steps stays at 32 for every served dim.
        for dim in (16..=MAX_DIM).step_by(16) {
            assert!(query_blocks(dim) * dim / 16 <= 32, "dim {dim}");
        }
    }
}
