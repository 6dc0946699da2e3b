//! userfaultfd for the command line: descriptors opened and driven through
//! the `userfaultfd` crate, plus the few pieces that crate has no API for,
//! written here against the kernel ABI (`include/uapi/linux/userfaultfd.h`):
//!
//! - the feature bits newer than the crate's [`FeatureFlags`] (MINOR_SHMEM,
//!   MOVE, POISON, ...), passed through it with `from_bits_retain`;
//! - `UFFDIO_MOVE` ([`Uffd::mv`]), which the crate does not wrap;
//! - the system call as a fallback where `/dev/userfaultfd` exists but this
//!   process may not open it (the crate then gives up instead of trying
//!   `userfaultfd(2)`, which is what an unprivileged process is allowed);
//! - [`probe`]: `UFFDIO_API` asking for nothing, to read back every feature
//!   and ioctl the kernel grants (the crate's builder does not report them).
//!
//! The install calls ([`Uffd::copy`], [`Uffd::cont`], [`Uffd::mv`]) are one
//! ioctl on a stack struct with no allocation, so the floors call them from
//! their SIGBUS handlers; errors come back as a plain errno.

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::EventFd;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use userfaultfd::{Event, FeatureFlags, IoctlFlags, UffdBuilder};
pub use userfaultfd::{EventBuffer, RegisterMode};

/// `UFFD_FEATURE_*` bits: the crate's where it names them, the kernel's
/// header values for the rest.
pub mod feature {
    use userfaultfd::FeatureFlags as F;

    /// `UFFD_FEATURE_PAGEFAULT_FLAG_WP`.
    pub const PAGEFAULT_FLAG_WP: u64 = F::PAGEFAULT_FLAG_WP.bits();
    /// `UFFD_FEATURE_MISSING_SHMEM`.
    pub const MISSING_SHMEM: u64 = F::MISSING_SHMEM.bits();
    /// `UFFD_FEATURE_SIGBUS`: faults raise SIGBUS in the faulting thread
    /// instead of queueing a message.
    pub const SIGBUS: u64 = F::SIGBUS.bits();
    /// `UFFD_FEATURE_MINOR_HUGETLBFS` (Linux 5.13).
    pub const MINOR_HUGETLBFS: u64 = 1 << 9;
    /// `UFFD_FEATURE_MINOR_SHMEM` (Linux 5.14): MINOR registration of shmem.
    pub const MINOR_SHMEM: u64 = 1 << 10;
    /// `UFFD_FEATURE_EXACT_ADDRESS` (Linux 5.18).
    pub const EXACT_ADDRESS: u64 = 1 << 11;
    /// `UFFD_FEATURE_WP_HUGETLBFS_SHMEM` (Linux 5.19).
    pub const WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
    /// `UFFD_FEATURE_WP_UNPOPULATED` (Linux 6.4).
    pub const WP_UNPOPULATED: u64 = 1 << 13;
    /// `UFFD_FEATURE_POISON` (Linux 6.6).
    pub const POISON: u64 = 1 << 14;
    /// `UFFD_FEATURE_WP_ASYNC` (Linux 6.7).
    pub const WP_ASYNC: u64 = 1 << 15;
    /// `UFFD_FEATURE_MOVE` (Linux 6.8): `UFFDIO_MOVE`.
    pub const MOVE: u64 = 1 << 16;

    /// The features the crate has no name for, with their kernel names.
    const NEWER: [(u64, &str); 8] = [
        (MINOR_HUGETLBFS, "MINOR_HUGETLBFS"),
        (MINOR_SHMEM, "MINOR_SHMEM"),
        (EXACT_ADDRESS, "EXACT_ADDRESS"),
        (WP_HUGETLBFS_SHMEM, "WP_HUGETLBFS_SHMEM"),
        (WP_UNPOPULATED, "WP_UNPOPULATED"),
        (POISON, "POISON"),
        (WP_ASYNC, "WP_ASYNC"),
        (MOVE, "MOVE"),
    ];

    /// Every feature bit this build knows, lowest first, with its kernel
    /// name (the crate's names are the kernel's without the prefix).
    pub fn all() -> impl Iterator<Item = (u64, &'static str)> {
        F::all()
            .iter_names()
            .map(|(n, f)| (f.bits(), n))
            .chain(NEWER)
    }
}

/// Bits of the `ioctls` masks the kernel reports (`1 << _UFFDIO_*`).
pub mod ioctl {
    use userfaultfd::IoctlFlags as I;

