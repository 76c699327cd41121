//! `hive-gpu info`: every backend, whether it can run here and why, and its devices.

use hive_gpu::{GpuDeviceInfo, HiveGpuError, detect_available_backends, select_best_backend};

const GIB: f64 = (1u64 << 30) as f64;

pub fn run() -> Result<(), HiveGpuError> {
    let statuses = detect_available_backends();
    out!("{:<8} {:<10} detail", "backend", "available");
    for s in &statuses {
        out!("{:<8} {:<10} {}", s.backend.name(), if s.available { "yes" } else { "no" }, s.reason);
    }
    match select_best_backend() {
        Ok(best) => out!("\nselected by default: {} (HIVE_GPU_BACKEND overrides)", best.name()),
        Err(err) => out!("\nno default backend: {err}"),
    }
    for device in statuses.iter().flat_map(|s| &s.devices) {
        out!();
        print_device(device)?;
    }
    Ok(())
}

fn print_device(d: &GpuDeviceInfo) -> Result<(), HiveGpuError> {
    let rows: Vec<(&str, String)> = vec![
        ("device", format!("{} #{} ({})", d.backend, d.device_id, d.name)),
        ("compute capability / SIMD", d.compute_capability.clone()),
        ("compute units", d.compute_units.to_string()),
        (
            "memory total",
            if d.total_vram_bytes == 0 {
                "unknown (the platform does not report it)".into()
            } else {
                format!("{:.1} GiB", d.total_vram_bytes as f64 / GIB)
            },
        ),
        (
            "memory available",
            if d.total_vram_bytes == 0 {
                "unknown".into()
            } else {
                format!(
                    "{:.1} GiB ({:.1}% in use)",
                    d.available_vram_bytes as f64 / GIB,
                    d.vram_usage_percent()
                )
            },
        ),
        ("driver", d.driver_version.clone().unwrap_or_else(|| "unknown".into())),
        ("max threads per block", d.max_threads_per_block.to_string()),
        ("shared memory per block", format!("{} KiB", d.max_shared_memory_per_block / 1024)),
        ("PCI bus id", d.pci_bus_id.clone().unwrap_or_else(|| "none (not a PCI device)".into())),
        (
            "L2 cache",
            d.l2_cache_bytes
                .map_or_else(|| "unknown".into(), |b| format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))),
        ),
        ("warp / wavefront size", d.warp_size.to_string()),
    ];
    for (key, value) in rows {
        out!("  {key:<26} {value}");
    }
    Ok(())
}
