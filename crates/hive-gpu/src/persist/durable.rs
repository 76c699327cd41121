//! Durable collections ([`crate::GpuContext::open_durable`]): a snapshot file plus an
//! append-only write-ahead log next to it (`<snapshot>.wal`, format in `docs/FORMAT.md`).
//!
//! Every write (upsert, removal, clear) is applied to the collection and appended to the log
//! under the collection's write lock, so the log's order is the order writes took effect. The
//! writer then releases the lock and waits until its record is durable ([`Durability`]):
//! group commit. Whichever waiting writer finds no flush in progress becomes the flusher: it
//! takes every record appended so far, writes them with one `write` and (for
//! [`Durability::Disk`]) one `fdatasync`, and wakes everyone whose record that covered. While
//! it flushes, other writers apply and append theirs, and the next flush takes them all, so
//! concurrent writers share flushes instead of queueing for one each.
//!
//! A checkpoint writes a new snapshot (the atomic save of `persist::save`) and then a fresh
//! log naming that snapshot as its base, by the same write-sync-rename-sync steps. On open, a
//! log whose base is not the current snapshot is one a checkpoint already folded in (a crash
//! came between the snapshot's rename and the log's) and is replaced, never replayed twice.
//!
//! A failed flush leaves the collection with writes the log may lack: the log refuses every
//! later write with the error until a checkpoint (which writes everything) succeeds.

use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::log::{self, Change, LOG_HEADER_BYTES, PendingRecord, SnapshotId};
use super::{Vectors, io_error, sync_directory_of, temporary_path};
use crate::collection::{Batch, Collection};
use crate::error::{HiveGpuError, Result};

/// When a durable collection acknowledges a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// After the write's log record is on the disk (`fdatasync`, shared by concurrent writers):
    /// an acknowledged write survives the process being killed, the operating system crashing
    /// and the power failing.
    Disk,
    /// After the write's log record is in the operating system's file cache (`write`, shared by
    /// concurrent writers, no `fdatasync`): an acknowledged write survives the process being
    /// killed (SIGKILL, a panic, an abort) but not an operating-system crash or a power
    /// failure. Many times faster where the disk's flushes are slow (docs/PERFORMANCE.md).
    Process,
}

/// How a durable collection is kept (see [`crate::GpuContext::open_durable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DurableOptions {
    /// When writes are acknowledged.
    pub durability: Durability,
    /// A write that leaves the log longer than this many bytes also checkpoints (writes a
    /// snapshot and empties the log), bounding the log's size and the replay at the next open.
    /// `u64::MAX` checkpoints only when asked ([`crate::GpuVectorStorage::checkpoint`]).
    pub checkpoint_log_bytes: u64,
}

impl Default for DurableOptions {
    /// [`Durability::Disk`], checkpointing once the log passes 256 MiB.
    fn default() -> Self {
        Self { durability: Durability::Disk, checkpoint_log_bytes: 256 << 20 }
    }
}

impl DurableOptions {
    /// These options with `durability`.
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// These options with `bytes` as the log length that triggers a checkpoint.
    pub fn with_checkpoint_log_bytes(mut self, bytes: u64) -> Self {
        self.checkpoint_log_bytes = bytes;
        self
    }
}

/// Counters of a durable collection's log since it was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LogStats {
    /// Writes logged.
    pub records: u64,
    /// Flushes (one `write`, and one `fdatasync` under [`Durability::Disk`], each).
    pub flushes: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// The log's length now, header included.
    pub log_bytes: u64,
    /// Records replayed when the collection was opened.
    pub replayed: u64,
    /// Bytes of a torn last record dropped when the collection was opened.
    pub torn_bytes: u64,
}

/// Which write a waiting writer waits for: the count of records appended when its own was.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticket(u64);

#[derive(Debug)]
struct LogState {
    /// The log file, opened for appending and locked for this process.
    file: Arc<File>,
    /// Records appended and not yet handed to a flush.
    pending: Vec<u8>,
    /// The next record's sequence number in this log file (from 1).
    next_sequence: u64,
    /// Records appended since the collection opened (tickets count these).
    appended: u64,
    /// Of those, how many are durable.
    durable: u64,
    /// Whether a writer is flushing now.
    flushing: bool,
    /// Bumped by each checkpoint: a flush of an older log file that ends afterwards changes
    /// nothing (its records are in the snapshot).
    generation: u64,
    /// A flush's failure, refusing writes until a checkpoint succeeds.
    failed: Option<String>,
    /// Records handed to flushes so far (of `appended`).
    taken: u64,
    /// Records the last flush took, and how long it took: what the next flusher gathers
    /// for (see [`Log::wait`]).
    last_batch: u64,
    last_flush: Duration,
    /// Whether a flusher is waiting for appends.
    gathering: bool,
    stats: LogStats,
}

