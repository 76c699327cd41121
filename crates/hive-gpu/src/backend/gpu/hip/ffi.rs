//! The C entry points of the HIP runtime, hiprtc and rocBLAS, opened with libloading, and the
//! few ABI facts (library names, property layouts, enum values) that their headers define.
//! Nothing here is linked at build time: a machine without ROCm builds and runs the rest.

use std::ffi::{c_char, c_int, c_void};

use libloading::Library;

/// `hipStream_t`, `hipEvent_t`, `hipModule_t`, `hipFunction_t`, `hiprtcProgram`,
/// `rocblas_handle`: all opaque pointers.
pub(crate) type Handle = *mut c_void;

/// `hipSuccess`, `hiprtcSuccess` and `rocblas_status_success`.
pub(crate) const SUCCESS: c_int = 0;
/// `hipErrorOutOfMemory`.
pub(crate) const ERROR_OUT_OF_MEMORY: c_int = 2;
/// `hipErrorNoDevice`.
pub(crate) const ERROR_NO_DEVICE: c_int = 100;
/// `hipErrorInvalidDevice` (what HIP 5 returns from `hipInit` without a GPU).
pub(crate) const ERROR_INVALID_DEVICE: c_int = 101;
/// `hipStreamNonBlocking`.
pub(crate) const STREAM_NON_BLOCKING: u32 = 1;
/// `hipEventDisableTiming`.
pub(crate) const EVENT_DISABLE_TIMING: u32 = 2;

/// `rocblas_operation_none` and `rocblas_operation_transpose`.
pub(crate) const ROCBLAS_OP_N: c_int = 111;
/// See [`ROCBLAS_OP_N`].
pub(crate) const ROCBLAS_OP_T: c_int = 112;
/// `rocblas_datatype_f16_r`.
pub(crate) const ROCBLAS_F16: c_int = 150;
/// `rocblas_datatype_f32_r`.
pub(crate) const ROCBLAS_F32: c_int = 151;
/// `rocblas_gemm_algo_standard`.
pub(crate) const ROCBLAS_ALGO_STANDARD: c_int = 0;

/// The runtime's file names, newest first: ROCm 7, 6 and 5.
pub(crate) const HIP_LIBRARIES: [&str; 3] = ["libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"];
/// The rocBLAS file names of the same ROCm release as a runtime of the given major version:
/// rocBLAS 5 with ROCm 7, 4 with ROCm 6, 3 (ROCm 5.6 and 5.7) or 2 (`.so.0`, ROCm 5.0 to 5.5)
/// with ROCm 5. Mixing releases is not supported by AMD, so no other one is tried.
pub(crate) fn rocblas_libraries(runtime_major: u32) -> &'static [&'static str] {
    match runtime_major {
        7 => &["librocblas.so.5"],
        6 => &["librocblas.so.4"],
        _ => &["librocblas.so.3", "librocblas.so.0"],
    }
}

/// Whether rocBLAS's kernel directory holds kernels for `arch` (`gfx90a`): rocBLAS aborts the
/// process on the first GEMM of an architecture it has no `TensileLibrary*` file for.
pub(crate) fn tensile_supports(directory: &std::path::Path, arch: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(directory) else { return false };
    entries.filter_map(|entry| entry.ok()).any(|entry| {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        name.starts_with("TensileLibrary")
            && name.match_indices(arch).any(|(at, _)| {
                // `gfx90a` must not match inside `gfx90a0`-like longer names.
                !name[at + arch.len()..].starts_with(|c: char| c.is_ascii_alphanumeric())
            })
    })
}

/// Where hiprtc lives for a runtime of the given major version: inside `libamdhip64` up to
/// ROCm 5, in its own `libhiprtc.so.<major>` from ROCm 6 on.
pub(crate) fn hiprtc_library(runtime_major: u32) -> Option<String> {
    (runtime_major >= 6).then(|| format!("libhiprtc.so.{runtime_major}"))
}

