//! The `Driver` trait: everything the GPU engine needs from a vendor runtime. CUDA implements
//! it over cudarc (`cuda.rs`), HIP over libloading (`hip.rs`). The engine above is
//! written once against this trait, so every line of it runs in the CUDA tests.

use crate::error::Result;
use crate::types::GpuDeviceInfo;

/// A device address.
pub type DevicePtr = u64;

/// One kernel argument, passed by value.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    /// `unsigned int`.
    U32(u32),
    /// `int`.
    I32(i32),
    /// `unsigned long long`.
    U64(u64),
    /// `float`.
    F32(f32),
    /// `double`.
    F64(f64),
    /// A device pointer (0 for a null pointer).
    Ptr(DevicePtr),
}

/// Kernel arguments as the launch APIs of CUDA and HIP take them: one 8-byte slot each, whose
/// address goes in the parameter array. Little-endian puts 4-byte values first.
pub(crate) fn argument_slots(args: &[Arg]) -> Vec<u64> {
    args.iter()
        .map(|a| match *a {
            Arg::U32(v) => u64::from(v),
            Arg::I32(v) => u64::from(v as u32),
            Arg::U64(v) | Arg::Ptr(v) => v,
            Arg::F32(v) => u64::from(v.to_bits()),
            Arg::F64(v) => v.to_bits(),
        })
        .collect()
}

/// Input precision of a GEMM (the accumulation is always f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmInputs {
    /// f32 inputs, f32 products: no tensor-core shortcuts allowed.
    F32,
    /// f32 inputs rounded to TF32 on the tensor cores.
    Tf32,
    /// f16 inputs on the tensor cores.
    F16,
}

/// `C = A^T B` in column-major terms: `A` is `k x m` (leading dimension `lda`), `B` is `k x n`,
/// `C` is `m x n` f32 with leading dimension `ldc`. With row-major rows as `A` and row-major
/// queries as `B`, `C` holds one query's dot products per column.
#[derive(Debug, Clone, Copy)]
pub struct GemmTn {
    /// Rows of `C` (stored rows in the tile).
    pub m: usize,
    /// Columns of `C` (queries).
    pub n: usize,
    /// The shared dimension (vector dimension).
    pub k: usize,
    /// `A` (the stored rows).
    pub a: DevicePtr,
    /// Leading dimension of `A`.
    pub lda: usize,
    /// `B` (the queries).
    pub b: DevicePtr,
    /// Leading dimension of `B`.
    pub ldb: usize,
    /// `C` (f32).
    pub c: DevicePtr,
    /// Leading dimension of `C`.
    pub ldc: usize,
    /// Input precision.
    pub inputs: GemmInputs,
}

