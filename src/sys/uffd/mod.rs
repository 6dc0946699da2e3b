//! userfaultfd: the descriptor and its ioctls. The engine opens the
//! descriptor itself (`open.rs`: `/dev/userfaultfd`, or the system call,
//! user-mode-only for an ordinary user), hands it to the `userfaultfd`
//! crate's type to own, and makes every ioctl raw (registration, the API
//! handshake and feature probe, the fills, WAKE and WRITEPROTECT, and the
//! message reads): the crate lacks MOVE, POISON and the WP modes of COPY
//! and CONTINUE, and one form for all of them (a stack struct, a plain
//! errno) keeps the fault path's calls alike.
//!
//! Every ioctl wrapper is async-signal-safe: one syscall on a stack struct,
//! errors returned as a plain errno.

use std::os::fd::{AsRawFd, RawFd};

mod abi;
pub use abi::*;
pub mod inherit;
mod open;
mod own;
pub use open::{Descriptor, Refused, Want};
pub use own::OwnDescriptor;

/// Result of an ioctl: the kernel's count (bytes for COPY/MOVE/CONTINUE) or the errno.
pub type IoResult = Result<u64, i32>;

#[inline]
fn ioctl<T>(fd: RawFd, req: libc::c_ulong, arg: &mut T) -> Result<(), i32> {
    // SAFETY: `arg` is a live, correctly laid-out `#[repr(C)]` struct whose
    // size is encoded in `req`; the kernel reads and writes it. The install
    // and move ioctls also change the process's memory at the ranges `arg`
    // names (COPY, ZEROPAGE, CONTINUE and POISON fill a range of a
    // registered region; MOVE takes a page from its source): the wrappers
    // are crate-private, and every caller names ranges of the engine's own
    // regions and buffers (a page it holds the lock of, or a cache area it
    // owns), which no Rust reference of the application's covers while the
    // page is absent or being installed.
    let rc = unsafe { libc::ioctl(fd, req, arg as *mut T) };
    if rc == 0 {
        Ok(())
    } else {
        Err(super::errno())
    }
}

/// A userfaultfd descriptor: an owned descriptor of the `userfaultfd`
/// crate, opened here because that crate has no fallback from
/// `/dev/userfaultfd` to the system call and no `UFFD_USER_MODE_ONLY`
/// path for unprivileged processes.
#[derive(Debug)]
pub struct Uffd {
    inner: userfaultfd::Uffd,
    descriptor: Descriptor,
    /// Its slot on [`inherit`]'s list, if it got one.
    listed: Option<usize>,
}

impl Drop for Uffd {
    /// Takes the descriptor off [`inherit`]'s list before `inner` closes it.
    fn drop(&mut self) {
        if let Some(slot) = self.listed {
            inherit::unlist(slot);
        }
    }
}