/// Byte offsets of the `hipDeviceProp_t` fields we read, for one layout of the struct.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PropsLayout {
    /// Which entry point fills this layout.
    pub(crate) entry: &'static str,
    pub(crate) total_global_mem: usize,
    pub(crate) shared_mem_per_block: usize,
    pub(crate) warp_size: usize,
    pub(crate) max_threads_per_block: usize,
    pub(crate) multi_processor_count: usize,
    pub(crate) l2_cache_size: usize,
    pub(crate) pci_domain: usize,
    pub(crate) pci_bus: usize,
    pub(crate) pci_device: usize,
    pub(crate) gcn_arch_name: usize,
}

/// `hipDeviceProp_tR0600` (ROCm 6 and 7; 1,472 bytes), filled by `hipGetDevicePropertiesR0600`.
/// Offsets computed from the ROCm 6 header with the C compiler (x86-64 LP64).
pub(crate) const PROPS_R0600: PropsLayout = PropsLayout {
    entry: "hipGetDevicePropertiesR0600",
    total_global_mem: 288,
    shared_mem_per_block: 296,
    warp_size: 308,
    max_threads_per_block: 320,
    multi_processor_count: 388,
    l2_cache_size: 616,
    pci_bus: 584,
    pci_device: 588,
    pci_domain: 592,
    gcn_arch_name: 1160,
};

/// The ROCm 5 `hipDeviceProp_t` (792 bytes in 5.2), filled by `hipGetDeviceProperties`.
/// Offsets computed from Debian's HIP 5.2 header with the C compiler (x86-64 LP64).
pub(crate) const PROPS_R0000: PropsLayout = PropsLayout {
    entry: "hipGetDeviceProperties",
    total_global_mem: 256,
    shared_mem_per_block: 264,
    warp_size: 276,
    max_threads_per_block: 280,
    multi_processor_count: 336,
    l2_cache_size: 340,
    pci_domain: 364,
    pci_bus: 368,
    pci_device: 372,
    gcn_arch_name: 396,
};

/// Bytes handed to the property call: well over any known layout, so a release that grows the
/// struct cannot write past our buffer.
pub(crate) const PROPS_BUFFER: usize = 4096;

