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

/// What a write-ahead log keeps durable: a storage that writes itself as the log's snapshot and
/// takes the log's writes back at an open. One collection is one; so is a storage over several
/// devices (`crate::multi`), whose snapshot is its manifest and shard files and whose replayed
/// writes are routed as any write of it.
pub(crate) trait Logged {
    /// The storage's configuration (a durable open checks a snapshot's against the caller's).
    fn config(&self) -> crate::StorageConfig;
    /// Components per vector (records are checked against it).
    fn dimension(&self) -> usize {
        self.config().dimension
    }
    /// Writes the storage whole as the snapshot at `path`, crash-safe, and returns the new file's
    /// identity. Called where no write can take effect meanwhile (see [`Log::checkpoint`]).
    fn write_snapshot(&self, path: &Path) -> Result<SnapshotId>;
    /// Applies a replayed run of upserts.
    fn replay_upsert(&mut self, batch: &Vectors) -> Result<()>;
    /// Applies a replayed removal.
    fn replay_remove(&mut self, ids: &[String]) -> Result<()>;
    /// Applies a replayed clear.
    fn replay_clear(&mut self) -> Result<()>;
}

impl Logged for Collection {
    fn config(&self) -> crate::StorageConfig {
        *Collection::config(self)
    }
    fn write_snapshot(&self, path: &Path) -> Result<SnapshotId> {
        super::save(self, path, &mut |_, _| {})
    }
    fn replay_upsert(&mut self, batch: &Vectors) -> Result<()> {
        crate::exec::run(|| self.upsert(batch))?
    }
    fn replay_remove(&mut self, ids: &[String]) -> Result<()> {
        crate::exec::run(|| self.remove(ids))?
    }
    fn replay_clear(&mut self) -> Result<()> {
        self.clear();
        Ok(())
    }
}

/// What every durable open starts with: `path` made absolute (so that checkpoints go to the same
/// file whatever the working directory becomes), the lock beside it taken ([`lock`]), and whether
/// a snapshot is there already.
pub(crate) fn claim(path: &Path) -> Result<(PathBuf, File, bool)> {
    if path.file_name().is_none() {
        return Err(HiveGpuError::InvalidArgument(format!("{} names no file", path.display())));
    }
    let path = std::path::absolute(path).map_err(io_error(path))?;
    let lock = lock(&path)?;
    let exists = path.try_exists().map_err(io_error(&path))?;
    Ok((path, lock, exists))
}

/// Refuses to open the durable collection at `path`, which holds `found`, as `wanted`: the
/// dimension, metric and storage precision must agree (the error says which differ).
pub(crate) fn check_config(
    path: &Path,
    found: &crate::StorageConfig,
    wanted: &crate::StorageConfig,
) -> Result<()> {
    if (found.dimension, found.metric, found.precision) != (wanted.dimension, wanted.metric, wanted.precision)
    {
        return Err(HiveGpuError::InvalidArgument(format!(
            "{} holds a collection of dimension {}, {:?}, {:?} storage; asked for dimension {}, {:?}, {:?}",
            path.display(),
            found.dimension,
            found.metric,
            found.precision,
            wanted.dimension,
            wanted.metric,
            wanted.precision
        )));
    }
    Ok(())
}

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
    /// A flush's or a checkpoint's failure, refusing writes until a checkpoint succeeds.
    failed: Option<String>,
    /// The log file's header checksum, which its records' checksums start from.
    salt: u32,
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
    /// Held (locked) for the collection's life: see [`lock`].
    _lock: File,
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

/// How long [`lock`] waits for a held lock before it reports the collection as held.
const LOCK_PATIENCE: Duration = Duration::from_millis(500);

