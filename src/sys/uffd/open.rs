//! Opening a userfaultfd descriptor: through `/dev/userfaultfd`, else the
//! `userfaultfd(2)` system call, else (for an ordinary user) the system
//! call with `UFFD_USER_MODE_ONLY`.

use super::{UFFDIO, UFFD_USER_MODE_ONLY};
use std::os::fd::RawFd;

/// Where a descriptor came from, and so which faults it sees.
///
/// ```
/// let pager = uffd_pager::Pager::builder().build()?;
/// let d = pager.descriptor();
/// println!("{d}"); // e.g. "userfaultfd(2), user-mode only"
/// # Ok::<(), uffd_pager::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    /// Opened through `/dev/userfaultfd` (`USERFAULTFD_IOC_NEW`) rather
    /// than the `userfaultfd(2)` system call.
    pub device: bool,
    /// `UFFD_USER_MODE_ONLY`: only faults taken in user mode are delivered;
    /// a fault the kernel takes inside a system call (a `read(2)` into an
    /// absent page) fails with `EFAULT` instead. What an unprivileged
    /// process gets where `vm.unprivileged_userfaultfd` is 0 and
    /// `/dev/userfaultfd` is root-only, the usual defaults.
    pub user_mode_only: bool,
}

impl std::fmt::Display for Descriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.device {
            "/dev/userfaultfd"
        } else {
            "userfaultfd(2)"
        })?;
        if self.user_mode_only {
            f.write_str(", user-mode only")?;
        }
        Ok(())
    }
}

/// Which descriptor [`super::Uffd::open`] should get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// A full descriptor (faults inside system calls are delivered too), or
    /// an error.
    Full,
    /// A user-mode-only descriptor.
    UserModeOnly,
    /// A full descriptor if the process may open one, else user-mode-only.
    Any,
}

/// `USERFAULTFD_IOC_NEW` (`_IO(0xAA, 0x00)`) on `/dev/userfaultfd`.
const USERFAULTFD_IOC_NEW: libc::c_ulong = (UFFDIO as libc::c_ulong) << 8;

/// A raw descriptor from `/dev/userfaultfd`, or the errno of whatever
/// refused it.
fn open_device(flags: i32) -> Result<RawFd, i32> {
    let path = c"/dev/userfaultfd";
    // SAFETY: a valid C string; open returns a new descriptor or -1.
    let dev = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if dev < 0 {
        return Err(crate::sys::errno());
    }
    // SAFETY: USERFAULTFD_IOC_NEW takes the flags by value and returns a
    // new descriptor or -1; `dev` is ours and closed once.
    let fd = unsafe { libc::ioctl(dev, USERFAULTFD_IOC_NEW, flags) };
    let e = crate::sys::errno();
    // SAFETY: as above.
    unsafe { libc::close(dev) };
    if fd < 0 {
        Err(e)
    } else {
        Ok(fd)
    }
}

/// A raw descriptor from the `userfaultfd(2)` system call.
fn open_syscall(flags: i32) -> Result<RawFd, i32> {
    // SAFETY: plain syscall; returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd < 0 {
        Err(crate::sys::errno())
    } else {
        Ok(fd as RawFd)
    }
}

/// Opens a raw descriptor as `want` says: a full one through the device,
/// then the system call; a user-mode-only one through the system call.
pub(super) fn open_raw(want: Want, flags: i32) -> Result<(RawFd, Descriptor), Refused> {
    let full = || {
        let dev = open_device(flags);
        if let Ok(fd) = dev {
            return Ok((
                fd,
                Descriptor {
                    device: true,
                    user_mode_only: false,
                },
            ));
        }
        open_syscall(flags)
            .map(|fd| {
                (
                    fd,
                    Descriptor {
                        device: false,
                        user_mode_only: false,
                    },
                )
            })
            .map_err(|e| (dev.unwrap_err(), e))
    };
    let umo = || {
        open_syscall(flags | UFFD_USER_MODE_ONLY).map(|fd| {
            (
                fd,
                Descriptor {
                    device: false,
                    user_mode_only: true,
                },
            )
        })
    };
    let full_err = |(dev, sys): (i32, i32)| {
        format!(
            "a full descriptor was refused: /dev/userfaultfd: {}; userfaultfd(2): {} \
             (root, read-write access to /dev/userfaultfd, or vm.unprivileged_userfaultfd = 1 \
             gives one)",
            std::io::Error::from_raw_os_error(dev),
            std::io::Error::from_raw_os_error(sys)
        )
    };
    let umo_err = |e: i32| {
        format!(
            "userfaultfd(2) with UFFD_USER_MODE_ONLY: {}",
            std::io::Error::from_raw_os_error(e)
        )
    };
    match want {
        Want::Full => full()
            .map_err(|(d, s)| Refused::of(&[Tried::Device(d), Tried::Call(s)], full_err((d, s)))),
        Want::UserModeOnly => umo().map_err(|e| Refused::of(&[Tried::UserModeOnly(e)], umo_err(e))),
        Want::Any => full().or_else(|(d, s)| {
            umo().map_err(|u| {
                let message = format!("{}; {}", full_err((d, s)), umo_err(u));
                Refused::of(
                    &[Tried::Device(d), Tried::Call(s), Tried::UserModeOnly(u)],
                    message,
                )
            })
        }),
    }
}

