//! Filling a memfd's pages so that nobody sees one half written: through a
//! pipe, with `splice`.
//!
//! # Why
//! A kernel-mapped object's pages ([`crate::MapOptions::kernel_maps`]) are
//! mapped by the kernel's own fault path as soon as the memfd holds them.
//! `pwrite` into shmem is not safe for that: it puts a new folio into the
//! page cache first and copies into it with page faults disabled, and if
//! the source is not mapped at that moment (a file's page not faulted in
//! yet, or any page under migration, compaction or reclaim) the copy comes
//! up short, and shmem marks the folio up to date with the missing part
//! zeroed before the write faults the source in and copies again. A read
//! fault on the page in between maps the zeros; a test saw it on the first
//! pages that readahead wrote from a tmpfs file's view
//! (`tests/engine_kernel_maps.rs`). The engine's own install paths never
//! map such a page (they wait for the page lock), so only this mode needs
//! the care.
//!
//! `splice` from a pipe writes from the pipe's own pages, which the kernel
//! copies with no fault possible: the folio is locked, not up to date,
//! until the copy is whole, and a fault waits for it. The bytes reach the
//! pipe with a plain `write`, which may fault on the source freely (no
//! folio is held then).
//!
//! That holds for a memfd of base-page folios only. With shmem's large
//! folios on (`shmem_enabled` `always`, `within_size` or `force`, or a
//! per-size `hugepages-*kB/shmem_enabled` that resolves to one of those),
//! writing one page into a hole can allocate a large folio whose other
//! pages are zeroed and up to date, and punching one page out of a folio
//! that cannot split zeroes it in place: pages the engine thinks absent
//! would read as zeros. [`large_folios_possible`] says whether the system
//! allows them, and a kernel-mapped region is refused while it does.
//!
//! # Cost
//! Two system calls per run of pages where `pwrite` takes one, and a second
//! copy. Pipes come from a pool of [`PIPES`], made by [`PipePool::prepare`]
//! (on an ordinary thread, when the first kernel-mapped region is mapped);
//! a call claims the first free one with an atomic swap per pipe it tries.
//! When all are busy it makes a pipe of its own and closes it after, and if
//! it cannot (the process is out of descriptors) it yields and tries the
//! pool again. Async-signal-safe: no allocation, no lock that is waited
//! for, errno left to the caller (the SIGBUS handler saves it).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering::*};

/// Pipes in a pool: enough for the faulting threads and the I/O threads of
/// a small machine at once.
pub const PIPES: usize = 16;

/// Bytes a pipe is asked to hold: a readahead run
/// ([`crate::store::MAX_BATCH`] pages).
const WANT_BYTES: usize = crate::store::MAX_BATCH * super::PAGE_SIZE;

struct Slot {
    busy: AtomicBool,
    /// Read end, write end; -1 until made.
    rd: AtomicI32,
    wr: AtomicI32,
    /// Bytes it holds (`F_GETPIPE_SZ`).
    cap: AtomicUsize,
}

/// A pool of pipes for [`PipePool::write_at`].
pub struct PipePool {
    slots: [Slot; PIPES],
}

impl std::fmt::Debug for PipePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipePool").finish_non_exhaustive()
    }
}

impl Default for PipePool {
    fn default() -> Self {
        PipePool {
            slots: std::array::from_fn(|_| Slot {
                busy: AtomicBool::new(false),
                rd: AtomicI32::new(-1),
                wr: AtomicI32::new(-1),
                cap: AtomicUsize::new(0),
            }),
        }
    }
}

impl Drop for PipePool {
    fn drop(&mut self) {
        for s in &self.slots {
            close_pair(s.rd.load(Relaxed), s.wr.load(Relaxed));
        }
    }
}

fn close_pair(rd: RawFd, wr: RawFd) {
    for fd in [rd, wr] {
        if fd >= 0 {
            // SAFETY: a descriptor this pool made and nobody else uses.
            unsafe { libc::close(fd) };
        }
    }
}

/// A new pipe (close-on-exec) and what it holds.
fn make() -> Result<(RawFd, RawFd, usize), i32> {
    let mut fds = [-1; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(super::errno());
    }
    // A larger pipe carries a run in one splice; if the system refuses, the
    // default (16 pages) will do, in chunks.
    // SAFETY: fcntl on a descriptor just made.
    unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, WANT_BYTES as libc::c_int) };
    // SAFETY: as above.
    let cap = unsafe { libc::fcntl(fds[1], libc::F_GETPIPE_SZ) };
    if cap < super::PAGE_SIZE as i32 {
        let e = super::errno();
        close_pair(fds[0], fds[1]);
        return Err(if cap < 0 { e } else { libc::EINVAL });
    }
    Ok((fds[0], fds[1], cap as usize))
}

