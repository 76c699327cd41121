//! [`Driver`] over CUDA through cudarc: the driver API, NVRTC and cuBLAS, all loaded at run
//! time, so building needs no CUDA toolkit and a machine without CUDA gets a reason, not a panic.

use std::ffi::{CString, c_void};
use std::sync::Arc;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{result as cu, sys as cu_sys};
use cudarc::nvrtc::{result as rtc, sys as rtc_sys};

use super::driver::{Arg, DevicePtr, Driver, GemmInputs, GemmTn};
use crate::error::{HiveGpuError, Result};
use crate::types::{GpuBackendType, GpuDeviceInfo};

/// Kernel sources get this prelude on CUDA.
pub(super) const PRELUDE: &str = "#define HG_SHFL_XOR(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))\n#define HG_SHFL(v, l) __shfl_sync(0xffffffffu, (v), (l))\n";

fn driver_error(call: &str, e: cu::DriverError) -> HiveGpuError {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    HiveGpuError::CudaError { call: call.to_string(), message: format!("{name}: {text}") }
}

fn blas_error(call: &str, e: blas::CublasError) -> HiveGpuError {
    HiveGpuError::CublasError { call: call.to_string(), message: format!("{:?}", e.0) }
}

/// Runs a probe that may reach a missing shared library or symbol: cudarc panics there, we
/// turn it into a reason. (The process's panic hook is left alone: swapping it is racy across
/// threads, so such a rare broken install may also print cudarc's message.)
fn guarded<T>(
    what: &str,
    f: impl FnOnce() -> std::result::Result<T, String>,
) -> std::result::Result<T, String> {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    match outcome {
        Ok(result) => result,
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown failure".into());
            Err(format!("{what}: {message}"))
        }
    }
}

/// Whether the CUDA libraries load, and if not, precisely which one is missing.
pub(crate) fn libraries_present() -> std::result::Result<(), String> {
    // SAFETY: probing only dlopens the candidate library names.
    if !unsafe { cu_sys::is_culib_present() } {
        return Err("no NVIDIA driver: libcuda.so could not be loaded".into());
    }
    // SAFETY: as above.
    if !unsafe { rtc_sys::is_culib_present() } {
        return Err("driver found, but NVRTC is missing: libnvrtc.so could not be loaded \
                    (install the CUDA toolkit or `pip install nvidia-cuda-nvrtc-cu12` and add its lib to LD_LIBRARY_PATH)"
            .into());
    }
    // SAFETY: as above.
    if !unsafe { blas_sys::is_culib_present() } {
        return Err("driver and NVRTC found, but cuBLAS is missing: libcublas.so could not be loaded".into());
    }
    Ok(())
}

/// NVRTC's version as "major.minor".
pub(crate) fn nvrtc_version() -> std::result::Result<String, String> {
    // SAFETY: probing only dlopens the candidate library names.
    if !unsafe { rtc_sys::is_culib_present() } {
        return Err("libnvrtc.so could not be loaded".into());
    }
    guarded("NVRTC", || {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        let status = unsafe { rtc_sys::nvrtcVersion(&mut major, &mut minor) };
        if status != rtc_sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(format!("nvrtcVersion failed: {status:?}"));
        }
        Ok(format!("{major}.{minor}"))
    })
}

