//! A backend that wraps a real one and fails the calls a test plans: a device error or memory
//! running out in the middle of a write, to check that writes are all or nothing.

use std::sync::{Arc, Mutex};

use hive_gpu::{
    GpuBackend, GpuBackendType, GpuDeviceInfo, GpuDistanceMetric, HiveGpuError, Neighbor, RowStore,
    SearchPrecision, StoragePrecision,
};

/// Which call fails next.
#[derive(Debug, Default, Clone, Copy)]
pub struct Plan {
    /// Fail the append after this many more succeed.
    pub append_after: Option<usize>,
    /// The failing append first writes half of its rows (a torn write).
    pub torn: bool,
    /// Fail the next reservation.
    pub reserve: bool,
    /// Fail the next compaction.
    pub compact: bool,
}

pub fn injected(call: &str) -> HiveGpuError {
    HiveGpuError::CudaError { call: call.into(), message: "fault injected by the test".into() }
}

#[derive(Debug)]
pub struct FaultyBackend {
    pub inner: Arc<dyn GpuBackend>,
    pub plan: Arc<Mutex<Plan>>,
}

impl GpuBackend for FaultyBackend {
    fn backend_type(&self) -> GpuBackendType {
        self.inner.backend_type()
    }
    fn device_info(&self) -> GpuDeviceInfo {
        self.inner.device_info()
    }
    fn new_rows(
        &self,
        dim: usize,
        precision: StoragePrecision,
        search: SearchPrecision,
        tuning: &hive_gpu::Tuning,
    ) -> hive_gpu::Result<Box<dyn RowStore>> {
        Ok(Box::new(FaultyRows {
            inner: self.inner.new_rows(dim, precision, search, tuning)?,
            dim,
            plan: self.plan.clone(),
        }))
    }
}

#[derive(Debug)]
pub struct FaultyRows {
    inner: Box<dyn RowStore>,
    dim: usize,
    plan: Arc<Mutex<Plan>>,
}

impl RowStore for FaultyRows {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn reserve(&mut self, additional: usize) -> hive_gpu::Result<()> {
        if std::mem::take(&mut self.plan.lock().expect("plan").reserve) {
            return Err(injected("reserve"));
        }
        self.inner.reserve(additional)
    }
    fn append(&mut self, rows: &[f32]) -> hive_gpu::Result<()> {
        let mut plan = self.plan.lock().expect("plan");
        match plan.append_after {
            Some(0) => {
                plan.append_after = None;
                if plan.torn {
                    let half = rows.len() / self.dim / 2 * self.dim;
                    self.inner.append(&rows[..half])?;
                }
                Err(injected("append"))
            }
            Some(n) => {
                plan.append_after = Some(n - 1);
                self.inner.append(rows)
            }
            None => self.inner.append(rows),
        }
    }
    fn truncate(&mut self, len: usize) {
        self.inner.truncate(len)
    }
    fn tombstone(&mut self, slots: &[usize]) {
        self.inner.tombstone(slots)
    }
    fn compact(&mut self, keep: &[usize]) -> hive_gpu::Result<()> {
        if std::mem::take(&mut self.plan.lock().expect("plan").compact) {
            return Err(injected("compact"));
        }
        self.inner.compact(keep)
    }
    fn clear(&mut self) {
        self.inner.clear()
    }
    fn read_row(&self, slot: usize) -> hive_gpu::Result<Vec<f32>> {
        self.inner.read_row(slot)
    }
    fn memory_bytes(&self) -> usize {
        self.inner.memory_bytes()
    }
    fn knn(
        &self,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&hive_gpu::slots::SlotSet>,
    ) -> hive_gpu::Result<Vec<Vec<Neighbor>>> {
        self.inner.knn(queries, k, metric, allowed)
    }
    fn gather(&self, slots: &[usize]) -> hive_gpu::Result<Vec<f32>> {
        self.inner.gather(slots)
    }
    fn refine(
        &self,
        queries: &[f32],
        candidates: &hive_gpu::backend::Candidates,
        k: usize,
        metric: GpuDistanceMetric,
    ) -> hive_gpu::Result<Vec<Vec<Neighbor>>> {
        self.inner.refine(queries, candidates, k, metric)
    }
    fn select_k(&self, scores: &[f32], width: usize, k: usize) -> hive_gpu::Result<Vec<Vec<Neighbor>>> {
        self.inner.select_k(scores, width, k)
    }
    fn release_scratch(&self) {
        self.inner.release_scratch()
    }
}
