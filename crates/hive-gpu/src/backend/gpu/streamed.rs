//! Collections larger than the device: rows in page-locked host memory, streamed through the
//! device a window at a time for every search.
//!
//! A collection whose rows outgrow the device (or `Tuning::device_rows_bytes`) keeps them in
//! host pages of one window each (`Tuning::stream_window_bytes`, a whole number of 32-slot
//! words, so a page's removed and allowed slots are whole words of the collection's). Two
//! windows live on the device, each an ordinary [`GpuRows`] with room for one page: while the
//! engine's own search runs over page p in one window, a thread of its own uploads page p + 1
//! into the other (the copy engine, from page-locked memory, on the window's upload stream, a
//! few pieces at a time: `GpuRows::fill_window`); the windows' lists are merged on the host.
//! A large batch is searched in each window in pieces, several at once, as a device-resident
//! collection's batch is (`HostRows::search_window`).
//!
//! Exactness: a window's search is the device-resident search of its rows (exact top-k, f64
//! distances over the stored values, removed and filtered-out slots skipped), and the k best
//! of a union are among the k best of its parts. The merge keeps the earlier list's entry on
//! equal distances, and windows are searched in slot order, so ties still go to the lower slot:
//! the result is the device-resident one, entry for entry.
//!
//! What reads rows by slot (gather, read_row, saves) reads the pages on the host; `refine`
//! gathers each group of queries' candidates into a window and refines them there, so IVF and
//! graph searches over a streamed collection still end on the device.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rayon::prelude::*;

use super::Device;
use super::driver::Driver;
use super::memory::Staging;
use super::rows::GpuRows;
use crate::backend::{Candidates, Neighbor, RowStore};
use crate::error::{HiveGpuError, Result};
use crate::slots::SlotSet;
use crate::tuning::Tuning;
use crate::types::{GpuDistanceMetric, SearchPrecision, StoragePrecision};

/// Rows per task when host pages are written or their norms bounded in parallel.
const ROWS_PER_TASK: usize = 4096;

/// The device side of a streamed collection: its windows (two while the device has room for
/// them, else one, which searches without overlap) and the page-locked buffer a refine gathers
/// candidates into.
#[derive(Debug)]
struct Windows<D: Driver> {
    rows: Vec<GpuRows<D>>,
    gathered: Staging<D>,
}

/// A collection's rows in page-locked host memory, searched by streaming them through its
/// device (see the module documentation).
#[derive(Debug)]
pub(crate) struct HostRows<D: Driver> {
    device: Arc<Device<D>>,
    dim: usize,
    precision: StoragePrecision,
    search: SearchPrecision,
    tuning: Tuning,
    /// Rows per page and per window: a multiple of 32.
    page_rows: usize,
    /// Declared before the pages, so dropped first: no stream of a window outlives the pages
    /// it may read.
    windows: Mutex<Option<Windows<D>>>,
    /// The windows' device bytes while they exist: what `memory_bytes` reports without
    /// waiting for the windows' lock (held through a whole search).
    windows_bytes: AtomicUsize,
    pages: Vec<D::Pinned>,
    len: usize,
    dead: SlotSet,
    /// At least the largest squared norm any device computes for a stored row.
    max_sq_norm: f32,
}

impl<D: Driver> HostRows<D> {
    pub(super) fn new(
        device: Arc<Device<D>>,
        dim: usize,
        precision: StoragePrecision,
        search: SearchPrecision,
        tuning: Tuning,
    ) -> Self {
        let row_bytes = dim * precision.element_bytes();
        let mut window_bytes = tuning.stream_window_bytes;
        // Two windows' rows, norms and removed words within the lowered room...
        if let Some(limit) = tuning.device_rows_bytes {
            window_bytes = window_bytes.min(limit / 2 / (row_bytes + 5) * row_bytes);
        }
        // ...and two of them within a quarter of the device's free memory, leaving room for
        // the searches' own buffers.
        if let Ok((free, _)) = device.driver.mem_info() {
            window_bytes = window_bytes.min(free / 8);
        }
        // At most i32::MAX rows a page, whatever the knob and free memory say: a window's
        // arrays are sized from it (`GpuRows::window`) and its rows numbered in 32 bits.
        let page_rows = ((window_bytes / row_bytes.max(1)).min(i32::MAX as usize) / 32 * 32).max(32);
        Self {
            device,
            dim,
            precision,
            search,
            tuning,
            page_rows,
            windows: Mutex::new(None),
            windows_bytes: AtomicUsize::new(0),
            pages: Vec::new(),
            len: 0,
            dead: SlotSet::default(),
            max_sq_norm: 0.0,
        }
    }

