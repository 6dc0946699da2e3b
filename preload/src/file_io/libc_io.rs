//! libc's own definitions of the read, write and sync calls the shim
//! interposes, through which it passes the program's calls on.
//!
//! POSIX makes `read`, `write`, `readv`, `writev`, `pread`, `pwrite`,
//! `fsync`, `fdatasync` and `msync` cancellation points, and glibc's
//! definitions are (the vectored `p` forms and `sync_file_range` too). A
//! raw `syscall()` is not one: passed on that way, a thread blocked in
//! `read()` on a pipe never took a `pthread_cancel` (found by review). So
//! each is looked up once (`dlsym(RTLD_NEXT)`, the definition after this
//! library's) as the library loads, before `main` and any signal handler
//! of the program's, and called through a plain function pointer from
//! then on: one atomic load, no allocation, async-signal-safe as the call
//! itself. Before the lookup (a constructor of another library that runs
//! before this one's) or where libc has no such symbol, the raw system
//! call serves.
//!
//! Only the program's own calls ([`crate::programs_own`]). The engine is
//! linked into this library, so its own `pread`s and `pwrite`s (its file
//! stores, `/proc/self/pagemap`) come here too, and those stay raw system
//! calls: a cancellation pending on the thread would unwind it from inside
//! the engine (an in-thread fault, a residency guard, a write-back), where
//! nothing may unwind and page locks are held by hand (found by a review
//! of the change that made these calls cancellable).
//!
//! A cancellation unwinds the thread's stack (a forced unwind) through the
//! shim's frames, which hold a residency guard for the call's buffer. The
//! pointers are `extern "C-unwind"`, as are the interposed calls, so those
//! frames keep their landing pads and the guards are given back: called
//! as `extern "C"`, which Rust takes for a call that cannot unwind, the
//! optimiser dropped them (a release build skipped the guard's `drop`),
//! and a forced unwind through a frame with destructors is undefined
//! behaviour under the `"C"` ABI.

use std::ffi::{c_int, c_long, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The calls, in [`NAMES`]' order.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Call {
    Read,
    Write,
    Pread,
    Pwrite,
    Readv,
    Writev,
    Preadv,
    Pwritev,
    Preadv2,
    Pwritev2,
    Fsync,
    Fdatasync,
    Msync,
    SyncFileRange,
}

/// libc's names (the 64-bit offset forms, which on x86-64 are the same
/// functions) and system call numbers.
const CALLS: [(&CStr, c_long); 14] = [
    (c"read", libc::SYS_read),
    (c"write", libc::SYS_write),
    (c"pread64", libc::SYS_pread64),
    (c"pwrite64", libc::SYS_pwrite64),
    (c"readv", libc::SYS_readv),
    (c"writev", libc::SYS_writev),
    (c"preadv64", libc::SYS_preadv),
    (c"pwritev64", libc::SYS_pwritev),
    (c"preadv64v2", libc::SYS_preadv2),
    (c"pwritev64v2", libc::SYS_pwritev2),
    (c"fsync", libc::SYS_fsync),
    (c"fdatasync", libc::SYS_fdatasync),
    (c"msync", libc::SYS_msync),
    (c"sync_file_range", libc::SYS_sync_file_range),
];

/// libc's definitions, once looked up (0: not yet, or none).
static NEXT: [AtomicUsize; 14] = [const { AtomicUsize::new(0) }; 14];

/// Looks every call up. Called once, from the library's constructor.
pub(crate) fn resolve() {
    for (slot, (name, _)) in NEXT.iter().zip(CALLS) {
        // SAFETY: `name` is NUL-terminated; RTLD_NEXT looks past this
        // library, so the answer is never one of the shim's own calls.
        slot.store(
            unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize,
            Relaxed,
        );
    }
}

/// The call's libc definition, if looked up and the call is the
/// program's own (see the module docs).
fn next(c: Call) -> Option<usize> {
    Some(NEXT[c as usize].load(Relaxed)).filter(|&f| f != 0 && crate::programs_own())
}

/// A plain read or write: [`Call::Read`], [`Call::Write`] (`off`
/// ignored), [`Call::Pread`], [`Call::Pwrite`].
///
/// # Safety
/// As the call: `buf` is valid for `n` bytes of it.
pub(crate) unsafe fn plain(c: Call, fd: c_int, buf: *mut c_void, n: usize, off: i64) -> isize {
    type Rw = unsafe extern "C-unwind" fn(c_int, *mut c_void, usize) -> isize;
    type Prw = unsafe extern "C-unwind" fn(c_int, *mut c_void, usize, libc::off_t) -> isize;
    let positioned = matches!(c, Call::Pread | Call::Pwrite);
    match next(c) {
        // SAFETY: libc's definition of the call, whose prototype (in
        // <unistd.h>) is `Rw` or `Prw` as `positioned` says (`write`'s
        // `const void *` is the same pointer); the caller's contract.
        Some(f) if positioned => unsafe { std::mem::transmute::<usize, Prw>(f)(fd, buf, n, off) },
        // SAFETY: as above.
        Some(f) => unsafe { std::mem::transmute::<usize, Rw>(f)(fd, buf, n) },
        // SAFETY: the caller's contract.
        None => unsafe {
            crate::sys::call(
                CALLS[c as usize].1,
                fd as usize,
                buf as usize,
                n,
                off as usize,
                0,
            ) as isize
        },
    }
}

