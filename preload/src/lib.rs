//! `libuffd_pager_preload.so`: an LD_PRELOAD shim that hands an unmodified
//! program's file mappings (paths matching `UFFD_PAGER_FILES`) and large
//! private anonymous mappings (`UFFD_PAGER_ANON_MIN`) to uffd-pager, and
//! passes every other call to the kernel.
//!
//! Interposed: `mmap`/`mmap64`, `munmap`, `mremap`, `mprotect`,
//! `pkey_mprotect`, `msync`,
//! `madvise`, and, for coherence with the pager's page cache, `write`,
//! `pwrite`/`pwrite64`, `writev` and `pwritev`/`pwritev64` (a write to a
//! file the pager maps updates the cached pages it touches: see
//! [`engine::Region::refresh`]) and `read`, `pread`/`pread64`, `readv` and
//! `preadv`/`preadv64`, with the `_FORTIFY_SOURCE` `__read_chk`,
//! `__pread_chk` and `__pread64_chk` (a read of a file the pager maps writable and shared
//! writes the mapping's dirty pages back first), and `fsync`/`fdatasync`,
//! `sync`, `syncfs` and `sync_file_range` (which write them back and
//! report a failure), and the `exec` family
//! (which writes back first: see `exec.rs`). Calls that are not the program's own (the
//! engine's threads, its fault handler, the shim itself) go straight to the
//! kernel, so the engine's mappings never recurse into the shim.
//!
//! Not seen: static binaries, programs that make raw system calls, and
//! glibc's internal calls (its `malloc` maps memory without going through
//! `mmap`, so heap memory is never paged). The program's reads, writes and
//! syncs it passes on go through libc's own definitions, so they stay
//! cancellation points (`file_io/libc_io.rs`); the engine's and the
//! shim's own, and the memory calls it passes on, are raw system calls.

#![deny(unsafe_op_in_unsafe_fn)]

mod config;
mod exec;
mod file_io;
mod maps;

use std::cell::Cell;
use std::ffi::{c_int, c_void};

thread_local! {
    /// Set while this thread runs shim code that calls into the engine.
    static IN_SHIM: Cell<bool> = const { Cell::new(false) };
}

/// Whether a call on this thread is the program's own (not the engine's,
/// not the shim's).
#[inline]
fn programs_own() -> bool {
    !IN_SHIM.with(|c| c.get()) && !engine::in_engine()
}

/// Whether this thread is running shim code now (false once its
/// thread-locals are gone).
pub(crate) fn in_shim_here() -> bool {
    IN_SHIM.try_with(|c| c.get()).unwrap_or(false)
}

extern "C-unwind" {
    // glibc's; the `libc` crate does not declare it. "C-unwind": with the
    // asynchronous cancel type, putting the state back acts on a pending
    // cancel at once, by unwinding out of it.
    fn pthread_setcancelstate(state: libc::c_int, old: *mut libc::c_int) -> libc::c_int;
}

/// `PTHREAD_CANCEL_DISABLE` (glibc's value).
const PTHREAD_CANCEL_DISABLE: libc::c_int = 1;

/// Runs `f`, the shim's work for the call `site`, marked as shim code;
/// `Err` if it panicked. (The callers keep the program's errno where the
/// call succeeds.)
///
/// A panic (a bug in the shim or the engine) must not unwind into the
/// program's C frames, where Rust aborts the process with no word of which
/// call it was. It is caught here; the panic hook has said what it was on
/// stderr.
///
/// Cancellation is off meanwhile: the shim's own `open`s and `close`s
/// (its descriptor of a program's file, `/proc` files) are glibc
/// cancellation points, and a cancel pending there unwound into the
/// `catch_unwind` below as a foreign exception, which aborts the process
/// (found by review). The calls interposed here are not cancellation
/// points under the kernel alone; the cancel acts at the program's next
/// one.
fn guarded<T>(site: &'static str, f: impl FnOnce() -> T) -> Result<T, ()> {
    struct Reset(bool, libc::c_int);
    impl Drop for Reset {
        fn drop(&mut self) {
            IN_SHIM.with(|c| c.set(self.0));
            let mut was = 0;
            // SAFETY: puts back the state saved below; `was` is ours.
            unsafe { pthread_setcancelstate(self.1, &mut was) };
        }
    }
    let mut cancel = 0;
    // SAFETY: `cancel` receives the thread's state, put back by `Reset`.
    unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut cancel) };
    let _r = Reset(IN_SHIM.with(|c| c.replace(true)), cancel);
    let run = || {
        test_panic(site);
        f()
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).map_err(|_| ())
}