    /// `UFFDIO_REGISTER`.
    pub const REGISTER: u64 = I::REGISTER.bits();
    /// `UFFDIO_UNREGISTER`.
    pub const UNREGISTER: u64 = I::UNREGISTER.bits();
    /// `UFFDIO_WAKE`.
    pub const WAKE: u64 = I::WAKE.bits();
    /// `UFFDIO_COPY`.
    pub const COPY: u64 = I::COPY.bits();
    /// `UFFDIO_ZEROPAGE`.
    pub const ZEROPAGE: u64 = I::ZEROPAGE.bits();
    /// `UFFDIO_MOVE` (`_UFFDIO_MOVE` = 5).
    pub const MOVE: u64 = 1 << super::NR_MOVE;
    /// `UFFDIO_WRITEPROTECT`.
    pub const WRITEPROTECT: u64 = I::WRITE_PROTECT.bits();
    /// `UFFDIO_CONTINUE` (`_UFFDIO_CONTINUE` = 7).
    pub const CONTINUE: u64 = 1 << 7;
    /// `UFFDIO_POISON` (`_UFFDIO_POISON` = 8).
    pub const POISON: u64 = 1 << 8;
    /// `UFFDIO_API`.
    pub const API: u64 = I::API.bits();

    /// Every ioctl bit with the name the kernel's header gives it (after
    /// `UFFDIO_`), lowest first.
    pub const NAMES: [(u64, &str); 10] = [
        (REGISTER, "REGISTER"),
        (UNREGISTER, "UNREGISTER"),
        (WAKE, "WAKE"),
        (COPY, "COPY"),
        (ZEROPAGE, "ZEROPAGE"),
        (MOVE, "MOVE"),
        (WRITEPROTECT, "WRITEPROTECT"),
        (CONTINUE, "CONTINUE"),
        (POISON, "POISON"),
        (API, "API"),
    ];
}

/// The ioctl type byte of userfaultfd (`UFFDIO`).
const UFFDIO_TYPE: u8 = 0xAA;
/// `UFFD_API`, the only API version.
const UFFD_API_VERSION: u64 = 0xAA;
/// `_UFFDIO_API`.
const NR_API: u8 = 0x3F;
/// `_UFFDIO_MOVE`.
const NR_MOVE: u8 = 0x05;
/// `UFFD_USER_MODE_ONLY`, a flag of `userfaultfd(2)` (Linux 5.11).
const USER_MODE_ONLY: libc::c_int = 1;

/// `struct uffdio_api`.
#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

/// `struct uffdio_move`: `move` is the bytes moved, or a negated errno.
#[repr(C)]
struct UffdioMove {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}

/// `UFFDIO_API` = `_IOWR(UFFDIO, _UFFDIO_API, struct uffdio_api)`.
const UFFDIO_API: libc::c_ulong =
    nix::request_code_readwrite!(UFFDIO_TYPE, NR_API, std::mem::size_of::<UffdioApi>());
/// `UFFDIO_MOVE` = `_IOWR(UFFDIO, _UFFDIO_MOVE, struct uffdio_move)`.
const UFFDIO_MOVE: libc::c_ulong =
    nix::request_code_readwrite!(UFFDIO_TYPE, NR_MOVE, std::mem::size_of::<UffdioMove>());

/// The errno behind an error of the `userfaultfd` crate (`EIO` for the
/// ones that carry none). No allocation.
fn errno_of(e: &userfaultfd::Error) -> i32 {
    use userfaultfd::Error as E;
    match e {
        E::CopyFailed(e) | E::ZeropageFailed(e) | E::SystemError(e) => *e as i32,
        // Only progress is reported with EAGAIN; the caller retries.
        E::PartiallyCopied(_) => libc::EAGAIN,
        E::OpenDevUserfaultfd(e) => e.raw_os_error().unwrap_or(libc::EIO),
        _ => libc::EIO,
    }
}

fn errno_str(e: i32) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

/// A fresh descriptor from `userfaultfd(2)` with `flags`.
fn open_syscall(flags: libc::c_int) -> Result<OwnedFd, i32> {
    // SAFETY: userfaultfd(2) takes its flags by value and returns a new
    // descriptor or -1; it touches no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd < 0 {
        return Err(Errno::last_raw());
    }
    // SAFETY: a descriptor the kernel just made for us and nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `UFFDIO_API` on a fresh descriptor, enabling `features`; returns the
/// features and ioctls the kernel grants.
fn handshake(fd: BorrowedFd<'_>, features: u64) -> Result<(u64, u64), i32> {
    let mut a = UffdioApi {
        api: UFFD_API_VERSION,
        features,
        ioctls: 0,
    };
    // SAFETY: `a` is a live `struct uffdio_api`, whose size the request
    // encodes; the kernel reads and writes only inside it.
    if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API, &mut a as *mut UffdioApi) } != 0 {
        return Err(Errno::last_raw());
    }
    Ok((a.features, a.ioctls))
}

