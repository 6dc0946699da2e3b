//! Memfds, the page cache of shared regions: creation, sizing, hole
//! punching and writes (`pwrite`, async-signal-safe).

use super::super::{all_of, errno};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Whether the file `fd` has a hole at byte `at` (`SEEK_DATA` finds no
/// data there). An error other than "no data after" (`ENXIO`) is not a
/// hole, so a caller that would write a whole page over one never does it
/// on a failed look.
pub fn hole_at(fd: i32, at: u64) -> bool {
    // SAFETY: lseek on a descriptor the caller holds; it moves only that
    // descriptor's offset, which the engine never uses (it reads and
    // writes the memfd with pread/pwrite).
    let r = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
    if r < 0 {
        errno() == libc::ENXIO
    } else {
        r as u64 > at
    }
}

/// A memfd: the page cache of a shared region.
#[derive(Debug)]
pub struct Memfd {
    fd: OwnedFd,
}

impl Memfd {
    /// Creates a memfd of `len` bytes.
    pub fn new(name: &str, len: usize) -> Result<Memfd, i32> {
        Self::with_flags(name, len, 0)
    }

    /// Creates a memfd of `len` bytes with `memfd_create` flags beyond
    /// `MFD_CLOEXEC` (`MFD_HUGETLB`, see [`crate::sys::huge`]).
    pub fn with_flags(name: &str, len: usize, flags: u32) -> Result<Memfd, i32> {
        let cname = std::ffi::CString::new(name).map_err(|_| libc::EINVAL)?;
        // SAFETY: `cname` is a valid C string.
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | flags) };
        if fd < 0 {
            return Err(errno());
        }
        // SAFETY: a fresh descriptor that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let m = Memfd { fd };
        m.truncate(len)?;
        Ok(m)
    }

    /// Sets the length.
    pub fn truncate(&self, len: usize) -> Result<(), i32> {
        // SAFETY: ftruncate on our descriptor.
        if unsafe { libc::ftruncate(self.fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(errno());
        }
        Ok(())
    }

    /// The descriptor.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The descriptor, borrowed for as long as the memfd lives.
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// Bytes of memory the memfd holds (`st_blocks`).
    pub fn allocated(&self) -> u64 {
        // SAFETY: an all-zero `stat` is a valid value to fill.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat fills `st` for our own descriptor.
        match unsafe { libc::fstat(self.fd.as_raw_fd(), &mut st) } {
            0 => st.st_blocks as u64 * 512,
            _ => 0,
        }
    }

    /// Copies `buf.len()` bytes at `off` into `buf` through the kernel
    /// (`pread`): no Rust reference is made to the pages, which a mapping
    /// of the memfd may be writing meanwhile. A hole reads as zeros.
    /// Async-signal-safe.
    pub fn read_at(&self, off: usize, buf: &mut [u8]) -> Result<(), i32> {
        let fd = self.fd.as_raw_fd();
        all_of(buf.len(), |done| {
            // SAFETY: `buf[done..]` is valid for writes; `fd` is ours.
            unsafe {
                libc::pread(
                    fd,
                    buf.as_mut_ptr().add(done).cast(),
                    buf.len() - done,
                    (off + done) as libc::off_t,
                )
            }
        })
    }

    /// Frees the pages of `[off, off+len)`; async-signal-safe.
    #[inline]
    pub fn punch_hole(&self, off: usize, len: usize) -> Result<(), i32> {
        // SAFETY: fallocate on our descriptor.
        let rc = unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(errno())
        }
    }
}

/// Writes all of `buf` to `fd` at `off` (`pwrite`, retried on `EINTR` and
/// short writes); async-signal-safe.
pub fn pwrite_all(fd: RawFd, buf: &[u8], off: u64) -> Result<(), i32> {
    // SAFETY: `buf` is valid for reads of its length.
    unsafe { pwrite_all_raw(fd, buf.as_ptr(), buf.len(), off) }
}

/// As [`pwrite_all`], from `len` bytes at `src` that only the kernel reads
/// (a file's pages mapped by a store): no Rust reference to them is made.
/// If the kernel cannot read them, the error is `EFAULT`.
///
/// # Safety
/// `[src, src + len)` must be a mapped range of this process for the call
/// (reading it may still fail, which is reported, not faulted on).
pub unsafe fn pwrite_all_raw(fd: RawFd, src: *const u8, len: usize, off: u64) -> Result<(), i32> {
    all_of(len, |done| {
        // SAFETY: the caller's range, of which `[done, len)` is left; `fd`
        // is the caller's open descriptor. The kernel reads the bytes.
        unsafe {
            libc::pwrite(
                fd,
                src.add(done).cast(),
                len - done,
                (off + done as u64) as libc::off_t,
            )
        }
    })
}
