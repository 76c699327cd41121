//! How much more host memory this process may take before the kernel refuses it or kills the
//! process: the least of what the OS reports available, what the process's memory cgroup leaves
//! (v2 or v1, at every level up to the root: a container's limit is usually an ancestor's), and
//! the address-space and data limits (`setrlimit`, `ulimit -v` / `-d`).
//!
//! A container sees the host's `MemAvailable`, so without the cgroup a 4 GiB container on a
//! 256 GiB host would happily start a 20 GiB load and be OOM-killed half way. Readers, the CPU
//! row store and the collections ask [`check`] before they allocate what a file or a caller
//! asked for, and refuse with both sizes in the message.

use std::path::{Path, PathBuf};

use crate::error::{HiveGpuError, Result};

/// What may still be allocated, and which limit decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Budget {
    /// Bytes.
    pub(crate) bytes: u64,
    /// The limit that gave the least: "available memory (MemAvailable)", "cgroup memory.max
    /// of /sys/fs/cgroup/...", "address-space limit (RLIMIT_AS)", ...
    pub(crate) limited_by: String,
}

/// This process's budget now, or None where no source could be read (not Linux, no /proc).
pub(crate) fn budget() -> Option<Budget> {
    budget_under(Path::new("/"))
}

/// Available host memory in bytes, where known.
pub(crate) fn available_bytes() -> Option<u64> {
    budget().map(|b| b.bytes)
}

/// The memory this process could ever use: the machine's total, or a cgroup's limit where
/// that is smaller (what a container calls its memory).
pub(crate) fn total_bytes() -> Option<u64> {
    let root = Path::new("/");
    let limits = cgroup_levels(root).into_iter().filter_map(|(dir, version)| level_limit(&dir, version));
    meminfo(root, "MemTotal:").into_iter().chain(limits).min()
}

/// Refuses `bytes` more for `what` when the budget cannot hold them (an unknown budget
/// refuses nothing: the allocation itself still fails cleanly through `try_reserve`).
pub(crate) fn check(what: impl FnOnce() -> String, bytes: u64) -> Result<()> {
    check_within(what, bytes, budget())
}

/// [`check`] against a given budget: the decision alone, so tests can ask it about budgets
/// this machine does not have without allocating anything.
pub(crate) fn check_within(what: impl FnOnce() -> String, bytes: u64, budget: Option<Budget>) -> Result<()> {
    match budget {
        Some(budget) if bytes > budget.bytes => Err(HiveGpuError::OutOfMemory {
            what: what(),
            requested: bytes,
            available: budget.bytes,
            limited_by: budget.limited_by,
        }),
        _ => Ok(()),
    }
}

/// Claims `bytes` of host memory about to be written (rows appended, ids stored): Ok when the
/// budget holds them and the headroom, else `Err((bytes with the headroom, available))`.
///
/// Reading the budget costs a few small files, too much for every single-vector add, so a
/// read grants a credit: half of what remains after the claim, spent by later claims without
/// another read. Half, because the rest of the process and the cgroup's other processes spend
/// the same memory meanwhile; each read near the limit halves the credit again, so claims meet
/// a fresh reading before the budget runs out. Capacity reserved ahead (a `Vec` doubling) costs
/// nothing until written, which is why claims are made per write and not per reservation.
///
/// A claim also keeps [`headroom`] free beyond its bytes: a write allocates more than it
/// claims (ids, a map's growth, allocator slack, page tables), and a cgroup kills the process
/// on the first byte past its limit.
pub(crate) fn claim(bytes: u64) -> std::result::Result<(), (u64, u64)> {
    static CREDIT: std::sync::Mutex<u64> = std::sync::Mutex::new(0);
    let mut credit = CREDIT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if bytes <= *credit {
        *credit -= bytes;
        return Ok(());
    }
    let Some(available) = available_bytes() else {
        // No budget known: nothing to check against (the allocation itself still fails cleanly).
        return Ok(());
    };
    let needed = bytes.saturating_add(headroom(bytes));
    if needed > available {
        *credit = 0;
        // What was asked with its headroom, so the refusal's numbers show why.
        return Err((needed, available));
    }
    *credit = (available - needed) / 2;
    Ok(())
}

/// What a claim of `bytes` leaves free besides them: a quarter of the claim plus 16 MiB.
///
/// Measured in a CI run of `tests/memory_limits.rs` (1,024-dimensional rows, 4,096 ids a
/// write): each 16.8 MB claim lowered the cgroup's headroom by 17.0-17.3 MB, and by 19 MB when
/// the id map grew. Without the margin the last claim was granted with 16.9 MB available and
/// the child was OOM-killed writing it; the quarter covers the proportional part, the 16 MiB
/// the allocator's and the kernel's fixed slack.
fn headroom(bytes: u64) -> u64 {
    bytes / 4 + (16 << 20)
}