impl Uffd {
    /// Opens a descriptor as `want` says and enables `features`.
    pub fn open_as(features: u64, want: Want, nonblocking: bool) -> Result<Uffd, Refused> {
        let flags = libc::O_CLOEXEC | if nonblocking { libc::O_NONBLOCK } else { 0 };
        let (fd, descriptor) = open::open_raw(want, flags)?;
        // SAFETY: `fd` is a fresh descriptor that we own from here on.
        let inner = unsafe { <userfaultfd::Uffd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let mut a = ApiArg {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        ioctl(fd, iowr(nr::API, std::mem::size_of::<ApiArg>()), &mut a).map_err(|e| Refused {
            denied: false,
            errno: e,
            message: format!(
                "UFFDIO_API with features {features:#x} ({}): {}",
                feature_names(features),
                std::io::Error::from_raw_os_error(e)
            ),
        })?;
        let listed = inherit::list(fd);
        Ok(Uffd {
            inner,
            descriptor,
            listed,
        })
    }

    /// How the descriptor was opened.
    pub fn descriptor(&self) -> Descriptor {
        self.descriptor
    }

    /// The raw descriptor.
    pub fn fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }

    /// Registers `[start, start+len)` with `mode` bits; returns the ioctls the
    /// range supports.
    pub fn register(&self, start: usize, len: usize, mode: u64) -> Result<u64, i32> {
        let mut a = RegisterArg {
            range: Range {
                start: start as u64,
                len: len as u64,
            },
            mode,
            ioctls: 0,
        };
        ioctl(
            self.fd(),
            iowr(nr::REGISTER, std::mem::size_of::<RegisterArg>()),
            &mut a,
        )?;
        Ok(a.ioctls)
    }

    /// Unregisters a range.
    pub fn unregister(&self, start: usize, len: usize) -> Result<(), i32> {
        let mut r = Range {
            start: start as u64,
            len: len as u64,
        };
        ioctl(
            self.fd(),
            ior(nr::UNREGISTER, std::mem::size_of::<Range>()),
            &mut r,
        )
    }

    /// UFFDIO_COPY `len` bytes from `src` to `dst`.
    #[inline]
    pub fn copy(&self, dst: usize, src: usize, len: usize, mode: u64) -> IoResult {
        let mut a = CopyArg {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode,
            copy: 0,
        };
        let r = ioctl(
            self.fd(),
            iowr(nr::COPY, std::mem::size_of::<CopyArg>()),
            &mut a,
        );
        partial(r, a.copy)
    }

    /// UFFDIO_ZEROPAGE over `[dst, dst+len)`.
    #[inline]
    pub fn zeropage(&self, dst: usize, len: usize, mode: u64) -> IoResult {
        let mut a = ZeropageArg {
            range: Range {
                start: dst as u64,
                len: len as u64,
            },
            mode,
            zeropage: 0,
        };
        let r = ioctl(
            self.fd(),
            iowr(nr::ZEROPAGE, std::mem::size_of::<ZeropageArg>()),
            &mut a,
        );
        partial(r, a.zeropage)
    }

    /// Whether an event that changes the address space is on its way on
    /// this descriptor: the application's `munmap`, `mremap` or
    /// `madvise(MADV_DONTNEED)` of a range registered with it has begun,
    /// and the engine has not read its event yet. The kernel counts that
    /// window (`mmap_changing`) from before it changes the mappings, under
    /// `mmap_lock`, until the event is read, and an ioctl that fills pages
    /// checks it before anything else: a `UFFDIO_ZEROPAGE` of an empty
    /// range is `EAGAIN` inside the window and `EINVAL` outside it. One
    /// system call; async-signal-safe (errno is the caller's to keep).
    pub fn mmap_changing(&self) -> bool {
        let mut a = ZeropageArg {
            range: Range { start: 0, len: 0 },
            mode: 0,
            zeropage: 0,
        };
        ioctl(
            self.fd(),
            iowr(nr::ZEROPAGE, std::mem::size_of::<ZeropageArg>()),
            &mut a,
        ) == Err(libc::EAGAIN)
    }

    /// UFFDIO_CONTINUE over `[dst, dst+len)`: maps the shmem pages already in
    /// the page cache.
    #[inline]
    pub fn cont(&self, dst: usize, len: usize, mode: u64) -> IoResult {
        let mut a = ContinueArg {
            range: Range {
                start: dst as u64,
                len: len as u64,
            },
            mode,
            mapped: 0,
        };
        let r = ioctl(
            self.fd(),
            iowr(nr::CONTINUE, std::mem::size_of::<ContinueArg>()),
            &mut a,
        );
        partial(r, a.mapped)
    }

    /// UFFDIO_MOVE `len` bytes of anonymous pages from `src` to `dst`.
    #[inline]
    pub fn mv(&self, dst: usize, src: usize, len: usize, mode: u64) -> IoResult {
        let mut a = MoveArg {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode,
            moved: 0,
        };
        let r = ioctl(
            self.fd(),
            iowr(nr::MOVE, std::mem::size_of::<MoveArg>()),
            &mut a,
        );
        partial(r, a.moved)
    }

    /// UFFDIO_POISON: later accesses to `[dst, dst+len)` get SIGBUS.
    #[inline]
    pub fn poison(&self, dst: usize, len: usize, mode: u64) -> IoResult {
        let mut a = PoisonArg {
            range: Range {
                start: dst as u64,
                len: len as u64,
            },
            mode,
            updated: 0,
        };
        let r = ioctl(
            self.fd(),
            iowr(nr::POISON, std::mem::size_of::<PoisonArg>()),
            &mut a,
        );
        partial(r, a.updated)
    }

    /// UFFDIO_WRITEPROTECT: set (`protect`) or clear write protection.
    #[inline]
    pub fn writeprotect(&self, start: usize, len: usize, protect: bool, wake: bool) -> IoResult {
        let mut mode = if protect { 1 } else { 0 };
        if !protect && !wake {
            mode |= 1 << 1; // UFFDIO_WRITEPROTECT_MODE_DONTWAKE
        }
        let mut a = WriteprotectArg {
            range: Range {
                start: start as u64,
                len: len as u64,
            },
            mode,
        };
        ioctl(
            self.fd(),
            iowr(nr::WRITEPROTECT, std::mem::size_of::<WriteprotectArg>()),
            &mut a,
        )?;
        Ok(len as u64)
    }

    /// UFFDIO_WAKE: wakes threads waiting on faults in the range.
    #[inline]
    pub fn wake(&self, start: usize, len: usize) -> Result<(), i32> {
        let mut r = Range {
            start: start as u64,
            len: len as u64,
        };
        ioctl(
            self.fd(),
            ior(nr::WAKE, std::mem::size_of::<Range>()),
            &mut r,
        )
    }

    /// Reads up to `buf.len()` messages; returns how many were read.
    /// `Ok(0)` means none were ready (non-blocking descriptor).
    pub fn read_msgs(&self, buf: &mut [Msg]) -> Result<usize, i32> {
        let bytes = std::mem::size_of_val(buf);
        // SAFETY: `buf` is writable for `bytes` bytes and `Msg` is plain data.
        let n = unsafe { libc::read(self.fd(), buf.as_mut_ptr().cast(), bytes) };
        if n < 0 {
            let e = super::errno();
            return if e == libc::EAGAIN { Ok(0) } else { Err(e) };
        }
        Ok(n as usize / std::mem::size_of::<Msg>())
    }
}

/// An ioctl that reports a partial count: EAGAIN with progress is progress.
#[inline]
fn partial(r: Result<(), i32>, count: i64) -> IoResult {
    match r {
        Ok(()) => Ok(count.max(0) as u64),
        Err(libc::EAGAIN) if count > 0 => Ok(count as u64),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_uapi_header() {
        // Values from <linux/userfaultfd.h> on x86-64.
        assert_eq!(iowr(nr::API, std::mem::size_of::<ApiArg>()), 0xc018_aa3f);
        assert_eq!(iowr(nr::COPY, std::mem::size_of::<CopyArg>()), 0xc028_aa03);
        assert_eq!(
            iowr(nr::CONTINUE, std::mem::size_of::<ContinueArg>()),
            0xc020_aa07
        );
        assert_eq!(ior(nr::WAKE, std::mem::size_of::<Range>()), 0x8010_aa02);
        assert_eq!(std::mem::size_of::<Msg>(), 32);
    }
}
