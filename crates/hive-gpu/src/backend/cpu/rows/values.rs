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

    /// Whether the values are a file's mapping, searched where they lie.
    pub(super) fn is_mapped(&self) -> bool {
        matches!(self, Self::Mapped(..))
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
