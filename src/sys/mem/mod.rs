//! Memory mappings: owned anonymous and shared mappings and the
//! madvise primitives that eviction uses; memfds in [`memfd`].

use super::PAGE_SIZE;
use std::os::fd::RawFd;

mod memfd;
pub use memfd::{hole_at, pwrite_all, pwrite_all_raw, Memfd};

/// An owned mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    addr: usize,
    len: usize,
}

// SAFETY: a Mapping is an address range; access to its contents is governed
// by the code that uses it, not by the handle.
unsafe impl Send for Mapping {}
// SAFETY: as above; the handle itself is immutable.
unsafe impl Sync for Mapping {}

fn check(p: *mut libc::c_void) -> Result<usize, i32> {
    if p == libc::MAP_FAILED {
        Err(super::errno())
    } else {
        Ok(p as usize)
    }
}

/// Where a new mapping goes.
#[derive(Debug)]
pub enum At {
    /// Where the kernel finds room, near this address if it can (0: no
    /// preference).
    Near(usize),
    /// Exactly here, where nothing may be mapped yet (`EEXIST` if
    /// anything is).
    Free(usize),
    /// Exactly over this hold, an inaccessible mapping of the caller's
    /// ([`Mapping::reserve_at`]), which the new mapping replaces. A failed
    /// map drops the hold (the range is unmapped).
    Over(Mapping),
}

impl Mapping {
    /// A private anonymous read-write mapping of `len` bytes. Pages are
    /// allocated by the kernel on first touch.
    pub fn anonymous(len: usize) -> Result<Mapping, i32> {
        Self::anonymous_at(At::Near(0), len)
    }

