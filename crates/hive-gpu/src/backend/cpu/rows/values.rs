//! The CPU rows' stored values: in memory, or still in a mapped collection file, searched where
//! they lie (`GpuContext::open_storage_mapped`): a collection larger than memory opens and
//! searches, the page cache holding what fits. The first change that adds rows copies them into
//! memory; removals stay tombstones and need no copy.

use std::marker::PhantomData;

use crate::error::{HiveGpuError, Result};
use crate::persist::MappedRows;
use crate::types::GpuBackendType;

/// Values of one element type, owned or mapped.
#[derive(Debug, Clone)]
pub(super) enum Values<T> {
    /// In memory.
    Owned(Vec<T>),
    /// The little-endian elements of a mapped file, aligned for `T` (checked by
    /// [`Values::mapped`]; the mapping never moves).
    Mapped(MappedRows, PhantomData<T>),
}

impl<T: bytemuck::Pod> Values<T> {
    /// `rows` as values, where their bytes can be read as `T` in place: aligned, a whole
    /// number of elements, on a little-endian machine (the file's order). None otherwise.
    pub(super) fn mapped(rows: &MappedRows) -> Option<Self> {
        let fits = cfg!(target_endian = "little") && bytemuck::try_cast_slice::<u8, T>(rows.bytes()).is_ok();
        fits.then(|| Self::Mapped(rows.clone(), PhantomData))
    }

    /// The values, wherever they are.
    pub(super) fn as_slice(&self) -> &[T] {
        match self {
            Self::Owned(values) => values,
            // Checked castable when made, and the bytes never move: the fallback is unreachable.
            Self::Mapped(rows, _) => bytemuck::try_cast_slice(rows.bytes()).unwrap_or(&[]),
        }
    }

    /// The values in memory, copied there first if they are mapped (within the process's
    /// memory budget): what every change that adds rows starts with.
    pub(super) fn owned(&mut self) -> Result<&mut Vec<T>> {
        if let Self::Mapped(..) = self {
            let mapped = self.as_slice();
            let bytes = std::mem::size_of_val(mapped) as u64;
            let too_much = |available: u64| HiveGpuError::VramLimitExceeded {
                backend: GpuBackendType::Cpu,
                requested: bytes,
                available,
            };
            crate::memory::claim(bytes).map_err(|(_, available)| too_much(available))?;
            let mut copy = Vec::new();
            copy.try_reserve_exact(mapped.len())
                .map_err(|_| too_much(crate::memory::available_bytes().unwrap_or(0)))?;
            copy.extend_from_slice(mapped);
            *self = Self::Owned(copy);
        }
        match self {
            Self::Owned(values) => Ok(values),
            Self::Mapped(..) => Err(HiveGpuError::Internal("mapped rows were not copied".into())),
        }
    }

    /// Keeps the first `len` values (a mapping keeps its prefix: no copy).
    pub(super) fn truncate(&mut self, len: usize) {
        match self {
            Self::Owned(values) => values.truncate(len),
            Self::Mapped(rows, _) => {
                *rows = rows.truncated(len * std::mem::size_of::<T>());
            }
        }
    }

    /// Bytes of heap the values hold (a mapping holds none: the page cache backs it).
    pub(super) fn heap_bytes(&self) -> usize {
        match self {
            Self::Owned(values) => values.capacity() * std::mem::size_of::<T>(),
            Self::Mapped(..) => 0,
        }
    }
}

impl<T: bytemuck::Pod> std::ops::Deref for Values<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

/// Asks the kernel to back the spare capacity of `values` with transparent huge pages, where
/// the system leaves that to each program (`/sys/kernel/mm/transparent_hugepage/enabled` set to
/// `madvise`, a common default): writing a fresh buffer of hundreds of megabytes then faults
/// once per 2 MiB instead of once per 4 KiB, which was most of the time of copying a collection
/// file's rows into memory (docs/PERFORMANCE.md, opening collections). A hint: a kernel that
/// refuses it changes nothing.
pub(super) fn advise_huge_pages<T>(values: &Vec<T>) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let size = std::mem::size_of::<T>();
        let start = values.as_ptr() as usize + values.len() * size;
        let end = values.as_ptr() as usize + values.capacity() * size;
        let (first, last) = (start.next_multiple_of(HUGE), end / HUGE * HUGE);
        if last > first {
            // SAFETY: the range lies inside this vector's own allocation (its spare capacity,
            // rounded inward to whole huge pages); MADV_HUGEPAGE changes only the page size the
            // kernel backs it with and reads or writes no memory.
            unsafe {
                libc::madvise(first as *mut libc::c_void, last - first, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = values;
}
