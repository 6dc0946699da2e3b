//! What the kernel maps of a file beside the shim: the program's
//! descriptor's flags and seals, and the shared file mappings
//! `/proc/self/maps` lists (a writable one of a file the pager maps is
//! refused, as two caches of one file would disagree).

use super::covered;
use std::ffi::c_int;
use std::ops::Range;

/// The program's descriptor's flags (`F_GETFL`; -1 for a bad one).
pub(super) fn open_flags(fd: c_int) -> c_int {
    // SAFETY: F_GETFL reads the program's descriptor's flags.
    unsafe { libc::fcntl(fd, libc::F_GETFL) }
}

/// Whether the file behind `fd` is sealed against writes (a memfd with
/// `F_SEAL_WRITE` or `F_SEAL_FUTURE_WRITE`).
pub(super) fn write_sealed(fd: c_int) -> bool {
    // SAFETY: F_GET_SEALS reads the file's seals (EINVAL: a file that
    // takes none).
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    seals > 0 && seals & (libc::F_SEAL_WRITE | libc::F_SEAL_FUTURE_WRITE) != 0
}

/// A writable shared mapping of file `id` the kernel holds in this process
/// (one the shim passed on, or one made or made writable by a raw system
/// call), outside `over`, by `/proc/self/maps`. The pager's own memory is
/// anonymous or a memfd of its own, never the program's file.
pub(super) fn kernel_writes(id: (u64, u64), over: Option<&Range<usize>>) -> bool {
    kernel_shared_maps()
        .iter()
        .any(|k| k.writable && k.is(id) && !covered(std::slice::from_ref(&k.range), over))
}

/// A shared file mapping as `/proc/self/maps` lists it.
pub(super) struct KernelMap {
    pub(super) range: Range<usize>,
    pub(super) writable: bool,
    /// The device (as the line gives it) and the inode.
    dev: u64,
    ino: u64,
    /// The file's path, where the line names one that still exists.
    path: Option<String>,
}

impl KernelMap {
    /// Whether this is a mapping of the file `id` (`fstat`'s
    /// `(st_dev, st_ino)`). The line's device is the one the file's
    /// superblock reports, which on an overlay whose layers are on other
    /// file systems is the overlay's, where `fstat` gives the layer's: on
    /// a device that differs, the path the line names is asked
    /// (`stat`, which answers as `fstat` does). Before, such a kernel
    /// mapping was never seen, and the pager kept a second cache of the
    /// file beside the kernel's.
    pub(super) fn is(&self, id: (u64, u64)) -> bool {
        if self.ino != id.1 {
            return false;
        }
        if self.dev == id.0 {
            return true;
        }
        self.path.as_deref().is_some_and(|p| {
            std::fs::metadata(p).is_ok_and(|m| {
                use std::os::unix::fs::MetadataExt;
                (m.dev(), m.ino()) == id
            })
        })
    }
}

/// The shared file mappings of this process now.
pub(super) fn kernel_shared_maps() -> Vec<KernelMap> {
    let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let hex = |t: &str| usize::from_str_radix(t, 16).ok();
    text.lines()
        .filter_map(|l| {
            // start-end perms offset major:minor inode [padding path]
            let mut f = l.splitn(6, ' ');
            let (a, b) = f.next()?.split_once('-')?;
            let perms = f.next()?.as_bytes();
            let (maj, min) = f.nth(1)?.split_once(':')?;
            let ino: u64 = f.next()?.parse().ok()?;
            if perms.get(3) != Some(&b's') || ino == 0 {
                return None;
            }
            let path = f
                .next()
                .map(str::trim_start)
                .filter(|p| p.starts_with('/') && !p.ends_with(" (deleted)"))
                .map(str::to_string);
            Some(KernelMap {
                range: hex(a)?..hex(b)?,
                writable: perms.get(1) == Some(&b'w'),
                dev: libc::makedev(hex(maj)? as u32, hex(min)? as u32),
                ino,
                path,
            })
        })
        .collect()
}