    /// A private anonymous mapping of `len` bytes, placed `at`.
    pub fn anonymous_at(at: At, len: usize) -> Result<Mapping, i32> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        Self::with_flags(at, len, flags, -1)
    }

    /// A shared read-write mapping of `fd` at file offset 0, placed `at`.
    pub fn shared(fd: RawFd, len: usize, at: At) -> Result<Mapping, i32> {
        Self::with_flags(at, len, libc::MAP_SHARED, fd)
    }

    /// A read-write mapping of `len` bytes with mmap `flags` (of `fd` at
    /// offset 0, or anonymous with `fd` -1), placed `at`.
    pub fn with_flags(at: At, len: usize, mut flags: i32, fd: RawFd) -> Result<Mapping, i32> {
        let (hint, hold) = match at {
            At::Near(a) => (a, None),
            At::Free(a) => {
                flags |= libc::MAP_FIXED_NOREPLACE;
                (a, None)
            }
            At::Over(h) => {
                flags |= libc::MAP_FIXED;
                (h.addr, Some(h))
            }
        };
        if let Some(h) = &hold {
            if h.len != len {
                return Err(libc::EINVAL);
            }
        }
        // SAFETY: a fresh mapping (of a descriptor the caller holds open,
        // if any); with MAP_FIXED_NOREPLACE the kernel refuses to replace
        // anything already mapped, and MAP_FIXED replaces only the hold,
        // which the caller owns and gives up here, of this very length.
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        let addr = check(p)?;
        // (Replaced: the region's mapping is the range's owner now.)
        std::mem::forget(hold);
        Ok(Mapping { addr, len })
    }

    /// This mapping's range, held: replaced by an inaccessible mapping
    /// in one step (its contents are gone). On failure it is unmapped.
    pub fn into_hold(self) -> Result<Mapping, i32> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED;
        // SAFETY: MAP_FIXED over this mapping's own range, which `self`
        // owns and gives up here.
        let p = unsafe { libc::mmap(self.addr as *mut _, self.len, libc::PROT_NONE, flags, -1, 0) };
        check(p)?;
        let (addr, len) = (self.addr, self.len);
        std::mem::forget(self);
        Ok(Mapping { addr, len })
    }

    /// Reserves `[addr, addr+len)` exactly with an inaccessible mapping,
    /// failing with `EEXIST` if anything is mapped there.
    pub fn reserve_at(addr: usize, len: usize) -> Result<Mapping, i32> {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_NORESERVE
                    | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        let a = check(p)?;
        let m = Mapping { addr: a, len };
        if a != addr {
            // An old kernel that ignores MAP_FIXED_NOREPLACE.
            return Err(libc::EEXIST);
        }
        Ok(m)
    }

    /// Reserves `len` bytes at an address aligned to `align` (a power of
    /// two, at least a page) with an inaccessible mapping: a hold to map
    /// over ([`At::Over`]). Costs a mapping of `len + align` and up to two
    /// `munmap`s of what lies outside the aligned range.
    pub fn reserve_aligned(len: usize, align: usize) -> Result<Mapping, i32> {
        let total = len.checked_add(align).ok_or(libc::ENOMEM)?;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        // SAFETY: a fresh inaccessible mapping, placed by the kernel.
        let p = check(unsafe {
            libc::mmap(std::ptr::null_mut(), total, libc::PROT_NONE, flags, -1, 0)
        })?;
        let a = p.next_multiple_of(align);
        // SAFETY: the head and tail are parts of the mapping just made,
        // which nothing else knows of.
        unsafe {
            if a > p {
                libc::munmap(p as *mut libc::c_void, a - p);
            }
            if p + total > a + len {
                libc::munmap((a + len) as *mut libc::c_void, p + total - (a + len));
            }
        }
        Ok(Mapping { addr: a, len })
    }

    /// Start address.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Length in bytes (never zero: mmap refuses zero lengths).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes of the mapping resident now ([`resident`]).
    pub fn resident(&self) -> u64 {
        resident(self.addr, self.len)
    }

    /// Gives up ownership: the range is no longer unmapped on drop.
    pub fn into_raw(self) -> (usize, usize) {
        let r = (self.addr, self.len);
        std::mem::forget(self);
        r
    }

    /// Takes ownership of a range mapped elsewhere.
    ///
    /// # Safety
    /// `[addr, addr+len)` must be a mapping nobody else will unmap.
    pub unsafe fn from_raw(addr: usize, len: usize) -> Mapping {
        Mapping { addr, len }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own the range.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// A private anonymous mapping made on first use, so that an object that
/// never needs it costs no mapping (and no kernel VMA between its region
/// and the next one's). [`LazyMapping::get`] is async-signal-safe: one
/// `mmap` (and `madvise`) at most; when two threads race, the loser unmaps
/// its mapping and uses the winner's.
#[derive(Debug)]
pub struct LazyMapping {
    addr: std::sync::atomic::AtomicUsize,
    len: usize,
    advice: i32,
}

impl LazyMapping {
    /// `len` bytes, given `advice` (0: none) when made.
    pub fn new(len: usize, advice: i32) -> LazyMapping {
        LazyMapping {
            addr: std::sync::atomic::AtomicUsize::new(0),
            len,
            advice,
        }
    }

    /// The mapping's address, making it if it does not exist yet.
    pub fn get(&self) -> Result<usize, i32> {
        use std::sync::atomic::Ordering::*;
        if let Some(a) = self.peek() {
            return Ok(a);
        }
        let (a, len) = Mapping::anonymous(self.len)?.into_raw();
        if self.advice != 0 {
            let _ = madvise(a, len, self.advice);
        }
        match self.addr.compare_exchange(0, a, AcqRel, Acquire) {
            Ok(_) => Ok(a),
            Err(winner) => {
                // SAFETY: `a` is the mapping we just made and never published.
                drop(unsafe { Mapping::from_raw(a, len) });
                Ok(winner)
            }
        }
    }

    /// Bytes of the mapping resident now (0 if it was never made).
    pub fn resident(&self) -> u64 {
        self.peek().map_or(0, |a| resident(a, self.len))
    }

    /// The mapping's address if it was made.
    #[inline]
    pub fn peek(&self) -> Option<usize> {
        match self.addr.load(std::sync::atomic::Ordering::Acquire) {
            0 => None,
            a => Some(a),
        }
    }
}

impl Drop for LazyMapping {
    fn drop(&mut self) {
        if let Some(a) = self.peek() {
            // SAFETY: we made and own the range.
            drop(unsafe { Mapping::from_raw(a, self.len) });
        }
    }
}

/// Bytes of `[addr, addr + len)` (page-aligned `addr`) that are resident
/// now, from `mincore`: what the range costs in memory. A 16 MiB chunk of
/// the range that `mincore` refuses (one with an unmapped hole) counts as
/// nothing. For reports: it allocates nothing but loops over the range
/// 4,096 pages per call.
pub fn resident(addr: usize, len: usize) -> u64 {
    const CHUNK: usize = 4096;
    let mut v = [0u8; CHUNK];
    let (mut a, end) = (addr, addr + len);
    let mut n = 0u64;
    while a < end {
        let l = (end - a).min(CHUNK * PAGE_SIZE);
        // SAFETY: `v` has room for one byte per page of `l`; mincore only
        // reads the page tables of our own address space.
        let r = unsafe { libc::mincore(a as *mut libc::c_void, l, v.as_mut_ptr()) };
        if r == 0 {
            n += v[..l.div_ceil(PAGE_SIZE)]
                .iter()
                .filter(|&&b| b & 1 != 0)
                .count() as u64;
        }
        a += l;
    }
    n * PAGE_SIZE as u64
}

/// `madvise(addr, len, advice)`; async-signal-safe.
#[inline]
pub fn madvise(addr: usize, len: usize, advice: i32) -> Result<(), i32> {
    // SAFETY: madvise on a range the engine owns; DONTNEED/REMOVE drop pages,
    // which is the intended effect.
    let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(super::errno())
    }
}

