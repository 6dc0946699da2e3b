//! `uffd_pager_region`: mapping, and what a mapping can do.

use crate::fd_store::fd_store;
use crate::{abi, fail, fail_with, guard, non_null, uffd_pager};
use engine::{InstallKind, MapOptions, Region};
use std::ffi::{c_char, c_void, CStr};

/// Pages live in a shared memfd mapped into the region (zero copy; the
/// default). Writes reach the store at flush, eviction and unmap.
pub const UFFD_PAGER_KIND_SHARED: u32 = 0;
/// Pages are copied into private anonymous memory; dirty pages go to the
/// pager's swap, never to the store (a private mapping).
pub const UFFD_PAGER_KIND_ANONYMOUS: u32 = 1;

/// No access advice: readahead adapts to the faults (`MADV_NORMAL`).
pub const UFFD_PAGER_ACCESS_NORMAL: u32 = 0;
/// Scattered reads: the region's faults request no readahead
/// (`MADV_RANDOM`).
pub const UFFD_PAGER_ACCESS_RANDOM: u32 = 1;

/// How a region is mapped. Start from [`uffd_pager_map_options_init`].
/// Every call that takes options answers -EINVAL for a `size` not set by
/// it (or a bool that is neither 0 nor 1), and -E2BIG for fields of a
/// newer header this library does not know, set.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct uffd_pager_map_options {
    /// `sizeof(uffd_pager_map_options)` as the program was built: set by
    /// [`uffd_pager_map_options_init`] (see `uffd_pager_config.size`).
    pub size: usize,
    /// `UFFD_PAGER_KIND_*`.
    pub kind: u32,
    /// Map writable (default true).
    pub writable: bool,
    /// Fault every page in at map time (MAP_POPULATE).
    pub populate: bool,
    /// Never evict this region's pages (mlock).
    pub pinned: bool,
    /// Zero (room for a later field).
    pub _reserved: u8,
    /// Map at exactly this page-aligned address, which must be free; NULL:
    /// anywhere.
    pub fixed_addr: *mut c_void,
    /// Page size in bytes: 0 or 4096 (the default), or
    /// `UFFD_PAGER_HUGE_PAGE_SIZE` for 2 MiB pages from the kernel's
    /// hugetlb pool (`uffd_pager_huge_pages_available`). A region of 2 MiB
    /// pages has a length (and fixed address) that is a multiple of 2 MiB,
    /// no fault-around (a shared one reads the next page ahead for a
    /// sequential reader), and cannot be refreshed; the budget
    /// counts its pages as 512 each. Another size: `-EINVAL`; a pool too
    /// small for the region: `-ENOMEM`, and the message says what to set.
    pub page_size: usize,
}

/// Bytes in a 2 MiB page, for `uffd_pager_map_options.page_size`.
pub const UFFD_PAGER_HUGE_PAGE_SIZE: usize = 2 * 1024 * 1024;
const _: () = assert!(UFFD_PAGER_HUGE_PAGE_SIZE == engine::HUGE_PAGE_SIZE);

/// Free 2 MiB pages in the kernel's pool that no mapping has promised
/// (`/sys/kernel/mm/hugepages/hugepages-2048kB/`): what regions of
/// `UFFD_PAGER_HUGE_PAGE_SIZE` pages can draw on now. 0 where the kernel
/// has no such pool. Root raises it with `sysctl vm.nr_hugepages=N`.
#[no_mangle]
pub extern "C" fn uffd_pager_huge_pages_available() -> u64 {
    std::panic::catch_unwind(|| engine::HugePagePool::now().available()).unwrap_or(0)
}

/// Fills `o`, of `size` bytes (`sizeof *o`), with the defaults: shared
/// kind, writable, not populated, not pinned, anywhere, 4 KiB pages; and
/// `o->size` with `size`.
///
/// Returns 0, or -EINVAL for a NULL `o` or a `size` smaller than any
/// version of the struct (nothing written).
///
/// # Safety
/// `o` is NULL or points at `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_map_options_init(
    o: *mut uffd_pager_map_options,
    size: usize,
) -> i32 {
    // SAFETY: NULL or `size` writable bytes (the caller's contract).
    unsafe { abi::init(o, size) }
}

