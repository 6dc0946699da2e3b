//! Two pagers in one process, one of them behind on the application's
//! `munmap`: the kernel frees the range before it posts the event, so the
//! application can map a second pager's region there and fault on it
//! while the first pager still lists its old region at the address. The
//! fault is the new region's, and must neither wait for the first pager
//! nor go to it (it would find its region gone once it applied the
//! event). The first pager's event is held unapplied on purpose: its
//! global lock is held (`Pager::hold_global_write`), which applying an
//! event takes.

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::{Delivery, InstallKind, MapOptions, Pager};
use util::*;

const PAGES: usize = 8;

/// The old region's address, for [`unmap_then_map_there`].
static AT: AtomicUsize = AtomicUsize::new(0);

/// The map hook: the application unmaps the old region, and the new
/// region's `mmap` is hinted its range, which the kernel then gives it
/// (nothing can take the hole in between, as another `mmap` of the
/// engine's own could).
fn unmap_then_map_there(len: usize) -> usize {
    let at = AT.swap(0, SeqCst);
    if at != 0 {
        // SAFETY: the application unmaps region memory itself; the
        // region's handle is dropped only after the event is applied.
        assert_eq!(unsafe { libc::munmap(at as *mut libc::c_void, len) }, 0);
        // (munmap returned: the event has been read, and waits for the
        // global lock to be applied.)
    }
    at
}

#[test]
fn child_stale_claim() {
    if !is_child() {
        return;
    }
    // SAFETY: alarm has no preconditions: a hang ends the child.
    unsafe { libc::alarm(30) };
    let len = PAGES * PAGE;
    // Both in-thread (the SIGBUS handler asks only those), the pager behind
    // first: the handler asks them in the
    // order they were built.
    let behind = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let new = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    // A first round of the same, unheld: the threads' first events and
    // faults allocate what they keep (signal stacks), which could take the
    // hole otherwise.
    for p in [&behind, &new] {
        let mut warm = p.map_anonymous(len).unwrap();
        warm.as_mut_slice().fill(1);
        let w = warm.as_ptr() as usize;
        // SAFETY: the application unmaps region memory itself.
        assert_eq!(unsafe { libc::munmap(w as *mut libc::c_void, len) }, 0);
        drop(warm);
    }
    let mut old = behind.map_anonymous(len).unwrap();
    old.as_mut_slice().fill(0x11);
    let at = old.as_ptr() as usize;
    let hold = behind.hold_global_write();
    AT.store(at, SeqCst);
    uffd_pager::testing::set_before_map(Some(unmap_then_map_there));
    let opts = MapOptions {
        kind: Some(InstallKind::Anonymous),
        ..MapOptions::default()
    };
    let store = Arc::new(uffd_pager::store::ZeroStore::new(len as u64));
    // SAFETY: the test changes this store only through the region.
    let r = unsafe { new.map_store(store, len, &opts) };
    uffd_pager::testing::set_before_map(None);
    let mut r = r.unwrap();
    if r.as_ptr() as usize != at {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        panic!("at {at:#x} got {:#x} {maps}", r.as_ptr() as usize);
    }
    let done = Arc::new(AtomicBool::new(false));
    let base = at;
    let writer = {
        let done = done.clone();
        std::thread::spawn(move || {
            for pg in 0..PAGES {
                // SAFETY: the new region's memory, live until joined.
                unsafe { *((base + pg * PAGE) as *mut u8) = 0x22 };
            }
            done.store(true, SeqCst);
        })
    };
    let t = Instant::now();
    while !done.load(SeqCst) && t.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let waited = t.elapsed();
    let finished = done.load(SeqCst);
    drop(hold);
    writer.join().unwrap();
    assert!(
        finished,
        "the new region's faults waited {waited:?} for the pager behind"
    );
    for pg in 0..PAGES {
        assert_eq!(r.as_slice()[pg * PAGE], 0x22, "page {pg}");
        assert_eq!(r.as_slice()[pg * PAGE + 1], 0, "page {pg}");
    }
    r.as_mut_slice()[1] = 3;
    drop(old);
    assert_eq!(r.as_slice()[0], 0x22);
    drop(r);
    println!("ok in {waited:?}");
    std::process::exit(0);
}

#[test]
fn a_fault_on_a_new_region_does_not_wait_for_a_pager_behind_on_the_unmap() {
    let out = run_child("child_stale_claim", &[]);
    assert!(out.status.success(), "{}", describe(&out));
}