/// A vendor runtime bound to one device.
pub trait Driver: Send + Sync + std::fmt::Debug + Sized + 'static {
    /// An ordered queue of device work, with whatever per-queue state the BLAS needs.
    type Stream: Send + std::fmt::Debug;
    /// A loaded kernel.
    type Function: Send + Sync + Copy + std::fmt::Debug;
    /// Page-locked host memory for asynchronous copies (shared by the searches of a collection
    /// streamed from it, which only read it).
    type Pinned: Send + Sync + std::fmt::Debug + std::ops::DerefMut<Target = [u8]>;
    /// A marker in a stream that another stream can wait for.
    type Event: Send + std::fmt::Debug;

    /// The device's description: what does not change (its total memory included; the
    /// engine reads free memory through [`Driver::mem_info`]).
    fn device_info(&self) -> GpuDeviceInfo;
    /// Threads per warp or wavefront.
    fn warp_size(&self) -> u32;
    /// Multiprocessors (compute units).
    fn multiprocessors(&self) -> u32;
    /// Whether the device runs the `mma.sync` tensor-core kernels of `kernels/fused.cu`
    /// (CUDA compute capability 8.0 and later).
    fn tensor_cores(&self) -> bool {
        false
    }
    /// Largest dynamic shared memory one block may use, in bytes.
    fn max_shared_bytes(&self) -> usize;
    /// `(free, total)` device memory in bytes.
    fn mem_info(&self) -> Result<(usize, usize)>;

    /// Device memory; out of memory is `VramLimitExceeded`.
    fn alloc(&self, bytes: usize) -> Result<DevicePtr>;
    /// Frees what [`Driver::alloc`] returned.
    fn free(&self, ptr: DevicePtr);
    /// Page-locked host memory.
    fn pinned(&self, bytes: usize) -> Result<Self::Pinned>;
    /// The device address at which kernels can write `host` directly, so small results come
    /// back with no copy (the stream's synchronization makes the writes visible); None where
    /// the runtime does not map page-locked memory into the device's address space.
    fn mapped(&self, _host: &Self::Pinned) -> Option<DevicePtr> {
        None
    }
    /// A new stream; `with_blas` also gives it a BLAS handle (for [`Driver::gemm_tn`]), which
    /// costs device memory, so only streams that run GEMMs ask for one.
    fn stream(&self, with_blas: bool) -> Result<Self::Stream>;

    /// Queues a copy of `host[..bytes]` to `dst`. The host buffer must stay untouched until
    /// the stream is synchronized.
    fn upload(&self, stream: &Self::Stream, dst: DevicePtr, host: &Self::Pinned, bytes: usize) -> Result<()> {
        self.upload_at(stream, dst, host, 0, bytes)
    }
    /// Queues a copy of `host[offset..offset + bytes]` to `dst` (a range past the buffer is an
    /// error). The host buffer must stay untouched until the stream is synchronized.
    fn upload_at(
        &self,
        stream: &Self::Stream,
        dst: DevicePtr,
        host: &Self::Pinned,
        offset: usize,
        bytes: usize,
    ) -> Result<()>;
    /// Queues a copy of `bytes` from `src` into `host`; valid after the stream is synchronized.
    fn download(
        &self,
        stream: &Self::Stream,
        host: &mut Self::Pinned,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<()>;
    /// Queues a device-to-device copy.
    fn copy(&self, stream: &Self::Stream, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()>;
    /// Whether this device can copy straight into `other`'s memory (and `other` into its):
    /// enables peer access both ways on first ask. False for the device itself (a plain
    /// [`Driver::copy`] serves it) and where the runtime has no peer copies (this default).
    fn peer_access(&self, _other: &Self) -> bool {
        false
    }
    /// Queues a copy of `bytes` from this device's `src` into `dst` on device `peer`, on this
    /// device's stream; only after [`Driver::peer_access`] said yes for `peer`.
    fn copy_to_peer(
        &self,
        _stream: &Self::Stream,
        _peer: &Self,
        _dst: DevicePtr,
        _src: DevicePtr,
        _bytes: usize,
    ) -> Result<()> {
        Err(crate::error::HiveGpuError::Internal("this runtime has no peer copies".into()))
    }
    /// Queues setting `bytes` bytes at `dst` to `value`.
    fn fill(&self, stream: &Self::Stream, dst: DevicePtr, value: u8, bytes: usize) -> Result<()>;
    /// Waits for everything queued on the stream.
    fn synchronize(&self, stream: &Self::Stream) -> Result<()>;
    /// A new event.
    fn event(&self) -> Result<Self::Event>;
    /// Marks the point reached by `stream`'s queued work.
    fn record(&self, event: &Self::Event, stream: &Self::Stream) -> Result<()>;
    /// Makes `stream`'s later work wait until the event's last recorded point is reached.
    fn wait(&self, stream: &Self::Stream, event: &Self::Event) -> Result<()>;

    /// Compiles `source` for this device and loads the named kernels, in order.
    fn compile(&self, source: &str, names: &[&str]) -> Result<Vec<Self::Function>>;
    /// Queues a kernel launch.
    fn launch(
        &self,
        stream: &Self::Stream,
        function: Self::Function,
        grid: (u32, u32),
        block: u32,
        shared_bytes: u32,
        args: &[Arg],
    ) -> Result<()>;
    /// Whether [`Driver::gemm_tn`] can run GEMMs of these inputs on a BLAS library within the
    /// error bounds the gates assume. Where it cannot, the engine runs its own GEMM kernel.
    fn has_gemm(&self, _inputs: GemmInputs) -> bool {
        true
    }
    /// Queues a GEMM (see [`GemmTn`]).
    fn gemm_tn(&self, stream: &Self::Stream, gemm: &GemmTn) -> Result<()>;
}
