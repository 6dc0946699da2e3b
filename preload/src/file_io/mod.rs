//! The file calls the shim interposes for coherence with the pager's page
//! cache: writes refresh the cached pages they touch (after writing back
//! the file's writable mappings), reads and syncs write those mappings
//! back first.

use crate::{errno, in_shim, in_shim_or, maps, programs_own, set_errno};
use std::ffi::{c_int, c_void};

pub(crate) mod libc_io;
mod read;
mod sync;

use libc_io::Call;

/// The pager pages of a system call's buffer, kept resident until it is
/// dropped, where a fault inside the call would be `EFAULT`
/// ([`maps::resident_for_call`]); taken and given back as shim work, the
/// program's errno kept.
struct Resident(Vec<engine::ResidentGuard<'static>>);

impl Resident {
    /// For the buffer `buf` of `len` bytes of the program's own call,
    /// which `writes` it (`read(2)`) or only reads it (`write(2)`).
    fn for_buffer(buf: usize, len: usize, writes: bool) -> Resident {
        if !maps::residency_needed() || !programs_own() || !maps::any() {
            return Resident(Vec::new());
        }
        let e = errno();
        let guards = in_shim("resident", || maps::resident_for_call(buf, len, writes));
        set_errno(e);
        Resident(guards)
    }
}

impl Drop for Resident {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let e = errno();
        let guards = std::mem::take(&mut self.0);
        in_shim("resident", || drop(guards));
        set_errno(e);
    }
}

/// Runs the write `f` on `fd` and, if it wrote to a file the pager maps,
/// refreshes the pages it touched. `at` is the write's file offset, or
/// None for the descriptor's position (either replaced by the end of the
/// file on an `O_APPEND` descriptor, where `append`); `len` the most bytes
/// it can write,
/// or None where finding out would read the program's memory (a vectored
/// write's `iovec`s, which may not be readable: the kernel answers that
/// with `EFAULT`, the shim would crash); `buf` the buffer it reads, kept
/// resident for it where a fault inside the call would be `EFAULT`
/// ([`Resident`]; None for the vectored writes).
fn coherent_write(
    fd: c_int,
    at: Option<i64>,
    append: bool,
    len: Option<usize>,
    buf: Option<usize>,
    f: impl FnOnce() -> isize,
) -> isize {
    let _resident = match (buf, len) {
        (Some(b), Some(n)) => Resident::for_buffer(b, n, false),
        _ => Resident(Vec::new()),
    };
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
pub unsafe extern "C-unwind" fn write(fd: c_int, buf: *const c_void, n: usize) -> isize {
    coherent_write(fd, None, true, Some(n), Some(buf as usize), || {
        // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
        unsafe { libc_io::plain(Call::Write, fd, buf.cast_mut(), n, 0) }
    })
}

/// pwrite(2), kept coherent with pager mappings of the file.
///
/// # Safety
/// As pwrite(2).
#[no_mangle]
pub unsafe extern "C-unwind" fn pwrite(
    fd: c_int,
    buf: *const c_void,
    n: usize,
    off: libc::off_t,
) -> isize {
    coherent_write(fd, Some(off), true, Some(n), Some(buf as usize), || {
        // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
        unsafe { libc_io::plain(Call::Pwrite, fd, buf.cast_mut(), n, off) }
    })
}

/// pwrite64(2): the same call on x86-64.
///
/// # Safety
/// As pwrite(2).
#[no_mangle]
pub unsafe extern "C-unwind" fn pwrite64(
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
pub unsafe extern "C-unwind" fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
    coherent_write(fd, None, true, None, None, || unsafe {
        libc_io::vectored(Call::Writev, fd, iov, cnt, 0, 0)
    })
}

/// pwritev(2), kept coherent with pager mappings of the file.
///
/// # Safety
/// As pwritev(2).
#[no_mangle]
pub unsafe extern "C-unwind" fn pwritev(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
) -> isize {
    coherent_write(fd, Some(off), true, None, None, || {
        // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
        unsafe { libc_io::vectored(Call::Pwritev, fd, iov, cnt, off, 0) }
    })
}

/// pwritev64(2): the same call on x86-64.
///
/// # Safety
/// As pwritev(2).
#[no_mangle]
pub unsafe extern "C-unwind" fn pwritev64(
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
pub unsafe extern "C-unwind" fn pwritev2(
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
    coherent_write(fd, at, append, None, None, || {
        // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
        unsafe { libc_io::vectored(Call::Pwritev2, fd, iov, cnt, off, flags) }
    })
}

/// pwritev64v2(2): the same call on x86-64.
///
/// # Safety
/// As pwritev2(2).
#[no_mangle]
pub unsafe extern "C-unwind" fn pwritev64v2(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
    flags: c_int,
) -> isize {
    // SAFETY: the same contract.
    unsafe { pwritev2(fd, iov, cnt, off, flags) }
}
