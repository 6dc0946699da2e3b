//! `uffd_pager_store`: a store whose pages come from C callbacks.

use crate::region::{map_with, uffd_pager_region};
use crate::{abi, fail, uffd_pager};
use engine::store::{Store, StoreError};
use std::ffi::c_void;
use std::sync::Arc;

/// A store of your own, in C. Offsets and lengths are whole pages. Each
/// callback returns 0 or a negative errno (-1 to -4095); anything else (a
/// byte count, 1 for true) is taken for a failure, `-EIO`.
///
/// The callbacks are called from several threads at once, with the same
/// `ctx` (two reads of different pages may overlap, a write may overlap a
/// read): a store that keeps state in `ctx` (a file offset, a buffer)
/// locks it itself.
///
/// Unless `signal_safe` is set, the engine calls the callbacks only from
/// its own I/O threads (they may allocate, lock and block). With
/// `signal_safe` set they are also called from a SIGBUS handler and must be
/// async-signal-safe; they must not touch the memory of a region either
/// (a fault there would come with SIGBUS blocked: the kernel kills the
/// process).
///
/// A callback must return normally: a C++ exception thrown out of one
/// aborts the process, and a `longjmp` out of one is undefined behaviour.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct uffd_pager_store {
    /// `sizeof(uffd_pager_store)` as the program was built: set by
    /// [`uffd_pager_store_init`] (see `uffd_pager_config.size`).
    pub size: usize,
    /// Passed to every callback.
    pub ctx: *mut c_void,
    /// Length in bytes, a multiple of 4096.
    pub len: u64,
    /// Fills `len` bytes at `buf` with the store's bytes at `offset`.
    pub read: Option<unsafe extern "C" fn(*mut c_void, u64, *mut c_void, usize) -> i32>,
    /// Writes `len` bytes from `buf` at `offset`; NULL: a read-only store.
    pub write: Option<unsafe extern "C" fn(*mut c_void, u64, *const c_void, usize) -> i32>,
    /// Called once per successful map of the store when the engine no
    /// longer needs it (mapped twice, it is called twice); may be NULL.
    /// Until then the other callbacks may run, also after the region's
    /// unmap has returned: a write-back that failed keeps the pages, and
    /// `uffd_pager_flush_unmapped` or `uffd_pager_free` writes them later.
    /// So with `release` NULL, `ctx` must outlive the pager. It may run
    /// on any thread (the one that unmaps or frees, or one of the
    /// engine's); no callback may call the API.
    pub release: Option<unsafe extern "C" fn(*mut c_void)>,
    /// The callbacks are async-signal-safe.
    pub signal_safe: bool,
    /// Zero (room for later fields).
    pub _reserved: [u8; 7],
}

// SAFETY: repr(C) with no padding (`_reserved` fills the tail after
// `signal_safe`, `abi`'s tests check), `size` first, `signal_safe` the one
// bool; every other field is an integer or a nullable (function) pointer.
unsafe impl abi::Versioned for uffd_pager_store {
    const NAME: &'static str = "uffd_pager_store";
    const FIRST_SIZE: usize = 56;
    const BOOLS: &'static [usize] = &[std::mem::offset_of!(Self, signal_safe)];
    const RESERVED: &'static [(usize, usize)] = &[(std::mem::offset_of!(Self, _reserved), 7)];
    fn defaults() -> Self {
        uffd_pager_store {
            size: std::mem::size_of::<Self>(),
            ctx: std::ptr::null_mut(),
            len: 0,
            read: None,
            write: None,
            release: None,
            signal_safe: false,
            _reserved: [0; 7],
        }
    }
}

/// Fills `s`, of `size` bytes (`sizeof *s`), with an empty store (no
/// callbacks, length 0, not signal-safe) and `s->size` with `size`: set
/// the callbacks and the length after it.
///
/// Returns 0, or -EINVAL for a NULL `s` or a `size` that is no version's
/// (nothing written).
///
/// # Safety
/// `s` is NULL or points at `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_store_init(s: *mut uffd_pager_store, size: usize) -> i32 {
    // SAFETY: NULL or `size` writable bytes (the caller's contract).
    unsafe { abi::init(s, size) }
}

/// The C store as an engine store, whether its `release` is ours to call
/// (set once the map succeeded: on a failure the store is dropped, and
/// `ctx` stays the caller's), and the gate its callbacks pass.
struct CStore(
    uffd_pager_store,
    Arc<std::sync::atomic::AtomicBool>,
    Arc<Gate>,
);

