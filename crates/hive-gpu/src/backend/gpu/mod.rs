//! One GPU engine for CUDA and (later) ROCm: device storage, kernel launches, tiling and
//! selection written once over the [`driver::Driver`] trait. The vendor code is the driver
//! implementation and little else.

pub(crate) mod bounds;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod driver;
mod kernels;
mod memory;
mod rows;
mod search;

use std::sync::Arc;

use self::driver::Driver;
use self::kernels::Kernels;
use crate::backend::{GpuBackend, RowStore};
use crate::error::Result;
use crate::types::{GpuBackendType, GpuDeviceInfo, SearchPrecision, StoragePrecision};

/// A device with its compiled kernels: what every collection on it shares.
#[derive(Debug)]
pub(crate) struct Device<D: Driver> {
    pub(crate) driver: Arc<D>,
    pub(crate) kernels: Kernels<D>,
    pub(crate) backend: GpuBackendType,
}

/// A [`GpuBackend`] over any [`Driver`].
#[derive(Debug)]
pub(crate) struct GpuEngine<D: Driver> {
    device: Arc<Device<D>>,
}

impl<D: Driver> GpuEngine<D> {
    /// Compiles the kernels for the driver's device (once per process and device: callers
    /// cache the engine).
    pub(crate) fn new(driver: Arc<D>, backend: GpuBackendType, prelude: &str) -> Result<Self> {
        let kernels = Kernels::compile(&*driver, prelude)?;
        Ok(Self { device: Arc::new(Device { driver, kernels, backend }) })
    }
}

impl<D: Driver> GpuBackend for GpuEngine<D> {
    fn backend_type(&self) -> GpuBackendType {
        self.device.backend
    }

    fn device_info(&self) -> GpuDeviceInfo {
        self.device.driver.device_info()
    }

    fn new_rows(
        &self,
        dim: usize,
        precision: StoragePrecision,
        search: SearchPrecision,
    ) -> Result<Box<dyn RowStore>> {
        crate::backend::check_new_rows(dim)?;
        Ok(Box::new(rows::GpuRows::new(self.device.clone(), dim, precision, search)?))
    }
}

#[cfg(feature = "cuda")]
pub(crate) mod cuda_backend {
    //! Opening CUDA devices: one engine per device for the whole process.
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use super::GpuEngine;
    use super::cuda::{CudaDriver, PRELUDE};
    use crate::backend::GpuBackend;
    use crate::error::Result;
    use crate::types::GpuBackendType;

    type Engines = Mutex<HashMap<usize, Arc<GpuEngine<CudaDriver>>>>;
    static ENGINES: std::sync::OnceLock<Engines> = std::sync::OnceLock::new();

    /// The engine of CUDA device `ordinal`, compiled on first use.
    pub(crate) fn open(ordinal: usize) -> Result<Arc<dyn GpuBackend>> {
        let engines = ENGINES.get_or_init(|| Mutex::new(HashMap::new()));
        // A panic while a previous open held the lock leaves the map itself intact.
        let mut engines = engines.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(engine) = engines.get(&ordinal) {
            return Ok(engine.clone());
        }
        let driver = CudaDriver::open(ordinal)?;
        let engine = Arc::new(GpuEngine::new(driver, GpuBackendType::Cuda, PRELUDE)?);
        engines.insert(ordinal, engine.clone());
        Ok(engine)
    }
}
