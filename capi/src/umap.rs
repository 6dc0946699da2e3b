//! UMap's C calls (`include/umap/umap.h`), served by this engine, so that a
//! program written for LLNL's UMap builds unchanged against this project's
//! header and `-luffd_pager`.
//!
//! # How UMap's model maps onto the engine
//! - One pager per process, made at the first [`umap`] from the settings
//!   then in force (UMap's environment variables, read once, and any
//!   `umapcfg_set_*` call made before it); a `umap` refused for its length,
//!   offset, descriptor or file range (an unaligned offset, a range past
//!   the end) makes none. Settings changed after the first
//!   `umap` are kept for the getters but do not change the running pager.
//! - `UMAP_PAGESIZE` (bytes, a multiple of 4096; default 4096) is UMap's
//!   unit of filling. The engine's pages stay 4 KiB and each is read from
//!   the file on its own fault: the UMap page size sets the fault-around
//!   cluster (`UMAP_PAGESIZE / 4096` pages, rounded down to a power of
//!   two), which maps the neighbours already cached, in writable (shared)
//!   regions only, so a UMap page larger than 4 KiB is not filled by one
//!   fault as UMap fills it; [`umap_prefetch`] and the readahead window
//!   count in it. `UMAP_BUFSIZE` counts UMap pages, so the budget is
//!   `UMAP_BUFSIZE × UMAP_PAGESIZE` bytes (default: 80% of the memory
//!   available at the first call, as UMap's), and at least the engine's
//!   least budget, four 4 KiB pages.
//! - `UMAP_PAGE_FILLERS` sets the readahead threads, `UMAP_READ_AHEAD` the
//!   readahead window in UMap pages (default 0: none), and
//!   `UMAP_PAGE_EVICTORS=0` turns the background reclaimer off (any other
//!   value: one reclaimer). The eviction water marks and
//!   `UMAP_MAX_FAULT_EVENTS` are reported by the getters but the engine
//!   keeps its own water marks.
//! - A region mapped without `PROT_WRITE` is a private copy (the anonymous
//!   install kind, the fastest for reads); with `PROT_WRITE` it is a shared
//!   region whose dirty pages are written back to the file at
//!   [`umap_flush`], eviction and [`uunmap`], as UMap writes them back,
//!   and at exit for a region the program never unmapped.
//!   `UMAP_PRIVATE` and `MAP_SHARED` are both accepted and mean that;
//!   `UMAP_FIXED` places the region at `addr`; other flags are ignored, as
//!   UMap ignores them. `offset` is honoured (whole pages).
//! - Delivery and policy come from `UFFD_PAGER_DELIVERY` (default
//!   `in-thread`: a fault inside a system call on umapped memory fails with
//!   EFAULT, where UMap's handler threads would serve it; set
//!   `UFFD_PAGER_DELIVERY=threads` for that) and `UFFD_PAGER_POLICY`
//!   (default `retry-once`).
//! - In a `fork()`ed child the parent's pager serves nothing (a `umap`
//!   there fails); a child of a parent that had made no pager makes its
//!   own at its first `umap`, and its exit writes its regions back. A
//!   child forked while another thread of the parent was in a UMap call
//!   inherits the library's state locked by a thread it does not have:
//!   its calls then answer at once (`EPERM`, or a getter's default)
//!   instead of waiting for ever, and its exit writes nothing back.

use crate::umap_state::{say, state};
use engine::{InstallKind, MapOptions};
use std::ffi::{c_int, c_void};

/// One entry of [`umap_prefetch`]'s array.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct umap_prefetch_item {
    /// Any address in the UMap page to fetch.
    pub page_base_addr: *mut c_void,
}

/// Sets errno and returns UMAP_FAILED, keeping the message for
/// `uffd_pager_last_error` and printing it (UMap reports on stderr).
fn umap_failed(errno: i32, msg: impl std::fmt::Display) -> *mut c_void {
    let _ = crate::fail(errno, &msg);
    // (Never `eprintln!`: it panics when stderr is gone, and this runs
    // outside the callers' `catch_unwind` too.)
    say(&msg);
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() = errno };
    usize::MAX as *mut c_void
}

