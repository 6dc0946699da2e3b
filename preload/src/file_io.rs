//! The file calls the shim interposes for coherence with the pager's page
//! cache: writes refresh the cached pages they touch (after writing back
//! the file's writable mappings), reads and syncs write those mappings
//! back first.

use crate::{errno, in_shim, in_shim_or, maps, programs_own, set_errno, sys};
use std::ffi::{c_int, c_void};

/// Runs the write `f` on `fd` and, if it wrote to a file the pager maps,
/// refreshes the pages it touched. `at` is the write's file offset, or
/// None for the descriptor's position (either replaced by the end of the
/// file on an `O_APPEND` descriptor, where `append`); `len` the most bytes
/// it can write,
/// or None where finding out would read the program's memory (a vectored
/// write's `iovec`s, which may not be readable: the kernel answers that
/// with `EFAULT`, the shim would crash).
fn coherent_write(
    fd: c_int,
    at: Option<i64>,
    append: bool,
    len: Option<usize>,
    f: impl FnOnce() -> isize,
) -> isize {
    if !programs_own() || !maps::any_file() {
        return f();
    }
    // A failure to find out whether the write lands in a mapped file fails
    // the write before it is made: made, it could leave a mapping showing
    // older bytes.
    let Ok(target) = in_shim_or("write", Err(()), libc::EIO, || {
        Ok(maps::file_of(fd, at, append))
    }) else {
        return -1;
    };
    // A writable shared mapping of the file writes its dirty pages back
    // first: a dirty page holds its own copy of the bytes about to change,
    // and a write-back of it between the write and the refresh below
    // (reclaim, kswapd, another thread's msync) would put that older copy
    // over them, in the file and then in the mapping
    // (`Region::flush_range`). Clean, such a page is only dropped. Only the
    // pages the write can touch: the rest stay dirty (and writable, with
    // no fault to dirty them again).
    if let Some(t) = target.as_ref().filter(|_| maps::any_writable()) {
        let e = errno();
        in_shim("flush", || {
            maps::flush_before_write(t, len.map(|n| n as u64))
        });
        set_errno(e);
    }
    let n = f();
    if n > 0 {
        if let Some(t) = target {
            let e = errno();
            in_shim("refresh", || maps::refresh(t, n as u64));
            set_errno(e);
        }
    }
    n
}

/// write(2), kept coherent with pager mappings of the file.
///
/// # Safety
/// As write(2).
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: usize) -> isize {
    coherent_write(fd, None, true, Some(n), || {
        // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
        unsafe { sys::call(libc::SYS_write, fd as usize, buf as usize, n, 0, 0) as isize }
    })
}

/// pwrite(2), kept coherent with pager mappings of the file.
///
/// # Safety
/// As pwrite(2).
#[no_mangle]
pub unsafe extern "C" fn pwrite(
    fd: c_int,
    buf: *const c_void,
    n: usize,
    off: libc::off_t,
) -> isize {
    coherent_write(fd, Some(off), true, Some(n), || {
        // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
        unsafe {
            sys::call(
                libc::SYS_pwrite64,
                fd as usize,
                buf as usize,
                n,
                off as usize,
                0,
            ) as isize
        }
    })
}

/// pwrite64(2): the same call on x86-64.
///
/// # Safety
/// As pwrite(2).
#[no_mangle]
pub unsafe extern "C" fn pwrite64(
    fd: c_int,
    buf: *const c_void,
    n: usize,
    off: libc::off_t,
) -> isize {
    // SAFETY: the same contract.
    unsafe { pwrite(fd, buf, n, off) }
}

/// writev(2), kept coherent with pager mappings of the file.
///
/// # Safety
/// As writev(2).
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
    coherent_write(fd, None, true, None, || unsafe {
        sys::iov(libc::SYS_writev, fd, iov, cnt, 0)
    })
}

/// pwritev(2), kept coherent with pager mappings of the file.
///
/// # Safety
/// As pwritev(2).
#[no_mangle]
pub unsafe extern "C" fn pwritev(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
) -> isize {
    coherent_write(fd, Some(off), true, None, || {
        // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
        unsafe { sys::iov(libc::SYS_pwritev, fd, iov, cnt, off) }
    })
}

/// pwritev64(2): the same call on x86-64.
///
/// # Safety
/// As pwritev(2).
#[no_mangle]
pub unsafe extern "C" fn pwritev64(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
) -> isize {
    // SAFETY: the same contract.
    unsafe { pwritev(fd, iov, cnt, off) }
}

/// Where a `pwritev2` with `off` and `flags` writes: at the end of the
/// file with `RWF_APPEND` (its length now), at the descriptor's position
/// for an `off` of -1 (None), at `off` otherwise; with `RWF_NOAPPEND` even
/// on a descriptor opened `O_APPEND` (see `pwritev2`).
fn v2_target(fd: c_int, off: libc::off_t, flags: c_int) -> Option<i64> {
    if flags & libc::RWF_APPEND != 0 {
        // SAFETY: a zeroed stat is a valid out-parameter; fstat writes
        // only it.
        let mut s: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        return (unsafe { libc::fstat(fd, &mut s) } == 0).then_some(s.st_size);
    }
    (off != -1).then_some(off)
}

