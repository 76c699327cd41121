//! The universal GPU backend through wgpu (Vulkan; Metal on Apple, DX12 on Windows): every GPU
//! without a vendor backend, and Mesa's software Vulkan (lavapipe) in CI.
//!
//! The device computes the approximate distances and selects each query's candidates: every
//! row inside the proven error band of the k-th distance.
//! - Batches: register-blocked distance tiles, then a radix select of each query's k-th
//!   distance over the tile and a collect pass.
//! - Single queries with k <= 256: one fused pass in which each workgroup keeps the rows within
//!   the band of its own k-th (`scan_select`), and a one-workgroup merge (`merge_lists`).
//!   Where the adapter has subgroups of one fixed size of at least 8 lanes, eight lanes share a
//!   row (`scan_select_wide`), so that loads are contiguous. Larger k takes the batch's radix
//!   passes over a plain scan.
//!
//! Only the candidates come back; the exact f64 re-rank runs on the host copy of the rows,
//! with the CPU backend's code.

mod filter;
mod params;
mod rows;
#[cfg(test)]
mod translate;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::backend::{GpuBackend, RowStore};
use crate::error::{HiveGpuError, Result};
use crate::types::{GpuBackendType, GpuDeviceInfo, SearchPrecision, StoragePrecision};

const KEYS_WGSL: &str = include_str!("kernels/keys.wgsl");
const COMMON_WGSL: &str = include_str!("kernels/common.wgsl");
const SEARCH_WGSL: &str = include_str!("kernels/search.wgsl");
const SELECT_WGSL: &str = include_str!("kernels/select.wgsl");
const SCAN_WIDE_WGSL: &str = include_str!("kernels/scan_wide.wgsl");

fn backends() -> wgpu::Backends {
    let mut b = wgpu::Backends::VULKAN;
    if cfg!(target_vendor = "apple") {
        b |= wgpu::Backends::METAL;
    }
    if cfg!(windows) {
        b |= wgpu::Backends::DX12;
    }
    b
}

fn rank(device_type: wgpu::DeviceType) -> u8 {
    match device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// The process's one wgpu instance, never destroyed. Destroying the last instance lets the
/// Vulkan loader unload the driver, and NVIDIA's driver leaves thread-exit destructors behind
/// in every thread that called it: a thread that probed Vulkan then crashed when it ended.
fn instance() -> &'static wgpu::Instance {
    static INSTANCE: OnceLock<wgpu::Instance> = OnceLock::new();
    INSTANCE.get_or_init(|| {
        let mut descriptor = wgpu::InstanceDescriptor::new_without_display_handle();
        descriptor.backends = backends();
        descriptor.flags = wgpu::InstanceFlags::empty();
        wgpu::Instance::new(descriptor)
    })
}

/// Adapters in preference order (discrete, integrated, virtual, other, software), filtered by
/// `HIVE_GPU_ADAPTER=<substring of the name>` when set.
fn adapters() -> std::result::Result<Vec<wgpu::Adapter>, String> {
    let mut found = pollster::block_on(instance().enumerate_adapters(backends()));
    if found.is_empty() {
        return Err("no Vulkan adapter: no Vulkan loader or driver found (install the GPU's Vulkan driver, \
                    or mesa-vulkan-drivers for the software one)"
            .into());
    }
    if let Ok(wanted) = std::env::var("HIVE_GPU_ADAPTER")
        && !wanted.trim().is_empty()
    {
        let names: Vec<String> = found.iter().map(|a| a.get_info().name).collect();
        found.retain(|a| a.get_info().name.to_lowercase().contains(&wanted.trim().to_lowercase()));
        if found.is_empty() {
            return Err(format!("HIVE_GPU_ADAPTER={wanted:?} matches none of the adapters {names:?}"));
        }
    }
    found.sort_by_key(|a| rank(a.get_info().device_type));
    Ok(found)
}

/// Why the wgpu backend is unavailable, or the adapters it would use.
pub(crate) fn probe() -> std::result::Result<Vec<GpuDeviceInfo>, String> {
    let found = adapters()?;
    let note = "cooperative matrices: batches filter on f16 tensor cores, then re-rank exactly";
    Ok(found
        .iter()
        .enumerate()
        .map(|(i, a)| adapter_info(a, i, filter::adapter_supports(a).then_some(note)))
        .collect())
}