// SAFETY: repr(C) with no padding (`_reserved` fills the hole after
// `pinned`, `abi`'s tests check), `size` first, the three bools in
// `BOOLS`; every other field is an integer or a nullable pointer.
unsafe impl abi::Versioned for uffd_pager_map_options {
    const NAME: &'static str = "uffd_pager_map_options";
    const FIRST_SIZE: usize = 32;
    const BOOLS: &'static [usize] = &[
        std::mem::offset_of!(Self, writable),
        std::mem::offset_of!(Self, populate),
        std::mem::offset_of!(Self, pinned),
    ];
    const RESERVED: &'static [(usize, usize)] = &[(std::mem::offset_of!(Self, _reserved), 1)];
    fn defaults() -> Self {
        uffd_pager_map_options {
            size: std::mem::size_of::<Self>(),
            kind: UFFD_PAGER_KIND_SHARED,
            writable: true,
            populate: false,
            pinned: false,
            _reserved: 0,
            fixed_addr: std::ptr::null_mut(),
            page_size: 0,
        }
    }
}

/// A mapped region (opaque to C).
pub struct uffd_pager_region {
    pub(crate) region: Region,
    /// The file offset its store starts at: `uffd_pager_map_fd`'s
    /// `offset` (0 for every other map). Its store is that window of the
    /// file, while C names the bytes a `write(2)` changed by their offset
    /// in the file.
    file_offset: u64,
}

/// `[offset, offset + len)` of a file, as offsets in the store of a region
/// that maps the file from `base` on: the part before `base` is none of
/// the region's (`None` where nothing is left); the engine clips the end.
fn in_store(base: u64, offset: u64, len: u64) -> Option<(u64, u64)> {
    if base == 0 {
        return Some((offset, len));
    }
    let end = offset.saturating_add(len);
    let start = offset.max(base);
    (start < end).then(|| (start - base, end - start))
}

/// The engine's options for `o` (NULL: the defaults).
pub(crate) fn options(o: *const uffd_pager_map_options) -> Result<MapOptions, i32> {
    if o.is_null() {
        return Ok(MapOptions::default());
    }
    // SAFETY: a non-NULL `o` points at options of the size it says (the
    // header's contract).
    let o = unsafe { abi::read(o) }?;
    let kind = match o.kind {
        UFFD_PAGER_KIND_SHARED => InstallKind::Shared,
        UFFD_PAGER_KIND_ANONYMOUS => InstallKind::Anonymous,
        k => return Err(fail(libc::EINVAL, format_args!("unknown kind {k}"))),
    };
    Ok(MapOptions {
        kind: Some(kind),
        writable: o.writable,
        populate: o.populate,
        pinned: o.pinned,
        fixed_addr: (!o.fixed_addr.is_null()).then_some(o.fixed_addr as usize),
        // (The engine refuses a size it does not offer: `-EINVAL`.)
        page_size: if o.page_size == 0 {
            engine::PAGE_SIZE
        } else {
            o.page_size
        },
        // (Neither is offered to C: the options struct is part of the ABI.)
        kernel_maps: false,
        access: engine::Access::Normal,
    })
}

/// What every map call shares: checks `p` and `out`, reads `opts` (NULL:
/// the defaults), runs `map`, and hands the region to C in `*out`. `map`
/// may refuse with a negative errno of its own.
pub(crate) fn map_with(
    p: *const uffd_pager,
    opts: *const uffd_pager_map_options,
    out: *mut *mut uffd_pager_region,
    map: impl FnOnce(&engine::Pager, MapOptions) -> Result<engine::Result<Region>, i32>,
) -> i32 {
    map_at_file_offset(p, opts, out, 0, map)
}