/// A way to a descriptor that was refused, with its errno.
enum Tried {
    Device(i32),
    Call(i32),
    UserModeOnly(i32),
}

impl Refused {
    /// The refusal of every way in `tried`: for want of permission where
    /// at least one answered `EPERM` or `EACCES` and the others said only
    /// that they do not exist here (no `/dev/userfaultfd`: `ENOENT`,
    /// `ENODEV`, `ENXIO`; a kernel before user-mode-only: `EINVAL`);
    /// `errno` is then `EPERM`, else the last way's own.
    fn of(tried: &[Tried], message: String) -> Refused {
        let perm = |e: i32| e == libc::EPERM || e == libc::EACCES;
        let absent = |t: &Tried| match *t {
            Tried::Device(e) => matches!(e, libc::ENOENT | libc::ENODEV | libc::ENXIO),
            Tried::UserModeOnly(e) => e == libc::EINVAL,
            Tried::Call(_) => false,
        };
        let errno = |t: &Tried| match *t {
            Tried::Device(e) | Tried::Call(e) | Tried::UserModeOnly(e) => e,
        };
        let denied = tried.iter().any(|t| perm(errno(t)))
            && tried.iter().all(|t| perm(errno(t)) || absent(t));
        Refused {
            denied,
            errno: if denied {
                libc::EPERM
            } else {
                tried.last().map_or(libc::EOPNOTSUPP, errno)
            },
            message,
        }
    }
}

/// Why no descriptor could be had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Every way tried was refused for want of permission (`EPERM`,
    /// `EACCES`: a seccomp filter, `vm.unprivileged_userfaultfd`, the
    /// device's mode), not for want of support.
    pub denied: bool,
    /// `EPERM` where denied, else the last way's errno (`ENOSYS` without
    /// userfaultfd, `EMFILE` out of descriptors...).
    pub errno: i32,
    /// What each way answered.
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refused {}

#[cfg(test)]
mod tests {
    use super::{Refused, Tried::*};
    use libc::*;

    fn of(t: &[super::Tried]) -> (bool, i32) {
        let r = Refused::of(t, String::new());
        (r.denied, r.errno)
    }

    /// Permission refused where a way exists, whether or not the device
    /// does (a container: no /dev/userfaultfd, the system call filtered);
    /// not for a kernel or a process that lacks something else.
    #[test]
    fn a_refusal_is_for_want_of_permission_only_where_one_said_so() {
        assert_eq!(
            of(&[Device(ENOENT), Call(EPERM), UserModeOnly(EPERM)]),
            (true, EPERM)
        );
        assert_eq!(of(&[Device(EACCES), Call(EPERM)]), (true, EPERM));
        assert_eq!(of(&[Device(ENOENT), Call(EPERM)]), (true, EPERM));
        // A kernel before user-mode-only (EINVAL) that refuses the rest.
        assert_eq!(
            of(&[Device(ENOENT), Call(EPERM), UserModeOnly(EINVAL)]),
            (true, EPERM)
        );
        assert_eq!(of(&[UserModeOnly(EPERM)]), (true, EPERM));
        // No userfaultfd at all, or out of descriptors: not permission.
        assert_eq!(
            of(&[Device(ENOENT), Call(ENOSYS), UserModeOnly(ENOSYS)]),
            (false, ENOSYS)
        );
        assert_eq!(
            of(&[Device(ENOENT), Call(EPERM), UserModeOnly(EMFILE)]),
            (false, EMFILE)
        );
        assert_eq!(of(&[UserModeOnly(EINVAL)]), (false, EINVAL));
        assert_eq!(of(&[Device(ENOENT)]), (false, ENOENT));
    }
}