fn map(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: i64,
) -> *mut c_void {
    let mut st = match state() {
        Ok(st) => st,
        Err(e) => return umap_failed(e, crate::error_text()),
    };
    let bad = &st.settings.bad_page_size;
    if let Some(m) = bad.as_ref().or(st.settings.bad.first().map(|(_, m)| m)) {
        return umap_failed(libc::EINVAL, m.clone());
    }
    // A fixed range is held before the pager is built and the store
    // opened: their own mappings go where the kernel finds room, which may
    // be a range the caller has just freed (`engine::AddressHold`).
    let Some(rounded) = len
        .div_ceil(engine::PAGE_SIZE)
        .checked_mul(engine::PAGE_SIZE)
    else {
        return umap_failed(libc::ENOMEM, format_args!("length {len}"));
    };
    let fixed = flags & libc::MAP_FIXED != 0 && len != 0;
    let _hold = match fixed.then(|| engine::AddressHold::new(addr as usize, rounded)) {
        Some(Err(e)) => return umap_failed(e.errno(), e),
        h => h,
    };
    // Bad arguments are refused before the first call makes the pager: a
    // failed probe must not fix the settings the program sets after it.
    if len == 0 || offset < 0 {
        return umap_failed(libc::EINVAL, format_args!("length {len}, offset {offset}"));
    }
    // SAFETY: F_GETFL on a descriptor number; a bad one is EBADF.
    if unsafe { libc::fcntl(fd, libc::F_GETFL) } < 0 {
        return umap_failed(libc::EBADF, format_args!("fd {fd} is not open"));
    }
    // The store is opened before the first call makes the pager too: a
    // descriptor, offset or range the store refuses (an unaligned offset,
    // a range past the end of the file) fails the call without fixing the
    // settings.
    let len = rounded;
    let writable = prot & libc::PROT_WRITE != 0;
    let store = match crate::fd_store::fd_store(fd, offset as u64, len, writable) {
        Ok(s) => s,
        Err(rc) => return umap_failed(-rc, crate::error_text()),
    };
    if st.pager.is_none() {
        // (A bad setting is EINVAL; a pager the kernel refuses keeps its
        // errno: EPERM where userfaultfd is not allowed.)
        let made = st
            .settings
            .builder()
            .map_err(|m| (libc::EINVAL, m))
            .and_then(|b| b.build().map_err(|e| (e.errno(), e.to_string())));
        match made {
            Ok(p) => {
                st.pager = Some(p);
                st.unit = st.settings.page_size as usize;
                // The buffer in force, for the getter (UMap's default is
                // what the memory was when the pager was made).
                st.settings.buf_pages = st.settings.buffer_pages();
            }
            Err((errno, m)) => return umap_failed(errno, m),
        }
    }
    let opts = MapOptions {
        kind: Some(if writable {
            InstallKind::Shared
        } else {
            InstallKind::Anonymous
        }),
        writable,
        fixed_addr: (flags & libc::MAP_FIXED != 0).then_some(addr as usize),
        ..MapOptions::default()
    };
    let pager = st.pager.as_ref().expect("made above");
    // SAFETY: C callers reach a region's bytes through raw pointers only, and the C API makes
    // no Rust slice of them, so a store changed behind the engine shows its new bytes without
    // breaking a Rust reference (the header says so).
    match unsafe { pager.map_store(store, len, &opts) } {
        Ok(r) => {
            let p = r.as_ptr();
            st.regions.push(r);
            p.cast()
        }
        Err(e) => umap_failed(e.errno(), e),
    }
}

/// Maps `length` bytes of the file `fd` from `offset` on (see the module
/// documentation for the flags). Returns the address, or `UMAP_FAILED` with
/// errno set.
///
/// # Safety
/// With `UMAP_FIXED`, `addr` must be a page-aligned address range that is
/// free, as for a plain `MAP_FIXED_NOREPLACE` mmap.
#[no_mangle]
pub unsafe extern "C" fn umap(
    addr: *mut c_void,
    length: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: libc::off_t,
) -> *mut c_void {
    std::panic::catch_unwind(|| map(addr, length, prot, flags, fd, offset))
        .unwrap_or_else(|_| umap_failed(libc::EFAULT, "internal error in umap"))
}

/// Unmaps the region that starts at `addr`, writing its dirty pages back.
/// Returns 0, or -1 with errno set (EINVAL: no region starts there).
///
/// # Safety
/// No thread uses the region's memory after the call.
#[no_mangle]
pub unsafe extern "C" fn uunmap(addr: *mut c_void, length: usize) -> c_int {
    let _ = length; // UMap unmaps the whole region too
    let r = std::panic::catch_unwind(|| {
        let mut st = state()?;
        let Some(i) = st.regions.iter().position(|r| r.as_ptr() == addr.cast()) else {
            return Err(crate::fail(
                libc::EINVAL,
                format_args!("uunmap: no region starts at {addr:p}"),
            )
            .abs());
        };
        // The state stays held across the write-back: an exit on another
        // thread waits for it (the region is in no list meanwhile), and so
        // does umap_flush, which would else return before these pages are
        // written.
        let region = st.regions.swap_remove(i);
        let r = region.unmap().map_err(|e| crate::fail_with(&e).abs());
        drop(st);
        r
    });
    match r {
        Ok(Ok(())) => 0,
        _ => {
            set_errno(e_or_fault(&r));
            -1
        }
    }
}

