//! Naming devices: every device of a backend with its details ([`list_devices`]), one device by
//! ordinal or PCI bus id ([`DeviceSelector`]), and lists of devices as `HIVE_GPU_DEVICES`
//! writes them ([`parse_device_list`]), for the contexts of a multi-device storage.

use std::fmt;
use std::str::FromStr;

use crate::error::{HiveGpuError, Result};
use crate::types::{GpuBackendType, GpuDeviceInfo};

/// The environment variable that names the devices a process uses: a comma list of
/// `[backend:]device` entries, each device an ordinal (`0`), a PCI bus id (`0000:3b:00.0` or
/// `3b:00.0`) or `all` (every device of the backend); a backend left out is the one
/// [`crate::select_best_backend`] picks. `cuda:0,cuda:1`, `1`, `vulkan:all`. A device named
/// twice is used twice (two logical shards on it, say).
/// [`crate::GpuContext::new`] opens the first device it names,
/// [`crate::GpuContext::all_devices`] every one.
pub const DEVICES_VARIABLE: &str = "HIVE_GPU_DEVICES";

/// One device of a backend: by its ordinal among the backend's devices, or by its PCI bus id,
/// which stays the same when devices are renumbered (another process's `CUDA_VISIBLE_DEVICES`,
/// a card added).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceSelector {
    /// The `n`-th device of the backend, from 0.
    Ordinal(usize),
    /// The device at this PCI bus id, normalised to `dddd:bb:dd.f` in lower case.
    PciBusId(String),
}

impl DeviceSelector {
    /// A PCI bus id selector: `dddd:bb:dd.f` or `bb:dd.f` (domain 0), hexadecimal in either
    /// case.
    pub fn pci(id: &str) -> Result<Self> {
        normalise_pci(id).map(DeviceSelector::PciBusId).ok_or_else(|| {
            HiveGpuError::InvalidArgument(format!(
                "{id:?} is no PCI bus id (expected dddd:bb:dd.f or bb:dd.f, hexadecimal)"
            ))
        })
    }
}

impl fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSelector::Ordinal(n) => write!(f, "{n}"),
            DeviceSelector::PciBusId(id) => f.write_str(id),
        }
    }
}

impl FromStr for DeviceSelector {
    type Err = HiveGpuError;
    /// An ordinal (`2`) or a PCI bus id (`0000:3b:00.0`, `3b:00.0`).
    fn from_str(text: &str) -> Result<Self> {
        let text = text.trim();
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            return text.parse().map(DeviceSelector::Ordinal).map_err(|_| {
                HiveGpuError::InvalidArgument(format!("device ordinal {text} is out of range"))
            });
        }
        DeviceSelector::pci(text).map_err(|_| {
            HiveGpuError::InvalidArgument(format!(
                "{text:?} names no device: expected an ordinal (0, 1, ...) or a PCI bus id (dddd:bb:dd.f)"
            ))
        })
    }
}

/// `dddd:bb:dd.f` in lower case, from that or `bb:dd.f`; None for anything else.
fn normalise_pci(id: &str) -> Option<String> {
    let id = id.trim().to_ascii_lowercase();
    let parts: Vec<&str> = id.split(':').collect();
    let (domain, bus, rest) = match parts.as_slice() {
        [bus, rest] => ("0000", *bus, *rest),
        [domain, bus, rest] => (*domain, *bus, *rest),
        _ => return None,
    };
    let (device, function) = rest.split_once('.')?;
    let hex =
        |s: &str, max: usize| !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !(hex(domain, 8) && hex(bus, 2) && hex(device, 2) && hex(function, 1)) {
        return None;
    }
    let value = |s: &str| u32::from_str_radix(s, 16).ok();
    Some(format!("{:04x}:{:02x}:{:02x}.{:x}", value(domain)?, value(bus)?, value(device)?, value(function)?))
}

/// Every device of `backend` with its details, in ordinal order (as
/// [`crate::detect_available_backends`] lists them); an unavailable backend is an error saying
/// why.
pub fn list_devices(backend: GpuBackendType) -> Result<Vec<GpuDeviceInfo>> {
    let status = crate::backend::probe(backend);
    if !status.available {
        return Err(HiveGpuError::BackendUnavailable { backend, reason: status.reason });
    }
    Ok(status.devices)
}

/// The ordinal of the device `selector` names on `backend`.
pub(crate) fn resolve(backend: GpuBackendType, selector: &DeviceSelector) -> Result<usize> {
    let wanted = match selector {
        DeviceSelector::Ordinal(n) => return Ok(*n),
        DeviceSelector::PciBusId(id) => id,
    };
    let devices = list_devices(backend)?;
    let found = devices
        .iter()
        .position(|d| d.pci_bus_id.as_deref().and_then(normalise_pci).as_deref() == Some(wanted.as_str()));
    found.ok_or_else(|| {
        let known: Vec<String> = devices
            .iter()
            .enumerate()
            .map(|(i, d)| format!("{i}: {}", d.pci_bus_id.as_deref().unwrap_or("no PCI bus id")))
            .collect();
        HiveGpuError::InvalidArgument(format!(
            "no {backend} device is at PCI bus id {wanted} (its devices: {})",
            if known.is_empty() { "none".to_string() } else { known.join(", ") }
        ))
    })
}