/// The budget with `/proc` and `/sys` read below `root` (tests build a fake tree).
fn budget_under(root: &Path) -> Option<Budget> {
    let mut best: Option<Budget> = None;
    let mut offer = |bytes: u64, limited_by: String| {
        if best.as_ref().is_none_or(|b| bytes < b.bytes) {
            best = Some(Budget { bytes, limited_by });
        }
    };
    if let Some(available) = meminfo(root, "MemAvailable:") {
        offer(available, "available memory (MemAvailable in /proc/meminfo)".into());
    }
    for (bytes, source) in cgroup_headroom(root) {
        offer(bytes, source);
    }
    let status = read(root, "proc/self/status");
    let limits = read(root, "proc/self/limits");
    if let (Some(status), Some(limits)) = (&status, &limits) {
        for (limit_name, usage_key, name) in [
            ("Max address space", "VmSize:", "address-space limit (RLIMIT_AS, ulimit -v)"),
            ("Max data size", "VmData:", "data-segment limit (RLIMIT_DATA, ulimit -d)"),
        ] {
            if let (Some(limit), Some(used)) = (soft_limit(limits, limit_name), status_kib(status, usage_key))
            {
                offer(limit.saturating_sub(used), name.into());
            }
        }
    }
    best
}

fn read(root: &Path, relative: &str) -> Option<String> {
    std::fs::read_to_string(root.join(relative)).ok()
}

/// A `/proc/meminfo` value in bytes.
fn meminfo(root: &Path, key: &str) -> Option<u64> {
    status_kib(&read(root, "proc/meminfo")?, key)
}

/// A `Key:   123 kB` line's value in bytes.
fn status_kib(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// The soft limit of a `/proc/self/limits` row, None when unlimited.
fn soft_limit(limits: &str, name: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with(name))?;
    line[name.len()..].split_whitespace().next()?.parse().ok()
}

/// `(headroom, source)` for every level of this process's memory cgroup that has a limit:
/// the limit minus the level's working set (usage less inactive file pages, which the kernel
/// reclaims before it kills anything; the measure container runtimes evict on).
fn cgroup_headroom(root: &Path) -> Vec<(u64, String)> {
    cgroup_levels(root)
        .into_iter()
        .filter_map(|(dir, version)| {
            level_headroom(&dir, version)
                .map(|headroom| (headroom, format!("cgroup memory limit of {}", dir.display())))
        })
        .collect()
}

/// Every directory of this process's memory cgroup hierarchy, with its cgroup version.
fn cgroup_levels(root: &Path) -> Vec<(PathBuf, u8)> {
    let Some(membership) = read(root, "proc/self/cgroup") else { return Vec::new() };
    let mut found = Vec::new();
    for line in membership.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let version = if id == "0" && controllers.is_empty() {
            2
        } else if controllers.split(',').any(|c| c == "memory") {
            1
        } else {
            continue;
        };
        let mount = if version == 2 {
            let unified = root.join("sys/fs/cgroup/unified");
            if unified.join("cgroup.controllers").exists()
                && !root.join("sys/fs/cgroup/cgroup.controllers").exists()
            {
                unified
            } else {
                root.join("sys/fs/cgroup")
            }
        } else {
            root.join("sys/fs/cgroup/memory")
        };
        found.extend(levels(&mount, path).into_iter().map(|dir| (dir, version)));
    }
    found
}

/// The cgroup's own directory and its ancestors up to the mount point. Inside a container
/// the listed path may not exist below the mount (a cgroup namespace shows `/`): then the mount
/// point itself is the process's cgroup.
fn levels(mount: &Path, path: &str) -> Vec<PathBuf> {
    let mut dir = mount.join(path.trim_start_matches('/'));
    let mut out = Vec::new();
    while dir.starts_with(mount) {
        if dir.is_dir() {
            out.push(dir.clone());
        }
        if dir == mount || !dir.pop() {
            break;
        }
    }
    if out.is_empty() && mount.is_dir() {
        out.push(mount.to_path_buf());
    }
    out
}

fn number(dir: &Path, file: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join(file)).ok()?.trim().parse().ok()
}

/// One cgroup level's limit, None without one ("max" in v2; v1 writes "no limit" as a
/// page-rounded i64::MAX).
fn level_limit(dir: &Path, version: u8) -> Option<u64> {
    let limit = number(dir, if version == 2 { "memory.max" } else { "memory.limit_in_bytes" })?;
    (limit < 1 << 62).then_some(limit)
}