/// `MADV_DONTNEED_LOCKED` (Linux 5.18): `MADV_DONTNEED` that drops the
/// pages of a locked (`mlock`ed) mapping too, and leaves the lock.
pub const MADV_DONTNEED_LOCKED: i32 = 24;

/// Drops the pages of `[addr, addr + len)` from this process's mappings,
/// locked ones included: reclaim's zap. A region the application
/// `mlock`ed (or `mlockall`ed, `MCL_FUTURE` locking every later region)
/// is still paged within the budget, where `MADV_DONTNEED` refuses it
/// (`EINVAL`). `MADV_DONTNEED` where the kernel lacks the locked variant.
/// Async-signal-safe.
pub fn zap(addr: usize, len: usize) -> Result<(), i32> {
    match madvise(addr, len, MADV_DONTNEED_LOCKED) {
        Err(libc::EINVAL) => madvise(addr, len, libc::MADV_DONTNEED),
        r => r,
    }
}

/// Bytes of [`zeros`] there are: a 2 MiB page's (`sys::huge` checks).
pub const ZEROS_LEN: usize = 2 << 20;

/// Zeros: 2 MiB, so that a huge page takes them too (a zero page to copy
/// in, which hugetlb has no `UFFDIO_ZEROPAGE` for; a hole's contents). Interior mutability (never used:
/// nothing writes it) puts it in `.bss`, not `.rodata`: it adds nothing to
/// the binary, costs no memory, and reading it maps the kernel's shared
/// zero page.
#[repr(C, align(4096))]
struct ZeroPage(std::cell::UnsafeCell<[u8; ZEROS_LEN]>);
// SAFETY: nothing ever writes the bytes; they are only read.
unsafe impl Sync for ZeroPage {}
static ZERO_PAGE: ZeroPage = ZeroPage(std::cell::UnsafeCell::new([0; ZEROS_LEN]));

