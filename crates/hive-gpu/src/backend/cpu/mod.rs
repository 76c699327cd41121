//! The SIMD CPU backend: always available, exact, multi-threaded with rayon.

mod bf16;
mod few;
mod filter;
mod int8;
mod packed;
pub(crate) mod rows;
pub mod simd;
pub(crate) mod topk;

use crate::backend::{GpuBackend, RowStore};
use crate::error::Result;
use crate::types::{GpuBackendType, GpuDeviceInfo, SearchPrecision, StoragePrecision};

pub use simd::SimdLevel;

/// The CPU as a backend. Threads come from rayon's global pool (`RAYON_NUM_THREADS`).
#[derive(Debug, Clone)]
pub struct CpuBackend {
    simd: SimdLevel,
}

impl CpuBackend {
    /// The CPU backend with the widest SIMD level this machine supports.
    pub fn new() -> Self {
        Self { simd: SimdLevel::detect() }
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl GpuBackend for CpuBackend {
    fn backend_type(&self) -> GpuBackendType {
        GpuBackendType::Cpu
    }

    fn device_info(&self) -> GpuDeviceInfo {
        // A container's memory is its cgroup's limit, not the host's.
        let total = crate::memory::total_bytes().unwrap_or(0);
        let available = crate::memory::available_bytes().unwrap_or(0).min(total);
        GpuDeviceInfo {
            name: cpu_model().unwrap_or_else(|| std::env::consts::ARCH.to_string()),
            backend: GpuBackendType::Cpu,
            device_id: 0,
            total_vram_bytes: total,
            available_vram_bytes: available,
            used_vram_bytes: total.saturating_sub(available),
            driver_version: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .ok()
                .map(|s| format!("Linux {}", s.trim())),
            compute_capability: self.simd.name().to_string(),
            max_threads_per_block: 1,
            max_shared_memory_per_block: l2_cache_bytes().unwrap_or(0),
            // The machine's logical cores; the threads a search uses are rayon's
            // (`RAYON_NUM_THREADS`), which the CLI reports separately.
            compute_units: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            pci_bus_id: None,
            l2_cache_bytes: l2_cache_bytes(),
            warp_size: 1,
            software: false,
        }
    }

    fn new_rows(
        &self,
        dim: usize,
        precision: StoragePrecision,
        _search: SearchPrecision,
        tuning: &crate::tuning::Tuning,
    ) -> Result<Box<dyn RowStore>> {
        crate::backend::check_new_rows(dim)?;
        Ok(Box::new(
            rows::CpuRows::new(dim, precision, self.simd)
                .with_bf16_min_rows(tuning.cpu_bf16_min_rows)
                .with_here_products(tuning.cpu_here_products)
                .with_packed_lists(tuning.cpu_packed_lists),
        ))
    }
}

fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name") || l.starts_with("Model"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

fn l2_cache_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index2/size").ok()?;
    let text = text.trim();
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let value: u64 = number.parse().ok()?;
    Some(match unit {
        "K" => value * 1024,
        "M" => value * 1024 * 1024,
        _ => value,
    })
}
