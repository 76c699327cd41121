//! [`Driver`] over AMD's HIP runtime, hiprtc and (when installed) rocBLAS, all opened at run
//! time with libloading: the crate builds with no ROCm, and a machine without it gets a reason.
//! The engine above is the one CUDA runs; this file is the vendor calls and little else.

mod ffi;

use std::ffi::{CString, c_int, c_void};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use libloading::Library;

use self::ffi::{Handle, Hip, PropsFn, PropsLayout, Rocblas, Rtc, c_text};
use super::driver::{Arg, DevicePtr, Driver, GemmInputs, GemmTn};
use crate::error::{HiveGpuError, Result};
use crate::types::{GpuBackendType, GpuDeviceInfo};

/// Why f16 GEMMs avoid rocBLAS on gfx90a.
const F16_FLUSH: &str = "MI200's f16 matrix instructions flush subnormals to zero";

/// Kernel sources get this prelude on HIP (its shuffles take the full wavefront by default).
pub(super) const PRELUDE: &str =
    "#define HG_SHFL_XOR(v, o) __shfl_xor((v), (o))\n#define HG_SHFL(v, l) __shfl((v), (l))\n";

/// The loaded ROCm libraries, for the whole process (never unloaded: HIP registers exit
/// handlers of its own).
#[derive(Debug)]
pub(crate) struct Runtime {
    hip: Hip,
    rtc: Rtc,
    props: (PropsFn, PropsLayout),
    /// rocBLAS, or why it is not used.
    blas: std::result::Result<Blas, String>,
    /// The runtime's file name (e.g. `libamdhip64.so.6`).
    hip_file: &'static str,
    /// Where hiprtc came from.
    rtc_file: String,
    /// The libraries the tables point into, kept loaded.
    _libraries: Vec<Library>,
}

// SAFETY: the tables are plain function pointers into libraries that stay loaded; the HIP
// runtime, hiprtc and rocBLAS entry points are thread-safe.
unsafe impl Send for Runtime {}
// SAFETY: as above.
unsafe impl Sync for Runtime {}

/// rocBLAS as loaded: its calls, its file and where its per-architecture kernels live.
#[derive(Debug)]
struct Blas {
    table: Rocblas,
    file: &'static str,
    /// `ROCBLAS_TENSILE_LIBPATH`, else `rocblas/library` beside the loaded library.
    kernels: Option<PathBuf>,
}

/// The directory of the loaded shared library whose file name is `file`, from the process's
/// memory map (Linux, as ROCm is).
fn loaded_directory(file: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| {
            std::path::Path::new(path)
                .file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with(file))
        })
        .and_then(|path| std::fs::canonicalize(path).ok())
        .and_then(|path| path.parent().map(PathBuf::from))
}

fn open_library(name: &str) -> std::result::Result<Library, String> {
    // SAFETY: loading a ROCm library runs its initialisers, which only set up the library's
    // own state; nothing of ours runs during them.
    unsafe { Library::new(name) }.map_err(|e| e.to_string())
}

/// The ROCm libraries, or precisely why they cannot be used (loaded once per process).
pub(crate) fn runtime() -> std::result::Result<&'static Runtime, String> {
    static RUNTIME: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();
    RUNTIME.get_or_init(load_runtime).as_ref().map_err(Clone::clone)
}

fn load_runtime() -> std::result::Result<Runtime, String> {
    let (hip_file, hip_library) = ffi::HIP_LIBRARIES
        .iter()
        .find_map(|name| open_library(name).ok().map(|lib| (*name, lib)))
        .ok_or_else(|| {
            format!(
                "no ROCm runtime: none of {} could be loaded (install ROCm 5, 6 or 7, or Debian's libamdhip64-5)",
                ffi::HIP_LIBRARIES.join(", ")
            )
        })?;
    let hip = Hip::load(&hip_library).map_err(|e| format!("{hip_file} lacks a symbol: {e}"))?;
    let props = ffi::props_entry(&hip_library).map_err(|e| format!("{hip_file}: {e}"))?;
    let mut libraries = vec![];
    let (rtc, rtc_file) = match ffi::hiprtc_library(major_of(hip_file)) {
        None => {
            let rtc = Rtc::load(&hip_library).map_err(|e| format!("{hip_file} lacks hiprtc: {e}"))?;
            (rtc, format!("{hip_file} (built in)"))
        }
        Some(name) => {
            let library = open_library(&name).map_err(|e| {
                format!(
                    "ROCm runtime found ({hip_file}), but hiprtc is missing: {name} could not be loaded: {e}"
                )
            })?;
            let rtc = Rtc::load(&library).map_err(|e| format!("{name} lacks a symbol: {e}"))?;
            libraries.push(library);
            (rtc, name)
        }
    };
    let candidates = ffi::rocblas_libraries(major_of(hip_file));
    let blas = candidates
        .iter()
        .find_map(|file| open_library(file).ok().map(|library| (*file, library)))
        .ok_or_else(|| {
            format!("rocBLAS not found ({}): GEMMs run on hive-gpu's own kernel", candidates.join(", "))
        })
        .and_then(|(file, library)| {
            let table = Rocblas::load(&library).map_err(|e| format!("{file} lacks a symbol: {e}"))?;
            libraries.push(library);
            let kernels = std::env::var_os("ROCBLAS_TENSILE_LIBPATH")
                .map(PathBuf::from)
                .or_else(|| loaded_directory(file).map(|dir| dir.join("rocblas").join("library")));
            Ok(Blas { table, file, kernels })
        });
    libraries.push(hip_library);
    Ok(Runtime { hip, rtc, props, blas, hip_file, rtc_file, _libraries: libraries })
}

