//! The engine's userfaultfds in a `fork()`ed child: covered, so that the
//! child holds no reference to them.
//!
//! A child inherits a copy of every descriptor, and a userfaultfd's
//! context lives until its last copy closes: until then the kernel keeps
//! the parent's ranges registered with it. The engine closes a region's
//! own descriptor when the region's object goes (per-region delivery),
//! and a range registered there that the engine never listed (the tail of
//! a region the application grew in place with its own `mremap`) is
//! unregistered only by that close. With a child's copy open, a touch or
//! `munmap` of such a range in the parent waited, unread, until the child
//! exited or exec'd. The child cannot use the descriptors (the engine
//! refuses to work there, `crate::fork`), so the fork handler replaces
//! each with `/dev/null` ([`cover_in_child`]): the number stays taken, so
//! that a drop in the child that closes it closes nothing else.
//!
//! The engine lists each descriptor it opens ([`list`]) and takes it off
//! before it closes it. A descriptor opened or closed while another
//! thread forks may be missed (left open in the child), and the child
//! covers a number only where `/proc/self/fd` says it is a userfaultfd:
//! still, one the application opened at a number the engine had just
//! closed and reused, between the kernel's copy of the descriptor table
//! and its copy of memory, would be covered. Without `/proc` (or one of
//! another pid namespace) or `/dev/null`, nothing is covered. The child's
//! list is then marked taken ([`COVERED`]), so that a descriptor the child
//! opens later at one of those numbers is never covered in its own
//! children on the parent's account.
//!
//! Cost: a scan of [`SLOTS`] words per open, a store per close; in every
//! `fork()`ed child (fork-then-exec ones too), an `open` and a `close`, and
//! a `readlink` per listed descriptor. None per fault.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering::*};

/// How many descriptors can be listed at once; more are left open in a
/// child.
pub const SLOTS: usize = 1024;

static LISTED: [AtomicI32; SLOTS] = [const { AtomicI32::new(-1) }; SLOTS];

/// A slot a child's [`cover_in_child`] has passed: taken, with no
/// descriptor ([`list`] takes free slots only, -1).
const COVERED: i32 = -2;

/// Lists `fd`, a userfaultfd the engine has just opened: its slot, or
/// `None` if every slot is taken.
pub(super) fn list(fd: RawFd) -> Option<usize> {
    LISTED
        .iter()
        .position(|s| s.compare_exchange(-1, fd, AcqRel, Relaxed).is_ok())
}

/// Takes slot `slot` off the list: before its descriptor is closed.
pub(super) fn unlist(slot: usize) {
    LISTED[slot].store(-1, Release);
}

/// In a `fork()`ed child, from the fork handler: replaces each listed
/// descriptor that is a userfaultfd with `/dev/null`, and marks every
/// listed slot [`COVERED`]. Async-signal-safe
/// (system calls on the stack only); errno is left as it was found.
pub fn cover_in_child() {
    // SAFETY: errno is this thread's; the calls below are async-signal-safe
    // and touch only stack buffers and this module's atomics.
    unsafe {
        let errno = *libc::__errno_location();
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if null >= 0 {
            for s in &LISTED {
                let fd = s.load(Acquire);
                if fd >= 0 && fd != null && is_userfaultfd(fd) {
                    libc::dup3(null, fd, libc::O_CLOEXEC);
                }
            }
            libc::close(null);
        }
        for s in &LISTED {
            if s.load(Relaxed) >= 0 {
                s.store(COVERED, Relaxed);
            }
        }
        *libc::__errno_location() = errno;
    }
}

/// Whether descriptor `fd` of this process is a userfaultfd
/// (`/proc/self/fd/N` reads `anon_inode:[userfaultfd]`). Async-signal-safe.
fn is_userfaultfd(fd: RawFd) -> bool {
    const WANT: &[u8] = b"anon_inode:[userfaultfd]";
    let mut path = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
    let mut n = 14;
    let mut digits = [0u8; 10];
    let (mut v, mut k) = (fd as u32, 0);
    loop {
        digits[k] = b'0' + (v % 10) as u8;
        k += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    while k > 0 {
        k -= 1;
        path[n] = digits[k];
        n += 1;
    }
    let mut buf = [0u8; 64];
    // SAFETY: `path` is NUL-terminated (the digits leave at least one zero
    // byte after them), `buf` is a live stack buffer of its length.
    let r = unsafe { libc::readlink(path.as_ptr().cast(), buf.as_mut_ptr().cast(), buf.len()) };
    r == WANT.len() as isize && &buf[..WANT.len()] == WANT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_userfaultfd_is_told_from_other_descriptors() {
        let u = crate::sys::uffd::Uffd::open_as(0, crate::sys::uffd::Want::UserModeOnly, true)
            .or_else(|_| crate::sys::uffd::Uffd::open_as(0, crate::sys::uffd::Want::Full, true))
            .unwrap();
        assert!(is_userfaultfd(u.fd()));
        let mut p = [0; 2];
        // SAFETY: a pipe into a live array of two descriptors.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        assert!(!is_userfaultfd(p[0]), "a pipe");
        // SAFETY: our pipe's descriptors, closed once.
        unsafe {
            libc::close(p[0]);
            libc::close(p[1]);
        }
        assert!(!is_userfaultfd(1 << 30), "a number not open");
    }
}