/// Whether shmem may give a memfd large folios now (see the module docs):
/// reads `/sys/kernel/mm/transparent_hugepage/shmem_enabled` and the
/// per-size `hugepages-*kB/shmem_enabled`. A kernel without them has none.
/// `advise` needs `MADV_HUGEPAGE` on a mapping, which the engine never
/// sets and a `write` has none of. Allocates: ordinary threads only.
pub fn large_folios_possible() -> bool {
    let dir = std::path::Path::new(THP_DIR);
    let current = |p: &std::path::Path| setting(p);
    let top = current(&dir.join("shmem_enabled")).unwrap_or_default();
    let sizes: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| current(&e.path().join("shmem_enabled")))
        .collect();
    large_folios_with(&top, &sizes)
}

/// Where the kernel's transparent-huge-page settings are.
pub const THP_DIR: &str = "/sys/kernel/mm/transparent_hugepage";

/// The chosen value of a sysfs setting that lists its choices with the
/// chosen one bracketed (`always [never]`); `None` if it cannot be read.
/// Allocates: ordinary threads only.
pub fn setting(p: &std::path::Path) -> Option<String> {
    let s = std::fs::read_to_string(p).ok()?;
    let a = s.find('[')?;
    let b = s[a..].find(']')? + a;
    Some(s[a + 1..b].to_string())
}

/// [`large_folios_possible`] for the global setting `top` and the per-size
/// settings `sizes` (the bracketed words of the sysfs files).
fn large_folios_with(top: &str, sizes: &[String]) -> bool {
    let on = |v: &str| matches!(v, "always" | "within_size" | "force");
    on(top) || sizes.iter().any(|v| on(v) || (v == "inherit" && on(top)))
}

impl PipePool {
    /// Makes every pipe of the pool that is not made yet (ordinary threads:
    /// a failure here is reported where it can be, at map time, not in a
    /// fault). Idempotent; racing calls are safe (a slot is claimed first).
    pub fn prepare(&self) -> Result<(), i32> {
        for s in &self.slots {
            if s.busy.swap(true, Acquire) {
                continue;
            }
            let r = if s.rd.load(Relaxed) < 0 {
                make().map(|(rd, wr, cap)| {
                    s.cap.store(cap, Relaxed);
                    s.wr.store(wr, Relaxed);
                    s.rd.store(rd, Relaxed);
                })
            } else {
                Ok(())
            };
            s.busy.store(false, Release);
            r?;
        }
        Ok(())
    }