/// The longest a flusher holds its flush back to gather more writers' records.
const MAX_GATHER: Duration = Duration::from_millis(1);

/// A durable collection's log (see the module documentation).
#[derive(Debug)]
pub(crate) struct Log {
    snapshot: PathBuf,
    path: PathBuf,
    options: DurableOptions,
    state: Mutex<LogState>,
    flushed: Condvar,
    /// Signalled by appends while a flusher gathers.
    appended: Condvar,
    /// One checkpoint at a time.
    checkpointing: Mutex<()>,
}

/// The log's path for the snapshot at `snapshot`: the same name with `.wal` added.
pub(crate) fn log_path(snapshot: &Path) -> PathBuf {
    let mut name = snapshot.file_name().unwrap_or_default().to_os_string();
    name.push(".wal");
    snapshot.with_file_name(name)
}

fn lock_error(path: &Path) -> impl Fn(std::fs::TryLockError) -> HiveGpuError + '_ {
    move |e| match e {
        std::fs::TryLockError::WouldBlock => HiveGpuError::InvalidArgument(format!(
            "{} is held by another open durable collection (in this process or another)",
            path.display()
        )),
        std::fs::TryLockError::Error(source) => HiveGpuError::Io { path: path.to_path_buf(), source },
    }
}

/// Writes a fresh log continuing `base` at `path`: a new file with just the header, synced,
/// locked, renamed over whatever was there, the directory synced. Returns it open for
/// appending.
fn create_log(path: &Path, base: SnapshotId) -> Result<File> {
    let temporary = temporary_path(path);
    let made = (|| {
        let io = io_error(&temporary);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .open(&temporary)
            .map_err(&io)?;
        file.write_all(&log::encode_header(base)).map_err(&io)?;
        file.sync_all().map_err(&io)?;
        file.try_lock().map_err(lock_error(path))?;
        std::fs::rename(&temporary, path).map_err(io_error(path))?;
        sync_directory_of(path)?;
        Ok(file)
    })();
    if made.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    made
}