    /// The rows of `rows` (a device-resident collection that ran out of room), moved to host
    /// pages with room for `additional` more: their stored elements copied as they are, their
    /// removed slots kept.
    pub(super) fn spilled_from(rows: &GpuRows<D>, additional: usize) -> Result<Self> {
        let mut host =
            Self::new(rows.device.clone(), rows.dim, rows.precision, rows.search, rows.tuning.clone());
        host.reserve(rows.len.saturating_add(additional))?;
        let (precision, dim) = (rows.precision, rows.dim);
        rows.read_stored(0, rows.len, precision, &mut |bytes| host.append_stored(bytes, precision, dim))?;
        for slot in rows.dead.iter().filter(|&s| s < rows.len) {
            host.dead.set(slot, true);
        }
        Ok(host)
    }

    fn row_bytes(&self) -> usize {
        self.dim * self.precision.element_bytes()
    }

    pub(super) fn dim(&self) -> usize {
        self.dim
    }

    /// Empty device-resident rows of this collection's kind: where a cleared collection
    /// starts again.
    pub(super) fn empty_on_device(&self) -> Result<GpuRows<D>> {
        GpuRows::new(self.device.clone(), self.dim, self.precision, self.search, self.tuning.clone())
    }

    /// The windows' lock, held for the whole of a search: searches of one streamed collection
    /// run one at a time (each would need windows of its own, and they share one host-to-device
    /// link anyway). A search that panicked leaves no windows behind: the next makes them anew.
    fn windows(&self) -> Result<MutexGuard<'_, Option<Windows<D>>>> {
        Ok(self.windows.lock().unwrap_or_else(|poisoned| {
            let mut windows = poisoned.into_inner();
            *windows = None;
            self.windows_bytes.store(0, Ordering::Relaxed);
            windows
        }))
    }

    /// The windows, made on first use: two with room for a page each, or one where the device
    /// has room for only one.
    fn ready_windows<'a>(&self, guard: &'a mut Option<Windows<D>>) -> Result<&'a mut Windows<D>> {
        if guard.is_none() {
            // The pages are sized to fit `device_rows_bytes` already (but for their 32-row
            // floor): the windows do not ask the knob again.
            let mut tuning = self.tuning.clone();
            tuning.device_rows_bytes = None;
            let window = || {
                GpuRows::window(
                    self.device.clone(),
                    self.dim,
                    self.precision,
                    self.search,
                    tuning.clone(),
                    self.page_rows,
                )
            };
            let first = window()?;
            let rows = match window() {
                Ok(second) => vec![first, second],
                Err(HiveGpuError::VramLimitExceeded { .. }) => vec![first],
                Err(e) => return Err(e),
            };
            self.windows_bytes.store(rows.iter().map(|r| r.memory_bytes()).sum(), Ordering::Relaxed);
            *guard = Some(Windows { rows, gathered: Staging::new() });
        }
        guard.as_mut().ok_or_else(|| HiveGpuError::Internal("streamed windows missing".into()))
    }

    /// The stored elements of slots `start..start + count` within one page.
    fn page_bytes(&self, start: usize, count: usize) -> &[u8] {
        let row_bytes = self.row_bytes();
        let offset = (start % self.page_rows) * row_bytes;
        &self.pages[start / self.page_rows][offset..offset + count * row_bytes]
    }

    /// Writes whole rows at slots `self.len..`, page by page, and raises the norm bound over
    /// them; the room was reserved.
    fn write_rows(&mut self, incoming: Incoming<'_>) -> Result<()> {
        let (dim, row_bytes, precision) = (self.dim, self.row_bytes(), self.precision);
        let count = match incoming {
            Incoming::Values(values) => values.len() / dim,
            Incoming::Stored(bytes) => bytes.len() / row_bytes,
        };
        let mut written = 0;
        let mut max = 0f64;
        while written < count {
            let slot = self.len + written;
            let (page, at) = (slot / self.page_rows, slot % self.page_rows);
            let rows = (self.page_rows - at).min(count - written);
            let dst = &mut self.pages[page][at * row_bytes..(at + rows) * row_bytes];
            let task = |(task, dst): (usize, &mut [u8])| {
                let first = written + task * ROWS_PER_TASK;
                let n = dst.len() / row_bytes;
                match incoming {
                    Incoming::Values(values) => crate::exact::elements::narrow_into(
                        &values[first * dim..(first + n) * dim],
                        precision,
                        dst,
                    ),
                    Incoming::Stored(bytes) => {
                        dst.copy_from_slice(&bytes[first * row_bytes..(first + n) * row_bytes])
                    }
                }
                super::rows::largest_squared_norm(dst, precision, dim)
            };
            let chunk = ROWS_PER_TASK * row_bytes;
            // One task's worth on this thread; more on the library's pool, never on a pool of
            // the caller's (a parallel iterator outside `exec::run` would run on rayon's global
            // pool while the collection's lock is held).
            let largest = if rows <= ROWS_PER_TASK {
                dst.chunks_mut(chunk).enumerate().map(task).fold(0.0, f64::max)
            } else {
                crate::exec::run(|| dst.par_chunks_mut(chunk).enumerate().map(task).reduce(|| 0.0, f64::max))?
            };
            max = max.max(largest);
            written += rows;
        }
        self.len += count;
        self.max_sq_norm = self.max_sq_norm.max(super::rows::device_sq_norm_bound(max, dim));
        Ok(())
    }

    /// The searchable rows of each page (live, and members of `allowed` when given), with the
    /// page's removed and allowed slots renumbered from its first.
    fn page_masks(&self, allowed: Option<&SlotSet>) -> Vec<(usize, SlotSet, Option<SlotSet>, usize)> {
        (0..self.len.div_ceil(self.page_rows))
            .map(|page| {
                let start = page * self.page_rows;
                let rows = self.page_rows.min(self.len - start);
                let dead = self.dead.window(start, rows);
                let allowed = allowed.map(|a| a.window(start, rows));
                let searchable = match &allowed {
                    Some(allowed) => allowed.and_not(&dead).count(),
                    None => rows - dead.count(),
                };
                (rows, dead, allowed, searchable)
            })
            .collect()
    }

    /// One window's k nearest rows for each query: a large batch in pieces of about
    /// `Tuning::piece_queries`, `Tuning::piece_workers` of them searched at once, as the
    /// collection's batches are on a device-resident collection (where one piece's host work
    /// overlaps another's device work); a streamed collection's batch reaches its store whole
    /// (one piece would otherwise stream every row once per piece).
    fn search_window(
        &self,
        window: &GpuRows<D>,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let (dim, nq) = (self.dim, queries.len() / self.dim);
        let pieces = crate::exec::Pieces::of(nq, &self.tuning);
        if pieces.count == 1 {
            return window.knn(queries, k, metric, allowed);
        }
        let (count, workers) = (pieces.count, pieces.workers);
        let range = |i: usize| pieces.range(i, nq);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let done: Vec<std::sync::OnceLock<Result<Vec<Vec<Neighbor>>>>> =
            (0..count).map(|_| std::sync::OnceLock::new()).collect();
        let failed = std::sync::atomic::AtomicBool::new(false);
        let work = || {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(slot) = done.get(i) else { break };
                if failed.load(Ordering::Relaxed) {
                    break;
                }
                let r = range(i);
                let found = window.knn(&queries[r.start * dim..r.end * dim], k, metric, allowed);
                failed.fetch_or(found.is_err(), Ordering::Relaxed);
                let _ = slot.set(found);
            }
        };
        std::thread::scope(|scope| {
            for w in 0..workers.min(count) {
                // A worker the OS refuses leaves its pieces to the others (and to this thread).
                let _ = std::thread::Builder::new()
                    .name(format!("hive-gpu-window-{w}"))
                    .spawn_scoped(scope, work);
            }
            work();
        });
        let mut found = Vec::with_capacity(nq);
        for (i, piece) in done.into_iter().enumerate() {
            let piece = match piece.into_inner() {
                Some(Ok(piece)) => piece,
                // Pieces side by side need more device memory than one alone (as in
                // `index/flat.rs`): one that ran out of it, and those skipped after it, run
                // again on their own once the window's idle workspaces are freed.
                Some(Err(HiveGpuError::VramLimitExceeded { .. })) | None => {
                    window.release_scratch();
                    let r = range(i);
                    window.knn(&queries[r.start * dim..r.end * dim], k, metric, allowed)?
                }
                Some(Err(e)) => return Err(e),
            };
            found.extend(piece);
        }
        Ok(found)
    }

    /// Refines `queries` against `lists` (each ascending, live, in range, together at most a
    /// window's rows): their rows gathered into a window and refined there, the slots mapped
    /// back.
    fn refine_gathered(
        &self,
        windows: &mut Windows<D>,
        queries: &[f32],
        lists: &[Vec<usize>],
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let mut union: Vec<usize> = lists.iter().flatten().copied().collect();
        union.sort_unstable();
        union.dedup();
        let row_bytes = self.row_bytes();
        let staging = windows.gathered.get(&self.device.driver, (union.len() * row_bytes).max(1))?;
        for (dst, &slot) in staging.chunks_exact_mut(row_bytes).zip(&union) {
            dst.copy_from_slice(self.page_bytes(slot, 1));
        }
        let window = &mut windows.rows[0];
        window.fill_window(staging, union.len(), SlotSet::empty(union.len()), self.max_sq_norm)?;
        let renumbered: Vec<Vec<usize>> = lists
            .iter()
            .map(|list| list.iter().map(|slot| union.binary_search(slot).unwrap_or(0)).collect())
            .collect();
        let found = window.refine(queries, &Candidates::from_lists(&renumbered), k, metric)?;
        Ok(crate::backend::ungather(found, &union))
    }
}