/// What one cgroup level leaves: limit minus working set, None without a limit.
fn level_headroom(dir: &Path, version: u8) -> Option<u64> {
    let limit = level_limit(dir, version)?;
    let (usage, inactive_key) = if version == 2 {
        (number(dir, "memory.current")?, "inactive_file ")
    } else {
        (number(dir, "memory.usage_in_bytes")?, "total_inactive_file ")
    };
    let inactive = std::fs::read_to_string(dir.join("memory.stat"))
        .ok()
        .and_then(|stat| {
            stat.lines().find_map(|l| l.strip_prefix(inactive_key).and_then(|v| v.trim().parse::<u64>().ok()))
        })
        .unwrap_or(0);
    Some(limit.saturating_sub(usage.saturating_sub(inactive)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/` with the given files.
    struct FakeRoot(PathBuf);

    impl FakeRoot {
        fn new(name: &str, files: &[(&str, &str)]) -> Self {
            let dir = std::env::temp_dir().join(format!("hive-gpu-memory-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            for (path, text) in files {
                let path = dir.join(path);
                std::fs::create_dir_all(path.parent().expect("a parent")).expect("create dirs");
                std::fs::write(path, text).expect("write");
            }
            Self(dir)
        }
    }

    impl Drop for FakeRoot {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const MEMINFO: &str = "MemTotal:       268435456 kB\nMemAvailable:   200000000 kB\n";
    const UNLIMITED: &str = "Max address space         unlimited            unlimited            bytes\n\
                             Max data size             unlimited            unlimited            bytes\n";

    #[test]
    fn a_cgroup_v2_limit_of_an_ancestor_caps_the_host_s_available_memory() {
        let root = FakeRoot::new(
            "v2",
            &[
                ("proc/meminfo", MEMINFO),
                ("proc/self/cgroup", "0::/pod/app\n"),
                ("proc/self/limits", UNLIMITED),
                ("proc/self/status", "VmSize:  1000 kB\nVmData:  500 kB\n"),
                ("sys/fs/cgroup/cgroup.controllers", "memory\n"),
                ("sys/fs/cgroup/pod/memory.max", "4294967296\n"),
                ("sys/fs/cgroup/pod/memory.current", "1073741824\n"),
                ("sys/fs/cgroup/pod/memory.stat", "anon 1\ninactive_file 536870912\n"),
                ("sys/fs/cgroup/pod/app/memory.max", "max\n"),
                ("sys/fs/cgroup/pod/app/memory.current", "1073741824\n"),
            ],
        );
        let budget = budget_under(&root.0).expect("a budget");
        // 4 GiB - (1 GiB - 0.5 GiB of reclaimable cache).
        assert_eq!(budget.bytes, (4 << 30) - (1 << 29));
        assert!(budget.limited_by.contains("pod"), "{}", budget.limited_by);
    }

    #[test]
    fn a_cgroup_v1_limit_counts_and_the_v1_no_limit_value_does_not() {
        let root = FakeRoot::new(
            "v1",
            &[
                ("proc/meminfo", MEMINFO),
                ("proc/self/cgroup", "4:memory:/job\n3:cpu:/\n"),
                ("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"),
                ("sys/fs/cgroup/memory/memory.usage_in_bytes", "5\n"),
                ("sys/fs/cgroup/memory/job/memory.limit_in_bytes", "2147483648\n"),
                ("sys/fs/cgroup/memory/job/memory.usage_in_bytes", "1073741824\n"),
            ],
        );
        assert_eq!(budget_under(&root.0).expect("a budget").bytes, 1 << 30);
    }

    #[test]
    fn an_address_space_limit_leaves_the_limit_less_what_is_mapped() {
        let root = FakeRoot::new(
            "rlimit",
            &[
                ("proc/meminfo", MEMINFO),
                (
                    "proc/self/limits",
                    "Max address space         3221225472           unlimited            bytes\n",
                ),
                ("proc/self/status", "VmSize:  1048576 kB\nVmData:  5 kB\n"),
            ],
        );
        let budget = budget_under(&root.0).expect("a budget");
        assert_eq!(budget.bytes, 2 << 30);
        assert!(budget.limited_by.contains("RLIMIT_AS"));
    }

    #[test]
    fn no_readable_source_is_no_budget() {
        let root = FakeRoot::new("none", &[("unrelated", "")]);
        assert_eq!(budget_under(&root.0), None);
    }

    #[test]
    fn this_machine_has_a_budget() {
        // Every Linux CI and development machine has /proc/meminfo.
        if cfg!(target_os = "linux") {
            assert!(budget().is_some_and(|b| b.bytes > 0));
        }
    }
}