fn adapter_info(adapter: &wgpu::Adapter, ordinal: usize, note: Option<&str>) -> GpuDeviceInfo {
    let info = adapter.get_info();
    let limits = adapter.limits();
    let device_type = format!("{:?}", info.device_type);
    let mut driver = format!("{} {} ({:?}, {device_type})", info.driver, info.driver_info, info.backend);
    if let Some(note) = note {
        driver.push_str("; ");
        driver.push_str(note);
    }
    GpuDeviceInfo {
        name: info.name.clone(),
        backend: GpuBackendType::Vulkan,
        device_id: ordinal,
        // wgpu does not report device memory; 0 means unknown, never a guess.
        total_vram_bytes: 0,
        available_vram_bytes: 0,
        used_vram_bytes: 0,
        driver_version: Some(driver),
        compute_capability: format!("vendor {:#06x} device {:#06x}", info.vendor, info.device),
        max_threads_per_block: limits.max_compute_invocations_per_workgroup,
        max_shared_memory_per_block: u64::from(limits.max_compute_workgroup_storage_size),
        compute_units: 0,
        pci_bus_id: (!info.device_pci_bus_id.is_empty()).then(|| info.device_pci_bus_id.clone()),
        l2_cache_bytes: None,
        warp_size: info.subgroup_min_size.max(1),
        software: info.device_type == wgpu::DeviceType::Cpu,
    }
}

/// The WGSL modules the backend compiles, assembled from `kernels/*.wgsl`: what device creation
/// builds its pipelines from, and what `translate.rs` checks that naga turns into MSL and HLSL.
pub(super) struct Modules {
    /// The scans and distances, one module per stored element type (in the order of
    /// [`StoragePrecision::ALL`]: f32, f16, bf16, i8, u8).
    pub(super) search: [String; 5],
    /// The same with the subgroup scan of single queries added.
    pub(super) wide: [String; 5],
    /// Radix select, lists and thresholds.
    pub(super) select: String,
}

impl Modules {
    pub(super) fn new() -> Self {
        let search = format!("{KEYS_WGSL}\n{COMMON_WGSL}\n{SEARCH_WGSL}");
        // Naga takes the subgroup built-ins without `enable subgroups;` (which it rejects).
        let wide = format!("{search}\n{SCAN_WIDE_WGSL}");
        Self {
            search: StoragePrecision::ALL.map(|p| rows_as(&search, p)),
            wide: StoragePrecision::ALL.map(|p| rows_as(&wide, p)),
            select: format!("{KEYS_WGSL}\n{COMMON_WGSL}\n{SELECT_WGSL}"),
        }
    }

