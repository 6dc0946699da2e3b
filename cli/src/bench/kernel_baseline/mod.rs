//! `bench random|scan|filemap --baseline kernel`: the engine against the
//! kernel at the kernel's own job, under one memory limit, in one
//! invocation.
//!
//! The workload's files (the [`pattern`](crate::workload::common::pattern))
//! live on a disk file system, not tmpfs. Each side runs in a child process
//! of its own, forked before any pager exists, that first joins a fresh
//! memory cgroup whose [`limit`] is the budget plus the engine's overhead, so everything
//! it touches (the engine's pages and metadata, the page cache its file
//! stores pull in, the kernel's page cache of the mapping) is charged there
//! and neither side gets the host's page cache for free: the files' cached
//! pages are dropped (`fdatasync`, `POSIX_FADV_DONTNEED`) before each side.
//! A side the cgroup OOM-kills is reported as such.
//!
//! Sides: the engine (the run's policy, install kind and budget, its file
//! stores opened with `O_DIRECT` so that it does not cache a file twice),
//! the kernel's `mmap` with default readahead, and for `random` also with
//! `MADV_RANDOM`. Both sides run the same access loop ([`access`]), which
//! times every access (but `scan`'s) into a latency histogram.

pub mod access;
mod report;

use crate::os::cgroup::{MemCgroup, MemStat};
use crate::workload::common::Knobs;
use crate::workload::pattern_file::PatternFile;
use access::{EngineMapper, KernelMapper, Workload};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;
use uffd_pager::{Counter, Percentiles, PAGE_SIZE};

/// What the limit allows beyond the budget and the engine's
/// [`Footprint`](uffd_pager::Footprint) (page states and LRU ring): the
/// process itself (heap, thread stacks, the I/O and staging buffers). The
/// engine side's cgroup peak was at most 1.6 MiB above its budget plus
/// footprint in this project's runs (`docs/measurements/2-vcpu/issue14/run2/`);
/// the binary's and libraries' pages are charged to the parent's group,
/// which loaded them.
pub const FIXED_OVERHEAD: u64 = 4 << 20;

/// The memory limit of each side: the budget, the engine's footprint for
/// `mapped_pages` pages under it, and [`FIXED_OVERHEAD`].
pub fn limit(budget_pages: u64, mapped_pages: usize) -> Result<u64, String> {
    let f = uffd_pager::Footprint::of(mapped_pages, budget_pages).map_err(|e| e.to_string())?;
    Ok(budget_pages * PAGE_SIZE as u64 + FIXED_OVERHEAD + (f.state_bytes + f.lru_bytes) as u64)
}

/// One side's result.
#[derive(Debug, Clone, Default)]
pub struct Side {
    /// `engine (retry-once, anonymous)`, `kernel mmap`, `kernel mmap + MADV_RANDOM`.
    pub name: String,
    /// Operations done ([`Workload::unit`]), all threads.
    pub ops: u64,
    /// Wall time of the timed part, seconds.
    pub secs: f64,
    /// Words or bytes that differed from the file.
    pub mismatches: u64,
    /// The engine's pgfault / pgmajfault / pgsteal (0 for the kernel).
    pub pager: [u64; 3],
    /// Access latency (count 0 where accesses are not timed).
    pub latency: Percentiles,
    /// The engine's footprint at the end, as it measured it
    /// ([`uffd_pager::MemoryUse`]); empty for the kernel.
    pub footprint: String,
    /// The cgroup's view.
    pub cgroup: MemStat,
    /// Killed (by the OOM killer, or anything else) before it reported.
    pub killed: Option<String>,
}

impl Side {
    /// Operations per second.
    pub fn rate(&self) -> f64 {
        self.ops as f64 / self.secs.max(1e-9)
    }
}

