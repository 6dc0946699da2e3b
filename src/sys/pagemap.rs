//! Where a page of this process is, without touching it: present in its
//! page tables (`mincore`), or in swap (`/proc/self/pagemap`).

/// Whether the page at `addr` is present (`mincore`): what an ioctl's
/// error code may not say. For private anonymous memory, present means
/// mapped by a PTE; for a shared mapping of a file or memfd, that the file
/// holds the page, mapped or not (where no PTE maps it, `mincore` looks in
/// the file's page cache): a kernel-mapped object's page that a fault
/// filled and the kernel has not mapped yet is present. Never touches the
/// page, so it cannot fault. `Err` if `addr` is not mapped at all.
/// Async-signal-safe.
#[inline]
pub fn page_present(addr: usize) -> Result<bool, i32> {
    let mut v = 0u8;
    // SAFETY: mincore writes one byte per page of the (one-page) range
    // into `v`; it only inspects page tables.
    let rc = unsafe { libc::mincore(addr as *mut libc::c_void, 4096, &mut v) };
    if rc == 0 {
        Ok(v & 1 != 0)
    } else {
        Err(super::errno())
    }
}

/// `/proc/self/pagemap` kept open since a pager was built:
/// [`page_in_swap`]'s fallback for a process out of descriptors, checked
/// on each use ([`super::self_file`]).
static PAGEMAP: super::self_file::SelfFile = super::self_file::SelfFile::new(c"/proc/self/pagemap");

/// Opens `/proc/self/pagemap`, close-on-exec; -1 if it cannot be.
fn open_pagemap() -> i32 {
    // SAFETY: a NUL-terminated path; the caller owns the descriptor.
    unsafe {
        libc::open(
            c"/proc/self/pagemap".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    }
}

/// Keeps a descriptor of `/proc/self/pagemap` for [`page_in_swap`] to
/// fall back on (a pager's build calls it; in a forked child, a pager
/// built there opens the child's own).
pub fn keep_pagemap() {
    let _ = PAGEMAP.fd();
}

/// Whether the kernel holds the page at `addr` in swap (a swap entry in
/// its PTE: `/proc/self/pagemap` bit 62), where [`page_present`] says "not
/// resident" once the page has left the swap cache: still the
/// application's page, not a dropped one. Opens, reads and closes the
/// file each call (a rare path); a process out of descriptors (`EMFILE`,
/// `ENFILE`) reads the one [`keep_pagemap`] kept, if it still is that
/// file. False if neither can be read. Async-signal-safe (`open`,
/// `fstat`, `pread`, `close`), `errno` kept.
pub fn page_in_swap(addr: usize) -> bool {
    let saved = super::errno();
    let mut fd = open_pagemap();
    let own = fd >= 0;
    if !own && matches!(super::errno(), libc::EMFILE | libc::ENFILE) {
        fd = PAGEMAP.kept();
    }
    if fd < 0 {
        super::set_errno(saved);
        return false;
    }
    let mut entry = 0u64;
    // SAFETY: reads 8 bytes into `entry`; `fd` is open (ours, or the kept
    // one just checked).
    let n = unsafe {
        libc::pread(
            fd,
            (&mut entry as *mut u64).cast(),
            8,
            ((addr / 4096) * 8) as libc::off_t,
        )
    };
    if own {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(fd) };
    }
    super::set_errno(saved);
    n == 8 && entry & (1 << 62) != 0
}

/// Whether the page at `addr` is there: resident ([`page_present`]) or
/// in swap ([`page_in_swap`]). For anonymous memory, where `mincore`'s
/// "not resident" would otherwise be taken for "no page" (dropped).
/// Async-signal-safe.
pub fn page_there(addr: usize) -> Result<bool, i32> {
    page_present(addr).map(|p| p || page_in_swap(addr))
}

/// Bytes of private anonymous memory `[addr, addr + len)` (page-aligned
/// `addr`) holds now: its pages present in the page tables and mapped by
/// this process alone (`/proc/self/pagemap` bits 63 and 56). Unlike
/// `mincore`'s count ([`crate::sys::mem::resident`]) it leaves out PTEs
/// of the shared zero page, which a read of a never-written anonymous
/// page maps (`UFFDIO_ZEROPAGE`) and which costs no memory. `None` if the
/// file cannot be read. For reports: it loops over the range 4,096 pages
/// per read.
pub fn anonymous_bytes(addr: usize, len: usize) -> Option<u64> {
    const PRESENT: u64 = 1 << 63;
    const EXCLUSIVE: u64 = 1 << 56;
    const CHUNK: usize = 4096;
    let page = crate::sys::PAGE_SIZE;
    let fd = open_pagemap();
    if fd < 0 {
        return None;
    }
    let mut v = vec![0u64; CHUNK];
    let (mut a, end) = (addr, addr + len);
    let mut n = 0u64;
    let mut ok = true;
    while a < end {
        let pages = (end - a).div_ceil(page).min(CHUNK);
        // SAFETY: reads at most `pages` u64s into `v`, which holds CHUNK.
        let got = unsafe {
            libc::pread(
                fd,
                v.as_mut_ptr().cast(),
                pages * 8,
                ((a / page) * 8) as libc::off_t,
            )
        };
        if got != (pages * 8) as isize {
            ok = false;
            break;
        }
        n += v[..pages]
            .iter()
            .filter(|&&e| e & (PRESENT | EXCLUSIVE) == PRESENT | EXCLUSIVE)
            .count() as u64;
        a += pages * page;
    }
    // SAFETY: our own descriptor, closed once.
    unsafe { libc::close(fd) };
    ok.then_some(n * page as u64)
}
