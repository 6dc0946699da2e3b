//! UMap's C calls (`include/umap/umap.h`), served by this engine, so that a
//! program written for LLNL's UMap builds unchanged against this project's
//! header and `-luffd_pager`.
//!
//! # How UMap's model maps onto the engine
//! - One pager per process, made at the first [`umap`] from the settings
//!   then in force (UMap's environment variables, read once, and any
//!   `umapcfg_set_*` call made before it); a `umap` refused for its length,
//!   offset or descriptor makes none. Settings changed after the first
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
//!   available at the first call, as UMap's).
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

use crate::umap_settings::Settings;
use engine::{InstallKind, MapOptions, Pager, Region};
use std::ffi::{c_int, c_long, c_void};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// One entry of [`umap_prefetch`]'s array.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct umap_prefetch_item {
    /// Any address in the UMap page to fetch.
    pub page_base_addr: *mut c_void,
}

/// The process's UMap state.
struct State {
    settings: Settings,
    /// The UMap page size in force: the one the pager was made with (a
    /// setter called after the first `umap` changes only the getter's).
    unit: usize,
    pager: Option<Pager>,
    regions: Vec<Region>,
}

static STATE: OnceLock<Mutex<State>> = OnceLock::new();

/// The state's lock, held: the holder's thread id is in [`HOLDER`] while
/// it is (so that the exit's write-back can tell another thread's call in
/// flight, which it waits for, from one of its own thread's).
struct Held(MutexGuard<'static, State>);

/// The thread id of the state lock's holder, or 0.
static HOLDER: AtomicI32 = AtomicI32::new(0);

impl std::ops::Deref for Held {
    type Target = State;
    fn deref(&self) -> &State {
        &self.0
    }
}

impl std::ops::DerefMut for Held {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.0
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // (Before the guard, a field, unlocks.)
        HOLDER.store(0, Relaxed);
    }
}

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// The state, locked; or, in a `fork()`ed child whose parent had it
/// locked at the fork (by a thread the child does not have, so it stays
/// locked for ever), EPERM with a message, where waiting would hang.
fn state() -> Result<Held, i32> {
    let m = STATE.get_or_init(|| {
        OWNER_PID.store(std::process::id(), Relaxed);
        Mutex::new(State {
            settings: Settings::from_env(),
            unit: engine::PAGE_SIZE,
            pager: None,
            regions: Vec::new(),
        })
    });
    let g = if forked() {
        lock_in_child(m).ok_or_else(|| {
            crate::fail(
                libc::EPERM,
                "umap: a fork()ed child of a process in the middle of a UMap call",
            )
            .abs()
        })?
    } else {
        m.lock().unwrap_or_else(|e| e.into_inner())
    };
    HOLDER.store(gettid(), Relaxed);
    Ok(Held(g))
}

/// The process that made the state (0: none yet).
static OWNER_PID: AtomicU32 = AtomicU32::new(0);

/// Whether this is a `fork()`ed child of the process that made the state.
fn forked() -> bool {
    let owner = OWNER_PID.load(Relaxed);
    owner != 0 && owner != std::process::id()
}