    /// Every module with a name, for checks over all of them.
    #[cfg(test)]
    pub(super) fn all(self) -> Vec<(&'static str, String)> {
        const SEARCH: [&str; 5] = [
            "search (f32 rows)",
            "search (f16 rows)",
            "search (bf16 rows)",
            "search (i8 rows)",
            "search (u8 rows)",
        ];
        const WIDE: [&str; 5] = [
            "subgroup scan (f32 rows)",
            "subgroup scan (f16 rows)",
            "subgroup scan (bf16 rows)",
            "subgroup scan (i8 rows)",
            "subgroup scan (u8 rows)",
        ];
        let mut all: Vec<(&'static str, String)> = SEARCH.into_iter().zip(self.search).collect();
        all.extend(WIDE.into_iter().zip(self.wide));
        all.push(("select", self.select));
        all
    }
}

// Rows are bound as vectors of 4 components (16 bytes of f32, 8 of f16 or bf16, 4 of bytes),
// so that a row of a length divisible by 4 loads in wide pieces; buffers are sized to whole
// vectors. `ROW(i)` is component i of the binding, `ROW4(w)` components 4w to 4w + 3, both as
// f32: every stored type widens exactly (bf16 is an f32's high half; a byte is sign- or
// zero-extended by `extractBits`), so the kernels' f32 arithmetic is that of f32 rows holding
// the stored values. f16 goes through `unpack2x16float`, which may flush subnormals (the gate
// covers that, `rows.rs`).
fn rows_as(source: &str, precision: StoragePrecision) -> String {
    let (row_type, row, row4) = match precision {
        StoragePrecision::F32 => ("vec4<f32>", "rows[i >> 2u][i & 3u]", "rows[base + w]"),
        StoragePrecision::F16 => (
            "vec2<u32>",
            "unpack2x16float(rows[i >> 2u][(i >> 1u) & 1u])[i & 1u]",
            "vec4<f32>(unpack2x16float(rows[base + w].x), unpack2x16float(rows[base + w].y))",
        ),
        StoragePrecision::Bf16 => (
            "vec2<u32>",
            "bitcast<f32>((rows[i >> 2u][(i >> 1u) & 1u] << (16u - 16u * (i & 1u))) & 0xffff0000u)",
            "bf16x4(rows[base + w])",
        ),
        StoragePrecision::I8 => (
            "u32",
            "f32(extractBits(bitcast<i32>(rows[i >> 2u]), (i & 3u) * 8u, 8u))",
            "i8x4(rows[base + w])",
        ),
        StoragePrecision::U8 => {
            ("u32", "f32(extractBits(rows[i >> 2u], (i & 3u) * 8u, 8u))", "u8x4(rows[base + w])")
        }
    };
    // The unpacking helpers ROW4 may call (unused ones cost nothing).
    const UNPACK: &str = "
fn bf16x4(v: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(bitcast<f32>(v.x << 16u), bitcast<f32>(v.x & 0xffff0000u), bitcast<f32>(v.y << 16u), bitcast<f32>(v.y & 0xffff0000u));
}
fn i8x4(v: u32) -> vec4<f32> {
    let s = bitcast<i32>(v);
    return vec4<f32>(f32(extractBits(s, 0u, 8u)), f32(extractBits(s, 8u, 8u)), f32(extractBits(s, 16u, 8u)), f32(extractBits(s, 24u, 8u)));
}
fn u8x4(v: u32) -> vec4<f32> {
    return vec4<f32>(f32(extractBits(v, 0u, 8u)), f32(extractBits(v, 8u, 8u)), f32(extractBits(v, 16u, 8u)), f32(extractBits(v, 24u, 8u)));
}
";
    let body = source.replace("ROW_TYPE", row_type).replace("ROW(i)", row).replace("ROW4(base + w)", row4);
    format!("{body}\n{UNPACK}")
}

/// The index of `precision` in [`StoragePrecision::ALL`] (and in the per-type arrays here).
fn element_index(precision: StoragePrecision) -> usize {
    StoragePrecision::ALL.iter().position(|&p| p == precision).unwrap_or(0)
}

/// The pipelines that read stored rows, for one element type.
#[derive(Debug)]
pub(crate) struct RowPipelines {
    pub(crate) distances: wgpu::ComputePipeline,
    pub(crate) scan: wgpu::ComputePipeline,
    pub(crate) scan_select: wgpu::ComputePipeline,
    /// `scan_select` with eight lanes per row, where the adapter has fixed-size subgroups of at
    /// least 8 lanes (collections use it unless `Tuning::wgpu_subgroups` is off); rows of a
    /// length divisible by 4. None where the driver failed it: single queries stay on
    /// `scan_select`.
    pub(crate) scan_select_wide: Option<wgpu::ComputePipeline>,
}

/// A compute pipeline of `entry` in `source`, bound by `layout`.
fn compute_pipeline(
    device: &wgpu::Device,
    layout: &wgpu::BindGroupLayout,
    source: &str,
    entry: &str,
) -> wgpu::ComputePipeline {
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(entry),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(entry),
        bind_group_layouts: &[Some(layout)],
        ..Default::default()
    });
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(entry),
        layout: Some(&pipeline_layout),
        module: &module,
        entry_point: Some(entry),
        compilation_options: Default::default(),
        cache: None,
    })
}

impl Kernels {
    /// The row pipelines of `precision`, made on first use.
    fn row_pipelines(&self, device: &wgpu::Device, precision: StoragePrecision) -> &RowPipelines {
        let index = element_index(precision);
        self.rows[index].get_or_init(|| {
            let modules = Modules::new();
            let source = &modules.search[index];
            let layout = &self.search_layout;
            // A driver that fails the subgroup kernel leaves single queries on `scan_select`.
            let scan_select_wide = self
                .subgroups
                .then(|| {
                    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
                    let pipeline = compute_pipeline(device, layout, &modules.wide[index], "scan_select_wide");
                    pollster::block_on(scope.pop()).is_none().then_some(pipeline)
                })
                .flatten();
            RowPipelines {
                distances: compute_pipeline(device, layout, source, "distances"),
                scan: compute_pipeline(device, layout, source, "scan"),
                scan_select: compute_pipeline(device, layout, source, "scan_select"),
                scan_select_wide,
            }
        })
    }
}