/// [`map_with`] for a region whose store is its file from `file_offset` on.
fn map_at_file_offset(
    p: *const uffd_pager,
    opts: *const uffd_pager_map_options,
    out: *mut *mut uffd_pager_region,
    file_offset: u64,
    map: impl FnOnce(&engine::Pager, MapOptions) -> Result<engine::Result<Region>, i32>,
) -> i32 {
    guard(|| {
        non_null!(p);
        non_null!(out);
        let o = match options(opts) {
            Ok(o) => o,
            Err(rc) => return rc,
        };
        // SAFETY: a live pager handle (the header's contract).
        let p = unsafe { &(*p).pager };
        match map(p, o) {
            Ok(Ok(region)) => {
                // SAFETY: `out` is non-NULL (checked above) and points at a
                // pointer (the header's contract).
                unsafe {
                    out.write(Box::into_raw(Box::new(uffd_pager_region {
                        region,
                        file_offset,
                    })))
                };
                0
            }
            Ok(Err(e)) => fail_with(&e),
            Err(rc) => rc,
        }
    })
}

/// Maps `len` bytes (a multiple of 4096) of zero-filled anonymous memory.
///
/// # Safety
/// `p` is a live pager; `out` points at writable memory for a pointer.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_map_anonymous(
    p: *const uffd_pager,
    len: usize,
    out: *mut *mut uffd_pager_region,
) -> i32 {
    map_with(p, std::ptr::null(), out, |p, _| Ok(p.map_anonymous(len)))
}

/// Maps `len` bytes of zero-filled anonymous memory with options `opts`
/// (NULL: the defaults, as [`uffd_pager_map_anonymous`]); `len` is a
/// multiple of the page size (`opts->page_size`), and `opts->writable`
/// is true (`-EINVAL` otherwise: make a region read-only after the map,
/// with `uffd_pager_region_protect`).
///
/// # Safety
/// `p` is a live pager; `opts` is NULL or points at options; `out` points
/// at writable memory for a pointer.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_map_anonymous_with(
    p: *const uffd_pager,
    len: usize,
    opts: *const uffd_pager_map_options,
    out: *mut *mut uffd_pager_region,
) -> i32 {
    map_with(p, opts, out, |p, o| Ok(p.map_anonymous_with(len, &o)))
}

/// Maps the file at `path`: `len` bytes from its start, or the whole file
/// (rounded up to pages) if `len` is 0.
///
/// A store changed behind the engine (the file written by another
/// descriptor or process, a store whose callbacks return other bytes) shows
/// its new bytes in a page only after the engine evicts the page clean and
/// reads it again; `uffd_pager_region_refresh` brings cached pages up to
/// date at once.
///
/// # Safety
/// `p` is a live pager; `path` is a NUL-terminated string; `opts` is NULL
/// or points at options; `out` points at writable memory for a pointer.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_map_file(
    p: *const uffd_pager,
    path: *const c_char,
    len: usize,
    opts: *const uffd_pager_map_options,
    out: *mut *mut uffd_pager_region,
) -> i32 {
    if path.is_null() {
        return fail(libc::EINVAL, "path is NULL");
    }
    // SAFETY: a NUL-terminated string (the caller's contract).
    let path = unsafe { CStr::from_ptr(path) };
    let path = std::path::Path::new(
        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes()),
    );
    map_with(p, opts, out, |p, o| {
        // SAFETY: C callers reach a region's bytes through raw pointers only, and the C API
        // makes no Rust slice of them, so a store changed behind the engine shows its new bytes
        // without breaking a Rust reference (the header says so).
        Ok(unsafe { p.map_file(path, (len > 0).then_some(len), &o) })
    })
}

