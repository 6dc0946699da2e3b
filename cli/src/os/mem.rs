//! Memory for the floors: anonymous and memfd mappings through `memmap2`,
//! memfds, hole punches, `pwrite` and `madvise` through `nix`, and the one
//! call neither has, `process_madvise(2)` ([`dontneed_batch`]).
//!
//! [`punch_hole`], [`pwrite_all`] and [`dontneed_batch`] are a system call
//! or a few on stack data, so the floors' SIGBUS handlers may call them.

use memmap2::{MmapMut, MmapOptions};
use nix::errno::Errno;
use nix::fcntl::FallocateFlags;
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use nix::sys::mman::{madvise, MmapAdvise};
use std::ffi::CStr;
use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;

/// A private anonymous read-write mapping of `len` bytes, with no swap
/// reserved for it (`MAP_NORESERVE`): the kernel allocates each page on
/// first touch.
pub fn anonymous(len: usize) -> std::io::Result<MmapMut> {
    anonymous_sized(len, uffd_pager::PAGE_SIZE)
}

/// [`anonymous`] of pages of `page_size`: 4 KiB, or 2 MiB from the
/// kernel's hugetlb pool (`MAP_HUGETLB`; `len` a multiple of 2 MiB, and a
/// page that the pool cannot supply at first touch is a SIGBUS).
pub fn anonymous_sized(len: usize, page_size: usize) -> std::io::Result<MmapMut> {
    let mut o = MmapOptions::new();
    o.len(len).no_reserve_swap();
    if page_size != uffd_pager::PAGE_SIZE {
        o.huge(Some(page_size.trailing_zeros() as u8));
    }
    o.map_anon()
}

/// A memfd (`MFD_CLOEXEC`) of a fixed length, closed on drop.
#[derive(Debug)]
pub struct Memfd {
    file: File,
}

impl Memfd {
    /// A memfd named `name`, `len` bytes long (all holes).
    pub fn new(name: &CStr, len: usize) -> std::io::Result<Memfd> {
        Self::sized(name, len, uffd_pager::PAGE_SIZE)
    }

    /// [`Memfd::new`] of pages of `page_size`: 4 KiB (tmpfs) or 2 MiB
    /// (hugetlbfs, `MFD_HUGETLB`: `len` a multiple of 2 MiB; it has no
    /// `write(2)`, so it is filled through a mapping).
    pub fn sized(name: &CStr, len: usize, page_size: usize) -> std::io::Result<Memfd> {
        let mut flags = MemFdCreateFlag::MFD_CLOEXEC;
        if page_size != uffd_pager::PAGE_SIZE {
            flags |= MemFdCreateFlag::MFD_HUGETLB | MemFdCreateFlag::MFD_HUGE_2MB;
        }
        let fd = memfd_create(name, flags)?;
        let file = File::from(fd);
        file.set_len(len as u64)?;
        Ok(Memfd { file })
    }

    /// The raw descriptor, for code that cannot hold a borrow (a signal
    /// handler reading it from an atomic).
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// A shared read-write mapping of its first `len` bytes.
    pub fn map_shared(&self, len: usize) -> std::io::Result<MmapMut> {
        // SAFETY: memmap2's contract is that nothing else changes the file
        // under a Rust reference to the mapping; the floors read and write
        // the mapping only through raw pointers, exactly because the
        // kernel (hole punches, UFFDIO_CONTINUE) changes what it shows.
        unsafe { MmapOptions::new().len(len).map_mut(&self.file) }
    }

    /// Punches `[off, off + len)` out of the memfd (its pages leave the
    /// page cache and every mapping of them).
    pub fn punch_hole(&self, off: usize, len: usize) -> Result<(), Errno> {
        punch_hole(self.fd(), off, len)
    }
}

/// `fallocate(PUNCH_HOLE | KEEP_SIZE)` of `[off, off + len)` in `fd`.
/// Async-signal-safe.
pub fn punch_hole(fd: RawFd, off: usize, len: usize) -> Result<(), Errno> {
    nix::fcntl::fallocate(
        fd,
        FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
        off as libc::off_t,
        len as libc::off_t,
    )
}