/// pwritev2(2), kept coherent with pager mappings of the file.
///
/// # Safety
/// As pwritev2(2).
#[no_mangle]
pub unsafe extern "C" fn pwritev2(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
    flags: c_int,
) -> isize {
    let at = if programs_own() && maps::any_file() {
        v2_target(fd, off, flags)
    } else {
        None
    };
    // `RWF_NOAPPEND` writes at `off` (or the position) on an `O_APPEND`
    // descriptor too: taken for a write at the end of the file, it left a
    // dirty page there to undo it and the mapping showing older bytes.
    let append = flags & libc::RWF_NOAPPEND == 0;
    coherent_write(fd, at, append, None, || {
        // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
        unsafe { sys::iov2(libc::SYS_pwritev2, fd, iov, cnt, off, flags) }
    })
}

/// pwritev64v2(2): the same call on x86-64.
///
/// # Safety
/// As pwritev2(2).
#[no_mangle]
pub unsafe extern "C" fn pwritev64v2(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
    flags: c_int,
) -> isize {
    // SAFETY: the same contract.
    unsafe { pwritev2(fd, iov, cnt, off, flags) }
}

/// fsync(2): the pager's writable shared mappings of the file are written
/// back first, as the kernel's `fsync` covers what was stored through a
/// mapping, and so are pages of pager mappings unmapped while their file
/// refused them. A write-back that fails makes the call fail with its
/// errno (EIO for a file).
///
/// # Safety
/// As fsync(2).
#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    coherent_sync(fd, libc::SYS_fsync)
}

/// fdatasync(2): as [`fsync`].
///
/// # Safety
/// As fdatasync(2).
#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    coherent_sync(fd, libc::SYS_fdatasync)
}

/// syncfs(2): as [`fsync`], for every file the pager maps (more than the
/// descriptor's file system: a write-back more than asked for loses
/// nothing).
///
/// # Safety
/// As syncfs(2).
#[no_mangle]
pub unsafe extern "C" fn syncfs(fd: c_int) -> c_int {
    synced_after(
        "syncfs",
        || maps::flush_all("at syncfs"),
        || {
            // SAFETY: the program's own call on its descriptor, passed on.
            unsafe { sys::call(libc::SYS_syncfs, fd as usize, 0, 0, 0, 0) as c_int }
        },
    )
}

/// sync(2): every writable shared pager mapping, and the pages of those
/// unmapped while their file refused them, are written back first, as the
/// kernel's `sync` writes what was stored through a mapping. (It reports
/// nothing: a failure is said on stderr.)
///
/// # Safety
/// As sync(2).
#[no_mangle]
pub unsafe extern "C" fn sync() {
    synced_after(
        "sync",
        || maps::flush_all("at sync"),
        || {
            // SAFETY: sync takes no arguments.
            unsafe { sys::call(libc::SYS_sync, 0, 0, 0, 0, 0) as c_int }
        },
    );
}

/// sync_file_range(2): the file's writable shared pager mappings are
/// written back first (all of it: more than the range loses nothing).
///
/// # Safety
/// As sync_file_range(2).
#[no_mangle]
pub unsafe extern "C" fn sync_file_range(
    fd: c_int,
    off: libc::off64_t,
    n: libc::off64_t,
    flags: libc::c_uint,
) -> c_int {
    synced_after(
        "sync_file_range",
        || maps::flush_file(fd, "at sync_file_range", false),
        || {
            // SAFETY: the program's own call on its descriptor, passed on.
            let (fd, off, n) = (fd as usize, off as usize, n as usize);
            unsafe { sys::call(libc::SYS_sync_file_range, fd, off, n, flags as usize, 0) as c_int }
        },
    )
}

fn coherent_sync(fd: c_int, nr: libc::c_long) -> c_int {
    synced_after(
        "fsync",
        || maps::flush_file(fd, "at fsync", true),
        || {
            // SAFETY: the program's own call on its descriptor, passed on.
            unsafe { sys::call(nr, fd as usize, 0, 0, 0, 0) as c_int }
        },
    )
}

/// The kernel's sync call `call` after the shim's write-back `flush` (for
/// `site`): the call's result, or -1 with the write-back's errno where it
/// failed and the call did not.
fn synced_after(
    site: &'static str,
    flush: impl FnOnce() -> Result<(), c_int>,
    call: impl FnOnce() -> c_int,
) -> c_int {
    let mut failed = Ok(());
    if programs_own() && maps::any_to_sync() {
        let e = errno();
        failed = in_shim(site, flush);
        set_errno(e);
    }
    let r = call();
    match failed {
        Err(e) if r == 0 => {
            set_errno(e);
            -1
        }
        _ => r,
    }
}