/// The ROCm major version of a runtime file name (`libamdhip64.so.6` is 6).
fn major_of(file: &str) -> u32 {
    file.rsplit('.').next().and_then(|v| v.parse().ok()).unwrap_or(5)
}

impl Runtime {
    fn error(&self, call: &str, status: c_int) -> HiveGpuError {
        // SAFETY: the name and string calls accept any status value.
        let (name, text) =
            unsafe { ((self.hip.hipGetErrorName)(status), (self.hip.hipGetErrorString)(status)) };
        let (name, text) = (c_text(name, "unknown error"), c_text(text, ""));
        // HIP 5 describes some statuses by their name alone.
        let message = if text.is_empty() || text == name { name } else { format!("{name}: {text}") };
        HiveGpuError::HipError { call: call.to_string(), message }
    }

    fn check(&self, call: &str, status: c_int) -> Result<()> {
        if status == ffi::SUCCESS { Ok(()) } else { Err(self.error(call, status)) }
    }

    fn rtc_error(&self, call: &str, status: c_int) -> HiveGpuError {
        // SAFETY: accepts any status value.
        let text = unsafe { (self.rtc.hiprtcGetErrorString)(status) };
        HiveGpuError::HipError { call: call.to_string(), message: c_text(text, "unknown hiprtc error") }
    }

    /// `major.minor.patch` of a HIP version number (`major * 10^7 + minor * 10^5 + patch`).
    fn version_text(version: c_int) -> String {
        let v = version.max(0);
        format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
    }

    /// The runtime's version and file, and the driver's version, e.g.
    /// "HIP 6.2.41133 (libamdhip64.so.6, driver 6.2.41133)".
    pub(crate) fn describe(&self) -> String {
        let read = |call: unsafe extern "C" fn(*mut c_int) -> c_int| {
            let mut version = 0;
            // SAFETY: valid out-pointer.
            let status = unsafe { call(&mut version) };
            if status == ffi::SUCCESS { Self::version_text(version) } else { "unknown".into() }
        };
        format!(
            "HIP {} ({}, driver {})",
            read(self.hip.hipRuntimeGetVersion),
            self.hip_file,
            read(self.hip.hipDriverGetVersion)
        )
    }

    /// Number of AMD GPUs, or why there are none (initialised once per process).
    pub(crate) fn device_count(&self) -> std::result::Result<usize, String> {
        static COUNT: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
        COUNT
            .get_or_init(|| {
                let no_device = |call: &str, status: c_int| {
                    format!(
                        "ROCm runtime found ({}), but no AMD GPU: {}",
                        self.describe(),
                        self.error(call, status)
                    )
                };
                // SAFETY: plain initialisation call.
                let status = unsafe { (self.hip.hipInit)(0) };
                if status != ffi::SUCCESS {
                    return Err(no_device("hipInit", status));
                }
                let mut count = 0;
                // SAFETY: valid out-pointer.
                let status = unsafe { (self.hip.hipGetDeviceCount)(&mut count) };
                match status {
                    ffi::SUCCESS => Ok(count.max(0) as usize),
                    ffi::ERROR_NO_DEVICE | ffi::ERROR_INVALID_DEVICE => Ok(0),
                    other => Err(no_device("hipGetDeviceCount", other)),
                }
            })
            .clone()
    }