/// Compiles `source` with NVRTC for `arch` ("compute_90" gives PTX, "sm_90" a cubin) and
/// returns the image. Needs only libnvrtc: CI uses it to check every kernel compiles.
pub(crate) fn nvrtc_compile(source: &str, arch: &str) -> Result<Vec<u8>> {
    let src =
        CString::new(source).map_err(|_| HiveGpuError::Internal("kernel source contains NUL".into()))?;
    let nvrtc_err = |call: &str, e: rtc::NvrtcError| HiveGpuError::CudaError {
        call: call.to_string(),
        message: format!("{:?}", e.0),
    };
    let prog = rtc::create_program(&src, None).map_err(|e| nvrtc_err("nvrtcCreateProgram", e))?;
    // Subnormal results kept (NVRTC's default, stated): `nearest.rs`'s proof counts on it.
    let options =
        vec![format!("--gpu-architecture={arch}"), "--std=c++14".to_string(), "--ftz=false".to_string()];
    // SAFETY: `prog` was created above and is destroyed below, once.
    let compiled = unsafe { rtc::compile_program(prog, &options) };
    let outcome = if let Err(e) = compiled {
        // SAFETY: valid program.
        let log = unsafe { rtc::get_program_log(prog) }
            .map(|raw| raw.iter().map(|&c| c as u8 as char).collect::<String>())
            .unwrap_or_default();
        Err(HiveGpuError::CudaError {
            call: format!("nvrtcCompileProgram({arch})"),
            message: format!("{:?}: {}", e.0, log.trim_end_matches('\0')),
        })
    } else if arch.starts_with("sm_") {
        let mut size = 0usize;
        // SAFETY: valid program and out-pointer; the buffer has the size NVRTC reported.
        unsafe {
            rtc_sys::nvrtcGetCUBINSize(prog, &mut size);
            let mut image = vec![0u8; size];
            let status = rtc_sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast());
            if status == rtc_sys::nvrtcResult::NVRTC_SUCCESS {
                Ok(image)
            } else {
                Err(HiveGpuError::CudaError { call: "nvrtcGetCUBIN".into(), message: format!("{status:?}") })
            }
        }
    } else {
        // SAFETY: valid program.
        unsafe { rtc::get_ptx(prog) }
            .map(|ptx| ptx.iter().map(|&c| c as u8).collect())
            .map_err(|e| nvrtc_err("nvrtcGetPTX", e))
    };
    // SAFETY: created above, not used after this.
    let _ = unsafe { rtc::destroy_program(prog) };
    outcome
}

/// One CUDA device with its primary context.
#[derive(Debug)]
pub struct CudaDriver {
    ordinal: usize,
    device: cu_sys::CUdevice,
    context: ContextHandle,
    name: String,
    major: i32,
    minor: i32,
    sms: u32,
    warp: u32,
    max_threads: u32,
    max_shared_optin: usize,
    l2_bytes: u64,
    pci: String,
    driver_version: String,
    nvrtc_version: String,
    total: usize,
    /// [`Driver::peer_access`]'s answer per other device, once asked.
    peers: std::sync::Mutex<std::collections::HashMap<usize, bool>>,
}

#[derive(Debug)]
struct ContextHandle(cu_sys::CUcontext);
// SAFETY: a CUDA context handle may be used from any thread (each binds it before use).
unsafe impl Send for ContextHandle {}
// SAFETY: as above.
unsafe impl Sync for ContextHandle {}

impl CudaDriver {
    /// Opens device `ordinal`, or says why CUDA cannot be used here.
    pub(crate) fn open(ordinal: usize) -> Result<Arc<Self>> {
        let unavailable =
            |reason: String| HiveGpuError::BackendUnavailable { backend: GpuBackendType::Cuda, reason };
        libraries_present().map_err(unavailable)?;
        let count = Self::device_count().map_err(unavailable)?;
        if ordinal >= count {
            return Err(HiveGpuError::DeviceNotFound { backend: GpuBackendType::Cuda, ordinal, count });
        }
        guarded("CUDA", || Self::open_inner(ordinal).map_err(|e| e.to_string()))
            .map(Arc::new)
            .map_err(unavailable)
    }

    /// Number of CUDA devices, or why there are none.
    pub(crate) fn device_count() -> std::result::Result<usize, String> {
        libraries_present()?;
        guarded("CUDA", || {
            cu::init().map_err(|e| driver_error("cuInit", e).to_string())?;
            let n = cu::device::get_count().map_err(|e| driver_error("cuDeviceGetCount", e).to_string())?;
            Ok(n.max(0) as usize)
        })
    }

