//! Two in-thread pagers: the application moves pager A's region to X with
//! its own `mremap`, then unmaps it there, and pager B maps a region at X
//! before A has applied either event. A applies the move first, and for
//! a moment lists a region at X too. A fault on B's region must go to B:
//! the move is older than B's map, though A applied it later. (The moved
//! region's placement was taken when A applied the event, so A's stale
//! region looked newer, and the fault waited behind A's events.) A's
//! events are held on purpose: its global lock (`hold_global_write`) until
//! B has mapped, then a pause after the move is applied
//! (`testing::set_after_event`).

#[path = "engine_util.rs"]
mod util;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::{Delivery, InstallKind, MapOptions, Pager};
use util::*;

static ARMED: AtomicBool = AtomicBool::new(false);
static ASLEEP: AtomicBool = AtomicBool::new(false);

/// The event hook: the first event applied once armed (the move) is
/// followed by a pause of 400 ms (nanosleep: async-signal-safe).
fn pause_after_the_move() {
    if ARMED.swap(false, SeqCst) {
        ASLEEP.store(true, SeqCst);
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 400_000_000,
        };
        // SAFETY: a valid timespec; no remainder wanted.
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
    }
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn child_remap_placement() {
    if !is_child() {
        return;
    }
    // SAFETY: alarm has no preconditions: a hang ends the child.
    unsafe { libc::alarm(30) };
    let len = 8 * PAGE;
    // A first: the SIGBUS handler asks the pagers in the order they were
    // built, so a wrong choice would go to A.
    let a = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let b = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .unwrap();
    let mut ra = a.map_anonymous(len).unwrap();
    ra.as_mut_slice().fill(0x11);
    let (y, x) = (ra.as_ptr() as usize, free_range(len));
    let hold = a.hold_global_write();
    // The mover's mremap returns only once both its events (the move, and
    // the unmap of the old range) are read, which may wait for the hold:
    // the unmap at X comes from another thread, as soon as the kernel has
    // moved the range there (its mmap_lock is free while the mover waits).
    let mover = std::thread::spawn(move || app_mremap(y, len, len, x));
    let unmapping = Arc::new(AtomicBool::new(false));
    let unmapper = {
        let unmapping = unmapping.clone();
        std::thread::spawn(move || {
            wait_for("the kernel moved the range", || mapped(x));
            unmapping.store(true, SeqCst);
            // SAFETY: the application unmaps the memory it moved there; the
            // call returns once A reads its event.
            assert_eq!(unsafe { libc::munmap(x as *mut libc::c_void, len) }, 0);
        })
    };
    wait_for("the unmap freed X", || unmapping.load(SeqCst) && !mapped(x));
    let opts = MapOptions {
        kind: Some(InstallKind::Anonymous),
        fixed_addr: Some(x),
        ..MapOptions::default()
    };
    let rb = b.map_anonymous_with(len, &opts).unwrap();
    uffd_pager::testing::set_after_event(Some(pause_after_the_move));
    ARMED.store(true, SeqCst);
    drop(hold);
    wait_for("A applied the move", || ASLEEP.load(SeqCst));
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let done = done.clone();
        std::thread::spawn(move || {
            for pg in 0..8 {
                // SAFETY: B's region at X, live until the writer is joined.
                unsafe { std::ptr::write_volatile((x + pg * PAGE) as *mut u8, 0x22) };
            }
            done.store(true, SeqCst);
        })
    };
    let t = Instant::now();
    while !done.load(SeqCst) && t.elapsed() < Duration::from_millis(200) {
        std::thread::sleep(Duration::from_millis(2));
    }
    let (finished, took) = (done.load(SeqCst), t.elapsed());
    writer.join().unwrap();
    mover.join().unwrap();
    unmapper.join().unwrap();
    uffd_pager::testing::set_after_event(None);
    assert!(finished, "B's faults waited {took:?} behind A's events");
    for pg in 0..8 {
        assert_eq!(rb.as_slice()[pg * PAGE], 0x22, "page {pg}");
    }
    drop(ra);
    drop(rb);
    println!("B's writes took {took:?}");
    std::process::exit(0);
}

#[test]
fn a_move_applied_late_is_older_than_a_map_made_since() {
    let out = run_child("child_remap_placement", &[]);
    assert!(out.status.success(), "{}", describe(&out));
}