/// Pipelines and layouts, created once per device.
#[derive(Debug)]
pub(crate) struct Kernels {
    search_layout: wgpu::BindGroupLayout,
    select_layout: wgpu::BindGroupLayout,
    /// The scans and distances of each stored element type ([`element_index`]): f32 and f16
    /// made with the device, the others on a collection's first use of them.
    rows: [OnceLock<RowPipelines>; 5],
    /// Whether the adapter has fixed-size subgroups of at least 8 lanes (`scan_select_wide`).
    subgroups: bool,
    merge_lists: wgpu::ComputePipeline,
    radix_hist: wgpu::ComputePipeline,
    radix_pick: wgpu::ComputePipeline,
    collect: wgpu::ComputePipeline,
    /// Filter thresholds from the sample's radix select, and the selection of filter lists.
    thresholds: wgpu::ComputePipeline,
    select_lists: wgpu::ComputePipeline,
}

/// The device a wgpu collection lives on.
#[derive(Debug)]
pub(crate) struct WgpuDevice {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: GpuDeviceInfo,
    limits: wgpu::Limits,
    kernels: Kernels,
    /// The tensor-core filter, where the adapter has cooperative matrices.
    filter: Option<filter::FilterKernels>,
    /// Errors wgpu reports outside an error scope (kept, never a panic).
    uncaptured: Arc<Mutex<Option<String>>>,
    /// The host-visible buffer every upload goes through, shared by the device's collections.
    staging: Mutex<Option<wgpu::Buffer>>,
}

/// The wgpu backend.
#[derive(Debug)]
pub(crate) struct WgpuBackend {
    device: Arc<WgpuDevice>,
}

fn layout_entry(binding: u32, ty: wgpu::BindingType) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry { binding, visibility: wgpu::ShaderStages::COMPUTE, ty, count: None }
}

fn storage(read_only: bool) -> wgpu::BindingType {
    wgpu::BindingType::Buffer {
        ty: wgpu::BufferBindingType::Storage { read_only },
        has_dynamic_offset: false,
        min_binding_size: None,
    }
}

fn params_binding() -> wgpu::BindingType {
    wgpu::BindingType::Buffer {
        ty: wgpu::BufferBindingType::Uniform,
        has_dynamic_offset: true,
        min_binding_size: std::num::NonZeroU64::new(rows::PARAMS_BYTES),
    }
}

