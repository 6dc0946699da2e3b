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

#[allow(missing_docs)]
/// Feature bits of `struct uffdio_api` (include/uapi/linux/userfaultfd.h).
pub mod feature {
    pub const PAGEFAULT_FLAG_WP: u64 = 1 << 0;
    pub const EVENT_FORK: u64 = 1 << 1;
    pub const EVENT_REMAP: u64 = 1 << 2;
    pub const EVENT_REMOVE: u64 = 1 << 3;
    pub const MISSING_HUGETLBFS: u64 = 1 << 4;
    pub const MISSING_SHMEM: u64 = 1 << 5;
    pub const EVENT_UNMAP: u64 = 1 << 6;
    pub const SIGBUS: u64 = 1 << 7;
    pub const THREAD_ID: u64 = 1 << 8;
    pub const MINOR_HUGETLBFS: u64 = 1 << 9;
    pub const MINOR_SHMEM: u64 = 1 << 10;
    pub const EXACT_ADDRESS: u64 = 1 << 11;
    pub const WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
    pub const WP_UNPOPULATED: u64 = 1 << 13;
    pub const POISON: u64 = 1 << 14;
    pub const WP_ASYNC: u64 = 1 << 15;
    pub const MOVE: u64 = 1 << 16;

    /// Every feature bit with its kernel name, for the probe's report.
    pub const NAMES: &[(u64, &str)] = &[
        (PAGEFAULT_FLAG_WP, "PAGEFAULT_FLAG_WP"),
        (EVENT_FORK, "EVENT_FORK"),
        (EVENT_REMAP, "EVENT_REMAP"),
        (EVENT_REMOVE, "EVENT_REMOVE"),
        (MISSING_HUGETLBFS, "MISSING_HUGETLBFS"),
        (MISSING_SHMEM, "MISSING_SHMEM"),
        (EVENT_UNMAP, "EVENT_UNMAP"),
        (SIGBUS, "SIGBUS"),
        (THREAD_ID, "THREAD_ID"),
        (MINOR_HUGETLBFS, "MINOR_HUGETLBFS"),
        (MINOR_SHMEM, "MINOR_SHMEM"),
        (EXACT_ADDRESS, "EXACT_ADDRESS"),
        (WP_HUGETLBFS_SHMEM, "WP_HUGETLBFS_SHMEM"),
        (WP_UNPOPULATED, "WP_UNPOPULATED"),
        (POISON, "POISON"),
        (WP_ASYNC, "WP_ASYNC"),
        (MOVE, "MOVE"),
    ];
}

/// The kernel names of the feature bits in `bits`, `|`-separated.
pub fn feature_names(bits: u64) -> String {
    let names: Vec<&str> = feature::NAMES
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect();
    names.join("|")
}

#[allow(missing_docs)]
/// ioctl numbers (`_UFFDIO_*`), as bit positions in `uffdio_api.ioctls`.
pub mod nr {
    pub const REGISTER: u32 = 0x00;
    pub const UNREGISTER: u32 = 0x01;
    pub const WAKE: u32 = 0x02;
    pub const COPY: u32 = 0x03;
    pub const ZEROPAGE: u32 = 0x04;
    pub const MOVE: u32 = 0x05;
    pub const WRITEPROTECT: u32 = 0x06;
    pub const CONTINUE: u32 = 0x07;
    pub const POISON: u32 = 0x08;
    pub const API: u32 = 0x3F;
}

#[allow(missing_docs)]
/// `UFFDIO_REGISTER_MODE_*`.
pub mod mode {
    pub const MISSING: u64 = 1 << 0;
    pub const WP: u64 = 1 << 1;
    pub const MINOR: u64 = 1 << 2;
}

#[allow(missing_docs)]
/// `UFFD_PAGEFAULT_FLAG_*` in a fault message.
pub mod fault_flag {
    pub const WRITE: u64 = 1 << 0;
    pub const WP: u64 = 1 << 1;
}