/// Writes all of `buf` to `fd` at `off`, retrying short writes and
/// `EINTR`. Async-signal-safe.
pub fn pwrite_all(fd: BorrowedFd<'_>, mut buf: &[u8], mut off: u64) -> Result<(), Errno> {
    while !buf.is_empty() {
        match nix::sys::uio::pwrite(fd, buf, off as libc::off_t) {
            Ok(0) => return Err(Errno::EIO),
            Ok(n) => {
                buf = &buf[n..];
                off += n as u64;
            }
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `MADV_DONTNEED` of `[addr, addr + len)`. Async-signal-safe.
///
/// # Safety
/// The range must be mapped memory of this process that no Rust reference
/// points into: its contents are dropped (anonymous pages read back as
/// zeros or fault again, file pages are re-read from the file).
pub unsafe fn dontneed(addr: usize, len: usize) -> Result<(), Errno> {
    let Some(p) = NonNull::new(addr as *mut libc::c_void) else {
        return Err(Errno::EINVAL);
    };
    // SAFETY: the caller's contract.
    unsafe { madvise(p, len, MmapAdvise::MADV_DONTNEED) }
}

/// The most ranges [`dontneed_batch`] takes.
pub const BATCH_MAX: usize = 64;

/// `process_madvise(2)` of `advice` over `iov`, on this process
/// (`PIDFD_SELF`, Linux 6.15: no pidfd to open); the bytes advised.
///
/// # Safety
/// As [`dontneed`], for every range in `iov`.
unsafe fn process_madvise_self(iov: &[libc::iovec], advice: libc::c_int) -> Result<usize, Errno> {
    /// `PIDFD_SELF_THREAD_GROUP` in `<linux/pidfd.h>`.
    const PIDFD_SELF: libc::c_int = -10000;
    // SAFETY: the kernel only reads `iov`, which describes ranges of our
    // own address space; what the advice does to them is the caller's
    // contract.
    let r = unsafe {
        libc::syscall(
            libc::SYS_process_madvise,
            PIDFD_SELF,
            iov.as_ptr(),
            iov.len(),
            advice,
            0u32,
        )
    };
    Errno::result(r).map(|n| n as usize)
}

/// `MADV_DONTNEED` of up to [`BATCH_MAX`] `(addr, len)` ranges of this
/// process in one `process_madvise(2)` (one TLB flush for all of them),
/// or one `madvise` per range where the kernel refuses that or stops
/// short. No allocation; async-signal-safe.
///
/// # Safety
/// As [`dontneed`], for every range.
pub unsafe fn dontneed_batch(ranges: &[(usize, usize)]) -> Result<(), Errno> {
    let ranges = &ranges[..ranges.len().min(BATCH_MAX)];
    let iov: [libc::iovec; BATCH_MAX] = std::array::from_fn(|i| {
        let (addr, len) = ranges.get(i).copied().unwrap_or((0, 0));
        libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        }
    });
    let want: usize = ranges.iter().map(|&(_, len)| len).sum();
    // SAFETY: the caller's contract.
    if unsafe { process_madvise_self(&iov[..ranges.len()], libc::MADV_DONTNEED) } == Ok(want) {
        return Ok(());
    }
    ranges.iter().try_for_each(|&(addr, len)| {
        // SAFETY: the caller's contract, range by range.
        unsafe { dontneed(addr, len) }
    })
}

/// Whether `dir` is on tmpfs (its files live in memory).
pub fn on_tmpfs(dir: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a zeroed statfs is a valid out-parameter; `c` is a path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == TMPFS_MAGIC }
}

/// How many of the pages mapped in `[addr, addr + len)` are mapped more
/// than once (a map count of 2 or more: a second mapping in any process),
/// from `/proc/self/smaps`: the
/// `Shared_Clean` and `Shared_Dirty` of every mapping that overlaps the
/// range, in 4 KiB pages. A mapping that only partly overlaps counts
/// whole, so give the exact range of a mapping.
///
/// Why it matters to a benchmark: the kernel counts a file page's first
/// mapping (`NR_FILE_MAPPED`, per memory cgroup) and not later ones, so a
/// fault that maps a page some other mapping already holds costs less. A
/// kernel-side pass over pages that another mapping keeps mapped is
/// cheaper than a user of that file would see.
pub fn pages_mapped_elsewhere(addr: usize, len: usize) -> std::io::Result<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    Ok(shared_kib_in(&smaps, addr, addr + len) / 4)
}

