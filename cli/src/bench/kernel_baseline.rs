//! `bench random --baseline kernel`: the engine against the kernel at the
//! kernel's own job, under one memory limit, in one invocation.
//!
//! The file (4 × the budget, the `random` workload's pattern) lives on a
//! disk file system, not tmpfs. Each side runs in a child process of its
//! own, forked before any pager exists, that first joins a fresh memory
//! cgroup whose limit is the budget plus [`OVERHEAD`], so everything it
//! touches (the engine's pages and metadata, the page cache its file store
//! pulls in, the kernel's page cache of the mapping) is charged there and
//! neither side gets the host's page cache for free: the file's cached
//! pages are dropped (`fdatasync`, `POSIX_FADV_DONTNEED`) before each side.
//! A side the cgroup OOM-kills is reported as such.
//!
//! Sides: the engine (the run's policy, install kind and budget, its file
//! store opened with `O_DIRECT` so that it does not cache the file twice),
//! the kernel's `mmap` with default readahead, and with `MADV_RANDOM`.

use crate::os::cgroup::{MemCgroup, MemStat};
use crate::workload::common::Knobs;
use crate::workload::pattern_file::{file_pages, read_random_words, PatternFile};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;
use uffd_pager::store::{FileStore, FileStoreOptions};
use uffd_pager::{Counter, PAGE_SIZE};

/// What the limit allows beyond the budget: the process itself (binary,
/// libraries, heap, thread stacks) and the engine's fixed metadata.
pub const OVERHEAD: u64 = 16 << 20;

/// One side's result.
#[derive(Debug, Clone, Default)]
pub struct Side {
    /// `engine (retry-once, anonymous)`, `kernel mmap`, `kernel mmap + MADV_RANDOM`.
    pub name: String,
    /// Page reads done, all threads.
    pub reads: u64,
    /// Wall time of the reading loop, seconds.
    pub secs: f64,
    /// Words that differed from the pattern.
    pub mismatches: u64,
    /// The engine's pgfault / pgmajfault / pgsteal (0 for the kernel).
    pub pager: [u64; 3],
    /// The cgroup's view.
    pub cgroup: MemStat,
    /// Killed (by the OOM killer, or anything else) before it reported.
    pub killed: Option<String>,
}

impl Side {
    /// Microseconds per page per thread.
    pub fn us_per_page(&self, threads: usize) -> f64 {
        self.secs * threads as f64 / self.reads.max(1) as f64 * 1e6
    }
}

/// Reads random words of the `pages`-page mapping at `base` for
/// `k.duration`: (reads, seconds).
///
/// # Safety
/// `base` maps `pages` readable pages of the pattern file for the call.
unsafe fn timed_reads(base: usize, pages: usize, k: &Knobs, mismatches: &AtomicU64) -> (u64, f64) {
    let t0 = Instant::now();
    // SAFETY: the caller's contract.
    let reads = unsafe {
        read_random_words(
            base,
            pages,
            k.threads.max(1),
            k.seed,
            t0 + k.duration,
            mismatches,
        )
    };
    (reads, t0.elapsed().as_secs_f64())
}

/// Which side a child runs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Engine,
    Kernel { random: bool },
}