/// Maps `len` bytes (not 0) of the open file `fd` from `offset` on (both whole
/// pages, inside the file). The file is opened again (a writable mapping) or
/// the descriptor duplicated, so the caller may close its own. A writable
/// mapping of a descriptor open for appending is refused (-EACCES), as
/// mmap(2) refuses it, and so are a path-only (`O_PATH`) descriptor
/// (-EBADF), one that is not of a regular file (-ENODEV) and, writable, a
/// memfd sealed against writes (-EPERM), all before any descriptor of the
/// file is opened. A change to the file behind the engine: as for
/// `uffd_pager_map_file`. Unmapping the region (or a map that fails after
/// the file was opened) closes the store's descriptor of the file, which
/// drops this process's POSIX record locks on it (`fcntl(F_SETLK)`,
/// `lockf`), as any close(2) of the file does: a program that holds such
/// locks takes open file description locks (`F_OFD_SETLK`) instead.
///
/// # Safety
/// `p` is a live pager; `opts` is NULL or points at options; `out` points
/// at writable memory for a pointer.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_map_fd(
    p: *const uffd_pager,
    fd: i32,
    offset: u64,
    len: usize,
    opts: *const uffd_pager_map_options,
    out: *mut *mut uffd_pager_region,
) -> i32 {
    map_at_file_offset(p, opts, out, offset, |p, o| {
        let writable = o.writable && o.install_kind() == InstallKind::Shared;
        let store = fd_store(fd, offset, len, writable)?;
        // SAFETY: C callers reach a region's bytes through raw pointers only, and the C API
        // makes no Rust slice of them, so a store changed behind the engine shows its new bytes
        // without breaking a Rust reference (the header says so).
        Ok(unsafe { p.map_store(store, len, &o) })
    })
}

/// Runs `f` on the region behind `r`.
fn with(r: *const uffd_pager_region, f: impl FnOnce(&Region) -> engine::Result<()>) -> i32 {
    guard(|| {
        non_null!(r);
        // SAFETY: a live region handle (the header's contract).
        match f(unsafe { &(*r).region }) {
            Ok(()) => 0,
            Err(e) => fail_with(&e),
        }
    })
}

/// The region's first byte (NULL for a NULL handle).
///
/// # Safety
/// `r` is NULL or a live region handle.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_region_addr(r: *const uffd_pager_region) -> *mut c_void {
    if r.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: the caller's contract.
    unsafe { (*r).region.as_ptr().cast() }
}

/// The region's length in bytes (0 for a NULL handle).
///
/// # Safety
/// `r` is NULL or a live region handle.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_region_len(r: *const uffd_pager_region) -> usize {
    if r.is_null() {
        return 0;
    }
    // SAFETY: the caller's contract.
    unsafe { (*r).region.len() }
}

/// Writes the region's dirty pages back to its store (msync).
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_region_flush(r: *const uffd_pager_region) -> i32 {
    with(r, Region::flush)
}

/// C's `bool` as the bytes it arrives in: checked before use (see
/// `uffd_pager_region_protect`). The header names it `bool`.
pub type CBool = u8;

/// Makes the region read-only (`writable` false) or read-write (mprotect).
/// `writable` another value than 0 or 1 (a caller without the prototype,
/// through `dlsym` or a foreign-function interface): `-EINVAL`, and
/// `uffd_pager_last_error()` says so. (Such a caller's `int` arrives as its
/// low byte, which is what is checked: 256 reads as 0.)
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_region_protect(
    r: *const uffd_pager_region,
    // (A byte, as C's `bool` is passed: read as Rust's `bool`, a 2 was
    // undefined behaviour.)
    writable: CBool,
) -> i32 {
    if writable > 1 {
        return fail(
            libc::EINVAL,
            format_args!("writable is {writable}: 0 (false) or 1 (true)"),
        );
    }
    with(r, |g| g.protect(writable == 1))
}

/// Advises how the whole region will be read from now on, as
/// `madvise(MADV_NORMAL | MADV_RANDOM)` would: `UFFD_PAGER_ACCESS_RANDOM`
/// turns its readahead off from the next fault, `UFFD_PAGER_ACCESS_NORMAL`
/// turns it back on. The install kind stays what the map chose. Another
/// value: `-EINVAL`.
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_region_advise(r: *const uffd_pager_region, access: u32) -> i32 {
    let access = match access {
        UFFD_PAGER_ACCESS_NORMAL => engine::Access::Normal,
        UFFD_PAGER_ACCESS_RANDOM => engine::Access::Random,
        _ => return fail(libc::EINVAL, format!("unknown access advice {access}")),
    };
    with(r, |g| g.advise(access))
}