/// Callbacks running now, and whether no more may start.
///
/// Hazard: a map that fails may leave a callback running, or about to
/// run, on one of the engine's I/O threads: a read that outlived the I/O
/// timeout of a populating map, or one queued and not begun. The caller
/// may free `ctx` as soon as the map returns its failure, and the callback
/// then ran on freed memory (found by review). So a failing map closes the
/// gate (later calls fail with EIO without calling back) and waits for
/// the callbacks inside to return before it reports the failure.
#[derive(Default)]
struct Gate {
    inside: std::sync::atomic::AtomicU32,
    closed: std::sync::atomic::AtomicBool,
}

impl Gate {
    /// Runs `f` unless the gate is closed (then EIO). Async-signal-safe.
    fn pass(&self, f: impl FnOnce() -> i32) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        // (Counted before the look: `close` either sees this call inside
        // and waits for it, or this call sees the gate closed.)
        self.inside.fetch_add(1, SeqCst);
        let r = if self.closed.load(SeqCst) {
            -libc::EIO
        } else {
            f()
        };
        self.inside.fetch_sub(1, SeqCst);
        rc(r)
    }

    /// Closes the gate and waits until no callback is inside.
    fn close(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.closed.store(true, SeqCst);
        while self.inside.load(SeqCst) != 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

// SAFETY: the header says the callbacks are called from several threads at
// once with this `ctx`; the struct holds nothing else.
unsafe impl Send for CStore {}
// SAFETY: as above.
unsafe impl Sync for CStore {}

/// A callback's return as the engine's result: 0 is success, a negative
/// errno (-1 to -4095) that error. Anything else is a callback that does
/// not keep the contract (a `pread`-style byte count, `1` for true, a
/// large negative number) and fails as `EIO`: passed on, a read that
/// returned its length failed every fault with "errno" 4096. (A `-1` is
/// `-EPERM`, as the contract reads it.)
fn rc(r: i32) -> Result<(), StoreError> {
    match r {
        0 => Ok(()),
        -4095..=-1 => Err(StoreError(-r)),
        _ => Err(StoreError(libc::EIO)),
    }
}

impl Store for CStore {
    fn len(&self) -> u64 {
        self.0.len
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let f = self.0.read.ok_or(StoreError(libc::EIO))?;
        self.2.pass(|| {
            // SAFETY: the callback's contract: `len` writable bytes at `buf`.
            unsafe { f(self.0.ctx, offset, buf.as_mut_ptr().cast(), buf.len()) }
        })
    }
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        let f = self.0.write.ok_or(StoreError(libc::EROFS))?;
        self.2.pass(|| {
            // SAFETY: the callback's contract: `len` readable bytes at `buf`.
            unsafe { f(self.0.ctx, offset, buf.as_ptr().cast(), buf.len()) }
        })
    }
    fn writable(&self) -> bool {
        self.0.write.is_some()
    }
    fn signal_safe(&self) -> bool {
        self.0.signal_safe
    }
    fn name(&self) -> &'static str {
        "c-store"
    }
}

impl Drop for CStore {
    fn drop(&mut self) {
        if !self.1.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        if let Some(f) = self.0.release {
            // SAFETY: called once, as the header promises.
            unsafe { f(self.0.ctx) };
        }
    }
}

