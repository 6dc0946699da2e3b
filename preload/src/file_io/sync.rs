//! The sync calls (`fsync`, `fdatasync`, `syncfs`, `sync`,
//! `sync_file_range`): the pager's writable mappings of the file written
//! back first.

use super::libc_io::Call;
use crate::{errno, in_shim, maps, programs_own, set_errno, sys};
use std::ffi::c_int;

/// fsync(2): the pager's writable shared mappings of the file are written
/// back first, as the kernel's `fsync` covers what was stored through a
/// mapping, and so are pages of pager mappings unmapped while their file
/// refused them. A write-back that fails makes the call fail with its
/// errno (EIO for a file).
///
/// # Safety
/// As fsync(2).
#[no_mangle]
pub unsafe extern "C-unwind" fn fsync(fd: c_int) -> c_int {
    coherent_sync(fd, Call::Fsync)
}

/// fdatasync(2): as [`fsync`].
///
/// # Safety
/// As fdatasync(2).
#[no_mangle]
pub unsafe extern "C-unwind" fn fdatasync(fd: c_int) -> c_int {
    coherent_sync(fd, Call::Fdatasync)
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
pub unsafe extern "C-unwind" fn sync_file_range(
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
            unsafe { super::libc_io::sync_file_range(fd, off, n, flags) }
        },
    )
}

/// `fsync` or `fdatasync` (`c`), through libc's definition (a
/// cancellation point, see [`super::libc_io`]).
fn coherent_sync(fd: c_int, c: Call) -> c_int {
    synced_after(
        "fsync",
        || maps::flush_file(fd, "at fsync", true),
        || {
            // SAFETY: the program's own call on its descriptor, passed on.
            unsafe { super::libc_io::sync_fd(c, fd) }
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