    fn open_inner(ordinal: usize) -> Result<Self> {
        use cu_sys::CUdevice_attribute as A;
        cu::init().map_err(|e| driver_error("cuInit", e))?;
        let device = cu::device::get(ordinal as i32).map_err(|e| driver_error("cuDeviceGet", e))?;
        let name = cu::device::get_name(device).map_err(|e| driver_error("cuDeviceGetName", e))?;
        // SAFETY: valid device.
        let total =
            unsafe { cu::device::total_mem(device) }.map_err(|e| driver_error("cuDeviceTotalMem", e))?;
        // SAFETY: valid device; the context is released in Drop, or below if binding it fails.
        let context = unsafe { cu::primary_ctx::retain(device) }
            .map_err(|e| driver_error("cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: context retained above.
        if let Err(e) = unsafe { cu::ctx::set_current(context) } {
            // SAFETY: retained above and not used after this.
            let _ = unsafe { cu::primary_ctx::release(device) };
            return Err(driver_error("cuCtxSetCurrent", e));
        }
        // SAFETY: valid device; attributes are plain integers.
        let attr = |a: A| unsafe { cu::device::get_attribute(device, a) }.unwrap_or(0);
        let mut version = 0;
        // SAFETY: valid out-pointer.
        unsafe { cu_sys::cuDriverGetVersion(&mut version) };
        let pci = format!(
            "{:04x}:{:02x}:{:02x}.0",
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)
        );
        Ok(Self {
            ordinal,
            device,
            context: ContextHandle(context),
            name,
            major: attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            minor: attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            sms: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).max(1) as u32,
            warp: attr(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE).max(1) as u32,
            max_threads: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK).max(1) as u32,
            max_shared_optin: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN).max(48 * 1024)
                as usize,
            l2_bytes: attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE).max(0) as u64,
            pci,
            driver_version: format!("{}.{}", version / 1000, (version % 1000) / 10),
            nvrtc_version: nvrtc_version().unwrap_or_else(|e| format!("unknown: {e}")),
            total,
            peers: Default::default(),
        })
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for the driver's lifetime.
        unsafe { cu::ctx::set_current(self.context.0) }.map_err(|e| driver_error("cuCtxSetCurrent", e))
    }

    /// The "sm_XY" target of this device.
    fn arch(&self) -> String {
        format!("sm_{}{}", self.major, self.minor)
    }
}

/// Whether `from`'s context can read and write `to`'s memory directly, enabling it: the
/// runtime reports the pair, and the context of `from` is given access to `to`'s.
fn can_access_peer(from: &CudaDriver, to: &CudaDriver) -> bool {
    let mut can = 0;
    // SAFETY: valid devices; the call only writes `can`.
    let status = unsafe { cu_sys::cuDeviceCanAccessPeer(&mut can, from.device, to.device) };
    if status != cu_sys::CUresult::CUDA_SUCCESS || can == 0 || from.bind().is_err() {
        return false;
    }
    // SAFETY: `to`'s context is retained for its driver's lifetime; `from`'s is current.
    let status = unsafe { cu_sys::cuCtxEnablePeerAccess(to.context.0, 0) };
    matches!(
        status,
        cu_sys::CUresult::CUDA_SUCCESS | cu_sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
    )
}

impl Drop for CudaDriver {
    fn drop(&mut self) {
        // SAFETY: retained in `open_inner`, released once here.
        let _ = unsafe { cu::primary_ctx::release(self.device) };
    }
}

/// A CUDA stream, with a cuBLAS handle when it runs GEMMs.
#[derive(Debug)]
pub struct CudaStream {
    stream: cu_sys::CUstream,
    blas: Option<blas_sys::cublasHandle_t>,
}
// SAFETY: streams and cuBLAS handles may move between threads; the engine uses each from one
// thread at a time (workspaces are checked out of a pool).
unsafe impl Send for CudaStream {}

impl Drop for CudaStream {
    fn drop(&mut self) {
        // SAFETY: created in `Driver::stream`, destroyed once here, after its work finished.
        unsafe {
            let _ = cu::stream::synchronize(self.stream);
            if let Some(handle) = self.blas {
                let _ = blas::destroy_handle(handle);
            }
            let _ = cu::stream::destroy(self.stream);
        }
    }
}

