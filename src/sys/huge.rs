//! 2 MiB pages (hugetlb): mappings, the hugetlbfs memfd, the kernel's pool
//! of reserved pages, and a read of the process's own memory that never
//! waits on userfaultfd.
//!
//! Hugetlb pages come only from the pool the administrator reserves
//! (`/proc/sys/vm/nr_hugepages`); nothing here reserves pages at `mmap`
//! time (`MAP_NORESERVE`): a pager maps more than its budget, and the
//! budget, not the mapping, says how many it holds at once. A page the pool
//! cannot supply fails the install or fill that needed it (`ENOMEM` /
//! `ENOSPC`), as the kernel's own hugetlb fault then raises SIGBUS.

use super::mem::{At, Mapping, Memfd};
use std::os::fd::RawFd;

/// Bytes in a huge page (x86-64 PMD size).
pub const HUGE_PAGE_SIZE: usize = 2 << 20;
/// `log2(HUGE_PAGE_SIZE)`.
pub const HUGE_PAGE_SHIFT: u32 = 21;

/// `MAP_HUGE_2MB` / `MFD_HUGE_2MB`: `21 << MAP_HUGE_SHIFT`.
const HUGE_2MB: i32 = 21 << 26;

/// A private anonymous hugetlb mapping of `len` bytes (a multiple of
/// [`HUGE_PAGE_SIZE`]), placed `at`.
pub fn anonymous_at(at: At, len: usize) -> Result<Mapping, i32> {
    let flags = libc::MAP_PRIVATE
        | libc::MAP_ANONYMOUS
        | libc::MAP_NORESERVE
        | libc::MAP_HUGETLB
        | HUGE_2MB;
    Mapping::with_flags(at, len, flags, -1)
}

/// A shared mapping of the hugetlbfs memfd `fd`, reserving nothing,
/// placed `at`.
pub fn shared_at(fd: RawFd, len: usize, at: At) -> Result<Mapping, i32> {
    Mapping::with_flags(at, len, libc::MAP_SHARED | libc::MAP_NORESERVE, fd)
}

// A huge page's worth of zeros is there to copy or write out.
const _: () = assert!(HUGE_PAGE_SIZE <= super::mem::ZEROS_LEN);

/// A memfd on hugetlbfs of 2 MiB pages (`MFD_HUGETLB`). It has no
/// `write`: pages are filled through a mapping of it, after
/// [`allocate`].
pub fn memfd(name: &str, len: usize) -> Result<Memfd, i32> {
    Memfd::with_flags(name, len, libc::MFD_HUGETLB | HUGE_2MB as u32)
}

/// Takes the pages of `[off, off + len)` of a hugetlbfs memfd from the
/// pool now (`fallocate`), so that writing them through a mapping cannot
/// fault for want of one (which would be SIGBUS in the engine's own
/// thread). `ENOSPC` when the pool is empty; `EINTR` is retried.
/// Async-signal-safe.
pub fn allocate(fd: RawFd, off: usize, len: usize) -> Result<(), i32> {
    loop {
        // SAFETY: fallocate on a descriptor the caller holds open.
        let rc = unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, off as i64, len as i64) };
        match rc {
            0 => return Ok(()),
            // Hugetlbfs checks for a pending signal before it looks for the
            // page (a stop, a freeze, a handled signal): not an answer.
            _ if super::errno() == libc::EINTR => continue,
            _ => return Err(super::errno()),
        }
    }
}

/// The kernel's pool of 2 MiB pages, in pages
/// (`/sys/kernel/mm/hugepages/hugepages-2048kB/`): what regions of
/// [`HUGE_PAGE_SIZE`] pages draw from.
///
/// ```
/// if let Some(pool) = uffd_pager::HugePagePool::read() {
///     assert!(pool.free <= pool.total);
/// }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pool {
    /// Reserved by the administrator (`nr_hugepages`).
    pub total: u64,
    /// Not in use by anyone.
    pub free: u64,
    /// Promised to mappings that reserved them but not yet faulted in.
    pub reserved: u64,
}

