//! A descriptor of a `/proc/self` file kept for later reads, that stays
//! this process's own.
//!
//! Two hazards make a kept descriptor lie:
//!
//! - **fork.** The child inherits the descriptor, and a `/proc/self/*`
//!   descriptor belongs to the process that opened it: read in the
//!   child, `/proc/self/mem` gives the parent's memory and
//!   `/proc/self/pagemap` the parent's page tables.
//! - **The application's own `close`.** A program that closes every
//!   descriptor it did not open (daemons do) frees the number, and its next
//!   `open` may reuse it for a file of its own.
//!
//! [`SelfFile::fd`] checks both each call (the process id it was opened
//! in, and the device and inode it had) and opens the file again where
//! either fails. The old number is never closed: after a fork it is the
//! child's copy of the parent's descriptor, which no reader here uses
//! again (their process id check fails) but which another thread could
//! close and reuse meanwhile, and after a reuse it is the application's.
//! So a forked child that uses the file leaks one descriptor. Cost:
//! `getpid` and `fstat` per call, `open` after a fork or a reuse.
//! Async-signal-safe (`getpid`, `fstat`, `open`, `close` of its own
//! unpublished descriptor, and atomics), `errno` kept.

use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// A `/proc/self` file opened on first use and checked on every use.
pub struct SelfFile {
    path: &'static CStr,
    /// The process id (high 32 bits) and descriptor (low 32 bits) it was
    /// opened in; `u64::MAX` while none.
    state: AtomicU64,
    dev: AtomicU64,
    ino: AtomicU64,
}

const NONE: u64 = u64::MAX;

fn pack(pid: i32, fd: i32) -> u64 {
    ((pid as u32 as u64) << 32) | fd as u32 as u64
}

fn unpack(s: u64) -> (i32, i32) {
    ((s >> 32) as u32 as i32, s as u32 as i32)
}

/// The device and inode of `fd`, if it is open.
fn identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: a zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes only `st`; a closed or reused number is only
    // asked about.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

impl SelfFile {
    /// `path`, read-only and close-on-exec, not opened yet.
    pub const fn new(path: &'static CStr) -> SelfFile {
        SelfFile {
            path,
            state: AtomicU64::new(NONE),
            dev: AtomicU64::new(0),
            ino: AtomicU64::new(0),
        }
    }

    fn is_it(&self, fd: i32) -> bool {
        identity(fd) == Some((self.dev.load(Acquire), self.ino.load(Acquire)))
    }

    /// The descriptor, this process's own and still the file: opened (again)
    /// where there is none, where it was inherited from a parent, or where
    /// its number now names another file. `Err(errno)` if it cannot be
    /// opened.
    pub fn fd(&self) -> Result<i32, i32> {
        let saved = super::errno();
        let r = self.fd_inner();
        super::set_errno(saved);
        r
    }

    fn fd_inner(&self) -> Result<i32, i32> {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let seen = self.state.load(Acquire);
        let (by, old) = unpack(seen);
        if seen != NONE && by == pid && self.is_it(old) {
            return Ok(old);
        }
        // SAFETY: a NUL-terminated path; the descriptor is ours.
        let fd = unsafe { libc::open(self.path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(super::errno());
        }
        let Some((dev, ino)) = identity(fd) else {
            let e = super::errno();
            // SAFETY: our own descriptor, never published.
            unsafe { libc::close(fd) };
            return Err(e);
        };
        // (Every open of the file in this process has this identity while
        // one is open, so a racing repair stores the same values.)
        self.dev.store(dev, Release);
        self.ino.store(ino, Release);
        match self
            .state
            .compare_exchange(seen, pack(pid, fd), AcqRel, Acquire)
        {
            Ok(_) => Ok(fd),
            Err(now) => {
                // SAFETY: our own descriptor, never published.
                unsafe { libc::close(fd) };
                // Another thread repaired it first.
                let (by, won) = unpack(now);
                if by == pid && self.is_it(won) {
                    Ok(won)
                } else {
                    Err(libc::EAGAIN)
                }
            }
        }
    }

    /// The descriptor if one is kept that is this process's own and still
    /// the file; never opens. -1 if not.
    pub fn kept(&self) -> i32 {
        let saved = super::errno();
        let (by, fd) = unpack(self.state.load(Acquire));
        // SAFETY: getpid has no preconditions.
        let ok = fd >= 0 && by == unsafe { libc::getpid() } && self.is_it(fd);
        super::set_errno(saved);
        if ok {
            fd
        } else {
            -1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A number the application closed and reused for a file of its own is
    /// left to it, and the file opened anew.
    #[test]
    fn a_reused_number_is_not_read() {
        static PAGEMAP: SelfFile = SelfFile::new(c"/proc/self/pagemap");
        let fd = PAGEMAP.fd().unwrap();
        // SAFETY: the test's own descriptor of the kept file.
        unsafe { libc::close(fd) };
        // SAFETY: a NUL-terminated path; the descriptor is the test's.
        let other = unsafe { libc::open(c"/proc/self/status".as_ptr(), libc::O_RDONLY) };
        assert!(other >= 0);
        if other == fd {
            assert_eq!(PAGEMAP.kept(), -1, "the reused number is not the file");
        }
        let again = PAGEMAP.fd().unwrap();
        assert_ne!(again, other);
        assert!(PAGEMAP.kept() == again);
        // SAFETY: the test's own descriptor.
        unsafe { libc::close(other) };
    }
}