    /// Writes the `len` bytes at `src` to `fd` at `off` through a pipe
    /// (see the module docs): a reader of `fd`'s page cache sees each page
    /// either absent or whole. `fd` is a shmem file, `off` and `len` whole
    /// pages.
    ///
    /// # Safety
    /// `[src, src + len)` must be a mapped range of this process for the
    /// call; only the kernel reads it (a failure to read it is `EFAULT`).
    /// `fd` is a descriptor the caller may write whose written range no
    /// Rust reference covers (the engine's memfd, at pages it holds locked
    /// and has lent to nobody), and `off + len` fits in an `i64`.
    pub unsafe fn write_at(
        &self,
        fd: RawFd,
        src: *const u8,
        len: usize,
        off: u64,
    ) -> Result<(), i32> {
        // Tries over a second at most (a pipe is held for one copy of a
        // run, microseconds), then the error of the last make.
        const TRIES: u32 = 100_000;
        let mut last = libc::EMFILE;
        for _ in 0..TRIES {
            for s in &self.slots {
                if s.busy.swap(true, Acquire) {
                    continue;
                }
                if s.rd.load(Relaxed) < 0 {
                    match make() {
                        Ok((rd, wr, cap)) => {
                            s.cap.store(cap, Relaxed);
                            s.wr.store(wr, Relaxed);
                            s.rd.store(rd, Relaxed);
                        }
                        // (The own pipe below will say why, if it fails too.)
                        Err(_) => {
                            s.busy.store(false, Release);
                            continue;
                        }
                    }
                }
                let (rd, wr, cap) = (s.rd.load(Relaxed), s.wr.load(Relaxed), s.cap.load(Relaxed));
                // SAFETY: the caller's contract; the slot is ours.
                let r = unsafe { through(rd, wr, cap, fd, src, len, off) };
                if r.is_err() {
                    // It may hold bytes a later call would splice: a fresh
                    // one next time.
                    close_pair(rd, wr);
                    s.rd.store(-1, Relaxed);
                    s.wr.store(-1, Relaxed);
                }
                s.busy.store(false, Release);
                return r;
            }
            // All busy (or none could be made): a pipe of this call's own.
            match make() {
                Ok((rd, wr, cap)) => {
                    // SAFETY: the caller's contract.
                    let r = unsafe { through(rd, wr, cap, fd, src, len, off) };
                    close_pair(rd, wr);
                    return r;
                }
                Err(e) => last = e,
            }
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
        Err(last)
    }
}

/// One pipe's worth at a time: `write` into the (empty) pipe, then
/// `splice` all of it out to `fd` at its offset.
///
/// # Safety
/// As [`PipePool::write_at`]; `rd`/`wr` are an empty pipe of `cap` bytes
/// that only this call uses.
unsafe fn through(
    rd: RawFd,
    wr: RawFd,
    cap: usize,
    fd: RawFd,
    src: *const u8,
    len: usize,
    off: u64,
) -> Result<(), i32> {
    let mut done = 0;
    while done < len {
        let chunk = (len - done).min(cap);
        #[cfg(test)]
        let chunk = match tests::FAIL_AFTER.with(|f| f.get()) {
            at if done >= at => return Err(libc::ENOMEM),
            at => chunk.min(at - done),
        };
        // SAFETY: `[done + put, done + chunk)` lies in the caller's range;
        // the pipe has room for the whole chunk, so a blocking write
        // returns.
        super::all_of(chunk, |put| unsafe {
            libc::write(wr, src.add(done + put).cast(), chunk - put)
        })?;
        super::all_of(chunk, |out| {
            let mut at = (off + (done + out) as u64) as libc::loff_t;
            // SAFETY: plain descriptors; `at` is a valid offset cell.
            unsafe { libc::splice(rd, std::ptr::null_mut(), fd, &mut at, chunk - out, 0) }
        })?;
        done += chunk;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    thread_local! {
        /// Bytes a call on this thread writes before it fails with
        /// `ENOMEM` (a splice that ran out of memory halfway).
        pub(crate) static FAIL_AFTER: std::cell::Cell<usize> =
            const { std::cell::Cell::new(usize::MAX) };
    }

    #[test]
    fn large_folios_are_possible_when_a_setting_resolves_on() {
        let v = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(!large_folios_with(
            "never",
            &v(&["never", "inherit", "advise"])
        ));
        assert!(!large_folios_with("advise", &v(&["inherit"])));
        assert!(!large_folios_with("", &[]));
        assert!(large_folios_with("within_size", &[]));
        assert!(large_folios_with("force", &v(&["never"])));
        assert!(large_folios_with("never", &v(&["never", "always"])));
        assert!(large_folios_with("always", &v(&["inherit"])));
    }

    #[test]
    fn writes_whole_runs_through_a_pool_and_past_it() {
        let pool = PipePool::default();
        pool.prepare().unwrap();
        let m = crate::sys::mem::Memfd::new("pipe-test", 64 * 4096).unwrap();
        let data: Vec<u8> = (0..40 * 4096).map(|i| (i * 7 % 251) as u8).collect();
        // A run larger than any pipe, at an offset.
        // SAFETY: `data` is mapped for the call.
        unsafe { pool.write_at(m.fd(), data.as_ptr(), data.len(), 8 * 4096) }.unwrap();
        let mut back = vec![0u8; data.len()];
        // SAFETY: reading into a buffer of its length.
        let n = unsafe { libc::pread(m.fd(), back.as_mut_ptr().cast(), back.len(), 8 * 4096) };
        assert_eq!(n as usize, data.len());
        assert_eq!(back, data);
        // Every slot busy: the call makes a pipe of its own.
        for s in &pool.slots {
            s.busy.store(true, Relaxed);
        }
        // SAFETY: as above.
        unsafe { pool.write_at(m.fd(), data.as_ptr(), 4096, 0) }.unwrap();
        // An unreadable source is an error, and the slot's pipe is remade.
        for s in &pool.slots {
            s.busy.store(false, Relaxed);
        }
        // SAFETY: page 0 of the address space is never mapped for this
        // process; the kernel reports EFAULT rather than faulting.
        let r = unsafe { pool.write_at(m.fd(), 4096 as *const u8, 4096, 0) };
        assert_eq!(r, Err(libc::EFAULT));
        // SAFETY: as above.
        unsafe { pool.write_at(m.fd(), data.as_ptr(), 4096, 4096) }.unwrap();
    }
}