impl WgpuBackend {
    /// Opens adapter `ordinal` (in preference order). Every context on one adapter shares one
    /// device for the whole process, as CUDA contexts share an engine: pipelines compile once,
    /// and no device is ever destroyed. NVIDIA's Vulkan driver deadlocks when one thread runs
    /// `vkDestroyDevice` while another thread that used the driver exits (seen on the H100
    /// and H200: the `bad_input` tests hung in 2 of 6 runs, every hung process stuck so).
    pub(crate) fn open(ordinal: usize) -> Result<Self> {
        type Devices = Mutex<HashMap<String, Arc<WgpuDevice>>>;
        static DEVICES: OnceLock<Devices> = OnceLock::new();
        let unavailable =
            |reason: String| HiveGpuError::BackendUnavailable { backend: GpuBackendType::Vulkan, reason };
        let found = adapters().map_err(unavailable)?;
        let count = found.len();
        let adapter = found.into_iter().nth(ordinal).ok_or(HiveGpuError::DeviceNotFound {
            backend: GpuBackendType::Vulkan,
            ordinal,
            count,
        })?;
        let info = adapter.get_info();
        let key = format!(
            "{:?} {} {:#x}:{:#x} {} {}",
            info.backend, info.name, info.vendor, info.device, info.device_pci_bus_id, ordinal
        );
        // A panic while another open held the lock leaves the map itself intact.
        let mut devices =
            DEVICES.get_or_init(Default::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(device) = devices.get(&key) {
            return Ok(Self { device: device.clone() });
        }
        let device = Arc::new(Self::create_device(&adapter, ordinal)?);
        devices.insert(key, device.clone());
        Ok(Self { device })
    }

    fn create_device(adapter: &wgpu::Adapter, ordinal: usize) -> Result<WgpuDevice> {
        let unavailable =
            |reason: String| HiveGpuError::BackendUnavailable { backend: GpuBackendType::Vulkan, reason };
        let limits = adapter.limits();
        let details = adapter.get_info();
        // Subgroups of one fixed size of at least 8 lanes: every group of 8 lanes of
        // `scan_select_wide` lies inside one subgroup.
        let subgroups = adapter.features().contains(wgpu::Features::SUBGROUP)
            && details.subgroup_min_size >= 8
            && details.subgroup_min_size == details.subgroup_max_size
            && 256 % details.subgroup_min_size == 0;
        let coop = filter::adapter_supports(adapter);
        let request = |features: wgpu::Features| {
            let experimental = if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
                // SAFETY: wgpu calls cooperative matrices experimental: its implementation may
                // have bugs, which callers accept by this call. The filter kernel only loads and
                // stores fragments inside its workgroup arrays and bound buffers. Its answers
                // are exact only while the driver's products stay within the bound the host
                // assumes (`bounds::CoopF16`), and while a subgroup barrier orders each
                // subgroup's own workgroup-memory hand-off (as on NVIDIA; Vulkan's model does
                // not promise it). The GPU suite checks both against an f64 reference with the
                // filter forced on every batch.
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            };
            pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
                label: Some("hive-gpu"),
                required_features: features,
                required_limits: limits.clone(),
                experimental_features: experimental,
                ..Default::default()
            }))
        };
        // The filter and subgroups only speed searches up: an adapter that refuses them still
        // serves, with what it grants.
        let mut wishes = Vec::new();
        if coop {
            wishes.push(filter::features());
        }
        if subgroups {
            wishes.push(wgpu::Features::SUBGROUP);
        }
        let granted = wishes.into_iter().find_map(|features| request(features).ok().map(|d| (d, features)));
        let (device, queue, features) = match granted {
            Some(((device, queue), features)) => (device, queue, features),
            None => {
                let (device, queue) = request(wgpu::Features::empty())
                    .map_err(|e| unavailable(format!("the adapter refused a device: {e}")))?;
                (device, queue, wgpu::Features::empty())
            }
        };
        let subgroups = subgroups && features.contains(wgpu::Features::SUBGROUP);
        let filter = features
            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
            .then(|| filter::FilterKernels::new(&device));
        let uncaptured = Arc::new(Mutex::new(None));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut slot) = sink.lock() {
                slot.get_or_insert_with(|| e.to_string());
            }
        }));
        let kernels = Self::kernels(&device, subgroups);
        // f32 and f16 rows' pipelines are made with the device, the other types' on first use.
        let wide = kernels.row_pipelines(&device, StoragePrecision::F32).scan_select_wide.is_some();
        kernels.row_pipelines(&device, StoragePrecision::F16);
        let mut note = String::from(
            "f16 and bf16 rows are unpacked in the shaders, so they need no SHADER_F16; i8 and u8 rows are read as packed words",
        );
        if wide {
            note.push_str("; single queries scan 8 lanes per row (subgroups)");
        }
        if filter.is_some() {
            note.push_str(
                "; batches filter on cooperative matrices (f16 tensor cores), then re-rank exactly",
            );
        }
        let info = adapter_info(adapter, ordinal, Some(&note));
        Ok(WgpuDevice { device, queue, info, limits, kernels, filter, uncaptured, staging: Mutex::new(None) })
    }

    fn kernels(device: &wgpu::Device, subgroups: bool) -> Kernels {
        let search_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("search"),
            entries: &[
                layout_entry(0, params_binding()),
                layout_entry(1, storage(true)),
                layout_entry(2, storage(true)),
                layout_entry(3, storage(true)),
                layout_entry(4, storage(true)),
                layout_entry(5, storage(false)),
            ],
        });
        let select_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("select"),
            entries: &[
                layout_entry(0, params_binding()),
                layout_entry(1, storage(true)),
                layout_entry(2, storage(false)),
                layout_entry(3, storage(false)),
                layout_entry(4, storage(false)),
                layout_entry(5, storage(true)),
            ],
        });
        let pipeline = |layout: &wgpu::BindGroupLayout, source: &str, entry: &str| {
            compute_pipeline(device, layout, source, entry)
        };
        let select = &Modules::new().select;
        Kernels {
            rows: Default::default(),
            subgroups,
            merge_lists: pipeline(&select_layout, select, "merge_lists"),
            radix_hist: pipeline(&select_layout, select, "radix_hist"),
            radix_pick: pipeline(&select_layout, select, "radix_pick"),
            collect: pipeline(&select_layout, select, "collect"),
            thresholds: pipeline(&select_layout, select, "thresholds"),
            select_lists: pipeline(&select_layout, select, "select_lists"),
            search_layout,
            select_layout,
        }
    }
}