/// Maps `len` bytes backed by the callbacks in `*store` (copied). On
/// success `release` is called once, when the engine lets the store go
/// (after the region is gone). On any failure it is not called, and no
/// callback runs once the call has returned (a failing map waits for the
/// ones still running, a read that outlived the I/O timeout of a
/// `populate`, to return): `ctx` is the caller's again. (Before, it was called on some failures and not on
/// others with the same error code, so a caller could not tell whether to
/// free `ctx`.)
///
/// A store changed behind the engine (the file written by another
/// descriptor or process, a store whose callbacks return other bytes) shows
/// its new bytes in a page only after the engine evicts the page clean and
/// reads it again; `uffd_pager_region_refresh` brings cached pages up to
/// date at once.
///
/// # Safety
/// `p` is a live pager; `store` points at a store struct whose callbacks
/// honour its contract; `opts` is NULL or points at options; `out` points
/// at writable memory for a pointer.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_map_store(
    p: *const uffd_pager,
    store: *const uffd_pager_store,
    len: usize,
    opts: *const crate::region::uffd_pager_map_options,
    out: *mut *mut uffd_pager_region,
) -> i32 {
    if store.is_null() {
        return fail(libc::EINVAL, "store is NULL");
    }
    // SAFETY: points at a store struct of the size it says (the caller's
    // contract); copied.
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let gate = Arc::new(Gate::default());
    let s = match unsafe { abi::read(store) } {
        Ok(s) => CStore(s, armed.clone(), gate.clone()),
        Err(rc) => return rc,
    };
    if s.0.read.is_none() || !s.0.len.is_multiple_of(engine::PAGE_SIZE as u64) {
        return fail(
            libc::EINVAL,
            "a store needs a read callback and a whole-page len",
        );
    }
    // SAFETY: C callers reach a region's bytes through raw pointers only, and the C API makes
    // no Rust slice of them, so a store changed behind the engine shows its new bytes without
    // breaking a Rust reference (the header says so).
    let rc = map_with(p, opts, out, |p, o| {
        Ok(unsafe { p.map_store(Arc::new(s), len, &o) })
    });
    if rc == 0 {
        armed.store(true, std::sync::atomic::Ordering::Release);
    } else {
        // No callback runs once the failure is reported (see `Gate`).
        gate.close();
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
    use std::time::Duration;

    /// Only a negative errno is passed on; a return outside the contract
    /// is EIO (before, a byte count such as 4096, or 1, went on as an
    /// errno).
    #[test]
    fn callback_returns_outside_the_contract_are_eio() {
        assert_eq!(rc(0), Ok(()));
        assert_eq!(rc(-libc::ENOSPC), Err(StoreError(libc::ENOSPC)));
        assert_eq!(rc(-1), Err(StoreError(libc::EPERM)));
        assert_eq!(rc(-4095), Err(StoreError(4095)));
        for r in [4096, 1, -4096, i32::MIN, i32::MAX] {
            assert_eq!(rc(r), Err(StoreError(libc::EIO)), "{r}");
        }
    }

    /// Set by the test once the map has returned and `ctx` is its again.
    static GIVEN_BACK: AtomicBool = AtomicBool::new(false);
    /// Callbacks that ran, or were still running, after that.
    static AFTER: AtomicU32 = AtomicU32::new(0);

    /// Reads zeros, slowly: 1 s, longer than the pager's I/O timeout.
    unsafe extern "C" fn slow_read(_: *mut c_void, _: u64, buf: *mut c_void, len: usize) -> i32 {
        if GIVEN_BACK.load(SeqCst) {
            AFTER.fetch_add(1, SeqCst);
        }
        std::thread::sleep(Duration::from_secs(1));
        // SAFETY: the callback's contract: `len` writable bytes at `buf`.
        unsafe { std::ptr::write_bytes(buf.cast::<u8>(), 0, len) };
        if GIVEN_BACK.load(SeqCst) {
            AFTER.fetch_add(1, SeqCst);
        }
        0
    }

    /// A populating map whose reads outlive the I/O timeout fails, and no
    /// callback runs once it has returned: the caller may free `ctx` then.
    /// Before, the read the map gave up on went on, and the ones queued
    /// behind it began, after the failure was reported.
    #[test]
    fn no_callback_runs_after_a_failed_map_returns() {
        let pager = engine::Pager::builder()
            .io_timeout(Duration::from_millis(200))
            .readahead(0, 1)
            .build()
            .unwrap();
        let p = crate::uffd_pager { pager };
        let mut s = uffd_pager_store {
            len: 8 * engine::PAGE_SIZE as u64,
            read: Some(slow_read),
            ..abi::Versioned::defaults()
        };
        s.size = std::mem::size_of::<uffd_pager_store>();
        let mut o: crate::region::uffd_pager_map_options = abi::Versioned::defaults();
        o.populate = true;
        o.writable = false;
        let mut out: *mut uffd_pager_region = std::ptr::null_mut();
        // SAFETY: a live pager, a store and options of this build, `out`
        // writable.
        let rc = unsafe { uffd_pager_map_store(&p, &s, 8 * engine::PAGE_SIZE, &o, &mut out) };
        assert!(rc < 0, "the map succeeded ({rc})");
        GIVEN_BACK.store(true, SeqCst);
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(
            AFTER.load(SeqCst),
            0,
            "callbacks ran after the failed map returned"
        );
    }
}