fn threads_in_process() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// Drops the file's pages from the page cache.
fn drop_cache(file: &std::fs::File) {
    // SAFETY: plain syscalls on our descriptor.
    unsafe {
        libc::fdatasync(file.as_raw_fd());
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// The side's reading loop, in the child: (reads, seconds, mismatches, pager counters).
fn run_side(
    k: &Knobs,
    kind: Kind,
    file: &PatternFile,
) -> Result<(u64, f64, u64, [u64; 3]), String> {
    let pages = file.pages();
    let mismatches = AtomicU64::new(0);
    match kind {
        Kind::Engine => {
            let store = FileStore::open(
                Path::new(&format!("/proc/self/fd/{}", file.file().as_raw_fd())),
                &FileStoreOptions {
                    direct: true,
                    ..FileStoreOptions::default()
                },
            )
            .map_err(|e| format!("opening the file with O_DIRECT: {e}"))?;
            let pager = k.pager().map_err(|e| e.to_string())?;
            let opts = crate::workload::pattern_file::read_map_options(k.install);
            let region = pager
                .map_store(Arc::new(store), pages * PAGE_SIZE, &opts)
                .map_err(|e| e.to_string())?;
            pager.reset_stats();
            // SAFETY: the region maps `pages` pages and outlives the call.
            let (reads, secs) =
                unsafe { timed_reads(region.as_ptr() as usize, pages, k, &mismatches) };
            let st = pager.stats();
            let c = [
                st.get(Counter::PGFAULT),
                st.get(Counter::PGMAJFAULT),
                st.get(Counter::PGSTEAL),
            ];
            Ok((reads, secs, mismatches.into_inner(), c))
        }
        Kind::Kernel { random } => {
            let len = pages * PAGE_SIZE;
            // SAFETY: a fresh shared read-only mapping of our file; nothing
            // else is placed there.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    file.file().as_raw_fd(),
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return Err(format!("mmap: {}", std::io::Error::last_os_error()));
            }
            if random {
                // SAFETY: advice on our own mapping.
                unsafe { libc::madvise(base, len, libc::MADV_RANDOM) };
            }
            // SAFETY: `base` maps `pages` readable pages until the munmap below.
            let (reads, secs) = unsafe { timed_reads(base as usize, pages, k, &mismatches) };
            // SAFETY: our mapping, no longer used.
            unsafe { libc::munmap(base, len) };
            Ok((reads, secs, mismatches.into_inner(), [0; 3]))
        }
    }
}

/// Forks a child that joins `group` and runs `kind`; waits for it.
fn in_child(
    k: &Knobs,
    kind: Kind,
    file: &PatternFile,
    group: &MemCgroup,
    name: String,
) -> Result<Side, String> {
    let mut fds = [0; 2];
    // SAFETY: pipe fills two descriptors.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the caller checked this process has one thread, so the child
    // may run anything.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: the child's own descriptors.
        let mut w = unsafe { std::fs::File::from_raw_fd(fds[1]) };
        // SAFETY: as above.
        unsafe { libc::close(fds[0]) };
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        let line = match group.add(me).and_then(|()| run_side(k, kind, file)) {
            Ok((reads, secs, mm, c)) => {
                format!("ok {reads} {secs} {mm} {} {} {}\n", c[0], c[1], c[2])
            }
            Err(e) => format!("err {e}\n"),
        };
        let _ = w.write_all(line.as_bytes());
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: the parent's own descriptors.
    unsafe { libc::close(fds[1]) };
    // SAFETY: as above.
    let mut r = unsafe { std::fs::File::from_raw_fd(fds[0]) };
    let mut text = String::new();
    let _ = r.read_to_string(&mut text);
    let mut status = 0;
    // SAFETY: waits for our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let mut side = Side {
        name,
        cgroup: group.stat(),
        ..Side::default()
    };
    if libc::WIFSIGNALED(status) {
        side.killed = Some(format!(
            "killed by signal {}{}",
            libc::WTERMSIG(status),
            if side.cgroup.oom_kills > 0 {
                " (OOM killer)"
            } else {
                ""
            }
        ));
        return Ok(side);
    }
    let f: Vec<&str> = text.split_whitespace().collect();
    match f.as_slice() {
        ["ok", reads, secs, mm, a, b, c] => {
            let n = |s: &str| s.parse::<u64>().unwrap_or(0);
            side.reads = n(reads);
            side.secs = secs.parse().unwrap_or(0.0);
            side.mismatches = n(mm);
            side.pager = [n(a), n(b), n(c)];
            Ok(side)
        }
        _ => Err(format!(
            "{}: {}",
            side.name,
            text.trim().trim_start_matches("err ")
        )),
    }
}

/// Runs the three sides in `dir` (a disk file system).
pub fn random(k: &Knobs, dir: &Path) -> Result<(Vec<Side>, String, u64), String> {
    if k.budget_pages == 0 {
        return Err(
            "--baseline kernel needs a budget (--budget PAGES): it is the memory limit".into(),
        );
    }
    if crate::os::mem::on_tmpfs(dir) {
        return Err(format!(
            "{} is tmpfs: the kernel baseline needs a disk file system (--dir)",
            dir.display()
        ));
    }
    if threads_in_process() != 1 {
        return Err(
            "the kernel baseline forks its sides and must start before any other thread".into(),
        );
    }
    let limit = k.budget_pages * PAGE_SIZE as u64 + OVERHEAD;
    let file = PatternFile::create(dir, "baseline", file_pages(k)).map_err(|e| e.to_string())?;
    let kinds = [
        (
            Kind::Engine,
            format!("engine ({}, {:?})", k.policy, k.install).to_lowercase(),
        ),
        (Kind::Kernel { random: false }, "kernel mmap".to_string()),
        (
            Kind::Kernel { random: true },
            "kernel mmap + MADV_RANDOM".to_string(),
        ),
    ];
    let mut sides = Vec::new();
    let mut version = "";
    for (i, (kind, name)) in kinds.into_iter().enumerate() {
        drop_cache(file.file());
        let group = MemCgroup::create(
            &format!("uffd-pager-baseline-{}-{i}", std::process::id()),
            limit,
        )?;
        version = group.version();
        sides.push(in_child(k, kind, &file, &group, name)?);
    }
    Ok((sides, version.to_string(), limit))
}