/// `UFFD_EVENT_PAGEFAULT`.
pub const EVENT_PAGEFAULT: u8 = 0x12;
/// `UFFD_EVENT_REMAP`: `arg0` = from, `arg1` = to, `arg2` = length.
pub const EVENT_REMAP: u8 = 0x14;
/// `UFFD_EVENT_REMOVE` (`madvise(MADV_DONTNEED/REMOVE/FREE)`): `arg0` =
/// start, `arg1` = end.
pub const EVENT_REMOVE: u8 = 0x15;
/// `UFFD_EVENT_UNMAP` (`munmap`, or the tail an `mremap` dropped): `arg0`
/// = start, `arg1` = end.
pub const EVENT_UNMAP: u8 = 0x16;
const UFFD_API: u64 = 0xAA;
const UFFDIO: u32 = 0xAA;
const UFFD_USER_MODE_ONLY: i32 = 1;

#[repr(C)]
#[derive(Default)]
struct ApiArg {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Range {
    start: u64,
    len: u64,
}
#[repr(C)]
#[derive(Default)]
struct RegisterArg {
    range: Range,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Default)]
struct CopyArg {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}
#[repr(C)]
#[derive(Default)]
struct ZeropageArg {
    range: Range,
    mode: u64,
    zeropage: i64,
}
#[repr(C)]
#[derive(Default)]
struct MoveArg {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}
#[repr(C)]
#[derive(Default)]
struct WriteprotectArg {
    range: Range,
    mode: u64,
}
#[repr(C)]
#[derive(Default)]
struct ContinueArg {
    range: Range,
    mode: u64,
    mapped: i64,
}
#[repr(C)]
#[derive(Default)]
struct PoisonArg {
    range: Range,
    mode: u64,
    updated: i64,
}

/// One `struct uffd_msg` (32 bytes), as read from the descriptor.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Msg {
    /// `UFFD_EVENT_*`.
    pub event: u8,
    _reserved1: u8,
    _reserved2: u16,
    _reserved3: u32,
    /// For a page fault: `flags`.
    pub arg0: u64,
    /// For a page fault: `address`.
    pub arg1: u64,
    /// For a page fault: the faulting thread id (with THREAD_ID).
    pub arg2: u64,
}

const fn iowr(nr: u32, size: usize) -> libc::c_ulong {
    ((3u32 << 30) | ((size as u32) << 16) | (UFFDIO << 8) | nr) as libc::c_ulong
}
const fn ior(nr: u32, size: usize) -> libc::c_ulong {
    ((2u32 << 30) | ((size as u32) << 16) | (UFFDIO << 8) | nr) as libc::c_ulong
}

/// Install modes shared by COPY, CONTINUE, MOVE and ZEROPAGE.
pub const MODE_DONTWAKE: u64 = 1 << 0;
/// `UFFDIO_COPY_MODE_WP` / `UFFDIO_CONTINUE_MODE_WP`: install write-protected.
pub const MODE_WP: u64 = 1 << 1;

pub mod inherit;
mod open;
mod own;
pub use open::{Descriptor, Want};
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
    pub fn open_as(features: u64, want: Want, nonblocking: bool) -> Result<Uffd, String> {
        let flags = libc::O_CLOEXEC | if nonblocking { libc::O_NONBLOCK } else { 0 };
        let (fd, descriptor) = open::open_raw(want, flags)?;
        // SAFETY: `fd` is a fresh descriptor that we own from here on.
        let inner = unsafe { <userfaultfd::Uffd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let mut a = ApiArg {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        ioctl(fd, iowr(nr::API, std::mem::size_of::<ApiArg>()), &mut a).map_err(|e| {
            format!(
                "UFFDIO_API with features {features:#x} ({}): {}",
                feature_names(features),
                std::io::Error::from_raw_os_error(e)
            )
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