/// [`guarded`] work that goes into the engine: a panic there stops the
/// program (SIGABRT), after a line that names the call.
///
/// Hazard: the engine's locks are not all released by an unwinding panic
/// (a page's lock bit, a region's write lock, an RCU reader's slot are
/// taken and released by hand), so a program that went on would hang at
/// its next touch of that page, or in its next map; and the exit-time
/// write-back would wait on them too. Stopping at once is the lesser harm.
fn in_shim<T>(site: &'static str, f: impl FnOnce() -> T) -> T {
    match guarded(site, f) {
        Ok(v) => v,
        Err(()) => {
            say_panic(
                site,
                "the pager's locks may be held for good, so the program stops here",
            );
            std::process::abort()
        }
    }
}

/// [`guarded`] work that takes no engine lock (the shim's own table, whose
/// lock is taken poison-safe, and system calls): a panic there fails the
/// call, which returns `failed` with errno `err`, and the program goes on.
fn in_shim_or<T>(site: &'static str, failed: T, err: c_int, f: impl FnOnce() -> T) -> T {
    match guarded(site, f) {
        Ok(v) => v,
        Err(()) => {
            say_panic(site, "the call fails");
            set_errno(err);
            failed
        }
    }
}

/// One line on stderr, written with a raw system call: through `write`,
/// the shim's own interposer, it would be shim work again, which is what
/// just failed.
fn say_panic(site: &str, then: &str) {
    let line =
        format!("uffd-pager-preload: internal error in {site} (a panic, said above); {then}\n");
    // SAFETY: writes `line`'s bytes, which live across the call, to fd 2.
    let _ = unsafe { sys::call(libc::SYS_write, 2, line.as_ptr() as usize, line.len(), 0, 0) };
}

/// Test builds only (debug assertions on): `UFFD_PAGER_PRELOAD_PANIC=SITE`
/// makes the shim's work for `SITE` panic, so the tests can show what a
/// program sees then. A release build has no such hook.
#[cfg(debug_assertions)]
fn test_panic(site: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| std::env::var("UFFD_PAGER_PRELOAD_PANIC").ok());
    if at.as_deref() == Some(site) {
        panic!("UFFD_PAGER_PRELOAD_PANIC={site}");
    }
}

#[cfg(not(debug_assertions))]
#[inline(always)]
fn test_panic(_: &str) {}

fn errno() -> c_int {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() }
}

fn set_errno(e: c_int) {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// The kernel's own calls, as raw system calls (never the shim again).
pub(crate) mod sys {
    use std::ffi::{c_int, c_long, c_void};

    /// mmap(2) as a raw system call; -1 and errno on failure, as libc's.
    ///
    /// # Safety
    /// As mmap(2): a fixed mapping replaces whatever was there.
    #[inline]
    pub unsafe fn mmap(
        a: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        off: i64,
    ) -> *mut c_void {
        // SAFETY: the caller's contract.
        unsafe { libc::syscall(libc::SYS_mmap, a, len, prot, flags, fd, off) as *mut c_void }
    }
    /// The system call `nr` with five arguments, as libc's `syscall`.
    ///
    /// # Safety
    /// As the call `nr` names with these arguments (memory they point at
    /// or map is the caller's to give).
    #[inline]
    pub unsafe fn call(nr: c_long, a: usize, b: usize, c: usize, d: usize, e: usize) -> c_long {
        // SAFETY: the caller's contract.
        unsafe { libc::syscall(nr, a, b, c, d, e) }
    }
}

// The interposed calls. Each is the program's call: it gets the kernel's
// behaviour except where a pager mapping is involved.

/// mmap(2), served by the pager for the mappings the settings name.
///
/// # Safety
/// As mmap(2).
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    if programs_own() && maps::active() {
        let saved = errno();
        let served = in_shim("mmap", || {
            maps::mmap(maps::MmapCall {
                addr,
                len,
                prot,
                flags,
                fd,
                off,
            })
        });
        // The engine's calls on the way may have set errno (a map it
        // refused before the kernel made it: EEXIST); a successful mmap,
        // the shim's or the kernel's, leaves the program's as it was.
        if let Some(r) = served {
            if r != libc::MAP_FAILED {
                set_errno(saved);
            }
            return r;
        }
        set_errno(saved);
    }
    // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
    unsafe { sys::mmap(addr, len, prot, flags, fd, off) }
}