/// Bytes moved per trip through the staging buffer.
const STAGING_BYTES: usize = 8 << 20;

impl WgpuDevice {
    /// The pipelines that read rows stored as `precision`.
    pub(super) fn row_pipelines(&self, precision: StoragePrecision) -> &RowPipelines {
        self.kernels.row_pipelines(&self.device, precision)
    }

    /// Copies `bytes` (a multiple of 4) to `dst` at `offset` through the reusable staging
    /// buffer: map, fill, copy on the device, wait (so the next trip may map it again).
    fn write(&self, dst: &wgpu::Buffer, offset: u64, bytes: &[u8]) -> Result<()> {
        let mut slot =
            self.staging.lock().map_err(|_| HiveGpuError::Internal("staging lock poisoned".into()))?;
        if slot.is_none() {
            *slot = Some(self.create_buffer(
                "staging",
                STAGING_BYTES as u64,
                wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            )?);
        }
        let Some(staging) = slot.as_ref() else {
            return Err(HiveGpuError::Internal("staging buffer missing".into()));
        };
        for (i, piece) in bytes.chunks(STAGING_BYTES).enumerate() {
            let len = piece.len() as u64;
            let slice = staging.slice(0..len);
            slice.map_async(wgpu::MapMode::Write, |_| {});
            let filled =
                self.device
                    .poll(wgpu::PollType::Wait { submission_index: None, timeout: None })
                    .map_err(|e| HiveGpuError::VulkanError(format!("mapping the staging buffer: {e}")))
                    .and_then(|_| {
                        slice.get_mapped_range_mut().map(|mut view| view.copy_from_slice(piece)).map_err(
                            |e| HiveGpuError::VulkanError(format!("mapping the staging buffer: {e}")),
                        )
                    });
            // Unmapped on every path, so a failed trip leaves the buffer usable.
            staging.unmap();
            filled?;
            let mut encoder =
                self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("upload") });
            encoder.copy_buffer_to_buffer(staging, 0, dst, offset + (i * STAGING_BYTES) as u64, len);
            self.queue.submit([encoder.finish()]);
        }
        Ok(())
    }

    /// A buffer, or `VramLimitExceeded` when the device cannot hold it (out of memory or over
    /// its buffer limits), never an invalid buffer.
    fn create_buffer(&self, label: &str, size: u64, usage: wgpu::BufferUsages) -> Result<wgpu::Buffer> {
        let size = size.max(16).div_ceil(4) * 4;
        let too_big = HiveGpuError::VramLimitExceeded {
            backend: GpuBackendType::Vulkan,
            requested: size,
            available: 0,
        };
        if size > self.limits.max_buffer_size {
            return Err(too_big);
        }
        let out_of_memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let invalid = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: false,
        });
        let validation = pollster::block_on(invalid.pop());
        let memory = pollster::block_on(out_of_memory.pop());
        if memory.is_some() {
            return Err(too_big);
        }
        if let Some(error) = validation {
            return Err(HiveGpuError::VulkanError(format!(
                "creating buffer {label} of {size} bytes: {error}"
            )));
        }
        Ok(buffer)
    }

    /// The first error wgpu reported outside a scope since the last call, as a `VulkanError`.
    fn take_error(&self, call: &str) -> Result<()> {
        let error = self.uncaptured.lock().ok().and_then(|mut slot| slot.take());
        match error {
            Some(message) => Err(HiveGpuError::VulkanError(format!("{call}: {message}"))),
            None => Ok(()),
        }
    }
}

impl GpuBackend for WgpuBackend {
    fn backend_type(&self) -> GpuBackendType {
        GpuBackendType::Vulkan
    }

    fn device_info(&self) -> GpuDeviceInfo {
        self.device.info.clone()
    }

    fn new_rows(
        &self,
        dim: usize,
        precision: StoragePrecision,
        _search: SearchPrecision,
        tuning: &crate::tuning::Tuning,
    ) -> Result<Box<dyn RowStore>> {
        crate::backend::check_new_rows(dim)?;
        Ok(Box::new(rows::WgpuRows::new(self.device.clone(), dim, precision, tuning.clone())?))
    }
}
