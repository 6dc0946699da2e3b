//! Helpers shared by the `engine_*` integration tests (included with
//! `#[path = "engine_util.rs"] mod util;`). Compiled on its own it is an
//! empty test crate.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;
use uffd_pager::{Delivery, Pager};

/// The engine's page size.
pub const PAGE: usize = 4096;

/// Handler-thread delivery as the tests use it.
pub const THREADS: Delivery = Delivery::Threads {
    threads: 2,
    spin_us: 0,
};

/// Every delivery mode.
pub const DELIVERIES: [Delivery; 3] = [Delivery::InThread, THREADS, Delivery::PerRegion];

/// Environment variable that turns the child-only tests on.
pub const CHILD_ENV: &str = "UFFD_CHILD";

/// A pseudo-random but deterministic byte for `offset` (a hash of the offset
/// and a seed), so that every byte of every page differs from its
/// neighbours and from other seeds.
pub fn pattern(seed: u64, offset: usize) -> u8 {
    let mut z = (offset as u64) ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 33)).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    z = (z ^ (z >> 33)).wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    (z ^ (z >> 33)) as u8
}

/// `len` bytes of [`pattern`] for `seed`, starting at offset 0.
pub fn pattern_vec(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|o| pattern(seed, o)).collect()
}

/// Asserts two byte ranges are equal, naming the first differing offset
/// (instead of dumping megabytes).
#[track_caller]
pub fn assert_bytes(actual: &[u8], expected: &[u8], ctx: &str) {
    assert_eq!(actual.len(), expected.len(), "{ctx}: length differs");
    if let Some(i) = actual.iter().zip(expected).position(|(a, b)| a != b) {
        let bad = actual.iter().zip(expected).filter(|(a, b)| a != b).count();
        panic!(
            "{ctx}: {bad} bytes differ; first at offset {i:#x} (page {}): got {:#04x}, want {:#04x}",
            i / PAGE,
            actual[i],
            expected[i]
        );
    }
}

/// A pager with the given delivery and neither readahead nor fault-around,
/// so that every page is faulted (and read) on its own: the counts these
/// tests assert are per page.
pub fn pager(d: Delivery) -> Pager {
    Pager::builder()
        .delivery(d)
        .readahead(0, 1)
        .fault_around(0)
        .build()
        .unwrap_or_else(|e| panic!("building a {d} pager: {e}"))
}

/// A writable region of `pages` pages holding [`pattern`] `seed`, and its
/// expected contents: anonymous memory written by the test, or a shared
/// region over a memory store.
pub fn filled_region(
    p: &Pager,
    kind: uffd_pager::InstallKind,
    pages: usize,
    seed: u64,
) -> (uffd_pager::Region, Vec<u8>) {
    use uffd_pager::store::MemoryStore;
    let data = pattern_vec(seed, pages * PAGE);
    match kind {
        uffd_pager::InstallKind::Anonymous => {
            let mut r = p.map_anonymous(pages * PAGE).unwrap();
            r.as_mut_slice().copy_from_slice(&data);
            (r, data)
        }
        uffd_pager::InstallKind::Shared => {
            let store = std::sync::Arc::new(MemoryStore::from_bytes(&data).unwrap());
            // SAFETY: the test changes this store only through the region (the
            // store contract).
            let r = unsafe { p.map_store(store, data.len(), &uffd_pager::MapOptions::default()) }
                .unwrap();
            (r, data)
        }
    }
}

/// A file in the temporary directory, removed on drop.
#[derive(Debug)]
pub struct TempFile {
    path: PathBuf,
}