/// `len` (at most [`ZEROS_LEN`]) bytes of zeros that live for ever, at a 4 KiB
/// aligned address. Async-signal-safe.
pub fn zeros(len: usize) -> &'static [u8] {
    // SAFETY: the array is never written (see `ZeroPage`), so a shared
    // slice of it aliases no mutable access.
    let all: &'static [u8; ZEROS_LEN] = unsafe { &*ZERO_PAGE.0.get() };
    &all[..len]
}

/// `mprotect`.
pub fn mprotect(addr: usize, len: usize, prot: i32) -> Result<(), i32> {
    // SAFETY: changes protection of a range the engine owns.
    let rc = unsafe { libc::mprotect(addr as *mut libc::c_void, len, prot) };
    if rc == 0 {
        Ok(())
    } else {
        Err(super::errno())
    }
}

/// Sorts `ranges` by address and merges the ones that touch; returns how
/// many are left (at the front). No allocation.
pub fn coalesce_ranges(ranges: &mut [(usize, usize)]) -> usize {
    ranges.sort_unstable_by_key(|r| r.0);
    let mut n = 0;
    for k in 0..ranges.len() {
        let (a, l) = ranges[k];
        if n > 0 && ranges[n - 1].0 + ranges[n - 1].1 == a {
            ranges[n - 1].1 += l;
        } else {
            ranges[n] = (a, l);
            n += 1;
        }
    }
    n
}

/// [`zap`] over several ranges of this process in one call
/// (`process_madvise` on `PIDFD_SELF`, `MADV_DONTNEED_LOCKED`), so the
/// kernel flushes the TLB once for all of them; falls back to one [`zap`]
/// per range where the kernel refuses. Async-signal-safe. At most 64
/// ranges.
pub fn dontneed_batch(ranges: &[(usize, usize)]) -> Result<(), i32> {
    const PIDFD_SELF: libc::c_int = -10000;
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 64];
    let n = ranges.len().min(64);
    for (v, &(a, l)) in iov.iter_mut().zip(&ranges[..n]) {
        *v = libc::iovec {
            iov_base: a as *mut libc::c_void,
            iov_len: l,
        };
    }
    let total: usize = ranges[..n].iter().map(|r| r.1).sum();
    // SAFETY: `iov` holds `n` valid descriptors of ranges in our own address
    // space; MADV_DONTNEED_LOCKED drops their pages, which the caller
    // intends.
    let r = unsafe {
        libc::syscall(
            libc::SYS_process_madvise,
            PIDFD_SELF,
            iov.as_ptr(),
            n,
            MADV_DONTNEED_LOCKED,
            0,
        )
    };
    if r >= 0 && r as usize == total {
        return Ok(());
    }
    for &(a, l) in &ranges[..n] {
        zap(a, l)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lazy_mapping_is_made_once_under_a_race() {
        let m = std::sync::Arc::new(LazyMapping::new(4 * 4096, libc::MADV_NOHUGEPAGE));
        assert!(m.peek().is_none());
        let addrs: Vec<usize> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || m.get().unwrap())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        assert!(addrs.iter().all(|&a| a == addrs[0]));
        assert_eq!(m.peek(), Some(addrs[0]));
        // SAFETY: the mapping is 4 pages, readable and writable, and ours.
        unsafe {
            std::ptr::write_volatile((addrs[0] + 3 * 4096) as *mut u8, 5);
            assert_eq!(
                std::ptr::read_volatile((addrs[0] + 3 * 4096) as *const u8),
                5
            );
        }
    }

    #[test]
    fn coalesce_merges_touching_ranges_only() {
        let mut r = [
            (0x5000, 0x1000),
            (0x1000, 0x1000),
            (0x2000, 0x2000),
            (0x9000, 0x1000),
        ];
        let n = coalesce_ranges(&mut r);
        assert_eq!(
            &r[..n],
            &[(0x1000, 0x3000), (0x5000, 0x1000), (0x9000, 0x1000)]
        );
        assert_eq!(coalesce_ranges(&mut []), 0);
    }
}
