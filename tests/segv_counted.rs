//! What an access the engine refuses counts: one SIGSEGV, and no page
//! fault (the kernel's bad area never reaches `handle_mm_fault` either).
//! Handler threads look at such a fault three times before they signal
//! it (a message may be stale); each look counted a fault and a SIGSEGV.

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicPtr, Ordering::SeqCst};
use uffd_pager::{Counter, InstallKind, Pager};
use util::*;

static PAGER: AtomicPtr<Pager> = AtomicPtr::new(std::ptr::null_mut());

/// The application's SIGSEGV handler: exits 0 if the pager counted one
/// SIGSEGV and no fault since its stats were reset, 3 otherwise. (Reading
/// the stats allocates: the interrupted code is a plain load, which holds
/// no lock.)
extern "C" fn segv_checks_counts(_: libc::c_int) {
    // SAFETY: set before the access to a pager that outlives it.
    let p = unsafe { &*PAGER.load(SeqCst) };
    let s = p.stats();
    let (segv, faults) = (s.get(Counter::SEGV), s.get(Counter::PGFAULT));
    println!("segv {segv} pgfault {faults}");
    // SAFETY: _exit has no preconditions.
    unsafe { libc::_exit(if segv == 1 && faults == 0 { 0 } else { 3 }) };
}

/// A pager with handler threads that lives as long as the child, and an
/// alarm as the child's deadline.
fn child_pager() -> &'static Pager {
    // SAFETY: alarm has no preconditions: a hang ends the child.
    unsafe { libc::alarm(20) };
    Box::leak(Box::new(
        Pager::builder().delivery(THREADS).build().unwrap(),
    ))
}

/// Resets `p`'s counts and installs the handler that checks them at the
/// SIGSEGV to come.
fn count_from_here(p: &'static Pager) {
    PAGER.store(p as *const Pager as *mut Pager, SeqCst);
    // SAFETY: installs a handler for this child's SIGSEGV.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = segv_checks_counts as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut()), 0);
    }
    p.reset_stats();
}

/// The application grows a region with its own `mremap`: the grown part
/// stays registered with no region over it, so its access is refused.
#[test]
fn child_refused_access() {
    if !is_child() {
        return;
    }
    let p = child_pager();
    let pages = 4;
    let (r, _) = filled_region(p, InstallKind::Anonymous, pages, 5);
    let to = free_range(2 * pages * PAGE);
    app_mremap(r.as_ptr() as usize, pages * PAGE, 2 * pages * PAGE, to);
    std::mem::forget(r);
    // The event is applied before the count starts.
    // SAFETY: a page of the moved region.
    let _ = unsafe { std::ptr::read_volatile(to as *const u8) };
    count_from_here(p);
    // SAFETY: the grown part, which the kernel keeps registered.
    let _ = unsafe { std::ptr::read_volatile((to + 6 * PAGE) as *const u8) };
    println!("the access past the region returned");
    std::process::exit(2);
}

/// A write to a read-only store's page that the application made writable
/// with its own `mprotect`: the region refuses it, and handler threads
/// look at it three times before they signal it.
#[test]
fn child_refused_write() {
    if !is_child() {
        return;
    }
    let p = child_pager();
    let data = pattern_vec(4, 4 * PAGE);
    let store = std::sync::Arc::new(uffd_pager::store::MemoryStore::read_only(&data).unwrap());
    let opts = uffd_pager::MapOptions {
        writable: false,
        ..uffd_pager::MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region.
    let r = Box::leak(Box::new(
        unsafe { p.map_store(store, data.len(), &opts) }.unwrap(),
    ));
    // The page is in first: the write below is refused, not read.
    assert_eq!(r.as_slice()[PAGE], data[PAGE]);
    count_from_here(p);
    make_writable_and_write(r, PAGE);
    std::process::exit(2);
}

#[test]
fn a_write_refused_three_looks_is_one_sigsegv_and_no_fault() {
    let out = run_child("child_refused_write", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

#[test]
fn an_access_refused_three_looks_is_one_sigsegv_and_no_fault() {
    let out = run_child("child_refused_access", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}