/// Rows being appended: f32 values (narrowed to the stored type) or stored elements.
#[derive(Clone, Copy)]
enum Incoming<'a> {
    Values(&'a [f32]),
    Stored(&'a [u8]),
}

/// Merges `found` (a later window's list, best first) into `best` (the lists of the windows
/// before it), keeping the `k` best; on equal distances `best`'s entry stays first, since it
/// holds lower slots.
pub(super) fn merge_lists(best: &mut Vec<Neighbor>, found: &[Neighbor], k: usize) {
    if found.is_empty() {
        return;
    }
    let mut merged = Vec::with_capacity(k.min(best.len() + found.len()));
    let (mut i, mut j) = (0, 0);
    while merged.len() < k && (i < best.len() || j < found.len()) {
        if j < found.len() && (i == best.len() || found[j].distance < best[i].distance) {
            merged.push(found[j]);
            j += 1;
        } else {
            merged.push(best[i]);
            i += 1;
        }
    }
    *best = merged;
}

/// Folds each query's list of one window (slots renumbered from `offset`) into the running
/// lists, in parallel for large batches.
fn merge_window(
    best: &mut [Vec<Neighbor>],
    found: Vec<Vec<Neighbor>>,
    offset: usize,
    k: usize,
) -> Result<()> {
    let merge = |(best, mut found): (&mut Vec<Neighbor>, Vec<Neighbor>)| {
        for n in &mut found {
            n.slot += offset;
        }
        merge_lists(best, &found, k);
    };
    // Small batches on this thread; large ones on the library's pool, never on rayon's global
    // pool (this runs under the windows' lock).
    if best.len() * k < crate::backend::PARALLEL_RESULTS {
        best.iter_mut().zip(found).for_each(merge);
        Ok(())
    } else {
        crate::exec::run(|| best.par_iter_mut().zip(found.into_par_iter()).for_each(merge))
    }
}

impl<D: Driver> RowStore for HostRows<D> {
    fn len(&self) -> usize {
        self.len
    }

    fn reserve(&mut self, additional: usize) -> Result<()> {
        let needed =
            self.len.checked_add(additional).filter(|&n| n <= i32::MAX as usize).ok_or_else(|| {
                HiveGpuError::InvalidArgument(format!(
                    "a GPU collection holds at most {} vectors ({} present, {additional} more asked)",
                    i32::MAX,
                    self.len
                ))
            })?;
        let pages = needed.div_ceil(self.page_rows);
        if pages > self.pages.len() {
            let page_bytes = self.page_rows * self.row_bytes();
            let more = (pages - self.pages.len()) as u64 * page_bytes as u64;
            let what = || {
                format!("{} more pages of streamed rows in page-locked host memory", pages - self.pages.len())
            };
            crate::memory::check(what, more)?;
            self.pages.try_reserve(pages - self.pages.len()).map_err(|_| HiveGpuError::OutOfMemory {
                what: "the list of streamed pages".into(),
                requested: more,
                available: crate::memory::available_bytes().unwrap_or(0),
                limited_by: "the allocator".into(),
            })?;
            while self.pages.len() < pages {
                self.pages.push(self.device.driver.pinned(page_bytes)?);
            }
        }
        self.dead.try_reserve(needed).map_err(|_| HiveGpuError::OutOfMemory {
            what: "removed slots of streamed rows".into(),
            requested: (needed / 8) as u64,
            available: crate::memory::available_bytes().unwrap_or(0),
            limited_by: "the allocator".into(),
        })?;
        Ok(())
    }

    fn append(&mut self, rows: &[f32]) -> Result<()> {
        crate::exact::elements::check_storable(rows, self.precision)?;
        if !rows.len().is_multiple_of(self.dim) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "append needs whole {}-dimensional rows ({} values)",
                self.dim,
                rows.len()
            )));
        }
        self.reserve(rows.len() / self.dim)?;
        self.write_rows(Incoming::Values(rows))
    }

    fn append_stored(&mut self, bytes: &[u8], precision: StoragePrecision, dim: usize) -> Result<()> {
        if precision != self.precision || dim != self.dim || cfg!(target_endian = "big") {
            return crate::backend::append_widened(self, bytes, precision, dim);
        }
        if !bytes.len().is_multiple_of(self.row_bytes()) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "{} bytes are not whole stored rows of dimension {dim}",
                bytes.len()
            )));
        }
        self.reserve(bytes.len() / self.row_bytes())?;
        self.write_rows(Incoming::Stored(bytes))
    }

    fn read_stored(
        &self,
        start: usize,
        count: usize,
        precision: StoragePrecision,
        out: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        crate::backend::check_row_range(start, count, self.len)?;
        if precision != self.precision || cfg!(target_endian = "big") {
            let slots: Vec<usize> = (start..start + count).collect();
            return out(&crate::exact::elements::narrow(&self.gather(&slots)?, precision));
        }
        // The pages are the stored elements: handed out as they are, a page's part at a time.
        let mut slot = start;
        while slot < start + count {
            let rows = (self.page_rows - slot % self.page_rows).min(start + count - slot);
            out(self.page_bytes(slot, rows))?;
            slot += rows;
        }
        Ok(())
    }

    fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.len = len;
            self.dead.clear_from(len);
        }
    }

    fn tombstone(&mut self, slots: &[usize]) {
        for &slot in slots {
            if slot < self.len {
                self.dead.set(slot, true);
            }
        }
    }

    fn compact(&mut self, keep: &[usize]) -> Result<()> {
        if keep.windows(2).any(|w| w[0] >= w[1]) || keep.last().is_some_and(|&s| s >= self.len) {
            return Err(HiveGpuError::InvalidArgument("compact needs ascending slots in range".into()));
        }
        // Slot keep[i] >= i, so moving rows forward in order never overwrites one still to move.
        let (row_bytes, page_rows) = (self.row_bytes(), self.page_rows);
        for (to, &from) in keep.iter().enumerate() {
            if to == from {
                continue;
            }
            let (to_page, to_at) = (to / page_rows, (to % page_rows) * row_bytes);
            let (from_page, from_at) = (from / page_rows, (from % page_rows) * row_bytes);
            if to_page == from_page {
                self.pages[to_page].copy_within(from_at..from_at + row_bytes, to_at);
            } else {
                let (low, high) = self.pages.split_at_mut(from_page);
                low[to_page][to_at..to_at + row_bytes]
                    .copy_from_slice(&high[0][from_at..from_at + row_bytes]);
            }
        }
        self.len = keep.len();
        self.dead.reset(self.len);
        self.pages.truncate(self.len.div_ceil(page_rows));
        Ok(())
    }

    fn clear(&mut self) {
        self.pages = Vec::new();
        self.len = 0;
        self.dead = SlotSet::default();
        self.max_sq_norm = 0.0;
        self.release_scratch();
    }

    fn read_row(&self, slot: usize) -> Result<Vec<f32>> {
        if slot >= self.len {
            return Err(HiveGpuError::InvalidArgument(format!("slot {slot} of {}", self.len)));
        }
        let mut row = Vec::with_capacity(self.dim);
        crate::exact::elements::widen(self.page_bytes(slot, 1), self.precision, &mut row);
        Ok(row)
    }

    fn memory_bytes(&self) -> usize {
        self.windows_bytes.load(Ordering::Relaxed)
    }

    fn knn(
        &self,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        crate::backend::candidates::check_finite_queries("knn", self.dim, queries)?;
        let masks = self.page_masks(allowed);
        let searchable: usize = masks.iter().map(|m| m.3).sum();
        if k == 0 || k > searchable || !queries.len().is_multiple_of(self.dim) || queries.is_empty() {
            return Err(HiveGpuError::InvalidArgument(format!(
                "knn needs 1 <= k <= {searchable} live rows (k = {k}) and whole {}-dimensional queries ({} values)",
                self.dim,
                queries.len()
            )));
        }
        let nq = queries.len() / self.dim;
        let mut guard = self.windows()?;
        let windows = self.ready_windows(&mut guard)?;
        let visited: Vec<usize> = (0..masks.len()).filter(|&p| masks[p].3 > 0).collect();
        let fill = |window: &mut GpuRows<D>, page: usize| {
            let (rows, dead, _, _) = &masks[page];
            window.fill_window(&self.pages[page], *rows, dead.clone(), self.max_sq_norm)
        };
        let search = |window: &GpuRows<D>, page: usize| {
            let (_, _, page_allowed, searchable) = &masks[page];
            self.search_window(window, queries, k.min(*searchable), metric, page_allowed.as_ref())
        };
        fill(&mut windows.rows[0], visited[0])?;
        let mut best = vec![Vec::new(); nq];
        for (i, &page) in visited.iter().enumerate() {
            let current = i % windows.rows.len();
            let next = visited.get(i + 1).copied();
            let found = match (next, windows.rows.split_at_mut(1)) {
                // Two windows: the next page goes up on a thread of its own while this one is
                // searched here.
                (Some(next), (first, [second])) => {
                    let (searched, filled) =
                        if current == 0 { (&first[0], second) } else { (&*second, &mut first[0]) };
                    std::thread::scope(|scope| {
                        let feeder = std::thread::Builder::new()
                            .name("hive-gpu-stream".into())
                            .spawn_scoped(scope, || fill(filled, next));
                        let found = search(searched, page);
                        let filled = feeder.ok().map(|feeder| {
                            feeder.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                        });
                        (found, filled)
                    })
                }
                (next, _) => {
                    let found = search(&windows.rows[current], page);
                    (found, next.map(|next| fill(&mut windows.rows[0], next)))
                }
            };
            let (found, filled) = found;
            merge_window(&mut best, found?, page * self.page_rows, k)?;
            match (filled, next) {
                (Some(filled), _) => filled?,
                // No thread to spare for the feeder: the next page goes up after this search.
                (None, Some(next)) => fill(&mut windows.rows[1 - current], next)?,
                (None, None) => {}
            }
        }
        Ok(best)
    }

    fn gather(&self, slots: &[usize]) -> Result<Vec<f32>> {
        if let Some(&slot) = slots.iter().find(|&&s| s >= self.len) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "gather: slot {slot} is past the {} stored rows",
                self.len
            )));
        }
        let what = || format!("gathering {} rows", slots.len());
        crate::memory::check(what, (slots.len() * self.dim * 4) as u64)?;
        let mut values = Vec::with_capacity(slots.len() * self.dim);
        let mut row = Vec::with_capacity(self.dim);
        for &slot in slots {
            // `widen` replaces what its output held: one row at a time, then appended.
            crate::exact::elements::widen(self.page_bytes(slot, 1), self.precision, &mut row);
            values.extend_from_slice(&row);
        }
        Ok(values)
    }

    fn refine(
        &self,
        queries: &[f32],
        candidates: &Candidates,
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let nq = crate::backend::candidates::check_refine(self.dim, queries, candidates, k)?;
        let lists = (0..nq)
            .map(|q| crate::backend::candidates::live_candidates(candidates, q, self.len, &self.dead))
            .collect::<Result<Vec<_>>>()?;
        let mut guard = self.windows()?;
        let windows = self.ready_windows(&mut guard)?;
        let (dim, capacity) = (self.dim, self.page_rows);
        let mut results = Vec::with_capacity(nq);
        let mut q = 0;
        while q < nq {
            if lists[q].len() > capacity {
                // More candidates than a window holds: refined a window's worth at a time.
                let mut best = Vec::new();
                for piece in lists[q].chunks(capacity) {
                    let found = self.refine_gathered(
                        windows,
                        &queries[q * dim..(q + 1) * dim],
                        &[piece.to_vec()],
                        k,
                        metric,
                    )?;
                    merge_lists(&mut best, &found[0], k);
                }
                results.push(best);
                q += 1;
                continue;
            }
            // Queries whose lists together fit a window are refined together.
            let (mut end, mut total) = (q, 0);
            while end < nq && total + lists[end].len() <= capacity {
                total += lists[end].len();
                end += 1;
            }
            let found = if total == 0 {
                vec![Vec::new(); end - q]
            } else {
                self.refine_gathered(windows, &queries[q * dim..end * dim], &lists[q..end], k, metric)?
            };
            results.extend(found);
            q = end;
        }
        Ok(results)
    }

    fn select_k(&self, scores: &[f32], width: usize, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        let mut guard = self.windows()?;
        self.ready_windows(&mut guard)?.rows[0].select_k(scores, width, k)
    }

    fn scan_codes(&self, scan: &crate::backend::CodeScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        let mut guard = self.windows()?;
        self.ready_windows(&mut guard)?.rows[0].scan_codes(scan, k)
    }

    fn scan_pq(&self, scan: &crate::backend::PqScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        let mut guard = self.windows()?;
        self.ready_windows(&mut guard)?.rows[0].scan_pq(scan, k)
    }

    fn scan_bits(&self, scan: &crate::backend::BitScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        let mut guard = self.windows()?;
        self.ready_windows(&mut guard)?.rows[0].scan_bits(scan, k)
    }

    fn release_scratch(&self) {
        // The windows are device memory kept between searches: the next search makes them again.
        if let Ok(mut windows) = self.windows() {
            *windows = None;
            self.windows_bytes.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[(usize, f64)]) -> Vec<Neighbor> {
        entries.iter().map(|&(slot, distance)| Neighbor { slot, distance }).collect()
    }

    #[test]
    fn merging_windows_keeps_the_k_best_and_gives_ties_to_the_earlier_lower_slot() {
        let mut best = list(&[(3, 1.0), (7, 2.0), (9, 4.0)]);
        merge_lists(&mut best, &list(&[(40, 0.5), (41, 2.0), (42, 3.0)]), 4);
        assert_eq!(best, list(&[(40, 0.5), (3, 1.0), (7, 2.0), (41, 2.0)]));
        // Fewer entries than k: all of them, in order.
        let mut best = list(&[(1, 1.0)]);
        merge_lists(&mut best, &list(&[(50, 1.0)]), 10);
        assert_eq!(best, list(&[(1, 1.0), (50, 1.0)]));
        let mut best = Vec::new();
        merge_lists(&mut best, &list(&[(5, 0.0)]), 1);
        assert_eq!(best, list(&[(5, 0.0)]));
    }
}
