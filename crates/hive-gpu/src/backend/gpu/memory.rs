//! Owned device memory and the per-search workspace, both generic over the [`Driver`].

use std::sync::Arc;

use super::driver::{DevicePtr, Driver};
use crate::error::Result;

/// Device memory freed on drop.
#[derive(Debug)]
pub(super) struct DeviceBuffer<D: Driver> {
    driver: Arc<D>,
    ptr: DevicePtr,
    bytes: usize,
}

impl<D: Driver> DeviceBuffer<D> {
    pub(super) fn new(driver: &Arc<D>, bytes: usize) -> Result<Self> {
        let ptr = driver.alloc(bytes)?;
        Ok(Self { driver: driver.clone(), ptr, bytes })
    }

    pub(super) fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl<D: Driver> Drop for DeviceBuffer<D> {
    fn drop(&mut self) {
        self.driver.free(self.ptr);
    }
}

/// A device buffer that only grows, reused across searches so a search allocates nothing
/// once the sizes it needs have been seen.
#[derive(Debug)]
pub(super) struct Scratch<D: Driver> {
    buffer: Option<DeviceBuffer<D>>,
}

impl<D: Driver> Scratch<D> {
    pub(super) fn new() -> Self {
        Self { buffer: None }
    }

    /// A device pointer to at least `bytes` bytes.
    pub(super) fn get(&mut self, driver: &Arc<D>, bytes: usize) -> Result<DevicePtr> {
        if self.buffer.as_ref().is_none_or(|b| b.bytes() < bytes) {
            self.buffer = None;
            self.buffer = Some(DeviceBuffer::new(driver, bytes.next_power_of_two().max(256))?);
        }
        Ok(self.buffer.as_ref().map(|b| b.ptr()).unwrap_or(0))
    }
}

/// Growable page-locked host memory.
#[derive(Debug)]
pub(super) struct Staging<D: Driver> {
    buffer: Option<D::Pinned>,
    /// The buffer's device address ([`Driver::mapped`]), once asked: asked once per buffer,
    /// not once per search.
    device_address: Option<Option<DevicePtr>>,
}

impl<D: Driver> Staging<D> {
    pub(super) fn new() -> Self {
        Self { buffer: None, device_address: None }
    }

    pub(super) fn get(&mut self, driver: &D, bytes: usize) -> Result<&mut D::Pinned> {
        if self.buffer.as_ref().is_none_or(|b| b.len() < bytes) {
            self.buffer = None;
            self.device_address = None;
            self.buffer = Some(driver.pinned(bytes.next_power_of_two().max(4096))?);
        }
        match self.buffer.as_mut() {
            Some(b) => Ok(b),
            None => Err(crate::error::HiveGpuError::Internal("staging buffer missing".into())),
        }
    }

