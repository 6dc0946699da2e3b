//! A fault taken by an application's signal handler running on a small
//! alternate stack (`sigaltstack`, `SA_ONSTACK`) is served without writing
//! below that stack.
//!
//! The engine's SIGBUS handler runs on the stack the fault was taken on,
//! and its fault path needs tens of KiB; on an 8 KiB stack it wrote 17 KiB
//! below it, over whatever lay there (here an area the test fills and
//! checks; in a program, often the heap). Also where the application's
//! own SIGBUS handler, installed after the pager with `SA_ONSTACK`, passes
//! the fault on to the engine's by calling it. Its own file: it installs
//! process-wide SIGUSR1 and SIGBUS handlers.

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Delivery, InstallKind, MapOptions};
use util::*;

const PAGES: usize = 16;
/// The alternate stack: twice `SIGSTKSZ` (room for two kernel signal
/// frames with AVX-512 state, and the handlers above the switch), well
/// under what the fault path needs.
const ALT: usize = 16 << 10;
/// Checked memory below it.
const BELOW: usize = 248 << 10;
const FILL: u8 = 0xa5;

/// The page the handler reads (its address), and what it read.
static TARGET: AtomicUsize = AtomicUsize::new(0);
static READ: AtomicU8 = AtomicU8::new(0);

extern "C" fn on_usr1(_: libc::c_int) {
    let a = TARGET.load(Ordering::Relaxed);
    // SAFETY: a page of the live region the test set.
    let v = unsafe { std::ptr::read_volatile(a as *const u8) };
    READ.store(v, Ordering::Relaxed);
}

/// The engine's SIGBUS action, which [`forward`] calls.
static ENGINES: AtomicUsize = AtomicUsize::new(0);

/// An application's SIGBUS handler that passes every SIGBUS on to the
/// action it replaced by calling it.
extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let f = ENGINES.load(Ordering::Relaxed);
    // SAFETY: the engine's handler, installed with SA_SIGINFO.
    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
        unsafe { std::mem::transmute(f) };
    f(sig, info, uc);
}

/// A pager with a budget under the region's size (later faults evict
/// first: the deepest path) and a read-only region of [`PAGES`] pages;
/// the region's bytes.
fn pager_and_region() -> (uffd_pager::Pager, uffd_pager::Region, Vec<u8>) {
    let p = uffd_pager::Pager::builder()
        .delivery(Delivery::InThread)
        .readahead(0, 1)
        .fault_around(0)
        .budget_pages(4)
        .build()
        .unwrap();
    let data = pattern_vec(41, PAGES * PAGE);
    let store = Arc::new(MemoryStore::read_only(&data).unwrap());
    let opts = MapOptions {
        writable: false,
        kind: Some(InstallKind::Anonymous),
        ..MapOptions::default()
    };
    // SAFETY: nothing else changes the read-only store.
    let region = unsafe { p.map_store(store, data.len(), &opts) }.unwrap();
    (p, region, data)
}

/// An alternate stack of [`ALT`] bytes for this thread, above [`BELOW`]
/// bytes filled with [`FILL`]; `f` runs with it, then returns how many
/// bytes below the stack were written.
fn with_checked_alt_stack(f: impl FnOnce()) -> Option<usize> {
    // SAFETY: a fresh private mapping: the checked area, then the stack.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            BELOW + ALT,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    let below = base as *mut u8;
    // SAFETY: the first BELOW bytes of the mapping above.
    unsafe { std::ptr::write_bytes(below, FILL, BELOW) };
    let ss = libc::stack_t {
        ss_sp: below.wrapping_add(BELOW).cast(),
        ss_flags: 0,
        ss_size: ALT,
    };
    // SAFETY: this thread's alternate stack.
    unsafe { assert_eq!(libc::sigaltstack(&ss, std::ptr::null_mut()), 0) };
    f();
    // SAFETY: the checked area, read after the handlers ran.
    let seen = unsafe { std::slice::from_raw_parts(below, BELOW) };
    let lowest = seen.iter().position(|&b| b != FILL);
    // SAFETY: turns the alternate stack off before it is unmapped.
    unsafe {
        let off = libc::stack_t {
            ss_sp: std::ptr::null_mut(),
            ss_flags: libc::SS_DISABLE,
            ss_size: 0,
        };
        libc::sigaltstack(&off, std::ptr::null_mut());
        libc::munmap(base, BELOW + ALT);
    }
    lowest.map(|at| BELOW - at)
}

#[test]
fn a_fault_on_a_small_alternate_stack_stays_on_it() {
    with_deadline(60, "faults on an alternate stack", || {
        let (p, region, data) = pager_and_region();
        // SAFETY: a handler that reads one byte and stores it
        // (async-signal-safe).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_usr1 as *const () as usize;
            sa.sa_flags = libc::SA_ONSTACK;
            assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
        }
        let below = with_checked_alt_stack(|| {
            for i in 0..PAGES {
                TARGET.store(region.as_ptr() as usize + i * PAGE + 7, Ordering::Relaxed);
                // SAFETY: raise runs the handler on this thread before returning.
                unsafe { libc::raise(libc::SIGUSR1) };
                assert_eq!(READ.load(Ordering::Relaxed), data[i * PAGE + 7], "page {i}");
            }
        });
        assert_eq!(
            below, None,
            "the fault path wrote this many bytes below the {ALT}-byte alternate stack"
        );
        assert!(
            p.stats().get(uffd_pager::Counter::PGSTEAL) > 0,
            "reclaim ran in the handler"
        );
    });
}

/// The application's SIGBUS handler, installed after the pager with
/// `SA_ONSTACK`, passes each fault on to the engine's by calling it: the
/// engine's handler then runs on the alternate stack for a fault taken on
/// the thread's own stack. It looked at the interrupted stack pointer (on
/// the thread's stack), took the alternate stack for roomy, and wrote
/// below it.
#[test]
fn a_fault_passed_on_by_an_onstack_handler_stays_on_the_alternate_stack() {
    with_deadline(60, "faults passed on by a handler", || {
        let (p, region, data) = pager_and_region();
        // SAFETY: the engine's action read, then ours installed over it:
        // `forward` calls the engine's handler with what it got.
        let old = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = forward as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old), 0);
            assert_ne!(old.sa_flags & libc::SA_SIGINFO, 0, "the engine's action");
            ENGINES.store(old.sa_sigaction, Ordering::Relaxed);
            assert_eq!(libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()), 0);
            old
        };
        let below = with_checked_alt_stack(|| {
            for i in 0..PAGES {
                assert_eq!(
                    region.as_slice()[i * PAGE + 9],
                    data[i * PAGE + 9],
                    "page {i}"
                );
            }
        });
        // SAFETY: the engine's action back.
        unsafe { libc::sigaction(libc::SIGBUS, &old, std::ptr::null_mut()) };
        assert_eq!(
            below, None,
            "the fault path wrote this many bytes below the {ALT}-byte alternate stack"
        );
        assert!(p.stats().get(uffd_pager::Counter::PGSTEAL) > 0);
    });
}