impl Log {
    fn lock(&self) -> MutexGuard<'_, LogState> {
        // Every update of the state is a few assignments that cannot panic halfway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn new(
        snapshot: &Path,
        file: File,
        options: DurableOptions,
        next_sequence: u64,
        stats: LogStats,
    ) -> Self {
        Self {
            snapshot: snapshot.to_path_buf(),
            path: log_path(snapshot),
            options,
            state: Mutex::new(LogState {
                file: Arc::new(file),
                pending: Vec::new(),
                next_sequence,
                appended: 0,
                durable: 0,
                flushing: false,
                generation: 0,
                failed: None,
                taken: 0,
                last_batch: 0,
                last_flush: Duration::ZERO,
                gathering: false,
                stats,
            }),
            flushed: Condvar::new(),
            appended: Condvar::new(),
            checkpointing: Mutex::new(()),
        }
    }

    /// The snapshot this log continues.
    pub(crate) fn snapshot(&self) -> &Path {
        &self.snapshot
    }

    /// Starts a durable collection at `snapshot` from `collection` (empty, or just loaded from
    /// a file that has no usable log): writes the snapshot and a fresh log.
    pub(crate) fn create(snapshot: &Path, collection: &Collection, options: DurableOptions) -> Result<Self> {
        let path = log_path(snapshot);
        // Whoever holds the old log (if any) must not be writing to it while it is replaced.
        let _old = hold_existing(&path)?;
        let base = super::save(collection, snapshot)?;
        let file = create_log(&path, base)?;
        let stats = LogStats { log_bytes: LOG_HEADER_BYTES as u64, ..LogStats::default() };
        Ok(Self::new(snapshot, file, options, 1, stats))
    }

    /// Opens the log of the snapshot at `snapshot` (whose identity is `base` and which has
    /// been loaded into `collection`) and replays it into `collection`. A torn last record is
    /// cut off the file; a log of an older snapshot is replaced by a fresh one.
    pub(crate) fn open(
        snapshot: &Path,
        base: SnapshotId,
        collection: &mut Collection,
        options: DurableOptions,
    ) -> Result<Self> {
        let path = log_path(snapshot);
        let Some(file) = hold_existing(&path)? else {
            let file = create_log(&path, base)?;
            let stats = LogStats { log_bytes: LOG_HEADER_BYTES as u64, ..LogStats::default() };
            return Ok(Self::new(snapshot, file, options, 1, stats));
        };
        let image = super::read_image(&path)?;
        let invalid = |reason: String| HiveGpuError::InvalidFormat {
            path: path.clone(),
            format: LOG_FORMAT_NAME,
            reason,
        };
        let stale = match log::scan_header(&image) {
            // A log of an earlier snapshot: a checkpoint folded it in, then stopped before
            // replacing it.
            Ok(logged) => logged != base,
            // The empty file a crash can leave where a log was being created.
            Err(_) if image.is_empty() => true,
            Err(e) => return Err(invalid(e.to_string())),
        };
        if stale {
            // The old file stays locked until the new one has replaced it.
            let fresh = create_log(&path, base)?;
            drop(file);
            let file = fresh;
            let stats = LogStats { log_bytes: LOG_HEADER_BYTES as u64, ..LogStats::default() };
            return Ok(Self::new(snapshot, file, options, 1, stats));
        }
        let scanned = replay(&image, collection, &path)?;
        if scanned.valid_bytes < image.len() as u64 {
            let io = io_error(&path);
            file.set_len(scanned.valid_bytes).map_err(&io)?;
            file.sync_all().map_err(&io)?;
        }
        let stats = LogStats {
            log_bytes: scanned.valid_bytes,
            replayed: scanned.records,
            torn_bytes: image.len() as u64 - scanned.valid_bytes,
            ..LogStats::default()
        };
        Ok(Self::new(snapshot, file, options, scanned.records + 1, stats))
    }

    /// Refuses a write while an earlier flush's failure stands (the log may lack writes the
    /// collection has; see the module documentation).
    pub(crate) fn check_writable(&self) -> Result<()> {
        match &self.lock().failed {
            None => Ok(()),
            Some(reason) => Err(self.failure(reason)),
        }
    }

    fn failure(&self, reason: &str) -> HiveGpuError {
        HiveGpuError::Io {
            path: self.path.clone(),
            source: std::io::Error::other(format!(
                "an earlier write to the log failed ({reason}): writes are refused until a checkpoint succeeds"
            )),
        }
    }

    /// Appends `record`; call with the collection's write lock held, after the write took
    /// effect. Wait on the ticket (without the lock) before acknowledging the write.
    pub(crate) fn append(&self, record: &PendingRecord) -> Ticket {
        let mut state = self.lock();
        let sequence = state.next_sequence;
        state.next_sequence += 1;
        let before = state.pending.len();
        record.write_to(sequence, &mut state.pending);
        state.stats.log_bytes += (state.pending.len() - before) as u64;
        state.stats.records += 1;
        state.appended += 1;
        if state.gathering {
            self.appended.notify_one();
        }
        Ticket(state.appended)
    }

    /// Returns once the record of `ticket` is durable, flushing it (with every other record
    /// appended by then) if no flush is under way.
    pub(crate) fn wait(&self, ticket: Ticket) -> Result<()> {
        let mut state = self.lock();
        loop {
            if state.durable >= ticket.0 {
                return Ok(());
            }
            if let Some(reason) = &state.failed {
                return Err(self.failure(reason));
            }
            if state.flushing {
                state = self.flushed.wait(state).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            state.flushing = true;
            state = self.gather(state);
            let records = std::mem::take(&mut state.pending);
            let (upto, generation, file) = (state.appended, state.generation, state.file.clone());
            let batch = upto - state.taken;
            state.taken = upto;
            drop(state);
            let started = Instant::now();
            let written = (&*file).write_all(&records).and_then(|()| match self.options.durability {
                Durability::Disk => file.sync_data(),
                Durability::Process => Ok(()),
            });
            let took = started.elapsed();
            state = self.lock();
            state.flushing = false;
            if state.generation == generation {
                match written {
                    Ok(()) => {
                        state.durable = state.durable.max(upto);
                        state.stats.flushes += 1;
                        (state.last_batch, state.last_flush) = (batch, took);
                    }
                    Err(e) => state.failed = Some(e.to_string()),
                }
                // The buffer's memory goes back for the next appends.
                if state.pending.is_empty() {
                    let mut spare = records;
                    spare.clear();
                    state.pending = spare;
                }
            }
            self.flushed.notify_all();
        }
    }

    /// Holds a disk flush back until as many records are pending as the last flush took, for
    /// at most half that flush's time (and [`MAX_GATHER`]). Without it, writers fall into two
    /// alternating halves: the writers a flush acknowledges are still waking when the next
    /// flusher starts, so each flush takes half of them (4.25 records per flush from 8
    /// writers: `hive-gpu bench-writes`, docs/PERFORMANCE.md). A single writer, whose last
    /// flush took one record, never waits.
    fn gather<'a>(&'a self, mut state: MutexGuard<'a, LogState>) -> MutexGuard<'a, LogState> {
        if self.options.durability != Durability::Disk || state.last_batch <= 1 {
            return state;
        }
        let deadline = Instant::now() + (state.last_flush / 2).min(MAX_GATHER);
        while state.appended - state.taken < state.last_batch {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            state.gathering = true;
            state = self.appended.wait_timeout(state, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        state.gathering = false;
        state
    }

    /// Whether the log has grown past the options' checkpoint length.
    pub(crate) fn wants_checkpoint(&self) -> bool {
        self.lock().stats.log_bytes > self.options.checkpoint_log_bytes
    }

    /// [`Log::checkpoint`] if the log is still past its checkpoint length once this thread's
    /// turn comes (writers that found it long together checkpoint once).
    pub(crate) fn checkpoint_if_due(&self, collection: &Collection) -> Result<()> {
        let _one = self.checkpointing.lock().unwrap_or_else(|e| e.into_inner());
        if self.wants_checkpoint() { self.checkpoint_locked(collection) } else { Ok(()) }
    }

    /// Writes `collection` as the new snapshot and starts an empty log after it. Call with the
    /// collection's read lock held (no write can take effect meanwhile): every record logged
    /// so far is in the snapshot, so every waiting writer is acknowledged.
    pub(crate) fn checkpoint(&self, collection: &Collection) -> Result<()> {
        let _one = self.checkpointing.lock().unwrap_or_else(|e| e.into_inner());
        self.checkpoint_locked(collection)
    }

    fn checkpoint_locked(&self, collection: &Collection) -> Result<()> {
        let base = super::save(collection, &self.snapshot)?;
        let file = create_log(&self.path, base)?;
        let mut state = self.lock();
        state.file = Arc::new(file);
        state.pending.clear();
        state.next_sequence = 1;
        state.durable = state.appended;
        state.taken = state.appended;
        state.generation += 1;
        state.failed = None;
        state.stats.checkpoints += 1;
        state.stats.log_bytes = LOG_HEADER_BYTES as u64;
        drop(state);
        self.flushed.notify_all();
        Ok(())
    }

    /// The log's counters now.
    pub(crate) fn stats(&self) -> LogStats {
        self.lock().stats
    }
}

/// Opens and locks the log file at `path` if there is one.
fn hold_existing(path: &Path) -> Result<Option<File>> {
    match std::fs::OpenOptions::new().read(true).append(true).open(path) {
        Ok(file) => {
            file.try_lock().map_err(lock_error(path))?;
            Ok(Some(file))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(HiveGpuError::Io { path: path.to_path_buf(), source }),
    }
}

/// Applies every whole record of the log image to `collection`, in order. Runs of upserts
/// with no id twice go as one batch: that is the same as upserting them one after another
/// (each gets the next slots, each replaced id's old slot is removed) and much faster to
/// open.
fn replay(image: &[u8], collection: &mut Collection, path: &Path) -> Result<log::Scanned> {
    let dim = collection.config().dimension;
    let mut run = Run { vectors: Vectors::default(), ids: HashSet::new(), offset: 0, path };
    let scanned = log::scan(image, dim, |offset, change| -> Result<()> {
        match change {
            Change::Upsert(vectors) => {
                if vectors.ids().iter().any(|id| run.ids.contains(id)) {
                    run.apply(collection)?;
                }
                if run.vectors.len() == 0 {
                    run.offset = offset;
                }
                run.ids.extend(vectors.ids().iter().cloned());
                run.vectors.append(vectors);
                Ok(())
            }
            Change::Remove(ids) => {
                run.apply(collection)?;
                crate::exec::run(|| collection.remove(&ids))?.map_err(|e| not_applicable(path, offset, e))
            }
            Change::Clear => {
                run.apply(collection)?;
                collection.clear();
                Ok(())
            }
        }
    })?;
    let scanned = scanned.map_err(|e| HiveGpuError::InvalidFormat {
        path: path.to_path_buf(),
        format: LOG_FORMAT_NAME,
        reason: e.to_string(),
    })?;
    run.apply(collection)?;
    Ok(scanned)
}

/// What a log file is called in errors.
const LOG_FORMAT_NAME: &str = "hive-gpu write-ahead log";

fn not_applicable(path: &Path, offset: u64, e: HiveGpuError) -> HiveGpuError {
    HiveGpuError::InvalidFormat {
        path: path.to_path_buf(),
        format: LOG_FORMAT_NAME,
        reason: format!("the record at byte {offset} does not apply to the collection: {e}"),
    }
}

/// Consecutive logged upserts gathered for one batch.
struct Run<'a> {
    vectors: Vectors,
    ids: HashSet<String>,
    /// Byte offset of the first record in the run.
    offset: u64,
    path: &'a Path,
}

impl Run<'_> {
    fn apply(&mut self, collection: &mut Collection) -> Result<()> {
        if self.vectors.len() == 0 {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.vectors);
        self.ids.clear();
        crate::exec::run(|| collection.upsert(&batch))?.map_err(|e| not_applicable(self.path, self.offset, e))
    }
}