impl Pool {
    /// Reads the pool now; `None` where the kernel has no 2 MiB pool.
    /// Not async-signal-safe (it reads files).
    pub fn read() -> Option<Pool> {
        let read = |name: &str| -> Option<u64> {
            std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/hugepages-2048kB/{name}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        Some(Pool {
            total: read("nr_hugepages")?,
            free: read("free_hugepages")?,
            reserved: read("resv_hugepages")?,
        })
    }

    /// [`Pool::read`], all zeros where there is no pool.
    pub fn now() -> Pool {
        Self::read().unwrap_or_default()
    }

    /// Pages free for a new user: free and not promised.
    pub fn available(&self) -> u64 {
        self.free.saturating_sub(self.reserved)
    }

    /// Checks now that the pool can give `needed` pages:
    /// [`Error::NoHugePages`](crate::Error::NoHugePages), whose message
    /// says what to reserve, where it cannot. A check, not a reservation:
    /// another process may take them before they are faulted in.
    ///
    /// ```
    /// assert!(uffd_pager::HugePagePool::require(0).is_ok());
    /// ```
    pub fn require(needed: u64) -> crate::Result<()> {
        let available = Self::now().available();
        if available < needed {
            return Err(crate::Error::NoHugePages { needed, available });
        }
        Ok(())
    }

    /// The 2 MiB pages a region of `pages` of them holds at once under a
    /// budget of `budget` 4 KiB pages (0: no budget): what mapping it
    /// checks the pool for. Reclaim lets residency pass the budget by the
    /// page being faulted in (and one more racing it) before it evicts.
    pub fn needed_for(pages: u64, budget: u64) -> u64 {
        let units = (HUGE_PAGE_SIZE / super::PAGE_SIZE) as u64;
        if budget == 0 {
            pages
        } else {
            pages.min(budget / units + 2)
        }
    }
}

/// `/proc/self/mem`, opened at map time ([`open_self_mem`]) and checked
/// on each read ([`super::self_file`]: after a fork the inherited
/// descriptor would read the parent's memory).
static SELF_MEM: super::self_file::SelfFile = super::self_file::SelfFile::new(c"/proc/self/mem");

/// Opens `/proc/self/mem` for [`read_self`] if this process has it not
/// open yet. Call outside signal handlers (at map time), so that a read
/// finds it open.
pub fn open_self_mem() -> Result<(), i32> {
    SELF_MEM.fd().map(|_| ())
}

/// Copies `len` bytes of this process's memory at `addr` into `dst`
/// through `/proc/self/mem`. Where the engine reads a user page it does
/// not own the mapping of (evicting a huge anonymous page, which
/// `UFFDIO_MOVE` cannot take), a plain load could fault on a page the
/// application dropped and wait, in the engine's own thread, for a fault
/// the engine itself must serve; this read takes the kernel's remote path,
/// which does not wait on userfaultfd: an absent page fails it with `EIO`.
/// Async-signal-safe (`pread`, and what [`super::self_file::SelfFile::fd`]
/// calls: it opens the file again in a forked child).
///
/// # Safety
/// `dst` is valid for writes of `len` bytes.
pub unsafe fn read_self(addr: usize, dst: *mut u8, len: usize) -> Result<(), i32> {
    let fd = SELF_MEM.fd()?;
    let mut done = 0;
    while done < len {
        // SAFETY: the caller's contract on `dst`.
        let n = unsafe {
            libc::pread(
                fd,
                dst.add(done).cast(),
                len - done,
                (addr + done) as libc::off_t,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(libc::EIO),
            _ if super::errno() == libc::EINTR => {}
            _ => return Err(super::errno()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A forked child that maps (and so opens the file) reads its own
    /// memory: before, the descriptor the parent opened read the
    /// parent's, and a child's eviction of a huge page wrote the parent's
    /// bytes to its swap.
    #[test]
    fn a_forked_child_reads_its_own_memory() {
        open_self_mem().unwrap();
        let m = Mapping::anonymous(4096).unwrap();
        // SAFETY: our own fresh mapping.
        unsafe { std::ptr::write_bytes(m.addr() as *mut u8, 7, 4096) };
        // SAFETY: the child writes only its own copy of `m`, makes no
        // allocation and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: the child's copy of the mapping.
            unsafe { std::ptr::write_bytes(m.addr() as *mut u8, 9, 4096) };
            let mut out = [0u8; 64];
            let ok = open_self_mem().is_ok()
                // SAFETY: `out` holds 64 bytes.
                && unsafe { read_self(m.addr(), out.as_mut_ptr(), 64) }.is_ok()
                && out.iter().all(|&b| b == 9);
            // SAFETY: _exit has no preconditions.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut st = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "{st:#x}");
    }

    #[test]
    fn reading_own_memory_copies_it_and_an_unmapped_page_fails_cleanly() {
        open_self_mem().unwrap();
        let m = Mapping::anonymous(2 * super::super::PAGE_SIZE).unwrap();
        // SAFETY: our own fresh mapping.
        unsafe { std::ptr::write_bytes(m.addr() as *mut u8, 7, 4096) };
        let mut out = vec![0u8; 4096];
        // SAFETY: `out` holds 4096 bytes.
        unsafe { read_self(m.addr(), out.as_mut_ptr(), 4096) }.unwrap();
        assert!(out.iter().all(|&b| b == 7));
        let hole = Mapping::anonymous(4096).unwrap();
        let at = hole.addr();
        drop(hole);
        // SAFETY: as above.
        assert!(unsafe { read_self(at, out.as_mut_ptr(), 4096) }.is_err());
    }

    #[test]
    fn the_pool_reads_as_numbers() {
        let p = Pool::now();
        assert!(p.free <= p.total);
        assert!(p.available() <= p.free);
    }
}
