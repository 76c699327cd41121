//! One GPU engine for CUDA and ROCm: device storage, kernel launches, tiling and selection
//! written once over the [`driver::Driver`] trait. The vendor code is the driver
//! implementation and little else.

mod abi;
mod codes;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod driver;
#[cfg(feature = "rocm")]
pub(crate) mod hip;
mod kernels;
mod lists;
mod memory;
mod merge;
mod nearest;
mod prepare;
mod primitives;
mod residence;
mod rows;
pub(crate) mod search;
mod streamed;

use std::sync::Arc;

use std::collections::HashMap;
use std::sync::Mutex;

use self::abi::{GemmTnParams, Launch, Tiles};
use self::driver::{Driver, GemmInputs, GemmTn};
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
    /// Idle streams and memory of device merges (`merge.rs`), reused by the next.
    pub(crate) merges: Mutex<Vec<merge::MergeScratch<D>>>,
}

/// The grid of `kernels/gemm.cu`'s tiles over `g`: a block of `kernels::BLOCK` threads per 64
/// rows x 64 queries (`HG_GEMM_TILE`), for the own GEMM and `hg_tiles` alike.
fn pair_tile_launch(g: &GemmTn) -> Launch {
    const TILE: usize = 64;
    Launch::new((g.m.div_ceil(TILE) as u32, g.n.div_ceil(TILE) as u32), kernels::BLOCK)
}

impl<D: Driver> Device<D> {
    /// Queues `C = A^T B` (see [`GemmTn`]) on the BLAS library or on the engine's own kernel:
    /// where the BLAS cannot run it, or always with `own_gemm` (to test on CUDA the path ROCm
    /// takes without rocBLAS).
    pub(crate) fn gemm(&self, stream: &D::Stream, g: &GemmTn, own_gemm: bool) -> Result<()> {
        if !own_gemm && self.driver.has_gemm(g.inputs) {
            return self.driver.gemm_tn(stream, g);
        }
        let kernel = match g.inputs {
            GemmInputs::F32 | GemmInputs::Tf32 => self.kernels.gemm_tn_f32,
            GemmInputs::F16 => self.kernels.gemm_tn_f16,
        };
        self.launch(
            stream,
            kernel,
            pair_tile_launch(g),
            &GemmTnParams {
                a: g.a,
                lda: g.lda as u32,
                b: g.b,
                ldb: g.ldb as u32,
                c: g.c,
                ldc: g.ldc as u32,
                m: g.m as u32,
                n: g.n as u32,
                k: g.k as u32,
            },
        )
    }

    /// Queues the engine's own tiles of `g` (`g.a` the stored rows, of `precision`; `g.b` f32
    /// queries), laid out as [`Device::gemm`]'s products: L1 or L-infinity distances under
    /// those metrics, else dot products. The tile path's input where no BLAS computes it.
    pub(crate) fn tiles(
        &self,
        stream: &D::Stream,
        g: &GemmTn,
        metric: crate::types::GpuDistanceMetric,
        precision: crate::types::StoragePrecision,
    ) -> Result<()> {
        self.launch(
            stream,
            self.kernels.tiles().get(precision),
            pair_tile_launch(g),
            &Tiles {
                a: g.a,
                lda: g.lda as u32,
                b: g.b,
                ldb: g.ldb as u32,
                c: g.c,
                ldc: g.ldc as u32,
                m: g.m as u32,
                n: g.n as u32,
                k: g.k as u32,
                metric: crate::exact::metric_code(metric),
            },
        )
    }
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
        Ok(Self { device: Arc::new(Device { driver, kernels, backend, merges: Mutex::new(Vec::new()) }) })
    }
}

impl<D: Driver> GpuBackend for GpuEngine<D> {
    fn backend_type(&self) -> GpuBackendType {
        self.device.backend
    }

    fn device_info(&self) -> GpuDeviceInfo {
        let mut info = self.device.driver.device_info();
        // Free memory changes: read now, for every driver alike.
        if let Ok((free, total)) = self.device.driver.mem_info() {
            info.total_vram_bytes = total as u64;
            info.available_vram_bytes = free as u64;
            info.used_vram_bytes = total.saturating_sub(free) as u64;
        }
        info
    }

    fn new_rows(
        &self,
        dim: usize,
        precision: StoragePrecision,
        search: SearchPrecision,
        tuning: &crate::tuning::Tuning,
    ) -> Result<Box<dyn RowStore>> {
        crate::backend::check_new_rows(dim)?;
        let rows = rows::GpuRows::new(self.device.clone(), dim, precision, search, tuning.clone())?;
        Ok(Box::new(residence::EngineRows::Device(rows)))
    }
}

/// The engine of device `ordinal` of `backend`, opened by `open` on first use and then shared
/// by every context for the whole process: kernels compile once per device.
pub(crate) fn engine(
    backend: GpuBackendType,
    ordinal: usize,
    open: impl FnOnce() -> Result<Arc<dyn GpuBackend>>,
) -> Result<Arc<dyn GpuBackend>> {
    type Engines = Mutex<HashMap<(GpuBackendType, usize), Arc<dyn GpuBackend>>>;
    static ENGINES: std::sync::OnceLock<Engines> = std::sync::OnceLock::new();
    // A panic while a previous open held the lock leaves the map itself intact.
    let mut engines =
        ENGINES.get_or_init(Default::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(engine) = engines.get(&(backend, ordinal)) {
        return Ok(engine.clone());
    }
    let engine = open()?;
    engines.insert((backend, ordinal), engine.clone());
    Ok(engine)
}

/// The engine of CUDA device `ordinal`.
#[cfg(feature = "cuda")]
pub(crate) fn open_cuda(ordinal: usize) -> Result<Arc<dyn GpuBackend>> {
    engine(GpuBackendType::Cuda, ordinal, || {
        let driver = cuda::CudaDriver::open(ordinal)?;
        Ok(Arc::new(GpuEngine::new(driver, GpuBackendType::Cuda, cuda::PRELUDE)?))
    })
}

/// The engine of AMD GPU `ordinal`.
#[cfg(feature = "rocm")]
pub(crate) fn open_rocm(ordinal: usize) -> Result<Arc<dyn GpuBackend>> {
    engine(GpuBackendType::Rocm, ordinal, || {
        let driver = hip::HipDriver::open(ordinal)?;
        Ok(Arc::new(GpuEngine::new(driver, GpuBackendType::Rocm, hip::PRELUDE)?))
    })
}