/// Faults `[offset, offset+len)` in now, for a buffer a system call is
/// about to use (in-thread delivery cannot serve faults inside syscalls).
/// The pages are faulted in for writing, as a buffer `read(2)` fills
/// needs: in a writable shared region they count as written, and are
/// written back to the store, whether the call wrote them or not.
/// Under a budget another thread can evict the range again before the
/// call: `uffd_pager_region_lock_resident` keeps it resident until freed.
/// A range past the budget's low watermark (a sixteenth below it) is
/// refused (-ENOMEM): reclaim begins above it.
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_region_prefault(
    r: *const uffd_pager_region,
    offset: usize,
    len: usize,
) -> i32 {
    with(r, |g| g.prefault(offset, len))
}

/// Drops `[offset, offset+len)` from the mapping (MADV_DONTNEED).
/// `offset` must be a page boundary (-EINVAL otherwise, as madvise).
///
/// # Safety
/// `r` is a live region handle, and no other thread uses the range's bytes
/// meanwhile.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_region_dontneed(
    r: *mut uffd_pager_region,
    offset: usize,
    len: usize,
) -> i32 {
    guard(|| {
        non_null!(r);
        // SAFETY: a live handle (the caller's contract), used through a
        // shared reference as every other call on it (a `&mut` would alias
        // another thread's); the C API makes no Rust slice of the region's
        // bytes.
        match unsafe { (*r).region.dontneed_unchecked(offset, len) } {
            Ok(()) => 0,
            Err(e) => fail_with(&e),
        }
    })
}

/// Writes back the dirty pages that hold store bytes `[offset, offset+len)`:
/// call it right before changing those bytes behind the pager's back, and
/// [`uffd_pager_region_refresh`] right after (a write-back of a dirty
/// page's older copy in between would put it over the change). For a
/// region of `uffd_pager_map_fd`, offsets in the file, as the change names
/// them (the part of the range before the map's `offset` is none of the
/// region's).
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_region_flush_range(
    r: *const uffd_pager_region,
    offset: u64,
    len: u64,
) -> i32 {
    in_file(r, offset, len, |g, offset, len| g.flush_range(offset, len))
}

/// Store bytes `[offset, offset+len)` changed behind the pager's back (the
/// file was written with write(2)): cached pages are brought up to date.
/// Where the region may have written those pages, call
/// [`uffd_pager_region_flush_range`] before the change. For a region of
/// `uffd_pager_map_fd`, offsets in the file, as for
/// `uffd_pager_region_flush_range`.
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_region_refresh(
    r: *const uffd_pager_region,
    offset: u64,
    len: u64,
) -> i32 {
    // SAFETY: C code holds no Rust reference to the region's bytes (it
    // reads them through raw pointers, as it would after a write(2) to a
    // file it mapped).
    in_file(r, offset, len, |g, offset, len| unsafe {
        g.refresh_unchecked(offset, len)
    })
}

/// Runs `f` on the region behind `r` with file bytes `[offset, offset+len)`
/// as offsets in its store ([`in_store`]); nothing (0) where none of them
/// is the region's.
fn in_file(
    r: *const uffd_pager_region,
    offset: u64,
    len: u64,
    f: impl FnOnce(&Region, u64, u64) -> engine::Result<()>,
) -> i32 {
    if r.is_null() {
        // (`with`'s answer: -EINVAL.)
        return with(r, |_| Ok(()));
    }
    // SAFETY: a live region handle (the header's contract).
    let base = unsafe { (*r).file_offset };
    match in_store(base, offset, len) {
        Some((offset, len)) => with(r, |g| f(g, offset, len)),
        None => 0,
    }
}

/// Unmaps the region, writing a shared region's dirty pages back first,
/// and frees the handle (also on failure: the return value reports a
/// failed write-back). NULL: nothing.
///
/// # Safety
/// `r` came from a map call and is not used again.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_region_unmap(r: *mut uffd_pager_region) -> i32 {
    if r.is_null() {
        return 0;
    }
    guard(|| {
        // SAFETY: the caller's contract: ours, from Box::into_raw.
        let b = unsafe { Box::from_raw(r) };
        match b.region.unmap() {
            Ok(()) => 0,
            Err(e) => fail_with(&e),
        }
    })
}