/// mmap64(2): the same call on x86-64.
///
/// # Safety
/// As mmap(2).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    // SAFETY: the same contract.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// munmap(2).
///
/// # Safety
/// As munmap(2).
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    if programs_own() && maps::any() {
        let saved = errno();
        let r = in_shim("munmap", || maps::munmap(addr as usize, len));
        // (A success keeps the program's errno: the engine's calls on the
        // way may set it.)
        if r == 0 {
            set_errno(saved);
        }
        return r;
    }
    // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
    unsafe { sys::call(libc::SYS_munmap, addr as usize, len, 0, 0, 0) as c_int }
}

/// mremap(2). C declares it variadic (the new address comes only with
/// MREMAP_FIXED); stable Rust cannot define a variadic function, so it
/// takes the fifth argument as a plain one, which the x86-64 calling
/// convention passes in the same register either way. It is read only
/// with MREMAP_FIXED or MREMAP_DONTUNMAP, when the caller passed it.
///
/// # Safety
/// As mremap(2).
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let new_addr = if flags & (libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP) != 0 {
        new_addr
    } else {
        std::ptr::null_mut()
    };
    if programs_own() && maps::any() {
        let saved = errno();
        let served = || maps::mremap(old as usize, old_len, new_len, flags, new_addr as usize);
        let r = in_shim("mremap", served);
        // A success, the shim's or the kernel's, keeps the program's errno
        // (a shrink left the engine's EINVAL behind).
        if r != Some(libc::MAP_FAILED) {
            set_errno(saved);
        }
        if let Some(r) = r {
            return r;
        }
    }
    // SAFETY: the program's own call, passed on unchanged: its contract is this function's caller's.
    unsafe {
        sys::call(
            libc::SYS_mremap,
            old as usize,
            old_len,
            new_len,
            flags as usize,
            new_addr as usize,
        ) as *mut c_void
    }
}

/// The shim's answer to a memory call if pager memory is involved
/// (`served` returns it), else the kernel's: the system call `nr` with
/// arguments `args`. A success keeps the program's errno.
///
/// # Safety
/// As the call `nr` names with these arguments.
unsafe fn served_or_kernel(
    site: &'static str,
    served: impl FnOnce() -> Option<c_int>,
    nr: std::ffi::c_long,
    args: [usize; 4],
) -> c_int {
    if programs_own() && maps::any() {
        let saved = errno();
        let r = in_shim(site, served);
        // (A success, the shim's or the kernel's, keeps the program's errno.)
        if r != Some(-1) {
            set_errno(saved);
        }
        if let Some(r) = r {
            return r;
        }
    }
    let [a, b, c, d] = args;
    // SAFETY: the caller's contract.
    unsafe { sys::call(nr, a, b, c, d, 0) as c_int }
}

/// mprotect(2).
///
/// # Safety
/// As mprotect(2).
#[no_mangle]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    // SAFETY: the program's own call, passed on unchanged: its contract is
    // this function's caller's.
    unsafe {
        served_or_kernel(
            "mprotect",
            || maps::mprotect(addr as usize, len, prot, None),
            libc::SYS_mprotect,
            [addr as usize, len, prot as usize, 0],
        )
    }
}