    /// The device address of at least `bytes` of this memory, where the driver maps it.
    pub(super) fn device_address(&mut self, driver: &D, bytes: usize) -> Result<Option<DevicePtr>> {
        self.get(driver, bytes)?;
        if self.device_address.is_none() {
            self.device_address = Some(self.buffer.as_ref().and_then(|b| driver.mapped(b)));
        }
        Ok(self.device_address.flatten())
    }
}

/// Everything one search needs on the device: its own stream, so concurrent searches never
/// share buffers. Checked out of a pool per search.
#[derive(Debug)]
pub(super) struct Workspace<D: Driver> {
    pub(super) stream: D::Stream,
    /// GEMMs run here while the main stream selects from the previous tile.
    pub(super) gemm_stream: D::Stream,
    /// `[gemm done, select done]` per tile buffer.
    pub(super) events: [[D::Event; 2]; 2],
    pub(super) tiles: [Scratch<D>; 2],
    pub(super) staging: Staging<D>,
    /// Small results, written by the kernels straight into host memory where the driver maps it.
    pub(super) results: Staging<D>,
    pub(super) inputs: Scratch<D>,
    pub(super) lists: Scratch<D>,
    pub(super) evicted: Scratch<D>,
    pub(super) thresholds: Scratch<D>,
    pub(super) outputs: Scratch<D>,
    pub(super) dist: Scratch<D>,
    pub(super) cand: Scratch<D>,
    pub(super) keys: Scratch<D>,
    pub(super) slots: Scratch<D>,
    pub(super) radix: Scratch<D>,
    /// The k pairs the linear selection of a long re-ranked list keeps, before they are sorted.
    pub(super) selected_keys: Scratch<D>,
    pub(super) selected_slots: Scratch<D>,
    /// The sample's norms, side by side.
    pub(super) sample_norms: Scratch<D>,
    /// The fused filter's per-query thresholds and smallest dropped entries.
    pub(super) fused_state: Scratch<D>,
    /// The fused filter's candidate buffers and their fill counts.
    pub(super) fused_cand: Scratch<D>,
    pub(super) fused_counts: Scratch<D>,
    /// The f32 rows rounded to f16 for one search on f16 tensor cores.
    pub(super) rounded_rows: Scratch<D>,
    /// A filtered search's skip words (`crate::slots::SearchMask`).
    pub(super) skip: Scratch<D>,
    /// What `skip` holds: the words of the filter and rows of this key, and how many rows
    /// pass them. A search of the same key uses them as they are (the same key means the same
    /// length, so `skip` was not reallocated meanwhile).
    pub(super) skip_for: Option<(FilterKey, usize)>,
    /// Page-locked memory the skip words go up from: their own, so that no other upload of a
    /// search waits for theirs.
    pub(super) skip_staging: Staging<D>,
    /// Set for the length of a filtered search: what its kernels read instead of the removed
    /// rows.
    pub(super) filtered: Option<Filtered>,
    /// The rows of the last gathered filtered search, reused by the next (only small ones are
    /// kept), and the device list of their slots.
    pub(super) gathered: Option<Gathered<D>>,
    pub(super) gather_slots: Scratch<D>,
}

/// What names a filtered search's inputs: the filter's [`crate::slots::SlotSet::stamp`] and
/// the rows' `GpuRows::rows_stamp`. Equal keys mean equal passing rows, so what a workspace
/// derived for one key serves the next search of it.
pub(super) type FilterKey = (u64, u64);

/// The passing rows of a filtered search, gathered on the device into rows of their own.
#[derive(Debug)]
pub(super) struct Gathered<D: Driver> {
    /// The copy: row i holds the collection's slot `passing[i]`.
    pub(super) rows: Box<super::rows::GpuRows<D>>,
    /// The collection's slots of the copy's rows, ascending.
    pub(super) passing: Vec<usize>,
    /// The filter and rows they were gathered for.
    pub(super) key: FilterKey,
}

/// The rows a filtered search reads.
#[derive(Debug, Clone, Copy)]
pub(super) struct Filtered {
    /// Device address of the skip words (bit set = not searched).
    pub(super) skip: DevicePtr,
    /// Rows the search may return.
    pub(super) live: usize,
}

impl<D: Driver> Workspace<D> {
    pub(super) fn new(driver: &D) -> Result<Self> {
        Ok(Self {
            stream: driver.stream(false)?,
            gemm_stream: driver.stream(true)?,
            events: [[driver.event()?, driver.event()?], [driver.event()?, driver.event()?]],
            tiles: [Scratch::new(), Scratch::new()],
            staging: Staging::new(),
            results: Staging::new(),
            inputs: Scratch::new(),
            lists: Scratch::new(),
            evicted: Scratch::new(),
            thresholds: Scratch::new(),
            outputs: Scratch::new(),
            dist: Scratch::new(),
            cand: Scratch::new(),
            keys: Scratch::new(),
            slots: Scratch::new(),
            radix: Scratch::new(),
            selected_keys: Scratch::new(),
            selected_slots: Scratch::new(),
            sample_norms: Scratch::new(),
            fused_state: Scratch::new(),
            fused_cand: Scratch::new(),
            rounded_rows: Scratch::new(),
            fused_counts: Scratch::new(),
            skip: Scratch::new(),
            skip_for: None,
            skip_staging: Staging::new(),
            filtered: None,
            gathered: None,
            gather_slots: Scratch::new(),
        })
    }
}