/// Takes the durable collection at `snapshot` for this storage: `<snapshot>.lock`, created if
/// need be and locked exclusively (`std::fs::File::try_lock`) until the storage is dropped.
/// Its own file, never replaced, because the log and snapshot files are replaced by every
/// checkpoint: a lock on one of them would stay on the replaced file. Taken before the
/// snapshot is read, so no other storage can checkpoint between the read and the replay.
pub(crate) fn lock(snapshot: &Path) -> Result<File> {
    let mut name = snapshot.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    let path = snapshot.with_file_name(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_error(&path))?;
    // A lock belongs to the open file, which a child process shares from its fork until its
    // exec closes it: a storage dropped while another thread spawns a process keeps its lock
    // for that moment. So a held lock is asked for again for a while before it is an error.
    let started = std::time::Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < LOCK_PATIENCE => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(HiveGpuError::InvalidArgument(format!(
                    "{} is held by another open durable collection (in this process or another)",
                    snapshot.display()
                )));
            }
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(HiveGpuError::Io { path: path.clone(), source });
            }
        }
    }
}

/// Writes a fresh log continuing `base` at `path`: a new file with just the header, synced,
/// renamed over whatever was there, the directory synced. Returns it open for appending, with
/// its header's checksum (the records' salt).
fn create_log(path: &Path, base: SnapshotId) -> Result<(File, u32)> {
    let temporary = temporary_path(path);
    let made = (|| {
        let io = io_error(&temporary);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .open(&temporary)
            .map_err(&io)?;
        let header = log::encode_header(base);
        file.write_all(&header).map_err(&io)?;
        file.sync_all().map_err(&io)?;
        std::fs::rename(&temporary, path).map_err(io_error(path))?;
        sync_directory_of(path)?;
        Ok((file, log::header_salt(&header)))
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
        lock: File,
        snapshot: &Path,
        (file, salt): (File, u32),
        options: DurableOptions,
        next_sequence: u64,
        stats: LogStats,
    ) -> Self {
        Self {
            _lock: lock,
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
                salt,
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
    pub(crate) fn create(
        lock: File,
        snapshot: &Path,
        storage: &dyn Logged,
        options: DurableOptions,
    ) -> Result<Self> {
        let base = storage.write_snapshot(snapshot)?;
        let log = create_log(&log_path(snapshot), base)?;
        let stats = LogStats { log_bytes: LOG_HEADER_BYTES as u64, ..LogStats::default() };
        Ok(Self::new(lock, snapshot, log, options, 1, stats))
    }

    /// Opens the log of the snapshot at `snapshot` (whose identity is `base` and which has
    /// been loaded into `collection`) and replays it into `collection`. A torn last record is
    /// cut off the file; a log of an older snapshot is replaced by a fresh one.
    pub(crate) fn open(
        lock: File,
        snapshot: &Path,
        base: SnapshotId,
        storage: &mut dyn Logged,
        options: DurableOptions,
    ) -> Result<Self> {
        let path = log_path(snapshot);
        let fresh = LogStats { log_bytes: LOG_HEADER_BYTES as u64, ..LogStats::default() };
        let file = match std::fs::OpenOptions::new().read(true).append(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Self::new(lock, snapshot, create_log(&path, base)?, options, 1, fresh));
            }
            Err(source) => return Err(HiveGpuError::Io { path, source }),
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
            // An empty file holds no write (this library never leaves one: logs are created
            // whole, by rename); it is taken as no log.
            Err(_) if image.is_empty() => true,
            Err(e) => return Err(invalid(e.to_string())),
        };
        if stale {
            drop(file);
            return Ok(Self::new(lock, snapshot, create_log(&path, base)?, options, 1, fresh));
        }
        let salt =
            log::header_salt(image[..LOG_HEADER_BYTES].try_into().expect("a whole header was scanned"));
        let scanned = replay(&image, storage, &path)?;
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
        Ok(Self::new(lock, snapshot, (file, salt), options, scanned.records + 1, stats))
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
                "the log cannot take writes since an earlier failure ({reason}): writes are refused until a checkpoint succeeds"
            )),
        }
    }

    /// Appends `record`; call with the collection's write lock held, after the write took
    /// effect. Wait on the ticket (without the lock) before acknowledging the write.
    pub(crate) fn append(&self, record: &PendingRecord) -> Ticket {
        let mut state = self.lock();
        let (sequence, salt) = (state.next_sequence, state.salt);
        state.next_sequence += 1;
        let before = state.pending.len();
        record.write_to(sequence, salt, &mut state.pending);
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
    pub(crate) fn checkpoint_if_due(&self, storage: &dyn Logged) -> Result<()> {
        let _one = self.checkpointing.lock().unwrap_or_else(|e| e.into_inner());
        if self.wants_checkpoint() { self.checkpoint_locked(storage) } else { Ok(()) }
    }

    /// Writes `collection` as the new snapshot and starts an empty log after it. Call with the
    /// collection's read lock held (no write can take effect meanwhile): every record logged
    /// so far is in the snapshot, so every waiting writer is acknowledged.
    pub(crate) fn checkpoint(&self, storage: &dyn Logged) -> Result<()> {
        let _one = self.checkpointing.lock().unwrap_or_else(|e| e.into_inner());
        self.checkpoint_locked(storage)
    }

    /// A failure anywhere refuses writes until a checkpoint succeeds: once the new snapshot
    /// may have replaced the old one, the old log no longer continues the snapshot on disk,
    /// and a write appended to it would be dropped as stale at the next open.
    fn checkpoint_locked(&self, storage: &dyn Logged) -> Result<()> {
        let written = storage.write_snapshot(&self.snapshot).and_then(|base| create_log(&self.path, base));
        let (file, salt) = match written {
            Ok(log) => log,
            Err(e) => {
                self.lock().failed = Some(format!("a checkpoint failed: {e}"));
                return Err(e);
            }
        };
        let mut state = self.lock();
        state.file = Arc::new(file);
        state.salt = salt;
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

/// Applies every whole record of the log image to `collection`, in order. Runs of upserts
/// with no id twice go as one batch: that is the same as upserting them one after another
/// (each gets the next slots, each replaced id's old slot is removed) and much faster to
/// open.
fn replay(image: &[u8], storage: &mut dyn Logged, path: &Path) -> Result<log::Scanned> {
    let dim = storage.dimension();
    let mut run = Run { vectors: Vectors::default(), ids: HashSet::new(), offset: 0, path };
    let scanned = log::scan(image, dim, |offset, change| -> Result<()> {
        match change {
            Change::Upsert(vectors) => {
                if run.vectors.len() >= REPLAY_RUN || vectors.ids().iter().any(|id| run.ids.contains(id)) {
                    run.apply(storage)?;
                }
                if run.vectors.len() == 0 {
                    run.offset = offset;
                }
                run.ids.extend(vectors.ids().iter().cloned());
                run.vectors.append(vectors);
                Ok(())
            }
            Change::Remove(ids) => {
                run.apply(storage)?;
                storage.replay_remove(&ids).map_err(|e| not_applicable(path, offset, e))
            }
            Change::Clear => {
                run.apply(storage)?;
                storage.replay_clear().map_err(|e| not_applicable(path, offset, e))
            }
        }
    })?;
    let scanned = scanned.map_err(|e| HiveGpuError::InvalidFormat {
        path: path.to_path_buf(),
        format: LOG_FORMAT_NAME,
        reason: e.to_string(),
    })?;
    run.apply(storage)?;
    Ok(scanned)
}

/// Vectors gathered into one replayed batch at most: replacing many stored ids in one batch
/// leaves their old slots removed at once, where one write at a time would have compacted
/// them along the way, so a bounded run keeps a replay's peak memory near the original
/// writes'.
const REPLAY_RUN: usize = 1 << 16;

/// What a log file is called in errors.
const LOG_FORMAT_NAME: &str = "hive-gpu write-ahead log";

fn not_applicable(path: &Path, offset: u64, e: HiveGpuError) -> HiveGpuError {
    HiveGpuError::InvalidFormat {
        path: path.to_path_buf(),
        format: LOG_FORMAT_NAME,
        reason: format!(
            "the record at byte {offset} (or a later one of its run of upserts) does not apply to the collection: {e}"
        ),
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
    fn apply(&mut self, storage: &mut dyn Logged) -> Result<()> {
        if self.vectors.len() == 0 {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.vectors);
        self.ids.clear();
        storage.replay_upsert(&batch).map_err(|e| not_applicable(self.path, self.offset, e))
    }
}