/// Page-locked host memory.
#[derive(Debug)]
pub struct CudaPinned {
    ptr: *mut u8,
    len: usize,
}
// SAFETY: plain host memory owned by this value.
unsafe impl Send for CudaPinned {}
// SAFETY: a shared borrow only reads the bytes (`Deref`); writing needs `&mut` (`DerefMut`).
// The buffer is also mapped into the device (`mapped`): a kernel may write it only while its
// owner holds it exclusively and waits for the kernel before reading (as `Staging` does).
unsafe impl Sync for CudaPinned {}

impl std::ops::Deref for CudaPinned {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` bytes allocated by cuMemHostAlloc and owned here.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}
impl std::ops::DerefMut for CudaPinned {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}
impl Drop for CudaPinned {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once.
        let _ = unsafe { cu::free_host(self.ptr.cast()) };
    }
}

/// A CUDA event (timing disabled: it only orders streams).
#[derive(Debug)]
pub struct CudaEvent(cu_sys::CUevent);
// SAFETY: event handles may be used from any thread.
unsafe impl Send for CudaEvent {}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // SAFETY: created in `Driver::event`, destroyed once here.
        let _ = unsafe { cu::event::destroy(self.0) };
    }
}

impl Driver for CudaDriver {
    type Stream = CudaStream;
    type Function = CudaFunction;
    type Pinned = CudaPinned;
    type Event = CudaEvent;

    fn event(&self) -> Result<CudaEvent> {
        self.bind()?;
        cu::event::create(cu_sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map(CudaEvent)
            .map_err(|e| driver_error("cuEventCreate", e))
    }

    fn record(&self, event: &CudaEvent, stream: &CudaStream) -> Result<()> {
        self.bind()?;
        // SAFETY: valid event and stream.
        unsafe { cu::event::record(event.0, stream.stream) }.map_err(|e| driver_error("cuEventRecord", e))
    }

    fn wait(&self, stream: &CudaStream, event: &CudaEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: valid stream and event.
        unsafe {
            cu::stream::wait_event(stream.stream, event.0, cu_sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
        }
        .map_err(|e| driver_error("cuStreamWaitEvent", e))
    }

    fn device_info(&self) -> GpuDeviceInfo {
        GpuDeviceInfo {
            name: self.name.clone(),
            backend: GpuBackendType::Cuda,
            device_id: self.ordinal,
            // Free memory is read by the engine (`mem_info`), which fills the other two.
            total_vram_bytes: self.total as u64,
            available_vram_bytes: 0,
            used_vram_bytes: 0,
            driver_version: Some(format!("CUDA {} (NVRTC {})", self.driver_version, self.nvrtc_version)),
            compute_capability: format!("{}.{}", self.major, self.minor),
            max_threads_per_block: self.max_threads,
            max_shared_memory_per_block: self.max_shared_optin as u64,
            compute_units: self.sms,
            pci_bus_id: Some(self.pci.clone()),
            l2_cache_bytes: Some(self.l2_bytes),
            warp_size: self.warp,
            software: false,
        }
    }

    fn warp_size(&self) -> u32 {
        self.warp
    }

    fn multiprocessors(&self) -> u32 {
        self.sms
    }

    fn tensor_cores(&self) -> bool {
        self.major >= 8
    }

    fn max_shared_bytes(&self) -> usize {
        self.max_shared_optin
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        cu::mem_get_info().map_err(|e| driver_error("cuMemGetInfo", e))
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.bind()?;
        // SAFETY: plain allocation; freed by `free`.
        match unsafe { cu::malloc_sync(bytes.max(1)) } {
            Ok(ptr) => Ok(ptr),
            Err(e) if e.0 == cu_sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(HiveGpuError::VramLimitExceeded {
                    backend: GpuBackendType::Cuda,
                    requested: bytes as u64,
                    available: self.mem_info().map(|(free, _)| free as u64).unwrap_or(0),
                })
            }
            Err(e) => Err(driver_error("cuMemAlloc", e)),
        }
    }

    fn free(&self, ptr: DevicePtr) {
        if self.bind().is_ok() {
            // SAFETY: `ptr` came from `alloc` and is freed once (DeviceBuffer's Drop).
            let _ = unsafe { cu::free_sync(ptr) };
        }
    }

    fn pinned(&self, bytes: usize) -> Result<CudaPinned> {
        self.bind()?;
        // SAFETY: plain page-locked allocation owned by the returned value, mapped into the
        // device's address space (see `mapped`).
        let ptr = unsafe { cu::malloc_host(bytes.max(1), cu_sys::CU_MEMHOSTALLOC_DEVICEMAP) }
            .map_err(|e| driver_error("cuMemHostAlloc", e))?;
        Ok(CudaPinned { ptr: ptr.cast(), len: bytes })
    }

    fn mapped(&self, host: &CudaPinned) -> Option<DevicePtr> {
        self.bind().ok()?;
        let mut device: cu_sys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated by cuMemHostAlloc with CU_MEMHOSTALLOC_DEVICEMAP and is
        // alive; the call only writes `device`.
        let status = unsafe { cu_sys::cuMemHostGetDevicePointer_v2(&mut device, host.ptr.cast(), 0) };
        (status == cu_sys::CUresult::CUDA_SUCCESS && device != 0).then_some(device)
    }

    fn stream(&self, with_blas: bool) -> Result<CudaStream> {
        self.bind()?;
        let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking)
            .map_err(|e| driver_error("cuStreamCreate", e))?;
        let mut created = CudaStream { stream, blas: None };
        if with_blas {
            let handle = blas::create_handle().map_err(|e| blas_error("cublasCreate", e))?;
            created.blas = Some(handle);
            // SAFETY: both handles were just created.
            unsafe { blas::set_stream(handle, stream.cast()) }
                .map_err(|e| blas_error("cublasSetStream", e))?;
        }
        Ok(created)
    }

    fn upload_at(
        &self,
        stream: &CudaStream,
        dst: DevicePtr,
        host: &CudaPinned,
        offset: usize,
        bytes: usize,
    ) -> Result<()> {
        self.bind()?;
        let host = offset.checked_add(bytes).and_then(|end| host.get(offset..end)).ok_or_else(|| {
            HiveGpuError::Internal(format!("an upload of {bytes} bytes at {offset} is past its buffer"))
        })?;
        // SAFETY: `host` is pinned and outlives the copy (callers synchronize before reuse);
        // `dst` holds at least `bytes` (engine invariant).
        unsafe { cu::memcpy_htod_async(dst, host, stream.stream) }
            .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))
    }

    fn download(
        &self,
        stream: &CudaStream,
        host: &mut CudaPinned,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: as in `upload`, in the other direction.
        unsafe { cu::memcpy_dtoh_async(&mut host[..bytes], src, stream.stream) }
            .map_err(|e| driver_error("cuMemcpyDtoHAsync", e))
    }

    fn copy(&self, stream: &CudaStream, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: both ranges lie inside live allocations (engine invariant).
        unsafe { cu::memcpy_dtod_async(dst, src, bytes, stream.stream) }
            .map_err(|e| driver_error("cuMemcpyDtoDAsync", e))
    }

    fn peer_access(&self, other: &Self) -> bool {
        if self.device == other.device {
            return false;
        }
        let mut cache = self.peers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(&known) = cache.get(&other.ordinal) {
            return known;
        }
        let enabled = can_access_peer(self, other) && can_access_peer(other, self);
        cache.insert(other.ordinal, enabled);
        enabled
    }

    fn copy_to_peer(
        &self,
        stream: &CudaStream,
        peer: &Self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: `src` lies in a live allocation of this context and `dst` in one of `peer`'s
        // (engine invariant), both contexts retained for the drivers' lifetimes.
        let status = unsafe {
            cu_sys::cuMemcpyPeerAsync(dst, peer.context.0, src, self.context.0, bytes, stream.stream)
        };
        status.result().map_err(|e| driver_error("cuMemcpyPeerAsync", e))
    }

    fn fill(&self, stream: &CudaStream, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the range lies inside a live allocation (engine invariant).
        unsafe { cu::memset_d8_async(dst, value, bytes, stream.stream) }
            .map_err(|e| driver_error("cuMemsetD8Async", e))
    }

    fn synchronize(&self, stream: &CudaStream) -> Result<()> {
        self.bind()?;
        // SAFETY: valid stream.
        unsafe { cu::stream::synchronize(stream.stream) }.map_err(|e| driver_error("cuStreamSynchronize", e))
    }

    fn compile(&self, source: &str, names: &[&str]) -> Result<Vec<CudaFunction>> {
        self.bind()?;
        let image = nvrtc_compile(source, &self.arch())?;
        // SAFETY: `image` is a cubin NVRTC just produced for this device; the module stays
        // loaded for the process (kernels are cached per device).
        let module = unsafe { cu::module::load_data(image.as_ptr().cast::<c_void>()) }
            .map_err(|e| driver_error("cuModuleLoadData", e))?;
        names
            .iter()
            .map(|name| {
                let cname = CString::new(*name).map_err(|_| HiveGpuError::Internal("kernel name".into()))?;
                // SAFETY: valid module and name.
                let f = unsafe { cu::module::get_function(module, cname) }
                    .map_err(|e| driver_error(&format!("cuModuleGetFunction({name})"), e))?;
                // SAFETY: valid function; the attribute is a plain integer.
                let static_bytes = unsafe {
                    cu::function::get_function_attribute(
                        f,
                        cu_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                    )
                }
                .map_err(|e| driver_error("cuFuncGetAttribute", e))?;
                // Static and dynamic shared memory share the opt-in limit; the engine's sizing
                // leaves 1 KiB for kernels' small static arrays.
                let dynamic = self.max_shared_optin.saturating_sub((static_bytes.max(0) as usize).max(1024));
                // SAFETY: valid function; opting in to the device's dynamic shared memory.
                unsafe {
                    cu::function::set_function_attribute(
                        f,
                        cu_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        dynamic as i32,
                    )
                }
                .map_err(|e| driver_error("cuFuncSetAttribute", e))?;
                Ok(CudaFunction(f))
            })
            .collect()
    }

    fn launch(
        &self,
        stream: &CudaStream,
        function: CudaFunction,
        grid: (u32, u32),
        block: u32,
        shared_bytes: u32,
        args: &[Arg],
    ) -> Result<()> {
        self.bind()?;
        let mut values = super::driver::argument_slots(args);
        let mut params: Vec<*mut c_void> =
            values.iter_mut().map(|v| (v as *mut u64).cast::<c_void>()).collect();
        // SAFETY: `params` matches the kernel's signature (checked by the engine's launch
        // helpers and the conformance tests); `values` outlives the call.
        unsafe {
            cu::launch_kernel(
                function.0,
                (grid.0, grid.1, 1),
                (block, 1, 1),
                shared_bytes,
                stream.stream,
                &mut params,
            )
        }
        .map_err(|e| driver_error("cuLaunchKernel", e))
    }

    fn gemm_tn(&self, stream: &CudaStream, g: &GemmTn) -> Result<()> {
        use blas_sys::{cublasComputeType_t as C, cublasOperation_t as Op, cudaDataType_t as T};
        self.bind()?;
        let (data, compute, algo) = match g.inputs {
            // NVIDIA_TF32_OVERRIDE=1 would quietly turn plain f32 GEMMs into TF32 and break the
            // f32 error bound: then ask for pedantic f32 explicitly.
            GemmInputs::F32 if tf32_override() => (
                T::CUDA_R_32F,
                C::CUBLAS_COMPUTE_32F_PEDANTIC,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            ),
            GemmInputs::F32 => {
                (T::CUDA_R_32F, C::CUBLAS_COMPUTE_32F, blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT)
            }
            GemmInputs::Tf32 => (
                T::CUDA_R_32F,
                C::CUBLAS_COMPUTE_32F_FAST_TF32,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            ),
            GemmInputs::F16 => {
                (T::CUDA_R_16F, C::CUBLAS_COMPUTE_32F, blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT)
            }
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let Some(handle) = stream.blas else {
            return Err(HiveGpuError::Internal("GEMM on a stream without a cuBLAS handle".into()));
        };
        // SAFETY: the pointers and leading dimensions describe live device buffers of the
        // stated shapes (engine invariant); alpha/beta are host scalars read during the call.
        unsafe {
            blas::gemm_ex(
                handle,
                Op::CUBLAS_OP_T,
                Op::CUBLAS_OP_N,
                g.m as i32,
                g.n as i32,
                g.k as i32,
                (&alpha as *const f32).cast(),
                g.a as *const c_void,
                data,
                g.lda as i32,
                g.b as *const c_void,
                data,
                g.ldb as i32,
                (&beta as *const f32).cast(),
                g.c as *mut c_void,
                T::CUDA_R_32F,
                g.ldc as i32,
                compute,
                algo,
            )
        }
        .map_err(|e| blas_error("cublasGemmEx", e))
    }
}

fn tf32_override() -> bool {
    std::env::var("NVIDIA_TF32_OVERRIDE").is_ok_and(|v| v.trim() != "0")
        || std::env::var("HIVE_GPU_GEMM_PEDANTIC").as_deref() == Ok("1")
}

/// A loaded CUDA kernel.
#[derive(Debug, Clone, Copy)]
pub struct CudaFunction(cu_sys::CUfunction);
// SAFETY: function handles are immutable after loading and usable from any thread.
unsafe impl Send for CudaFunction {}
// SAFETY: as above.
unsafe impl Sync for CudaFunction {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::gpu::kernels::source;

    /// Every kernel compiles with NVRTC for Volta (Turing with NVRTC 13), Ampere and Hopper.
    /// Needs libnvrtc only (no GPU); CI installs it and sets `HIVE_GPU_REQUIRE_NVRTC=1`, which
    /// makes its absence a failure.
    #[test]
    fn kernels_compile_with_nvrtc_for_every_target() {
        let required = std::env::var("HIVE_GPU_REQUIRE_NVRTC").as_deref() == Ok("1");
        match nvrtc_version() {
            Err(reason) if !required => {
                eprintln!("NVRTC not found ({reason}); set HIVE_GPU_REQUIRE_NVRTC=1 to make this a failure");
                return;
            }
            Err(reason) => panic!("HIVE_GPU_REQUIRE_NVRTC=1 but NVRTC is unavailable: {reason}"),
            Ok(version) => eprintln!("NVRTC {version}"),
        }
        // CUDA 13 dropped Volta: its NVRTC starts at Turing.
        let major: u32 = nvrtc_version().ok().and_then(|v| v.split('.').next()?.parse().ok()).unwrap_or(12);
        let oldest = if major >= 13 { "compute_75" } else { "compute_70" };
        // The tensor-core kernels are part of the program from compute capability 8.0 on.
        for (arch, tensor) in [(oldest, false), ("compute_80", true), ("compute_90", true)] {
            let program = source(PRELUDE, 32, tensor);
            let ptx = nvrtc_compile(&program, arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
            let text = String::from_utf8_lossy(&ptx);
            let names = crate::backend::gpu::kernels::Kernels::<CudaDriver>::NAMES.iter();
            let tensor_names = crate::backend::gpu::kernels::TENSOR_NAMES.iter().filter(|_| tensor);
            for name in names.chain(tensor_names) {
                assert!(text.contains(&format!(".entry {name}(")), "{arch}: no entry point {name}");
            }
        }
        // A cubin too, as the driver path loads.
        let cubin = nvrtc_compile(&source(PRELUDE, 32, true), "sm_80").expect("sm_80 cubin");
        assert!(cubin.starts_with(b"\x7fELF"), "sm_80 output is not an ELF cubin");
    }
}