    /// Compiles `source` with hiprtc for `arch` (a gfx target such as `gfx90a` or
    /// `gfx90a:sramecc+:xnack-`) and returns the code object. Needs no GPU: CI checks every
    /// kernel compiles this way.
    pub(crate) fn compile(&self, source: &str, arch: &str) -> Result<Vec<u8>> {
        let src =
            CString::new(source).map_err(|_| HiveGpuError::Internal("kernel source has a NUL".into()))?;
        let name = CString::new("hive_gpu.hip").map_err(|_| HiveGpuError::Internal("program name".into()))?;
        let mut program: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer and NUL-terminated strings; no headers.
        let status = unsafe {
            (self.rtc.hiprtcCreateProgram)(
                &mut program,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if status != ffi::SUCCESS {
            return Err(self.rtc_error("hiprtcCreateProgram", status));
        }
        let outcome = self.compile_program(program, arch);
        // SAFETY: created above, destroyed once.
        unsafe { (self.rtc.hiprtcDestroyProgram)(&mut program) };
        outcome
    }

    fn compile_program(&self, program: Handle, arch: &str) -> Result<Vec<u8>> {
        let options: Vec<CString> = [format!("--offload-arch={arch}"), "-O3".into(), "-std=c++14".into()]
            .into_iter()
            .map(|o| CString::new(o).map_err(|_| HiveGpuError::Internal("compile option".into())))
            .collect::<Result<_>>()?;
        let pointers: Vec<*const std::ffi::c_char> = options.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: `program` is live; the options outlive the call.
        let status =
            unsafe { (self.rtc.hiprtcCompileProgram)(program, pointers.len() as c_int, pointers.as_ptr()) };
        if status != ffi::SUCCESS {
            let mut error = self.rtc_error(&format!("hiprtcCompileProgram({arch})"), status);
            if let HiveGpuError::HipError { message, .. } = &mut error {
                message.push_str(":\n");
                message.push_str(&self.program_log(program));
            }
            return Err(error);
        }
        let mut size = 0usize;
        // SAFETY: valid program and out-pointer.
        let status = unsafe { (self.rtc.hiprtcGetCodeSize)(program, &mut size) };
        if status != ffi::SUCCESS {
            return Err(self.rtc_error("hiprtcGetCodeSize", status));
        }
        let mut code = vec![0u8; size];
        // SAFETY: `code` holds the `size` bytes hiprtc reported.
        let status = unsafe { (self.rtc.hiprtcGetCode)(program, code.as_mut_ptr().cast()) };
        if status != ffi::SUCCESS {
            return Err(self.rtc_error("hiprtcGetCode", status));
        }
        Ok(code)
    }

    fn program_log(&self, program: Handle) -> String {
        let mut size = 0usize;
        // SAFETY: valid program and out-pointer.
        if unsafe { (self.rtc.hiprtcGetProgramLogSize)(program, &mut size) } != ffi::SUCCESS || size == 0 {
            return String::new();
        }
        let mut log = vec![0u8; size];
        // SAFETY: `log` holds the `size` bytes hiprtc reported.
        if unsafe { (self.rtc.hiprtcGetProgramLog)(program, log.as_mut_ptr().cast()) } != ffi::SUCCESS {
            return String::new();
        }
        String::from_utf8_lossy(&log).trim_end_matches('\0').to_string()
    }

    /// hiprtc's version, "major.minor".
    pub(crate) fn rtc_version(&self) -> String {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: valid out-pointers.
        let status = unsafe { (self.rtc.hiprtcVersion)(&mut major, &mut minor) };
        if status == ffi::SUCCESS { format!("{major}.{minor}") } else { "unknown".into() }
    }
}

/// The wavefront width of a gfx target: 64 on GCN and CDNA (gfx9 and older), 32 on RDNA
/// (gfx10 and newer), the default each compiles for.
pub(crate) fn wavefront_of(arch: &str) -> u32 {
    let family: u32 = arch
        .trim_start_matches("gfx")
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or(0);
    if family >= 1000 { 32 } else { 64 }
}

/// One AMD GPU.
#[derive(Debug)]
pub struct HipDriver {
    runtime: &'static Runtime,
    ordinal: c_int,
    name: String,
    /// The full target, features included (`gfx90a:sramecc+:xnack-`): kernels compile for it.
    target: String,
    wavefront: u32,
    compute_units: u32,
    max_threads: u32,
    shared_bytes: usize,
    l2_bytes: u64,
    pci: String,
    total: usize,
    /// rocBLAS usable on this device, or why GEMMs run on the engine's own kernel.
    blas: std::result::Result<(), String>,
    /// Code objects of the loaded modules, kept for the process as the modules are.
    images: Mutex<Vec<Vec<u8>>>,
}

impl HipDriver {
    /// Opens GPU `ordinal`, or says why ROCm cannot be used here.
    pub(crate) fn open(ordinal: usize) -> Result<Arc<Self>> {
        let unavailable =
            |reason: String| HiveGpuError::BackendUnavailable { backend: GpuBackendType::Rocm, reason };
        let runtime = runtime().map_err(unavailable)?;
        let count = runtime.device_count().map_err(unavailable)?;
        if ordinal >= count {
            return Err(HiveGpuError::DeviceNotFound { backend: GpuBackendType::Rocm, ordinal, count });
        }
        Self::open_inner(runtime, ordinal as c_int).map(Arc::new)
    }

    fn open_inner(runtime: &'static Runtime, ordinal: c_int) -> Result<Self> {
        // SAFETY: plain call with an ordinal below the device count.
        runtime.check("hipSetDevice", unsafe { (runtime.hip.hipSetDevice)(ordinal) })?;
        let (props_fn, layout) = runtime.props;
        let mut props = vec![0u8; ffi::PROPS_BUFFER];
        // SAFETY: the buffer is larger than the layout the entry point fills.
        runtime.check(layout.entry, unsafe { props_fn(props.as_mut_ptr().cast::<c_void>(), ordinal) })?;
        let int_at = |at: usize| i32::from_ne_bytes([props[at], props[at + 1], props[at + 2], props[at + 3]]);
        let size_at = |at: usize| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&props[at..at + 8]);
            usize::from_ne_bytes(bytes)
        };
        let text_at = |at: usize| {
            let field = &props[at..at + 256];
            let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
            String::from_utf8_lossy(&field[..end]).into_owned()
        };
        let target = text_at(layout.gcn_arch_name);
        let wavefront = int_at(layout.warp_size);
        // A layout that does not match the library would give garbage here: refuse it. The
        // wavefront must also be the one hiprtc compiles the target for by default, since the
        // kernels are built with HG_WARP set to it.
        if !target.starts_with("gfx") || wavefront as u32 != wavefront_of(&target) {
            return Err(HiveGpuError::RocmError(format!(
                "{} gave architecture {target:?} with wavefront {wavefront} from {}: either the \
                 hipDeviceProp_t layout is not the one this build knows, or the device runs a \
                 wavefront its target does not compile for by default; not supported",
                layout.entry,
                runtime.describe()
            )));
        }
        let arch = target.split(':').next().unwrap_or(&target).to_string();
        let blas = match &runtime.blas {
            Err(reason) => Err(reason.clone()),
            Ok(blas) => match &blas.kernels {
                Some(dir) if ffi::tensile_supports(dir, &arch) => Ok(()),
                dir => Err(format!(
                    "{} has no kernels for {arch} (no TensileLibrary file in {}): GEMMs run on hive-gpu's own kernel",
                    blas.file,
                    dir.as_ref().map_or("an unknown directory".into(), |d| d.display().to_string())
                )),
            },
        };
        Ok(Self {
            runtime,
            ordinal,
            blas,
            images: Mutex::new(Vec::new()),
            name: text_at(0),
            target,
            wavefront: wavefront as u32,
            compute_units: int_at(layout.multi_processor_count).max(1) as u32,
            max_threads: int_at(layout.max_threads_per_block).max(1) as u32,
            shared_bytes: size_at(layout.shared_mem_per_block).max(16 * 1024),
            l2_bytes: int_at(layout.l2_cache_size).max(0) as u64,
            pci: format!(
                "{:04x}:{:02x}:{:02x}.0",
                int_at(layout.pci_domain),
                int_at(layout.pci_bus),
                int_at(layout.pci_device)
            ),
            total: size_at(layout.total_global_mem),
        })
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: plain call with this driver's ordinal.
        self.runtime.check("hipSetDevice", unsafe { (self.runtime.hip.hipSetDevice)(self.ordinal) })
    }