/// Runs the read `f` on `fd`, first writing back a writable shared pager
/// mapping of its file (see [`maps::flush_for_read`]).
fn coherent_read(fd: c_int, f: impl FnOnce() -> isize) -> isize {
    if programs_own() && maps::any_writable() {
        let e = errno();
        in_shim("read", || maps::flush_for_read(fd));
        set_errno(e);
    }
    f()
}

/// read(2), seeing what was stored through a pager mapping of the file.
///
/// # Safety
/// As read(2).
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize {
    coherent_read(fd, || {
        // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
        unsafe { sys::call(libc::SYS_read, fd as usize, buf as usize, n, 0, 0) as isize }
    })
}

/// pread(2), seeing what was stored through a pager mapping of the file.
///
/// # Safety
/// As pread(2).
#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: usize, off: libc::off_t) -> isize {
    coherent_read(fd, || {
        // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
        unsafe {
            sys::call(
                libc::SYS_pread64,
                fd as usize,
                buf as usize,
                n,
                off as usize,
                0,
            ) as isize
        }
    })
}

/// pread64(2): the same call on x86-64.
///
/// # Safety
/// As pread(2).
#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: usize, off: libc::off_t) -> isize {
    // SAFETY: the same contract.
    unsafe { pread(fd, buf, n, off) }
}

// `_FORTIFY_SOURCE` (on by default in distributions' builds and in
// Debian's and Ubuntu's `gcc -O2`) turns a `read` or `pread` into a buffer
// whose size the compiler knows into these checked calls, which glibc
// serves with its internal `read`/`pread` and never through the symbols
// above: without them such a program read the file's older bytes past
// what it had stored through the mapping.
extern "C" {
    fn __chk_fail() -> !;
}

/// `__read_chk`: `read(2)` for a fortified program (see above).
///
/// # Safety
/// As read(2), with `buflen` the size of `buf`.
#[no_mangle]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, n: usize, buflen: usize) -> isize {
    if n > buflen {
        // SAFETY: glibc's own answer to an overflow: ends the process.
        unsafe { __chk_fail() }
    }
    // SAFETY: the caller's contract.
    unsafe { read(fd, buf, n) }
}

/// `__pread_chk`: `pread(2)` for a fortified program (see above).
///
/// # Safety
/// As pread(2), with `buflen` the size of `buf`.
#[no_mangle]
pub unsafe extern "C" fn __pread_chk(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    off: libc::off_t,
    buflen: usize,
) -> isize {
    if n > buflen {
        // SAFETY: glibc's own answer to an overflow: ends the process.
        unsafe { __chk_fail() }
    }
    // SAFETY: the caller's contract.
    unsafe { pread(fd, buf, n, off) }
}

/// `__pread64_chk`: the same call on x86-64.
///
/// # Safety
/// As pread(2), with `buflen` the size of `buf`.
#[no_mangle]
pub unsafe extern "C" fn __pread64_chk(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    off: libc::off_t,
    buflen: usize,
) -> isize {
    // SAFETY: the same contract.
    unsafe { __pread_chk(fd, buf, n, off, buflen) }
}

/// readv(2), seeing what was stored through a pager mapping of the file.
///
/// # Safety
/// As readv(2).
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
    coherent_read(fd, || unsafe { sys::iov(libc::SYS_readv, fd, iov, cnt, 0) })
}

/// preadv(2), seeing what was stored through a pager mapping of the file.
///
/// # Safety
/// As preadv(2).
#[no_mangle]
pub unsafe extern "C" fn preadv(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
) -> isize {
    // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
    coherent_read(fd, || unsafe {
        sys::iov(libc::SYS_preadv, fd, iov, cnt, off)
    })
}

/// preadv64(2): the same call on x86-64.
///
/// # Safety
/// As preadv(2).
#[no_mangle]
pub unsafe extern "C" fn preadv64(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
) -> isize {
    // SAFETY: the same contract.
    unsafe { preadv(fd, iov, cnt, off) }
}

/// preadv2(2), seeing what was stored through a pager mapping of the file.
///
/// # Safety
/// As preadv2(2).
#[no_mangle]
pub unsafe extern "C" fn preadv2(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
    flags: c_int,
) -> isize {
    // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
    coherent_read(fd, || unsafe {
        sys::iov2(libc::SYS_preadv2, fd, iov, cnt, off, flags)
    })
}

/// preadv64v2(2): the same call on x86-64.
///
/// # Safety
/// As preadv2(2).
#[no_mangle]
pub unsafe extern "C" fn preadv64v2(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
    flags: c_int,
) -> isize {
    // SAFETY: the same contract.
    unsafe { preadv2(fd, iov, cnt, off, flags) }
}