/// What the kernel grants a descriptor of one kind: [`probe`]'s answer.
#[derive(Debug, Clone, Copy)]
pub struct Grants {
    /// `UFFD_FEATURE_*` bits offered.
    pub features: u64,
    /// ioctl bits the descriptor offers (see [`ioctl`]).
    pub ioctls: u64,
}

/// Opens a descriptor with `userfaultfd(2)` (user-mode-only or not) and
/// asks `UFFDIO_API` for nothing, which reports everything the kernel
/// offers. The errno of whatever refused it otherwise.
pub fn probe(user_mode_only: bool) -> Result<Grants, i32> {
    let umo = if user_mode_only { USER_MODE_ONLY } else { 0 };
    let fd = open_syscall(libc::O_CLOEXEC | umo)?;
    let (features, ioctls) = handshake(fd.as_fd(), 0)?;
    Ok(Grants { features, ioctls })
}

/// A userfaultfd descriptor (the crate's).
#[derive(Debug)]
pub struct Uffd {
    inner: userfaultfd::Uffd,
}

impl Uffd {
    /// Opens a descriptor with `features` enabled: user-mode-only if asked
    /// (what any process may open), else a full one or an error. Through
    /// the crate (`/dev/userfaultfd` where it exists, else the system
    /// call); where the device exists but refuses this process, through the
    /// system call.
    pub fn open(features: u64, user_mode_only: bool, nonblocking: bool) -> Result<Uffd, String> {
        let built = UffdBuilder::new()
            .close_on_exec(true)
            .non_blocking(nonblocking)
            .user_mode_only(user_mode_only)
            .require_features(FeatureFlags::from_bits_retain(features))
            .create();
        let inner = match built {
            Ok(u) => u,
            Err(userfaultfd::Error::OpenDevUserfaultfd(dev)) => {
                Self::open_syscall(features, user_mode_only, nonblocking)
                    .map_err(|e| format!("/dev/userfaultfd: {dev}; userfaultfd(2): {e}"))?
            }
            Err(e) => {
                return Err(format!(
                    "userfaultfd with features {features:#x} ({}): {}",
                    feature_names(features).join("|"),
                    match errno_of(&e) {
                        libc::EIO => e.to_string(),
                        n => errno_str(n),
                    }
                ))
            }
        };
        Ok(Uffd { inner })
    }

    /// The crate's builder has no way past an inaccessible device: the
    /// system call and the handshake done here instead.
    fn open_syscall(
        features: u64,
        user_mode_only: bool,
        nonblocking: bool,
    ) -> Result<userfaultfd::Uffd, String> {
        let mut flags = libc::O_CLOEXEC;
        if nonblocking {
            flags |= libc::O_NONBLOCK;
        }
        if user_mode_only {
            flags |= USER_MODE_ONLY;
        }
        let fd = open_syscall(flags).map_err(errno_str)?;
        handshake(fd.as_fd(), features)
            .map_err(|e| format!("UFFDIO_API with features {features:#x}: {}", errno_str(e)))?;
        // SAFETY: `fd` is ours; ownership passes to the crate's descriptor,
        // which closes it once on drop.
        Ok(unsafe { userfaultfd::Uffd::from_raw_fd(fd.into_raw_fd()) })
    }

    /// Registers `[start, start + len)` in `mode`; returns the ioctl bits
    /// the range supports (see [`ioctl`]).
    pub fn register(&self, start: usize, len: usize, mode: RegisterMode) -> Result<u64, i32> {
        self.inner
            .register_with_mode(start as *mut libc::c_void, len, mode)
            .map(|f: IoctlFlags| f.bits())
            .map_err(|e| errno_of(&e))
    }

    /// Unregisters `[start, start + len)`.
    pub fn unregister(&self, start: usize, len: usize) -> Result<(), i32> {
        self.inner
            .unregister(start as *mut libc::c_void, len)
            .map_err(|e| errno_of(&e))
    }

    /// `UFFDIO_COPY` of `len` bytes from `src` to the registered `dst`,
    /// waking the faulting threads; the bytes copied. Async-signal-safe.
    ///
    /// # Safety
    /// `[src, src + len)` must be readable memory of this process, and no
    /// Rust reference may be held to `[dst, dst + len)`, whose contents the
    /// kernel fills in.
    #[inline]
    pub unsafe fn copy(&self, dst: usize, src: usize, len: usize) -> Result<usize, i32> {
        // SAFETY: the caller's contract is the crate's.
        unsafe {
            self.inner.copy(
                src as *const libc::c_void,
                dst as *mut libc::c_void,
                len,
                true,
            )
        }
        .map_err(|e| errno_of(&e))
    }

    /// `UFFDIO_CONTINUE` over the registered `[dst, dst + len)`: maps the
    /// shmem pages already in the page cache, waking the faulting threads;
    /// the bytes mapped. Async-signal-safe.
    #[inline]
    pub fn cont(&self, dst: usize, len: usize) -> Result<u64, i32> {
        self.inner
            .r#continue(dst as *mut libc::c_void, len, true)
            .map_err(|e| errno_of(&e))
    }