    fn hip(&self) -> &Hip {
        &self.runtime.hip
    }

    /// The architecture without its feature flags (`gfx90a`).
    fn arch(&self) -> &str {
        self.target.split(':').next().unwrap_or(&self.target)
    }

    /// Whether rocBLAS's f16 GEMMs flush subnormal inputs to zero here, which the f16 error
    /// bound does not allow for.
    fn f16_flushes(&self) -> bool {
        self.arch() == "gfx90a"
    }
}

/// A HIP stream, with a rocBLAS handle when it runs GEMMs.
#[derive(Debug)]
pub struct HipStream {
    runtime: &'static Runtime,
    stream: Handle,
    blas: Option<Handle>,
}
// SAFETY: HIP streams and rocBLAS handles may move between threads; the engine uses each
// from one thread at a time (workspaces are checked out of a pool).
unsafe impl Send for HipStream {}

impl Drop for HipStream {
    fn drop(&mut self) {
        // SAFETY: created in `Driver::stream`, destroyed once here, after its work finished.
        unsafe {
            let _ = (self.runtime.hip.hipStreamSynchronize)(self.stream);
            if let (Some(handle), Ok(blas)) = (self.blas, &self.runtime.blas) {
                let _ = (blas.table.rocblas_destroy_handle)(handle);
            }
            let _ = (self.runtime.hip.hipStreamDestroy)(self.stream);
        }
    }
}

/// Page-locked host memory.
#[derive(Debug)]
pub struct HipPinned {
    runtime: &'static Runtime,
    ptr: *mut u8,
    len: usize,
}
// SAFETY: plain host memory owned by this value.
unsafe impl Send for HipPinned {}
// SAFETY: a shared borrow only reads the bytes (`Deref`); writing needs `&mut` (`DerefMut`).
// The buffer is also mapped into the device (`mapped`): a kernel may write it only while its
// owner holds it exclusively and waits for the kernel before reading (as `Staging` does).
unsafe impl Sync for HipPinned {}