impl TempFile {
    /// Creates a uniquely named file holding `contents`.
    pub fn with_contents(tag: &str, contents: &[u8]) -> TempFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("uffd-engine-{tag}-{}-{n}.bin", std::process::id()));
        std::fs::write(&path, contents).expect("writing temp file");
        TempFile { path }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's current contents.
    pub fn read(&self) -> Vec<u8> {
        std::fs::read(&self.path).expect("reading temp file")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether this process is a child started by [`run_child`].
pub fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// The user id the unprivileged tests run as (`nobody`).
pub const NOBODY: u32 = 65534;

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// As [`run_child`], the child the first process of a new PID namespace
/// (an init, which drops a signal sent to it while its action is the
/// default; `unshare --pid --fork --kill-child`, as root). `None` if it
/// still ran after 20 s (it was killed then), with its output in the
/// message.
pub fn run_child_as_init(name: &str, envs: &[(&str, &str)]) -> Result<Output, String> {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--kill-child"])
        .arg(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("RUST_BACKTRACE", "0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    // (`--kill-child`: the namespace goes with `unshare` when it is killed.)
    output_within(cmd, 20).map_err(|out| describe(&out))
}

/// Runs `cmd` and returns its output (stdout and stderr piped), or, if
/// it is still running after `secs` seconds, kills it and returns what it
/// wrote as `Err`. A child that hung waited for ever (`Command::output`),
/// and the run with it.
pub fn output_within(mut cmd: Command, secs: u64) -> Result<Output, Output> {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning child test process");
    // Read while it runs: a child that fills a pipe would block on it.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let t = std::time::Instant::now();
    let (status, in_time) = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break (st, true);
        }
        if t.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            break (child.wait().unwrap(), false);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let o = Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    };
    if in_time {
        Ok(o)
    } else {
        Err(o)
    }
}

/// How long a child test process may run ([`run_child`]) before it is
/// taken for hung, killed, and the test fails.
pub const CHILD_LIMIT_S: u64 = 180;

/// [`output_within`] [`CHILD_LIMIT_S`]; panics with the child's output if
/// it ran past it.
pub fn child_output(cmd: Command) -> Output {
    output_within(cmd, CHILD_LIMIT_S).unwrap_or_else(|out| {
        panic!(
            "the child ran past {CHILD_LIMIT_S} s (hung?) and was killed:\n{}",
            describe(&out)
        )
    })
}

/// As [`run_child`], but the child runs as user and group [`NOBODY`] with no
/// supplementary groups when this process is root (otherwise it already
/// runs unprivileged, as the current user).
pub fn run_child_unprivileged(name: &str, envs: &[(&str, &str)]) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = child_command(name, envs);
    if is_root() {
        // As root, std drops the supplementary groups when it sets the uid.
        cmd.uid(NOBODY).gid(NOBODY);
    }
    child_output(cmd)
}

/// Runs the test `name` of the current test binary in a child process with
/// `UFFD_CHILD=1` plus `envs`, and returns its output.
pub fn run_child(name: &str, envs: &[(&str, &str)]) -> Output {
    child_output(child_command(name, envs))
}

/// The command [`run_child`] runs.
pub fn child_command(name: &str, envs: &[(&str, &str)]) -> Command {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("RUST_BACKTRACE", "0");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd
}

/// The signal that ended a child, if any.
pub fn exit_signal(out: &Output) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    out.status.signal()
}

/// A short description of a child's exit and output, for messages.
pub fn describe(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `f` on a fresh thread and aborts the test binary if it does not
/// finish within `secs` seconds (a hang becomes a failed run rather than a
/// stuck one). A panic inside `f` is propagated.
pub fn with_deadline<F: FnOnce() + Send + 'static>(secs: u64, what: &str, f: F) {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => h.join().expect("test body panicked"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // The body panicked: surface its panic.
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            // Not a panic: the body still runs, and holds what it holds (a
            // file's serialising lock, a held engine thread), so the other
            // tests of the binary waited behind it and each failed as a
            // hang of its own, a minute apiece (as a CI run once did).
            eprintln!("{what}: did not finish within {secs}s (hang?); the test binary aborts");
            std::process::abort()
        }
    }
}

/// A currently free, page-aligned address range of `len` bytes (at most
/// 64 MiB), for fixed-address mappings. Addresses come from an area far
/// below where the kernel places mappings on its own (top-down from the
/// stack), each call a fresh slot, so a concurrent test's mmap does not
/// land there between this probe and the caller's use.
pub fn free_range(len: usize) -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    const SLOT: usize = 64 << 20;
    assert!(len <= SLOT);
    let base = 0x2000_0000_0000usize;
    for _ in 0..1000 {
        let addr = base + NEXT.fetch_add(1, Ordering::Relaxed) * SLOT;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; a
        // successful probe is unmapped at once.
        unsafe {
            let p = libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_NORESERVE
                    | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                continue;
            }
            assert_eq!(libc::munmap(p, len), 0, "scratch munmap");
            if p as usize == addr {
                return addr;
            }
        }
    }
    panic!("no free address range found");
}

/// The calling thread's errno.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Runs child test `name` once per delivery mode (its `UFFD_DELIVERY`) and
/// asserts that each was killed by SIGSEGV after it printed "about to
/// write" and before it printed "went through" (a write the engine must
/// refuse).
pub fn assert_child_write_refused(name: &str) {
    for d in DELIVERIES {
        let out = run_child(name, &[("UFFD_DELIVERY", &d.to_string())]);
        assert_eq!(
            exit_signal(&out),
            Some(libc::SIGSEGV),
            "{d}: {}",
            describe(&out)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!stdout.contains("went through"));
        // Killed at the write, not in its set-up (a read refused too).
        assert!(stdout.contains("about to write"), "{d}: {}", describe(&out));
    }
}