    /// `UFFDIO_MOVE` of `len` bytes of anonymous pages from `src` to the
    /// registered `dst` (the pages themselves move; `src` is left
    /// unpopulated), waking the faulting threads; the bytes moved. Needs
    /// the MOVE feature. Async-signal-safe.
    ///
    /// # Safety
    /// No Rust reference may be held to either range: `src`'s pages vanish
    /// from it and `dst`'s appear.
    #[inline]
    pub unsafe fn mv(&self, dst: usize, src: usize, len: usize) -> Result<u64, i32> {
        let mut a = UffdioMove {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: 0,
            moved: 0,
        };
        // SAFETY: `a` is a live `struct uffdio_move`, whose size the request
        // encodes; what the move does to memory is the caller's contract.
        let rc = unsafe { libc::ioctl(self.as_raw_fd(), UFFDIO_MOVE, &mut a as *mut UffdioMove) };
        match (rc, a.moved) {
            (0, n) => Ok(n.max(0) as u64),
            (_, n) if n > 0 => Ok(n as u64),
            _ => Err(Errno::last_raw()),
        }
    }

    /// Reads the events waiting into `buf` (none if the descriptor is
    /// non-blocking and nothing waits) and returns the addresses of the
    /// page faults among them, in order. Allocates nothing.
    pub fn read_faults<'a>(
        &self,
        buf: &'a mut EventBuffer,
    ) -> Result<impl Iterator<Item = usize> + 'a, i32> {
        let events = self.inner.read_events(buf).map_err(|e| errno_of(&e))?;
        Ok(events.filter_map(|e| match e {
            Ok(Event::Pagefault { addr, .. }) => Some(addr as usize),
            _ => None,
        }))
    }

    /// Blocks in poll(2) until this descriptor or `stop` is readable;
    /// true when `stop` is.
    pub fn wait_or_stop(&self, stop: &EventFd) -> bool {
        let mut fds = [
            PollFd::new(self.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        let _ = nix::poll::poll(&mut fds, PollTimeout::NONE);
        fds[1].revents().is_some_and(|r| !r.is_empty())
    }
}

impl AsFd for Uffd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

impl AsRawFd for Uffd {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

/// The kernel names of the feature bits set in `bits`, lowest first.
pub fn feature_names(bits: u64) -> Vec<&'static str> {
    feature::all()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| n)
        .collect()
}

/// The names of the ioctl bits set in `bits`, lowest first.
pub fn ioctl_names(bits: u64) -> Vec<&'static str> {
    ioctl::NAMES
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|&(_, n)| n)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_codes_are_the_headers() {
        // <linux/userfaultfd.h> on x86-64.
        assert_eq!(UFFDIO_API, 0xc018_aa3f);
        assert_eq!(UFFDIO_MOVE, 0xc028_aa05);
    }

    #[test]
    fn feature_table_is_in_bit_order_and_complete() {
        let bits: Vec<u64> = feature::all().map(|(b, _)| b).collect();
        assert_eq!(bits, (0..17).map(|i| 1u64 << i).collect::<Vec<_>>());
        assert_eq!(
            feature_names(feature::SIGBUS | feature::MOVE),
            ["SIGBUS", "MOVE"]
        );
        assert_eq!(ioctl_names(ioctl::COPY | ioctl::API), ["COPY", "API"]);
    }

    #[test]
    fn probe_grants_sigbus() {
        let g = probe(true).expect("userfaultfd available");
        assert_ne!(g.features & feature::SIGBUS, 0);
        assert_ne!(g.ioctls & ioctl::API, 0);
    }

    #[test]
    fn move_moves_a_page() {
        let uffd = match Uffd::open(feature::MOVE, true, false) {
            Ok(u) => u,
            Err(e) => return eprintln!("no UFFDIO_MOVE here: {e}"),
        };
        let src = crate::os::mem::anonymous(4096).unwrap();
        let dst = crate::os::mem::anonymous(4096).unwrap();
        let (s, d) = (src.as_ptr() as usize, dst.as_ptr() as usize);
        // SAFETY: `src` is our own fresh page; no reference to it is held.
        unsafe { std::ptr::write_volatile(s as *mut u8, 7) };
        uffd.register(d, 4096, RegisterMode::MISSING).unwrap();
        // SAFETY: both pages are ours and no reference to them is held.
        assert_eq!(unsafe { uffd.mv(d, s, 4096) }, Ok(4096));
        // SAFETY: `dst` now holds the moved page.
        assert_eq!(unsafe { std::ptr::read_volatile(d as *const u8) }, 7);
    }
}