impl std::ops::Deref for HipPinned {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` bytes from hipHostMalloc, owned here.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}
impl std::ops::DerefMut for HipPinned {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}
impl Drop for HipPinned {
    fn drop(&mut self) {
        // SAFETY: allocated by hipHostMalloc, freed once.
        let _ = unsafe { (self.runtime.hip.hipHostFree)(self.ptr.cast()) };
    }
}

/// A HIP event (timing disabled: it only orders streams).
#[derive(Debug)]
pub struct HipEvent {
    runtime: &'static Runtime,
    event: Handle,
}
// SAFETY: event handles may be used from any thread.
unsafe impl Send for HipEvent {}

impl Drop for HipEvent {
    fn drop(&mut self) {
        // SAFETY: created in `Driver::event`, destroyed once here.
        let _ = unsafe { (self.runtime.hip.hipEventDestroy)(self.event) };
    }
}

/// A loaded HIP kernel.
#[derive(Debug, Clone, Copy)]
pub struct HipFunction(Handle);
// SAFETY: function handles are immutable after loading and usable from any thread.
unsafe impl Send for HipFunction {}
// SAFETY: as above.
unsafe impl Sync for HipFunction {}

fn device_ptr(ptr: DevicePtr) -> *mut c_void {
    ptr as usize as *mut c_void
}

impl Driver for HipDriver {
    type Stream = HipStream;
    type Function = HipFunction;
    type Pinned = HipPinned;
    type Event = HipEvent;

    fn device_info(&self) -> GpuDeviceInfo {
        let blas = match (&self.blas, &self.runtime.blas) {
            (Ok(()), Ok(blas)) if self.f16_flushes() => {
                format!("{} for GEMMs (f16 ones on hive-gpu's own kernel: {F16_FLUSH})", blas.file)
            }
            (Ok(()), Ok(blas)) => format!("{} for GEMMs", blas.file),
            (Err(reason), _) | (Ok(()), Err(reason)) => reason.clone(),
        };
        GpuDeviceInfo {
            name: self.name.clone(),
            backend: GpuBackendType::Rocm,
            device_id: self.ordinal as usize,
            // Free memory is read by the engine (`mem_info`), which fills the other two.
            total_vram_bytes: self.total as u64,
            available_vram_bytes: 0,
            used_vram_bytes: 0,
            driver_version: Some(format!(
                "{}, hiprtc {} from {}, target {}; {blas}",
                self.runtime.describe(),
                self.runtime.rtc_version(),
                self.runtime.rtc_file,
                self.target
            )),
            compute_capability: self.arch().to_string(),
            max_threads_per_block: self.max_threads,
            max_shared_memory_per_block: self.shared_bytes as u64,
            compute_units: self.compute_units,
            pci_bus_id: Some(self.pci.clone()),
            l2_cache_bytes: Some(self.l2_bytes),
            warp_size: self.wavefront,
            software: false,
        }
    }

    fn warp_size(&self) -> u32 {
        self.wavefront
    }

    fn multiprocessors(&self) -> u32 {
        self.compute_units
    }

    fn max_shared_bytes(&self) -> usize {
        self.shared_bytes
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        self.runtime.check("hipMemGetInfo", unsafe { (self.hip().hipMemGetInfo)(&mut free, &mut total) })?;
        Ok((free, total))
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.bind()?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; freed by `free`.
        match unsafe { (self.hip().hipMalloc)(&mut ptr, bytes.max(1)) } {
            ffi::SUCCESS => Ok(ptr as usize as DevicePtr),
            ffi::ERROR_OUT_OF_MEMORY => Err(HiveGpuError::VramLimitExceeded {
                backend: GpuBackendType::Rocm,
                requested: bytes as u64,
                available: self.mem_info().map(|(free, _)| free as u64).unwrap_or(0),
            }),
            status => Err(self.runtime.error("hipMalloc", status)),
        }
    }

    fn free(&self, ptr: DevicePtr) {
        if self.bind().is_ok() {
            // SAFETY: `ptr` came from `alloc` and is freed once (DeviceBuffer's Drop).
            let _ = unsafe { (self.hip().hipFree)(device_ptr(ptr)) };
        }
    }

    fn pinned(&self, bytes: usize) -> Result<HipPinned> {
        self.bind()?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the memory is owned by the returned value.
        self.runtime
            .check("hipHostMalloc", unsafe { (self.hip().hipHostMalloc)(&mut ptr, bytes.max(1), 0) })?;
        Ok(HipPinned { runtime: self.runtime, ptr: ptr.cast(), len: bytes })
    }

    fn stream(&self, with_blas: bool) -> Result<HipStream> {
        self.bind()?;
        let mut stream: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.runtime.check("hipStreamCreateWithFlags", unsafe {
            (self.hip().hipStreamCreateWithFlags)(&mut stream, ffi::STREAM_NON_BLOCKING)
        })?;
        let mut created = HipStream { runtime: self.runtime, stream, blas: None };
        if let (true, Ok(()), Ok(blas)) = (with_blas, &self.blas, &self.runtime.blas) {
            let blas = &blas.table;
            let blas_error = |call: &str, status: c_int| HiveGpuError::RocblasError {
                call: call.to_string(),
                // SAFETY: accepts any status value.
                message: c_text(unsafe { (blas.rocblas_status_to_string)(status) }, "unknown rocBLAS status"),
            };
            let mut handle: Handle = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            let status = unsafe { (blas.rocblas_create_handle)(&mut handle) };
            if status != ffi::SUCCESS {
                return Err(blas_error("rocblas_create_handle", status));
            }
            created.blas = Some(handle);
            // SAFETY: both handles were just created.
            let status = unsafe { (blas.rocblas_set_stream)(handle, stream) };
            if status != ffi::SUCCESS {
                return Err(blas_error("rocblas_set_stream", status));
            }
        }
        Ok(created)
    }

    fn upload_at(
        &self,
        stream: &HipStream,
        dst: DevicePtr,
        host: &HipPinned,
        offset: usize,
        bytes: usize,
    ) -> Result<()> {
        self.bind()?;
        let host = offset.checked_add(bytes).and_then(|end| host.get(offset..end)).ok_or_else(|| {
            HiveGpuError::Internal(format!("an upload of {bytes} bytes at {offset} is past its buffer"))
        })?;
        // SAFETY: `host` is pinned and outlives the copy (callers synchronize before reuse);
        // `dst` holds at least `bytes` (engine invariant).
        self.runtime.check("hipMemcpyHtoDAsync", unsafe {
            (self.hip().hipMemcpyHtoDAsync)(device_ptr(dst), host.as_ptr().cast(), bytes, stream.stream)
        })
    }

    fn download(&self, stream: &HipStream, host: &mut HipPinned, src: DevicePtr, bytes: usize) -> Result<()> {
        self.bind()?;
        let host = &mut host[..bytes];
        // SAFETY: as in `upload`, in the other direction.
        self.runtime.check("hipMemcpyDtoHAsync", unsafe {
            (self.hip().hipMemcpyDtoHAsync)(host.as_mut_ptr().cast(), device_ptr(src), bytes, stream.stream)
        })
    }

    fn copy(&self, stream: &HipStream, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: both ranges lie inside live allocations (engine invariant).
        self.runtime.check("hipMemcpyDtoDAsync", unsafe {
            (self.hip().hipMemcpyDtoDAsync)(device_ptr(dst), device_ptr(src), bytes, stream.stream)
        })
    }

    fn fill(&self, stream: &HipStream, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the range lies inside a live allocation (engine invariant).
        self.runtime.check("hipMemsetD8Async", unsafe {
            (self.hip().hipMemsetD8Async)(device_ptr(dst), value, bytes, stream.stream)
        })
    }

    fn synchronize(&self, stream: &HipStream) -> Result<()> {
        self.bind()?;
        // SAFETY: valid stream.
        self.runtime
            .check("hipStreamSynchronize", unsafe { (self.hip().hipStreamSynchronize)(stream.stream) })
    }

    fn event(&self) -> Result<HipEvent> {
        self.bind()?;
        let mut event: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.runtime.check("hipEventCreateWithFlags", unsafe {
            (self.hip().hipEventCreateWithFlags)(&mut event, ffi::EVENT_DISABLE_TIMING)
        })?;
        Ok(HipEvent { runtime: self.runtime, event })
    }

    fn record(&self, event: &HipEvent, stream: &HipStream) -> Result<()> {
        self.bind()?;
        // SAFETY: valid event and stream.
        self.runtime
            .check("hipEventRecord", unsafe { (self.hip().hipEventRecord)(event.event, stream.stream) })
    }

    fn wait(&self, stream: &HipStream, event: &HipEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: valid stream and event.
        self.runtime.check("hipStreamWaitEvent", unsafe {
            (self.hip().hipStreamWaitEvent)(stream.stream, event.event, 0)
        })
    }

    fn compile(&self, source: &str, names: &[&str]) -> Result<Vec<HipFunction>> {
        self.bind()?;
        let image = self.runtime.compile(source, &self.target)?;
        let mut module: Handle = std::ptr::null_mut();
        // SAFETY: `image` is a code object hiprtc just produced for this device; it is kept
        // below for as long as the driver, and the module stays loaded for the process.
        self.runtime.check("hipModuleLoadData", unsafe {
            (self.hip().hipModuleLoadData)(&mut module, image.as_ptr().cast())
        })?;
        // HIP may read the image after loading (it does not promise a copy): keep it.
        self.images.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(image);
        names
            .iter()
            .map(|name| {
                let cname = CString::new(*name).map_err(|_| HiveGpuError::Internal("kernel name".into()))?;
                let mut function: Handle = std::ptr::null_mut();
                // SAFETY: valid module, name and out-pointer.
                self.runtime.check(&format!("hipModuleGetFunction({name})"), unsafe {
                    (self.hip().hipModuleGetFunction)(&mut function, module, cname.as_ptr())
                })?;
                Ok(HipFunction(function))
            })
            .collect()
    }

    fn launch(
        &self,
        stream: &HipStream,
        function: HipFunction,
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
        self.runtime.check("hipModuleLaunchKernel", unsafe {
            (self.hip().hipModuleLaunchKernel)(
                function.0,
                grid.0,
                grid.1,
                1,
                block,
                1,
                1,
                shared_bytes,
                stream.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn has_gemm(&self, inputs: GemmInputs) -> bool {
        self.blas.is_ok() && !(inputs == GemmInputs::F16 && self.f16_flushes())
    }

    fn gemm_tn(&self, stream: &HipStream, g: &GemmTn) -> Result<()> {
        self.bind()?;
        let (Ok(blas), Some(handle)) = (&self.runtime.blas, stream.blas) else {
            return Err(HiveGpuError::Internal("GEMM on a stream without a rocBLAS handle".into()));
        };
        // rocBLAS has no TF32 mode: the fast path's candidates come from an f32 GEMM, which is
        // inside the TF32 error band.
        let data = match g.inputs {
            GemmInputs::F32 | GemmInputs::Tf32 => ffi::ROCBLAS_F32,
            GemmInputs::F16 => ffi::ROCBLAS_F16,
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the pointers and leading dimensions describe live device buffers of the
        // stated shapes (engine invariant); alpha/beta are host scalars read during the call.
        let status = unsafe {
            (blas.table.rocblas_gemm_ex)(
                handle,
                ffi::ROCBLAS_OP_T,
                ffi::ROCBLAS_OP_N,
                g.m as c_int,
                g.n as c_int,
                g.k as c_int,
                (&alpha as *const f32).cast(),
                device_ptr(g.a),
                data,
                g.lda as c_int,
                device_ptr(g.b),
                data,
                g.ldb as c_int,
                (&beta as *const f32).cast(),
                device_ptr(g.c),
                ffi::ROCBLAS_F32,
                g.ldc as c_int,
                device_ptr(g.c),
                ffi::ROCBLAS_F32,
                g.ldc as c_int,
                ffi::ROCBLAS_F32,
                ffi::ROCBLAS_ALGO_STANDARD,
                0,
                0,
            )
        };
        if status == ffi::SUCCESS {
            return Ok(());
        }
        Err(HiveGpuError::RocblasError {
            call: "rocblas_gemm_ex".into(),
            // SAFETY: accepts any status value.
            message: c_text(
                unsafe { (blas.table.rocblas_status_to_string)(status) },
                "unknown rocBLAS status",
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::gpu::kernels::{Kernels, source};

    /// Whether CI demands ROCm's libraries here (`HIVE_GPU_REQUIRE_HIPRTC=1`): then a missing
    /// runtime fails these tests instead of leaving them with nothing to check.
    fn runtime_or_skip() -> Option<&'static Runtime> {
        match runtime() {
            Ok(runtime) => Some(runtime),
            Err(reason) if std::env::var("HIVE_GPU_REQUIRE_HIPRTC").as_deref() == Ok("1") => {
                panic!("HIVE_GPU_REQUIRE_HIPRTC=1 but {reason}")
            }
            Err(reason) => {
                eprintln!("skipped, no ROCm runtime here: {reason}");
                None
            }
        }
    }

    /// rocBLAS is used only for architectures its kernel directory has files for.
    #[test]
    fn tensile_kernels_are_matched_by_whole_architecture() {
        let dir = std::env::temp_dir().join(format!("hive-gpu-tensile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        for name in [
            "TensileLibrary_lazy_gfx90a.dat",
            "TensileLibrary_Type_HH_gfx1100.co",
            "Kernels.so-000-gfx906.hsaco",
        ] {
            std::fs::write(dir.join(name), b"").expect("temp file");
        }
        assert!(ffi::tensile_supports(&dir, "gfx90a"));
        assert!(ffi::tensile_supports(&dir, "gfx1100"));
        assert!(!ffi::tensile_supports(&dir, "gfx110"), "a prefix of an architecture is not it");
        assert!(!ffi::tensile_supports(&dir, "gfx906"), "only TensileLibrary files count");
        assert!(!ffi::tensile_supports(&dir, "gfx942"));
        assert!(!ffi::tensile_supports(&dir.join("missing"), "gfx90a"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn wavefront_follows_the_architecture_family() {
        for (arch, wave) in [("gfx803", 64), ("gfx906", 64), ("gfx90a:sramecc+:xnack-", 64), ("gfx942", 64)] {
            assert_eq!(wavefront_of(arch), wave, "{arch}");
        }
        for arch in ["gfx1010", "gfx1030", "gfx1100", "gfx1201"] {
            assert_eq!(wavefront_of(arch), 32, "{arch}");
        }
        assert_eq!(ffi::hiprtc_library(5), None);
        assert_eq!(ffi::hiprtc_library(6).as_deref(), Some("libhiprtc.so.6"));
        assert_eq!(ffi::rocblas_libraries(7), ["librocblas.so.5"]);
        assert_eq!(ffi::rocblas_libraries(6), ["librocblas.so.4"]);
        assert_eq!(ffi::rocblas_libraries(5), ["librocblas.so.3", "librocblas.so.0"]);
        assert_eq!(major_of("libamdhip64.so.7"), 7);
        assert_eq!(Runtime::version_text(50_221_153), "5.2.21153");
        assert_eq!(Runtime::version_text(60_241_133), "6.2.41133");
    }

    /// Every name in the FFI tables resolves in the installed runtime (all of them, so one
    /// run lists every missing symbol), and the property entry point matches its version.
    #[test]
    fn symbol_tables_match_the_installed_runtime() {
        let Some(runtime) = runtime_or_skip() else { return };
        let library = open_library(runtime.hip_file).expect("the runtime loaded once already");
        let rtc_library = match ffi::hiprtc_library(major_of(runtime.hip_file)) {
            Some(name) => open_library(&name).expect("hiprtc loaded once already"),
            None => open_library(runtime.hip_file).expect("as above"),
        };
        let blas_library = ffi::rocblas_libraries(major_of(runtime.hip_file))
            .iter()
            .find_map(|file| open_library(file).ok());
        let mut tables = vec![(Hip::NAMES, &library), (Rtc::NAMES, &rtc_library)];
        if let Some(blas) = &blas_library {
            tables.push((Rocblas::NAMES, blas));
        }
        let missing: Vec<String> = tables
            .into_iter()
            .flat_map(|(names, lib)| names.iter().map(move |name| (*name, lib)))
            .filter(|(name, lib)| {
                // SAFETY: only resolves the address; nothing is called.
                unsafe { lib.get::<*const c_void>(format!("{name}\0").as_bytes()) }.is_err()
            })
            .map(|(name, _)| name.to_string())
            .collect();
        assert!(missing.is_empty(), "{} lacks {missing:?}", runtime.hip_file);
        let expected =
            if major_of(runtime.hip_file) >= 6 { ffi::PROPS_R0600.entry } else { ffi::PROPS_R0000.entry };
        assert_eq!(runtime.props.1.entry, expected, "{}", runtime.hip_file);
        for (name, expected) in
            [(ffi::PROPS_R0600.entry, major_of(runtime.hip_file) >= 6), (ffi::PROPS_R0000.entry, true)]
        {
            // SAFETY: only resolves the address.
            let found = unsafe { library.get::<*const c_void>(format!("{name}\0").as_bytes()) }.is_ok();
            assert!(found || !expected, "{} lacks {name}", runtime.hip_file);
        }
        if let Err(reason) = &runtime.blas {
            eprintln!("rocBLAS: {reason}");
        }
    }

    /// Compiles the whole kernel source for `arch` and checks the code object holds every
    /// kernel.
    fn check_compiles(runtime: &Runtime, arch: &str) {
        let wave = wavefront_of(arch);
        let code = runtime
            .compile(&source(PRELUDE, wave, false), arch)
            .unwrap_or_else(|e| panic!("{arch} (HG_WARP={wave}): {e}"));
        assert!(code.starts_with(b"\x7fELF"), "{arch}: the code object is not ELF");
        for name in Kernels::<HipDriver>::NAMES {
            let symbol = format!("{name}.kd");
            assert!(
                code.windows(symbol.len()).any(|w| w == symbol.as_bytes()),
                "{arch}: no kernel descriptor {symbol} in the code object"
            );
        }
        eprintln!("{arch}: {} bytes, HG_WARP={wave}", code.len());
    }

    /// The wave64 (GCN/CDNA) and wave32 (RDNA) targets every hiprtc since ROCm 5 knows.
    #[test]
    fn kernels_compile_with_hiprtc_for_every_target() {
        let Some(runtime) = runtime_or_skip() else { return };
        eprintln!("hiprtc {} from {}", runtime.rtc_version(), runtime.rtc_file);
        for arch in ["gfx906", "gfx908", "gfx90a", "gfx1030"] {
            check_compiles(runtime, arch);
        }
        // Newer targets only where this hiprtc knows them: Debian's HIP 5.2 aborts the process
        // on gfx942 or gfx1100, so each is tried in a child process first.
        let exe = std::env::current_exe().expect("the test binary's path");
        for arch in ["gfx942", "gfx1100", "gfx1200"] {
            let output = std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "backend::gpu::hip::tests::hiprtc_child",
                    "--include-ignored",
                    "--nocapture",
                ])
                .args(["--test-threads", "1"])
                .env("HIVE_GPU_HIPRTC_CHILD_ARCH", arch)
                .output()
                .expect("the test binary runs again as a child");
            let stdout = String::from_utf8_lossy(&output.stdout);
            let stderr = String::from_utf8_lossy(&output.stderr);
            if stdout.contains("HIPRTC_CHILD_COMPILED") && output.status.success() {
                eprintln!("{arch}: compiled in a child process");
            } else if !stdout.contains("HIPRTC_CHILD_KNOWS_TARGET") {
                eprintln!("{arch}: this hiprtc does not know the target ({}), not compiled", output.status);
            } else {
                panic!("{arch}: hiprtc knows the target but the kernels failed:\n{stdout}\n{stderr}");
            }
        }
    }

    /// Runs only as the child of `kernels_compile_with_hiprtc_for_every_target`.
    #[test]
    #[ignore = "a child process of kernels_compile_with_hiprtc_for_every_target, never run alone"]
    fn hiprtc_child() {
        let arch = std::env::var("HIVE_GPU_HIPRTC_CHILD_ARCH").expect("set by the parent test");
        let runtime = runtime().expect("the parent found the runtime");
        let probe = "extern \"C\" __global__ void hg_probe(float* x) { x[threadIdx.x] += 1.0f; }";
        if runtime.compile(probe, &arch).is_err() {
            return;
        }
        println!("HIPRTC_CHILD_KNOWS_TARGET");
        check_compiles(runtime, &arch);
        println!("HIPRTC_CHILD_COMPILED");
    }
}