/// A vectored read or write: [`Call::Readv`], [`Call::Writev`] (`off`
/// and `flags` ignored), [`Call::Preadv`], [`Call::Pwritev`] (`flags`
/// ignored), [`Call::Preadv2`], [`Call::Pwritev2`].
///
/// # Safety
/// As the call: `iov` points at `cnt` iovecs whose buffers are valid for
/// it.
pub(crate) unsafe fn vectored(
    c: Call,
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: i64,
    flags: c_int,
) -> isize {
    type V = unsafe extern "C-unwind" fn(c_int, *const libc::iovec, c_int) -> isize;
    type Pv = unsafe extern "C-unwind" fn(c_int, *const libc::iovec, c_int, libc::off_t) -> isize;
    type Pv2 =
        unsafe extern "C-unwind" fn(c_int, *const libc::iovec, c_int, libc::off_t, c_int) -> isize;
    let nr = CALLS[c as usize].1;
    match (c, next(c)) {
        // SAFETY: libc's definition of the call, whose prototype (in
        // <sys/uio.h>) is the type it is called as; the caller's contract.
        (Call::Readv | Call::Writev, Some(f)) => unsafe {
            std::mem::transmute::<usize, V>(f)(fd, iov, cnt)
        },
        // SAFETY: as above.
        (Call::Preadv | Call::Pwritev, Some(f)) => unsafe {
            std::mem::transmute::<usize, Pv>(f)(fd, iov, cnt, off)
        },
        // SAFETY: as above.
        (Call::Preadv2 | Call::Pwritev2, Some(f)) => unsafe {
            std::mem::transmute::<usize, Pv2>(f)(fd, iov, cnt, off, flags)
        },
        // The raw call: the offset, where there is one, as the low half
        // of the kernel's (low, high) pair, which on x86-64 is all of it;
        // the flags sixth (arguments a call does not take are ignored).
        // SAFETY: the caller's contract.
        _ => unsafe { libc::syscall(nr, fd, iov, cnt, off, 0, flags) as isize },
    }
}

/// [`Call::Fsync`] or [`Call::Fdatasync`] on `fd`.
///
/// # Safety
/// None beyond the call's own (a descriptor number).
pub(crate) unsafe fn sync_fd(c: Call, fd: c_int) -> c_int {
    type S = unsafe extern "C-unwind" fn(c_int) -> c_int;
    match next(c) {
        // SAFETY: libc's definition of the call, whose prototype (in
        // <unistd.h>) is `S`.
        Some(f) => unsafe { std::mem::transmute::<usize, S>(f)(fd) },
        // SAFETY: a system call on a descriptor number.
        None => unsafe { crate::sys::call(CALLS[c as usize].1, fd as usize, 0, 0, 0, 0) as c_int },
    }
}

/// msync(2) of `[addr, addr + len)` with `flags`.
///
/// # Safety
/// As msync(2).
pub(crate) unsafe fn msync(addr: *mut c_void, len: usize, flags: c_int) -> c_int {
    type M = unsafe extern "C-unwind" fn(*mut c_void, usize, c_int) -> c_int;
    match next(Call::Msync) {
        // SAFETY: libc's definition of msync, whose prototype (in
        // <sys/mman.h>) is `M`; the caller's contract.
        Some(f) => unsafe { std::mem::transmute::<usize, M>(f)(addr, len, flags) },
        // SAFETY: the caller's contract.
        None => unsafe {
            crate::sys::call(libc::SYS_msync, addr as usize, len, flags as usize, 0, 0) as c_int
        },
    }
}

/// sync_file_range(2).
///
/// # Safety
/// None beyond the call's own (a descriptor number and plain values).
pub(crate) unsafe fn sync_file_range(fd: c_int, off: i64, n: i64, flags: libc::c_uint) -> c_int {
    type S = unsafe extern "C-unwind" fn(c_int, i64, i64, libc::c_uint) -> c_int;
    match next(Call::SyncFileRange) {
        // SAFETY: libc's definition, whose prototype (in <fcntl.h>) is
        // `S` (`off64_t` is `i64`).
        Some(f) => unsafe { std::mem::transmute::<usize, S>(f)(fd, off, n, flags) },
        // SAFETY: a system call on a descriptor number and plain values.
        None => unsafe {
            let (fd, off, n) = (fd as usize, off as usize, n as usize);
            crate::sys::call(libc::SYS_sync_file_range, fd, off, n, flags as usize, 0) as c_int
        },
    }
}