/// A device list as [`DEVICES_VARIABLE`] writes it, every entry resolved to a backend and an
/// ordinal (`all` expanded, PCI bus ids looked up); `default_backend` is asked for the backend
/// of entries that name none, once, and only if one does.
pub fn parse_device_list(
    text: &str,
    default_backend: impl FnOnce() -> Result<GpuBackendType>,
) -> Result<Vec<(GpuBackendType, usize)>> {
    let mut default_backend = Some(default_backend);
    let mut chosen: Option<GpuBackendType> = None;
    let mut out = Vec::new();
    for entry in text.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err(HiveGpuError::InvalidArgument(format!(
                "the device list {text:?} has an empty entry"
            )));
        }
        let named = entry
            .split_once(':')
            .and_then(|(head, tail)| head.parse::<GpuBackendType>().ok().map(|backend| (backend, tail)));
        let (backend, device) = match named {
            Some(named) => named,
            None => {
                if chosen.is_none() {
                    let pick = default_backend.take().map_or_else(
                        || Err(HiveGpuError::Internal("no default backend".into())),
                        |pick| pick(),
                    )?;
                    chosen = Some(pick);
                }
                (chosen.unwrap_or(GpuBackendType::Cpu), entry)
            }
        };
        if device.trim().eq_ignore_ascii_case("all") {
            let count = list_devices(backend)?.len();
            out.extend((0..count).map(|ordinal| (backend, ordinal)));
            continue;
        }
        let selector: DeviceSelector = device.parse().map_err(|e| match e {
            HiveGpuError::InvalidArgument(why) => {
                HiveGpuError::InvalidArgument(format!("device list entry {entry:?}: {why}"))
            }
            other => other,
        })?;
        out.push((backend, resolve(backend, &selector)?));
    }
    Ok(out)
}

/// [`DEVICES_VARIABLE`]'s value, when it is set to something.
pub(crate) fn from_environment() -> Option<String> {
    std::env::var(DEVICES_VARIABLE).ok().filter(|v| !v.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_bus_ids_are_normalised_and_anything_else_is_refused() {
        for (given, want) in [
            ("0000:3B:00.0", "0000:3b:00.0"),
            ("3b:00.0", "0000:3b:00.0"),
            ("1:2:3.4", "0001:02:03.4"),
            ("0001:c1:00.1", "0001:c1:00.1"),
        ] {
            assert_eq!(DeviceSelector::pci(given).expect(given), DeviceSelector::PciBusId(want.into()));
        }
        for bad in ["", "3b", "3b:00", "zz:00.0", "0000:3b:00.0.1", "0000:3b:000.0", "3b:00.12", "a:b:c:d.0"]
        {
            assert!(DeviceSelector::pci(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!("7".parse::<DeviceSelector>().expect("7"), DeviceSelector::Ordinal(7));
        assert!("99999999999999999999999".parse::<DeviceSelector>().is_err());
        assert!("gpu0".parse::<DeviceSelector>().is_err());
    }

    #[test]
    fn a_device_list_names_backends_or_takes_the_default_once() {
        let cpu = || Ok(GpuBackendType::Cpu);
        assert_eq!(parse_device_list("cpu:0", cpu).expect("cpu:0"), [(GpuBackendType::Cpu, 0)]);
        assert_eq!(
            parse_device_list("0, 0", cpu).expect("0,0"),
            [(GpuBackendType::Cpu, 0), (GpuBackendType::Cpu, 0)]
        );
        assert_eq!(parse_device_list("cpu:all", cpu).expect("all"), [(GpuBackendType::Cpu, 0)]);
        // An entry that names its backend never asks for the default.
        let never = || -> Result<GpuBackendType> { panic!("asked for the default backend") };
        assert_eq!(parse_device_list("cpu:0", never).expect("named"), [(GpuBackendType::Cpu, 0)]);
        for bad in ["", "cpu:0,", "cpu:x", "cpu:1:2"] {
            assert!(parse_device_list(bad, cpu).is_err(), "{bad:?} accepted");
        }
        // The CPU has no PCI bus id: looking one up says which devices there are.
        let e = parse_device_list("cpu:0000:3b:00.0", cpu).expect_err("no such device");
        assert!(e.to_string().contains("PCI bus id 0000:3b:00.0"), "{e}");
    }
}