/// pkey_mprotect(2): as `mprotect`, a key other than -1 always the
/// kernel's (the engine sets no keys).
///
/// # Safety
/// As pkey_mprotect(2).
#[no_mangle]
pub unsafe extern "C" fn pkey_mprotect(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    pkey: c_int,
) -> c_int {
    // SAFETY: the program's own call, passed on unchanged: its contract is
    // this function's caller's.
    unsafe {
        served_or_kernel(
            "pkey_mprotect",
            || maps::mprotect(addr as usize, len, prot, Some(pkey)),
            libc::SYS_pkey_mprotect,
            [addr as usize, len, prot as usize, pkey as usize],
        )
    }
}

/// msync(2): a pager mapping's dirty pages are written back first.
///
/// # Safety
/// As msync(2).
#[no_mangle]
pub unsafe extern "C-unwind" fn msync(addr: *mut c_void, len: usize, flags: c_int) -> c_int {
    if programs_own() && maps::any() {
        if let Some(r) = in_shim("msync", || maps::msync(addr as usize, len, flags)) {
            return r;
        }
    }
    // Not a pager range: libc's msync (a cancellation point) for the
    // program's own call.
    // SAFETY: the program's own call, passed on unchanged: its contract is
    // this function's caller's.
    unsafe { file_io::libc_io::msync(addr, len, flags) }
}

/// madvise(2): MADV_DONTNEED, MADV_WILLNEED and the access advice
/// (MADV_RANDOM, MADV_NORMAL, MADV_SEQUENTIAL) on pager memory go through
/// the engine.
///
/// # Safety
/// As madvise(2).
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // SAFETY: the program's own call, passed on unchanged: its contract is
    // this function's caller's.
    unsafe {
        served_or_kernel(
            "madvise",
            || maps::madvise(addr as usize, len, advice),
            libc::SYS_madvise,
            [addr as usize, len, advice as usize, 0],
        )
    }
}

/// Reads the settings when the library loads (before `main`).
extern "C" fn load() {
    file_io::libc_io::resolve();
    in_shim_or("load", (), 0, maps::load);
}

extern "C" {
    /// glibc's and musl's registration of an exit handler; with no
    /// `dso` the handler belongs to no library (`atexit` from a library
    /// ties it to that library, which runs it when the library is
    /// finalised).
    fn __cxa_atexit(f: extern "C" fn(*mut c_void), arg: *mut c_void, dso: *mut c_void) -> c_int;
}

/// The shim's destructor, at exit (`exit` or a return from `main`), from
/// the dynamic linker's finalisation, itself the first exit handler
/// registered and so the last run. Hazard: an `LD_PRELOAD` library is
/// finalised before the program's own libraries, whose destructors may
/// still store to a writable shared mapping (a logging or database
/// library flushing at exit); written back here, those stores were never
/// written back (found by review). So the write-back is registered as an
/// exit handler now: registered while the exit handlers run, it runs
/// after the finalisation returns (the C library starts its list over
/// when a handler adds one), after every library's destructor, before
/// stdio's buffers are flushed. Where it cannot be registered, it runs
/// now.
extern "C" fn unload() {
    // SAFETY: `late_unload` is a function of this library, which is
    // never unloaded (linked `-z nodelete`, see `build.rs`: a `dlclose`
    // leaves it mapped); it takes no argument.
    let r = unsafe { __cxa_atexit(late_unload, std::ptr::null_mut(), std::ptr::null_mut()) };
    if r != 0 {
        late_unload(std::ptr::null_mut());
    }
}

/// Writes the counters and flushes writable mappings at exit (see
/// `unload`).
extern "C" fn late_unload(_: *mut c_void) {
    // An exit from inside the shim's own work on this thread (a signal
    // handler that calls exit() while this thread holds the table in a
    // write(2) or msync): the table's lock is this thread's, and waiting
    // for it would never end.
    // Likewise an exit from a signal handler that interrupted the engine's
    // own work on this thread (a fault it was serving in-thread): it may
    // hold what the write-back would wait for.
    if in_shim_here() || engine::in_engine() {
        return;
    }
    in_shim("unload", maps::unload);
}

#[used]
#[link_section = ".init_array"]
static LOAD: extern "C" fn() = load;

#[used]
#[link_section = ".fini_array"]
static UNLOAD: extern "C" fn() = unload;