/// The state locked in a `fork()`ed child, or `None` where a thread of the
/// parent held it at the fork (it stays locked for ever). A thread of the
/// child's that holds it (its tid is one of ours) is waited for. A holder
/// writes its tid right after it locks and clears it right before it
/// unlocks, so the lock can be held with no tid written for a moment: the
/// lock is tried again, and taken for the parent's once it has stayed
/// locked with none for 100 ms (a parent's thread that forked us in that
/// moment never writes one). Once the child has had the lock, the state is
/// its own: later calls lock it as the parent's did.
fn lock_in_child(m: &'static Mutex<State>) -> Option<MutexGuard<'static, State>> {
    use std::sync::TryLockError;
    let mut silent = 0;
    let g = loop {
        match m.try_lock() {
            Ok(g) => break g,
            Err(TryLockError::Poisoned(p)) => break p.into_inner(),
            Err(TryLockError::WouldBlock) => match HOLDER.load(Relaxed) {
                0 if silent < 100 => silent += 1,
                0 => return None,
                tid if std::path::Path::new(&format!("/proc/self/task/{tid}")).exists() => {
                    silent = 0
                }
                _ => return None,
            },
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    OWNER_PID.store(std::process::id(), Relaxed);
    Some(g)
}

/// At exit: the regions the program never `uunmap`ped are written back
/// (as the kernel keeps what was stored through a shared mapping), and so
/// are pages of regions unmapped while their file refused them; what
/// fails is said on stderr. Another thread's call in flight (a `uunmap`
/// writing its region back, which `exit` would cut short) is waited for,
/// up to [`EXIT_WAIT`]. Skipped if this thread holds the state (an exit
/// from inside a UMap call on this thread), after that wait, or in a
/// `fork()`ed child (a region's flush refuses to run there).
extern "C" fn umap_fini() {
    // (An exit from a signal handler that interrupted the engine serving
    // a fault on this thread: what a write-back would wait for may be
    // held here.)
    if engine::in_engine() {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        use std::sync::TryLockError;
        let Some(m) = STATE.get() else { return };
        let deadline = std::time::Instant::now() + EXIT_WAIT;
        // A fork()ed child whose parent was in a call at the fork: the
        // state stays locked by a thread the child does not have (and the
        // regions in it are the parent's, which the child cannot write
        // anyway).
        if forked() && lock_in_child(m).map(drop).is_none() {
            return;
        }
        let st = loop {
            match m.try_lock() {
                Ok(st) => break st,
                // A call that panicked (caught) while it held the state: the
                // regions are still there to write.
                Err(TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(TryLockError::WouldBlock)
                    if HOLDER.load(Relaxed) != gettid() && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(TryLockError::WouldBlock) => {
                    say("a call was in flight at exit: regions not written back");
                    return;
                }
            }
        };
        let mut r = Ok(());
        for region in &st.regions {
            // (A private copy has nothing to write: `Ok` at once.)
            r = r.and(region.flush());
        }
        if let Some(p) = &st.pager {
            r = r.and(p.flush_unmapped());
        }
        match r {
            Err(engine::Error::ForkedChild) | Ok(()) => {}
            Err(e) => {
                say(format_args!("write-back at exit failed: {e}"));
            }
        }
    });
}

/// How long the exit's write-back waits for another thread's call.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

#[used]
#[link_section = ".fini_array"]
static UMAP_FINI: extern "C" fn() = umap_fini;

/// Writes `umap: {msg}` and a newline to stderr with one `write(2)`, not
/// through `std::io::stderr()`: a child `fork()`ed while a parent thread
/// held std's stderr lock inherits it held, and would wait for ever. A
/// broken stderr is ignored (UMap reports there; the program goes on).
fn say(msg: impl std::fmt::Display) {
    let line = format!("umap: {msg}\n");
    // SAFETY: write(2) of a buffer we own.
    let _ = unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
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
    let len = rounded;
    let writable = prot & libc::PROT_WRITE != 0;
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
    let store = match crate::region::fd_store(fd, offset as u64, len, writable) {
        Ok(s) => s,
        Err(rc) => return umap_failed(-rc, crate::error_text()),
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

macro_rules! getters_setters {
    ($($get:ident / $set:ident : $t:ty => $field:ident, $var:literal;)*) => {$(
        /// UMap's setting of the same name (see the module documentation).
        #[no_mangle]
        pub extern "C" fn $get() -> $t {
            std::panic::catch_unwind(|| state().map_or(0, |s| s.settings.$field as $t))
                .unwrap_or_default()
        }
        /// Sets UMap's setting of the same name; takes effect at the first
        /// `umap` if called before it, where it also replaces a bad value
        /// of its environment variable.
        #[no_mangle]
        pub extern "C" fn $set(v: $t) {
            let _ = std::panic::catch_unwind(|| {
                if let Ok(mut s) = state() {
                    s.settings.$field = v as _;
                    s.settings.bad.retain(|(var, _)| *var != $var);
                }
            });
        }
    )*};
}

/// UMap's buffer size in UMap pages: `UMAP_BUFSIZE`, what
/// `umapcfg_set_max_pages_in_buffer` set, or UMap's default (80% of the
/// memory available: now, or when the first `umap` made the pager).
#[no_mangle]
pub extern "C" fn umapcfg_get_max_pages_in_buffer() -> u64 {
    std::panic::catch_unwind(|| state().map_or(0, |s| s.settings.buffer_pages())).unwrap_or(0)
}

/// Sets UMap's buffer size (UMap pages); takes effect at the first `umap`
/// if called before it (0: UMap's default).
#[no_mangle]
pub extern "C" fn umapcfg_set_max_pages_in_buffer(v: u64) {
    let _ = std::panic::catch_unwind(|| {
        if let Ok(mut s) = state() {
            s.settings.buf_pages = v;
            s.settings.bad.retain(|(var, _)| *var != "UMAP_BUFSIZE");
        }
    });
}

getters_setters! {
    umapcfg_get_num_fillers / umapcfg_set_num_fillers: u64 => fillers, "UMAP_PAGE_FILLERS";
    umapcfg_get_num_evictors / umapcfg_set_num_evictors: u64 => evictors, "UMAP_PAGE_EVICTORS";
    umapcfg_get_read_ahead / umapcfg_set_read_ahead: u64 => read_ahead, "UMAP_READ_AHEAD";
    umapcfg_get_max_fault_events / umapcfg_set_max_fault_events: u64 =>
        max_fault_events, "UMAP_MAX_FAULT_EVENTS";
    umapcfg_get_evict_low_water_threshold / umapcfg_set_evict_low_water_threshold: c_int =>
        low_water, "UMAP_EVICT_LOW_WATER_THRESHOLD";
    umapcfg_get_evict_high_water_threshold / umapcfg_set_evict_high_water_threshold: c_int =>
        high_water, "UMAP_EVICT_HIGH_WATER_THRESHOLD";
}

/// UMap's page size in bytes (`UMAP_PAGESIZE`).
#[no_mangle]
pub extern "C" fn umapcfg_get_umap_page_size() -> u64 {
    let fallback = engine::PAGE_SIZE as u64;
    std::panic::catch_unwind(|| state().map_or(fallback, |s| s.settings.page_size))
        .unwrap_or(fallback)
}

/// Sets UMap's page size; a value that is not a non-zero multiple of 4096
/// is refused with a message on stderr (the setting is unchanged).
#[no_mangle]
pub extern "C" fn umapcfg_set_umap_page_size(page_size: u64) {
    if page_size == 0 || !page_size.is_multiple_of(engine::PAGE_SIZE as u64) {
        say(format_args!(
            "page size {page_size} must be a non-zero multiple of 4096; unchanged"
        ));
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        if let Ok(mut st) = state() {
            st.settings.page_size = page_size;
            // The program's own value replaces a bad UMAP_PAGESIZE.
            st.settings.bad_page_size = None;
        }
    });
}

/// The system's page size.
#[no_mangle]
pub extern "C" fn umapcfg_get_system_page_size() -> c_long {
    engine::PAGE_SIZE as c_long
}

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