/// What a child of [`assert_child_write_refused`] does: makes `r` writable
/// with the application's own `mprotect` and writes one byte at `offset`,
/// printing "went through" if the write is not refused.
pub fn make_writable_and_write(r: &uffd_pager::Region, offset: usize) {
    assert!(offset < r.len());
    // SAFETY: the application's own call on region memory.
    let rc = unsafe {
        libc::mprotect(
            r.as_ptr().cast(),
            r.len(),
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    assert_eq!(rc, 0);
    println!("about to write");
    // SAFETY: inside the region (checked above); a write the engine must
    // refuse.
    unsafe { std::ptr::write_volatile(r.as_ptr().add(offset), 1u8) };
    println!("the write went through");
}

/// Map options for a region of 2 MiB pages of `kind`.
pub fn huge_opts(kind: uffd_pager::InstallKind) -> uffd_pager::MapOptions {
    uffd_pager::MapOptions {
        kind: Some(kind),
        page_size: uffd_pager::HUGE_PAGE_SIZE,
        ..uffd_pager::MapOptions::default()
    }
}

/// A pager with delivery `d` and a budget of `pages` 2 MiB pages.
pub fn huge_pager(d: uffd_pager::Delivery, pages: u64) -> uffd_pager::Pager {
    uffd_pager::Pager::builder()
        .delivery(d)
        .budget_pages(pages * (uffd_pager::HUGE_PAGE_SIZE / 4096) as u64)
        .build()
        .expect("build a pager")
}

/// The application's own `mremap` of `[old, old + len)` to exactly `to`,
/// `new_len` long.
pub fn app_mremap(old: usize, len: usize, new_len: usize, to: usize) {
    // SAFETY: the application moves region memory itself (MREMAP_FIXED
    // onto a range the caller found free).
    let q = unsafe {
        libc::mremap(
            old as *mut libc::c_void,
            len,
            new_len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            to as *mut libc::c_void,
        )
    };
    assert_eq!(q as usize, to, "mremap: {}", errno());
}

/// This process's anonymous resident memory (`RssAnon`), in KiB.
pub fn rss_anon_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon in /proc/self/status")
}

/// Maps `len` bytes of inaccessible anonymous memory of the test's own
/// (a place to move a region to, or an address the kernel refuses);
/// panics if mmap fails. The caller unmaps it, or lets the process end.
pub fn reserve(len: usize) -> usize {
    // SAFETY: a fresh mapping wherever the kernel finds room.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap: {}", errno());
    p as usize
}

/// Maps `len` bytes of anonymous read-write memory of the application's
/// own at `at` with `MAP_FIXED` (replacing whatever is there); returns the
/// address mmap gave (`MAP_FAILED` on error). One system call:
/// async-signal-safe.
///
/// # Safety
/// Whatever was mapped at `[at, at + len)` is gone: nothing may still
/// refer to it.
pub unsafe fn map_own_fixed(at: usize, len: usize) -> usize {
    // SAFETY: the caller gives the range up (the function's contract).
    unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        ) as usize
    }
}

/// Maps the first `len` bytes of `f` shared and read-only; panics if
/// mmap fails.
pub fn map_file_shared(f: &std::fs::File, len: usize) -> usize {
    // SAFETY: a fresh shared read mapping of an open file.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(f),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap of the file: {}", errno());
    p as usize
}

/// Whether anything is mapped at `addr` (its page).
pub fn mapped(addr: usize) -> bool {
    // SAFETY: msync of one page only asks whether it is mapped (ENOMEM if
    // not); MS_ASYNC writes nothing here.
    unsafe {
        libc::msync(
            (addr & !(PAGE - 1)) as *mut libc::c_void,
            PAGE,
            libc::MS_ASYNC,
        ) == 0
    }
}

/// The permissions `/proc/self/maps` gives the mapping at `addr`.
pub fn perms_at(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (range, perms) = (f.next().unwrap(), f.next().unwrap());
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            usize::from_str_radix(a, 16).unwrap(),
            usize::from_str_radix(b, 16).unwrap(),
        );
        if (a..b).contains(&addr) {
            return perms.to_string();
        }
    }
    "unmapped".to_string()
}

/// The value of `field` (as `Rss`, `VmFlags`) for the mapping that holds
/// `addr`, from `/proc/self/smaps`; `None` if no mapping holds it or it
/// has no such line.
pub fn smaps_field(addr: usize, field: &str) -> Option<String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = a <= addr && addr < b;
                    continue;
                }
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix(field).and_then(|v| v.strip_prefix(':')) {
                return Some(v.trim().to_string());
            }
        }
    }
    None
}

/// A read-only memory store the engine calls on its I/O workers (it is
/// not signal-safe), whose reads each take `delay` first.
pub struct OnWorkers {
    pub inner: uffd_pager::store::MemoryStore,
    pub delay: Duration,
}

impl uffd_pager::store::Store for OnWorkers {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), uffd_pager::store::StoreError> {
        std::thread::sleep(self.delay);
        self.inner.read(offset, buf)
    }
    fn write(&self, _: u64, _: &[u8]) -> Result<(), uffd_pager::store::StoreError> {
        Err(uffd_pager::store::StoreError(libc::EROFS))
    }
    fn writable(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "on-workers"
    }
}
