//! The read calls (`read`, `pread`, `readv`, `preadv` and their `_chk`
//! and 64-bit forms): a writable shared pager mapping of the file written
//! back first, so the read sees what was stored through it.

use super::libc_io::{self, Call};
use crate::{errno, in_shim, maps, programs_own, set_errno};
use std::ffi::{c_int, c_void};

/// Runs the read `f` on `fd` at `at` (None: the descriptor's position),
/// first writing back the pages of the writable shared pager mappings of
/// its file that hold the bytes it reads (see [`maps::flush_for_read`]).
/// `buf`: the buffer (address, length) the call writes, kept resident
/// for it where a fault inside the call would be `EFAULT`
/// ([`super::Resident`]); None for the vectored calls, which are taken
/// to read to the end of the file.
///
/// A write-back that fails fails the read with its errno, before it is
/// made: made, it returned the file's older bytes, with no error, where
/// the kernel's read shows what was stored through the mapping.
fn coherent_read(
    fd: c_int,
    at: Option<i64>,
    buf: Option<(usize, usize)>,
    f: impl FnOnce() -> isize,
) -> isize {
    let _resident = buf.map(|(b, n)| super::Resident::for_buffer(b, n, true));
    if programs_own() && maps::any_writable() {
        let e = errno();
        let len = buf.map(|(_, n)| n as u64);
        if let Err(err) = in_shim("read", || maps::flush_for_read(fd, at, len)) {
            set_errno(err);
            return -1;
        }
        set_errno(e);
    }
    f()
}

/// read(2), seeing what was stored through a pager mapping of the file.
///
/// # Safety
/// As read(2).
#[no_mangle]
pub unsafe extern "C-unwind" fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize {
    coherent_read(fd, None, Some((buf as usize, n)), || {
        // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
        unsafe { libc_io::plain(Call::Read, fd, buf, n, 0) }
    })
}

/// pread(2), seeing what was stored through a pager mapping of the file.
///
/// # Safety
/// As pread(2).
#[no_mangle]
pub unsafe extern "C-unwind" fn pread(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    off: libc::off_t,
) -> isize {
    coherent_read(fd, Some(off), Some((buf as usize, n)), || {
        // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
        unsafe { libc_io::plain(Call::Pread, fd, buf, n, off) }
    })
}

/// pread64(2): the same call on x86-64.
///
/// # Safety
/// As pread(2).
#[no_mangle]
pub unsafe extern "C-unwind" fn pread64(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    off: libc::off_t,
) -> isize {
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
pub unsafe extern "C-unwind" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    buflen: usize,
) -> isize {
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
pub unsafe extern "C-unwind" fn __pread_chk(
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
pub unsafe extern "C-unwind" fn __pread64_chk(
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
pub unsafe extern "C-unwind" fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
    coherent_read(fd, None, None, || unsafe {
        libc_io::vectored(Call::Readv, fd, iov, cnt, 0, 0)
    })
}

/// preadv(2), seeing what was stored through a pager mapping of the file.
///
/// # Safety
/// As preadv(2).
#[no_mangle]
pub unsafe extern "C-unwind" fn preadv(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
) -> isize {
    // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
    coherent_read(fd, Some(off), None, || unsafe {
        libc_io::vectored(Call::Preadv, fd, iov, cnt, off, 0)
    })
}

/// preadv64(2): the same call on x86-64.
///
/// # Safety
/// As preadv(2).
#[no_mangle]
pub unsafe extern "C-unwind" fn preadv64(
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
pub unsafe extern "C-unwind" fn preadv2(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
    flags: c_int,
) -> isize {
    // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
    // (An offset of -1: the descriptor's position.)
    coherent_read(fd, (off != -1).then_some(off), None, || unsafe {
        libc_io::vectored(Call::Preadv2, fd, iov, cnt, off, flags)
    })
}

/// preadv64v2(2): the same call on x86-64.
///
/// # Safety
/// As preadv2(2).
#[no_mangle]
pub unsafe extern "C-unwind" fn preadv64v2(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
    flags: c_int,
) -> isize {
    // SAFETY: the same contract.
    unsafe { preadv2(fd, iov, cnt, off, flags) }
}