/// A whole run: the sides, first the engine's, and what they ran under.
#[derive(Debug, Clone)]
pub struct Report {
    /// The workload.
    pub workload: Workload,
    /// The sides, the engine's first.
    pub sides: Vec<Side>,
    /// `v1 memory.limit_in_bytes` or `v2 memory.max`.
    pub cgroup: &'static str,
    /// Each side's limit in bytes ([`limit`]).
    pub limit: u64,
    /// Pages per file, and files.
    pub file_pages: usize,
    /// Files (one per thread for `filemap`).
    pub files: usize,
    /// The engine's budget in pages.
    pub budget_pages: u64,
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

/// The side's access loop, in the child: its result line for the parent.
fn run_side(
    w: Workload,
    k: &Knobs,
    kind: Kind,
    files: &[PatternFile],
    budget: u64,
    dir: &Path,
) -> Result<String, String> {
    let pages = files[0].pages();
    let raw: Vec<std::fs::File> = files
        .iter()
        .map(|f| f.file().try_clone())
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let (out, c, footprint) = match kind {
        Kind::Engine => {
            let m = EngineMapper::new(w, k, budget, &raw, pages, dir)?;
            m.pager.reset_stats();
            let mut out = access::run(w, &m, pages, k)?;
            let st = m.pager.stats();
            let c = [Counter::PGFAULT, Counter::PGMAJFAULT, Counter::PGSTEAL].map(|c| st.get(c));
            let mut footprint = std::mem::take(&mut out.footprint);
            let (huge, refused) = (
                st.get(Counter::THP_COLLAPSE_ALLOC),
                st.get(Counter::THP_COLLAPSE_ALLOC_FAILED),
            );
            if huge + refused > 0 {
                footprint += &format!("; huge folios made {huge}, refused {refused}");
            }
            (out, c, footprint)
        }
        Kind::Kernel { random } => {
            let m = KernelMapper {
                fds: raw.iter().map(|f| f.as_raw_fd()).collect(),
                pages,
                random,
                writable: k.write_pct > 0,
            };
            (access::run(w, &m, pages, k)?, [0; 3], String::new())
        }
    };
    let l = out.latency.percentiles();
    Ok(format!(
        "ok {} {} {} {} {} {} {} {} {} {} {} | {footprint}\n",
        out.ops,
        out.elapsed.as_secs_f64(),
        out.mismatches,
        c[0],
        c[1],
        c[2],
        l.count,
        l.p50_ns,
        l.p99_ns,
        l.p999_ns,
        l.max_ns
    ))
}

/// Parses [`run_side`]'s line into `side`.
fn parse_line(text: &str, side: &mut Side) -> Result<(), String> {
    let (nums, footprint) = text.split_once(" | ").unwrap_or((text, ""));
    side.footprint = footprint.trim().to_string();
    let f: Vec<&str> = nums.split_whitespace().collect();
    let n = |s: &str| s.parse::<u64>().unwrap_or(0);
    match f.as_slice() {
        ["ok", ops, secs, mm, a, b, c, count, p50, p99, p999, max] => {
            side.ops = n(ops);
            side.secs = secs.parse().unwrap_or(0.0);
            side.mismatches = n(mm);
            side.pager = [n(a), n(b), n(c)];
            side.latency = Percentiles {
                count: n(count),
                p50_ns: n(p50),
                p99_ns: n(p99),
                p999_ns: n(p999),
                max_ns: n(max),
                ..Percentiles::default()
            };
            Ok(())
        }
        _ => Err(format!(
            "{}: {}",
            side.name,
            text.trim().trim_start_matches("err ")
        )),
    }
}

/// One side to run: what, on which files, under which budget.
struct Job<'a> {
    w: Workload,
    k: &'a Knobs,
    kind: Kind,
    files: &'a [PatternFile],
    budget: u64,
    dir: &'a Path,
}