fn e_or_fault(r: &std::thread::Result<Result<(), i32>>) -> i32 {
    match r {
        Ok(Err(e)) => *e,
        _ => libc::EFAULT,
    }
}

fn set_errno(e: i32) {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// Writes every region's dirty pages back to its file, and those of
/// regions unmapped while their file refused them. Returns 0, or -1 with
/// errno set.
#[no_mangle]
pub extern "C" fn umap_flush() -> c_int {
    let r = std::panic::catch_unwind(|| {
        let st = state()?;
        // Every region, and the pages of regions unmapped while their file
        // refused them, even after a failure: the first error is reported.
        let mut r = Ok(());
        for region in &st.regions {
            r = r.and(region.flush());
        }
        if let Some(p) = &st.pager {
            r = r.and(p.flush_unmapped());
        }
        r.map_err(|e| crate::fail_with(&e).abs())
    });
    match r {
        Ok(Ok(())) => 0,
        _ => {
            set_errno(e_or_fault(&r));
            -1
        }
    }
}

/// Whether regions can be written (1: yes, written back to their files).
#[no_mangle]
pub extern "C" fn umap_has_write_support() -> c_int {
    1
}

/// Faults in the UMap page around each address of `page_array` now (an
/// address in no region is skipped).
///
/// # Safety
/// `page_array` points at `npages` items (or `npages` is 0 or less).
#[no_mangle]
pub unsafe extern "C" fn umap_prefetch(npages: c_int, page_array: *mut umap_prefetch_item) {
    if npages <= 0 || page_array.is_null() {
        return;
    }
    // SAFETY: the caller's contract.
    let items = unsafe { std::slice::from_raw_parts(page_array, npages as usize) };
    let _ = std::panic::catch_unwind(|| {
        let Ok(st) = state() else { return };
        let unit = st.unit;
        for it in items {
            let a = it.page_base_addr as usize;
            for r in &st.regions {
                let start = r.as_ptr() as usize;
                if (start..start + r.len()).contains(&a) {
                    let off = (a - start) / unit * unit;
                    let _ = r.populate(off, unit.min(r.len() - off));
                }
            }
        }
    });
}

/// As [`umap_prefetch`] for `[paddr, paddr+size)`. The pages are fetched,
/// not pinned: the engine may evict them again under its budget.
///
/// # Safety
/// None beyond the arguments being plain values.
#[no_mangle]
pub unsafe extern "C" fn umap_fetch_and_pin(paddr: *mut c_char_alias, size: u64) {
    let _ = std::panic::catch_unwind(|| {
        let Ok(st) = state() else { return };
        let a = paddr as usize;
        for r in &st.regions {
            let start = r.as_ptr() as usize;
            let end = start + r.len();
            let (lo, hi) = (a.max(start), a.saturating_add(size as usize).min(end));
            if lo < hi {
                let _ = r.populate(lo - start, hi - lo);
            }
        }
    });
}

/// `char`, as UMap's header spells `umap_fetch_and_pin`'s argument.
pub type c_char_alias = std::ffi::c_char;

/// A snapshot of the UMap pager's statistics (all zero before the first
/// `umap`) into `*out` of `size` bytes: the same struct and rules as
/// [`uffd_pager_stats_get`](crate::uffd_pager_stats_get). Declared in
/// `uffd_pager.h` (UMap's header has no statistics). Returns the bytes
/// written, or `-EINVAL` for a NULL `out` or a `size` over 4096.
///
/// # Safety
/// `out` points at `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn umap_uffd_pager_stats(
    out: *mut crate::uffd_pager_stats,
    size: usize,
) -> c_int {
    if out.is_null() || size > crate::abi::MAX_SIZE {
        return crate::fail(
            libc::EINVAL,
            format_args!("umap_uffd_pager_stats: out {out:p}, size {size}"),
        );
    }
    let s = std::panic::catch_unwind(|| {
        state()
            .ok()
            .and_then(|st| {
                st.pager
                    .as_ref()
                    .map(|p| crate::uffd_pager_stats::from(&p.stats()))
            })
            .unwrap_or_default()
    })
    .unwrap_or_default();
    // SAFETY: `size` writable bytes (the caller's contract), not `s`.
    unsafe { crate::abi::fill(out.cast::<u8>(), size, &s) as c_int }
}