/// Declares a table of C functions resolved from one library, with the list of their names.
macro_rules! symbol_table {
    ($(#[$doc:meta])* $table:ident { $($name:ident: fn($($arg:ty),* $(,)?) -> $ret:ty;)* }) => {
        $(#[$doc])*
        #[allow(non_snake_case)]
        pub(crate) struct $table {
            $(pub(crate) $name: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        impl $table {
            /// The symbol names, in table order (the symbol test checks them against the library).
            #[cfg(test)]
            pub(crate) const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            /// Resolves every symbol, or names the first one missing. The library must stay
            /// loaded for as long as the table is used.
            pub(crate) fn load(library: &Library) -> Result<Self, String> {
                Ok(Self {
                    $($name: {
                        // SAFETY: the symbol's C signature is the one declared in this table,
                        // taken from the HIP/hiprtc/rocBLAS headers; the caller keeps the
                        // library loaded while the pointer is used.
                        let symbol = unsafe {
                            library.get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                        };
                        *symbol.map_err(|e| format!("{}: {e}", stringify!($name)))?
                    },)*
                })
            }
        }

        impl std::fmt::Debug for $table {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(stringify!($table))
            }
        }
    };
}

symbol_table! {
    /// The HIP runtime calls the engine makes.
    Hip {
        hipInit: fn(u32) -> c_int;
        hipGetDeviceCount: fn(*mut c_int) -> c_int;
        hipSetDevice: fn(c_int) -> c_int;
        hipDriverGetVersion: fn(*mut c_int) -> c_int;
        hipRuntimeGetVersion: fn(*mut c_int) -> c_int;
        hipGetErrorName: fn(c_int) -> *const c_char;
        hipGetErrorString: fn(c_int) -> *const c_char;
        hipMemGetInfo: fn(*mut usize, *mut usize) -> c_int;
        hipMalloc: fn(*mut *mut c_void, usize) -> c_int;
        hipFree: fn(*mut c_void) -> c_int;
        hipHostMalloc: fn(*mut *mut c_void, usize, u32) -> c_int;
        hipHostFree: fn(*mut c_void) -> c_int;
        hipStreamCreateWithFlags: fn(*mut Handle, u32) -> c_int;
        hipStreamDestroy: fn(Handle) -> c_int;
        hipStreamSynchronize: fn(Handle) -> c_int;
        hipStreamWaitEvent: fn(Handle, Handle, u32) -> c_int;
        hipEventCreateWithFlags: fn(*mut Handle, u32) -> c_int;
        hipEventRecord: fn(Handle, Handle) -> c_int;
        hipEventDestroy: fn(Handle) -> c_int;
        hipMemcpyHtoDAsync: fn(*mut c_void, *const c_void, usize, Handle) -> c_int;
        hipMemcpyDtoHAsync: fn(*mut c_void, *mut c_void, usize, Handle) -> c_int;
        hipMemcpyDtoDAsync: fn(*mut c_void, *mut c_void, usize, Handle) -> c_int;
        hipMemsetD8Async: fn(*mut c_void, u8, usize, Handle) -> c_int;
        hipModuleLoadData: fn(*mut Handle, *const c_void) -> c_int;
        hipModuleGetFunction: fn(*mut Handle, Handle, *const c_char) -> c_int;
        hipModuleLaunchKernel: fn(
            Handle, u32, u32, u32, u32, u32, u32, u32, Handle, *mut *mut c_void, *mut *mut c_void,
        ) -> c_int;
    }
}

symbol_table! {
    /// hiprtc, the run-time kernel compiler.
    Rtc {
        hiprtcVersion: fn(*mut c_int, *mut c_int) -> c_int;
        hiprtcGetErrorString: fn(c_int) -> *const c_char;
        hiprtcCreateProgram: fn(
            *mut Handle, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char,
        ) -> c_int;
        hiprtcCompileProgram: fn(Handle, c_int, *const *const c_char) -> c_int;
        hiprtcGetProgramLogSize: fn(Handle, *mut usize) -> c_int;
        hiprtcGetProgramLog: fn(Handle, *mut c_char) -> c_int;
        hiprtcGetCodeSize: fn(Handle, *mut usize) -> c_int;
        hiprtcGetCode: fn(Handle, *mut c_char) -> c_int;
        hiprtcDestroyProgram: fn(*mut Handle) -> c_int;
    }
}

symbol_table! {
    /// The rocBLAS calls of the GEMM path.
    Rocblas {
        rocblas_create_handle: fn(*mut Handle) -> c_int;
        rocblas_destroy_handle: fn(Handle) -> c_int;
        rocblas_set_stream: fn(Handle, Handle) -> c_int;
        rocblas_status_to_string: fn(c_int) -> *const c_char;
        rocblas_gemm_ex: fn(
            Handle, c_int, c_int, c_int, c_int, c_int,
            *const c_void, *const c_void, c_int, c_int,
            *const c_void, c_int, c_int,
            *const c_void, *const c_void, c_int, c_int,
            *mut c_void, c_int, c_int,
            c_int, c_int, i32, u32,
        ) -> c_int;
    }
}

/// The properties entry point of a runtime: `hipGetDevicePropertiesR0600` where it exists
/// (ROCm 6+), else the ROCm 5 one, with the layout it fills.
pub(crate) type PropsFn = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;

/// Resolves the properties entry point and its layout.
pub(crate) fn props_entry(library: &Library) -> Result<(PropsFn, PropsLayout), String> {
    for layout in [PROPS_R0600, PROPS_R0000] {
        let name = format!("{}\0", layout.entry);
        // SAFETY: both entry points are `hipError_t f(hipDeviceProp_t*, int)`; the caller
        // keeps the library loaded and passes a buffer larger than either layout.
        if let Ok(symbol) = unsafe { library.get::<PropsFn>(name.as_bytes()) } {
            return Ok((*symbol, layout));
        }
    }
    Err("neither hipGetDevicePropertiesR0600 nor hipGetDeviceProperties is exported".into())
}

/// The C string at `ptr`, or `fallback` for a null pointer.
pub(crate) fn c_text(ptr: *const c_char, fallback: &str) -> String {
    if ptr.is_null() {
        return fallback.to_string();
    }
    // SAFETY: non-null strings returned by HIP/hiprtc/rocBLAS are static, NUL-terminated.
    unsafe { std::ffi::CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
}