/// Forks a child that joins `group` and runs `job`; waits for it, and kills
/// it if it runs far past its duration (a hang is reported, not waited
/// out).
fn in_child(job: &Job<'_>, group: &MemCgroup, name: String) -> Result<Side, String> {
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
        let mut wr = unsafe { std::fs::File::from_raw_fd(fds[1]) };
        // SAFETY: as above.
        unsafe { libc::close(fds[0]) };
        crate::os::interrupt::unblock_in_child();
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        // A panic must not unwind into the parent's frames, which the child
        // shares: it becomes an error line.
        let line = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            group
                .add(me)
                .and_then(|()| run_side(job.w, job.k, job.kind, job.files, job.budget, job.dir))
                .unwrap_or_else(|e| format!("err {e}\n"))
        }))
        .unwrap_or_else(|_| "err the side panicked\n".to_string());
        let _ = wr.write_all(line.as_bytes());
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: the parent's own descriptors.
    unsafe { libc::close(fds[1]) };
    // SAFETY: as above.
    let mut r = unsafe { std::fs::File::from_raw_fd(fds[0]) };
    // The child writes one short line (well under a pipe's buffer) just
    // before it exits, so waiting first cannot block it.
    let deadline =
        std::time::Instant::now() + job.k.duration * 10 + std::time::Duration::from_secs(120);
    let mut status = 0;
    let mut timed_out = false;
    loop {
        // SAFETY: polls our own child.
        let got = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if got == pid || got < 0 {
            break;
        }
        if std::time::Instant::now() > deadline {
            timed_out = true;
            // SAFETY: our child, not yet reaped.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut text = String::new();
    let _ = r.read_to_string(&mut text);
    let mut side = Side {
        name,
        cgroup: group.stat(),
        ..Side::default()
    };
    if timed_out {
        side.killed = Some("killed: ran 10× past its duration".to_string());
        return Ok(side);
    }
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
    parse_line(&text, &mut side)?;
    Ok(side)
}

/// The run's files, in pages each, and how many, and the engine's budget
/// (see [`run`]).
fn files_of(w: Workload, k: &Knobs) -> Result<(usize, usize, u64), String> {
    Ok(match w {
        Workload::Random => {
            // 4 × the limit, which itself grows with the file's page states.
            let mut pages = 4 * k.budget_pages as usize;
            for _ in 0..3 {
                pages = 4 * (limit(k.budget_pages, pages)? as usize / PAGE_SIZE);
            }
            // Whole pages of the engine's page size (a 2 MiB region's
            // length is a multiple of 2 MiB).
            let units = k.page_size / PAGE_SIZE;
            (pages.next_multiple_of(units), 1, k.budget_pages)
        }
        Workload::Scan => {
            let p = k.pages.max(1);
            (
                p,
                1,
                k.budget_pages.max(crate::workload::scan::budget_holding(p)),
            )
        }
        Workload::Filemap => (k.pages.max(1), k.threads.max(1), k.budget_pages),
    })
}

/// Runs workload `w`'s sides with their files in `dir` (a disk file
/// system). File sizes: `random` 4 × the limit; `scan` `k.pages`, the
/// engine's budget raised to hold it (warm passes); `filemap` `k.pages`
/// per thread.
pub fn run(w: Workload, k: &Knobs, dir: &Path) -> Result<Report, String> {
    check(w, k, dir)?;
    // The thread that waits for the ending signals holds no lock a child
    // could inherit (and kills the children when it cleans up).
    if threads_in_process() != 1 + crate::os::interrupt::helper_threads() {
        return Err(
            "the kernel baseline forks its sides and must start before any other thread".into(),
        );
    }
    let (file_pages, files, budget) = files_of(w, k)?;
    let limit = limit(budget, file_pages * files)?;
    let files: Vec<PatternFile> = (0..files)
        .map(|_| PatternFile::create(dir, "baseline", file_pages))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut kinds = vec![
        (
            Kind::Engine,
            format!(
                "engine ({}, {}{})",
                k.policy,
                access::engine_map_options(w, k).install_kind(),
                if k.kernel_maps { ", kernel-mapped" } else { "" }
            )
            .to_lowercase(),
        ),
        (Kind::Kernel { random: false }, "kernel mmap".to_string()),
    ];
    if w == Workload::Random {
        kinds.push((
            Kind::Kernel { random: true },
            "kernel mmap + MADV_RANDOM".to_string(),
        ));
    }
    let mut sides = Vec::new();
    let mut cgroup = "";
    for (i, (kind, name)) in kinds.into_iter().enumerate() {
        for f in &files {
            drop_cache(f.file());
        }
        let group = MemCgroup::create(
            &format!("uffd-pager-baseline-{}-{i}", std::process::id()),
            limit,
        )?;
        cgroup = group.version();
        let job = Job {
            w,
            k,
            kind,
            files: &files,
            budget,
            dir,
        };
        sides.push(in_child(&job, &group, name)?);
    }
    Ok(Report {
        workload: w,
        sides,
        cgroup,
        limit,
        file_pages,
        files: files.len(),
        budget_pages: budget,
    })
}

/// What [`run`] refuses before it starts, for the command line to report
/// as a usage error: no budget, a directory that is missing or on tmpfs,
/// an anonymous scan.
pub fn check(w: Workload, k: &Knobs, dir: &Path) -> Result<(), String> {
    if !dir.is_dir() {
        return Err(format!(
            "{}: not a directory (--baseline-dir)",
            dir.display()
        ));
    }
    if k.budget_pages == 0 {
        return Err(
            "--baseline kernel needs a budget (--budget PAGES): it is the memory limit".into(),
        );
    }
    // Each side runs in a memory cgroup: one made and removed now says
    // whether it can (root, a memory controller), before the files are
    // written (an ordinary user's run wrote gigabytes of them first, then
    // failed with exit code 1).
    crate::os::cgroup::MemCgroup::create(
        &format!("uffd-pager-baseline-check-{}", std::process::id()),
        64 << 20,
    )?;
    if crate::os::mem::on_tmpfs(dir) {
        return Err(format!(
            "{} is tmpfs: the kernel baseline needs a disk file system (--baseline-dir)",
            dir.display()
        ));
    }
    // The files are made there (and unlinked at once): one made and
    // removed now says whether it can.
    PatternFile::create(dir, "baseline-check", 0).map_err(|e| {
        format!(
            "--baseline-dir {}: the kernel baseline cannot make its files there ({e})",
            dir.display()
        )
    })?;
    // The files must fit: made first and written whole, files larger than
    // the disk filled it (a 1 TiB `filemap` at a gigabyte a second).
    let (file_pages, files, _) = files_of(w, k)?;
    let need = (file_pages as u64)
        .checked_mul(files as u64)
        .and_then(|p| p.checked_mul(PAGE_SIZE as u64));
    let free = crate::os::mem::free_bytes(dir)
        .map_err(|e| format!("--baseline-dir {}: {e}", dir.display()))?;
    // (A tenth more: the engine's swap files and the disk's own use.)
    if need.is_none_or(|n| n.saturating_add(n / 10) > free) {
        return Err(format!(
            "the kernel baseline's files come to {} MiB ({files} of {file_pages} pages), more \
             than {} MiB free on {} (--baseline-dir): use a smaller --budget or --pages",
            need.map_or(u64::MAX, |n| n >> 20),
            free >> 20,
            dir.display()
        ));
    }
    if w == Workload::Scan
        && access::engine_map_options(w, k).install_kind() == uffd_pager::InstallKind::Anonymous
    {
        return Err(
            "scan --baseline kernel needs the shared kind: an anonymous region's pages go with MADV_DONTNEED, so its passes would not be warm".into(),
        );
    }
    Ok(())
}