/// The `Shared_Clean` + `Shared_Dirty` kB of the mappings in `smaps` that
/// overlap `[start, end)`.
fn shared_kib_in(smaps: &str, start: usize, end: usize) -> u64 {
    let mut inside = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let head = line.split_once(' ').map_or(line, |(h, _)| h);
        if let Some((a, b)) = head.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = a < end && start < b;
                continue;
            }
        }
        if !inside {
            continue;
        }
        if let Some(v) = line
            .strip_prefix("Shared_Clean:")
            .or_else(|| line.strip_prefix("Shared_Dirty:"))
        {
            kib += v
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap_or(0);
        }
    }
    kib
}

/// Bytes free to an unprivileged writer on the file system of `dir`
/// (`statvfs(2)`).
pub fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    let s = nix::sys::statvfs::statvfs(dir)?;
    Ok((s.blocks_available() as u64).saturating_mul(s.fragment_size() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dontneed_batch_zeroes_anonymous_pages() {
        let m = anonymous(4 * 4096).unwrap();
        let a = m.as_ptr() as usize;
        for p in 0..4 {
            // SAFETY: our own fresh mapping of 4 pages; no reference held.
            unsafe { std::ptr::write_volatile((a + p * 4096) as *mut u8, 9) };
        }
        // SAFETY: as above.
        unsafe { dontneed_batch(&[(a, 4096), (a + 2 * 4096, 2 * 4096)]) }.unwrap();
        // SAFETY: as above.
        let read = |p: usize| unsafe { std::ptr::read_volatile((a + p * 4096) as *const u8) };
        assert_eq!([read(0), read(1), read(2), read(3)], [0, 9, 0, 0]);
    }

    #[test]
    fn memfd_pwrite_and_punch() {
        use std::os::fd::AsFd;
        let m = Memfd::new(c"os-mem-test", 2 * 4096).unwrap();
        let map = m.map_shared(2 * 4096).unwrap();
        pwrite_all(m.file.as_fd(), &[5; 4096], 4096).unwrap();
        let a = map.as_ptr() as usize;
        // SAFETY: the mapping is live; read through a raw pointer.
        let read = || unsafe { std::ptr::read_volatile((a + 4096) as *const u8) };
        assert_eq!(read(), 5);
        m.punch_hole(4096, 4096).unwrap();
        assert_eq!(read(), 0);
    }

    #[test]
    fn shared_pages_are_counted_only_in_the_range() {
        let smaps = "\
7f0000000000-7f0000004000 r--s 00000000 00:01 5 /dev/shm/a
Rss:                  16 kB
Shared_Clean:          8 kB
Shared_Dirty:          4 kB
Private_Clean:         4 kB
7f0000004000-7f0000008000 r--s 00000000 00:01 6 /dev/shm/b
Shared_Clean:         16 kB
";
        assert_eq!(shared_kib_in(smaps, 0x7f00_0000_0000, 0x7f00_0000_4000), 12);
        assert_eq!(shared_kib_in(smaps, 0x7f00_0000_4000, 0x7f00_0000_5000), 16);
        assert_eq!(shared_kib_in(smaps, 0x7f00_0000_8000, 0x7f00_0000_9000), 0);
    }

    #[test]
    fn a_file_mapped_twice_shows_as_shared() {
        let f = Memfd::new(c"mapped-twice", 4 * 4096).unwrap();
        let mut a = f.map_shared(4 * 4096).unwrap();
        a.fill(1);
        let range = (a.as_ptr() as usize, a.len());
        assert_eq!(pages_mapped_elsewhere(range.0, range.1).unwrap(), 0);
        let b = f.map_shared(4 * 4096).unwrap();
        assert!(b.iter().step_by(4096).all(|&x| x == 1));
        assert_eq!(pages_mapped_elsewhere(range.0, range.1).unwrap(), 4);
    }
}
